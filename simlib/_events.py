"""Events: ``solve(..., events=Event(cond, ...))`` locates the zeros of ``cond(t, y, args)``
along the numerical solution, records them, stops the run or changes the state there.

After every accepted step ``[t, t + h]`` the drivers evaluate each ``cond`` at the step end;
a sign change (in the event's direction) brackets a crossing, which the Illinois variant of
regula falsi (Dowell and Jarratt, BIT 11, 1971) locates on the step's dense output
``y(t + theta h)``: ``phi(theta) = cond(t + theta h, y(t + theta h))`` on ``theta in [0, 1]``,
to a bracket of a few ulps. The root finder runs on ``stop_gradient``-ed inputs; one Newton
correction ``theta* - phi(theta*) / stop_gradient(phi'(theta*))`` then carries the
derivative of the implicit function theorem, ``dt*/dp = -(d cond/dp) / (d cond/dt)``, so
the event time and the states after it are differentiable with respect to ``y0`` and
``args`` (and anything ``cond``/``apply``/``f`` close over).

See docs/events.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from ._solution import Solution
from ._solver._base import PyTree
from ._util import buffer, convert_closure, tree_where

_MAX_ROOT_ITERATIONS = 100  # >= 50 halvings with the bisection safeguard


class Event:
    """An event: a zero of the scalar ``cond(t, y, args)`` along the solution.

    Args:
        cond: ``cond(t, y, args) -> scalar``; the event happens where it crosses zero.
        terminal: End the run at the (first) crossing: the solution's final time and
            state are those of the event, values saved at later times are ``nan``.
        direction: ``+1``: only rising crossings (``cond`` from negative to
            non-negative); ``-1``: only falling ones; ``0``: both.
        apply: ``apply(t, y, args) -> y_new``: at the crossing the state is replaced
            by ``y_new`` and the run continues from there (the solver restarts: its
            carried state is rebuilt with ``init``; the step-size controller goes on).
            With ``terminal=True`` the run ends with the state ``y_new``.
        capacity: How many crossings are recorded (times and states); the default is 1
            for a terminal event and 16 otherwise. More crossings than that set
            ``Result.EVENT_CAPACITY_EXCEEDED`` (and raise with ``throw=True``); the
            run itself goes on.

    Events compare and hash by their fields (functions by identity): they are static
    arguments of the compiled solve, like the vector field.
    """

    __slots__ = ("apply", "capacity", "cond", "direction", "terminal")

    def __init__(self, cond: Callable[[Any, PyTree, Any], Any], terminal: bool = True,
                 direction: int = 0, apply: Callable[[Any, PyTree, Any], PyTree] | None = None,
                 capacity: int | None = None) -> None:
        if not callable(cond):
            raise TypeError(f"Event: cond must be callable as cond(t, y, args), got {cond!r}")
        if not isinstance(terminal, bool):
            raise ValueError(f"Event: terminal must be True or False, got {terminal!r}")
        if isinstance(direction, bool) or direction not in (-1, 0, 1):
            raise ValueError(
                f"Event: direction must be +1 (rising), -1 (falling) or 0 (either), "
                f"got {direction!r}")
        if apply is not None and not callable(apply):
            raise TypeError(
                f"Event: apply must be None or callable as apply(t, y, args) -> y, got "
                f"{apply!r}")
        if capacity is None:
            capacity = 1 if terminal else 16
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"Event: capacity must be a positive integer, got {capacity!r}")
        object.__setattr__(self, "cond", cond)
        object.__setattr__(self, "terminal", terminal)
        object.__setattr__(self, "direction", int(direction))
        object.__setattr__(self, "apply", apply)
        object.__setattr__(self, "capacity", capacity)

    def __setattr__(self, name, value):
        raise AttributeError("Event is immutable")

    def _key(self):
        return (self.cond, self.terminal, self.direction, self.apply, self.capacity)

    def __eq__(self, other) -> bool:
        return isinstance(other, Event) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Event(cond={self.cond!r}, terminal={self.terminal}, "
                f"direction={self.direction}, apply={self.apply!r}, "
                f"capacity={self.capacity})")


class EventRecord(NamedTuple):
    """The crossings of one event, in ``Solution.events``.

    Attributes:
        ts: Crossing times, shape ``(capacity,)``; unused rows are ``inf``.
        ys: States at the crossings (before ``apply``): ``y0``'s pytree with a leading
            ``capacity`` axis; unused rows are ``inf``.
        count: Number of crossings found (it may exceed ``capacity``: then only the first
            ``capacity`` are recorded and the run reports
            ``Result.EVENT_CAPACITY_EXCEEDED``).
    """

    ts: jax.Array
    ys: PyTree
    count: jax.Array


def as_events(events: Event | Sequence[Event] | None) -> tuple[Event, ...] | None:
    """``solve``'s ``events=`` argument as a tuple of :class:`Event` (``None``: none)."""
    if events is None:
        return None
    if isinstance(events, Event):
        return (events,)
    if isinstance(events, list | tuple):
        events = tuple(events)
        if not events:
            return None
        for i, ev in enumerate(events):
            if not isinstance(ev, Event):
                raise TypeError(f"events[{i}] must be a simlib.Event, got {ev!r}")
        return events
    raise TypeError(f"events must be a simlib.Event or a list of them, got {events!r}")


