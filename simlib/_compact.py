"""``solve_ensemble()``: an adaptive ensemble advanced in chunks, finished members dropped.

Under ``jax.vmap`` an adaptive ``solve`` is one batched ``while_loop`` that runs until its
slowest member is done: every member pays for the longest one. Here the members advance
in chunks of at most ``chunk_steps`` step attempts, each chunk one compiled call over
the members still running; between chunks the host reads which members are done (t1
reached, or failed), and once the live ones fit a smaller power-of-two bucket it packs
them into it (finished members' outputs go to their place in the result). Only the
bucket sizes ``n, 2^k, 2^(k-1), ..., min_bucket`` are ever compiled.

Each member runs the adaptive driver's own pieces (``_stepping.py``: the same step
attempt, initial step, controller, dense-save loop, failure codes and output assembly),
so the results are those of ``solve`` per member. See docs/ensembles.md ("Uneven ensembles") and
docs/design.md.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _stepping
from ._arguments import (
    DEFAULT_MAX_STEPS,
    SAVE_T1,
    Problem,
    check_callable,
    check_count,
    check_field,
    check_initialize,
    check_keywords,
    check_saveat,
    check_solver,
    complete,
    normalise,
)
from ._control import DEFAULT_CONTROLLER, PIDController
from ._dae import MassField, initialise, prepare_mass
from ._errors import Result, SolverError, result_message
from ._solution import SaveAt, Solution
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._solver._sde import AbstractSDESolver
from ._util import buffer, inside_trace, is_tracer
from ._validate import Checks
from .progress import bar as progress_bar

__all__ = ["solve_ensemble"]

class _Member(NamedTuple):
    """One member's whole state between chunks (batched along a leading member axis)."""
    c: _stepping.Attempt  # the adaptive carry: t, y, h, controller memory, solver state, stats
    t1: jax.Array
    direction: jax.Array
    last: Any            # ts mode: (t, y, h, y1, dense) of the last accepted step; else None
    saved: Any           # ts mode: the values at the save times (nan until reached)
    n_saved: Any         # ts mode: how many save times are filled
    args: Any            # the member's own (batched) leaves of ``args``


class _Plan(NamedTuple):
    """Everything static about a run (hashable: it keys the compiled chunks)."""
    f: Any
    solver: Any
    mode: str
    n_save: int
    args_tree: Any       # treedef of ``args``
    args_batched: tuple  # per leaf of ``args``: batched over members?
    has_dt0: bool
    mass: bool = False   # a DAE: ``f`` a MassField, M the last of the shared leaves ...
    mass_batched: bool = False  # ... or, one M per member, the last of the batched leaves
    controller: PIDController = DEFAULT_CONTROLLER


def _merge_args(plan: _Plan, batched, shared):
    it_b, it_s = iter(batched), iter(shared)
    leaves = [next(it_b) if b else next(it_s) for b in plan.args_batched]
    args = jax.tree_util.tree_unflatten(plan.args_tree, leaves)
    if not plan.mass:
        return args
    return args, next(it_b) if plan.mass_batched else next(it_s)  # MassField's (args, M)


# ---- per member (vmapped below)

def _init_member(plan: _Plan, y0, t0, t1, batched, shared, dt0, rtol, atol, code):
    args = _merge_args(plan, batched, shared)
    c, t0, t1, direction = _stepping.adaptive_init(plan.f, plan.solver, plan.controller, y0,
                                                   t0, t1, dt0, rtol, atol, args)
    c = c._replace(result=jnp.where(code != 0, code, c.result))  # refused: never steps
    last = saved = n_saved = None
    if plan.mode == "ts":
        last = _stepping.first_last(plan.f, plan.solver, c, args)
        saved = buffer(y0, plan.n_save, jnp.nan)
        n_saved = jnp.array(0, jnp.int32)
    return _Member(c, t1, direction, last, saved, n_saved, batched)


