"""``solve()``: one entry point for fixed-step and adaptive integration.

Fixed step is a ``lax.scan`` over a grid ``t0 + k dt`` whose last point is ``t1``
exactly; save times in ``SaveAt(ts=...)`` are inserted into the grid, so fixed-step
runs return exact (not interpolated) values there. Adaptive stepping is a bounded
loop of step attempts under an embedded error estimate and a PI controller; its
forward pass is a ``while_loop`` and its reverse-mode derivative replays the same
attempts in a ``lax.scan`` of ``max_steps`` attempts (skipping finished chunks),
so ``jax.grad`` goes through the whole adaptive integration, including the
controller's dependence on the parameters.
"""

from __future__ import annotations

import difflib
import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._control import initial_step, log_error_ratio, pi_factor
from ._errors import Result, SolverError, first_failure, result_message
from ._solver._base import AbstractSolver, PyTree, VectorField

DEFAULT_MAX_STEPS = 4096
_CHUNK = 16  # attempts per chunk in the differentiable replay of adaptive runs


@dataclass(frozen=True)
class SaveAt:
    """Which times a :func:`solve` returns.

    Exactly one of ``t1``, ``ts`` and ``steps`` selects the output; ``t0=True``
    additionally puts the initial state first.

    Attributes:
        t0: Also save the initial state.
        t1: Save the final state only (the default of ``solve``).
        ts: Save at these times, which must lie in ``[t0, t1]`` and be ordered in the
            direction of integration. Fixed-step runs step exactly onto them;
            adaptive runs use the method's dense output.
        steps: Save after every step. Adaptive runs return ``max_steps`` rows, the
            unused ones filled with ``inf``; ``stats["num_accepted"]`` says how many
            are real.
    """

    t0: bool = False
    t1: bool = False
    ts: Any = None
    steps: bool = False

    def mode(self) -> str:
        chosen = [name for name, on in (("t1", self.t1), ("ts", self.ts is not None),
                                        ("steps", self.steps)) if on]
        if len(chosen) != 1:
            raise ValueError(
                f"saveat: choose exactly one of t1=True, ts=..., steps=True; got {chosen or 'none'}"
            )
        return chosen[0]


class Solution(NamedTuple):
    """The result of :func:`solve`.

    Attributes:
        ts: Saved times, shape ``(n_save,)``.
        ys: Saved states: ``y0``'s pytree with a leading axis over ``ts``.
        stats: ``num_steps`` (attempts), ``num_accepted``, ``num_rejected``,
            ``num_fevals`` (right-hand-side evaluations, dense-output extras excluded)
            and ``t_final`` (where the integration stopped).
        result: A :class:`~simlib.Result` code; 0 means success.
    """

    ts: jax.Array
    ys: PyTree
    stats: dict
    result: jax.Array

    @property
    def message(self) -> str:
        """A readable account of ``result`` (for unbatched solutions)."""
        code = int(np.asarray(self.result).ravel()[0])
        if code == 0:
            return "the integration reached t1"
        return Result(code).name


# --------------------------------------------------------------------------------------
# helpers


def _is_tracer(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def _tree_where(pred, a: PyTree, b: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


def _where_rows(mask: jax.Array, tree: PyTree, other) -> PyTree:
    """Per row ``i`` of every leaf: ``tree[i]`` where ``mask[i]``, else ``other`` (a scalar or a
    pytree like one row of ``tree``)."""
    if not isinstance(other, float):
        return jax.tree_util.tree_map(
            lambda v, o: jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)), v, o[None]),
            tree, other)
    return jax.tree_util.tree_map(
        lambda v: jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)), v, other), tree)


def _all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    out = jnp.array(True)
    for leaf in leaves:
        out = out & jnp.all(jnp.isfinite(leaf))
    return out


def _buffer(y: PyTree, n: int, fill: float) -> PyTree:
    return jax.tree_util.tree_map(lambda x: jnp.full((n,) + x.shape, fill, x.dtype), y)


def _write(buf: PyTree, index, y: PyTree) -> PyTree:
    return jax.tree_util.tree_map(
        lambda b, x: lax.dynamic_update_index_in_dim(b, x.astype(b.dtype), index, 0), buf, y
    )


def _fevals_per_step(solver: AbstractSolver) -> int:
    from ._solver._explicit_rk import ExplicitRungeKutta
    from ._solver._symplectic import SymplecticSplitting

    if isinstance(solver, ExplicitRungeKutta):
        return solver.tableau.stages - (1 if solver.tableau.fsal else 0)
    if isinstance(solver, SymplecticSplitting):
        kicks = sum(1 for b in solver.kicks if b != 0.0) - (1 if solver.carries_force else 0)
        return kicks + len(solver.drifts)
    return 0