def check_events(events: tuple[Event, ...], y0: PyTree, args: Any, tdtype: Any) -> None:
    """Check each ``cond`` returns a scalar and each ``apply`` a state like ``y0``."""
    t = jax.ShapeDtypeStruct((), tdtype)
    struct = jax.tree_util.tree_structure(y0)
    for i, ev in enumerate(events):
        try:
            out = jax.eval_shape(ev.cond, t, y0, args)
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise TypeError(f"events[{i}]: calling cond(t0, y0, args) failed: {err}") from err
        leaves = jax.tree_util.tree_leaves(out)
        if len(leaves) != 1 or leaves[0].shape != () or not jnp.issubdtype(
                leaves[0].dtype, jnp.floating):
            raise ValueError(
                f"events[{i}]: cond must return a real scalar, got {out!r}")
        if ev.apply is None:
            continue
        try:
            new = jax.eval_shape(ev.apply, t, y0, args)
        except Exception as err:  # noqa: BLE001
            raise TypeError(f"events[{i}]: calling apply(t0, y0, args) failed: {err}") from err
        if jax.tree_util.tree_structure(new) != struct or any(
                a.shape != b.shape for a, b in zip(jax.tree_util.tree_leaves(new),
                                                   jax.tree_util.tree_leaves(y0), strict=True)):
            raise ValueError(
                f"events[{i}]: apply must return a state shaped like y0, got {new!r}")


@jax.tree_util.register_pytree_node_class
class EventSet:
    """The events of one run inside the compiled core: ``cond``/``apply`` closure-converted
    (values they close over become leaves, so a ``custom_vjp`` sees them), with the
    user's ``args`` carried along as a leaf as well."""

    def __init__(self, specs: tuple, args: Any, consts: tuple) -> None:
        self.specs = specs  # per event: (cond, apply, terminal, direction, capacity)
        self.args = args
        self.consts = consts  # per event: (cond_consts, apply_consts)

    @classmethod
    def convert(cls, events: tuple[Event, ...], t: Any, y: PyTree, args: Any) -> EventSet:
        specs, consts = [], []
        for ev in events:
            cond, (_, cc) = convert_closure(ev.cond, t, y, args)
            if ev.apply is not None:
                apply, (_, ac) = convert_closure(ev.apply, t, y, args)
            else:
                apply, ac = None, ()
            specs.append((cond, apply, ev.terminal, ev.direction, ev.capacity))
            consts.append((cc, ac))
        return cls(tuple(specs), args, tuple(consts))

    def tree_flatten(self) -> tuple[tuple, tuple]:
        return (self.args, self.consts), self.specs

    @classmethod
    def tree_unflatten(cls, specs: tuple, children: tuple) -> EventSet:
        return cls(specs, *children)

    def __len__(self) -> int:
        return len(self.specs)

    @property
    def has_apply(self) -> bool:
        return any(s[1] is not None for s in self.specs)

    def cond(self, i: int, t: Any, y: PyTree) -> jax.Array:
        return jnp.asarray(self.specs[i][0](t, y, (self.args, self.consts[i][0])))

    def apply(self, i: int, t: Any, y: PyTree) -> PyTree:
        return self.specs[i][1](t, y, (self.args, self.consts[i][1]))

    def conds(self, t: Any, y: PyTree, dtype: Any) -> jax.Array:
        return jnp.stack([self.cond(i, t, y).astype(dtype) for i in range(len(self))])