def _advance_member(plan: _Plan, m: _Member, shared, ts, rtol, atol, budget, max_steps):
    """At most ``budget`` attempts of the adaptive driver for one member, filling the save
    times they cover (ts mode) with the adaptive driver's dense-save loop
    (:func:`simlib._stepping.save_dense`)."""
    f, solver = plan.f, plan.solver
    args = _merge_args(plan, m.args, shared)
    t1, direction = m.t1, m.direction
    k = _stepping.error_exponent(solver)

    def advance(run):
        c, n = run
        c, data = _stepping.attempt(f, solver, plan.controller, k, c, t1, direction, rtol,
                                    atol, args)
        return (c, n + 1), data

    def live(run):
        return _stepping.not_done(run[0], t1, direction, max_steps) & (run[1] < budget)

    run = (m.c, jnp.array(0, jnp.int32))
    last, saved, n_saved = m.last, m.saved, m.n_saved
    if plan.mode == "ts":
        (run, last), saved = _stepping.save_dense(f, solver, args, advance, live, run, last,
                                                  ts, direction, previous=(saved, n_saved),
                                                  t_end=t1)
        n_saved = jnp.sum(direction * (ts - run[0].t) <= 0).astype(jnp.int32)
    else:
        run = lax.while_loop(live, lambda run: advance(run)[0], run)
    c = run[0]
    return m._replace(c=c, last=last, saved=saved, n_saved=n_saved), \
        _stepping.not_done(c, t1, direction, max_steps)


def _outputs(plan: _Plan, m: _Member):
    """What the result needs of a member: its end, saved values and statistics."""
    return (m.c.t, m.c.y, m.saved, _stepping.stats_of(m.c, plan.solver))


# ---- compiled calls (one per bucket size)

@functools.partial(jax.jit, static_argnums=0)
def _init(plan, y0s, t0s, t1s, batched, shared, dt0, rtol, atol, codes):
    init = jax.vmap(functools.partial(_init_member, plan),
                    in_axes=(0, 0, 0, 0, None, None, None, None, 0))
    members = init(y0s, t0s, t1s, batched, shared, dt0, rtol, atol, codes)
    return members, jax.vmap(functools.partial(_outputs, plan))(members)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=1)
def _chunk(plan, members, shared, ts, rtol, atol, budget, max_steps):
    return jax.vmap(functools.partial(_advance_member, plan),
                    in_axes=(0, None, None, None, None, None, None))(
        members, shared, ts, rtol, atol, budget, max_steps)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1,))
def _repack(plan, out, members, slots, keep):
    """Write every member of the bucket to its place in ``out`` (slots past the end are
    padding and dropped), then gather the members at ``keep`` into the next bucket."""
    now = jax.vmap(functools.partial(_outputs, plan))(members)
    out = jax.tree_util.tree_map(lambda o, x: o.at[slots].set(x, mode="drop"), out, now)
    return out, jax.tree_util.tree_map(lambda x: x[keep], members)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _finish(plan, save_t0, max_steps, out, y0s, t0s, t1s, ts, codes):
    """The batched :class:`Solution`, assembled per member as ``_adaptive_run`` does; a
    member refused before its run (``codes``, the DAE initialisation's) gets its outputs
    NaN, as ``Checks.apply`` does for ``solve``."""
    def one(o, y0, t0, t1, code):
        t_end, y_end, saved, stats = o
        sol = _stepping.adaptive_solution(plan.solver, plan.mode, save_t0, plan.has_dt0,
                                          max_steps, t0, t1, y0, t_end, y_end, ts, saved,
                                          (None, None), stats)
        refused = code != 0

        def poison(x):
            return jnp.where(refused, jnp.asarray(jnp.nan, x.dtype), x)

        stats = dict(sol.stats, t_final=poison(sol.stats["t_final"]))
        return type(sol)(poison(sol.ts), jax.tree_util.tree_map(poison, sol.ys), stats,
                         sol.result)

    return jax.vmap(one)(out, y0s, t0s, t1s, codes)


def _initialise_one(plan: _Plan, initialize: str, recorded: list, shared, rtol, atol,
                    y0, t0, batched, m):
    checks = Checks("solve_ensemble")
    y = initialise(plan.f, y0, t0, _merge_args(plan, batched, shared), m, rtol, atol,
                   initialize, checks)
    recorded.append(checks)
    return y, checks.first_failure()