def _time_dtype(y0: PyTree):
    dtypes = [leaf.dtype for leaf in jax.tree_util.tree_leaves(y0)]
    return jnp.result_type(*dtypes)


# --------------------------------------------------------------------------------------
# fixed step


def _grid_count(t0: float, t1: float, dt: float) -> int:
    """Number of grid steps of size ``|dt|`` covering ``[t0, t1]`` (the last may be short)."""
    span = abs(t1 - t0)
    if span == 0.0:
        return 0
    ratio = span / abs(dt)
    return max(1, math.ceil(ratio * (1.0 - 1e-12)))


def _snap_tol(g, dt, dtype):
    eps = jnp.finfo(dtype).eps
    return 16 * eps * (jnp.abs(g) + jnp.abs(dt))


def _fixed_iterations(t0: float, t1: float, dt: float, ts: np.ndarray | None) -> int:
    """Exact number of scan iterations the fixed-step walk needs (host side)."""
    n_grid = _grid_count(t0, t1, dt)
    if ts is None or ts.size == 0:
        return n_grid
    direction = 1.0 if t1 >= t0 else -1.0
    step = direction * abs(dt)
    k = np.rint((ts - t0) / step).astype(np.int64)
    g = np.where(k >= n_grid, t1, t0 + k * step)
    tol = 16 * np.finfo(np.float64).eps * (np.abs(g) + abs(dt))
    on_grid = (k >= 1) & (k <= n_grid) & (np.abs(g - ts) <= tol)
    on = ts[on_grid]
    return n_grid + int(np.sum(~on_grid)) + (on.size - np.unique(on).size) + 1


def _fixed_core(f, solver, mode, save_t0, n_iter, n_save, in_graph_check, max_steps,
                y0, t0, t1, dt, n_grid, ts, args):
    tdtype = _time_dtype(y0)
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    step = direction * jnp.abs(jnp.asarray(dt, tdtype))
    if n_grid is None:
        span = jnp.abs(t1 - t0)
        n_grid = jnp.where(
            span == 0, 0, jnp.maximum(1, jnp.ceil(span / jnp.abs(step) * (1 - 1e-12)))
        ).astype(jnp.int32)

    def grid(k):
        return jnp.where(k >= n_grid, t1, t0 + k.astype(tdtype) * step)

    per_step = _fevals_per_step(solver)
    state0 = solver.init(f, t0, y0, args)
    init_fevals = 1 if state0 is not None else 0
    ts_arr = None if ts is None else jnp.asarray(ts, tdtype)

    # The time, the grid index, the save index and the step count never depend on the
    # state, so under vmap they stay unbatched scalars (one time per ensemble, and
    # dynamic_update_slice rather than scatter for saves). Only the state and the
    # failure record are per member.
    def body(carry, _):
        t, y, state, k, i, buf, result, fail_t, fail_step, count = carry
        g = grid(k + 1)
        if mode == "ts":
            s = jnp.where(i < n_save, ts_arr[jnp.minimum(i, n_save - 1)], t1)
            snap = jnp.abs(s - g) <= _snap_tol(g, step, tdtype)
            s_first = direction * (s - g) < 0
            target = jnp.where(snap | s_first, s, g)
            advance_grid = ~s_first | snap
            save = (i < n_save) & (snap | s_first)
        else:
            target = g
            advance_grid = jnp.array(True)
        target = jnp.where(direction * (target - t1) > 0, t1, target)
        h = target - t
        count = count + (h != 0).astype(count.dtype)
        y1, _, _, state1 = solver.step(f, t, y, h, args, state)
        newly_bad = (result == 0) & ~_all_finite(y1)
        result = jnp.where(newly_bad, Result.NONFINITE_STATE.value, result)
        fail_t = jnp.where(newly_bad, t, fail_t)
        fail_step = jnp.where(newly_bad, count, fail_step)
        # No select of the state on failure: it would cost 40% of a Lorenz ensemble step.
        # The failure's time and step are recorded, values saved before it are kept, and
        # the non-finite state propagates to the later outputs.
        k = k + advance_grid.astype(k.dtype)
        if mode == "ts":
            buf = _write(buf, jnp.where(save, i, n_save), y1)
            i = i + save.astype(i.dtype)
        out = (target, y1) if mode == "steps" else None
        return (target, y1, state1, k, i, buf, result, fail_t, fail_step, count), out

    buf0 = _buffer(y0, n_save + 1, jnp.nan) if mode == "ts" else None
    zero = jnp.array(0, jnp.int32)
    carry0 = (t0, y0, state0, zero, zero, buf0, zero, t0, zero, zero)
    carry, outs = lax.scan(body, carry0, None, length=n_iter)
    t, y, _, k, i, buf, result, fail_t, fail_step, count = carry
    unfinished = (result == 0) & ((t != t1) | (i < n_save if mode == "ts" else False))
    result = jnp.where(unfinished, Result.MAX_STEPS_REACHED.value, result)
    failed = result == Result.NONFINITE_STATE.value
    t_final = jnp.where(failed, fail_t, t)
    step_final = jnp.where(failed, fail_step, count)

    if mode == "t1":
        ts_out = t[None]
        ys_out = jax.tree_util.tree_map(lambda x: x[None], y)
    elif mode == "ts":
        ts_out = ts_arr
        ys_out = jax.tree_util.tree_map(lambda b: b[:n_save], buf)
    else:
        ts_out, ys_out = outs
    if save_t0:
        ts_out = jnp.concatenate([t0[None], ts_out])
        ys_out = jax.tree_util.tree_map(
            lambda a, b: jnp.concatenate([a[None], b]), y0, ys_out
        )
    stats = dict(
        num_steps=step_final,
        num_accepted=step_final,
        num_rejected=jnp.zeros_like(step_final),
        num_fevals=step_final * per_step + init_fevals,
        t_final=t_final,
    )
    if in_graph_check:
        ts_out, ys_out, stats, result = _check_in_graph(
            (ts_out, ys_out, stats, result), result, t_final, step_final, t1, max_steps)
    return Solution(ts_out, ys_out, stats, result)


