r"""Total energies assembled from pair and bond potentials, and their forces.

For a pair potential :math:`u`, the energy of a configuration is
:math:`U = \sum_{i<j} u(r_{ij})` over pairs within the cutoff, and the force on particle
:math:`i` is :math:`F_i = -\partial U/\partial x_i = -\sum_{j} u'(r_{ij})\,(x_i - x_j)/r_{ij}`.
The direct path computes :math:`u'` elementwise with one forward-mode derivative
(``jax.jvp``) of ``u``, in the same pass as the energy, which is cheaper than the reverse-mode
gradient of :math:`U`; both agree to round-off (tests check it). Self pairs, pairs beyond the
cutoff and padded neighbour slots are masked with the double-``where`` pattern, so values
and gradients stay finite.

Without a neighbour list every pair is visited, in tiles of rows (``lax.map``), so memory
grows as ``n * tile`` rather than ``n**2``; each tile is recomputed in reverse mode
(``jax.checkpoint``), so gradients need no more memory than the forward pass.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.typing import ArrayLike

from .._errors import Result
from . import _native
from ._cells import CellList, cell_pass, check_cells
from ._cells_pallas import fits, interpret, lj_cells
from ._gravity_pallas import gravity_pair_sums, vmem_capacity
from ._mixing import MIXING_RULES, PairParams
from ._potentials import gravity, is_long_range, lennard_jones
from ._space import Space, check_box, checked_upstream, free, nan_unless_valid


class Energy:
    """Base class: ``energy(positions, params, neighbors=None) -> scalar``.

    Subclasses provide ``__call__`` (the total energy, pure JAX) and a ``space`` attribute,
    and must be pytrees (energies are arguments of compiled functions). Optional:
    :meth:`energy_and_forces` (default: ``jax.value_and_grad`` of ``__call__``),
    :meth:`virial` (for :func:`pressure`) and ``r_cut`` (needed with a neighbour list).
    Pair potentials need no subclass: give ``u(r, params)`` to :func:`pair_energy`
    (docs/extending.md). Energies add: ``lj + bonds``.
    """

    space: Space

    def __call__(self, positions, params, neighbors=None):
        raise NotImplementedError

    def energy_and_forces(self, positions, params, neighbors=None):
        e, g = jax.value_and_grad(self.__call__)(positions, params, neighbors)
        return e, -g

    def forces(self, positions, params, neighbors=None):
        """Forces ``-dU/dx``, shape ``(n, d)``."""
        return self.energy_and_forces(positions, params, neighbors)[1]

    def virial(self, positions, params, neighbors=None):
        r"""The pair virial :math:`W = \sum_{i<j} r_{ij}\cdot f_{ij}`, for the pressure."""
        raise NotImplementedError(f"{type(self).__name__} has no virial")

    def virial_tensor(self, positions, params, neighbors=None):
        r"""The virial tensor :math:`W_{ab} = \sum_{i<j} r_{ij,a} f_{ij,b}` ``(d, d)``, for the
        pressure tensor; its trace is :meth:`virial`."""
        raise NotImplementedError(f"{type(self).__name__} has no virial tensor")

    def energy_forces_virial(self, positions: jax.Array, params,
                             neighbors=None, *, diagonal: bool = False
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
        r"""``(U, F, W)``: the energy, the forces and the virial
        :math:`W = \sum_{i<j} r_{ij}\cdot f_{ij}` (``diagonal=True``: the diagonal
        :math:`W_{aa}` of the virial tensor, ``(d,)``), what a constant-pressure step needs
        at its new positions (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed.
        2017, §2.4). By default :meth:`energy_and_forces` and then :meth:`virial` (or
        :meth:`virial_tensor`); :func:`pair_energy` gives all three from one pass over the
        pairs."""
        e, f = self.energy_and_forces(positions, params, neighbors)
        return e, f, self._virial_of(positions, params, neighbors, diagonal)

    def _virial_of(self, positions, params, neighbors, diagonal):
        if not diagonal:
            return self.virial(positions, params, neighbors)
        w = self.virial_tensor(positions, params, neighbors)
        return jnp.diagonal(w) if w.ndim == 2 else w

    def __add__(self, other):
        if not isinstance(other, Energy):
            return NotImplemented
        return SumEnergy((self, other))


@jax.tree_util.register_pytree_node_class
class SumEnergy(Energy):
    """The sum of several energies, sharing one ``params`` dict and neighbour list."""

    def tree_flatten(self):
        return (self.terms,), None

    @classmethod
    def tree_unflatten(cls, _, children):
        return cls(children[0])

    def __init__(self, terms):
        flat = []
        for t in terms:
            flat.extend(t.terms if isinstance(t, SumEnergy) else [t])
        self.terms = tuple(flat)
        self.space = flat[0].space
        self.r_cut = max((t.r_cut for t in flat if getattr(t, "r_cut", None) is not None),
                         default=None)

    def __call__(self, positions, params, neighbors=None):
        return sum(t(positions, params, neighbors) for t in self.terms)

    def energy_and_forces(self, positions, params, neighbors=None):
        parts = [t.energy_and_forces(positions, params, neighbors) for t in self.terms]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def virial(self, positions, params, neighbors=None):
        return sum(t.virial(positions, params, neighbors) for t in self.terms)

    def energy_forces_virial(self, positions: jax.Array, params, neighbors=None, *,
                             diagonal: bool = False
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The terms' ``(U, F, W)`` summed (:meth:`Energy.energy_forces_virial`)."""
        parts = [t.energy_forces_virial(positions, params, neighbors, diagonal=diagonal)
                 for t in self.terms]
        return tuple(sum(p[k] for p in parts) for k in range(3))

    def virial_tensor(self, positions, params, neighbors=None):
        """The terms' virial tensors summed, ``(d, d)``; only the diagonal ``(d,)`` where
        some term gives only its diagonal (:func:`pme`, :func:`ewald`)."""
        parts = [t.virial_tensor(positions, params, neighbors) for t in self.terms]
        if all(w.ndim == 2 for w in parts):
            return sum(parts)
        return sum(jnp.diagonal(w) if w.ndim == 2 else w for w in parts)


