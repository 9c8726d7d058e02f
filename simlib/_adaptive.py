"""Adaptive integration: a bounded loop of step attempts under an embedded error estimate.

The forward pass is a ``while_loop``; its reverse-mode derivative (a ``custom_vjp``)
replays the same attempts in a bounded ``lax.scan`` and differentiates that, so
``jax.grad`` sees the whole computation, the step-size controller included.
See docs/design.md.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._adjoint import Direct, first_order_only
from ._control import initial_step, log_error_ratio, pi_factor
from ._errors import Result, check_solution
from ._events import (
    EventSet,
    EventState,
    after_step,
    init_state,
    overflowed,
    pack_events,
    records,
    unpack_events,
)
from ._solution import assemble_solution
from ._solver._base import PyTree
from ._util import (
    all_finite,
    buffer,
    convert_closure,
    time_dtype,
    tree_where,
    where_rows,
    write,
)
from .progress import report, tick

_CHUNK = 16  # attempts per chunk in the differentiable replay of adaptive runs



_LOG_RATIO_FLOOR = math.log(1e-4)  # r_prev is floored at 1e-4 (Hairer's DOPRI5 does too)


class _Attempt(NamedTuple):
    t: jax.Array
    y: PyTree
    h: jax.Array
    log_ratio_prev: jax.Array
    state: PyTree
    n_steps: jax.Array
    n_accepted: jax.Array
    result: jax.Array


def _attempt(f, solver, k_exp, carry: _Attempt, t1, direction, rtol, atol, args):
    """One step attempt: take a step, accept or reject it, propose the next step size.

    Returns the new carry and the data of the attempt: ``(t, y, h, accepted, y1, dense)``,
    ``dense`` being the solver's opaque dense-output data.
    """
    t, y, h = carry.t, carry.y, carry.h
    last = direction * (t + h - t1) >= 0
    h = jnp.where(last, t1 - t, h)
    y1, err, dense, state1 = solver.step(f, t, y, h, args, carry.state)
    ratio = solver.error_ratio(y, y1, err, h, rtol, atol)
    newton_failed = solver.step_failed(err)
    finite = jnp.isfinite(ratio) & all_finite(y1)
    ratio = jnp.where(finite & ~newton_failed, ratio, jnp.inf)
    accept = ratio <= 1.0
    log_ratio = log_error_ratio(ratio)
    # --- step-control hook (AbstractSolver.propose_step; None: the PI controller) ---
    if solver.propose_step is None:
        factor = pi_factor(log_ratio, carry.log_ratio_prev, k_exp)
        state_next = tree_where(accept, state1, carry.state)
    else:
        factor, state_next = solver.propose_step(h, ratio, accept, err, carry.state, state1,
                                                 rtol, atol)
    # --- end hook ---
    h_next = h * factor
    t_new = jnp.where(accept, jnp.where(last, t1, t + h), t)
    tiny = 10 * jnp.finfo(jnp.result_type(t)).eps * jnp.maximum(jnp.abs(t), 1.0)
    reached = direction * (t1 - t_new) <= 0
    underflow = ~reached & (jnp.abs(h_next) < tiny)
    result = jnp.where(
        (carry.result == 0) & underflow,
        jnp.where(newton_failed, Result.NEWTON_FAILED.value,
                  jnp.where(finite, Result.STEP_SIZE_TOO_SMALL.value,
                            Result.NONFINITE_STATE.value)),
        carry.result,
    )
    new = _Attempt(
        t=t_new,
        y=tree_where(accept, y1, y),
        h=h_next,
        log_ratio_prev=jnp.where(accept, jnp.maximum(log_ratio, _LOG_RATIO_FLOOR),
                                 carry.log_ratio_prev),
        state=state_next,
        n_steps=carry.n_steps + 1,
        n_accepted=carry.n_accepted + accept.astype(jnp.int32),
        result=result,
    )
    return new, (t, y, h, accept, y1, dense)


# ---- events (simlib/_events.py): handled after each attempt; ``events=None`` adds nothing
def _attempt_events(f, solver, k_exp, c: _Attempt, ev, events, t1, direction, rtol, atol,
                    args):
    """``_attempt``, then the events: locate crossings on the step's dense output, record
    them, and stop (terminal) or restart from the changed state (``apply``) at the first
    acting one. Returns ``(new carry, new event state, attempt data)``."""
    new, data = _attempt(f, solver, k_exp, c, t1, direction, rtol, atol, args)
    if events is None:
        return new, ev, data
    t, y, h, accept, y1, dense = data

    def interp(theta, d):
        t_, y_, h_, y1_, dense_, args_ = d
        return solver.interpolate(f, args_, t_, y_, h_, y1_, dense_, theta)

    t_out, y_out, restart, ev = after_step(events, ev, accept, t, h, new.t, new.y, interp,
                                           (t, y, h, y1, dense, args))
    state = new.state
    if events.has_apply:
        state = lax.cond(restart, lambda: _solver_init(f, solver, t_out, y_out, args, rtol, atol),
                         lambda: new.state)
    return new._replace(t=t_out, y=y_out, state=state), ev, data


def _live(c: _Attempt, ev, t1, direction, max_steps):
    ok = _not_done(c, t1, direction, max_steps)
    return ok if ev is None else ok & ~ev.stopped
# ---- end events


def _solver_init(f, solver, t, y, args, rtol, atol, f0=None):
    """The solver's carried state at ``(t, y)`` for an adaptive run: ``init``, then the
    run's tolerances (``set_tolerances``); every (re)start goes through here."""
    return solver.set_tolerances(solver.init(f, t, y, args, f0), rtol, atol)


