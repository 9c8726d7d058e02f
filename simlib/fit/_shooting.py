"""Multiple shooting: fit ODE parameters on long or chaotic horizons.

The observation times are split into ``K`` consecutive segments; each segment starts
from its own fitted state and is integrated only over its own short span, so the loss
stays smooth in the parameters even when one long trajectory would be chaotic. A
penalty ties the end of each segment to the start of the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._solve import SaveAt, solve
from .._solver._base import AbstractSolver
from ._losses import mse_loss, trajectory_residuals
from ._transforms import Transform

PyTree = Any

__all__ = ["MultipleShooting", "multiple_shooting"]


class _Shifted:
    """``g(s, y, (args, t_start)) = f(t_start + s, y, args)``: a segment in local time, so
    equal-length segments share one static time grid and can be ``vmap``-ped.
    Hashes like ``f``, so solve's compilation caches still hit."""

    def __init__(self, f: Callable):
        self.f = f

    def __call__(self, s, y, args_and_start):
        args, t_start = args_and_start
        return self.f(t_start + s, y, args)

    def __hash__(self) -> int:
        return hash((_Shifted, self.f))

    def __eq__(self, other) -> bool:
        return isinstance(other, _Shifted) and other.f == self.f


@dataclass(frozen=True, eq=False)
class MultipleShooting:
    r"""A multiple-shooting least-squares problem; build it with :func:`multiple_shooting`.

    Parameters are a dict ``{"args": args, "y0s": y0s}``: the vector field's parameters
    and the ``(K, d)`` initial states of the ``K`` segments. Segment ``k`` starts at
    ``ts[starts[k]]`` from ``y0s[k]`` and predicts the observations up to (not including)
    the start of segment ``k + 1``; the last segment also predicts the last observation.
    The loss is

    .. math::

        L = \mathrm{mse}(\hat y, y; \sigma, M)
            + w \sum_{k=0}^{K-2} \lVert y_k(t_{k+1}) - y0s_{k+1} \rVert^2 ,

    the data misfit of :func:`mse_loss` plus ``continuity_weight`` :math:`w` times the
    squared continuity defects, where :math:`y_k(t_{k+1})` is segment ``k`` integrated to
    the start time of segment ``k + 1``.

    Attributes:
        f: The vector field ``f(t, y, args)``.
        ts: Observation times (numpy, increasing).
        observed: Observations ``(n, d)``.
        starts: Index of each segment's first observation, plus ``n - 1`` at the end.
        solver, dt, rtol, atol, max_steps, throw, adjoint: Passed to :func:`simlib.solve`
            (``adjoint`` only when not None).
        sigma, mask: Noise scale and observed entries, as in :func:`mse_loss`.
        continuity_weight: The penalty weight :math:`w`.
        uniform: True when every segment has the same local time grid (segments are then
            integrated together under ``jax.vmap``).

    References:
        H. G. Bock and K. J. Plitt, "A multiple shooting algorithm for direct solution of
        optimal control problems", IFAC Proceedings 17 (1984) 1603-1608.
        E. Baake, M. Baake, H. G. Bock and K. M. Briggs, "Fitting ordinary differential
        equations to chaotic data", *Phys. Rev. A* 45 (1992) 5524-5529.
    """

    f: Callable
    ts: np.ndarray
    observed: jax.Array
    starts: tuple[int, ...]
    solver: AbstractSolver
    dt: float | None
    rtol: float | None
    atol: float | None
    max_steps: int
    throw: bool
    sigma: Any
    mask: np.ndarray | None
    continuity_weight: float
    uniform: bool
    save_ts: tuple[jax.Array, ...]
    adjoint: Any = None

    @property
    def segments(self) -> int:
        """Number of segments ``K``."""
        return len(self.starts) - 1

    # ------------------------------------------------------------------ parameters
    def init_params(self, args: PyTree, y0s: Any = None) -> dict:
        """Initial parameters ``{"args": args, "y0s": y0s}``.

        Args:
            args: Initial guess of the vector field's parameters.
            y0s: Initial segment states ``(K, d)``; default: the observations at the
                segment start times (every component must then be observed there).

        Returns:
            The parameter dict to pass to :func:`simlib.fit.fit` as ``params0``.
        """
        starts = np.asarray(self.starts[:-1])
        if y0s is None:
            if self.mask is not None and not np.all(self.mask[starts]):
                raise ValueError(
                    "init_params: some state components are not observed (mask) at the segment "
                    "starts, so y0s cannot be taken from the data; pass y0s explicitly"
                )
            y0s = self.observed[starts]
        y0s = jnp.asarray(y0s)
        if y0s.shape != (self.segments, self.observed.shape[1]):
            raise ValueError(f"y0s must have shape (segments, d) = "
                             f"{(self.segments, self.observed.shape[1])}, got {y0s.shape}")
        return {"args": args, "y0s": y0s}

    def transforms(self, args: Transform | PyTree = None) -> dict:
        """The ``transforms`` tree for :func:`simlib.fit.fit`: ``args`` (a transform, or a
        tree of them matching ``args``) for the parameters, identity for the states."""
        return {"args": args, "y0s": None}

    # ------------------------------------------------------------------ integration
    def _solve_kw(self) -> dict:
        kw = dict(solver=self.solver, dt=self.dt, rtol=self.rtol, atol=self.atol,
                  max_steps=self.max_steps, throw=self.throw)
        if self.adjoint is not None:
            kw["adjoint"] = self.adjoint
        return kw

    def _segments(self, params: dict) -> tuple[jax.Array, jax.Array]:
        """Predictions at every observation time ``(n, d)`` and the ``K - 1`` segment
        end states that should match the next segment's start ``(K - 1, d)``."""
        args, y0s = params["args"], jnp.asarray(params["y0s"])
        starts = self.starts
        if self.uniform:
            m = starts[1] - starts[0]
            (rel,) = self.save_ts
            t_starts = jnp.asarray(self.ts[np.asarray(starts[:-1])], dtype=y0s.dtype)
            field = _Shifted(self.f)

            def one(y0, t_start):
                sol = solve(field, y0, 0.0, float(self.ts[m] - self.ts[0]), args=(args, t_start),
                            saveat=SaveAt(ts=rel), **self._solve_kw())
                return sol.ys

            ys = jax.vmap(one)(y0s, t_starts)  # (K, m + 1, d)
            d = ys.shape[-1]
            pred = jnp.concatenate([ys[:, :m].reshape(-1, d), ys[-1, m:]], axis=0)
            return pred, ys[:-1, m]
        pieces, ends = [], []
        for k in range(self.segments):
            i0, i1 = starts[k], starts[k + 1]
            sol = solve(self.f, y0s[k], float(self.ts[i0]), float(self.ts[i1]), args=args,
                        saveat=SaveAt(ts=self.save_ts[k]), **self._solve_kw())
            last = k == self.segments - 1
            pieces.append(sol.ys if last else sol.ys[:-1])
            if not last:
                ends.append(sol.ys[-1])
        d = y0s.shape[-1]
        end_arr = jnp.stack(ends) if ends else jnp.zeros((0, d), y0s.dtype)
        return jnp.concatenate(pieces, axis=0), end_arr

    def predict(self, params: dict) -> jax.Array:
        """Model values at every observation time, shape ``(n, d)``: each segment's
        trajectory from its own start state."""
        return self._segments(params)[0]

    def defects(self, params: dict) -> jax.Array:
        """Continuity defects ``y_k(t_{k+1}) - y0s[k+1]``, shape ``(K - 1, d)``."""
        _, ends = self._segments(params)
        return ends - jnp.asarray(params["y0s"])[1:]

    # ------------------------------------------------------------------ objectives
    def loss(self, params: dict) -> jax.Array:
        """The multiple-shooting loss ``mse + continuity_weight * sum(defects ** 2)``."""
        pred, ends = self._segments(params)
        gaps = ends - jnp.asarray(params["y0s"])[1:]
        misfit = mse_loss(pred, self.observed, sigma=self.sigma, mask=self.mask)
        return misfit + self.continuity_weight * jnp.sum(gaps**2)

    def residuals(self, params: dict) -> jax.Array:
        r"""Residual vector consistent with :meth:`loss`: ``loss = sum(r ** 2) / N`` with
        ``N`` the number of observed entries, i.e. ``r = [data residuals,
        sqrt(N w) * defects]``."""
        pred, ends = self._segments(params)
        gaps = ends - jnp.asarray(params["y0s"])[1:]
        r_data = trajectory_residuals(pred, self.observed, sigma=self.sigma, mask=self.mask)
        scale = jnp.sqrt(r_data.shape[0] * self.continuity_weight)
        return jnp.concatenate([r_data, scale * jnp.ravel(gaps).astype(r_data.dtype)])