@functools.partial(jax.jit, static_argnums=(0, 1))
def _initialise_members(plan: _Plan, initialize: str, y0s, t0s, batched, shared, m, rtol,
                        atol):
    """``solve``'s ``initialize=`` (:func:`simlib._dae.initialise`) for every member, under
    ``vmap``: the members' ``y0`` (consistent ones for ``"consistent"``) and the first
    failing check of each, ``(code, which, index, value)`` (code 0: none)."""
    one = functools.partial(_initialise_one, plan, initialize, [], shared, rtol, atol)
    return jax.vmap(one, in_axes=(0, 0, 0, 0 if plan.mass_batched else None))(
        y0s, t0s, batched, m)


def _initialise_checks(plan: _Plan, initialize: str, *operands) -> Checks:
    """The checks :func:`_initialise_members` makes (their messages), traced anew."""
    recorded: list = []
    y0s, t0s, batched, shared, m, rtol, atol = operands
    one = functools.partial(_initialise_one, plan, initialize, recorded, shared, rtol, atol)
    jax.eval_shape(jax.vmap(one, in_axes=(0, 0, 0, 0 if plan.mass_batched else None)),
                   y0s, t0s, batched, m)
    return recorded[0]


def _bucket(live: int, size: int, min_bucket: int) -> int:
    """The bucket for ``live`` members: the smallest power of two holding them (at least
    ``min_bucket``), never larger than the current ``size``."""
    return min(size, max(min_bucket, 1 << max(0, live - 1).bit_length()))


# ---- the entry point