# --------------------------------------------------------------------------------------
# adaptive


_LOG_RATIO_FLOOR = math.log(1e-4)  # r_prev is floored at 1e-4 (Hairer's DOPRI5 does too)


class _Attempt(NamedTuple):
    t: jax.Array
    y: PyTree
    h: jax.Array
    log_ratio_prev: jax.Array
    fsal: PyTree
    n_steps: jax.Array
    n_accepted: jax.Array
    result: jax.Array


def _attempt(f, solver, k_exp, carry: _Attempt, t1, direction, rtol, atol, args):
    """One step attempt: take a step, accept or reject it, propose the next step size.

    Returns the new carry and the data of the attempt: ``(t, y, h, accepted, y1, ks)``.
    """
    t, y, h = carry.t, carry.y, carry.h
    last = direction * (t + h - t1) >= 0
    h = jnp.where(last, t1 - t, h)
    y1, err, ks, fsal1 = solver.step(f, t, y, h, args, carry.fsal)
    ratio = solver.error_ratio(y, y1, err, h, rtol, atol)
    finite = jnp.isfinite(ratio) & _all_finite(y1)
    ratio = jnp.where(finite, ratio, jnp.inf)
    accept = ratio <= 1.0
    log_ratio = log_error_ratio(ratio)
    factor = pi_factor(log_ratio, carry.log_ratio_prev, k_exp)
    h_next = h * factor
    t_new = jnp.where(accept, jnp.where(last, t1, t + h), t)
    tiny = 10 * jnp.finfo(jnp.result_type(t)).eps * jnp.maximum(jnp.abs(t), 1.0)
    reached = direction * (t1 - t_new) <= 0
    underflow = ~reached & (jnp.abs(h_next) < tiny)
    result = jnp.where(
        (carry.result == 0) & underflow,
        jnp.where(finite, Result.STEP_SIZE_TOO_SMALL.value, Result.NONFINITE_STATE.value),
        carry.result,
    )
    new = _Attempt(
        t=t_new,
        y=_tree_where(accept, y1, y),
        h=h_next,
        log_ratio_prev=jnp.where(accept, jnp.maximum(log_ratio, _LOG_RATIO_FLOOR),
                                 carry.log_ratio_prev),
        fsal=None if carry.fsal is None else _tree_where(accept, fsal1, carry.fsal),
        n_steps=carry.n_steps + 1,
        n_accepted=carry.n_accepted + accept.astype(jnp.int32),
        result=result,
    )
    return new, (t, y, h, accept, y1, ks)


