r"""Electrostatics in periodic boxes: the Ewald sum and smooth particle-mesh Ewald.

The Coulomb energy of point charges :math:`q_i` in an orthorhombic box with periodic images,
:math:`U = \frac{k}{2}\sum_{\mathbf n}{}' \sum_{i,j} q_i q_j / |\mathbf r_{ij} + \mathbf n L|`,
is split by Ewald (Ann. Phys. 369, 253 (1921)) into sums that converge fast:

.. math::

    U = k\Big[\sum_{i<j}^{r_{ij}<r_c} q_i q_j \frac{\operatorname{erfc}(\alpha r_{ij})}{r_{ij}}
      + \frac{2\pi}{V}\sum_{\mathbf k\ne 0} \frac{e^{-k^2/4\alpha^2}}{k^2} |S(\mathbf k)|^2
      - \frac{\alpha}{\sqrt\pi}\sum_i q_i^2 - \frac{\pi Q^2}{2V\alpha^2}\Big],
    \qquad S(\mathbf k) = \sum_j q_j e^{i\mathbf k\cdot\mathbf r_j},

with :math:`\mathbf k = 2\pi(m_x/L_x, m_y/L_y, m_z/L_z)`, :math:`Q = \sum_i q_i` (the last term
is the energy of a uniform neutralising background; zero for a neutral box) and "tin-foil"
boundary conditions. Excluded pairs (bonded neighbours in a molecule) lose
:math:`(1 - s_{ij})\,q_i q_j/r_{ij}`, which is done by subtracting
:math:`\operatorname{erf}(\alpha r)/r` (and the real-space :math:`\operatorname{erfc}` term when
the pair is within the cutoff). Smooth PME (Essmann et al., J. Chem. Phys. 103, 8577 (1995))
replaces the structure factor by the FFT of the charges spread on a grid with cardinal
B-splines of order :math:`p`; its forces are the exact gradient of its energy (their
eq. 4.9). Everything is JAX: energies, forces, virials and gradients with respect to
positions, charges, the box and :math:`\alpha`. On the CPU, the real-space pair sum over a
neighbour list runs in a native kernel (``_native/ewald.cc``), and PME's charge spreading
and force gathering in two more (``_native/pme.cc``; the FFT stays ``jnp.fft``), when they
can be built; their first derivatives come from the kernels and higher ones from the
pure-JAX sums, which are the reference and the fallback.

Accuracy parameters follow Kolafa & Perram (Mol. Sim. 9, 351 (1992)); see
:func:`ewald_parameters`.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import erf, erfc
from jax.typing import ArrayLike

from .._util import is_tracer
from . import _native
from ._energy import Energy, PairEnergy
from ._potentials import lennard_jones
from ._space import Space, nan_unless_valid


class EwaldParameters(NamedTuple):
    """Accuracy parameters of an Ewald or PME sum (see :func:`ewald_parameters`).

    Attributes:
        alpha: The splitting parameter :math:`\\alpha` (1/length).
        kmax: Largest wave index per axis of the Ewald reciprocal sum, ``(3,)`` ints.
        grid: PME grid points per axis, ``(3,)`` ints (products of 2, 3, 5 and 7).
    """

    alpha: float
    kmax: tuple[int, int, int]
    grid: tuple[int, int, int]


def _fft_size(n: int) -> int:
    """The smallest integer >= ``n`` with no prime factor above 7 (fast FFT sizes): the
    least :math:`7^a 5^b 3^c 2^d \\ge n`, with the smallest :math:`d` for each
    :math:`(a, b, c)` (fast for any ``n``, so that a tiny tolerance reaches the memory
    check instead of a long search)."""
    n = max(int(n), 1)
    best = 1 << (n - 1).bit_length()                  # a power of 2
    p7 = 1
    while p7 < best:
        p5 = p7
        while p5 < best:
            p3 = p5
            while p3 < best:
                best = min(best, p3 << (-(-n // p3) - 1).bit_length())
                p3 *= 3
            p5 *= 5
        p7 *= 7
    return best


def _box3(box) -> np.ndarray:
    b = np.broadcast_to(np.asarray(box, np.float64), (3,)).copy()
    if not (np.all(np.isfinite(b)) and np.all(b > 0)):
        raise ValueError(f"box side lengths must be positive and finite, got {box!r}")
    return b


def ewald_parameters(box: ArrayLike, r_cut: float, tolerance: float = 1e-6, *,
                     order: int = 5) -> EwaldParameters:
    r"""Ewald and PME accuracy parameters for a requested relative force error.

    The relative force error :math:`\delta` is the RMS force error in units of
    :math:`q_{\rm rms}^2/\ell^2`, the force between two charges of RMS size at the mean
    interparticle spacing :math:`\ell = (V/N)^{1/3}`. The Kolafa-Perram estimates of the RMS
    force errors of the real-space and reciprocal sums (Mol. Sim. 9, 351 (1992), eqs. 18
    and 31), in those units and bounded with :math:`\ell \le r_c`, are

    .. math::

        \delta_r \approx 2\,e^{-\alpha^2 r_c^2}, \qquad
        \delta_k \approx \frac{2\alpha\sqrt{r_c L}}{\sqrt{\pi k_{max}}}
            \,e^{-(\pi k_{max}/\alpha L)^2}.

    ``alpha`` solves :math:`\delta_r = \delta` for the given cutoff; ``kmax`` is the smallest
    integer per axis with :math:`\delta_k \le \delta`. The PME grid follows the empirical rule
    of OpenMM for order 5, :math:`K = \lceil 2\alpha L / (3\delta^{1/p})\rceil` (Eastman et
    al., PLoS Comput. Biol. 13, e1005659 (2017)), rounded up to a fast FFT size; the tests
    check it against the Ewald sum at the requested :math:`\delta`.

    Args:
        box: Side lengths (scalar or ``(3,)``), concrete.
        r_cut: Real-space cutoff (at most half the shortest side).
        tolerance: The relative force error :math:`\delta`, in (0, 1).
        order: PME B-spline order :math:`p`.

    Example:
        >>> ewald_parameters(3.0, 1.0, 1e-5)
        EwaldParameters(alpha=3.4937..., kmax=(12, 12, 12), grid=(112, 112, 112))
    """
    b = _box3(box)
    if not 0 < tolerance < 1:
        raise ValueError(f"ewald_parameters: tolerance must be in (0, 1), got {tolerance!r}")
    if not 0 < r_cut <= 0.5 * b.min():
        raise ValueError(f"ewald_parameters: r_cut={r_cut!r} must be positive and at most half "
                         f"the shortest box side {b.min()!r} (minimum image)")
    alpha = math.sqrt(math.log(2.0 / tolerance)) / r_cut
    return _reciprocal_sizes(b, r_cut, alpha, tolerance, order)


# C_p in the PME force error C_p (alpha h)^(p-1) (units of q_rms^2/l^2), the largest found for
# random +-1 charges (n = 64 and 200, alpha r_c = 3 to 4.2, h = L/64 to L/16)
_PME_ERROR_CONSTANT = {3: 0.3, 4: 0.25, 5: 0.06, 6: 0.06, 7: 0.03, 8: 0.03}


def _reciprocal_sizes(b, r_cut, alpha, tolerance, order) -> EwaldParameters:
    """``kmax`` and the PME grid for a given ``alpha`` (see :func:`ewald_parameters`)."""
    kmax = []
    for length in b:
        k = 1
        while (2 * alpha * math.sqrt(r_cut * length / (math.pi * k))
               * math.exp(-(math.pi * k / (alpha * length)) ** 2)) > tolerance:
            k += 1
        kmax.append(k)
    c = _PME_ERROR_CONSTANT.get(order, 0.03)
    spacing = min(0.5, (0.5 * tolerance / c) ** (1 / (order - 1))) / alpha     # h <= 0.5/alpha
    grid = tuple(_fft_size(max(math.ceil(length / spacing), order + 1)) for length in b)
    return EwaldParameters(alpha, tuple(kmax), grid)


# Reciprocal-space arrays sized from a tolerance (issue 41: tolerance=1e-15 on a 16-ion box
# asked XLA for 1.6 PB): ewald and pme warn above this many PME grid points or candidate
# Ewald wave vectors, and refuse above this many bytes, before anything is allocated
_RECIPROCAL_WARN_POINTS = 256**3
_RECIPROCAL_MEMORY_LIMIT = 2 * 1024**3
# what the refusal suggests instead: 1e-16, 2e-16, 5e-16, 1e-15, ..., 0.5
_SUGGESTED_TOLERANCES = tuple(float(f"{m}e-{e}") for e in range(16, 0, -1) for m in (1, 2, 5))


def _memory(n: float) -> str:
    """``n`` bytes for a message: ``"3.52 GiB"``."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024:
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PiB"