@jax.tree_util.register_pytree_node_class
class PairEnergy(Energy):
    """The energy of a pair potential; build it with :func:`pair_energy`.

    A pytree: the space (its box) is a leaf; the potential, cutoff and options are static.
    """

    def __init__(self, potential: Callable[..., jax.Array], space: Space, r_cut: float | None,
                 shift: bool, mixing: Mapping[str, Callable] | None, tile: int,
                 tail: bool = False) -> None:
        self.potential = potential
        self.space = space
        self.r_cut = r_cut
        self.shift = shift
        self.mixing = tuple(sorted((mixing or {}).items()))
        self.rules = {**MIXING_RULES, **dict(self.mixing)}
        self.tile = tile
        self.tail = tail

    def tree_flatten(self):
        return (self.space,), (self.potential, self.r_cut, self.shift, self.mixing, self.tile,
                               self.tail)

    @classmethod
    def tree_unflatten(cls, static, children):
        potential, r_cut, shift, mixing, tile, tail = static
        return cls(potential, children[0], r_cut, shift, dict(mixing), tile, tail)

    def __repr__(self):
        name = getattr(self.potential, "__name__", repr(self.potential))
        tail = ", tail_correction=True" if self.tail else ""
        return (f"pair_energy({name}, {self.space!r}, r_cut={self.r_cut}, "
                f"shift={self.shift}{tail})")

    # -- long-range (tail) corrections ---------------------------------------------------
    def _tail_constants(self, positions, params):
        """``(n, V, eps sigma^3, (sigma/r_c)^3)`` for the Lennard-Jones tail terms."""
        n, d = positions.shape
        if d != 3:
            raise ValueError(f"tail_correction is the 3D tail; positions are {d}D")
        sigma = jnp.asarray(params["sigma"], positions.dtype)
        epsilon = jnp.asarray(params["epsilon"], positions.dtype)
        if sigma.ndim or epsilon.ndim:
            raise ValueError(f"tail_correction needs one sigma and one epsilon (scalars), got "
                             f"shapes {sigma.shape} and {epsilon.shape}")
        s3 = (sigma / self.r_cut) ** 3
        return n, self.space.volume(d), epsilon * sigma**3, s3

    def tail_energy(self, positions, params) -> jax.Array:
        r"""The energy that the truncation leaves out, with :math:`g(r) = 1` beyond
        :math:`r_c`: :math:`U_{tail} = \frac{8}{3}\pi \frac{n^2}{V}\epsilon\sigma^3
        \left[\frac13\left(\frac{\sigma}{r_c}\right)^9 - \left(\frac{\sigma}{r_c}\right)^3
        \right]` (Allen & Tildesley 2017, §2.8). Zero without ``tail_correction``."""
        if not self.tail:
            return jnp.zeros((), jnp.result_type(positions))
        n, volume, es3, s3 = self._tail_constants(positions, params)
        return 8.0 / 3.0 * jnp.pi * n * n / volume * es3 * (s3**3 / 3.0 - s3)

    def tail_virial(self, positions, params) -> jax.Array:
        r""":math:`W_{tail} = 3 V P_{tail}` with :math:`P_{tail} = \frac{16}{3}\pi\rho^2
        \epsilon\sigma^3\left[\frac23\left(\frac{\sigma}{r_c}\right)^9
        - \left(\frac{\sigma}{r_c}\right)^3\right]` (Allen & Tildesley 2017, §2.8);
        zero without ``tail_correction``."""
        if not self.tail:
            return jnp.zeros((), jnp.result_type(positions))
        n, volume, es3, s3 = self._tail_constants(positions, params)
        return 16.0 * jnp.pi * n * n / volume * es3 * (2.0 * s3**3 / 3.0 - s3)

    # -- the pair kernel ---------------------------------------------------------------
    def _terms(self, dr, valid, pp, want_derivative):
        """Energies (and ``u'(r)/r``) of pairs with displacement components ``dr``."""
        r2 = sum(c * c for c in dr)
        mask = valid
        if self.r_cut is not None:
            mask = mask & (r2 < self.r_cut**2)
        r = jnp.sqrt(jnp.where(mask, r2, 1.0))

        def u(r):
            value = self.potential(r, pp)
            if self.shift:
                value = value - self.potential(jnp.full_like(r, self.r_cut), pp)
            return value

        if not want_derivative:
            return jnp.where(mask, u(r), 0.0), None, r
        value, du = jax.jvp(u, (r,), (jnp.ones_like(r),))
        return jnp.where(mask, value, 0.0), jnp.where(mask, du / r, 0.0), r

    def _check(self, positions, neighbors):
        """The positions as an array, after the eager checks, and the in-graph box code
        (:func:`check_box`; ``None`` when the box was checked eagerly)."""
        positions = jnp.asarray(positions)
        if positions.ndim != 2:
            raise ValueError(f"positions must have shape (n, d), got {positions.shape}")
        if positions.shape[0] == 0:
            raise ValueError(f"positions has no particles (shape {positions.shape})")
        if neighbors is not None:
            cells = isinstance(neighbors, CellList)
            kind = "cell list" if cells else "neighbour list"
            n_listed = neighbors.n_particles if cells else neighbors.idx.shape[0]
            if self.r_cut is None:
                raise ValueError(f"a {kind} was given but this energy has no r_cut; "
                                 "build it with pair_energy(..., r_cut=...)")
            if neighbors.r_cut < self.r_cut:
                raise ValueError(f"the {kind}'s r_cut={neighbors.r_cut} is below the "
                                 f"energy's r_cut={self.r_cut}; pairs would be missed")
            if n_listed != positions.shape[0]:
                raise ValueError(f"the {kind} is for {n_listed} particles, "
                                 f"positions has {positions.shape[0]}")
            if cells:
                check_cells(neighbors, positions)
        code = check_box(self.space, positions.shape[1], self.r_cut, caller="pair_energy",
                         what="the energy's r_cut")
        return positions, _with_finite_positions(code, positions)

    def _neighbor_pass(self, positions, params, neighbors, want_derivative):
        n, d = positions.shape
        idx = neighbors.idx
        valid = idx < n
        j = jnp.where(valid, idx, 0)
        xt = positions.T
        dr = [self.space.minimum_image(xt[k][:, None] - xt[k][j], k) for k in range(d)]
        pp = PairParams(params, n, lambda a: a[:, None], lambda a: a[j], self.rules)
        u, c, r = self._terms(dr, valid, pp, want_derivative)
        return u, c, r, dr

    def _tiles(self, positions, params, body):
        """``body(dr, valid, pp, rows)`` summed or stacked over row tiles of all pairs."""
        n, d = positions.shape
        tile = min(self.tile, n)
        n_tiles = -(-n // tile)
        rows = jnp.arange(n_tiles * tile).reshape(n_tiles, tile)
        xt = positions.T
        cols = jnp.arange(n)

        def one(rows):
            i = jnp.minimum(rows, n - 1)
            valid = (rows[:, None] < n) & (rows[:, None] != cols[None, :])
            dr = [self.space.minimum_image(xt[k][i][:, None] - xt[k][None, :], k)
                  for k in range(d)]
            pp = PairParams(params, n, lambda a: a[i][:, None], lambda a: a[None, :],
                            self.rules)
            return body(dr, valid, pp)

        return lax.map(jax.checkpoint(one), rows)

    # -- public ------------------------------------------------------------------------
    def __call__(self, positions, params, neighbors=None):
        """The total energy :math:`U = \\sum_{i<j} u(r_{ij})` (plus :meth:`tail_energy`), a
        scalar (NaN for a traced box that :func:`check_box` refuses)."""
        positions, code = self._check(positions, neighbors)
        tail = self.tail_energy(positions, params)
        if isinstance(neighbors, CellList):
            return nan_unless_valid(code, cell_pass(self, positions, params, neighbors,
                                                    False)[0] + tail)
        if neighbors is not None:
            u, _, _, _ = self._neighbor_pass(positions, params, neighbors, False)
            return nan_unless_valid(code, 0.5 * jnp.sum(u) + tail)
        out = self._tiles(positions, params,
                          lambda dr, valid, pp: jnp.sum(self._terms(dr, valid, pp, False)[0]))
        return nan_unless_valid(code, 0.5 * jnp.sum(out) + tail)

    def energy_and_forces(self, positions, params, neighbors=None):
        """The energy and the forces ``(n, d)`` in one pass (the tail adds no force; NaN for
        a traced box that :func:`check_box` refuses)."""
        positions, code = self._check(positions, neighbors)
        e, f = self._pair_energy_and_forces(positions, params, neighbors)
        if self.tail:
            e = e + self.tail_energy(positions, params)
        return nan_unless_valid(code, e, f)

    def _pair_energy_and_forces(self, positions, params, neighbors):
        """Energy and forces of the pairs from the kernel that serves this call."""
        if isinstance(neighbors, CellList):
            if self._pallas_lj(positions, params, neighbors):
                u, f, _ = _lj_cells(self, positions, params, neighbors, False)
                return u, f
            u, f, _ = cell_pass(self, positions, params, neighbors, True)
            return u, f[neighbors.atom_slot]
        if self._direct_gravity(positions, params, neighbors):
            if _native.load() is not None or jax.default_backend() == "tpu":
                return _gravity_by_backend(positions, params, self)
            return _gravity_direct(self, positions, *_gravity_arguments(positions, params))
        if self._native_lj(positions, params, neighbors):
            return _lj_native(positions, params, neighbors, self)
        return self._energy_and_forces(positions, params, neighbors)

    def _lj_parameter_shapes(self, positions, params):
        """The shapes of ``sigma`` and ``epsilon`` where this is plain 3D Lennard-Jones with a
        cutoff, float32/64 positions, the default (Lorentz-Berthelot) mixing and no
        parameter that promotes the dtype, which the dedicated LJ kernels take; else
        ``None``."""
        if not (self.potential is lennard_jones and self.r_cut is not None
                and positions.ndim == 2 and positions.shape[1] == 3
                and positions.dtype in (jnp.float32, jnp.float64)
                and isinstance(params, Mapping) and "sigma" in params
                and "epsilon" in params
                and self.rules["sigma"] is MIXING_RULES["sigma"]
                and self.rules["epsilon"] is MIXING_RULES["epsilon"]):
            return None
        values = (params["sigma"], params["epsilon"])
        try:
            shapes = [jnp.shape(v) for v in values]
            promoted = jnp.result_type(positions.dtype, *values)
        except TypeError:
            return None
        return shapes if promoted == positions.dtype else None

    def _native_lj(self, positions, params, neighbors):
        """Whether the native Lennard-Jones kernel over a neighbour list serves this call:
        :meth:`_lj_parameter_shapes`, with ``sigma`` and ``epsilon`` scalars or one per
        particle, and the native library built."""
        if getattr(getattr(neighbors, "idx", None), "dtype", None) != jnp.int32:
            return False
        shapes = self._lj_parameter_shapes(positions, params)
        n = positions.shape[0]
        return (shapes is not None and all(s in ((), (n,)) for s in shapes)
                and _native.load() is not None)

    def _pallas_lj(self, positions, params, neighbors):
        """Whether the Pallas Lennard-Jones cell kernel (``_cells_pallas``) serves this call:
        cells built with ``kernel="pallas"`` and the half shell, float32,
        :meth:`_lj_parameter_shapes` with one ``sigma`` and one ``epsilon``, a capacity that
        fills whole sublanes (a multiple of 8), and on a TPU resident arrays that fit its
        VMEM."""
        if not (isinstance(neighbors, CellList) and neighbors.kernel == "pallas"
                and neighbors.shell == "half" and neighbors.capacity % 8 == 0
                and positions.dtype == jnp.float32):
            return False
        shapes = self._lj_parameter_shapes(positions, params)
        vmem = vmem_capacity() if jax.default_backend() == "tpu" else None
        return (shapes is not None and all(s == () for s in shapes)
                and fits(neighbors.grid, neighbors.capacity, vmem))

    def _direct_gravity(self, positions, params, neighbors):
        """Whether this call is plain direct-sum gravity, which the dedicated kernels serve
        (the native one on the CPU, :func:`_gravity_direct` elsewhere)."""
        return (self.potential is gravity and neighbors is None and self.r_cut is None
                and not self.space.periodic and positions.shape[1] == 3
                and positions.dtype in (jnp.float32, jnp.float64)
                and isinstance(params, Mapping)
                and set(params) <= {"G", "softening", "masses"}
                and jnp.ndim(params["masses"]) in (0, 1)
                and self.rules["masses"] is MIXING_RULES["masses"])

    def _native_gravity(self, positions, params, neighbors):
        """Whether the native direct-sum gravity kernel serves this call."""
        return (self._direct_gravity(positions, params, neighbors)
                and _native.load() is not None)

    def _energy_and_forces(self, positions, params, neighbors=None):
        n, d = positions.shape
        if neighbors is not None:
            u, c, _, dr = self._neighbor_pass(positions, params, neighbors, True)
            forces = jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)], axis=1)
            return 0.5 * jnp.sum(u), forces

        def body(dr, valid, pp):
            u, c, _ = self._terms(dr, valid, pp, True)
            return jnp.sum(u), jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)])

        e, f = self._tiles(positions, params, body)         # f: (n_tiles, d, tile)
        forces = jnp.moveaxis(f, 1, 2).reshape(-1, d)[:n]
        return 0.5 * jnp.sum(e), forces

    def energy_forces_virial(self, positions: jax.Array, params, neighbors=None, *,
                             diagonal: bool = False
                             ) -> tuple[jax.Array, jax.Array, jax.Array]:
        r"""``(U, F, W)`` from one pass over the pairs: the energy, the forces and the
        virial :math:`W = -\sum_{i<j} r u'(r)` (``diagonal=True``: the diagonal of the
        virial tensor, :math:`W_{aa} = -\sum_{i<j} r_a^2 u'(r)/r`, ``(d,)``), tail terms
        included (:meth:`tail_energy`, :meth:`tail_virial`, a third of it on each diagonal
        entry). Over a neighbour list the native Lennard-Jones kernel sums all three in its
        force loop; the pure-JAX pass reuses its pair terms. Other cases: the energy and
        forces, then :meth:`virial` or :meth:`virial_tensor`."""
        if isinstance(neighbors, CellList) or neighbors is None:
            return super().energy_forces_virial(positions, params, neighbors,
                                                diagonal=diagonal)
        positions, code = self._check(positions, neighbors)
        d = positions.shape[1]
        if self._native_lj(positions, params, neighbors):
            e, f, w = _lj_native_all(positions, params, neighbors, self, diagonal)
        else:
            e, f, w = _list_sums(*self._neighbor_pass(positions, params, neighbors, True),
                                 diagonal)
        if self.tail:
            e = e + self.tail_energy(positions, params)
            tail = self.tail_virial(positions, params)
            w = w + (tail / d if diagonal else tail)
        return nan_unless_valid(code, e, f, w)

    def virial(self, positions, params, neighbors=None):
        r"""The pair virial :math:`W = \sum_{i<j} r_{ij}\cdot f_{ij} = -\sum_{i<j} r u'(r)`."""
        positions, code = self._check(positions, neighbors)
        tail = self.tail_virial(positions, params)
        if isinstance(neighbors, CellList):
            pass_ = _lj_cells if self._pallas_lj(positions, params, neighbors) else cell_pass
            return nan_unless_valid(code, pass_(self, positions, params, neighbors, True)[2]
                                    + tail)
        if self._native_lj(positions, params, neighbors):
            return nan_unless_valid(code, _lj_native_virial(positions, params, neighbors, self)
                                    + tail)
        if neighbors is not None:
            _, c, r, _ = self._neighbor_pass(positions, params, neighbors, True)
            return nan_unless_valid(code, -0.5 * jnp.sum(c * r * r) + tail)

        def body(dr, valid, pp):
            _, c, r = self._terms(dr, valid, pp, True)
            return jnp.sum(c * r * r)

        return nan_unless_valid(code, -0.5 * jnp.sum(self._tiles(positions, params, body))
                                + tail)

    def virial_tensor(self, positions, params, neighbors=None):
        r"""The pair virial tensor :math:`W_{ab} = -\sum_{i<j} r_a r_b u'(r)/r`, ``(d, d)``."""
        positions, code = self._check(positions, neighbors)
        if isinstance(neighbors, CellList):
            raise NotImplementedError("virial_tensor over a cell list: use a neighbour list "
                                      "(or none) for the pressure tensor")
        d = positions.shape[1]

        def tensor(c, dr):
            return jnp.stack([jnp.stack([jnp.sum(c * dr[a] * dr[b]) for b in range(d)])
                              for a in range(d)])

        # the tail correction is isotropic: a third of its virial on each diagonal entry
        tail = self.tail_virial(positions, params) / d * jnp.eye(d, dtype=positions.dtype)
        if neighbors is not None:
            _, c, _, dr = self._neighbor_pass(positions, params, neighbors, True)
            return nan_unless_valid(code, -0.5 * tensor(c, dr) + tail)

        def body(dr, valid, pp):
            _, c, _ = self._terms(dr, valid, pp, True)
            return tensor(c, dr)

        return nan_unless_valid(code, -0.5 * jnp.sum(self._tiles(positions, params, body),
                                                     axis=0) + tail)