def solve_ensemble(
    f: VectorField,
    y0s: PyTree,
    t0: Any,
    t1: Any,
    *,
    solver: AbstractSolver,
    rtol: float | None = None,
    atol: float | None = None,
    dt: float | None = None,
    args: Any = None,
    args_axes: Any = None,
    saveat: SaveAt = SAVE_T1,
    max_steps: int = DEFAULT_MAX_STEPS,
    throw: bool = True,
    controller: PIDController | None = None,
    chunk_steps: int = 64,
    min_bucket: int = 64,
    progress: bool = False,
    mass_matrix: Any = None,
    mass_axes: int | None = None,
    initialize: str = "check",
    **unknown: Any,
) -> Solution:
    """An adaptive :func:`solve` of every member of an ensemble, finished members dropped
    as the others go on.

    The result equals ``jax.vmap`` of :func:`solve` over the members (the same step
    attempts, statistics and status codes per member; values to round-off), but a member
    stops costing anything once it is done. Under ``vmap`` an adaptive solve is one
    batched loop that runs every member until the slowest one finishes; here the members
    advance in chunks of at most ``chunk_steps`` step attempts, each chunk one compiled
    call over the members still running. Between chunks the host counts the live
    members, and when they fit a smaller power-of-two bucket it packs them into it, so
    only ``log2(n)`` bucket sizes ever compile. Worth it when step counts differ widely
    (a few long members among many short ones); on an even ensemble it costs a little
    (docs/ensembles.md, "Uneven ensembles", has the measured figures).

    Eager only: the host decides between chunks, so it cannot run under ``jax.jit``,
    ``jax.vmap`` or ``jax.grad`` (use ``jax.vmap(solve)`` or :func:`ensemble` there).
    It runs on JAX's default device.

    Args:
        f: Vector field ``f(t, y, args)``, as for :func:`solve`.
        y0s: The members' initial states: a pytree whose leaves have a leading member
            axis of length ``n``.
        t0, t1: Start and end times: scalars shared by all members, or arrays of shape
            ``(n,)``, one per member.
        solver: An adaptive solver instance, e.g. ``simlib.Tsit5()``.
        rtol, atol: Tolerances, shared by all members (one stands in for the other when
            missing; at least one is needed).
        dt: The first step, shared by all members (default: chosen per member, as in
            :func:`solve`).
        args: Parameters passed to ``f``.
        args_axes: Which leaves of ``args`` are per member, like ``jax.vmap``'s
            ``in_axes``: ``None`` (default: ``args`` shared), ``0`` (every leaf has a
            leading member axis), or a pytree prefix of ``args`` of ``0`` and ``None``.
        saveat: ``SaveAt(t1=True)`` (default) or ``SaveAt(ts=...)`` (times shared by all
            members, within every member's span), optionally with ``t0=True``.
            ``SaveAt(steps=True)`` is not supported.
        max_steps: Bound on each member's step attempts, as for :func:`solve`.
        throw: Raise :class:`SolverError` naming the first failing member (default).
            With ``False`` every member's code is in ``Solution.result``.
        controller: The step-size controller, shared by all members, as for
            :func:`solve` (default: ``PIDController()``).
        chunk_steps: Step attempts per chunk (per member). Smaller chunks drop finished
            members sooner but pay a host round trip per chunk.
        min_bucket: The smallest bucket; fewer live members than this run in it padded.
        progress: Show the members finished so far, updated between chunks (a tqdm bar
            on a terminal, plain lines otherwise; see :mod:`simlib.progress`).
        mass_matrix: A constant ``M`` of a DAE ``M y' = f(t, y, args)``, shared by all
            members: an ``(n,)`` diagonal or an ``(n, n)`` matrix on one member's
            flattened state, with the same solvers and checks as :func:`solve`
            (docs/dae.md); with ``mass_axes=0``, one per member stacked on a leading
            member axis, ``(members, n)`` or ``(members, n, n)``. A bad ``M`` raises
            ``ValueError`` at once.
        mass_axes: ``None`` (default: ``mass_matrix`` shared) or ``0`` (its leading axis
            is the members', like ``args_axes``).
        initialize: With a singular ``mass_matrix``, as for :func:`solve`, per member:
            ``"check"`` (default), ``"consistent"`` or ``"none"``. A member whose start
            is refused (inconsistent ``y0``, Newton not converged, not index 1) never
            runs: with ``throw=False`` its ``result`` is
            ``Result.INCONSISTENT_INITIAL_CONDITIONS`` and its outputs NaN (as
            ``jax.vmap(solve)`` gives it), the other members unaffected; with
            ``throw=True`` a :class:`SolverError` names it before any member runs.

    Returns:
        A :class:`Solution` batched over the members, in their original order: what
        ``jax.vmap(solve)`` returns (``ts``/``ys`` with a leading member axis, each
        ``stats`` entry and ``result`` of shape ``(n,)``).

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> decay = lambda t, y, k: -k * y
        >>> sol = sl.solve_ensemble(decay, jnp.ones((4, 1)), 0.0, jnp.array([1.0, 1.0, 1.0, 8.0]),
        ...                         solver=sl.Tsit5(), rtol=1e-8, atol=1e-10, args=0.5)
        >>> round(float(sol.ys[3, -1, 0]), 6)  # exp(-4)
        0.018316
    """
    check_keywords("solve_ensemble", unknown)
    chunk_steps = check_count(chunk_steps, "chunk_steps")
    min_bucket = check_count(min_bucket, "min_bucket")
    p = _normalise(f, y0s, t0, t1, solver=solver, rtol=rtol, atol=atol, dt=dt, args=args,
                   saveat=saveat, max_steps=max_steps, throw=throw, controller=controller,
                   progress=progress, mass_matrix=mass_matrix, initialize=initialize)
    _check_mass_axes(mass_axes, mass_matrix)
    plan, batched, shared = _plan(p, args_axes)
    n, max_steps, tdtype, ts, y0s = p.members, p.max_steps, p.tdtype, p.ts, p.y0
    t0s, t1s = jnp.asarray(p.t0, tdtype), jnp.asarray(p.t1, tdtype)
    rtol_a, atol_a = jnp.asarray(p.rtol, tdtype), jnp.asarray(p.atol, tdtype)
    codes = jnp.zeros((n,), jnp.int32)
    if mass_matrix is not None:  # a DAE: solve's checks and initialisation, per member
        plan, y0s, batched, shared, codes = _start_dae(p, plan, mass_matrix, mass_axes == 0,
                                                       initialize, t0s, batched, shared,
                                                       rtol_a, atol_a)
    dt0 = None if dt is None else jnp.asarray(dt, tdtype)
    # traced: changing the chunk length or the step budget compiles nothing
    budget, limit = jnp.asarray(chunk_steps, jnp.int32), jnp.asarray(max_steps, jnp.int32)
    members, out = _init(plan, y0s, t0s, t1s, batched, shared, dt0, rtol_a, atol_a, codes)
    slots = np.arange(n, dtype=np.int32)   # the original index of each bucket slot (n: pad)
    with progress_bar(progress, n, "solve_ensemble", unit="member") as shown:
        while True:
            members, live = _chunk(plan, members, shared, ts, rtol_a, atol_a, budget, limit)
            live = np.asarray(live)
            n_live = int(live.sum())
            shown.set(n - n_live)
            size = len(slots)
            new_size = _bucket(n_live, size, min_bucket) if n_live else 0
            if new_size == size:
                continue
            keep = np.flatnonzero(live)
            if new_size:  # pad with finished members (they do nothing), dropped when written
                keep = np.concatenate([keep, np.flatnonzero(~live)[:new_size - n_live]])
            else:
                keep = keep[:0]
            out, members = _repack(plan, out, members, jnp.asarray(slots), jnp.asarray(keep))
            if not new_size:
                break
            slots = np.where(np.arange(new_size) < n_live, slots[keep], n).astype(np.int32)
    sol = _finish(plan, bool(saveat.t0), max_steps, out, y0s, t0s, t1s, ts, codes)
    if p.throw:
        _raise_first_failure(sol, p.t1, max_steps)
    return sol