def _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args):
    tdtype = _time_dtype(y0)
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    f0 = f(t0, y0, args)
    if dt0 is None:
        h0 = initial_step(f, t0, y0, f0, args, direction, solver.order, rtol, atol)
        init_fevals = 2
    else:
        h0 = direction * jnp.abs(jnp.asarray(dt0, tdtype))
        init_fevals = 1
    fsal = f0 if getattr(solver, "tableau", None) is not None and solver.tableau.fsal else None
    zero = jnp.array(0, jnp.int32)
    carry = _Attempt(t0, y0, h0.astype(tdtype), jnp.asarray(0.0, tdtype), fsal, zero, zero, zero)
    return carry, t0, t1, direction, init_fevals


def _k_exponent(solver) -> int:
    return (solver.error_order or solver.order - 1) + 1


def _not_done(c: _Attempt, t1, direction, max_steps):
    return (c.result == 0) & (direction * (t1 - c.t) > 0) & (c.n_steps < max_steps)


def _adaptive_forward(f, solver, mode, n_save, max_steps, y0, t0, t1, dt0, rtol, atol, ts,
                      args):
    """The while-loop forward pass. Returns ``(final carry, saved, steps_out)``."""
    carry, t0, t1, direction, _ = _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args)
    k_exp = _k_exponent(solver)
    tdtype = t0.dtype
    ts_arr = None if ts is None else jnp.asarray(ts, tdtype)

    def attempt(c):
        return _attempt(f, solver, k_exp, c, t1, direction, rtol, atol, args)

    def until(stop):
        return lambda s: _not_done(s[0], t1, direction, max_steps) & stop(s)

    if mode == "ts":
        # A scan over save times, each running the while loop until a step covers it, then
        # evaluating the dense output of the last accepted step. Nothing large is carried
        # through the while loop: under vmap a batched while loop selects its whole carry
        # at every iteration.
        def follow(s):
            c, last = s
            new, (t, y, h, accept, y1, ks) = attempt(c)
            return new, _tree_where(accept, (t, y, h, y1, ks), last)

        def save(s, t_save):
            s = lax.while_loop(until(lambda s: direction * (t_save - s[0].t) > 0), follow, s)
            c, (t, y, h, y1, ks) = s
            theta = (t_save - t) / jnp.where(h == 0, 1.0, h)
            value = solver.interpolate(f, args, t, y, h, y1, ks, theta)
            reached = direction * (t_save - c.t) <= 0
            return s, _tree_where(reached, value, jax.tree_util.tree_map(
                lambda v: jnp.full_like(v, jnp.nan), value))

        f0 = f(t0, y0, args)
        stages = solver.tableau.stages
        last = (t0, y0, jnp.zeros_like(t0), y0, [f0] * stages)
        (carry, _), saved = lax.scan(save, (carry, last), ts_arr)
        c = lax.while_loop(until(lambda s: True), lambda s: (attempt(s[0])[0],), (carry,))[0]
        return c, saved, (None, None)

    def body(state):
        c, sts, sys_ = state
        new, (_, _, _, accept, _, _) = attempt(c)
        if mode == "steps":
            idx = jnp.where(accept, c.n_accepted, max_steps)
            sts = lax.dynamic_update_index_in_dim(sts, new.t, idx, 0)
            sys_ = _write(sys_, idx, new.y)
        return new, sts, sys_

    sts = jnp.full((max_steps + 1,), jnp.inf, tdtype) if mode == "steps" else None
    sys_ = _buffer(y0, max_steps + 1, jnp.inf) if mode == "steps" else None
    c, sts, sys_ = lax.while_loop(until(lambda s: True), body, (carry, sts, sys_))
    if mode == "steps":  # drop the row that rejected attempts wrote to
        sts, sys_ = sts[:max_steps], jax.tree_util.tree_map(lambda b: b[:max_steps], sys_)
    return c, None, (sts, sys_)