def _with_finite_positions(code, positions):
    """``code`` (from :func:`check_box`) with ``NONFINITE_STATE`` where some position is
    not finite, so that the energy is NaN there: a pair with a NaN distance fails the
    cutoff test and a neighbour list leaves a NaN particle out, which would otherwise sum
    to a finite energy. Left out inside ``simulate``, which checks every step itself."""
    if checked_upstream():
        return code
    finite = jnp.all(jnp.isfinite(lax.stop_gradient(positions)))
    bad = jnp.where(finite, jnp.int32(Result.SUCCESSFUL), jnp.int32(Result.NONFINITE_STATE))
    return bad if code is None else jnp.where(code != 0, code, bad)


def _gravity_arguments(positions, params):
    """``(masses (n,), constants [G, softening])`` in the positions' dtype."""
    dtype = positions.dtype
    masses = jnp.broadcast_to(jnp.asarray(params["masses"], dtype), (positions.shape[0],))
    constants = jnp.stack([jnp.asarray(params["G"], dtype),
                           jnp.asarray(params["softening"], dtype)])
    return masses, constants


def _gravity_by_backend(positions, params, energy: PairEnergy):
    """Direct-sum gravity from the kernel for the backend, with a pure-JAX VJP: native
    (``_native/gravity.cc``) on the CPU where it is built, Pallas tiles on TPUs
    (:mod:`._gravity_pallas`), :func:`_gravity_direct` elsewhere."""
    return _gravity_kernel(energy, positions, *_gravity_arguments(positions, params))