class EventState(NamedTuple):
    """What the drivers carry for the events: the last values of the conditions, the
    records, the crossing counts and whether a terminal event stopped the run."""

    g: jax.Array  # (n_events,) cond at the current (t, y)
    ts: tuple  # per event (capacity + 1,): the last row takes writes beyond capacity
    ys: tuple
    counts: jax.Array  # (n_events,) int32
    stopped: jax.Array  # bool
    n_restarts: jax.Array  # int32: how often ``apply`` restarted the solver


def init_state(es: EventSet, t0: Any, y0: PyTree) -> EventState:
    tdtype = jnp.result_type(t0)
    return EventState(
        g=es.conds(t0, y0, tdtype),
        ts=tuple(jnp.full((s[4] + 1,), jnp.inf, tdtype) for s in es.specs),
        ys=tuple(buffer(y0, s[4] + 1, jnp.inf) for s in es.specs),
        counts=jnp.zeros((len(es),), jnp.int32),
        stopped=jnp.asarray(False),
        n_restarts=jnp.asarray(0, jnp.int32),
    )


def records(es: EventSet, ev: EventState) -> tuple[EventRecord, ...]:
    """The per-event records of a finished run (the overflow rows dropped)."""
    return tuple(
        EventRecord(ts[:s[4]], jax.tree_util.tree_map(lambda b, c=s[4]: b[:c], ys), ev.counts[i])
        for i, (s, ts, ys) in enumerate(zip(es.specs, ev.ts, ev.ys, strict=True)))


def overflowed(es: EventSet, ev: EventState) -> jax.Array:
    caps = jnp.asarray([s[4] for s in es.specs], jnp.int32)
    return jnp.any(ev.counts > caps)