def multiple_shooting(
    f: Callable,
    ts: Any,
    observed: Any,
    *,
    segments: int,
    solver: AbstractSolver,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    max_steps: int = 4096,
    throw: bool = False,
    adjoint: Any = None,
    sigma: Any = None,
    mask: Any = None,
    continuity_weight: float = 1.0,
) -> MultipleShooting:
    r"""Set up a multiple-shooting fit of ``f``'s parameters to observations ``(ts, observed)``.

    The ``n`` observation times are split into ``segments`` consecutive segments of
    (as nearly as possible) equal numbers of intervals; segment ``k`` is integrated with
    :func:`simlib.solve` from its own fitted initial state. When all segments have the
    same local time grid (uniformly spaced ``ts`` and ``segments`` dividing ``n - 1``)
    they are integrated together under ``jax.vmap``, in local time
    ``f(t_start + s, y, args)`` so that non-autonomous fields work too; otherwise one
    ``solve`` per segment. ``segments=1`` is single shooting (with the initial state
    fitted). The loss (see :class:`MultipleShooting`) is

    .. math:: L = \mathrm{mse}(\hat y, y; \sigma, M) + w \sum_k
              \lVert y_k(t_{k+1}) - y0s_{k+1} \rVert^2 .

    Example (Lorenz):

    .. code-block:: python

        ms = multiple_shooting(lorenz, ts, ys_obs, segments=40, solver=sl.Tsit5(),
                               rtol=1e-8, atol=1e-8)
        res = fit(ms.loss, ms.init_params((8.0, 22.0, 2.0)),
                  transforms=ms.transforms(Positive()), optimizer=optax.lbfgs(), steps=500)
        sigma, rho, beta = res.params["args"]

    Args:
        f: Vector field ``f(t, y, args)`` with a 1-D array state.
        ts: Observation times, 1-D, strictly increasing, at least two.
        observed: Observations, shape ``(n, d)``.
        segments: Number of segments ``K`` (``1 <= K <= n - 1``).
        solver, dt, rtol, atol, max_steps: As in :func:`simlib.solve`.
        adjoint: The gradient strategy of :func:`simlib.solve` (e.g. ``simlib.Direct()``);
            ``None`` keeps solve's default.
        throw: Passed to :func:`simlib.solve`. The default ``False`` lets a failed solve
            (a trial step of the optimiser into a region where the state blows up) give a
            non-finite loss, which line searches back off from and :func:`fit` stops at,
            instead of raising from inside the compiled loop.
        sigma: Noise standard deviation (scalar, per component or per entry).
        mask: Observed entries (concrete booleans broadcastable to ``observed``).
        continuity_weight: Penalty weight :math:`w > 0` on the squared defects.

    Returns:
        A :class:`MultipleShooting` with ``loss``, ``residuals``, ``init_params``,
        ``transforms``, ``predict`` and ``defects``.

    References:
        H. G. Bock, "Recent advances in parameter identification techniques for ODE", in
        *Numerical Treatment of Inverse Problems in Differential and Integral Equations*,
        Birkhauser, 1983, 95-121. E. Baake et al., *Phys. Rev. A* 45 (1992) 5524-5529.
    """
    ts_np, obs = _check_data(ts, observed)
    n = ts_np.shape[0]
    if isinstance(segments, bool) or not isinstance(segments, int | np.integer) \
            or not 1 <= segments <= n - 1:
        raise ValueError(f"segments must be an integer between 1 and len(ts) - 1 = {n - 1}, "
                         f"got {segments!r}")
    segments = int(segments)
    if not (np.isfinite(continuity_weight) and continuity_weight > 0):
        raise ValueError(f"continuity_weight must be positive, got {continuity_weight!r}")
    if not callable(f):
        raise TypeError(f"f must be callable as f(t, y, args), got {f!r}")
    mask_np = _check_mask(mask, obs.shape)
    starts, uniform, save_ts = _segment_grid(ts_np, segments, obs.dtype)
    return MultipleShooting(
        f=f, ts=ts_np, observed=obs, starts=starts, solver=solver, dt=dt, rtol=rtol, atol=atol,
        max_steps=int(max_steps), throw=bool(throw), sigma=sigma, mask=mask_np,
        continuity_weight=float(continuity_weight), uniform=uniform, save_ts=save_ts,
        adjoint=adjoint,
    )