def _gravity_direct(energy, positions, masses, constants):
    r"""Direct-sum gravity in pure JAX, written for the pair sum alone.

    :math:`U = -\tfrac12 G \sum_{i \ne j} m_i m_j s_{ij}`,
    :math:`F_i = -G m_i \sum_{j \ne i} m_j s_{ij}^3 (x_i - x_j)` with
    :math:`s_{ij} = (r_{ij}^2 + \epsilon^2)^{-1/2}`: one ``rsqrt`` per pair, where the generic
    pair kernel takes a square root, the potential's own root and division, and its
    derivative by forward mode (timings: docs/benchmarks.md, "Design measurements"). Row
    tiles of
    ``energy.tile`` targets against all sources, as the generic kernel; the self pair is
    masked, so a softening of 0 is allowed.
    """
    n = positions.shape[0]
    tile = min(energy.tile, n)
    n_tiles = -(-n // tile)
    rows = jnp.arange(n_tiles * tile).reshape(n_tiles, tile)
    xt = positions.T
    cols = jnp.arange(n)
    eps2 = constants[1] * constants[1]

    def one(rows):
        i = jnp.minimum(rows, n - 1)
        d = [xt[k][i][:, None] - xt[k][None, :] for k in range(3)]
        skip = (rows[:, None] == cols[None, :]) | (rows[:, None] >= n)
        r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2
        s = jnp.where(skip, 0.0, lax.rsqrt(jnp.where(skip, 1.0, r2)))
        ms = masses[None, :] * s
        mi = jnp.where(rows < n, masses[i], 0.0)
        w = ms * s * s
        return (jnp.sum(mi * jnp.sum(ms, axis=1)),
                jnp.stack([mi * jnp.sum(w * d[k], axis=1) for k in range(3)]))

    e, f = lax.map(jax.checkpoint(one), rows)                # f: (n_tiles, 3, tile)
    forces = -constants[0] * jnp.moveaxis(f, 1, 2).reshape(-1, 3)[:n]
    return -0.5 * constants[0] * jnp.sum(e), forces


def _gravity_ffi(energy, positions, masses, constants):
    name = "simlib_gravity_f32" if positions.dtype == jnp.float32 else "simlib_gravity_f64"
    call = jax.ffi.ffi_call(
        name, (jax.ShapeDtypeStruct(positions.shape, positions.dtype),
               jax.ShapeDtypeStruct((), positions.dtype)), vmap_method="sequential")
    forces, e = call(positions, masses, constants)
    return e, forces


def _gravity_pallas(positions, masses, constants):
    """Energy and forces from the Pallas tiled kernels (TPUs only)."""
    a, u = gravity_pair_sums(positions, masses, constants[1])
    return -constants[0] * u, -constants[0] * masses[:, None] * a


@jax.custom_vjp
def _gravity_kernel(energy, positions, masses, constants):
    return lax.platform_dependent(
        positions, masses, constants,
        cpu=lambda *a: (_gravity_ffi(energy, *a) if _native.load() is not None
                        else _gravity_direct(energy, *a)),
        tpu=_gravity_pallas,
        default=lambda *a: _gravity_direct(energy, *a))


def _gravity_kernel_fwd(energy, positions, masses, constants):
    out = _gravity_kernel(energy, positions, masses, constants)
    return out, (energy, positions, masses, constants)


def _gravity_kernel_bwd(res, cotangent):
    energy, positions, masses, constants = res
    _, vjp = jax.vjp(lambda *a: _gravity_direct(energy, *a), positions, masses, constants)
    return (jax.tree_util.tree_map(jnp.zeros_like, energy), *vjp(cotangent))


_gravity_kernel.defvjp(_gravity_kernel_fwd, _gravity_kernel_bwd)


class _Rows(NamedTuple):
    """The part of a neighbour list the pair kernel reads."""

    idx: jax.Array


def _lj_native_all(positions, params, neighbors, energy: PairEnergy, diagonal=False):
    """``(U, forces, W)`` from the native Lennard-Jones kernel over a neighbour list; ``W``
    the virial, or with ``diagonal`` the diagonal of the virial tensor ``(3,)``."""
    dtype = positions.dtype
    d = positions.shape[1]
    box = (energy.space.box_vector(d, dtype) if energy.space.periodic
           else jnp.zeros(d, dtype))
    config = (energy.r_cut, energy.shift, energy.space.periodic, energy.tile, bool(diagonal))
    return _lj_kernel(config, positions, neighbors.idx, jnp.asarray(params["sigma"], dtype),
                      jnp.asarray(params["epsilon"], dtype), box)


def _lj_native(positions, params, neighbors, energy: PairEnergy):
    """Native Lennard-Jones over a neighbour list (``_native/lj.cc``): ``(U, forces)``;
    derivatives from the pure-JAX kernel (``custom_jvp``, so forward and reverse mode both
    work)."""
    return _lj_native_all(positions, params, neighbors, energy)[:2]


def _lj_native_virial(positions, params, neighbors, energy: PairEnergy):
    r"""The pair virial :math:`W = -\sum_{i<j} r u'(r)` from the same native pass."""
    return _lj_native_all(positions, params, neighbors, energy)[2]


def _lj_pure(config, positions, idx, sigma, epsilon, box):
    """The native kernel's ``(U, forces, W)`` in pure JAX (its reference, fallback and
    derivative); ``W`` the virial, or the diagonal of the virial tensor ``(3,)``."""
    r_cut, shift, periodic, tile, diagonal = config
    space = Space(box, True) if periodic else free()
    energy = PairEnergy(lennard_jones, space, r_cut, shift, None, tile)
    params = dict(sigma=sigma, epsilon=epsilon)
    return _list_sums(*energy._neighbor_pass(positions, params, _Rows(idx), True), diagonal)


def _list_sums(u, c, r, dr, diagonal: bool):
    """``(U, forces, W)`` from a neighbour-list pass's pair terms (each pair listed from both
    ends, hence the halves): ``W = -sum r u'(r)``, or with ``diagonal`` the diagonal of the
    virial tensor ``(d,)``."""
    d = len(dr)
    f = jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)], axis=1)
    if diagonal:
        w = -0.5 * jnp.stack([jnp.sum(c * dr[k] * dr[k]) for k in range(d)])
    else:
        w = -0.5 * jnp.sum(c * r * r)
    return 0.5 * jnp.sum(u), f, w