def _reciprocal_cost(name: str, params: EwaldParameters) -> tuple[str, int, int]:
    """``(description, points, bytes)`` of the reciprocal-space arrays ``params`` imply.
    PME holds about three arrays of the grid's size in the default float dtype (the
    charges, their transform and the influence function); Ewald picks its wave vectors from
    :math:`(k_x+1)(2k_y+1)(2k_z+1)` candidate int64 triples (and then needs :math:`O(nK)`
    per call)."""
    if name == "pme":
        points = math.prod(params.grid)
        itemsize = jnp.dtype(jnp.result_type(float)).itemsize
        return f"a {'x'.join(map(str, params.grid))} grid", points, 3 * itemsize * points
    kx, ky, kz = params.kmax
    points = (kx + 1) * (2 * ky + 1) * (2 * kz + 1)
    return f"kmax={params.kmax} ({points:,} candidate wave vectors)", points, 24 * points


def _check_reciprocal(name: str, tolerance: float,
                      parameters: Callable[[float], EwaldParameters]) -> None:
    """Refuse (``ValueError``) reciprocal-space arrays sized from ``tolerance`` above
    ``_RECIPROCAL_MEMORY_LIMIT`` bytes, suggesting the smallest tolerance that fits, and
    warn above ``_RECIPROCAL_WARN_POINTS`` points; ``parameters(tolerance)`` sizes them.
    Eager: nothing is allocated."""
    what, points, size = _reciprocal_cost(name, parameters(tolerance))
    limit = _RECIPROCAL_MEMORY_LIMIT
    if size > limit:
        fits = (t for t in _SUGGESTED_TOLERANCES
                if t > tolerance and _reciprocal_cost(name, parameters(t))[2] <= limit)
        fit = next(fits, None)
        hint = (f"tolerance={fit:g} is the smallest that fits" if fit is not None
                else "no tolerance fits")
        other = "give grid= explicitly" if name == "pme" else "use pme for large boxes"
        raise ValueError(
            f"{name}: tolerance={tolerance!r} needs {what}, about {_memory(size)} of memory, "
            f"over the limit of {_memory(limit)}; {hint} (1e-4 to 1e-6 is typical), or "
            f"{other}")
    if points > _RECIPROCAL_WARN_POINTS:
        warnings.warn(f"{name}: tolerance={tolerance!r} needs {what}, about {_memory(size)} "
                      f"of memory; 1e-4 to 1e-6 is typical and far cheaper", UserWarning,
                      stacklevel=3)


def _erfc_coulomb(r, params):
    r"""The real-space Ewald pair term :math:`q_i q_j \operatorname{erfc}(\alpha r)/r`."""
    return params["charges"] * erfc(params["alpha"] * r) / r


