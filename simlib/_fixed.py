"""Fixed-step integration: a ``lax.scan`` over a grid ``t0 + k dt`` ending exactly on ``t1``.

Save times in ``SaveAt(ts=...)`` are inserted into the grid, so the values saved there are
the method's own, not interpolants. See docs/design.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ._adjoint import Checkpointed, Direct, SaveWrites, StepLoop, Steps, hoist_constants
from ._errors import Result, check_solution
from ._events import (
    EventSet,
    after_step,
    init_state,
    pack_events,
    unpack_events,
)
from ._solver._base import AbstractSolver
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
    """The walk from ``t0`` to ``t1`` (:func:`_walker`), one scan of :func:`_step_body`
    differentiated as ``adjoint`` builds it, assembled into a solution (:func:`_finish`)."""
    tdtype = time_dtype(y0)
    t0, t1, direction, step, n_grid, ts_arr = _grid(adjoint.times((t0, t1, dt, ts)), n_grid,
                                                    tdtype)
    advance = _walker(mode, n_save, t0, t1, direction, step, n_grid, ts_arr, tdtype)
    # Checkpointed: the save buffer stays out of the recomputed segments
    saves_out = mode == "ts" and adjoint.saves_as_outputs and not progress
    body = _step_body(f, solver, mode, n_save, advance, args, events, saves_out)
    buf0 = buffer(y0, n_save + 1, jnp.nan) if mode == "ts" and not saves_out else None
    zero = jnp.array(0, jnp.int32)
    carry0 = (t0, y0, solver.init(f, t0, y0, args), zero, zero, buf0, zero, t0, zero, zero)
    if events is not None:
        carry0 = carry0 + (init_state(events, t0, y0),)
    if progress:  # an eager run's bar (simlib/progress.py): the same steps, in chunks
        carry, outs = _reporting_scan(body, carry0, n_iter, progress)
    else:
        carry, outs = adjoint.scan(body, carry0, n_iter, padding=True,
                                   steps=FixedSteps(f, solver, args, mode, n_save, advance))
    if saves_out:  # the buffer came back as the loop's output
        carry, outs = carry[:5] + (outs,) + carry[6:], None
    return _finish(solver, mode, save_t0, n_save, max_steps, t0, t1, y0, ts_arr, carry, outs,
                   events)


def _grid(times, n_grid, tdtype):
    """``(t0, t1, direction, step, n_grid, ts)`` of the walk, in the time dtype; ``n_grid``
    (:func:`grid_count`) computed in the graph when the host could not (traced times)."""
    t0, t1, dt, ts = times
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    step = direction * jnp.abs(jnp.asarray(dt, tdtype))
    if n_grid is None:
        span = jnp.abs(t1 - t0)
        n_grid = jnp.where(
            span == 0, 0, jnp.maximum(1, jnp.ceil(span / jnp.abs(step) * (1 - 1e-12)))
        ).astype(jnp.int32)
    return t0, t1, direction, step, n_grid, None if ts is None else jnp.asarray(ts, tdtype)


def _step_body(f, solver, mode, n_save, advance, args, events, saves_out):
    """The scan body: one step of the walk, ``carry = (t, y, state, k, i, buf, result,
    fail_t, fail_step, count[, event state])``; the output is the step's ``(t, y)`` for
    ``SaveAt(steps=True)``, its :class:`SaveWrites` when ``saves_out``, else ``None``.

    The time, the grid index, the save index and the step count never depend on the
    state, so under vmap they stay unbatched scalars (one time per ensemble, and
    dynamic_update_slice rather than scatter for saves). Only the state and the failure
    record are per member."""

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

    return body


def _finish(solver, mode, save_t0, n_save, max_steps, t0, t1, y0, ts_arr, carry, outs,
            events):
    """The solution from the walk's final carry (:func:`~simlib._stepping.run_solution`);
    after a failed step, the run's time and step count are the failure's."""
    t, y, _, k, i, buf, result, fail_t, fail_step, count, *ev = carry
    failed = (result == Result.NONFINITE_STATE.value) | (result == Result.NEWTON_FAILED.value)
    step_final = jnp.where(failed, fail_step, count)
    return run_solution(solver, mode, save_t0, max_steps, t0, t1, y0, t, y, ts_arr,
                        jax.tree_util.tree_map(lambda b: b[:n_save], buf) if mode == "ts"
                        else None, outs, (step_final, step_final, 0), result,
                        (t != t1) | (i < n_save if mode == "ts" else False),
                        solver.init_fevals, jnp.where(failed, fail_t, t), events,
                        ev[0] if ev else None)


def _whole(y):
    return y, lambda d: d


def _time_plan(advance: Callable, mode: str, n_save: int, start: tuple, n_iter: int,
               segment: int) -> tuple:
    """The fixed-step walk's plan without the state: ``(end, starts, full_plan, plan_fn,
    walk_consts)``, the walker's state ``(t, k, i, count)`` at the end and at the start of
    each segment of ``segment`` steps, every step's ``(t, h, slot, count)`` when ``mode``
    is ``"steps"`` (else ``None``), and ``plan_fn(start, *walk_consts)``, which
    regenerates one segment's plan; the values the walker closes over are hoisted into
    ``walk_consts`` (explicit inputs of a custom VJP)."""
    n_seg = -(-n_iter // segment)

    def walk(c, _):
        t, k, i, count = c
        target, h, k, save = advance(t, k, i)
        slot = jnp.where(save, i, n_save)
        count = count + (h != 0).astype(count.dtype)
        return (target, k, i + save.astype(i.dtype), count), (t, h, slot, count)

    def segment_plan(start):
        return lax.scan(walk, start, None, length=segment)

    def walk_segment(c, _):
        end, plan = segment_plan(c)
        return end, (c, plan if mode == "steps" else None)

    end, (starts, full_plan) = lax.scan(walk_segment, start, None, length=n_seg)
    if mode == "steps":
        full_plan = jax.tree_util.tree_map(lambda x: x.reshape((-1,) + x.shape[2:])[:n_iter],
                                           full_plan)
    plan_fn, walk_consts = hoist_constants(
        segment_plan, jax.tree_util.tree_map(lambda x: x[0], starts))
    return end, starts, full_plan, plan_fn, walk_consts


class FixedSteps(Steps):
    """The fixed-step walk as :class:`~simlib._adjoint.Steps`: ``solver``'s step of ``f``
    on the grid that ``advance`` (:func:`_walker`) walks, with plan items ``(t, h, slot,
    count, index)``; the state is ``y`` alone (the solver's carried state is rebuilt with
    ``init``, as a time-symmetric method carries none that matters).

    :meth:`loop` returns what ``lax.scan(body, carry0, None, length=n_iter)`` would for the
    fixed-step body, ``(carry, outs)``, with the saved values' cotangents injected at
    their steps. The time plan (each step's ``t``, ``h``, save slot and count) depends on
    times only. It is not stored: a walk-only pass keeps the walker's state at the start
    of every segment of ``ceil(sqrt(n_iter))`` steps, and each segment's plan is
    regenerated from there, in the forward and again in the backward pass. So memory holds
    ``O(sqrt(n_iter))`` scalars besides a few states. (``SaveAt(steps=True)`` returns every
    step anyway and keeps the full plan.)
    """

    def __init__(self, f: Callable, solver: AbstractSolver, args: Any, mode: str,
                 n_save: int, advance: Callable):
        self.f, self.solver, self.args = f, solver, args
        self.mode, self.n_save, self.advance = mode, n_save, advance

    def step(self, z: Any, params: Any, x: tuple) -> Any:
        """``y1``: the solver's step from ``y = z`` at ``t = x[0]`` with ``h = x[1]``."""
        t, h = x[0], x[1]
        return self.solver.step(self.f, t, z, h, params,
                                self.solver.init(self.f, t, z, params))[0]

    def unstep(self, z1: Any, params: Any, x: tuple) -> Any:
        """The step back from ``t + h`` with ``-h``."""
        return self.step(z1, params, (x[0] + x[1], -x[1]))

    def loop(self, carry0: tuple, n_iter: int) -> StepLoop:
        t0, y0, _, k0, i0, buf0, result0, fail_t0, fail_step0, count0 = carry0
        mode, n_save = self.mode, self.n_save
        segment = max(1, math.ceil(math.sqrt(n_iter))) if mode != "steps" else n_iter
        n_seg = -(-n_iter // segment)
        (t_end, k_end, i_end, count_end), starts, full_plan, plan_fn, walk_consts = _time_plan(
            self.advance, mode, n_save, (t0, k0, i0, count0), n_iter, segment)
        # Values the vector field closes over become explicit inputs of the custom VJP (a
        # backward pass that closed over them would leak tracers of an enclosing jit).
        f, args = convert_closure(self.f, t0, y0, self.args)
        steps = FixedSteps(f, self.solver, args, mode, n_save, self.advance)

        def plan(block, consts):
            start, j = block
            _, p = plan_fn(start, *consts[2])
            return (*p, j * segment + jnp.arange(segment))

        def finish(out):
            (y, buf, ys), (result, fail_t, fail_step) = out
            carry = (t_end, y, None, k_end, i_end, buf, result, fail_t, fail_step, count_end)
            return carry, (full_plan[0] + full_plan[1], ys) if mode == "steps" else None

        return StepLoop(
            steps.forward(plan_fn, n_iter), steps.step, steps.unstep, _whole, y0, args,
            (starts, (buf0, result0, fail_t0, fail_step0), walk_consts),
            blocks=lambda consts: (consts[0], jnp.arange(n_seg)), n_blocks=n_seg,
            n_inner=segment, plan=plan, unpack=_unpack, finish=finish,
            inject_step=self.inject(n_iter))

    def forward(self, plan_fn: Callable, n_iter: int) -> Callable:
        """The loop as :func:`~simlib._adjoint.reversible_loop` runs it forwards:
        ``forward(y0, args, consts) -> (((y, buf, ys), failure), y)``, segment by segment
        (each segment's plan regenerated by ``plan_fn``)."""
        f, solver, mode = self.f, self.solver, self.mode

        def forward(y0, a, consts):
            starts, (buf0, result0, fail_t0, fail_step0), walk_consts = consts

            def body(c, xs):
                y, state, buf, result, fail_t, fail_step = c
                t, h, slot, count = xs
                y1, state1, (result, fail_t, fail_step) = checked_step(
                    f, solver, t, y, h, a, state, count, (result, fail_t, fail_step))
                if buf is not None:
                    buf = jax.tree_util.tree_map(
                        lambda b, x: lax.dynamic_update_index_in_dim(b, x, slot, 0), buf, y1)
                return ((y1, state1, buf, result, fail_t, fail_step),
                        (y1 if mode == "steps" else None))

            def run_segment(c, start):
                _, plan = plan_fn(start, *walk_consts)
                return lax.scan(body, c, plan)

            c0 = (y0, solver.init(f, starts[0][0], y0, a), buf0, result0, fail_t0, fail_step0)
            (y, _, buf, result, fail_t, fail_step), ys = lax.scan(run_segment, c0, starts)
            if mode == "steps":
                ys = jax.tree_util.tree_map(
                    lambda x: x.reshape((-1,) + x.shape[2:])[:n_iter], ys)
            return ((y, buf, ys), (result, fail_t, fail_step)), y

        return forward

    def inject(self, n_iter: int) -> Callable:
        """``inject_step(g, x, (d_buf, d_ys))``: a step's saved value's cotangent added to
        ``g`` (row ``slot`` of the save buffer's, row ``index`` of the steps')."""
        n_save = self.n_save

        def inject_step(g, xs, cts):
            d_buf, d_ys = cts
            _, _, slot, _, index = xs
            if d_buf is not None:
                g = jax.tree_util.tree_map(
                    lambda gl, db: gl + jnp.where(slot < n_save, db[jnp.minimum(slot, n_save)],
                                                  0.0), g, d_buf)
            if d_ys is not None:
                g = jax.tree_util.tree_map(
                    lambda gl, dl: gl + jnp.where(index < n_iter,
                                                  dl[jnp.minimum(index, n_iter - 1)], 0.0),
                    g, d_ys)
            return g

        return inject_step


def _unpack(cotangent):
    (d_y, d_buf, d_ys), _ = cotangent
    return d_y, None, (d_buf, d_ys)


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