def _lj_ffi(config, positions, idx, sigma, epsilon, box):
    r_cut, shift, periodic, _, diagonal = config
    n = positions.shape[0]
    if sigma.ndim == 0 and epsilon.ndim == 0:      # the pair values, as PairParams mixes them
        sigma = MIXING_RULES["sigma"](sigma, sigma)[None]
        epsilon = MIXING_RULES["epsilon"](epsilon, epsilon)[None]
    else:                                          # Lorentz-Berthelot in the kernel
        sigma, epsilon = jnp.broadcast_to(sigma, (n,)), jnp.broadcast_to(epsilon, (n,))
    kind = "simlib_lj_diag" if diagonal else "simlib_lj"    # W_aa (3,), or W
    name = kind + ("_f32" if positions.dtype == jnp.float32 else "_f64")
    call = jax.ffi.ffi_call(
        name, (jax.ShapeDtypeStruct(positions.shape, positions.dtype),
               jax.ShapeDtypeStruct((), positions.dtype),
               jax.ShapeDtypeStruct((3,) if diagonal else (), positions.dtype)),
        vmap_method="sequential")
    forces, e, w = call(positions, idx, sigma, epsilon, box, r_cut=float(r_cut),
                        shift=int(shift), periodic=int(periodic))
    return e, forces, w


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _lj_kernel(config, positions, idx, sigma, epsilon, box):
    return lax.platform_dependent(
        positions, idx, sigma, epsilon, box,
        cpu=lambda *a: _lj_ffi(config, *a),
        default=lambda *a: _lj_pure(config, *a))