def _illinois(phi, fa, fb, active, dtype):
    """A zero of ``phi`` on ``[0, 1]`` bracketed by ``phi(0) = fa``, ``phi(1) = fb`` of
    opposite signs (or ``fb = 0``): regula falsi with the Illinois modification (Dowell and
    Jarratt 1971), with a bisection step whenever two steps in a row failed to halve the
    bracket, stopped when the bracket is a few ulps wide. ``active=False`` returns 1 at
    once (under ``vmap`` the members without a crossing do not iterate).

    ``fa`` only gives the sign at 0 when it is tiny against ``fb`` (after an event, the
    condition restarts from its zero): its magnitude is then taken as ``|fb|``, so the
    first point is the midpoint rather than one next to the zero just left.
    """
    tol = 4 * jnp.finfo(dtype).eps
    fa = fa.astype(dtype)
    fb = fb.astype(dtype)
    fa = jnp.where(jnp.abs(fa) < 1e-3 * jnp.abs(fb), jnp.sign(fa) * jnp.abs(fb), fa)

    def cont(s):
        a, b, fa, fb, n, _, _ = s
        return (n < _MAX_ROOT_ITERATIONS) & (b - a > tol) & (fa != 0) & (fb != 0)

    def body(s):
        a, b, fa, fb, n, side, poor = s
        denom = fb - fa
        c = jnp.where(denom != 0, b - fb * (b - a) / jnp.where(denom != 0, denom, 1.0),
                      0.5 * (a + b))
        c = jnp.where(poor >= 2, 0.5 * (a + b), jnp.clip(c, a, b))
        fc = phi(c)
        same_as_b = jnp.sign(fc) == jnp.sign(fb)
        # fc replaces the endpoint of its sign; if the same endpoint is kept twice in a
        # row, its value is halved (the Illinois step), which forces the bracket to shrink.
        a_new = jnp.where(same_as_b, a, c)
        fa_new = jnp.where(same_as_b, jnp.where(side == 1, 0.5 * fa, fa), fc)
        b_new = jnp.where(same_as_b, c, b)
        fb_new = jnp.where(same_as_b, fc, jnp.where(side == -1, 0.5 * fb, fb))
        side_new = jnp.where(same_as_b, 1, -1).astype(jnp.int32)  # 1: b moved last, -1: a
        halved = (b_new - a_new) <= 0.5 * (b - a)
        poor_new = jnp.where(halved, 0, poor + 1).astype(jnp.int32)
        return a_new, b_new, fa_new, fb_new, n + 1, side_new, poor_new

    a0 = jnp.where(active, 0.0, 1.0).astype(dtype)
    i0 = jnp.asarray(0, jnp.int32)
    a, b, fa, fb, _, _, _ = lax.while_loop(
        cont, body, (a0, jnp.asarray(1.0, dtype), fa, fb, i0, i0, i0))
    return jnp.where(fa == 0, a, jnp.where(fb == 0, b, jnp.where(jnp.abs(fa) < jnp.abs(fb),
                                                                  a, b)))


def _crossed(direction: int, prev, new):
    rising = (prev < 0) & (new >= 0)
    falling = (prev > 0) & (new <= 0)
    if direction > 0:
        return rising
    if direction < 0:
        return falling
    return rising | falling


def after_step(es: EventSet, ev: EventState, accept: jax.Array, t: jax.Array, h: jax.Array,
               t_end: jax.Array, y1: PyTree, interp: Callable[[jax.Array, PyTree], PyTree],
               data: PyTree, prepare: Callable[[PyTree], PyTree] | None = None
               ) -> tuple[jax.Array, PyTree, jax.Array, EventState]:
    """Event handling after a step attempt ``[t, t + h]``; ``(t_end, y1)`` is where the
    run stands after it (the step's end if it was accepted, else where it started).

    ``interp(theta, data)`` is the step's dense output ``y(t + theta h)``; ``data`` (a
    pytree: the step's start, end, stages...) is what it differentiates through;
    ``prepare(data)``, if given, is applied to it once before root finding (e.g. to
    evaluate ``f`` at the step's ends for a Hermite interpolant).

    Returns ``(t_out, y_out, restart, ev)``: the time and state the run continues from
    (``(t_end, y1)`` unless an event with ``apply`` or a terminal event acted in the
    step), whether the solver must restart there, and the new event state.
    """
    tdtype = jnp.result_type(t_end)
    g_new = es.conds(t_end, y1, tdtype)
    hit = jnp.stack([_crossed(s[3], ev.g[i], g_new[i]) for i, s in enumerate(es.specs)])
    hit = hit & accept & ~ev.stopped

    # Most steps cross nothing: they only update the conditions (outside vmap the
    # branch below is skipped; under vmap both run, masked).
    def quiet(_):
        return t_end, y1, jnp.asarray(False), ev._replace(g=g_new)

    def crossing(_):
        if prepare is not None:
            located = _locate(es, t, h, interp, prepare(data), ev.g, g_new, hit, tdtype)
        else:
            located = _locate(es, t, h, interp, data, ev.g, g_new, hit, tdtype)
        return _handle_crossing(es, ev, t_end, y1, g_new, hit, located, tdtype)

    return lax.cond(jnp.any(hit), crossing, quiet, None)