def _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args):
    tdtype = time_dtype(y0)
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    if dt0 is None:  # f(t0, y0) and one Euler probe; the solver's init reuses f(t0, y0)
        f0 = f(t0, y0, args)
        h0 = initial_step(f, t0, y0, f0, args, direction, solver.order, rtol, atol)
        state = _solver_init(f, solver, t0, y0, args, rtol, atol, f0)
    else:
        h0 = direction * jnp.abs(jnp.asarray(dt0, tdtype))
        state = _solver_init(f, solver, t0, y0, args, rtol, atol)
    zero = jnp.array(0, jnp.int32)
    carry = _Attempt(t0, y0, h0.astype(tdtype), jnp.asarray(0.0, tdtype), state, zero, zero,
                     zero)
    return carry, t0, t1, direction


def _placeholder_dense(f, solver, carry: _Attempt, args):
    """Zeros shaped like one step's dense-output data (the solver's, opaque here)."""
    shapes = jax.eval_shape(lambda t, y, h, a, s: solver.step(f, t, y, h, a, s)[2],
                            carry.t, carry.y, carry.h, args, carry.state)
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _k_exponent(solver) -> int:
    return (solver.error_order or solver.order - 1) + 1


def _not_done(c: _Attempt, t1, direction, max_steps):
    return (c.result == 0) & (direction * (t1 - c.t) > 0) & (c.n_steps < max_steps)