@_lj_kernel.defjvp
def _lj_kernel_jvp(config, primals, tangents):
    positions, idx, sigma, epsilon, box = primals
    tx, _, ts, te, tb = tangents
    out = _lj_kernel(config, *primals)
    _, t_out = jax.jvp(lambda x, s, e, b: _lj_pure(config, x, idx, s, e, b),
                       (positions, sigma, epsilon, box), (tx, ts, te, tb))
    return out, t_out


def _lj_cells(energy: PairEnergy, positions, params, cells: CellList, want_virial: bool):
    """``(U, forces, W)`` of Lennard-Jones over cells from the Pallas kernel (compiled on a
    TPU, in interpret mode elsewhere); derivatives from the pure-JAX
    :func:`~simlib.particles._cells.cell_pass` (``custom_jvp``). ``W`` is zero without
    ``want_virial``."""
    dtype = positions.dtype
    sigma = jnp.asarray(params["sigma"], dtype)
    epsilon = jnp.asarray(params["epsilon"], dtype)
    return _lj_cells_kernel(want_virial, energy, positions, sigma, epsilon, cells)


def _lj_cells_pure(energy, positions, sigma, epsilon, cells):
    u, f, w = cell_pass(energy, positions, dict(sigma=sigma, epsilon=epsilon), cells, True)
    return u, f[cells.atom_slot], w


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _lj_cells_kernel(want_virial, energy, positions, sigma, epsilon, cells):
    return lj_cells(positions, cells.slot_atom, cells.atom_slot,
                    energy.space.box_vector(3, positions.dtype), sigma, epsilon,
                    grid=cells.grid, capacity=cells.capacity, r_cut=energy.r_cut,
                    shift=energy.shift, want_virial=want_virial,
                    interpret=interpret())