class _Coulomb(Energy):
    """What the Ewald sum and PME share: real space, self, background, exclusions, checks."""

    def _setup(self, space, r_cut, alpha, coulomb_constant, exclusions, exclusion_scale, tile):
        self.space = space
        self.r_cut = r_cut
        self.alpha = alpha
        self.coulomb_constant = coulomb_constant
        self.exclusions = exclusions
        self.exclusion_scale = exclusion_scale
        self.tile = tile
        self._real = PairEnergy(_erfc_coulomb, space, r_cut, False, None, tile)

    # -- shared pieces -----------------------------------------------------------------
    def _box(self, dtype):
        return self.space.box_vector(3, dtype)

    def _valid(self, box):
        """Whether box and alpha make sense (a traced boolean): positive finite sides at
        least twice the cutoff, and a positive finite alpha. Raises eagerly when concrete."""
        alpha = jnp.asarray(self.alpha)
        ok = (jnp.all(jnp.isfinite(box)) & jnp.all(box >= 2 * self.r_cut)
              & jnp.isfinite(alpha) & (alpha > 0))
        if not is_tracer((box, alpha)):
            if not bool(ok):
                raise ValueError(
                    f"{type(self).__name__.lower()}: need a finite box with every side at least "
                    f"2 * r_cut = {2 * self.r_cut} (minimum image) and a positive finite alpha; "
                    f"got box={np.asarray(box).tolist()}, alpha={float(alpha)!r}")
        return ok

    def _charges(self, positions, params):
        n = positions.shape[0]
        if "charges" not in params:
            raise KeyError(f"params['charges'] is missing (params has {sorted(params)})")
        q = jnp.asarray(params["charges"])
        if q.shape not in ((), (n,)):
            raise ValueError(f"params['charges'] must be a scalar or have shape ({n},), "
                             f"got {q.shape}")
        return jnp.broadcast_to(q.astype(jnp.result_type(q, positions)), (n,))

    def _check(self, positions):
        positions = jnp.asarray(positions)
        if positions.ndim != 2 or positions.shape[1] != 3:
            raise ValueError(f"{type(self).__name__}: positions must have shape (n, 3), got "
                             f"{positions.shape}")
        return positions

    def _real_params(self, q):
        return {"charges": q, "alpha": jnp.asarray(self.alpha, q.dtype)}

    def _constant_terms(self, q, box):
        r"""Self energy :math:`-\alpha/\sqrt\pi\sum q_i^2` and the neutralising background
        :math:`-\pi Q^2 / (2 V \alpha^2)` (Hub et al., JCTC 10, 381 (2014))."""
        alpha = jnp.asarray(self.alpha, q.dtype)
        volume = jnp.prod(box)
        return (-alpha / math.sqrt(math.pi) * jnp.sum(q * q)
                - math.pi * jnp.sum(q) ** 2 / (2 * volume * alpha**2))

    def _exclusion_correction(self, positions, q, box):
        r""":math:`-\sum_{(i,j)} (1-s_{ij}) q_i q_j [\operatorname{erf}(\alpha r)/r +
        [r < r_c]\operatorname{erfc}(\alpha r)/r]`: removes the excluded pairs' Coulomb."""
        if self.exclusions is None:
            return jnp.zeros((), q.dtype)
        i, j = self.exclusions[:, 0], self.exclusions[:, 1]
        space = Space(box, True)
        dr = space.displacement(positions[i], positions[j])
        r2 = jnp.sum(dr * dr, axis=-1)
        nonzero = r2 > 0
        r = jnp.sqrt(jnp.where(nonzero, r2, 1.0))
        alpha = jnp.asarray(self.alpha, q.dtype)
        erf_r = jnp.where(nonzero, erf(alpha * r) / r, 2 * alpha / math.sqrt(math.pi))
        real = jnp.where(nonzero & (r2 < self.r_cut**2), erfc(alpha * r) / r, 0.0)
        keep = 0.0 if self.exclusion_scale is None else self.exclusion_scale
        return -jnp.sum((1.0 - keep) * q[i] * q[j] * (erf_r + real))

    def _reciprocal(self, positions, q, box):
        raise NotImplementedError

    def _real_space(self, positions, q, box, neighbors, want_forces):
        r"""The pair sum :math:`\sum_{i<j} q_iq_j\operatorname{erfc}(\alpha r)/r` (and its
        forces): ``pair_energy``'s kernel for a neighbour list or many particles; for at
        most ``tile`` particles one broadcast pass over all pairs, with the closed-form
        derivative :math:`-\partial_r(\operatorname{erfc}(\alpha r)/r) =
        [\operatorname{erfc}(\alpha r)/r + 2\alpha e^{-\alpha^2r^2}/\sqrt\pi]/r`."""
        n = positions.shape[0]
        if _native_real(positions, q, neighbors):
            alpha = jnp.asarray(self.alpha, q.dtype)
            e, f, *_ = _ewald_real(self.r_cut, positions, neighbors.idx, q, box, alpha)
            return e, (f if want_forces else None)
        if neighbors is not None or n > self.tile:
            params = self._real_params(q)
            if want_forces:
                return self._real._energy_and_forces(positions, params, neighbors)
            return self._real(positions, params, neighbors), None
        d = Space(box, True).displacement(positions[:, None, :], positions[None, :, :])
        r2 = jnp.sum(d * d, axis=-1)
        mask = ~np.eye(n, dtype=bool) & (r2 < self.r_cut**2)
        r2 = jnp.where(mask, r2, 1.0)
        inv_r = lax.rsqrt(r2)
        alpha = jnp.asarray(self.alpha, positions.dtype)
        qq = q[:, None] * q[None, :]
        u = jnp.where(mask, qq * erfc(alpha * r2 * inv_r) * inv_r, 0.0)
        if not want_forces:
            return 0.5 * jnp.sum(u), None
        c = jnp.where(mask, (u + qq * (2 / math.sqrt(math.pi)) * alpha
                             * jnp.exp(-alpha * alpha * r2)) * inv_r * inv_r, 0.0)
        return 0.5 * jnp.sum(u), jnp.sum(c[:, :, None] * d, axis=1)

    def _long_range(self, positions, q, box):
        """Everything but the real-space pair sum (unscaled by the Coulomb constant)."""
        return (self._reciprocal(positions, q, box) + self._constant_terms(q, box)
                + self._exclusion_correction(positions, q, box))

    # -- public ------------------------------------------------------------------------
    def _prepare(self, positions, params, neighbors):
        """Checks that need no values (shapes, the neighbour list) and the eager value
        checks; returns positions and charges."""
        positions = self._check(positions)
        q = self._charges(positions, params)
        self._valid(self._box(positions.dtype))
        self._real._check(positions, neighbors)
        return positions, q

    def __call__(self, positions, params, neighbors=None):
        """The electrostatic energy (a scalar); ``params['charges']`` is ``(n,)``."""
        positions, q = self._prepare(positions, params, neighbors)
        return _energy_jit(self, positions, q, neighbors)

    def energy_and_forces(self, positions, params, neighbors=None):
        """The energy and the forces ``(n, 3)``: the real-space pairs in one direct pass,
        the rest by reverse mode."""
        positions, q = self._prepare(positions, params, neighbors)
        return _energy_and_forces_jit(self, positions, q, neighbors)

    def _energy(self, positions, q, neighbors):
        box = self._box(positions.dtype)
        ok = self._valid(box)
        e = (self._real_space(positions, q, box, neighbors, False)[0]
             + self._long_range(positions, q, box))
        return jnp.where(ok, self.coulomb_constant * e, jnp.nan)

    def _energy_and_forces(self, positions, q, neighbors):
        box = self._box(positions.dtype)
        ok = self._valid(box)
        e_real, f_real = self._real_space(positions, q, box, neighbors, True)
        e_long, g_long = jax.value_and_grad(self._long_range)(positions, q, box)
        k = self.coulomb_constant
        return (jnp.where(ok, k * (e_real + e_long), jnp.nan),
                jnp.where(ok, k * (f_real - g_long), jnp.nan))

    def _with_lj_energy_and_forces(self, lj, positions, params, neighbors):
        """``(U, F)`` of ``lj + self`` with the real-space Coulomb and Lennard-Jones pairs
        in one native pass (:func:`_ewald_lj`), or ``None`` where that pass does not serve
        the call (then sum the terms apart). ``lj`` shares this energy's space."""
        positions, q = self._prepare(positions, params, neighbors)
        if not _fusable_lj(self, lj, positions, q, params, neighbors):
            return None
        positions, code = lj._check(positions, neighbors)
        e, f = _with_lj_jit(self, lj, positions, q, params["sigma"], params["epsilon"],
                            neighbors)
        return nan_unless_valid(code, e, f)

    def _with_lj(self, lj, positions, q, sigma, epsilon, neighbors):
        box = self._box(positions.dtype)
        ok = self._valid(box)
        n, dtype = positions.shape[0], positions.dtype
        sigma = jnp.broadcast_to(jnp.asarray(sigma, dtype), (n,))
        epsilon = jnp.broadcast_to(jnp.asarray(epsilon, dtype), (n,))
        k = jnp.asarray(self.coulomb_constant, dtype)
        e_c, e_lj, f_pairs = _ewald_lj((self.r_cut, lj.shift, lj.tile), positions,
                                       neighbors.idx, q, sigma, epsilon, box,
                                       jnp.asarray(self.alpha, dtype), k)
        e_long, g_long = jax.value_and_grad(self._long_range)(positions, q, box)
        return (jnp.where(ok, e_lj + k * (e_c + e_long), jnp.nan),
                jnp.where(ok, f_pairs - k * g_long, jnp.nan))

    def virial_tensor(self, positions, params, neighbors=None):
        r"""The diagonal of the virial, :math:`W_{aa} = -L_a\,\partial U/\partial L_a` at fixed
        scaled coordinates ``(3,)``: the exact box derivative of this energy (with
        :math:`\alpha`, the cutoff and the k-vectors or grid held fixed). The pressure tensor
        is :math:`P_{aa} = (2K_{aa} + W_{aa})/V`."""
        positions, q = self._prepare(positions, params, neighbors)
        return _virial_jit(self, positions, q, neighbors)

    def _virial(self, positions, q, neighbors):
        box = self._box(positions.dtype)
        children, static = self.tree_flatten()

        def scaled(lam):
            energy = type(self).tree_unflatten(static, (Space(box * lam, True), *children[1:]))
            return energy._energy(positions * lam, q, neighbors)

        return -jax.grad(scaled)(jnp.ones(3, positions.dtype))

    def virial(self, positions, params, neighbors=None):
        r"""The scalar virial :math:`W = \sum_a W_{aa}` (see :meth:`virial_tensor`), so that
        :func:`~simlib.particles.pressure` gives :math:`P = (2K + W)/(3V)`."""
        return jnp.sum(self.virial_tensor(positions, params, neighbors))