def _adaptive_replay(f, solver, mode, n_save, max_steps, y0, t0, t1, dt0, rtol, atol, ts,
                     args):
    """The same computation as ``_adaptive_forward``, as a differentiable bounded scan.

    Every attempt is recorded; saved values are then rebuilt from the recorded
    accepted steps with the method's dense output.
    """
    carry, t0, t1, direction, _ = _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args)
    k_exp = _k_exponent(solver)
    tdtype = t0.dtype
    n_chunks = -(-max_steps // _CHUNK)

    def one(c, _):
        active = _not_done(c, t1, direction, max_steps)
        new, (t, y, h, accept, _, _) = _attempt(f, solver, k_exp, c, t1, direction,
                                                rtol, atol, args)
        new = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b), new, c)
        return new, (t, y, h, accept & active, new.t, new.y)

    def skip(c):
        rec = (jnp.zeros((_CHUNK,), tdtype), _buffer(c.y, _CHUNK, 0.0),
               jnp.zeros((_CHUNK,), tdtype), jnp.zeros((_CHUNK,), bool),
               jnp.zeros((_CHUNK,), tdtype), _buffer(c.y, _CHUNK, 0.0))
        return c, rec

    def chunk(c, _):
        return lax.cond(
            _not_done(c, t1, direction, max_steps),
            lambda c: lax.scan(one, c, None, length=_CHUNK),
            skip,
            c,
        )

    c, recs = lax.scan(chunk, carry, None, length=n_chunks)
    recs = jax.tree_util.tree_map(lambda r: r.reshape((-1,) + r.shape[2:]), recs)
    t_rec, y_rec, h_rec, acc_rec, tnew_rec, ynew_rec = recs
    order = jnp.argsort(~acc_rec, stable=True)  # accepted attempts first, in time order
    saved = None
    steps_out = (None, None)
    if mode == "ts":
        ts_arr = jnp.asarray(ts, tdtype)
        starts = jnp.where(acc_rec, direction * t_rec, jnp.inf)[order]
        idx = jnp.searchsorted(starts, direction * ts_arr, side="left") - 1
        idx = jnp.clip(idx, 0, max_steps - 1)
        src = order[idx]

        def interp(s, m):
            t, h = t_rec[m], h_rec[m]
            y = jax.tree_util.tree_map(lambda r: r[m], y_rec)
            fsal = solver.init(f, t, y, args)
            y1, _, ks, _ = solver.step(f, t, y, h, args, fsal)
            theta = (s - t) / jnp.where(h == 0, 1.0, h)
            return solver.interpolate(f, args, t, y, h, y1, ks, theta)

        saved = jax.vmap(interp)(ts_arr, src)
        # Save times at t0 take y0 (there may be no accepted step, if t0 == t1).
        saved = _where_rows(ts_arr != t0, saved, jax.tree_util.tree_map(
            lambda v, y: jnp.broadcast_to(y, v.shape[1:]), saved, y0))
        saved = _where_rows(direction * (ts_arr - c.t) <= 0, saved, jnp.nan)
    elif mode == "steps":
        valid = jnp.arange(max_steps) < c.n_accepted
        steps_out = (jnp.where(valid, tnew_rec[order], jnp.inf),
                     _where_rows(valid, jax.tree_util.tree_map(lambda r: r[order], ynew_rec),
                                 jnp.inf))
    return c, saved, steps_out


def _adaptive_diff_outputs(c, saved, steps_out):
    return (c.t, c.y, saved, steps_out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4))
def _adaptive_solve(f, solver, mode, n_save, max_steps, inputs):
    c, saved, steps_out = _adaptive_forward(f, solver, mode, n_save, max_steps, **inputs)
    return _adaptive_diff_outputs(c, saved, steps_out), _stats_of(c)


def _stats_of(c: _Attempt):
    return (c.n_steps, c.n_accepted, c.result)


def _adaptive_fwd(f, solver, mode, n_save, max_steps, inputs):
    out = _adaptive_solve(f, solver, mode, n_save, max_steps, inputs)
    return out, inputs


def _adaptive_bwd(f, solver, mode, n_save, max_steps, inputs, cotangent):
    d_out, _ = cotangent

    def replay(inputs):
        c, saved, steps_out = _adaptive_replay(f, solver, mode, n_save, max_steps, **inputs)
        return _adaptive_diff_outputs(c, saved, steps_out)

    _, vjp = jax.vjp(replay, inputs)
    (d_inputs,) = vjp(d_out)
    return (d_inputs,)


_adaptive_solve.defvjp(_adaptive_fwd, _adaptive_bwd)