def _normalise(f: VectorField, y0s: Any, t0: Any, t1: Any, *, solver: Any, rtol: Any,
               atol: Any, mass_matrix: Any, initialize: Any, **common: Any) -> Problem:
    """``solve``'s normalisation and checks (:func:`simlib._arguments.normalise` and
    :func:`~simlib._arguments.complete`) for an ensemble: an adaptive ODE solver, at least
    one tolerance, eager only, ``SaveAt(t1=True)`` or ``SaveAt(ts=...)``, the members'
    spans and save times."""
    check_solver(solver)
    if isinstance(solver, AbstractSDESolver):
        raise TypeError("solver must be an adaptive simlib ODE solver instance such as "
                        f"simlib.Tsit5(), got {solver!r}")
    if not solver.adaptive:
        raise ValueError(f"solve_ensemble needs an adaptive solver (an embedded error "
                         f"estimate), and {type(solver).__name__} has none; use Tsit5, "
                         "Dopri5, ... or jax.vmap(solve) for fixed steps")
    check_callable(f, "f")
    if rtol is None and atol is None:
        raise ValueError("solve_ensemble is adaptive: give rtol and/or atol")
    check_initialize(initialize, mass_matrix)
    saveat = common["saveat"]
    if is_tracer((y0s, t0, t1, rtol, atol, common["dt"], common["args"], mass_matrix,
                  saveat.ts if isinstance(saveat, SaveAt) else None)) or inside_trace():
        raise TypeError("solve_ensemble runs eagerly (the host drops finished members between "
                        "compiled chunks), so it cannot be traced by jax.jit, jax.vmap or "
                        "jax.grad; call it outside them, or use jax.vmap(solve) there")
    if check_saveat(saveat) == "steps":
        raise ValueError("saveat: solve_ensemble supports SaveAt(t1=True) and SaveAt(ts=...), "
                         "not SaveAt(steps=True) (max_steps rows per member)")
    # eager only: a bad value raises ValueError at once
    p = normalise("solve_ensemble", f, y0s, t0, t1, solver=solver, rtol=rtol, atol=atol,
                  members=True, **common)
    return complete(p)


