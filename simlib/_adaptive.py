"""Adaptive integration: a bounded loop of step attempts under an embedded error estimate.

The forward pass is a ``while_loop``; its reverse-mode derivative (a ``custom_vjp``)
replays the same attempts in chunks (``_adjoint.live_chunks``) and differentiates that, so
``jax.grad`` sees the whole computation, the step-size controller included. The step
attempt, the dense-save loop and the output assembly are ``_stepping.py``'s (shared with
the ensemble chunks of ``_compact.py``); the controller is a :class:`~simlib.PIDController`.
See docs/design.md.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ._adjoint import Direct, first_order_only, live_chunks
from ._control import DEFAULT_CONTROLLER, PIDController
from ._errors import check_solution
from ._events import EventSet, EventState, after_step, init_state, pack_events, unpack_events
from ._stepping import (
    Attempt,
    adaptive_init,
    adaptive_solution,
    attempt,
    error_exponent,
    first_last,
    not_done,
    save_dense,
    solver_init,
    solver_step,
    stats_of,
)
from ._util import buffer, convert_closure, time_dtype, where_rows, write
from .progress import report, tick

_CHUNK = 16  # attempts per chunk in the differentiable replay of adaptive runs


# ---- events (simlib/_events.py): handled after each attempt; ``events=None`` adds nothing
def _attempt_events(f, solver, controller, k, c: Attempt, ev, events, t1, direction, rtol,
                    atol, args, guard=False):
    """:func:`attempt` (``guard``: its reverse-mode guard against non-finite attempts),
    then the events: locate crossings on the step's dense output, record them, and stop
    (terminal) or restart from the changed state (``apply``) at the first acting one.
    Returns ``(new carry, new event state, attempt data)``."""
    new, data = attempt(f, solver, controller, k, c, t1, direction, rtol, atol, args, guard)
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
        state = lax.cond(restart, lambda: solver_init(f, solver, t_out, y_out, args, rtol, atol),
                         lambda: new.state)
    return new._replace(t=t_out, y=y_out, state=state), ev, data


def _live(c: Attempt, ev, t1, direction, max_steps):
    ok = not_done(c, t1, direction, max_steps)
    return ok if ev is None else ok & ~ev.stopped
# ---- end events


def _adaptive_forward(f, solver, mode, n_save, max_steps, y0, t0, t1, dt0, rtol, atol, ts,
                      args, events=None, progress=0, controller=DEFAULT_CONTROLLER):
    """The while-loop forward pass. Returns ``(final carry, saved, steps_out)``, and the
    final event state after them when ``events`` (an ``EventSet``) is given."""
    carry, t0, t1, direction = adaptive_init(f, solver, controller, y0, t0, t1, dt0, rtol,
                                             atol, args)
    k = error_exponent(solver)
    tdtype = t0.dtype
    ev0 = None if events is None else init_state(events, t0, y0)

    def advance(run):
        new, ev, data = _attempt_events(f, solver, controller, k, *run, events, t1, direction,
                                        rtol, atol, args)
        return (new, ev), data

    def live(run):
        return _live(*run, t1, direction, max_steps)

    def loop(cond, body, init, clock):
        """``lax.while_loop``; an eager run with a bar (simlib/progress.py) runs it as an
        outer loop over inner loops of ``progress`` attempts, telling the host the time
        ``clock(state)`` in between: the same attempts in the same order."""
        if not progress:
            return lax.while_loop(cond, body, init)

        def chunk(s):
            s, _ = lax.while_loop(lambda si: cond(si[0]) & (si[1] < progress),
                                  lambda si: (body(si[0]), si[1] + 1), (s, jnp.int32(0)))
            tick("solve", jnp.abs(clock(s) - t0))
            return s

        return lax.while_loop(cond, chunk, init)

    def out(c, ev, saved, steps_out):
        return (c, saved, steps_out) if events is None else (c, saved, steps_out, ev)

    if mode == "ts":
        def on_save(run, i):  # every ~1/100 of the save times
            if progress:
                report("solve", jnp.abs(run[0].t - t0), (i + 1) % max(1, n_save // 100) == 0)

        ((c, ev), _), saved = save_dense(
            f, solver, args, advance, live, (carry, ev0), first_last(f, solver, carry, args),
            jnp.asarray(ts, tdtype), direction, on_save=on_save, t_end=t1,
            while_loop=lambda cond, body, init: loop(cond, body, init, lambda s: s[0][0].t))
        return out(c, ev, saved, (None, None))

    def body(state):
        c, ev, sts, sys_ = state
        (new, ev), (_, _, _, accept, _, _) = advance((c, ev))
        if mode == "steps":
            idx = jnp.where(accept, c.n_accepted, max_steps)
            sts = lax.dynamic_update_index_in_dim(sts, new.t, idx, 0)
            sys_ = write(sys_, idx, new.y)
        return new, ev, sts, sys_

    sts = jnp.full((max_steps + 1,), jnp.inf, tdtype) if mode == "steps" else None
    sys_ = buffer(y0, max_steps + 1, jnp.inf) if mode == "steps" else None
    c, ev, sts, sys_ = loop(lambda s: live(s[:2]), body, (carry, ev0, sts, sys_),
                            lambda s: s[0].t)
    if mode == "steps":  # drop the row that rejected attempts wrote to
        sts, sys_ = sts[:max_steps], jax.tree_util.tree_map(lambda b: b[:max_steps], sys_)
    return out(c, ev, None, (sts, sys_))


def _adaptive_replay(f, solver, mode, n_save, max_steps, adjoint, y0, t0, t1, dt0, rtol, atol,
                     ts, args, events=None, controller=DEFAULT_CONTROLLER):
    """The same computation as ``_adaptive_forward``, as a differentiable loop of chunks.

    Every attempt is recorded; saved values are then rebuilt from the recorded
    accepted steps with the method's dense output.
    """
    carry, t0, t1, direction = adaptive_init(f, solver, controller, y0, t0, t1, dt0, rtol,
                                             atol, args)
    k = error_exponent(solver)
    # Chunks of attempts, skipped once the run is done. Checkpointed: chunks of about
    # sqrt(max_steps) attempts whose residuals are recomputed in the backward pass.
    size = adjoint.chunk_length(max_steps, _CHUNK)
    n_chunks = -(-max_steps // size)
    ev0 = None if events is None else init_state(events, t0, y0)

    # A multistep solver's step depends on its carried history: its dense data is recorded
    # here (ts mode) instead of being rebuilt from solver.init at the save times.
    record_dense = solver.multistep and mode == "ts"

    def one(s, consts):  # every traced value from ``consts``: live_chunks' pullback
        c, ev = s
        t1, direction, rtol, atol, args, events = consts
        active = _live(c, ev, t1, direction, max_steps)
        new, ev_new, (t, y, h, accept, _, dense) = _attempt_events(
            f, solver, controller, k, c, ev, events, t1, direction, rtol, atol, args,
            guard=True)
        new, ev_new = jax.tree_util.tree_map(lambda a, b: jnp.where(active, a, b),
                                             (new, ev_new), (c, ev))
        rec = (t, y, h, accept & active, new.t, new.y)
        return (new, ev_new), rec + ((dense,) if record_dense else ())

    def run_chunk(s, consts):
        return lax.scan(lambda s, _: one(s, consts), s, None, length=size)

    # only the chunks that run, forward and backward (not n_chunks: simlib/_adjoint.py)
    (c, ev), recs = live_chunks(
        adjoint.remat(run_chunk), lambda s, k: _live(*s, k[0], k[1], max_steps),
        (carry, ev0), (t1, direction, rtol, atol, args, events), n_chunks)
    recs = jax.tree_util.tree_map(lambda r: r.reshape((-1,) + r.shape[2:])[:max_steps], recs)
    saved, steps_out = _replayed_outputs(f, solver, mode, max_steps, recs, c, t0, y0, ts,
                                         direction, rtol, atol, args)
    return (c, saved, steps_out) if events is None else (c, saved, steps_out, ev)


def _replayed_outputs(f, solver, mode, max_steps, recs, c, t0, y0, ts, direction, rtol, atol,
                      args):
    """``(saved, steps_out)`` of a replay from its records of every attempt
    ``(t, y, h, accepted, t_new, y_new[, dense])``: the save times by the dense output of
    the accepted step covering each (its data recorded for a multistep solver, rebuilt by
    ``step`` from ``init`` otherwise), or the accepted steps in time order."""
    t_rec, y_rec, h_rec, acc_rec, tnew_rec, ynew_rec = recs[:6]
    if mode == "steps":
        order = jnp.argsort(~acc_rec, stable=True)  # accepted attempts first, in time order
        valid = jnp.arange(max_steps) < c.n_accepted
        return None, (jnp.where(valid, tnew_rec[order], jnp.inf),
                      where_rows(valid, jax.tree_util.tree_map(lambda r: r[order], ynew_rec),
                                 jnp.inf))
    if mode != "ts":
        return None, (None, None)
    ts_arr = jnp.asarray(ts, t0.dtype)
    # the last accepted attempt starting before each save time, without sorting the
    # max_steps records: accepted starts rise in attempt order, so their running maximum
    # is sorted and the running last accepted index names the attempt (the first
    # accepted one where none starts before it: a save at t0, which takes y0 below)
    attempt = jnp.arange(max_steps)
    starts = lax.cummax(jnp.where(acc_rec, direction * lax.stop_gradient(t_rec), -jnp.inf))
    last = lax.cummax(jnp.where(acc_rec, attempt, -1))
    idx = jnp.searchsorted(starts, direction * lax.stop_gradient(ts_arr), side="left") - 1
    src = jnp.where(idx < 0, jnp.argmax(acc_rec), last[jnp.clip(idx, 0, max_steps - 1)])
    src = jnp.clip(src, 0, max_steps - 1)

    def interp(s, m):
        t, h = t_rec[m], h_rec[m]
        y = jax.tree_util.tree_map(lambda r: r[m], y_rec)
        if len(recs) > 6:  # a multistep solver: y1 is unused by its interpolate
            y1, dense = y, jax.tree_util.tree_map(lambda r: r[m], recs[6])
        else:
            state = solver_init(f, solver, t, y, args, rtol, atol)
            y1, _, dense, _ = solver_step(f, solver, t, y, h, args, state)
        theta = (s - t) / jnp.where(h == 0, 1.0, h)
        return solver.interpolate(f, args, t, y, h, y1, dense, theta)

    saved = jax.vmap(interp)(ts_arr, src)
    # Save times at t0 take y0 (there may be no accepted step, if t0 == t1).
    saved = where_rows(ts_arr != t0, saved, jax.tree_util.tree_map(
        lambda v, y: jnp.broadcast_to(y, v.shape[1:]), saved, y0))
    return where_rows(direction * (ts_arr - c.t) <= 0, saved, jnp.nan), (None, None)


def _adaptive_diff_outputs(c, saved, steps_out, ev=None):
    if ev is None:
        return (c.t, c.y, saved, steps_out)
    return (c.t, c.y, saved, steps_out, (ev.ts, ev.ys))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3, 4, 5, 6, 7))
def _adaptive_solve(f, solver, controller, mode, n_save, max_steps, adjoint, progress, inputs):
    c, saved, steps_out, *ev = _adaptive_forward(f, solver, mode, n_save, max_steps, **inputs,
                                                 progress=progress, controller=controller)
    return _adaptive_diff_outputs(c, saved, steps_out, *ev), stats_of(c, solver, *ev)


def _adaptive_fwd(f, solver, controller, mode, n_save, max_steps, adjoint, progress, inputs):
    out = _adaptive_solve(f, solver, controller, mode, n_save, max_steps, adjoint, progress,
                          inputs)
    return out, inputs


def _adaptive_bwd(f, solver, controller, mode, n_save, max_steps, adjoint, progress, inputs,
                  cotangent):
    d_out, _ = cotangent

    def replay(inputs):
        c, saved, steps_out, *ev = _adaptive_replay(f, solver, mode, n_save, max_steps,
                                                    adjoint, **inputs, controller=controller)
        return _adaptive_diff_outputs(c, saved, steps_out, *ev)

    def pull_back(inputs, d_out):
        return jax.vjp(replay, inputs)[1](d_out)

    return first_order_only(pull_back)(inputs, d_out)


_adaptive_solve.defvjp(_adaptive_fwd, _adaptive_bwd)


def adaptive_core(f, solver, mode, save_t0, n_save, in_graph_check, max_steps, adjoint,
                  y0, t0, t1, dt0, rtol, atol, ts, args, events=None, progress=0,
                  controller: PIDController | None = None):
    """The adaptive solve, differentiated as ``adjoint`` builds it
    (:meth:`~simlib.AbstractAdjoint.wrap`; reverse mode replays the attempts in chunks that
    :meth:`~simlib.AbstractAdjoint.remat` may recompute), its steps chosen by
    ``controller`` (``None``: the default :class:`~simlib.PIDController`)."""
    controller = DEFAULT_CONTROLLER if controller is None else controller
    tdtype = time_dtype(y0)
    f_plain, f_args = convert_closure(f, jnp.asarray(t0, tdtype), y0, args)
    if events is not None and not isinstance(events, EventSet):
        events = EventSet.convert(events, jnp.asarray(t0, tdtype), y0, args)

    def core(tree, strategy):
        y0, f_args, (t0, t1, dt0, rtol, atol, ts, events) = tree
        return pack_events(_adaptive_run(f_plain, solver, controller, mode, save_t0, n_save,
                                         max_steps, strategy, y0, t0, t1, dt0, rtol, atol, ts,
                                         f_args, events, progress))

    sol = adjoint.wrap(core, (y0, f_args, (t0, t1, dt0, rtol, atol, ts, events)),
                       jvp_able=False, reverse=Direct(), where="solve")
    return check_solution(unpack_events(sol), in_graph_check, jnp.asarray(t1, tdtype),
                          max_steps)


def _adaptive_run(f_plain, solver, controller, mode, save_t0, n_save, max_steps, adjoint, y0,
                  t0, t1, dt0, rtol, atol, ts, f_args, events, progress=0):
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
        c, saved, sts_sys, *evs = _adaptive_forward(f_plain, solver, mode, n_save, max_steps,
                                                    **inputs, progress=progress,
                                                    controller=controller)
        return c.t, c.y, saved, sts_sys, stats_of(c, solver), evs[0] if evs else None

    def replay(strategy):  # the custom VJP that replays the attempts
        diff, ints = _adaptive_solve(f_plain, solver, controller, mode, n_save, max_steps,
                                     strategy, progress, inputs)
        (t_end, y_end, saved, sts_sys, *ev_diff), stats = diff, ints[:4]
        ev = None
        if events is not None:
            (ev_ts, ev_ys), (g, counts, stopped, n_restarts) = ev_diff[0], ints[4]
            ev = EventState(g, ev_ts, ev_ys, counts, stopped, n_restarts)
        return t_end, y_end, saved, sts_sys, stats, ev

    t_end, y_end, saved, (sts, sys_), stats, ev = adjoint.run_adaptive(forward, replay)
    return adaptive_solution(solver, mode, save_t0, dt0 is not None, max_steps, inputs["t0"],
                             inputs["t1"], y0, t_end, y_end, inputs["ts"], saved, (sts, sys_),
                             stats, events, ev)


adaptive_jit = jax.jit(adaptive_core, static_argnums=(0, 1, 2, 3, 4, 5, 6, 7),
                       static_argnames=("events", "progress", "controller"))