def _adaptive_forward(f, solver, mode, n_save, max_steps, y0, t0, t1, dt0, rtol, atol, ts,
                      args, events=None, progress=0):
    """The while-loop forward pass. Returns ``(final carry, saved, steps_out)``, and the
    final event state after them when ``events`` (an ``EventSet``) is given."""
    carry, t0, t1, direction = _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args)
    k_exp = _k_exponent(solver)
    tdtype = t0.dtype
    ts_arr = None if ts is None else jnp.asarray(ts, tdtype)
    ev0 = None if events is None else init_state(events, t0, y0)

    def attempt(c, ev):
        return _attempt_events(f, solver, k_exp, c, ev, events, t1, direction, rtol, atol,
                               args)

    def until(stop):
        return lambda s: _live(s[0], s[1], t1, direction, max_steps) & stop(s)

    def loop(cond, body, init):
        """``lax.while_loop``; an eager run with a bar (simlib/progress.py) runs it as an
        outer loop over inner loops of ``progress`` attempts, telling the host in between:
        the same attempts in the same order."""
        if not progress:
            return lax.while_loop(cond, body, init)

        def chunk(s):
            s, _ = lax.while_loop(lambda si: cond(si[0]) & (si[1] < progress),
                                  lambda si: (body(si[0]), si[1] + 1), (s, jnp.int32(0)))
            tick("solve", jnp.abs(s[0].t - t0))
            return s

        return lax.while_loop(cond, chunk, init)

    def out(c, ev, saved, steps_out):
        return (c, saved, steps_out) if events is None else (c, saved, steps_out, ev)

    if mode == "ts":
        # A scan over save times, each running the while loop until a step covers it, then
        # evaluating the dense output of the last accepted step. Nothing large is carried
        # through the while loop: under vmap a batched while loop selects its whole carry
        # at every iteration.
        def follow(s):
            c, ev, last = s
            new, ev, (t, y, h, accept, y1, dense) = attempt(c, ev)
            return new, ev, tree_where(accept, (t, y, h, y1, dense), last)

        def save(s, t_save_i):
            t_save, i = t_save_i
            s = lax.while_loop(until(lambda s: direction * (t_save - s[0].t) > 0), follow, s)
            if progress:  # every ~1/100 of the save times
                report("solve", jnp.abs(s[0].t - t0), (i + 1) % max(1, n_save // 100) == 0)
            c, _, (t, y, h, y1, dense) = s
            theta = (t_save - t) / jnp.where(h == 0, 1.0, h)
            value = solver.interpolate(f, args, t, y, h, y1, dense, theta)
            reached = direction * (t_save - c.t) <= 0
            return s, tree_where(reached, value, jax.tree_util.tree_map(
                lambda v: jnp.full_like(v, jnp.nan), value))

        last = (t0, y0, jnp.zeros_like(t0), y0, _placeholder_dense(f, solver, carry, args))
        (carry, ev, _), saved = lax.scan(save, (carry, ev0, last),
                                         (ts_arr, jnp.arange(n_save, dtype=jnp.int32)))
        c, ev = loop(until(lambda s: True), lambda s: attempt(*s)[:2], (carry, ev))
        return out(c, ev, saved, (None, None))

    def body(state):
        c, ev, sts, sys_ = state
        new, ev, (_, _, _, accept, _, _) = attempt(c, ev)
        if mode == "steps":
            idx = jnp.where(accept, c.n_accepted, max_steps)
            sts = lax.dynamic_update_index_in_dim(sts, new.t, idx, 0)
            sys_ = write(sys_, idx, new.y)
        return new, ev, sts, sys_

    sts = jnp.full((max_steps + 1,), jnp.inf, tdtype) if mode == "steps" else None
    sys_ = buffer(y0, max_steps + 1, jnp.inf) if mode == "steps" else None
    c, ev, sts, sys_ = loop(until(lambda s: True), body, (carry, ev0, sts, sys_))
    if mode == "steps":  # drop the row that rejected attempts wrote to
        sts, sys_ = sts[:max_steps], jax.tree_util.tree_map(lambda b: b[:max_steps], sys_)
    return out(c, ev, None, (sts, sys_))


def _adaptive_replay(f, solver, mode, n_save, max_steps, adjoint, y0, t0, t1, dt0, rtol, atol,
                     ts, args, events=None):
    """The same computation as ``_adaptive_forward``, as a differentiable bounded scan.

    Every attempt is recorded; saved values are then rebuilt from the recorded
    accepted steps with the method's dense output.
    """
    carry, t0, t1, direction = _adaptive_init(f, solver, y0, t0, t1, dt0, rtol, atol, args)
    k_exp = _k_exponent(solver)
    tdtype = t0.dtype
    # Chunks of attempts, skipped once the run is done. Checkpointed: chunks of about
    # sqrt(max_steps) attempts whose residuals are recomputed in the backward pass.
    size = adjoint.chunk_length(max_steps, _CHUNK)
    n_chunks = -(-max_steps // size)
    ev0 = None if events is None else init_state(events, t0, y0)

    # A multistep solver's step depends on its carried history: its dense data is recorded
    # here (ts mode) instead of being rebuilt from solver.init at the save times.
    record_dense = solver.multistep and mode == "ts"

    def one(s, _):
        c, ev = s
        active = _live(c, ev, t1, direction, max_steps)
        new, ev_new, (t, y, h, accept, _, dense) = _attempt_events(
            f, solver, k_exp, c, ev, events, t1, direction, rtol, atol, args)
        new, ev_new = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b),
                                             (new, ev_new), (c, ev))
        rec = (t, y, h, accept & active, new.t, new.y)
        return (new, ev_new), rec + ((dense,) if record_dense else ())

    def skip(s):
        c = s[0]
        rec = (jnp.zeros((size,), tdtype), buffer(c.y, size, 0.0),
               jnp.zeros((size,), tdtype), jnp.zeros((size,), bool),
               jnp.zeros((size,), tdtype), buffer(c.y, size, 0.0))
        if record_dense:
            rec = rec + (buffer(_placeholder_dense(f, solver, c, args), size, 0.0),)
        return s, rec

    def run_chunk(c):
        return lax.scan(one, c, None, length=size)

    run_chunk = adjoint.remat(run_chunk)

    def chunk(s, _):
        return lax.cond(
            _live(*s, t1, direction, max_steps),
            run_chunk,
            skip,
            s,
        )

    (c, ev), recs = lax.scan(chunk, (carry, ev0), None, length=n_chunks)
    recs = jax.tree_util.tree_map(lambda r: r.reshape((-1,) + r.shape[2:])[:max_steps], recs)
    t_rec, y_rec, h_rec, acc_rec, tnew_rec, ynew_rec = recs[:6]
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
            if record_dense:  # y1 is unused by a multistep solver's interpolate
                y1, dense = y, jax.tree_util.tree_map(lambda r: r[m], recs[6])
            else:
                state = _solver_init(f, solver, t, y, args, rtol, atol)
                y1, _, dense, _ = solver.step(f, t, y, h, args, state)
            theta = (s - t) / jnp.where(h == 0, 1.0, h)
            return solver.interpolate(f, args, t, y, h, y1, dense, theta)

        saved = jax.vmap(interp)(ts_arr, src)
        # Save times at t0 take y0 (there may be no accepted step, if t0 == t1).
        saved = where_rows(ts_arr != t0, saved, jax.tree_util.tree_map(
            lambda v, y: jnp.broadcast_to(y, v.shape[1:]), saved, y0))
        saved = where_rows(direction * (ts_arr - c.t) <= 0, saved, jnp.nan)
    elif mode == "steps":
        valid = jnp.arange(max_steps) < c.n_accepted
        steps_out = (jnp.where(valid, tnew_rec[order], jnp.inf),
                     where_rows(valid, jax.tree_util.tree_map(lambda r: r[order], ynew_rec),
                                 jnp.inf))
    return (c, saved, steps_out) if events is None else (c, saved, steps_out, ev)


def _adaptive_diff_outputs(c, saved, steps_out, ev=None):
    if ev is None:
        return (c.t, c.y, saved, steps_out)
    return (c.t, c.y, saved, steps_out, (ev.ts, ev.ys))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5, 6))
