"""The pieces the ODE drivers share: the adaptive step attempt and the dense-output save
loop (the adaptive driver ``_adaptive.py`` and the ensemble chunks ``_compact.py``), and
the output assembly (those and the fixed-step driver ``_fixed.py``).

An adaptive run is a loop of :func:`attempt` calls over an :class:`Attempt` carry: the
solver protocol takes the step (``AbstractSolver.step``), the controller
(:class:`~simlib.PIDController`) judges it and proposes the next one. Save times are
filled by :func:`save_dense` from the solver's dense output, and every run ends in
:func:`run_solution`. See docs/design.md.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._control import PIDController, Scalar
from ._errors import Result
from ._events import overflowed, records
from ._solution import Solution, assemble_solution
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._util import all_finite, time_dtype, tree_where


class Attempt(NamedTuple):
    """The carry of an adaptive run between step attempts.

    Attributes:
        t, y, h: Time, state and the next step to attempt (signed).
        memory: The controller's remembered ``log r`` of earlier accepted steps.
        state: The solver's carried state.
        n_steps, n_accepted: Attempts so far, and accepted ones.
        result: The :class:`~simlib.Result` code (``0`` while running).
    """

    t: jax.Array
    y: PyTree
    h: jax.Array
    memory: tuple
    state: PyTree
    n_steps: jax.Array
    n_accepted: jax.Array
    result: jax.Array


def error_exponent(solver: AbstractSolver) -> int:
    """``k``: the order of the solver's error estimate plus one (the controller's unit)."""
    return (solver.error_order or solver.order - 1) + 1


def solver_init(f: VectorField, solver: AbstractSolver, t: Scalar, y: PyTree, args: Any,
                rtol: Scalar, atol: Scalar, f0: PyTree = None) -> PyTree:
    """The solver's carried state at ``(t, y)`` for an adaptive run: ``init``, then the
    run's tolerances (``set_tolerances``); every (re)start goes through here."""
    return solver.set_tolerances(solver.init(f, t, y, args, f0), rtol, atol)


def adaptive_init(f: VectorField, solver: AbstractSolver, controller: PIDController, y0: PyTree,
                  t0: Scalar, t1: Scalar, dt0: Scalar | None, rtol: Scalar, atol: Scalar,
                  args: Any) -> tuple[Attempt, jax.Array, jax.Array, jax.Array]:
    """``(carry, t0, t1, direction)`` at the start: the first step from the controller
    (given ``f(t0, y0)``, which the solver's ``init`` then reuses, when ``dt0`` is
    ``None``)."""
    tdtype = time_dtype(y0)
    t0 = jnp.asarray(t0, tdtype)
    t1 = jnp.asarray(t1, tdtype)
    direction = jnp.where(t1 >= t0, 1.0, -1.0).astype(tdtype)
    f0 = f(t0, y0, args) if dt0 is None else None
    h0 = controller.first_step(f, solver, t0, y0, f0, args, direction, dt0, rtol, atol)
    state = solver_init(f, solver, t0, y0, args, rtol, atol, f0)
    zero = jnp.array(0, jnp.int32)
    carry = Attempt(t0, y0, h0.astype(tdtype), controller.init_memory(tdtype), state, zero,
                    zero, zero)
    return carry, t0, t1, direction


@functools.partial(jax.jit, static_argnums=(0, 1))
def solver_step(f: VectorField, solver: AbstractSolver, t, y, h, args, state) -> tuple:
    """``solver.step(f, t, y, h, args, state)`` as one traced function: JAX keeps its
    jaxpr (keyed on ``f``, the solver and the shapes), so the drivers' several uses of the
    step in one solve (the save loop, the placeholder of its dense data, the replay, the
    forward-mode push) trace it once and transform that jaxpr, instead of tracing the
    Python step again each time."""
    return solver.step(f, t, y, h, args, state)


def _plain_step(f: VectorField, solver: AbstractSolver, controller: PIDController, t: Scalar,
                y: PyTree, h: Scalar, args: Any, state: PyTree, rtol: Scalar,
                atol: Scalar) -> tuple:
    """``(y1, err, dense, state1, ratio)``: the solver's step and the controller's error
    ratio of it."""
    y1, err, dense, state1 = solver_step(f, solver, t, y, h, args, state)
    ratio = controller.error_ratio(solver, y, y1, err, h, rtol, atol)
    return y1, err, dense, state1, ratio