def _locate(es: EventSet, t, h, interp: Callable, data: PyTree, g_prev, g_new, hit, tdtype):
    """``(thetas, tcs, ycs)``: for each event, its crossing in the step as a fraction
    ``theta`` of it, as a time and as a state (stacked along a leading event axis).

    The root is found on ``stop_gradient``-ed inputs (:func:`_illinois`); one Newton
    correction on the live inputs then leaves the primal (almost) unchanged and gives
    the derivative of the implicit function theorem.
    """
    sg_data, sg_es = lax.stop_gradient((data, es))
    thetas, tcs, ycs = [], [], []
    for i in range(len(es)):
        def phi(theta, i=i):
            y = interp(theta, sg_data)
            return sg_es.cond(i, t + theta * h, y).astype(tdtype)

        th = _illinois(phi, lax.stop_gradient(g_prev[i]), lax.stop_gradient(g_new[i]), hit[i],
                       tdtype)
        th = lax.stop_gradient(th)
        # One Newton correction on the live inputs: the primal barely moves, the
        # derivative is the implicit function theorem's. One jvp in theta gives
        # y(th), y'(th), phi(th) and phi'(th); the state at th_c is y(th) +
        # (th_c - th) y'(th) (exact to O((th_c - th)^2) in value, exact in derivative).
        def y_phi(x, i=i):
            y = interp(x, data)
            return y, es.cond(i, t + x * h, y).astype(tdtype)

        (y_th, phi_th), (dy_th, slope) = jax.jvp(y_phi, (th,), (jnp.ones_like(th),))
        slope = lax.stop_gradient(slope)
        safe = jnp.where(slope != 0, slope, 1.0)
        step = jnp.where(slope != 0, -phi_th / safe, 0.0)
        dy_th = lax.stop_gradient(dy_th)
        thetas.append(th)
        tcs.append(t + (th + step) * h)
        ycs.append(jax.tree_util.tree_map(lambda a, d, s=step: a + s.astype(a.dtype) * d,
                                          y_th, dy_th))
    return jnp.stack(thetas), jnp.stack(tcs), jax.tree_util.tree_map(
        lambda *x: jnp.stack(x), *ycs)


# Under vmap an index that differs per member turns a gather or an in-place update into a
# (slow, on CPU) gather/scatter; the indices below select among a handful of events or
# record rows, so they are written as masks instead.


def _row(tree: PyTree, i: int) -> PyTree:
    return jax.tree_util.tree_map(lambda x: x[i], tree)


def _pick(tree: PyTree, index, n: int) -> PyTree:
    """``tree[index]`` along the leading (event) axis of length ``n``, by masks."""
    def leaf(x):
        out = x[0]
        for j in range(1, n):
            out = jnp.where(index == j, x[j], out)
        return out
    return jax.tree_util.tree_map(leaf, tree)


def _put_row(buf: PyTree, slot, value: PyTree) -> PyTree:
    """``buf.at[slot].set(value)`` by a mask over the rows."""
    def leaf(b, v):
        mask = (jnp.arange(b.shape[0]) == slot).reshape((-1,) + (1,) * v.ndim)
        return jnp.where(mask, v.astype(b.dtype)[None], b)
    return jax.tree_util.tree_map(leaf, buf, value)