def _check_data(ts: Any, observed: Any) -> tuple[np.ndarray, jax.Array]:
    """Concrete, strictly increasing ``ts`` (float64 numpy) and ``observed`` of shape
    ``(len(ts), d)`` as an inexact JAX array."""
    if isinstance(ts, jax.core.Tracer) or isinstance(observed, jax.core.Tracer):
        raise TypeError("multiple_shooting: ts and observed must be concrete data, not traced")
    ts_np = np.asarray(ts, dtype=np.float64)
    if ts_np.ndim != 1 or ts_np.shape[0] < 2:
        raise ValueError(f"ts must be a 1-D array of at least two times, got shape {ts_np.shape}")
    if not np.all(np.isfinite(ts_np)) or np.any(np.diff(ts_np) <= 0):
        raise ValueError("ts must be finite and strictly increasing")
    obs = jnp.asarray(observed)
    if obs.ndim != 2 or obs.shape[0] != ts_np.shape[0]:
        raise ValueError(f"observed must have shape (len(ts), d) = ({ts_np.shape[0]}, d), got "
                         f"{obs.shape}")
    if not jnp.issubdtype(obs.dtype, jnp.inexact):
        obs = obs.astype(jnp.result_type(float))
    return ts_np, obs


def _check_mask(mask: Any, shape: tuple[int, ...]) -> np.ndarray | None:
    """``mask`` as a concrete boolean array of the observations' ``shape`` (or None)."""
    if mask is None:
        return None
    if isinstance(mask, jax.core.Tracer):
        raise TypeError("multiple_shooting: mask must be concrete")
    try:
        return np.broadcast_to(np.asarray(mask, bool), shape).copy()
    except ValueError:
        raise ValueError(f"mask (shape {np.shape(mask)}) must broadcast against observed "
                         f"(shape {shape})") from None