def guarded_step(f: VectorField, solver: AbstractSolver, controller: PIDController, t: Scalar,
                 y: PyTree, h: Scalar, args: Any, state: PyTree, rtol: Scalar,
                 atol: Scalar) -> tuple:
    """:func:`_plain_step` whose reverse-mode derivative is zero where the attempt is
    non-finite (a non-finite ``ratio`` or ``y1``).

    Such an attempt is rejected and contributes nothing differentiable: its ``y1``,
    ``dense`` and ``state1`` are discarded (``tree_where`` on the acceptance; BDF keeps
    only its stop-gradient factorisation), and its ratio, replaced by ``inf``, gives the
    constant ``factor_min``. So the derivative of the attempt through the step is exactly
    zero, but the pullback of the step itself would multiply those zero cotangents by the
    ``inf`` inside it (``f``'s derivative at an overflowed stage) and give NaN: the NaN of
    the unselected branch of ``jnp.where``. Here the pullback's result is replaced by
    zeros on such an attempt (a select, so a finite attempt's derivative is unchanged
    bit for bit).
    """

    def step(t, y, h, args, state, rtol, atol):
        return _plain_step(f, solver, controller, t, y, h, args, state, rtol, atol)

    @jax.custom_vjp
    def guarded(t, y, h, args, state, rtol, atol):
        return step(t, y, h, args, state, rtol, atol)

    def guarded_fwd(t, y, h, args, state, rtol, atol):
        out, pull_back = jax.vjp(step, t, y, h, args, state, rtol, atol)
        y1, ratio = out[0], out[4]
        return out, (pull_back, jnp.isfinite(ratio) & all_finite(y1))

    def guarded_bwd(res, cotangent):
        pull_back, finite = res
        return jax.tree_util.tree_map(
            lambda ct: ct if getattr(ct, "dtype", None) == jax.dtypes.float0
            else jnp.where(finite, ct, 0.0), pull_back(cotangent))

    guarded.defvjp(guarded_fwd, guarded_bwd)
    return guarded(t, y, h, args, state, rtol, atol)


def attempt(f: VectorField, solver: AbstractSolver, controller: PIDController, k: int,
            carry: Attempt, t1: Scalar, direction: Scalar, rtol: Scalar, atol: Scalar,
            args: Any, guard: bool = False) -> tuple[Attempt, tuple]:
    """One step attempt: the solver takes the step, the controller accepts or rejects it
    and proposes the next step size.

    ``guard``: take the step through :func:`guarded_step`, whose reverse-mode derivative
    is zero on an attempt with a non-finite error ratio or state (the differentiated
    replay of an adaptive run sets it; the derivative is the same otherwise).

    Returns the new carry and the data of the attempt: ``(t, y, h, accepted, y1, dense)``,
    ``dense`` being the solver's opaque dense-output data.
    """
    t, y, h = carry.t, carry.y, carry.h
    last = direction * (t + h - t1) >= 0
    h = jnp.where(last, t1 - t, h)
    step = guarded_step if guard else _plain_step
    y1, err, dense, state1, ratio = step(f, solver, controller, t, y, h, args, carry.state,
                                         rtol, atol)
    newton_failed = solver.step_failed(err)
    finite = jnp.isfinite(ratio) & all_finite(y1)
    ratio = jnp.where(finite & ~newton_failed, ratio, jnp.inf)
    accept = ratio <= 1.0
    factor, state_next, memory = controller.propose(solver, h, ratio, accept, err,
                                                    carry.state, state1, carry.memory, k,
                                                    rtol, atol)
    h_next = controller.next_step(h, factor, direction)
    t_new = jnp.where(accept, jnp.where(last, t1, t + h), t)
    reached = direction * (t1 - t_new) <= 0
    underflow = ~reached & controller.too_small(h_next, t, t_new, t1, direction)
    result = jnp.where(
        (carry.result == 0) & underflow,
        jnp.where(newton_failed, Result.NEWTON_FAILED.value,
                  jnp.where(finite, Result.STEP_SIZE_TOO_SMALL.value,
                            Result.NONFINITE_STATE.value)),
        carry.result,
    )
    new = Attempt(
        t=t_new,
        y=tree_where(accept, y1, y),
        h=h_next,
        memory=memory,
        state=state_next,
        n_steps=carry.n_steps + 1,
        n_accepted=carry.n_accepted + accept.astype(jnp.int32),
        result=result,
    )
    return new, (t, y, h, accept, y1, dense)