def _adaptive_solve(f, solver, mode, n_save, max_steps, adjoint, progress, inputs):
    c, saved, steps_out, *ev = _adaptive_forward(f, solver, mode, n_save, max_steps, **inputs,
                                                 progress=progress)
    return _adaptive_diff_outputs(c, saved, steps_out, *ev), _stats_of(c, solver, *ev)


def _stats_of(c: _Attempt, solver, ev=None):
    # state_fevals: evaluations a solver counts in its state (BDF's Newton iterations)
    stats = (c.n_steps, c.n_accepted, c.result,
             jnp.asarray(solver.state_fevals(c.state), jnp.int32))
    if ev is None:
        return stats
    return stats + ((ev.g, ev.counts, ev.stopped, ev.n_restarts),)


def _adaptive_fwd(f, solver, mode, n_save, max_steps, adjoint, progress, inputs):
    out = _adaptive_solve(f, solver, mode, n_save, max_steps, adjoint, progress, inputs)
    return out, inputs


def _adaptive_bwd(f, solver, mode, n_save, max_steps, adjoint, progress, inputs, cotangent):
    d_out, _ = cotangent

    def replay(inputs):
        c, saved, steps_out, *ev = _adaptive_replay(f, solver, mode, n_save, max_steps,
                                                    adjoint, **inputs)
        return _adaptive_diff_outputs(c, saved, steps_out, *ev)

    def pull_back(inputs, d_out):
        return jax.vjp(replay, inputs)[1](d_out)

    return first_order_only(pull_back)(inputs, d_out)


_adaptive_solve.defvjp(_adaptive_fwd, _adaptive_bwd)