def _plan(p: Problem, args_axes: Any) -> tuple[_Plan, list, list]:
    """The run's :class:`_Plan`, with ``args`` split by ``args_axes`` into the per-member
    (batched) leaves and the shared ones, and ``f`` checked on one member's state."""
    n, args = p.members, p.args
    args_leaves, args_tree = jax.tree_util.tree_flatten(args)
    try:
        axes = jax.tree_util.tree_map(
            lambda ax, sub: jax.tree_util.tree_map(lambda _: ax, sub), args_axes, args,
            is_leaf=lambda x: x is None)
        axes_leaves = jax.tree_util.tree_structure(args).flatten_up_to(axes)
    except (ValueError, TypeError) as err:
        raise ValueError(f"args_axes must be None, 0 or a pytree prefix of args of 0 and "
                         f"None, got {args_axes!r}: {err}") from err
    if any(ax not in (0, None) for ax in axes_leaves):
        raise ValueError(f"args_axes entries must be 0 (per member) or None (shared), got "
                         f"{args_axes!r}")
    batched_flags = tuple(ax == 0 for ax in axes_leaves)
    batched, shared = [], []
    for leaf, b in zip(args_leaves, batched_flags, strict=True):
        if b:
            leaf = jnp.asarray(leaf)
            if leaf.ndim == 0 or leaf.shape[0] != n:
                raise ValueError(f"args_axes marks a leaf of args as per member, but its shape "
                                 f"is {leaf.shape}, not ({n}, ...)")
            batched.append(leaf)
        else:
            shared.append(leaf)
    plan = _Plan(None, None, None, 0, args_tree, batched_flags, False)
    one_args = _merge_args(plan, [jax.ShapeDtypeStruct(x.shape[1:], x.dtype) for x in batched],
                           shared)
    f = check_field(p.f, _one_member(p.y0), one_args, p.tdtype, where=" for one member")
    plan = _Plan(f, p.solver, p.mode, p.n_save, args_tree, batched_flags, p.dt is not None,
                 controller=DEFAULT_CONTROLLER if p.controller is None else p.controller)
    return plan, batched, shared


def _one_member(y0s: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), y0s)


def _check_mass_axes(mass_axes: Any, mass_matrix: Any) -> None:
    if mass_axes is not None and (isinstance(mass_axes, bool) or mass_axes != 0):
        raise ValueError(f"mass_axes must be None (mass_matrix shared by the members) or 0 "
                         f"(one mass_matrix per member on its leading axis), got "
                         f"{mass_axes!r}")
    if mass_axes is not None and mass_matrix is None:
        raise ValueError("mass_axes=0 applies to a DAE: give mass_matrix")


def _start_dae(p: Problem, plan: _Plan, mass_matrix: Any, per_member: bool,
               initialize: str, t0s, batched, shared, rtol,
               atol) -> tuple[_Plan, PyTree, list, list, jax.Array]:
    """``solve``'s mass-matrix checks and ``initialize=`` for every member:
    ``(plan, y0s, batched, shared, codes)`` with ``f`` a :class:`MassField`, ``M`` the
    last shared leaf (``per_member``: the last batched one, ``M`` stacked on a leading
    member axis) and each member's refusal code (0: none); with ``throw`` a refused member
    raises :class:`SolverError` naming it."""
    flat = jax.eval_shape(lambda y: jax.flatten_util.ravel_pytree(y)[0], _one_member(p.y0))
    m, m_fmt = prepare_mass(mass_matrix, p.solver, flat.size, flat.dtype, p.checks,
                            members=p.members if per_member else None)
    operands = (p.y0, t0s, batched, shared, m, rtol, atol)
    plan = plan._replace(mass_batched=per_member)
    key = plan._replace(solver=None, mode=None, n_save=0)  # compiled once per f
    y0s, (codes, which, index, value) = _initialise_members(key, initialize, *operands)
    if p.throw and bool(jnp.any(codes != 0)):
        bad = np.flatnonzero(np.asarray(codes))
        i = int(bad[0])
        message = _initialise_checks(key, initialize, *operands).message(
            int(which[i]), int(index[i]), float(value[i]))
        raise SolverError(f"solve_ensemble: member {i} (of {bad.size} refused of "
                          f"{p.members}): " + message, Result(int(codes[i])), member=i)
    plan = plan._replace(f=MassField(plan.f), mass=True)
    if per_member:
        return plan, y0s, [*batched, m_fmt], shared, codes
    return plan, y0s, batched, [*shared, m_fmt], codes


def _raise_first_failure(sol: Solution, t1s: np.ndarray, max_steps: int) -> None:
    """Raise the :class:`SolverError` of the first failing member, if any."""
    codes = np.asarray(sol.result)
    bad = np.flatnonzero(codes != 0)
    if bad.size:
        i = int(bad[0])
        message = result_message(int(codes[i]), t=float(sol.stats["t_final"][i]),
                                 step=int(sol.stats["num_steps"][i]), t1=float(t1s[i]),
                                 max_steps=max_steps)
        raise SolverError(f"solve_ensemble: member {i} (of {bad.size} failing of "
                          f"{codes.size}): " + message, Result(int(codes[i])), sol)