@_lj_cells_kernel.defjvp
def _lj_cells_kernel_jvp(want_virial, primals, tangents):
    energy, positions, sigma, epsilon, cells = primals
    out = _lj_cells_kernel(want_virial, *primals)
    _, (t_u, t_f, t_w) = jax.jvp(lambda e, x, s, p: _lj_cells_pure(e, x, s, p, cells),
                                 (energy, positions, sigma, epsilon), tangents[:4])
    return out, (t_u, t_f, t_w if want_virial else jnp.zeros_like(t_w))


def pair_energy(potential: Callable, space: Space, r_cut: float | None = None, *,
                shift: bool = False, mixing: Mapping[str, Callable] | None = None,
                tile: int = 256, tail_correction: bool = False) -> PairEnergy:
    r"""The total energy of a pair potential, ``energy(positions, params, neighbors=None)``.

    :math:`U = \sum_{i<j,\ r_{ij} < r_c} [u(r_{ij}) - s\,u(r_c)]` with :math:`s = 1` when
    ``shift`` (the energy is continuous at the cutoff; forces are unchanged).

    Args:
        potential: ``u(r, params)``, elementwise in ``r`` (e.g. :func:`lennard_jones`).
        space: :func:`free` or :func:`periodic`.
        r_cut: Cutoff distance; ``None`` for all pairs (long-range forces such as gravity).
        shift: Subtract ``u(r_cut)`` so the energy goes to zero at the cutoff.
        mixing: Extra mixing rules ``{name: rule(a_i, a_j)}`` for per-particle parameters.
        tile: Rows per tile when visiting all pairs (memory ``~ n * tile``).
        tail_correction: Add the Lennard-Jones long-range corrections, the energy and
            virial of the pairs beyond ``r_cut`` with :math:`g(r) = 1` there
            (:meth:`PairEnergy.tail_energy`, :meth:`PairEnergy.tail_virial`; Allen &
            Tildesley 2017, §2.8): the energy and :func:`pressure` then estimate the
            untruncated potential's. Forces are unchanged. :func:`lennard_jones` in a
            periodic 3D box with one ``sigma`` and ``epsilon``, not with ``shift``.

    Returns:
        A :class:`PairEnergy`; call it as ``energy(positions, params, neighbors=None)``.
        With ``neighbors`` (a :func:`neighbor_list`) only listed pairs are visited.

    Example:
        >>> from simlib import particles as sp
        >>> positions, box = sp.lattice(4, 0.8442)
        >>> energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=2.5)
        >>> u = energy(positions, dict(sigma=1.0, epsilon=1.0))
        >>> print(f"{float(u) / len(positions):.3f}")   # per atom; a numpy pair sum: -6.773
        -6.773
    """
    if not callable(potential):
        raise TypeError(f"pair_energy: potential must be a function u(r, params), "
                        f"got {potential!r}")
    if not isinstance(space, Space):
        raise TypeError(f"pair_energy: space must be free() or periodic(box), "
                        f"got {space!r}")
    if r_cut is not None and not r_cut > 0:
        raise ValueError(f"pair_energy: r_cut must be positive, got {r_cut!r}")
    if shift and r_cut is None:
        raise ValueError("pair_energy: shift=True needs an r_cut to shift at")
    if space.periodic and is_long_range(potential):
        name = getattr(potential, "__name__", None) or repr(potential)
        raise ValueError(f"pair_energy: {name} is for free space (it is marked long_range); "
                         f"the minimum-image sum of 1/r in a periodic box does not converge "
                         f"to the lattice sum (use Ewald summation)")
    if int(tile) < 1:
        raise ValueError(f"pair_energy: tile must be a positive integer, got {tile!r}")
    if tail_correction:
        if potential is not lennard_jones or r_cut is None or not space.periodic:
            raise ValueError("pair_energy: tail_correction=True is the Lennard-Jones tail: it "
                             "needs potential=lennard_jones, an r_cut and a periodic space")
        if shift:
            raise ValueError("pair_energy: tail_correction=True estimates the untruncated, "
                             "unshifted potential; it cannot be combined with shift=True")
    return PairEnergy(potential, space, None if r_cut is None else float(r_cut), bool(shift),
                      mixing, int(tile), bool(tail_correction))