def _handle_crossing(es: EventSet, ev: EventState, t_end, y1: PyTree, g_new, hit, located,
                     tdtype):
    """:func:`after_step` for a step with crossings ``hit``, located at ``located``: record
    the crossings up to the first acting one (terminal or with ``apply``) and act on it."""
    thetas, tcs, ycs = located
    n = len(es)
    acts = [s[2] or s[1] is not None for s in es.specs]
    acting = hit & jnp.asarray(acts)
    any_act = jnp.any(acting) if any(acts) else jnp.asarray(False)
    first = jnp.argmin(jnp.where(acting, thetas, jnp.inf))
    theta_first = jnp.where(any_act, _pick(thetas, first, n), jnp.inf)
    record = hit & (thetas <= theta_first)

    ts_buf, ys_buf = [], []
    for i, s in enumerate(es.specs):
        slot = jnp.where(record[i], jnp.minimum(ev.counts[i], s[4]), s[4])
        ts_buf.append(_put_row(ev.ts[i], slot, tcs[i]))
        ys_buf.append(_put_row(ev.ys[i], slot, _row(ycs, i)))
    counts = ev.counts + record.astype(jnp.int32)

    if not any(acts):
        new = EventState(g_new, tuple(ts_buf), tuple(ys_buf), counts, ev.stopped,
                         ev.n_restarts)
        return t_end, y1, jnp.asarray(False), new

    t_star = _pick(tcs, first, n)
    y_after, g_after = _act(es, ev, first, t_star, _pick(ycs, first, n), tdtype)
    terminal = _pick(jnp.asarray([s[2] for s in es.specs]), first, n)
    has_apply = _pick(jnp.asarray([s[1] is not None for s in es.specs]), first, n)
    t_out = jnp.where(any_act, t_star, t_end)
    y_out = tree_where(any_act, y_after, y1)
    stopped = ev.stopped | (any_act & terminal)
    restart = any_act & has_apply & ~terminal
    new = EventState(jnp.where(any_act, g_after, g_new), tuple(ts_buf), tuple(ys_buf),
                     counts, stopped, ev.n_restarts + restart.astype(jnp.int32))
    return t_out, y_out, restart, new


def _act(es: EventSet, ev: EventState, first, t_star, y_star: PyTree, tdtype):
    """The state after the first acting event ``first`` (its ``apply``, if any) and the
    conditions there."""
    n = len(es)
    y_after = y_star
    for i, s in enumerate(es.specs):
        if s[1] is not None:
            y_after = tree_where(first == i, es.apply(i, t_star, y_star), y_after)
    # cond after the event: the acting event's value is kept when apply put the state back
    # on the side it crossed from (a dose lifting a concentration over its threshold). Left
    # at its zero (a bounce), it is given the sign of that side with a tiny magnitude, so
    # that the next crossing in the same direction is seen even if one step covers the
    # whole arc (the root finder then starts from the midpoint, see _illinois).
    g_after = es.conds(t_star, y_after, tdtype)
    prev_first = _pick(ev.g, first, n)
    g_first = _pick(g_after, first, n)
    keep = jnp.sign(g_first) == jnp.sign(prev_first)
    g_after = jnp.where(jnp.arange(n) == first,
                        jnp.where(keep, g_first, jnp.sign(prev_first) * jnp.finfo(tdtype).tiny),
                        g_after)
    return y_after, g_after


def pack_events(sol: Solution) -> Solution:
    """``sol`` with the records' float parts moved into ``ys`` (``ForwardMode`` pushes
    tangents through ``ts`` and ``ys`` only); :func:`unpack_events` undoes it."""
    recs = sol.stats.get("events")
    if recs is None:
        return sol
    stats = dict(sol.stats, events=tuple(r.count for r in recs))
    packed = (sol.ys, tuple((r.ts, r.ys) for r in recs), sol.stats["t_final"])
    return type(sol)(sol.ts, packed, stats, sol.result)


def unpack_events(sol: Solution) -> Solution:
    counts = sol.stats.get("events")
    if counts is None:
        return sol
    ys, recs, t_final = sol.ys  # the stop time of a terminal event is differentiable too
    stats = dict(sol.stats, t_final=t_final,
                 events=tuple(EventRecord(ts, ys_, n)
                              for (ts, ys_), n in zip(recs, counts, strict=True)))
    return type(sol)(sol.ts, ys, stats, sol.result)