def _adaptive_core(f, solver, mode, save_t0, n_save, in_graph_check, max_steps,
                   y0, t0, t1, dt0, rtol, atol, ts, args):
    tdtype = _time_dtype(y0)
    f_conv, consts = jax.closure_convert(lambda t, y, a: f(t, y, a), t0, y0, args)
    f_args = (args, tuple(consts))

    def f_plain(t, y, fa):
        return f_conv(t, y, fa[0], *fa[1])

    inputs = dict(
        y0=y0, t0=jnp.asarray(t0, tdtype), t1=jnp.asarray(t1, tdtype),
        dt0=None if dt0 is None else jnp.asarray(dt0, tdtype),
        rtol=jnp.asarray(rtol, tdtype), atol=jnp.asarray(atol, tdtype),
        ts=None if ts is None else jnp.asarray(ts, tdtype), args=f_args,
    )
    (t_end, y_end, saved, (sts, sys_)), (n_steps, n_acc, result) = _adaptive_solve(
        f_plain, solver, mode, n_save, max_steps, inputs
    )
    t0a, t1a = inputs["t0"], inputs["t1"]
    direction = jnp.where(t1a >= t0a, 1.0, -1.0)
    unfinished = (result == 0) & (direction * (t1a - t_end) > 0)
    result = jnp.where(unfinished, Result.MAX_STEPS_REACHED.value, result)
    if mode == "t1":
        ts_out, ys_out = t_end[None], jax.tree_util.tree_map(lambda x: x[None], y_end)
    elif mode == "ts":
        ts_out, ys_out = inputs["ts"], saved
    else:
        ts_out, ys_out = sts, sys_
    if save_t0:
        ts_out = jnp.concatenate([t0a[None], ts_out])
        ys_out = jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a[None], b]), y0, ys_out)
    init_fevals = 1 if dt0 is not None else 2  # f(t0, y0), and one Euler probe for h0
    stats = dict(
        num_steps=n_steps,
        num_accepted=n_acc,
        num_rejected=n_steps - n_acc,
        num_fevals=n_steps * _fevals_per_step(solver) + init_fevals,
        t_final=t_end,
    )
    if in_graph_check:
        ts_out, ys_out, stats, result = _check_in_graph(
            (ts_out, ys_out, stats, result), result, t_end, n_steps, t1a, max_steps)
    return Solution(ts_out, ys_out, stats, result)


# --------------------------------------------------------------------------------------
# errors under jit


def _raise_on_failure(result, t, step, t1, max_steps):
    failure = first_failure(result, t, step, t1)
    if failure is not None:
        code, t, step, t1 = failure
        raise SolverError(
            "solve: " + result_message(code, t=t, step=step, t1=t1, max_steps=max_steps),
            Result(code),
        )


def _check_in_graph(outputs, result, t, step, t1, max_steps):  # noqa: D417
    """Raise from inside a traced computation when ``result`` reports a failure.

    A ``pure_callback`` that sees the whole (possibly batched) result at once — under
    ``vmap`` it is called once, not once per member — and whose (zero) output is added
    to every output array, so that it runs whenever any output is used.
    """

    def callback(result, t, step, t1):
        _raise_on_failure(result, t, step, t1, max_steps)
        return np.zeros(np.shape(result), np.int32)

    args = [lax.stop_gradient(x) for x in (result, t, step, t1)]
    zero = jax.pure_callback(callback, jax.ShapeDtypeStruct(jnp.shape(result), jnp.int32),
                             *args, vmap_method="broadcast_all")
    return jax.tree_util.tree_map(lambda x: x + zero.astype(x.dtype), outputs)


_fixed_jit = jax.jit(_fixed_core, static_argnums=(0, 1, 2, 3, 4, 5, 6, 7))
_adaptive_jit = jax.jit(_adaptive_core, static_argnums=(0, 1, 2, 3, 4, 5, 6))


# --------------------------------------------------------------------------------------
# the entry point

_KEYWORDS = ("solver", "dt", "rtol", "atol", "args", "saveat", "max_steps", "throw")


def _as_array_tree(y0, name: str) -> PyTree:
    leaves, treedef = jax.tree_util.tree_flatten(y0)
    if not leaves:
        raise ValueError(f"{name} has no array leaves: {y0!r}")
    out = []
    for leaf in leaves:
        arr = leaf if isinstance(leaf, jax.Array | jax.core.Tracer) else jnp.asarray(leaf)
        if not jnp.issubdtype(arr.dtype, jnp.inexact):
            arr = arr.astype(jnp.result_type(float))
        out.append(arr)
    return jax.tree_util.tree_unflatten(treedef, out)


def _check_finite_scalar(x, name: str):
    if x is None or _is_tracer(x):
        return
    arr = np.asarray(x)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
    if not np.isfinite(arr):
        raise ValueError(f"{name} must be finite, got {float(arr)!r}")


class _CastToState:
    """``f`` with its output cast to the state's dtypes (a float32 state stays float32 when
    float64 parameters promote ``f``'s result). Hashes like ``f``, so jit caches still hit."""

    def __init__(self, f: VectorField):
        self.f = f

    def __call__(self, t, y, args):
        return jax.tree_util.tree_map(lambda o, x: o.astype(x.dtype), self.f(t, y, args), y)

    def __hash__(self) -> int:
        return hash((_CastToState, self.f))

    def __eq__(self, other) -> bool:
        return isinstance(other, _CastToState) and other.f == self.f