def adaptive_core(f, solver, mode, save_t0, n_save, in_graph_check, max_steps, adjoint,
                  y0, t0, t1, dt0, rtol, atol, ts, args, events=None, progress=0):
    """The adaptive solve, differentiated as ``adjoint`` builds it
    (:meth:`~simlib.AbstractAdjoint.wrap`; reverse mode replays the attempts in chunks that
    :meth:`~simlib.AbstractAdjoint.remat` may recompute)."""
    tdtype = time_dtype(y0)
    f_plain, f_args = convert_closure(f, jnp.asarray(t0, tdtype), y0, args)
    if events is not None and not isinstance(events, EventSet):
        events = EventSet.convert(events, jnp.asarray(t0, tdtype), y0, args)

    def core(tree, strategy):
        y0, f_args, (t0, t1, dt0, rtol, atol, ts, events) = tree
        return pack_events(_adaptive_run(f_plain, solver, mode, save_t0, n_save, max_steps,
                                         strategy, y0, t0, t1, dt0, rtol, atol, ts, f_args,
                                         events, progress))

    sol = adjoint.wrap(core, (y0, f_args, (t0, t1, dt0, rtol, atol, ts, events)),
                       jvp_able=False, reverse=Direct(), where="solve")
    return check_solution(unpack_events(sol), in_graph_check, jnp.asarray(t1, tdtype),
                          max_steps)


def _adaptive_run(f_plain, solver, mode, save_t0, n_save, max_steps, adjoint, y0, t0, t1, dt0,
                  rtol, atol, ts, f_args, events, progress=0):
    tdtype = time_dtype(y0)
    inputs = dict(
        y0=y0, t0=jnp.asarray(t0, tdtype), t1=jnp.asarray(t1, tdtype),
        dt0=None if dt0 is None else jnp.asarray(dt0, tdtype),
        rtol=jnp.asarray(rtol, tdtype), atol=jnp.asarray(atol, tdtype),
        ts=None if ts is None else jnp.asarray(ts, tdtype), args=f_args,
    )
    if events is not None:
        inputs["events"] = events

    def forward():  # the while loop itself, which jvp goes through
        c, saved, sts_sys, *evs = _adaptive_forward(f_plain, solver, mode, n_save,
                                                    max_steps, **inputs, progress=progress)
        return c.t, c.y, saved, sts_sys, _stats_of(c, solver), evs[0] if evs else None

    def replay(strategy):  # the custom VJP that replays the attempts
        (t_end, y_end, saved, sts_sys, *ev_diff), stats = _adaptive_solve(
            f_plain, solver, mode, n_save, max_steps, strategy, progress, inputs)
        stats = list(stats)  # n_steps, n_acc, result, state_fevals and the events' integers
        ev = None
        if events is not None:
            (ev_ts, ev_ys), (g, counts, stopped, n_restarts) = ev_diff[0], stats.pop()
            ev = EventState(g, ev_ts, ev_ys, counts, stopped, n_restarts)
        return t_end, y_end, saved, sts_sys, tuple(stats), ev

    t_end, y_end, saved, (sts, sys_), (n_steps, n_acc, result, state_fevals), ev = (
        adjoint.run_adaptive(forward, replay))
    t0a, t1a = inputs["t0"], inputs["t1"]
    direction = jnp.where(t1a >= t0a, 1.0, -1.0)
    if ev is not None:
        result = jnp.where((result == 0) & overflowed(events, ev),
                           Result.EVENT_CAPACITY_EXCEEDED.value, result)
    unfinished = (result == 0) & (direction * (t1a - t_end) > 0)
    if ev is not None:
        unfinished = unfinished & ~ev.stopped
    result = jnp.where(unfinished, Result.MAX_STEPS_REACHED.value, result)
    # f(t0, y0) and the Euler probe of initial_step (f0 then reaches init), or init's own
    init_fevals = 2 if dt0 is None else solver.init_fevals
    n_fevals = solver.num_fevals(n_steps, n_acc) + state_fevals + init_fevals
    if ev is not None:  # solver restarts after apply
        n_fevals = n_fevals + ev.n_restarts * solver.init_fevals
    return assemble_solution(mode, save_t0, t0a, y0, t_end, y_end, inputs["ts"], saved,
                             (sts, sys_), (n_steps, n_acc, n_fevals, t_end), result,
                             False, t1a, max_steps,
                             events=None if ev is None else records(events, ev))


adaptive_jit = jax.jit(adaptive_core, static_argnums=(0, 1, 2, 3, 4, 5, 6, 7),
                       static_argnames=("events", "progress"))