class _Rows(NamedTuple):
    """The part of a neighbour list the pair kernel reads."""

    idx: jax.Array


def _native_real(positions, q, neighbors) -> bool:
    """Whether the native real-space kernel serves this call: a neighbour list of int32
    rows, positions ``(n, 3)`` in float32/64 and charges of the same dtype."""
    idx = getattr(neighbors, "idx", None)
    return (idx is not None and getattr(idx, "dtype", None) == jnp.int32
            and idx.ndim == 2 and idx.shape[0] == positions.shape[0]
            and positions.ndim == 2 and positions.shape[1] == 3
            and positions.dtype in (jnp.float32, jnp.float64) and q.dtype == positions.dtype
            and _native.load() is not None)


def _ewald_real_pure(r_cut, positions, idx, q, box, alpha):
    r"""The real-space sum over the rows ``idx`` in pure JAX: ``(U, F, dU/dq, dU/dL,
    dU/d\alpha)``, the box derivative at fixed positions (the reference of the kernel)."""

    def energy(q, box, alpha):
        pairs = PairEnergy(_erfc_coulomb, Space(box, True), r_cut, False, None, 256)
        return pairs._energy_and_forces(positions, dict(charges=q, alpha=alpha), _Rows(idx))

    (e, f), (phi, box_grad, alpha_grad) = jax.value_and_grad(
        energy, argnums=(0, 1, 2), has_aux=True)(q, box, alpha)
    return e, f, phi, box_grad, alpha_grad