def _describe(tree) -> str:
    return str(jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape)}", tree))


def solve(
    f: VectorField,
    y0: PyTree,
    t0: float,
    t1: float,
    *,
    solver: AbstractSolver,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    args: Any = None,
    saveat: SaveAt = SaveAt(t1=True),
    max_steps: int = DEFAULT_MAX_STEPS,
    throw: bool = True,
    **unknown: Any,
) -> Solution:
    """Integrate ``dy/dt = f(t, y, args)`` from ``t0`` to ``t1``.

    Fixed step when ``dt`` is given without tolerances: a ``lax.scan`` of steps of
    size ``dt`` whose last step lands exactly on ``t1``. Adaptive when ``rtol`` or
    ``atol`` is given: each step's embedded error estimate, scaled by
    ``atol + rtol * |y|`` componentwise, must have RMS norm at most one (Hairer,
    Norsett and Wanner 1993, II.4); a PI controller picks the next step; ``dt``, if
    given, is the first step, else Hairer's algorithm chooses it. Integration
    backwards (``t1 < t0``) works as well.

    Args:
        f: Vector field ``f(t, y, args)`` returning a pytree like ``y``.
        y0: Initial state, any pytree of arrays. For symplectic solvers a tuple ``(q, p)``.
        t0, t1: Start and end times.
        solver: A solver instance, e.g. ``simlib.Tsit5()``.
        dt: Fixed step size, or the first step of an adaptive run. Its sign may be
            omitted; a negative ``dt`` is only valid for a backward span.
        rtol, atol: Relative and absolute tolerances (adaptive runs). If only one is
            given, the other takes the same value.
        args: Parameters passed to ``f``; any pytree. Gradients flow to it.
        saveat: Which times to return, see :class:`SaveAt`.
        max_steps: Bound on the number of step attempts (adaptive runs, and fixed-step
            runs whose span or ``dt`` are traced under an outer ``jit``).
        throw: Raise :class:`SolverError` on failure (default). With ``False`` the
            failure is reported in ``Solution.result``, so one bad member of a
            ``vmap``-ped ensemble does not stop the others.

    Returns:
        A :class:`Solution`.

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> sol = sl.solve(lambda t, y, a: -a * y, jnp.array([1.0]), 0.0, 1.0,
        ...                solver=sl.Tsit5(), rtol=1e-8, atol=1e-10, args=2.0)
        >>> float(sol.ys[-1, 0])  # exp(-2)  # doctest: +ELLIPSIS
        0.1353...
    """
    if unknown:
        bad = next(iter(unknown))
        close = difflib.get_close_matches(bad, _KEYWORDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"solve() got an unknown keyword argument {bad!r}{hint} "
            f"(valid keywords: {', '.join(_KEYWORDS)})"
        )
    if isinstance(solver, type):
        raise TypeError(f"solver must be an instance, e.g. {solver.__name__}(), not the class")
    if not isinstance(solver, AbstractSolver):
        raise TypeError(
            f"solver must be a simlib solver instance such as simlib.Tsit5(), got {solver!r}"
        )
    if not callable(f):
        raise TypeError(f"f must be callable as f(t, y, args), got {f!r}")
    if not isinstance(saveat, SaveAt):
        raise TypeError(f"saveat must be a simlib.SaveAt, got {saveat!r}")
    mode = saveat.mode()
    if not isinstance(max_steps, int | np.integer) or max_steps <= 0:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    max_steps = int(max_steps)

    if solver.symplectic and not (isinstance(y0, tuple) and len(y0) == 2):
        raise TypeError(
            f"{type(solver).__name__} is a symplectic solver for separable systems: y0 must "
            f"be a tuple (q, p), got {type(y0).__name__}"
        )
    y0 = _as_array_tree(y0, "y0")
    for leaf in jax.tree_util.tree_leaves(y0):
        if not _is_tracer(leaf) and not np.all(np.isfinite(np.asarray(leaf))):
            raise ValueError(f"y0 must be finite, but it contains nan or inf: {y0!r}")
    _check_finite_scalar(t0, "t0")
    _check_finite_scalar(t1, "t1")

    # The vector field must map y0's structure, shapes and dtypes onto themselves.
    tdtype = _time_dtype(y0)
    try:
        out = jax.eval_shape(f, jax.ShapeDtypeStruct((), tdtype), y0, args)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling f(t0, y0, args) failed: {err}") from err
    in_struct = jax.tree_util.tree_structure(y0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(
            f"f must return the same pytree structure as y0: y0 is {in_struct}, "
            f"f returned {out_struct}"
        )
    for a, b in zip(jax.tree_util.tree_leaves(y0), jax.tree_util.tree_leaves(out), strict=True):
        if a.shape != b.shape:
            raise ValueError(
                f"f must return arrays shaped like y0: y0 is {_describe(y0)}, "
                f"f returned {_describe(out)}"
            )
    if any(a.dtype != b.dtype for a, b in zip(jax.tree_util.tree_leaves(y0),
                                               jax.tree_util.tree_leaves(out), strict=True)):
        f = _CastToState(f)

    adaptive = rtol is not None or atol is not None
    concrete_span = not _is_tracer((t0, t1))
    if concrete_span:
        direction = 1.0 if float(t1) >= float(t0) else -1.0
    if dt is not None:
        _check_finite_scalar(dt, "dt")
        if not _is_tracer(dt):
            if float(dt) == 0.0:
                raise ValueError("dt must be nonzero, got 0.0")
            if concrete_span and float(dt) < 0 and direction > 0:
                raise ValueError(
                    f"dt={float(dt)!r} is negative but the span t0={float(t0)!r} -> "
                    f"t1={float(t1)!r} runs forward; give a positive dt"
                )

    if mode == "ts":
        ts = jnp.asarray(saveat.ts, tdtype)
        if ts.ndim != 1 or ts.shape[0] == 0:
            raise ValueError(f"saveat.ts must be a non-empty 1-D array, got shape {ts.shape}")
        if concrete_span and not _is_tracer(saveat.ts):
            ts_np = np.asarray(saveat.ts, np.float64)
            lo, hi = sorted((float(t0), float(t1)))
            if np.any(ts_np < lo) or np.any(ts_np > hi):
                raise ValueError(
                    f"saveat.ts must lie within [t0, t1] = [{float(t0)}, {float(t1)}]; got "
                    f"values from {ts_np.min()} to {ts_np.max()}"
                )
            if np.any(direction * np.diff(ts_np) < 0):
                raise ValueError(
                    "saveat.ts must be ordered in the direction of integration "
                    f"({'increasing' if direction > 0 else 'decreasing'})"
                )
        n_save = int(ts.shape[0])
    else:
        ts, n_save = None, 0

    traced = _is_tracer((y0, t0, t1, dt, rtol, atol, args, ts))
    in_graph_check = bool(throw) and traced

    if adaptive:
        if not solver.adaptive:
            raise ValueError(
                f"rtol/atol were given, but {type(solver).__name__} has no embedded error "
                "estimate; use an adaptive solver (Bosh3, Tsit5, Dopri5, Dopri8, Heun) or "
                "give dt without tolerances for a fixed-step run"
            )
        rtol = atol if rtol is None else rtol
        atol = rtol if atol is None else atol
        for name, tol in (("rtol", rtol), ("atol", atol)):
            if not _is_tracer(tol) and not (np.isfinite(float(tol)) and float(tol) > 0):
                raise ValueError(f"{name} must be positive and finite, got {tol!r}")
        sol = _adaptive_jit(f, solver, mode, saveat.t0, n_save, in_graph_check, max_steps,
                            y0, t0, t1, dt, rtol, atol, ts, args)
    else:
        if dt is None:
            raise ValueError(
                f"{type(solver).__name__} needs a step size: give dt for a fixed-step run"
                + (", or rtol/atol for an adaptive one" if solver.adaptive else "")
            )
        if not traced or not _is_tracer((t0, t1, dt, ts)):
            ts_np = None if ts is None else np.asarray(ts, np.float64)
            n_grid_host = _grid_count(float(t0), float(t1), float(dt))
            n_iter = _fixed_iterations(float(t0), float(t1), float(dt), ts_np)
            n_grid = jnp.asarray(n_grid_host, jnp.int32)
        else:
            n_iter = max_steps + n_save
            n_grid = None
        sol = _fixed_jit(f, solver, mode, saveat.t0, n_iter, n_save, in_graph_check, max_steps,
                         y0, t0, t1, dt, n_grid, ts, args)

    if throw and not traced:
        code = int(sol.result)
        if code != 0:
            t_fail = float(sol.stats["t_final"])
            step = int(sol.stats["num_steps"])
            message = result_message(code, t=t_fail, step=step, t1=float(t1),
                                     max_steps=max_steps)
            raise SolverError("solve: " + message, Result(code), sol)
    return sol