def _segment_grid(ts_np: np.ndarray, segments: int, dtype: Any
                  ) -> tuple[tuple[int, ...], bool, tuple[jax.Array, ...]]:
    """``(starts, uniform, save_ts)``: the first observation index of each segment (and
    the last index), whether all segments share one local time grid, and the save times
    (one local grid when uniform, else one absolute grid per segment)."""
    n = ts_np.shape[0]
    # (as nearly as possible) equal numbers of intervals per segment
    starts = tuple(int(round(x)) for x in np.linspace(0, n - 1, segments + 1))
    lengths = np.diff(starts)
    span = ts_np[-1] - ts_np[0]
    uniform = bool(np.all(lengths == lengths[0]))
    if uniform:
        m = int(lengths[0])
        rel = np.stack([ts_np[s: s + m + 1] - ts_np[s] for s in starts[:-1]])
        uniform = bool(np.allclose(rel, rel[0], rtol=0.0, atol=1e-9 * span))
    # Save times as concrete jax arrays in the state's dtype, made here (outside any jit):
    # solve() then sees concrete save times and runs its static-length fixed-step scan.
    if uniform:
        save_ts = (jnp.asarray(ts_np[: starts[1] + 1] - ts_np[0], dtype),)
    else:
        save_ts = tuple(jnp.asarray(ts_np[i0: i1 + 1], dtype)
                        for i0, i1 in zip(starts[:-1], starts[1:], strict=True))
    return starts, uniform, save_ts