def _ewald_real_ffi(r_cut, positions, idx, q, box, alpha):
    dtype = positions.dtype
    name = "simlib_ewald_f32" if dtype == jnp.float32 else "simlib_ewald_f64"
    shapes = ((), positions.shape, q.shape, (3,), ())
    call = jax.ffi.ffi_call(name, tuple(jax.ShapeDtypeStruct(s, dtype) for s in shapes),
                            vmap_method="sequential")
    return tuple(call(positions, idx, q, box, alpha, r_cut=float(r_cut)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _ewald_real(r_cut, positions, idx, q, box, alpha):
    r"""The real-space Ewald sum :math:`U = \sum_{i<j} q_iq_j\operatorname{erfc}(\alpha r)/r`
    over a neighbour list with its first derivatives ``(U, F, dU/dq, dU/dL, dU/d\alpha)``:
    native on the CPU (``_native/ewald.cc``), pure JAX elsewhere. The tangent of ``U`` is
    assembled from those derivatives (so gradients of energies and virials cost one kernel
    call); the tangents of the derivatives come from the pure-JAX sum."""
    return lax.platform_dependent(
        positions, idx, q, box, alpha,
        cpu=lambda *a: _ewald_real_ffi(r_cut, *a),
        default=lambda *a: _ewald_real_pure(r_cut, *a))


@_ewald_real.defjvp
def _ewald_real_jvp(r_cut, primals, tangents):
    positions, idx, q, box, alpha = primals
    tx, _, tq, tb, ta = tangents
    out = _ewald_real(r_cut, *primals)
    _, f, phi, box_grad, alpha_grad = out
    t_energy = (jnp.sum(phi * tq) - jnp.sum(f * tx) + jnp.sum(box_grad * tb)
                + alpha_grad * ta)
    _, t_rest = jax.jvp(lambda x, q, b, a: _ewald_real_pure(r_cut, x, idx, q, b, a)[1:],
                        (positions, q, box, alpha), (tx, tq, tb, ta))
    return out, (t_energy, *t_rest)


def _ewald_lj_unfused(config, positions, idx, q, sigma, epsilon, box, alpha, k):
    """``(U_c, U_lj, k F_c + F_lj)`` from the two kernels apart: :func:`_ewald_real` and
    :func:`pair_energy`'s Lennard-Jones kernel (native or pure JAX, with their derivatives)."""
    r_cut, shift, tile = config
    e_c, f_c, *_ = _ewald_real(r_cut, positions, idx, q, box, alpha)
    lj = PairEnergy(lennard_jones, Space(box, True), r_cut, shift, None, tile)
    e_lj, f_lj = lj._pair_energy_and_forces(positions, dict(sigma=sigma, epsilon=epsilon),
                                            _Rows(idx))
    return e_c, e_lj, k * f_c + f_lj


def _ewald_lj_ffi(config, positions, idx, q, sigma, epsilon, box, alpha, k):
    r_cut, shift, _ = config
    dtype = positions.dtype
    name = "simlib_ewald_lj_f32" if dtype == jnp.float32 else "simlib_ewald_lj_f64"
    out = (jax.ShapeDtypeStruct((), dtype), jax.ShapeDtypeStruct((), dtype),
           jax.ShapeDtypeStruct(positions.shape, dtype))
    call = jax.ffi.ffi_call(name, out, vmap_method="sequential")
    return tuple(call(positions, idx, q, sigma, epsilon, box, alpha, k, r_cut=float(r_cut),
                      shift=int(shift)))


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _ewald_lj(config, positions, idx, q, sigma, epsilon, box, alpha, k):
    r"""The real-space Ewald sum and Lennard-Jones (per-atom ``sigma``, ``epsilon``, mixed
    by Lorentz-Berthelot) over one neighbour list and cutoff, in one pass on the CPU
    (``_native/ewald.cc``, ``simlib_ewald_lj``): ``(U_c, U_lj, k F_c + F_lj)``, ``U_c``
    without the Coulomb constant ``k``. Elsewhere, and for every derivative (``custom_jvp``),
    the two kernels apart (:func:`_ewald_lj_unfused`), which are its reference."""
    return lax.platform_dependent(
        positions, idx, q, sigma, epsilon, box, alpha, k,
        cpu=lambda *a: _ewald_lj_ffi(config, *a),
        default=lambda *a: _ewald_lj_unfused(config, *a))


@_ewald_lj.defjvp
def _ewald_lj_jvp(config, primals, tangents):
    positions, idx, q, sigma, epsilon, box, alpha, k = primals
    tx, _, tq, ts, te, tb, ta, tk = tangents
    return jax.jvp(lambda x, q, s, e, b, a, k: _ewald_lj_unfused(config, x, idx, q, s, e, b, a,
                                                                 k),
                   (positions, q, sigma, epsilon, box, alpha, k),
                   (tx, tq, ts, te, tb, ta, tk))


def _fusable_lj(coulomb, lj, positions, q, params, neighbors) -> bool:
    """Whether ``lj`` (a :func:`pair_energy` term) and ``coulomb`` can share one native
    pass: Lennard-Jones with Lorentz-Berthelot mixing of per-atom (or scalar) ``sigma`` and
    ``epsilon`` over the same cutoff, in a periodic space, no tail correction, and the
    native real-space kernel serving ``coulomb``."""
    return (isinstance(lj, PairEnergy) and lj.potential is lennard_jones
            and getattr(lj, "r_cut", None) == coulomb.r_cut
            and not lj.tail and lj.space.periodic and _same_box(lj.space, coulomb.space)
            and _native_real(positions, q, neighbors)
            and lj._native_lj(positions, params, neighbors))


def _same_box(a: Space, b: Space) -> bool:
    """Whether two spaces have the same box: equal values, or one traced array."""
    if a.box is b.box:
        return True
    if is_tracer((a.box, b.box)):
        return False
    return bool(np.array_equal(np.broadcast_to(np.asarray(a.box), (3,)),
                               np.broadcast_to(np.asarray(b.box), (3,))))


# one compiled program per energy structure (the energy is a pytree argument)
_energy_jit = jax.jit(lambda energy, x, q, nbrs: energy._energy(x, q, nbrs))
_energy_and_forces_jit = jax.jit(lambda energy, x, q, nbrs: energy._energy_and_forces(x, q, nbrs))
_virial_jit = jax.jit(lambda energy, x, q, nbrs: energy._virial(x, q, nbrs))
_with_lj_jit = jax.jit(lambda energy, lj, x, q, sigma, epsilon, nbrs: energy._with_lj(
    lj, x, q, sigma, epsilon, nbrs))


def _exclusions(exclusions, exclusion_scale):
    if exclusions is None:
        if exclusion_scale is not None:
            raise ValueError("exclusion_scale was given without exclusions")
        return None, None
    e = jnp.asarray(exclusions)
    if e.ndim != 2 or e.shape[1] != 2 or not jnp.issubdtype(e.dtype, jnp.integer):
        raise ValueError(f"exclusions must be an (m, 2) integer array of pairs, got shape "
                         f"{e.shape} and dtype {e.dtype}")
    if exclusion_scale is not None:
        s = jnp.asarray(exclusion_scale)
        if s.shape not in ((), (e.shape[0],)):
            raise ValueError(f"exclusion_scale must be a scalar or shape ({e.shape[0]},), "
                             f"got {s.shape}")
        exclusion_scale = s
    return e, exclusion_scale


def _check_space(name, space, r_cut):
    if not isinstance(space, Space) or not space.periodic:
        raise ValueError(f"{name}: needs a periodic space, got {space!r}; in free space use "
                         f"pair_energy(coulomb, free())")
    if not r_cut > 0:
        raise ValueError(f"{name}: r_cut must be positive, got {r_cut!r}")
    if jnp.ndim(space.box) == 1 and jnp.shape(space.box)[0] != 3:
        raise ValueError(f"{name}: only 3D boxes, got box of shape {jnp.shape(space.box)}")


def _concrete_box(name, space, r_cut, tolerance, order, alpha):
    """Parameters from the tolerance (needs a concrete box), with ``alpha`` overriding."""
    if is_tracer(space.box):
        raise ValueError(f"{name}: build it with a concrete box (its k-vectors or grid are "
                         f"sized from it); pass the traced box later through the space leaf")
    b = _box3(space.box)
    if 2 * r_cut > b.min():
        raise ValueError(f"{name}: r_cut={r_cut} exceeds half the shortest box side "
                         f"{b.min()} (minimum image)")
    if alpha is None:
        return ewald_parameters(b, r_cut, tolerance, order=order)
    if is_tracer(alpha):
        raise ValueError(f"{name}: give alpha concretely when building (it sizes the k-vectors "
                         f"or grid); a traced alpha can replace it later as the energy's leaf")
    if not (np.isfinite(alpha) and alpha > 0):
        raise ValueError(f"{name}: alpha must be positive and finite, got {alpha!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"{name}: tolerance must be in (0, 1), got {tolerance!r}")
    return _reciprocal_sizes(b, r_cut, float(alpha), tolerance, order)


# ---------------------------------------------------------------------------------------
# The Ewald sum
# ---------------------------------------------------------------------------------------
def _half_kvectors(kmax) -> np.ndarray:
    """Integer wave vectors in the ellipsoid :math:`\\sum (m_a/k_a)^2 \\le 1`, one of each
    pair :math:`\\pm\\mathbf m` (and not 0): shape ``(K, 3)``."""
    kx, ky, kz = kmax
    m = np.stack(np.meshgrid(np.arange(0, kx + 1), np.arange(-ky, ky + 1),
                             np.arange(-kz, kz + 1), indexing="ij"), -1).reshape(-1, 3)
    half = (m[:, 0] > 0) | ((m[:, 0] == 0) & ((m[:, 1] > 0) | ((m[:, 1] == 0) & (m[:, 2] > 0))))
    inside = np.sum((m / np.asarray(kmax, np.float64)) ** 2, axis=1) <= 1.0 + 1e-12
    return m[half & inside]


@jax.tree_util.register_pytree_node_class
class Ewald(_Coulomb):
    r"""The Ewald sum of point charges in a periodic box; build it with :func:`ewald`.

    A pytree: the space (its box), ``alpha``, the Coulomb constant and the exclusions are
    leaves; the cutoff and the wave vectors are static. Memory :math:`O(nK)` for
    :math:`K` wave vectors: the reference, for small systems; use :func:`pme` for speed.
    """

    def __init__(self, space: Space, r_cut: float, alpha: float, kvectors: jax.Array,
                 coulomb_constant: float = 1.0, exclusions: ArrayLike | None = None,
                 exclusion_scale: ArrayLike | None = None, tile: int = 256) -> None:
        self._setup(space, r_cut, alpha, coulomb_constant, exclusions, exclusion_scale, tile)
        self.kvectors = kvectors

    def tree_flatten(self):
        return ((self.space, self.alpha, self.coulomb_constant, self.exclusions,
                 self.exclusion_scale), (self.r_cut, self.kvectors, self.tile))

    @classmethod
    def tree_unflatten(cls, static, children):
        space, alpha, k, excl, scale = children
        r_cut, kvectors, tile = static
        return cls(space, r_cut, alpha, kvectors, k, excl, scale, tile)

    def __repr__(self):
        return (f"ewald({self.space!r}, r_cut={self.r_cut}, alpha={self.alpha!r}, "
                f"{self.kvectors.m.shape[0]} k-vectors)")

    def _reciprocal(self, positions, q, box):
        r""":math:`\frac{4\pi}{V}\sum_{\mathbf k>0} e^{-k^2/4\alpha^2} |S(\mathbf k)|^2/k^2`."""
        m = jnp.asarray(self.kvectors.m, positions.dtype)
        k = 2 * math.pi * m / box                                   # (K, 3)
        k2 = jnp.sum(k * k, axis=1)
        alpha = jnp.asarray(self.alpha, positions.dtype)
        phase = positions @ k.T                                     # (n, K)
        s_cos = q @ jnp.cos(phase)
        s_sin = q @ jnp.sin(phase)
        weight = jnp.exp(-k2 / (4 * alpha**2)) / k2
        return 4 * math.pi / jnp.prod(box) * jnp.sum(weight * (s_cos**2 + s_sin**2))


class _Static:
    """A hashable wrapper for a numpy array kept as static pytree data."""

    def __init__(self, m: np.ndarray):
        self.m = m
        self._key = (m.shape, m.tobytes())

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, _Static) and self._key == other._key


def ewald(space: Space, r_cut: float, *, tolerance: float = 1e-6, alpha: float | None = None,
          kmax: tuple[int, int, int] | int | None = None,
          exclusions: ArrayLike | None = None, exclusion_scale: ArrayLike | None = None,
          coulomb_constant: float = 1.0, tile: int = 256) -> Ewald:
    r"""The Ewald sum of point charges, ``energy(positions, params, neighbors=None)``.

    .. math::

        U = k\Big[\sum_{i<j}^{r<r_c} q_i q_j\frac{\operatorname{erfc}(\alpha r_{ij})}{r_{ij}}
          + \frac{2\pi}{V}\sum_{\mathbf k\ne0}\frac{e^{-k^2/4\alpha^2}}{k^2}|S(\mathbf k)|^2
          - \frac{\alpha}{\sqrt\pi}\sum_i q_i^2 - \frac{\pi Q^2}{2V\alpha^2}\Big]
          - \text{exclusions}

    (Ewald, Ann. Phys. 369, 253 (1921); Allen & Tildesley 2017, §6.2). ``params['charges']``
    is ``(n,)``. A net charge :math:`Q \ne 0` is neutralised by a uniform background (the
    last term), which makes the energy independent of :math:`\alpha` but is itself an
    artefact of periodicity: compare energies of non-neutral boxes only at equal
    :math:`Q` and volume.

    Args:
        space: ``periodic(box)``, a 3D orthorhombic box with every side at least
            ``2 * r_cut``.
        r_cut: Real-space cutoff (a neighbour list must reach it).
        tolerance: Requested relative force error (see :func:`ewald_parameters`); sets
            ``alpha`` and ``kmax`` where they are not given. Wave vectors that would need
            more than 2 GiB are refused (``ValueError``), more than :math:`256^3` warn.
        alpha: The splitting parameter (1/length), a leaf (may be traced or differentiated).
        kmax: Largest wave index per axis (an int for all three).
        exclusions: ``(m, 2)`` pairs whose Coulomb interaction is removed (bonded atoms).
        exclusion_scale: Fraction of each excluded pair's Coulomb kept, scalar or ``(m,)``
            (0 by default; 0.5 or 1/1.2 for 1-4 pairs in common force fields).
        coulomb_constant: :math:`k = 1/4\pi\epsilon_0` in your units (1: Gaussian reduced
            units; 138.935458 kJ mol⁻¹ nm e⁻² for MD units).
        tile: Rows per tile of the all-pairs real-space sum.

    Example:
        >>> import jax.numpy as jnp
        >>> from simlib import particles as sp
        >>> x = jnp.array([[0., 0, 0], [.5, 0, 0], [0, .5, 0], [0, 0, .5], [.5, .5, 0],
        ...                [.5, 0, .5], [0, .5, .5], [.5, .5, .5]])
        >>> q = jnp.array([1., -1, -1, -1, 1, 1, 1, -1])           # rock salt, a = 1
        >>> energy = sp.ewald(sp.periodic(1.0), r_cut=0.5, tolerance=1e-12)
        >>> print(f"{-float(energy(x, dict(charges=q))) * 0.5 / 4:.9f}")   # Madelung
        1.747564595
    """
    _check_space("ewald", space, r_cut)
    params = _concrete_box("ewald", space, float(r_cut), tolerance, 5, alpha)
    if kmax is not None:
        kmax = (int(kmax),) * 3 if np.ndim(kmax) == 0 else tuple(int(k) for k in kmax)
        if len(kmax) != 3 or min(kmax) < 1:
            raise ValueError(f"ewald: kmax must be a positive int or three, got {kmax!r}")
    else:
        _check_reciprocal("ewald", tolerance, lambda t: _concrete_box(
            "ewald", space, float(r_cut), t, 5, alpha))
        kmax = params.kmax
    excl, scale = _exclusions(exclusions, exclusion_scale)
    return Ewald(space, float(r_cut), params.alpha, _Static(_half_kvectors(kmax)),
                 coulomb_constant, excl, scale, int(tile))


# ---------------------------------------------------------------------------------------
# Smooth particle-mesh Ewald
# ---------------------------------------------------------------------------------------
def _bspline_weights(w, order: int):
    r"""Cardinal B-spline values :math:`M_p(w + j)`, :math:`j = 0..p-1`, for fractional
    parts ``w`` in [0, 1): a list of ``p`` arrays shaped like ``w``. Recursion
    :math:`M_n(x) = \frac{x}{n-1}M_{n-1}(x) + \frac{n-x}{n-1}M_{n-1}(x-1)` from
    :math:`M_2` (Essmann et al. 1995, eq. 4.1)."""
    m = [w, 1.0 - w]
    for n in range(3, order + 1):
        prev = m + [0.0 * w]
        m = [((w + j) * prev[j] + (n - w - j) * (prev[j - 1] if j else 0.0)) / (n - 1)
             for j in range(n)]
    return m


@functools.lru_cache(maxsize=64)
def _bspline_moduli(size: int, order: int) -> np.ndarray:
    r""":math:`|b(m)|^2 = 1/|\sum_{k=0}^{p-2} M_p(k+1) e^{2\pi i mk/K}|^2` for
    :math:`m = 0..K-1` (Essmann et al. 1995, eq. 4.4). Where the sum vanishes (odd
    :math:`p` at :math:`m = K/2`) the neighbours' mean is used, as in OpenMM and GROMACS."""
    values = [float(v) for v in _bspline_weights(np.float64(0.0), order)]   # M_p(0..p-1)
    mp = np.array(values[1:])                                               # M_p(1..p-1)
    m = np.arange(size)
    k = np.arange(order - 1)
    denom = np.abs(np.exp(2j * np.pi * np.outer(m, k) / size) @ mp) ** 2
    small = denom < 1e-7
    for i in np.flatnonzero(small):
        denom[i] = 0.5 * (denom[(i - 1) % size] + denom[(i + 1) % size])
    return 1.0 / denom


@jax.tree_util.register_pytree_node_class
class PME(_Coulomb):
    r"""Smooth particle-mesh Ewald; build it with :func:`pme`.

    A pytree like :class:`Ewald`; the grid and the B-spline order are static.
    """

    def __init__(self, space: Space, r_cut: float, alpha: float, grid: tuple[int, int, int],
                 order: int, coulomb_constant: float = 1.0,
                 exclusions: ArrayLike | None = None,
                 exclusion_scale: ArrayLike | None = None, tile: int = 256) -> None:
        self._setup(space, r_cut, alpha, coulomb_constant, exclusions, exclusion_scale, tile)
        self.grid = grid
        self.order = order

    def tree_flatten(self):
        return ((self.space, self.alpha, self.coulomb_constant, self.exclusions,
                 self.exclusion_scale), (self.r_cut, self.grid, self.order, self.tile))

    @classmethod
    def tree_unflatten(cls, static, children):
        space, alpha, k, excl, scale = children
        r_cut, grid, order, tile = static
        return cls(space, r_cut, alpha, grid, order, k, excl, scale, tile)

    def __repr__(self):
        return (f"pme({self.space!r}, r_cut={self.r_cut}, alpha={self.alpha!r}, "
                f"grid={self.grid}, order={self.order})")

    def spread(self, positions, q, box):
        r"""The charge grid :math:`Q(\mathbf k) = \sum_i q_i \prod_a M_p(u_{ia} - k_a)`
        (periodically), with scaled coordinates :math:`u_{ia} = K_a x_{ia}/L_a`
        (Essmann et al. 1995, eq. 4.6): shape ``grid`` (pure JAX, the reference)."""
        return _spread_pure(self.grid, self.order, positions, q, box)

    def _influence(self, box, dtype):
        return _influence(self.grid, self.order, box, jnp.asarray(self.alpha, dtype), dtype)

    def reciprocal_from_grid(self, charge, box):
        r""":math:`E_{rec} = \frac{1}{2\pi V}\sum_{\mathbf m\ne0}
        \frac{e^{-\pi^2m^2/\alpha^2}}{m^2}B(\mathbf m)|\hat Q(\mathbf m)|^2`
        (Essmann et al. 1995, eq. 4.7) from the charge grid."""
        return _reciprocal_from_grid(self.grid, self.order, charge, box,
                                     jnp.asarray(self.alpha, charge.dtype))

    def _reciprocal(self, positions, q, box):
        """The reciprocal energy: native spreading and gathering on the CPU where they can
        be built (:func:`_pme_reciprocal`), else pure JAX (autodiff of the spreading)."""
        if _native_pme(positions, q):
            alpha = jnp.asarray(self.alpha, positions.dtype)
            return _pme_reciprocal(self.grid, self.order, positions, q, box, alpha)[0]
        return self.reciprocal_from_grid(self.spread(positions, q, box), box)


def _spread_pure(grid, order, positions, q, box):
    """:meth:`PME.spread` in pure JAX: one scatter-add of the :math:`np^3` weights."""
    p = order
    grid = np.asarray(grid)
    u = positions * (jnp.asarray(grid, positions.dtype) / box)
    base = jnp.floor(u)
    w = u - base
    base = base.astype(jnp.int32)
    j = np.arange(p)
    idx = [(base[:, a, None] - j[None, :]) % int(grid[a]) for a in range(3)]   # (n, p)
    wts = [jnp.stack(_bspline_weights(w[:, a], p), axis=1) for a in range(3)]  # (n, p)
    weights = (q[:, None, None, None] * wts[0][:, :, None, None]
               * wts[1][:, None, :, None] * wts[2][:, None, None, :])
    flat = ((idx[0][:, :, None, None] * int(grid[1]) + idx[1][:, None, :, None])
            * int(grid[2]) + idx[2][:, None, None, :])
    charge = jnp.zeros(int(np.prod(grid)), positions.dtype)
    charge = charge.at[flat.reshape(-1)].add(weights.reshape(-1))
    return charge.reshape(tuple(int(g) for g in grid))


def _influence(grid, order, box, alpha, dtype):
    r""":math:`\frac{1}{\pi V}\frac{e^{-\pi^2 m^2/\alpha^2}}{m^2} B(\mathbf m)` on the
    ``rfftn`` half grid, counting each :math:`\pm\mathbf m` pair once, 0 at
    :math:`\mathbf m = 0`."""
    kx, ky, kz = (int(g) for g in grid)
    mods = [_bspline_moduli(g, order) for g in (kx, ky, kz)]
    mz = np.arange(kz // 2 + 1)
    count = np.where((mz == 0) | (2 * mz == kz), 1.0, 2.0)      # rfft: +-m_z twice
    # B(m) as an outer product in the graph: three small constants, not one of the grid's
    # size (large literals are slow to compile)
    bx, by, bz = (jnp.asarray(v, dtype) for v in (mods[0], mods[1], mods[2][mz] * count))
    static = bx[:, None, None] * by[None, :, None] * bz[None, None, :]
    m = [jnp.asarray(np.fft.fftfreq(g, 1.0 / g), dtype) / box[a]
         for a, g in enumerate((kx, ky))]
    m.append(jnp.asarray(mz, dtype) / box[2])
    m2 = m[0][:, None, None] ** 2 + m[1][None, :, None] ** 2 + m[2][None, None, :] ** 2
    zero = m2 == 0
    m2 = jnp.where(zero, 1.0, m2)
    green = jnp.where(zero, 0.0, jnp.exp(-(math.pi**2) * m2 / alpha**2) / m2)
    return static * green / (2 * math.pi * jnp.prod(box))


def _reciprocal_from_grid(grid, order, charge, box, alpha):
    """:meth:`PME.reciprocal_from_grid` with ``alpha`` an argument."""
    qhat = jnp.fft.rfftn(charge)
    return jnp.sum(_influence(grid, order, box, alpha, charge.dtype)
                   * (qhat.real**2 + qhat.imag**2))


def _native_pme(positions, q) -> bool:
    """Whether the native spreading and gathering serve this call: positions ``(n, 3)`` in
    float32/64, charges of the same dtype, and the library loaded."""
    return (positions.ndim == 2 and positions.shape[1] == 3
            and positions.dtype in (jnp.float32, jnp.float64) and q.dtype == positions.dtype
            and _native.load() is not None)


def _pme_reciprocal_pure(grid, order, positions, q, box, alpha):
    r"""The reciprocal energy in pure JAX with its first derivatives ``(E, F, dE/dq, dE/dL,
    dE/d\alpha)``, the box derivative at fixed positions (the native kernels' reference)."""

    def energy(x, q, box, alpha):
        return _reciprocal_from_grid(grid, order, _spread_pure(grid, order, x, q, box), box,
                                     alpha)

    e, (gx, gq, gb, ga) = jax.value_and_grad(energy, argnums=(0, 1, 2, 3))(positions, q, box,
                                                                          alpha)
    return e, -gx, gq, gb, ga


def _pme_spread_ffi(grid, order, positions, q, box):
    """The charge grid from ``_native/pme.cc`` (the semantics of :func:`_spread_pure`)."""
    dtype = positions.dtype
    name = "simlib_pme_spread_f32" if dtype == jnp.float32 else "simlib_pme_spread_f64"
    call = jax.ffi.ffi_call(name, jax.ShapeDtypeStruct(tuple(int(g) for g in grid), dtype),
                            vmap_method="sequential")
    return call(positions, q, box, order=np.int64(order))


def _pme_gather_ffi(grid, order, positions, q, box, potential):
    r"""``(F, dE/dq)`` from the potential grid :math:`\partial E/\partial Q` (``pme.cc``):
    :math:`F_i = -q_i\sum_k\nabla_i\theta_i(k)\,\phi(k)`, :math:`\phi_i =
    \sum_k\theta_i(k)\,\phi(k)`."""
    dtype = positions.dtype
    name = "simlib_pme_gather_f32" if dtype == jnp.float32 else "simlib_pme_gather_f64"
    call = jax.ffi.ffi_call(name, (jax.ShapeDtypeStruct(positions.shape, dtype),
                                   jax.ShapeDtypeStruct(q.shape, dtype)),
                            vmap_method="sequential")
    return tuple(call(positions, q, box, potential, order=np.int64(order)))


def _pme_reciprocal_native(grid, order, positions, q, box, alpha):
    r"""Native spreading, ``rfftn`` and the influence function in XLA, the potential grid
    :math:`\phi = \partial E/\partial Q` by reverse mode (one ``irfftn``), native
    gathering. The box derivative at fixed positions adds the grid's share
    :math:`\sum_i x_{ia}F_{ia}/L_a` (:math:`u = xK/L`) to the influence function's."""
    charge = _pme_spread_ffi(grid, order, positions, q, box)
    e, (potential, gb, ga) = jax.value_and_grad(
        lambda c, b, a: _reciprocal_from_grid(grid, order, c, b, a), argnums=(0, 1, 2))(
        charge, box, alpha)
    f, phi = _pme_gather_ffi(grid, order, positions, q, box, potential)
    return e, f, phi, gb + jnp.sum(positions * f, axis=0) / box, ga


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _pme_reciprocal(grid, order, positions, q, box, alpha):
    r"""The PME reciprocal energy with its first derivatives ``(E, F, dE/dq, dE/dL,
    dE/d\alpha)``: native spreading and gathering on the CPU (``_native/pme.cc``), pure
    JAX elsewhere. As for :func:`_ewald_real`, the tangent of ``E`` is assembled from those
    derivatives (forces and virials cost one spreading and one gathering) and the tangents
    of the derivatives come from the pure-JAX path."""
    return lax.platform_dependent(
        positions, q, box, alpha,
        cpu=lambda *a: _pme_reciprocal_native(grid, order, *a),
        default=lambda *a: _pme_reciprocal_pure(grid, order, *a))


@_pme_reciprocal.defjvp
def _pme_reciprocal_jvp(grid, order, primals, tangents):
    positions, q, box, alpha = primals
    tx, tq, tb, ta = tangents
    out = _pme_reciprocal(grid, order, *primals)
    _, f, phi, box_grad, alpha_grad = out
    t_energy = (jnp.sum(phi * tq) - jnp.sum(f * tx) + jnp.sum(box_grad * tb)
                + alpha_grad * ta)
    _, t_rest = jax.jvp(lambda *a: _pme_reciprocal_pure(grid, order, *a)[1:], primals,
                        tangents)
    return out, (t_energy, *t_rest)


def pme(space: Space, r_cut: float, *, tolerance: float = 1e-6, alpha: float | None = None,
        grid: tuple[int, int, int] | int | None = None, order: int = 5,
        exclusions: ArrayLike | None = None, exclusion_scale: ArrayLike | None = None,
        coulomb_constant: float = 1.0, tile: int = 256) -> PME:
    r"""Smooth particle-mesh Ewald (Essmann et al., J. Chem. Phys. 103, 8577 (1995)).

    The energy of :func:`ewald` with the reciprocal sum evaluated on a grid: charges are
    spread with cardinal B-splines of order ``order`` (:math:`p`), transformed with
    ``jnp.fft.rfftn``, multiplied by the influence function
    :math:`e^{-\pi^2m^2/\alpha^2}B(\mathbf m)/(\pi V m^2)`, and the forces are the exact
    gradient of that energy. Cost :math:`O(n p^3 + K\log K)`.

    Args:
        space, r_cut, tolerance, alpha, exclusions, exclusion_scale, coulomb_constant, tile:
            As for :func:`ewald`.
        grid: Grid points per axis (an int for all three); by default from the tolerance
            (:func:`ewald_parameters`), refused (``ValueError``) where it would need more than
            2 GiB and warned about above :math:`256^3` points.
        order: B-spline order :math:`p` (interpolation of degree :math:`p-1`), at least 3.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from simlib import particles as sp
        >>> x = jax.random.uniform(jax.random.key(0), (16, 3)) * 2.0
        >>> q = jnp.tile(jnp.array([1.0, -1.0]), 8)
        >>> e_pme = sp.pme(sp.periodic(2.0), r_cut=0.9, tolerance=1e-6)(x, dict(charges=q))
        >>> e_ewald = sp.ewald(sp.periodic(2.0), r_cut=0.9, tolerance=1e-8)(x, dict(charges=q))
        >>> bool(abs(e_pme - e_ewald) < 1e-5 * abs(e_ewald))
        True
    """
    _check_space("pme", space, r_cut)
    if int(order) < 3:
        raise ValueError(f"pme: order must be at least 3, got {order!r}")
    params = _concrete_box("pme", space, float(r_cut), tolerance, int(order), alpha)
    if grid is not None:
        grid = (int(grid),) * 3 if np.ndim(grid) == 0 else tuple(int(g) for g in grid)
        if len(grid) != 3 or min(grid) < int(order):
            raise ValueError(f"pme: grid must have three sizes of at least order={order}, "
                             f"got {grid!r}")
    else:
        _check_reciprocal("pme", tolerance, lambda t: _concrete_box(
            "pme", space, float(r_cut), t, int(order), alpha))
        grid = params.grid
    excl, scale = _exclusions(exclusions, exclusion_scale)
    return PME(space, float(r_cut), params.alpha, grid, int(order), coulomb_constant, excl,
               scale, int(tile))


__all__ = ["Ewald", "EwaldParameters", "PME", "ewald", "ewald_parameters", "pme"]