@jax.tree_util.register_pytree_node_class
class BondEnergy(Energy):
    r"""The energy of a potential over a fixed list of bonded pairs:
    :math:`U = \sum_b u(|x_{i_b} - x_{j_b}|)`. Build it with :func:`bond_energy`."""

    def __init__(self, potential: Callable[..., jax.Array], space: Space,
                 bonds: ArrayLike) -> None:
        self.potential = potential
        self.space = space
        self.bonds = bonds
        self.r_cut = None

    def tree_flatten(self):
        return (self.space, self.bonds), self.potential

    @classmethod
    def tree_unflatten(cls, potential, children):
        return cls(potential, *children)

    def _pass(self, positions, params, want_derivative):
        i, j = self.bonds[:, 0], self.bonds[:, 1]
        dr = self.space.displacement(positions[i], positions[j])
        r2 = jnp.sum(dr * dr, axis=-1)
        nonzero = r2 > 0
        r = jnp.sqrt(jnp.where(nonzero, r2, 1.0))
        r = jnp.where(nonzero, r, 0.0)
        if not want_derivative:
            return self.potential(r, params), None, dr, r
        u, du = jax.jvp(lambda r: self.potential(r, params), (r,), (jnp.ones_like(r),))
        c = jnp.where(nonzero, du / jnp.where(nonzero, r, 1.0), 0.0)
        return u, c, dr, r

    def _check(self, positions):
        positions = jnp.asarray(positions)
        if positions.ndim != 2:
            raise ValueError(f"bond_energy: positions must have shape (n, d), got "
                             f"{positions.shape}")
        code = check_box(self.space, positions.shape[1], caller="bond_energy")
        return positions, _with_finite_positions(code, positions)

    def __call__(self, positions, params, neighbors=None):
        positions, code = self._check(positions)
        return nan_unless_valid(code, jnp.sum(self._pass(positions, params, False)[0]))

    def energy_and_forces(self, positions, params, neighbors=None):
        positions, code = self._check(positions)
        u, c, dr, _ = self._pass(positions, params, True)
        f = -c[:, None] * dr
        forces = jnp.zeros_like(positions).at[self.bonds[:, 0]].add(f).at[self.bonds[:, 1]].add(-f)
        return nan_unless_valid(code, jnp.sum(u), forces)

    def virial(self, positions, params, neighbors=None):
        positions, code = self._check(positions)
        _, c, _, r = self._pass(positions, params, True)
        return nan_unless_valid(code, -jnp.sum(c * r * r))

    def virial_tensor(self, positions, params, neighbors=None):
        positions, code = self._check(positions)
        _, c, dr, _ = self._pass(positions, params, True)
        return nan_unless_valid(code, -jnp.einsum("m,ma,mb->ab", c, dr, dr))


def bond_energy(potential: Callable, space: Space, bonds: ArrayLike) -> BondEnergy:
    """The energy of ``potential`` over bonded pairs ``bonds`` (an ``(m, 2)`` integer array).

    Parameters are read from ``params`` as they are: scalars or one value per bond ``(m,)``.
    Add it to a pair energy for molecules: ``energy = pair_energy(wca, space, r_cut) +
    bond_energy(harmonic, space, bonds)``.
    """
    bonds = jnp.asarray(bonds)
    if bonds.ndim != 2 or bonds.shape[1] != 2 or not jnp.issubdtype(bonds.dtype, jnp.integer):
        raise ValueError(f"bond_energy: bonds must be an (m, 2) integer array, got "
                         f"shape {bonds.shape} and dtype {bonds.dtype}")
    return BondEnergy(potential, space, bonds)


@jax.tree_util.register_pytree_node_class
class _FunctionEnergy(Energy):
    """A plain user function ``energy(positions, params, neighbors=None)``."""

    def __init__(self, fn, space=None):
        self.fn = fn
        self.space = space
        self.r_cut = None

    def tree_flatten(self):
        return (), self.fn

    @classmethod
    def tree_unflatten(cls, fn, _):
        return cls(fn)

    def __call__(self, positions, params, neighbors=None):
        return self.fn(positions, params, neighbors) if neighbors is not None else \
            self.fn(positions, params)


def as_energy(energy) -> Energy:
    """An :class:`Energy` from an energy object or a plain function."""
    if isinstance(energy, Energy):
        return energy
    if callable(energy):
        return _FunctionEnergy(energy)
    raise TypeError(f"energy must be a function energy(positions, params) or built by "
                    f"pair_energy, got {energy!r}")


def forces(energy: Energy | Callable[..., jax.Array]) -> Callable:
    """``forces(positions, params, neighbors=None) -> (n, d)``, the negative gradient of
    ``energy`` (the direct pair-force path for :func:`pair_energy`)."""
    energy = as_energy(energy)
    return energy.forces