def not_done(c: Attempt, t1: Scalar, direction: Scalar, max_steps: int) -> jax.Array:
    """Whether the run goes on: no failure, ``t1`` not reached, attempts left."""
    return (c.result == 0) & (direction * (t1 - c.t) > 0) & (c.n_steps < max_steps)


def placeholder_dense(f: VectorField, solver: AbstractSolver, carry: Attempt, args: Any) -> PyTree:
    """Zeros shaped like one step's dense-output data (the solver's, opaque here)."""
    shapes = jax.eval_shape(lambda t, y, h, a, s: solver_step(f, solver, t, y, h, a, s)[2],
                            carry.t, carry.y, carry.h, args, carry.state)
    return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def first_last(f: VectorField, solver: AbstractSolver, carry: Attempt, args: Any) -> tuple:
    """The ``last`` step :func:`save_dense` starts from: a step of length zero at the
    start, whose interpolant is the start itself."""
    return (carry.t, carry.y, jnp.zeros_like(carry.t), carry.y,
            placeholder_dense(f, solver, carry, args))


def save_dense(f: VectorField, solver: AbstractSolver, args: Any, advance: Callable, live: Callable,
               run: tuple, last: tuple, ts: jax.Array, direction: Scalar,
               previous: tuple | None = None,
               on_save: Callable | None = None,
               while_loop: Callable = lax.while_loop,
               t_end: jax.Array | None = None) -> tuple[tuple, PyTree]:
    """The dense-output save loop of the adaptive drivers: a ``lax.scan`` over the save
    times, each running the attempts until one covers it, then evaluating the solver's
    dense output (``interpolate``) on the last accepted step.

    Nothing large is carried through the inner ``while_loop``: under ``vmap`` a batched
    while loop selects its whole carry at every iteration.

    Args:
        advance: ``advance(run) -> (run, (t, y, h, accepted, y1, dense))``, one attempt.
        live: ``live(run)``: whether ``advance`` may be called again.
        run: The loop state; ``run[0]`` is the :class:`Attempt` carry.
        last: ``(t, y, h, y1, dense)`` of the last accepted step (:func:`first_last`).
        ts: The save times.
        previous: ``(saved, n_saved)`` of an earlier call (a chunked run): save times
            before ``n_saved`` keep their value. ``None``: a save time not reached is NaN.
        on_save: ``on_save(run, i)`` after save time ``i`` is reached (a progress report).
        while_loop: ``while_loop(cond, body, state)`` that runs the attempts up to a save
            time (``lax.while_loop``, or the driver's loop that reports progress).
        t_end: The run's end: the attempts after the last save time run in the same scan,
            as one more save time whose value is dropped, so that the step is traced and
            compiled once (a second loop after the scan would hold it again).

    Returns:
        ``((run, last), saved)``.
    """

    def follow(s):
        run, last = s
        run, (t, y, h, accept, y1, dense) = advance(run)
        return run, tree_where(accept, (t, y, h, y1, dense), last)

    def save(s, xs):
        t_save, i, old = xs
        s = while_loop(lambda s: live(s[0]) & (direction * (t_save - s[0][0].t) > 0),
                       follow, s)
        if on_save is not None:
            on_save(s[0], i)
        t, y, h, y1, dense = s[1]
        theta = (t_save - t) / jnp.where(h == 0, 1.0, h)
        value = solver.interpolate(f, args, t, y, h, y1, dense, theta)
        reached = direction * (t_save - s[0][0].t) <= 0
        if previous is None:
            return s, tree_where(reached, value, jax.tree_util.tree_map(
                lambda v: jnp.full_like(v, jnp.nan), value))
        return s, tree_where(reached & (i >= previous[1]), value, old)

    if t_end is not None:
        ts = jnp.concatenate([ts, jnp.asarray(t_end)[None]])
        if previous is not None:
            previous = (jax.tree_util.tree_map(lambda b: jnp.concatenate([b, b[-1:]]),
                                               previous[0]), previous[1])
    index = jnp.arange(ts.shape[0], dtype=jnp.int32)
    s, saved = lax.scan(save, (run, last), (ts, index, None if previous is None else previous[0]))
    if t_end is not None:
        saved = jax.tree_util.tree_map(lambda b: b[:-1], saved)
    return s, saved


