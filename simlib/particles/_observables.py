r"""Observables of a particle configuration (Allen & Tildesley 2017, ch. 2).

Units are the simulation's reduced units with Boltzmann's constant 1, so temperatures are
energies (``kT``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from ._energy import Energy, as_energy
from ._space import Space


def _mass_column(masses, like):
    m = jnp.asarray(masses, like.dtype)
    return m[..., :, None] if m.ndim >= 1 else m


def kinetic_energy(velocities: ArrayLike, masses: ArrayLike) -> jax.Array:
    r""":math:`K = \tfrac12 \sum_i m_i |v_i|^2`."""
    v = jnp.asarray(velocities)
    return 0.5 * jnp.sum(_mass_column(masses, v) * v * v, axis=(-2, -1))


def temperature(velocities: ArrayLike, masses: ArrayLike, *,
                remove_momentum: bool = True) -> jax.Array:
    r"""Kinetic temperature :math:`kT = 2K / N_f`, with :math:`N_f = d(n - 1)` degrees of
    freedom when the total momentum is conserved (``remove_momentum``), else :math:`dn`."""
    v = jnp.asarray(velocities)
    n, d = v.shape[-2:]
    dof = d * (n - 1) if remove_momentum else d * n
    return 2.0 * kinetic_energy(v, masses) / dof


def total_momentum(velocities: ArrayLike, masses: ArrayLike) -> jax.Array:
    r""":math:`P = \sum_i m_i v_i`, shape ``(d,)``."""
    v = jnp.asarray(velocities)
    return jnp.sum(_mass_column(masses, v) * v, axis=-2)


def angular_momentum(positions: ArrayLike, velocities: ArrayLike,
                     masses: ArrayLike) -> jax.Array:
    r""":math:`L = \sum_i m_i\, x_i \times v_i` about the origin (free space): shape ``(3,)`` in
    3D, a scalar in 2D."""
    x, v = jnp.asarray(positions), jnp.asarray(velocities)
    p = _mass_column(masses, v) * v
    if x.shape[-1] == 2:
        return jnp.sum(x[..., 0] * p[..., 1] - x[..., 1] * p[..., 0], axis=-1)
    return jnp.sum(jnp.cross(x, p), axis=-2)


def pressure(energy: Energy | Callable[..., jax.Array], positions: ArrayLike,
             velocities: ArrayLike, masses: ArrayLike, params: Any, *,
             space: Space | None = None, neighbors: Any = None) -> jax.Array:
    r"""Instantaneous pressure from the virial theorem:
    :math:`P = \frac{1}{dV}\left(2K + \sum_{i<j} r_{ij}\cdot f_{ij}\right)`
    (Allen & Tildesley 2017, eq. 2.61). Needs a periodic space (the energy's by default).
    """
    energy = as_energy(energy)
    space = energy.space if space is None else space
    x = jnp.asarray(positions)
    d = x.shape[-1]
    virial = energy.virial(x, params, neighbors)
    return (2.0 * kinetic_energy(velocities, masses) + virial) / (d * space.volume(d))


def pressure_tensor(energy: Energy | Callable[..., jax.Array], positions: ArrayLike,
                    velocities: ArrayLike, masses: ArrayLike, params: Any, *,
                    space: Space | None = None, neighbors: Any = None) -> jax.Array:
    r"""Instantaneous pressure tensor :math:`P_{ab} = \frac{1}{V}\left(\sum_i m_i v_{ia}
    v_{ib} + W_{ab}\right)` with the virial tensor :math:`W_{ab} = \sum_{i<j} r_{ij,a}
    f_{ij,b}` (Allen & Tildesley 2017, §2.7), ``(d, d)``; its trace over ``d`` is
    :func:`pressure`. For anisotropic barostats (the diagonal) and shear stress (the
    off-diagonal terms, e.g. for viscosity by Green-Kubo). An energy whose virial is known
    only on the diagonal (:func:`pme`, :func:`ewald`, or a sum with one of them) gives NaN
    off the diagonal.
    """
    energy = as_energy(energy)
    space = energy.space if space is None else space
    x = jnp.asarray(positions)
    v = jnp.asarray(velocities)
    d = x.shape[-1]
    m = _mass_column(masses, v)
    kinetic = jnp.einsum("na,nb->ab", m * v, v)
    w = energy.virial_tensor(x, params, neighbors)
    if w.ndim == 1:                   # the diagonal only: the off-diagonal terms are unknown
        w = jnp.where(jnp.eye(d, dtype=bool), jnp.diag(w), jnp.nan)
    return (kinetic + w) / space.volume(d)


def radial_distribution(positions: ArrayLike, space: Space, *, r_max: float,
                        n_bins: int = 100) -> tuple[jax.Array, jax.Array]:
    r"""The radial distribution function :math:`g(r)` of one or more frames.

    :math:`g(r) = \frac{V}{n(n-1)}\,\frac{2\,N_{pairs}(r, r+\Delta r)}{V_{shell}(r)}`, averaged
    over frames, in a periodic box (minimum images; ``r_max`` at most half the box).

    Args:
        positions: ``(n, d)`` or ``(n_frames, n, d)``.
        space: A periodic space.
        r_max: Largest distance binned.
        n_bins: Number of bins.

    Returns:
        ``(r, g)``: bin centres and :math:`g` at them, each ``(n_bins,)``.
    """
    x = jnp.asarray(positions)
    if x.ndim == 2:
        x = x[None]
    n_frames, n, d = x.shape
    edges = jnp.linspace(0.0, r_max, n_bins + 1, dtype=x.dtype)
    i, j = jnp.triu_indices(n, k=1)

    def histogram(frame):
        dr = space.displacement(frame[i], frame[j])
        r = jnp.sqrt(jnp.sum(dr * dr, axis=-1))
        b = jnp.floor(r / (r_max / n_bins)).astype(jnp.int32)
        return jnp.zeros(n_bins + 1, x.dtype).at[jnp.minimum(b, n_bins)].add(1.0)[:n_bins]

    counts = jnp.sum(jax.lax.map(histogram, x), axis=0)
    if d == 3:
        shell = 4.0 / 3.0 * jnp.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    elif d == 2:
        shell = jnp.pi * (edges[1:] ** 2 - edges[:-1] ** 2)
    else:
        shell = 2.0 * (edges[1:] - edges[:-1])
    pair_density = (n - 1) / space.volume(d)      # other particles per unit volume
    g = 2.0 * counts / (n_frames * n * pair_density * shell)
    return 0.5 * (edges[1:] + edges[:-1]), g


def mean_square_displacement(positions: ArrayLike, space: Space | None = None, *,
                             origins: int | None = None) -> jax.Array:
    r"""Mean-square displacement over saved frames, per lag (in frames).

    Without ``origins``, from the first frame only:
    :math:`\mathrm{MSD}(k) = \langle |x_i(k) - x_i(0)|^2 \rangle_i`. With ``origins=s``,
    averaged over the time origins :math:`t_0 = 0, s, 2s, \dots` (every frame for
    ``s = 1``), each lag over the origins that have a frame that many frames later:

    .. math::
        \mathrm{MSD}(k) = \frac{1}{n\,|O_k|}\sum_{t_0 \in O_k}\sum_i
            |x_i(t_0 + k) - x_i(t_0)|^2,\qquad O_k = \{t_0 : t_0 + k < n_{frames}\}

    (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed., 2017, §8.7). Many
    origins lower the noise at short lags; the last lags still rest on few intervals. The
    cost is ``n_frames * n_origins * n`` displacements (a ``lax.map`` over lags).

    Args:
        positions: ``(n_frames, n, d)``.
        space: In a periodic space, frames are unwrapped by summing minimum-image
            displacements between consecutive frames, which is right as long as no
            particle moves half a box between frames.
        origins: ``None`` (the first frame), or the spacing ``s >= 1`` of the time
            origins in frames.

    Returns:
        ``(n_frames,)``: the MSD at lags ``0, 1, ..., n_frames - 1`` frames.
    """
    x = jnp.asarray(positions)
    if x.ndim != 3:
        raise ValueError(f"mean_square_displacement: positions must be (n_frames, n, d), got "
                         f"shape {x.shape}")
    if origins is not None and not (isinstance(origins, int | np.integer)
                                    and not isinstance(origins, bool) and origins >= 1):
        raise ValueError(f"mean_square_displacement: origins must be None or a positive "
                         f"integer (the spacing of the time origins in frames), got "
                         f"{origins!r}")
    if space is not None and space.periodic:
        steps = space.displacement(x[1:], x[:-1])
        x = jnp.concatenate([x[:1], x[:1] + jnp.cumsum(steps, axis=0)])
    if origins is None:
        dx = x - x[:1]
        return jnp.mean(jnp.sum(dx * dx, axis=-1), axis=-1)
    f = x.shape[0]
    t0 = np.arange(0, f, int(origins))                 # static: the origins' frames
    start = x[t0]

    def lag(k):
        later = t0 + k
        valid = later < f
        dx = x[jnp.minimum(later, f - 1)] - start
        per_origin = jnp.mean(jnp.sum(dx * dx, axis=-1), axis=-1)
        return jnp.sum(jnp.where(valid, per_origin, 0.0)) / jnp.sum(valid)

    return jax.lax.map(lag, jnp.arange(f))


def block_average(samples: ArrayLike, n_blocks: int | None = None) -> tuple[float, float]:
    r"""The mean of ``samples`` and its standard error by block averaging.

    The series is cut into ``n_blocks`` consecutive blocks (``np.array_split``: lengths
    differ by at most one); the standard error is that of the block means,
    :math:`\sigma = \mathrm{std}(ar x_b) / \sqrt{n_b}` (sample standard deviation,
    ``ddof=1``). It is the error of the mean when the blocks are longer than the
    correlation time (Flyvbjerg & Petersen, J. Chem. Phys. 91, 461 (1989); Allen &
    Tildesley 2017, §8.4): check that fewer, longer blocks give about the same value. With
    ``n_blocks=None`` every sample is its own block: for independent estimates (a peak
    position per block of frames, a diffusion coefficient per group of molecules).

    Args:
        samples: ``(n,)``: a time series, or independent estimates.
        n_blocks: Number of blocks, at least 2 and at most ``n``.

    Returns:
        ``(mean, standard_error)``: the mean of all samples (numpy floats).
    """
    x = np.asarray(samples, float)
    if x.ndim != 1:
        raise ValueError(f"block_average: samples must be 1-D, got shape {x.shape}")
    n_b = len(x) if n_blocks is None else n_blocks
    if not (isinstance(n_b, int | np.integer) and not isinstance(n_b, bool)
            and 2 <= n_b <= len(x)):
        raise ValueError(f"block_average: needs at least 2 blocks of at least one sample: "
                         f"n_blocks={n_blocks!r} for {len(x)} samples")
    means = np.array([b.mean() for b in np.array_split(x, int(n_b))])
    return float(x.mean()), float(means.std(ddof=1) / np.sqrt(n_b))


def peak_position(r: ArrayLike, g: ArrayLike) -> float:
    r"""Where the tabulated ``g(r)`` is largest (e.g. the first peak of a radial
    distribution), refined by the parabola through the highest point and its neighbours:
    :math:`r_k + rac{\Delta r}{2}\,rac{g_{k-1} - g_{k+1}}{g_{k-1} - 2g_k + g_{k+1}}`
    on an even grid :math:`\Delta r` (exact for a parabola; the highest point of the
    ends is moved one point in).

    Args:
        r: ``(n,)`` evenly spaced points, ``n >= 3``.
        g: ``(n,)`` values at them.
    """
    r, g = np.asarray(r, float), np.asarray(g, float)
    if r.ndim != 1 or r.shape != g.shape or len(r) < 3:
        raise ValueError(f"peak_position: r and g must be 1-D of equal length >= 3, got "
                         f"shapes {r.shape} and {g.shape}")
    k = min(max(int(np.argmax(g)), 1), len(g) - 2)
    y0, y1, y2 = g[k - 1], g[k], g[k + 1]
    den = y0 - 2 * y1 + y2
    shift = 0.5 * (y0 - y2) / den if den != 0 else 0.0
    return float(r[k] + shift * (r[1] - r[0]))


def diffusion_coefficient(times: ArrayLike, msd: ArrayLike, *, dim: int,
                          window: tuple[float, float] = (0.2, 0.8)) -> float:
    r"""The self-diffusion coefficient from the Einstein relation
    :math:`\langle |x(t) - x(0)|^2 \rangle \to 2 d D t`: the slope of a least-squares line
    through the mean-square displacement over a window of times, divided by :math:`2d`
    (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed., 2017, §8.7).

    Args:
        times: ``(n_frames,)`` times of the frames.
        msd: ``(n_frames,)``, e.g. from :func:`mean_square_displacement`.
        dim: The number of dimensions ``d``.
        window: The fraction of the run fitted, ``(start, stop)``: the start skips the
            ballistic regime (``msd ~ t^2`` over the first collisions), the stop the last
            frames, where the average rests on few independent intervals.

    The statistical error is not estimated here: compare runs, or groups of particles
    (the MSD of each group through :func:`mean_square_displacement`, the spread of their
    coefficients through :func:`block_average`).
    """
    t = np.asarray(times, float)
    m = np.asarray(msd, float)
    if t.ndim != 1 or t.shape != m.shape:
        raise ValueError(f"diffusion_coefficient: times and msd must be 1-D of equal length, "
                         f"got shapes {t.shape} and {m.shape}")
    if not (isinstance(dim, int) and dim >= 1):
        raise ValueError(f"diffusion_coefficient: dim must be a positive integer, got {dim!r}")
    start, stop = window
    if not 0.0 <= start < stop <= 1.0:
        raise ValueError(f"diffusion_coefficient: window must be (start, stop) with "
                         f"0 <= start < stop <= 1, got {window!r}")
    i0, i1 = int(start * (len(t) - 1)), int(np.ceil(stop * (len(t) - 1)))
    if i1 - i0 < 2:
        raise ValueError(f"diffusion_coefficient: the window {window} holds {i1 - i0 + 1} "
                         f"frames of {len(t)}; at least 3 are needed")
    slope = np.polyfit(t[i0:i1 + 1], m[i0:i1 + 1], 1)[0]
    return float(slope / (2 * dim))
