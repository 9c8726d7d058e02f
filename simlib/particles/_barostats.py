r"""Constant pressure: stochastic cell rescaling (isotropic or orthorhombic), with the box as
a dynamic variable, for atoms or rigid molecules.

The box rides in the integrator's state (``carry.extra``); each step rebuilds the model's
space with it, so energies, minimum images and the virial all see the current box, and the
neighbour list follows it (:func:`follow_box`) without missing pairs. With molecules the
centres of mass are scaled (the molecules move rigidly) and the pressure is the molecular
one (:func:`molecular_pressure`).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from .._errors import Result
from ._constraints import Rattle
from ._dynamics import Carry, Integrator, inverse_mass, kinetic
from ._energy import Energy, SumEnergy
from ._neighbors import NeighborList, missing_pairs
from ._settle import Settle, settle_positions, settle_velocities
from ._space import Space, box_checked_upstream
from ._thermostats import bussi_draws, bussi_kinetic_from, degrees_of_freedom


def _volume(box):
    return box**3 if box.ndim == 0 else jnp.prod(box)


def with_box(tree, box):
    """``tree`` (a model, an energy) with every :class:`Space` in it made ``periodic(box)``."""
    return jax.tree_util.tree_map(
        lambda s: Space(box, True) if isinstance(s, Space) else s, tree,
        is_leaf=lambda s: isinstance(s, Space))


def follow_box(nbrs, positions, box, build_box):
    r"""The neighbour list moved into the box ``box`` (positions already scaled into it),
    rebuilt when a pair could otherwise be missed; returns ``(list, rebuilt)``.

    Since the last build (in the box ``build_box``) every length scaled by at least
    :math:`s = \min_k L_k / L^{build}_k`, so a pair that was beyond ``r_cut + skin`` then is
    now beyond :math:`s(r_c + \delta) - 2\max_i|\Delta_i|`, with :math:`\Delta_i` each atom's
    move relative to its scaled reference position. The list is rebuilt when that bound
    drops below :math:`r_c` (for :math:`s = 1` the usual half-skin test). Cells that the box
    has shrunk below ``r_cut + skin`` can no longer be searched: the list then reports an
    overflow, and :func:`simulate` reallocates it (a grid for the smaller box).
    """
    old = nbrs.space.box_vector(positions.shape[1], positions.dtype)
    moved = nbrs.replace(space=Space(box, True),
                         reference_positions=nbrs.reference_positions * (box / old))
    if nbrs.grid is not None:
        cell_size = box / jnp.asarray(nbrs.grid, box.dtype)
        moved = moved.replace(cell_size=cell_size,
                              overflow=moved.overflow | jnp.any(cell_size < nbrs.r_cut
                                                                + nbrs.skin))
    d = positions.T - moved.reference_positions.T
    r2 = sum(moved.space.minimum_image(d[k], k) ** 2 for k in range(d.shape[0]))
    s = jnp.min(box / build_box)
    safe = 2.0 * jnp.sqrt(jnp.max(r2)) <= s * (nbrs.r_cut + nbrs.skin) - nbrs.r_cut
    # As in NeighborList.update: the kept list is the cond's false branch (XLA's branch 0),
    # returned as it came, and the box move is applied after the cond. Otherwise (the kept
    # list as the true branch) XLA copied the (n, capacity) indices twice a step,
    # into the branch's result and back into the loop's carry (measured: 12.5 MB a step at
    # 32,000 atoms, tests/test_npt.py checks the compiled loop).
    out = lax.cond(~safe, lambda: moved.build(positions), lambda: nbrs)
    out = out.replace(space=moved.space,
                      reference_positions=jnp.where(safe, moved.reference_positions,
                                                    out.reference_positions),
                      cell_size=moved.cell_size,
                      overflow=jnp.where(safe, moved.overflow, out.overflow))
    if nbrs.debug:
        out = out.replace(missed_pairs=out.missed_pairs + missing_pairs(out, positions))
    return out, ~safe




# -- molecules ---------------------------------------------------------------------------

def molecule_index(molecules, n: int) -> tuple[jax.Array, jax.Array]:
    """Per atom, its molecule's number (in ``[0, n + w)``) and its molecule's first atom
    (the reference for minimum images), from ``molecules`` (``(w, k)`` atom indices, one
    molecule a row, padded with -1); atoms in no row are molecules of their own.
    Traceable."""
    ids = jnp.arange(n, dtype=jnp.int32)
    if molecules is None:
        return ids, ids
    mol = jnp.asarray(molecules)
    if not isinstance(mol, jax.core.Tracer):
        flat = np.asarray(mol)
        if flat.ndim != 2 or not np.issubdtype(flat.dtype, np.integer):
            raise ValueError(f"molecules must be a (w, k) integer array, got shape "
                             f"{flat.shape} and dtype {flat.dtype}")
        flat = flat.ravel()
        flat = flat[flat != -1]
        if flat.size and (flat.min() < 0 or flat.max() >= n):
            raise ValueError(f"molecules: atom indices must lie in [0, {n}), got "
                             f"[{flat.min()}, {flat.max()}]")
        if len(np.unique(flat)) != len(flat):
            raise ValueError("molecules: an atom appears in two molecules (or twice in one)")
    w = mol.shape[0]
    rows = jnp.where(mol >= 0, mol, n)                  # padding: out of range, dropped
    ref = ids.at[rows].set(jnp.broadcast_to(mol[:, :1], mol.shape).astype(jnp.int32),
                           mode="drop")
    ids = ids.at[rows].set(jnp.broadcast_to(n + jnp.arange(w, dtype=jnp.int32)[:, None],
                                            mol.shape), mode="drop")
    return ids, ref


def _molecular_parts(space, x, v, masses, ids, ref):
    r"""Each atom's offset :math:`d_i = x_i - X_{I(i)}` from its molecule's centre of mass
    (a minimum image from the molecule's first atom) and, if ``v`` is given, its velocity
    relative to the molecule's, :math:`u_i = v_i - V_{I(i)}`; zero for lone atoms."""
    n = x.shape[0]
    segments = 2 * n                        # numbers below n + w <= 2n
    m = jnp.broadcast_to(jnp.asarray(masses, x.dtype), (n,))[:, None]
    total = jax.ops.segment_sum(m, ids, num_segments=segments)
    safe = jnp.where(total > 0, total, 1.0)
    r = space.displacement(x, x[ref])
    d = r - (jax.ops.segment_sum(m * r, ids, num_segments=segments) / safe)[ids]
    if v is None:
        return d, None
    return d, v - (jax.ops.segment_sum(m * v, ids, num_segments=segments) / safe)[ids]


def virial_diagonal(energy: Energy, positions, params, neighbors=None) -> jax.Array:
    """The diagonal :math:`W_{aa}` of ``energy``'s virial tensor, ``(d,)``, whether a term
    returns the full ``(d, d)`` tensor or its diagonal (:func:`pme`, :func:`ewald`)."""
    terms = energy.terms if isinstance(energy, SumEnergy) else (energy,)
    out = 0.0
    for t in terms:
        w = t.virial_tensor(positions, params, neighbors)
        out = out + (jnp.diagonal(w) if w.ndim == 2 else w)
    return out


def _molecular_virial(energy, space, x, f, params, nbrs, d, diagonal):
    """:math:`W^{mol} = W - \\sum_i d_i f_i` (the scalar, or the diagonal)."""
    if diagonal:
        return virial_diagonal(energy, x, params, nbrs) - jnp.sum(d * f, axis=0)
    return energy.virial(x, params, nbrs) - jnp.sum(d * f)


def molecular_pressure(energy: Energy, positions: ArrayLike, velocities: ArrayLike,
                       masses: ArrayLike, params: Any, molecules: ArrayLike | None, *,
                       space: Space | None = None, neighbors: Any = None,
                       diagonal: bool = False) -> jax.Array:
    r"""The molecular pressure: the virial theorem applied to the molecules' centres of mass,

    .. math::
        P = \frac{2K^{com} + W^{mol}}{3V},\qquad
        W^{mol} = \sum_{I<J} R_{IJ}\cdot F_{IJ} = W - \sum_i d_i\cdot f_i,

    with :math:`K^{com} = \sum_I \frac12 M_I V_I^2`, :math:`W` the atomic virial of
    ``energy`` and :math:`d_i` atom :math:`i`'s offset from its molecule's centre of mass
    (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed. 2017, §2.12; Ciccotti &
    Ryckaert, Comput. Phys. Rep. 4, 345 (1986)). Intramolecular and constraint forces do
    not enter; for rigid molecules it equals, at every instant, the atomic pressure with
    the constraint forces' virial included. ``molecules`` is ``(w, k)`` atom indices (one
    molecule a row; other atoms are their own molecules; ``None``: atoms alone, the atomic
    pressure). ``diagonal=True`` gives :math:`P_{aa} = (2K^{com}_{aa} + W^{mol}_{aa})/V`,
    ``(3,)``, the diagonal of the molecular pressure tensor.
    """
    space = energy.space if space is None else space
    x = jnp.asarray(positions)
    ids, ref = molecule_index(molecules, x.shape[0])
    return _molecular_pressure_jit(energy, space, x, jnp.asarray(velocities, x.dtype),
                                   jnp.asarray(masses, x.dtype), params, ids, ref, neighbors,
                                   diagonal)


@jax.jit(static_argnames="diagonal")
def _molecular_pressure_jit(energy, space, x, v, masses, params, ids, ref, neighbors,
                            diagonal):
    _, f = energy.energy_and_forces(x, params, neighbors)
    d, u = _molecular_parts(space, x, v, masses, ids, ref)
    w = _molecular_virial(energy, space, x, f, params, neighbors, d, diagonal)
    m = 1.0 / inverse_mass(masses, x)
    vc = v - u                                                 # each atom's molecule's
    dim = x.shape[1]
    if diagonal:
        return (jnp.sum(m * vc * vc, axis=0) + w) / space.volume(dim)
    return (jnp.sum(m * vc * vc) + w) / (dim * space.volume(dim))


class CellState(NamedTuple):
    """The box ``()`` (a cube) or ``(3,)``, the thermostat's heat, the barostat's work, the
    (molecular) virial at the current positions (scalar, or its diagonal when
    anisotropic), the box at the list's last build, the list's build count then, the box's
    bounds (the smallest side, twice the cutoff; ten times the starting box), and whether
    SETTLE found every molecule so far (sticky)."""

    box: jax.Array
    heat: jax.Array
    work: jax.Array
    virial: jax.Array
    build_box: jax.Array
    builds: jax.Array
    smallest: jax.Array
    largest: jax.Array
    solved: jax.Array


@jax.tree_util.register_pytree_node_class
class StochasticCellRescaling(Integrator):
    r"""NPT: stochastic cell rescaling (isotropic or orthorhombic) with stochastic velocity
    rescaling, for atoms or rigid water.

    Bernetti & Bussi, J. Chem. Phys. 153, 114107 (2020). The volume follows a first-order
    stochastic equation for :math:`\varepsilon = \ln V`,

    .. math::
        d\varepsilon = -\frac{\beta_T}{\tau_p}\left(P_0 - P_{int} - \frac{kT}{V}\right)dt
            + \sqrt{\frac{2 kT \beta_T}{V\tau_p}}\,dW,\qquad
        P_{int} = \frac{2K + W}{3V},

    positions scale by :math:`e^{d\varepsilon/3}` and velocities by its inverse; the
    temperature is held by :class:`Bussi` rescaling, half a step on each side of velocity
    Verlet. ``anisotropic=True`` gives each side :math:`\eta_a = \ln L_a` of an
    orthorhombic box its own equation, driven by the diagonal of the pressure tensor
    :math:`P_{aa} = (2K_{aa} + W_{aa})/V` (the anisotropic variant, Del Tatto, Raiteri,
    Bernetti & Bussi, Appl. Sci. 12, 1139 (2022), restricted to diagonal cells),

    .. math::
        d\eta_a = -\frac{\beta_T}{3\tau_p}\left(P_0 - P_{aa} - \frac{kT}{V}\right)dt
            + \sqrt{\frac{2 kT \beta_T}{3V\tau_p}}\,dW_a,

    whose sum is the isotropic equation. It samples the isothermal-isobaric ensemble,
    volume fluctuations included, for any :math:`\tau_p`; the compressibility
    :math:`\beta_T` only sets how fast the volume relaxes. One Euler-Maruyama step of the
    cell per step, between the drift and the force, with the pressure at the step's start:
    one force and one virial evaluation a step. Needs an energy with a virial (its
    diagonal when anisotropic), a periodic 3D space (a ``(3,)`` box when anisotropic) and
    an explicit ``key``.

    **Rigid molecules.** With ``constraints=Settle(...)`` (without a thermostat of its own)
    the molecules are held rigid by SETTLE after the drift and after the second kick, the
    cell move scales each molecule's centre of mass, :math:`X_I \to \mu X_I` (and its
    centre-of-mass velocity by :math:`1/\mu`), so the constraints stay exact, the pressure
    is the molecular one (:func:`molecular_pressure`: centre-of-mass kinetic energy and
    :math:`W^{mol} = W - \sum_i d_i\cdot f_i`), and the thermostat has
    :math:`3(n-1) - 3w` degrees of freedom. ``constraints=Rattle(...)`` does the same for
    any rigid molecules (the connected clusters of its bonds), with SHAKE and RATTLE in
    place of SETTLE and :math:`3(n-1) - m` degrees of freedom for ``m`` bonds.

    **Effective energy.** ``Trajectory.conserved`` is
    :math:`\tilde H = K + U + P_0 V + Q + \mathcal{W}`: the thermostat's heat :math:`Q`
    (the kinetic energy it removed) and the barostat's work :math:`\mathcal{W}`, the
    energy each cell move removed, noise included: the exact change of :math:`K` and of
    :math:`P_0 V`, and the change of :math:`U` to second order,
    :math:`-\sum_a \ln\mu_a\,(W_{aa}^{n} + W_{aa}^{n+1})/2` (Bernetti & Bussi 2020,
    "effective energy"). Its drift measures the integration error and vanishes as
    :math:`dt \to 0`. The run fails with ``UNSTABLE_DYNAMICS`` when the box collapses below
    twice the cutoff, grows tenfold in a side, or is not finite; with ``SETTLE_FAILED``
    when SETTLE finds no solution.

    Args:
        kT: Temperature.
        pressure: Target pressure :math:`P_0` (hydrostatic).
        tau_t: The thermostat's time.
        tau_p: The barostat's relaxation time.
        compressibility: :math:`\beta_T` (an estimate is enough: ~0.1 for a Lennard-Jones
            liquid near its triple point, in reduced units; 4.5e-5 /bar for water).
        dof: Degrees of freedom of the thermostat; ``d (n - 1)`` by default, less
            ``3w`` with ``w`` rigid molecules.
        anisotropic: Each side of an orthorhombic box on its own.
        constraints: ``None``, a :class:`Settle` (with ``thermostat=None``) for rigid
            water, or a :class:`Rattle` for rigid bonds.
    """

    stochastic = True

    def __init__(self, kT: float, pressure: float, tau_t: float, tau_p: float,
                 compressibility: float, dof: int | None = None, *,
                 anisotropic: bool = False, constraints: Settle | Rattle | None = None) -> None:
        self.kT, self.pressure = kT, pressure
        self.tau_t, self.tau_p, self.compressibility = tau_t, tau_p, compressibility
        self.dof = None if dof is None else int(dof)
        self.anisotropic = bool(anisotropic)
        self.molecules = None
        if isinstance(constraints, Rattle):
            self.molecules = jnp.asarray(constraints.molecules())
        elif constraints is not None:
            if not isinstance(constraints, Settle):
                raise TypeError(f"StochasticCellRescaling: constraints must be a Settle or a "
                                f"Rattle, got {type(constraints).__name__}")
            self.molecules = constraints.molecules
            if constraints.thermostat is not None:
                raise ValueError("StochasticCellRescaling: give the Settle no thermostat of "
                                 "its own (the barostat's Bussi thermostat holds the "
                                 "temperature)")
        self.constraints = constraints

    def tree_flatten(self):
        return ((self.kT, self.pressure, self.tau_t, self.tau_p, self.compressibility,
                 self.constraints, self.molecules), (self.dof, self.anisotropic))

    @classmethod
    def tree_unflatten(cls, static, children):
        out = object.__new__(cls)
        (out.kT, out.pressure, out.tau_t, out.tau_p, out.compressibility,
         out.constraints, out.molecules) = children
        out.dof, out.anisotropic = static
        return out

    def __repr__(self):
        extra = ", anisotropic=True" if self.anisotropic else ""
        if self.constraints is not None:
            extra += f", constraints={self.constraints!r}"
        return (f"StochasticCellRescaling(kT={self.kT!r}, pressure={self.pressure!r}, "
                f"tau_t={self.tau_t!r}, tau_p={self.tau_p!r}{extra})")

    # -- helpers ------------------------------------------------------------------------
    def _index(self, n):
        return molecule_index(self.molecules, n)

    def _dof(self, positions):
        if self.dof is not None or self.constraints is None:
            return degrees_of_freedom(self.dof, positions)
        n, d = positions.shape
        if isinstance(self.constraints, Rattle):
            return d * (n - 1) - self.constraints.bonds.shape[0]
        return d * (n - 1) - 3 * self.constraints.molecules.shape[0]

    def _virial(self, model, x, f, masses, params, nbrs, index):
        if self.constraints is None:
            if self.anisotropic:
                return virial_diagonal(model.energy, x, params, nbrs)
            return model.energy.virial(x, params, nbrs)
        d, _ = _molecular_parts(model.space, x, None, masses, *index)
        return _molecular_virial(model.energy, model.space, x, f, params, nbrs, d,
                                 self.anisotropic)

    def _energy_forces_virial(self, model, x, masses, params, nbrs, index):
        """``(U, F, W)`` at ``x`` from one evaluation (:meth:`Energy.energy_forces_virial`:
        one pass over the pairs for :func:`pair_energy`); ``W`` the (molecular) virial, its
        diagonal when anisotropic."""
        checked = box_checked_upstream() if model.box_checked else contextlib.nullcontext()
        with checked:
            e, f, w = model.energy.energy_forces_virial(x, params, nbrs,
                                                        diagonal=self.anisotropic)
        if self.constraints is not None:
            d, _ = _molecular_parts(model.space, x, None, masses, *index)
            w = w - (jnp.sum(d * f, axis=0) if self.anisotropic else jnp.sum(d * f))
        return e, f, w

    def _kinetic(self, v, masses):
        """:math:`K` (``()``), or :math:`K_{aa}` (``(3,)``) when anisotropic: one reduction."""
        if not self.anisotropic:
            return kinetic(v, masses)
        m = jnp.asarray(masses, v.dtype)
        m = m[:, None] if m.ndim == 1 else m
        return 0.5 * jnp.sum(m * v * v, axis=0)

    def _thermostat(self, v, masses, nf, time, draws, heat, k=None):
        """Bussi rescaling over ``time`` with ``draws = (r1, s)`` (:func:`bussi_draws`);
        returns ``(v, heat, alpha^2)``. ``k``: the kinetic energy of ``v`` (or its
        diagonal), when known."""
        k = self._kinetic(v, masses) if k is None else k
        total = jnp.sum(k)
        c = jnp.exp(-time / jnp.asarray(self.tau_t, v.dtype))
        new = bussi_kinetic_from(total, 0.5 * nf * jnp.asarray(self.kT, v.dtype), nf, c,
                                 *draws)
        scale2 = new / total
        return jnp.sqrt(scale2) * v, heat + total - new, scale2

    # -- the integrator ------------------------------------------------------------------
    def init(self, model, carry: Carry, masses, params):
        x = carry.positions
        if not model.space.periodic or x.shape[1] != 3:
            raise ValueError("StochasticCellRescaling needs a periodic 3D space")
        nbrs = carry.neighbors
        if nbrs is not None and not isinstance(nbrs, NeighborList):
            raise ValueError(f"StochasticCellRescaling follows a neighbor_list(...) as the box "
                             f"changes, not a {type(nbrs).__name__}")
        box = jnp.asarray(model.space.box, x.dtype)       # a cube stays one: shape () or (3,)
        if self.anisotropic:
            if box.ndim == 0 or (nbrs is not None and jnp.ndim(nbrs.space.box) == 0):
                raise ValueError("StochasticCellRescaling(anisotropic=True) needs a box of "
                                 "three sides: periodic(jnp.full(3, L)) for the space and "
                                 "the neighbour list")
        r_cut = getattr(model.energy, "r_cut", None) or 0.0
        builds = nbrs.n_builds if nbrs is not None else jnp.int32(0)
        virial = self._virial(model, x, carry.forces, masses, params, nbrs,
                              self._index(x.shape[0]))
        zero = jnp.zeros((), x.dtype)
        return CellState(box, zero, zero, virial, box, builds,
                         jnp.asarray(2.0 * r_cut, x.dtype), 10.0 * box, jnp.array(True))

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        dtype = carry.velocities.dtype
        x0 = carry.positions
        nf = self._dof(x0)
        index = self._index(x0.shape[0])
        # all the step's random numbers in two draws: the two thermostat half-steps' (r1, s)
        # and the cell's noise (one normal, or three when anisotropic)
        n_cell = 3 if self.anisotropic else 1
        normals, s = bussi_draws(jax.random.fold_in(key, carry.step), nf, 2, n_cell,
                                 carry.velocities.dtype)
        first, second, z = (normals[0], s[0]), (normals[1], s[1]), normals[2:]
        cell = carry.extra
        half = 0.5 * dt
        inv_m = inverse_mass(masses, carry.velocities)
        old_space = Space(cell.box, True)
        settle = self.constraints
        # thermostat, the pressure at the step's start, half kick, drift (in the old box)
        volume = _volume(cell.box)
        if settle is None:
            # 2K after the thermostat is alpha^2 (2K before): no second reduction
            k0 = self._kinetic(carry.velocities, masses)
            v, heat, scale2 = self._thermostat(carry.velocities, masses, nf, half, first,
                                               cell.heat, k0)
            two_k = 2.0 * scale2 * k0
        else:
            v, heat, _ = self._thermostat(carry.velocities, masses, nf, half, first, cell.heat)
            _, u = _molecular_parts(old_space, x0, v, masses, *index)
            vc = v - u
            two_k = (jnp.sum(vc * vc / inv_m, axis=0) if self.anisotropic
                     else jnp.sum(vc * vc / inv_m))
        if self.anisotropic:
            p_int = (two_k + cell.virial) / volume
        else:
            p_int = (two_k + cell.virial) / (3.0 * volume)
        v = v + half * carry.forces * inv_m
        x1 = x0 + dt * v
        solved = cell.solved
        if settle is None:
            x = x1
        elif isinstance(settle, Rattle):
            x, v, ok = settle.constrain_positions(old_space, x0, x1, v, masses, dt)
            solved = solved & ok
        else:
            x, ok = settle_positions(old_space, x0, x1, settle.molecules, masses, settle.d_oh,
                                     settle.d_hh)
            v = v + (x - x1) / dt
            solved = solved & jnp.all(ok)
        # the cell: one Euler-Maruyama step of ln V (or of each ln L_a)
        kT = jnp.asarray(self.kT, dtype)
        beta = jnp.asarray(self.compressibility, dtype)
        tau_p = jnp.asarray(self.tau_p, dtype)
        p0 = jnp.asarray(self.pressure, dtype)
        if self.anisotropic:
            rate = beta / (3.0 * tau_p)
            log_mu = (-rate * (p0 - p_int - kT / volume) * dt
                      + jnp.sqrt(2.0 * kT * rate * dt / volume) * z)
        else:
            z = z[0]
            log_mu = (-beta / tau_p * (p0 - p_int - kT / volume) * dt
                      + jnp.sqrt(2.0 * kT * beta * dt / (volume * tau_p)) * z) / 3.0
        mu = jnp.exp(log_mu)
        box = mu * cell.box
        here = with_box(model, box)
        if settle is None:     # K_aa scales by 1/mu_a^2 exactly: one reduction
            d_kinetic = jnp.sum((1.0 / (mu * mu) - 1.0) * self._kinetic(v, masses))
            x, v = mu * x, v / mu
        else:                    # centres of mass scaled, each molecule moved rigidly
            k_before = kinetic(v, masses)
            d, u = _molecular_parts(old_space, x, v, masses, *index)
            x = mu * x - (mu - 1.0) * d
            v = v / mu + (1.0 - 1.0 / mu) * u
            d_kinetic = kinetic(v, masses) - k_before
        x = here.space.wrap(x)
        nbrs, build_box, builds = carry.neighbors, cell.build_box, cell.builds
        if nbrs is not None:
            # The list is kept in the box of the step's start; one the driver replaced since
            # (reallocated at this chunk's start positions, in another box) is rebuilt.
            fresh = nbrs.n_builds != cell.builds
            nbrs = nbrs.replace(space=Space(cell.box, True))
            nbrs, rebuilt = follow_box(nbrs, x, box,
                                       jnp.where(fresh, jnp.inf, build_box))
            build_box = jnp.where(rebuilt, box, build_box)
            builds = nbrs.n_builds
        e, f, virial = self._energy_forces_virial(here, x, masses, params, nbrs, index)
        v = v + half * f * inv_m
        if isinstance(settle, Rattle):
            v, ok = settle.constrain_velocities_on(here.space, x, v, masses)
            solved = solved & ok
        elif settle is not None:
            v = settle_velocities(here.space, x, v, settle.molecules, masses)
        v, heat, _ = self._thermostat(v, masses, nf, half, second, heat)
        # the energy this cell move removed: K and P0 V exactly, U to second order
        d_potential = -jnp.sum(jnp.broadcast_to(log_mu, jnp.shape(virial))
                               * 0.5 * (cell.virial + virial))
        work = cell.work - (d_kinetic + d_potential + p0 * (_volume(box) - volume))
        extra = cell._replace(box=box, heat=heat, work=work, virial=virial,
                              build_box=build_box, builds=builds, solved=solved)
        return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                              neighbors=nbrs, step=carry.step + 1, extra=extra)

    def observe(self, carry: Carry, masses) -> dict:
        cell = carry.extra
        volume = _volume(cell.box)
        return dict(conserved=carry.potential_energy + kinetic(carry.velocities, masses)
                    + cell.heat + cell.work + jnp.asarray(self.pressure, volume.dtype) * volume,
                    box=jnp.broadcast_to(cell.box, (3,)))

    def check(self, carry: Carry) -> jax.Array:
        cell = carry.extra
        box = cell.box
        bad = (~jnp.all(jnp.isfinite(box)) | (jnp.min(box) < cell.smallest)
               | jnp.any(box > cell.largest))
        failed = (Result.CONSTRAINTS_NOT_CONVERGED if isinstance(self.constraints, Rattle)
                  else Result.SETTLE_FAILED)
        return jnp.where(bad, jnp.int32(Result.UNSTABLE_DYNAMICS),
                         jnp.where(cell.solved, jnp.int32(0), jnp.int32(failed)))