def stats_of(c: Attempt, solver: AbstractSolver, ev: Any = None) -> tuple:
    """``(n_steps, n_accepted, result, state_fevals)`` of a finished carry, and the event
    state's integer parts after them when ``ev`` is given."""
    # state_fevals: evaluations a solver counts in its state (BDF's Newton iterations)
    stats = (c.n_steps, c.n_accepted, c.result,
             jnp.asarray(solver.state_fevals(c.state), jnp.int32))
    if ev is None:
        return stats
    return stats + ((ev.g, ev.counts, ev.stopped, ev.n_restarts),)


def run_solution(solver: AbstractSolver, mode: str, save_t0: bool, max_steps: int, t0: Scalar,
                 t1: Scalar, y0: PyTree, t_end: jax.Array, y_end: PyTree, ts: jax.Array | None,
                 saved: PyTree, steps_out: tuple, counts: tuple, result: jax.Array,
                 unfinished: jax.Array, init_fevals: int, t_final: jax.Array, events: Any = None,
                 ev: Any = None) -> Solution:
    """The output assembly of every ODE driver (fixed step, adaptive, ensemble chunks): the
    final status (``EVENT_CAPACITY_EXCEEDED`` where an event overflowed;
    ``MAX_STEPS_REACHED`` where the run is ``unfinished`` and nothing else stopped it), the
    count of ``f`` evaluations from ``counts = (n_steps, n_accepted, state_fevals)`` and
    the solver's ``num_fevals``, and the :class:`~simlib.Solution`."""
    n_steps, n_acc, state_fevals = counts
    if ev is not None:
        result = jnp.where((result == 0) & overflowed(events, ev),
                           Result.EVENT_CAPACITY_EXCEEDED.value, result)
    unfinished = (result == 0) & unfinished
    if ev is not None:
        unfinished = unfinished & ~ev.stopped
    result = jnp.where(unfinished, Result.MAX_STEPS_REACHED.value, result)
    n_fevals = solver.num_fevals(n_steps, n_acc) + state_fevals + init_fevals
    if ev is not None:  # solver restarts after apply
        n_fevals = n_fevals + ev.n_restarts * solver.init_fevals
    return assemble_solution(mode, save_t0, t0, y0, t_end, y_end, ts, saved, steps_out,
                             (n_steps, n_acc, n_fevals, t_final), result, False, t1, max_steps,
                             events=None if ev is None else records(events, ev))


def adaptive_solution(solver: AbstractSolver, mode: str, save_t0: bool, has_dt0: bool,
                      max_steps: int, t0: Scalar, t1: Scalar, y0: PyTree, t_end: jax.Array,
                      y_end: PyTree, ts: jax.Array | None, saved: PyTree, steps_out: tuple,
                      stats: tuple, events: Any = None, ev: Any = None) -> Solution:
    """:func:`run_solution` for an adaptive run ending at ``t_end`` with ``stats``
    (:func:`stats_of`): unfinished short of ``t1``, and ``f(t0, y0)`` and the Euler probe
    of the first-step choice counted (``f0`` then reaches ``init``), or ``init``'s own
    evaluations when ``dt0`` was given."""
    n_steps, n_acc, result, state_fevals = stats
    direction = jnp.where(t1 >= t0, 1.0, -1.0)
    return run_solution(solver, mode, save_t0, max_steps, t0, t1, y0, t_end, y_end, ts, saved,
                        steps_out, (n_steps, n_acc, state_fevals), result,
                        direction * (t1 - t_end) > 0, solver.init_fevals if has_dt0 else 2,
                        t_end, events, ev)
