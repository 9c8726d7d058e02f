"""Fixed-step integration: a ``lax.scan`` over a grid ``t0 + k dt`` ending exactly on ``t1``.

Save times in ``SaveAt(ts=...)`` are inserted into the grid, so the values saved there are
the method's own, not interpolants. See docs/design.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._adjoint import Checkpointed, Direct, SaveWrites, reversible_scan
from ._errors import Result, check_solution
from ._events import (
    EventSet,
    after_step,
    init_state,
    pack_events,
    unpack_events,
)
from ._solver._explicit_rk import hermite
from ._stepping import run_solution
from ._util import (
    buffer,
    checked_step,
    convert_closure,
    record_step_failure,
    time_dtype,
    tree_where,
    write,
)
from .progress import tick

CHECKPOINT_ABOVE = 1024
"""Reverse mode is ``Checkpointed()`` for fixed-step runs of more than this many steps,
``Direct()`` below (when the default strategy chooses reverse mode)."""


def grid_count(t0: float, t1: float, dt: float) -> int:
    """Number of grid steps of size ``|dt|`` covering ``[t0, t1]`` (the last may be short)."""
    span = abs(t1 - t0)
    if span == 0.0:
        return 0
    ratio = span / abs(dt)
    return max(1, math.ceil(ratio * (1.0 - 1e-12)))


def snap_tol(g, dt, dtype):
    eps = jnp.finfo(dtype).eps
    return 16 * eps * (jnp.abs(g) + jnp.abs(dt))


def fixed_iterations(t0: float, t1: float, dt: float, ts: np.ndarray | None) -> int:
    """Exact number of scan iterations the fixed-step walk needs (host side)."""
    n_grid = grid_count(t0, t1, dt)
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


def _walker(mode, n_save, t0, t1, direction, step, n_grid, ts_arr, tdtype):
    """The time grid as a function ``advance(t, k, i) -> (target, h, k', save)``.

    ``k`` indexes the grid ``t0 + k dt`` (whose point ``n_grid`` is ``t1``), ``i`` the next
    save time; a step goes to the nearer of the next grid point and the next save time
    (snapping them together when they are a few ulps apart). It depends on times only.
    """

    def grid(k):
        return jnp.where(k >= n_grid, t1, t0 + k.astype(tdtype) * step)

    def advance(t, k, i):
        g = grid(k + 1)
        if mode == "ts":
            s = jnp.where(i < n_save, ts_arr[jnp.minimum(i, n_save - 1)], t1)
            snap = jnp.abs(s - g) <= snap_tol(g, step, tdtype)
            s_first = direction * (s - g) < 0
            target = jnp.where(snap | s_first, s, g)
            advance_grid = ~s_first | snap
            save = (i < n_save) & (snap | s_first)
        else:
            target = g
            advance_grid = jnp.array(True)
            save = jnp.array(False)
        target = jnp.where(direction * (target - t1) > 0, t1, target)
        return target, target - t, k + advance_grid.astype(k.dtype), save

    return advance


# ---- events (simlib/_events.py) in fixed-step runs; ``events=None`` adds nothing
def _step_events(f, solver, t, y, h, target, args, state, count, failure, ev, events):
    """One fixed step with event handling: ``checked_step``, then crossings located on the
    step's interpolant (the solver's own, or the cubic Hermite polynomial through
    ``y, f(t, y)`` and ``y1, f(t + h, y1)``). Returns ``(t_out, y1, state1, failure, ev,
    truncated)``; ``truncated``: the step was cut at an acting event."""
    y1, err, dense, state1 = solver.step(f, t, y, h, args, state)
    failure = record_step_failure(solver, t, y1, err, count, failure)
    if solver.has_interpolant:  # its own dense output, else a cubic Hermite
        def interp(theta, d):
            t_, y_, h_, y1_, dense_, args_ = d
            return solver.interpolate(f, args_, t_, y_, h_, y1_, dense_, theta)
        data, prepare = (t, y, h, y1, dense, args), None
    else:
        def prepare(d):
            t_, y_, h_, y1_, args_ = d
            return (y_, y1_, f(t_, y_, args_), f(t_ + h_, y1_, args_), h_)

        def interp(theta, d):
            return hermite(*d[:4], d[4], theta)
        data = (t, y, h, y1, args)
    stopped_before = ev.stopped
    t_out, y_out, restart, ev = after_step(events, ev, jnp.asarray(True), t, h, target, y1,
                                           interp, data, prepare=prepare)
    if events.has_apply:
        state1 = lax.cond(restart, lambda: solver.init(f, t_out, y_out, args), lambda: state1)
    truncated = restart | (ev.stopped & ~stopped_before)
    return t_out, y_out, state1, failure, ev, truncated
# ---- end events


def fixed_core(f, solver, mode, save_t0, n_iter, n_save, in_graph_check, max_steps, adjoint,
               y0, t0, t1, dt, n_grid, ts, args, events=None, progress=0):
    """The fixed-step solve, differentiated as ``adjoint`` builds it
    (:meth:`~simlib.AbstractAdjoint.wrap`, then :meth:`~simlib.AbstractAdjoint.scan`)."""
    tdtype = time_dtype(y0)
    if events is not None and not isinstance(events, EventSet):
        events = EventSet.convert(events, jnp.asarray(t0, tdtype), y0, args)
    f_plain, fargs = convert_closure(f, jnp.asarray(t0, tdtype), y0, args)

    def core(tree, strategy):
        y0, fargs, (t0, t1, dt, n_grid, ts, events) = tree
        return pack_events(_fixed_run(f_plain, solver, mode, save_t0, n_iter, n_save,
                                      max_steps, strategy, y0, t0, t1, dt, n_grid, ts, fargs,
                                      events, progress))

    reverse = Checkpointed() if n_iter > CHECKPOINT_ABOVE else Direct()
    sol = adjoint.wrap(core, (y0, fargs, (t0, t1, dt, n_grid, ts, events)), jvp_able=True,
                       reverse=reverse, where="solve")
    return check_solution(unpack_events(sol), in_graph_check, jnp.asarray(t1, tdtype), max_steps)


def _fixed_run(f, solver, mode, save_t0, n_iter, n_save, max_steps, adjoint, y0, t0, t1, dt,
               n_grid, ts, args, events, progress=0):
    tdtype = time_dtype(y0)
    t0, t1, dt, ts = adjoint.times((t0, t1, dt, ts))
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    step = direction * jnp.abs(jnp.asarray(dt, tdtype))
    if n_grid is None:
        span = jnp.abs(t1 - t0)
        n_grid = jnp.where(
            span == 0, 0, jnp.maximum(1, jnp.ceil(span / jnp.abs(step) * (1 - 1e-12)))
        ).astype(jnp.int32)

    advance = _walker(mode, n_save, t0, t1, direction, step, n_grid,
                      None if ts is None else jnp.asarray(ts, tdtype), tdtype)
    state0 = solver.init(f, t0, y0, args)
    ts_arr = None if ts is None else jnp.asarray(ts, tdtype)

    # The time, the grid index, the save index and the step count never depend on the
    # state, so under vmap they stay unbatched scalars (one time per ensemble, and
    # dynamic_update_slice rather than scatter for saves). Only the state and the
    # failure record are per member.
    def body(carry, _):
        t, y, state, k, i, buf, result, fail_t, fail_step, count, *ev = carry
        k_prev = k
        target, h, k, save = advance(t, k, i)
        if ev:  # a stopped run takes steps of length zero
            ev = ev[0]
            stopped = ev.stopped
            target, h, save = (jnp.where(stopped, t, target), jnp.where(stopped, 0.0, h),
                               save & ~stopped)
        count = count + (h != 0).astype(count.dtype)
        if not ev:
            y1, state1, (result, fail_t, fail_step) = checked_step(
                f, solver, t, y, h, args, state, count, (result, fail_t, fail_step))
        else:  # an acting event cuts the step; the next one restarts from it
            target, y1, state1, (result, fail_t, fail_step), ev, cut = _step_events(
                f, solver, t, y, h, target, args, state, count, (result, fail_t, fail_step),
                ev, events)
            k, save = jnp.where(cut, k_prev, k), save & ~cut
        out = (target, y1) if mode == "steps" else None
        if mode == "ts":
            if saves_out:  # the loop fills the buffer (checkpointed_scan)
                out = SaveWrites(jnp.where(save, i, n_save), y1, n_save + 1, jnp.nan)
            else:
                buf = write(buf, jnp.where(save, i, n_save), y1)
            i = i + save.astype(i.dtype)
        if mode == "steps" and ev:  # rows after a terminal event: inf
            out = (jnp.where(stopped, jnp.inf, target),
                   tree_where(stopped, jax.tree_util.tree_map(
                       lambda x: jnp.full_like(x, jnp.inf), y1), y1))
        new = (target, y1, state1, k, i, buf, result, fail_t, fail_step, count)
        return (new + (ev,) if ev else new), out

    # Checkpointed: the save buffer stays out of the recomputed segments
    saves_out = mode == "ts" and adjoint.saves_as_outputs and not progress
    buf0 = buffer(y0, n_save + 1, jnp.nan) if mode == "ts" and not saves_out else None
    zero = jnp.array(0, jnp.int32)
    carry0 = (t0, y0, state0, zero, zero, buf0, zero, t0, zero, zero)
    if events is not None:
        carry0 = carry0 + (init_state(events, t0, y0),)
    if progress:  # an eager run's bar (simlib/progress.py): the same steps, in chunks
        carry, outs = _reporting_scan(body, carry0, n_iter, progress)
    else:
        carry, outs = adjoint.scan(body, carry0, n_iter, padding=True,
                                   backwards=lambda c, n: reversible_scan(
                                       f, solver, mode, n_save, advance, c, n, args))
    if saves_out:  # the buffer came back as the loop's output
        carry, outs = carry[:5] + (outs,) + carry[6:], None
    t, y, _, k, i, buf, result, fail_t, fail_step, count, *ev = carry
    # a failed step: the run's time and step count are the failure's
    failed = (result == Result.NONFINITE_STATE.value) | (result == Result.NEWTON_FAILED.value)
    step_final = jnp.where(failed, fail_step, count)
    return run_solution(solver, mode, save_t0, max_steps, t0, t1, y0, t, y, ts_arr,
                        jax.tree_util.tree_map(lambda b: b[:n_save], buf) if mode == "ts"
                        else None, outs, (step_final, step_final, 0), result,
                        (t != t1) | (i < n_save if mode == "ts" else False),
                        solver.init_fevals, jnp.where(failed, fail_t, t), events,
                        ev[0] if ev else None)


def _reporting_scan(body, carry0, n_iter: int, every: int):
    """``lax.scan(body, carry0, None, length=n_iter)`` as an outer scan over chunks of
    ``every`` iterations that tells the host's bar (``simlib.progress``) after each chunk,
    then the remaining ``n_iter % every``. Only eager (undifferentiated) runs use it."""
    n_outer, rest = divmod(n_iter, every)
    carry, outs = carry0, None
    if n_outer:
        def chunk(c, i):
            c, o = lax.scan(body, c, None, length=every)
            tick("solve", (i + 1) * every)
            return c, o

        carry, outs = lax.scan(chunk, carry0, jnp.arange(n_outer, dtype=jnp.int32))
        outs = jax.tree_util.tree_map(lambda a: a.reshape((-1,) + a.shape[2:]), outs)
    if rest:
        carry, tail = lax.scan(body, carry, None, length=rest)
        outs = tail if outs is None else jax.tree_util.tree_map(
            lambda a, b: jnp.concatenate([a, b]), outs, tail)
    return carry, outs


fixed_jit = jax.jit(fixed_core, static_argnums=(0, 1, 2, 3, 4, 5, 6, 7, 8),
                    static_argnames=("events", "progress"))
