r"""Constant pressure: stochastic cell rescaling (isotropic), with the box as a dynamic variable.

The box rides in the integrator's state (``carry.extra``); each step rebuilds the model's
space with it, so energies, minimum images and the virial all see the current box, and the
neighbour list follows it (:func:`follow_box`) without missing pairs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._errors import Result
from ._dynamics import Carry, Integrator, kinetic
from ._neighbors import NeighborList, missing_pairs
from ._space import Space
from ._thermostats import bussi_kinetic, degrees_of_freedom


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
    out = lax.cond(safe, lambda: moved, lambda: moved.build(positions))
    if nbrs.debug:
        out = out.replace(missed_pairs=out.missed_pairs + missing_pairs(out, positions))
    return out, ~safe


class CellState(NamedTuple):
    """The box ``(d,)``, the thermostat's heat, the virial at the current positions, the box
    at the list's last build, the list's build count then, and the box's bounds (the
    smallest side, twice the cutoff; ten times the starting box)."""

    box: jax.Array
    heat: jax.Array
    virial: jax.Array
    build_box: jax.Array
    builds: jax.Array
    smallest: jax.Array
    largest: jax.Array


@jax.tree_util.register_pytree_node_class
class StochasticCellRescaling(Integrator):
    r"""NPT: stochastic cell rescaling (isotropic) with stochastic velocity rescaling.

    Bernetti & Bussi, J. Chem. Phys. 153, 114107 (2020). The volume follows a first-order
    stochastic equation for :math:`\varepsilon = \ln V`,

    .. math::
        d\varepsilon = -\frac{\beta_T}{\tau_p}\left(P_0 - P_{int} - \frac{kT}{V}\right)dt
            + \sqrt{\frac{2 kT \beta_T}{V\tau_p}}\,dW,\qquad
        P_{int} = \frac{2K + W}{3V},

    positions scale by :math:`e^{d\varepsilon/3}` and velocities by its inverse; the
    temperature is held by :class:`Bussi` rescaling, half a step on each side of velocity
    Verlet. It samples the isothermal-isobaric ensemble, volume fluctuations included, for
    any :math:`\tau_p` (no Parrinello-Rahman or MTK oscillations); the compressibility
    :math:`\beta_T` only sets how fast the volume relaxes. The box is taken one
    Euler-Maruyama step of :math:`\varepsilon` per step, between the drift and the force,
    with :math:`P_{int}` at the start of the step: one force and one virial evaluation a
    step. Needs an energy with a virial (:func:`pair_energy`, :func:`bond_energy`, their
    sums), a periodic 3D space and an explicit ``key``; ``tail_correction=True`` gives the
    untruncated Lennard-Jones pressure.

    ``Trajectory.box`` holds the box of every frame. ``Trajectory.conserved`` is the total
    energy plus the thermostat's heat and :math:`P_0 V`; it is not conserved (the
    barostat's work is not accumulated). The run fails with ``UNSTABLE_DYNAMICS`` when the
    box collapses below twice the cutoff, grows tenfold in a side, or is not finite.

    Args:
        kT: Temperature.
        pressure: Target pressure :math:`P_0`.
        tau_t: The thermostat's time.
        tau_p: The barostat's relaxation time.
        compressibility: :math:`\beta_T` (an estimate is enough: ~0.1 for a Lennard-Jones
            liquid near its triple point, in reduced units).
        dof: Degrees of freedom of the thermostat; ``d (n - 1)`` by default.
    """

    stochastic = True

    def __init__(self, kT: float, pressure: float, tau_t: float, tau_p: float,
                 compressibility: float, dof: int | None = None) -> None:
        self.kT, self.pressure = kT, pressure
        self.tau_t, self.tau_p, self.compressibility = tau_t, tau_p, compressibility
        self.dof = None if dof is None else int(dof)

    def tree_flatten(self):
        return (self.kT, self.pressure, self.tau_t, self.tau_p, self.compressibility), self.dof

    @classmethod
    def tree_unflatten(cls, dof, children):
        return cls(*children, dof)

    def __repr__(self):
        return (f"StochasticCellRescaling(kT={self.kT!r}, pressure={self.pressure!r}, "
                f"tau_t={self.tau_t!r}, tau_p={self.tau_p!r})")

    def init(self, model, carry: Carry, masses, params):
        x = carry.positions
        if not model.space.periodic or x.shape[1] != 3:
            raise ValueError("StochasticCellRescaling needs a periodic 3D space")
        if carry.neighbors is not None and not isinstance(carry.neighbors, NeighborList):
            raise ValueError(f"StochasticCellRescaling follows a neighbor_list(...) as the box "
                             f"changes, not a {type(carry.neighbors).__name__}")
        box = jnp.asarray(model.space.box, x.dtype)       # a cube stays one: shape () or (3,)
        r_cut = getattr(model.energy, "r_cut", None) or 0.0
        builds = carry.neighbors.n_builds if carry.neighbors is not None else jnp.int32(0)
        virial = model.energy.virial(x, params, carry.neighbors)
        return CellState(box, jnp.zeros((), x.dtype), virial, box, builds,
                         jnp.asarray(2.0 * r_cut, x.dtype), 10.0 * box)

    def _thermostat(self, v, masses, nf, time, key, heat):
        k = kinetic(v, masses)
        c = jnp.exp(-time / jnp.asarray(self.tau_t, v.dtype))
        new = bussi_kinetic(k, 0.5 * nf * jnp.asarray(self.kT, v.dtype), nf, c, key)
        return jnp.sqrt(new / k) * v, heat + k - new

    def step(self, model, carry: Carry, masses, params, dt, key) -> Carry:
        dtype = carry.velocities.dtype
        nf = degrees_of_freedom(self.dof, carry.positions)
        k1, k2, k3 = jax.random.split(jax.random.fold_in(key, carry.step), 3)
        cell = carry.extra
        half = 0.5 * dt
        m = jnp.asarray(masses, dtype)
        inv_m = (1.0 / m)[:, None] if m.ndim == 1 else 1.0 / m
        # thermostat, half kick, drift (in the old box)
        v, heat = self._thermostat(carry.velocities, masses, nf, half, k1, cell.heat)
        volume = _volume(cell.box)
        p_int = (2.0 * kinetic(v, masses) + cell.virial) / (3.0 * volume)
        v = v + half * carry.forces * inv_m
        x = carry.positions + dt * v
        # the cell: one Euler-Maruyama step of eps = ln V
        kT = jnp.asarray(self.kT, dtype)
        beta = jnp.asarray(self.compressibility, dtype)
        tau_p = jnp.asarray(self.tau_p, dtype)
        drift = -beta / tau_p * (jnp.asarray(self.pressure, dtype) - p_int - kT / volume) * dt
        noise = jnp.sqrt(2.0 * kT * beta * dt / (volume * tau_p)) * jax.random.normal(
            k3, (), dtype)
        mu = jnp.exp((drift + noise) / 3.0)
        box = mu * cell.box
        here = with_box(model, box)
        x = here.space.wrap(mu * x)
        v = v / mu
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
        e, f = here.energy_and_forces(x, params, nbrs)
        v = v + half * f * inv_m
        v, heat = self._thermostat(v, masses, nf, half, k2, heat)
        virial = here.energy.virial(x, params, nbrs)
        extra = cell._replace(box=box, heat=heat, virial=virial, build_box=build_box,
                              builds=builds)
        return carry._replace(positions=x, velocities=v, forces=f, potential_energy=e,
                              neighbors=nbrs, step=carry.step + 1, extra=extra)

    def observe(self, carry: Carry, masses) -> dict:
        cell = carry.extra
        volume = _volume(cell.box)
        return dict(conserved=carry.potential_energy + kinetic(carry.velocities, masses)
                    + cell.heat + jnp.asarray(self.pressure, volume.dtype) * volume,
                    box=jnp.broadcast_to(cell.box, (3,)))

    def check(self, carry: Carry) -> jax.Array:
        cell = carry.extra
        box = cell.box
        bad = (~jnp.all(jnp.isfinite(box)) | (jnp.min(box) < cell.smallest)
               | jnp.any(box > cell.largest))
        return jnp.where(bad, jnp.int32(Result.UNSTABLE_DYNAMICS), jnp.int32(0))
