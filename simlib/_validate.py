"""The argument checks of ``solve``, its SDE path and ``solve_ensemble``, each written once.

A check is a function ``test(xp, *operands) -> (mask, shown)`` of an array namespace:
``mask`` marks the bad elements and ``shown`` the values the message quotes. On concrete
operands it runs with NumPy and a bad value raises ``ValueError`` at once, naming the
argument and the value. On traced operands (a jitted loss taking the save times, a
``vmap`` over experiments) it runs with ``jax.numpy`` in the graph: the first failing
check becomes the run's :class:`~simlib.Result` code (``INVALID_SAVE_TIMES``,
``INVALID_TOLERANCE``, ``INVALID_TIME_ARGUMENT``, ``TIME_NOT_RESOLVED``, ``NONFINITE_Y0``,
``NONFINITE_ARGS``), the outputs become NaN, and with ``throw=True`` the in-graph check
raises :class:`~simlib.SolverError` with the same message as the eager refusal.

``args`` may hold ``inf`` (a rate bound, "no limit"), never NaN; ``y0`` neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._errors import Result, check_in_graph
from ._util import is_tracer

CODES = (Result.INVALID_SAVE_TIMES, Result.INVALID_TOLERANCE, Result.INVALID_TIME_ARGUMENT,
         Result.TIME_NOT_RESOLVED, Result.NONFINITE_Y0, Result.NONFINITE_ARGS,
         Result.INCONSISTENT_INITIAL_CONDITIONS, Result.INVALID_MASS_MATRIX)
"""The codes of invalid arguments found in the graph."""

RESOLUTION_ULPS = 16
"""The smallest step, in units of the time dtype's spacing at ``max(|t0|, |t1|)``
(``eps |t|``), that a run may take: below it each step's length is rounded by more than
1/16 of itself."""


class _Pending(NamedTuple):
    code: int
    message: str     # a template with {index} and {value}
    test: Callable   # a module-level function: jit's cache keys on it
    operands: tuple  # some of them traced


def _fmt(value) -> str:
    return repr(float(value))


class Checks:
    """The checks of one call: concrete ones raise at once, traced ones wait until
    :meth:`apply` evaluates them in the graph and ties them to the run's outputs."""

    def __init__(self, caller: str):
        self.caller = caller
        self.pending: list[_Pending] = []

    def __call__(self, code: Result, message: str, test: Callable, *operands) -> None:
        """Run ``test(xp, *operands) -> (mask, shown)``; ``message`` (a template with
        ``{index}``, the flat index of the first bad element, and ``{value}``, its shown
        value) is the refusal's text. ``None`` among the operands: nothing to check."""
        if any(x is None for x in operands):
            return
        if is_tracer(operands):
            self.pending.append(_Pending(int(code), message, test, operands))
            return
        mask, shown = test(np, *(np.asarray(x) for x in operands))
        shown = np.ravel(np.broadcast_to(shown, np.shape(mask)))
        mask = np.ravel(mask)
        if mask.size and mask.any():
            i = int(np.argmax(mask))
            raise ValueError(message.format(index=i, value=_fmt(shown[i])))

    def apply(self, sol, *, throw: bool, t1, max_steps: int):
        """``sol`` with the first failing traced check as its ``result`` (its outputs NaN),
        raised in the graph when ``throw``: one jitted call, so that an eager ``vmap``
        compiles the checks once instead of dispatching each operation."""
        if not self.pending:
            return sol
        plan = tuple((p.code, p.message, p.test) for p in self.pending)
        return _evaluate(tuple(p.operands for p in self.pending), sol, t1, plan=plan,
                         caller=self.caller, max_steps=max_steps, throw=bool(throw))


    def first_failure(self):
        """In the graph, without touching a run: ``(code, which, index, value)`` of the
        first failing pending check (``code`` 0: none), for a caller that reports each
        member on its own (``solve_ensemble``'s DAE initialisation under ``vmap``);
        :meth:`message` formats it."""
        return _first_failure(tuple(p.code for p in self.pending),
                              tuple(p.test for p in self.pending),
                              tuple(p.operands for p in self.pending))

    def message(self, which: int, index: int, value) -> str:
        """The refusal's text of pending check ``which`` (see :meth:`first_failure`)."""
        return self.pending[int(which)].message.format(index=int(index), value=_fmt(value))


def _first_failure(codes, tests, operands):
    """``(code, which, index, value)``: the first of the traced checks that fails (``code``
    0, ``which`` 0 when none does), the flat index and shown value of its first bad
    element."""
    if not tests:
        zero = jnp.int32(0)
        return zero, zero, zero, jnp.zeros((), jnp.result_type(float))
    found = [_first_bad(test, ops) for test, ops in zip(tests, operands, strict=True)]
    bads = jnp.stack([f[0] for f in found])
    which = jnp.argmax(bads).astype(jnp.int32)
    code = jnp.where(jnp.any(bads), jnp.asarray(codes, jnp.int32)[which], 0)
    index = jnp.stack([f[1] for f in found])[which]
    value = jnp.stack([f[2] for f in found])[which]
    return code, which, index, value


def _first_bad(test, operands):
    """``(any bad, index of the first bad element, its shown value)`` of a traced check."""
    mask, shown = test(jnp, *(jnp.asarray(x) for x in operands))
    shown = jnp.ravel(jnp.broadcast_to(jnp.asarray(shown), jnp.shape(mask)))
    mask = jnp.ravel(mask)
    if mask.size == 0:
        return jnp.array(False), jnp.int32(0), jnp.zeros((), jnp.result_type(float))
    i = jnp.argmax(mask).astype(jnp.int32)
    return jnp.any(mask), i, shown[i].astype(jnp.result_type(float))


@functools.partial(jax.jit, static_argnames=("plan", "caller", "max_steps", "throw"))
def _evaluate(operands, sol, t1, *, plan, caller, max_steps, throw):
    code, which, index, value = _first_failure(
        tuple(c for c, _, _ in plan), tuple(test for _, _, test in plan), operands)
    failed = code != 0

    def poison(x):
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            return x
        return jnp.where(failed, jnp.asarray(jnp.nan, x.dtype), x)

    result = jnp.where(code != 0, code, sol.result).astype(jnp.asarray(sol.result).dtype)
    t_final, n_steps = sol.stats["t_final"], sol.stats["num_steps"]
    stats = dict(sol.stats)
    stats["t_final"] = poison(t_final)
    sol = type(sol)(poison(sol.ts), jax.tree_util.tree_map(poison, sol.ys), stats, result)
    if not throw:
        return sol
    # one in-graph check for the run's failures and the arguments': a failed argument
    # check selects its own message (key 1000 + its place in the plan)
    key = jnp.where(code != 0, 1000 + which, result)
    messages = tuple((1000 + i, c, message, (("index", "d"), ("value", "r")))
                     for i, (c, message, _) in enumerate(plan))
    ts, ys, st, res = check_in_graph(
        tuple(sol), result, t_final, n_steps, t1, max_steps, caller,
        detail=(index, value), key=key, messages=messages)
    return type(sol)(ts, ys, st, res)


# ---- the checks, each written once

def _nonfinite(xp, x):
    return ~xp.isfinite(x), x


def _nan(xp, x):
    return xp.isnan(x), x


def _not_positive(xp, x):
    return ~(xp.isfinite(x) & (x > 0)), x


def _zero(xp, x):
    return x == 0, x


def leaf_paths(tree) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every array leaf of ``tree`` with a floating or complex dtype,
    the path as ``jax.tree_util.keystr`` writes it (``"[1]"``, ``"['k']"``)."""
    out = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, bool | int | float | complex | np.ndarray | np.generic | jax.Array
                      | jax.core.Tracer):
            if jnp.issubdtype(jnp.result_type(leaf), jnp.inexact):
                out.append((jax.tree_util.keystr(path), leaf))
    return out


def check_state(checks: Checks, y0, name: str = "y0") -> None:
    """Every leaf of ``y0`` finite (``NONFINITE_Y0``)."""
    for path, leaf in leaf_paths(y0):
        checks(Result.NONFINITE_Y0,
               f"{name} must be finite, but it contains nan or inf: {name}{path} holds "
               "{value} at flat index {index}", _nonfinite, leaf)


def check_args(checks: Checks, args) -> None:
    """No NaN in any floating leaf of ``args`` (``NONFINITE_ARGS``); ``inf`` is allowed
    (a rate bound, "no limit")."""
    for path, leaf in leaf_paths(args):
        checks(Result.NONFINITE_ARGS,
               f"args must not contain nan, but args{path} holds nan at flat index "
               "{index}; check the parameters passed to f (an earlier fit or a division "
               "0/0 may have produced it)", _nan, leaf)


def check_tolerances(checks: Checks, rtol, atol) -> None:
    """``rtol`` and ``atol`` positive and finite (``INVALID_TOLERANCE``)."""
    for name, tol in (("rtol", rtol), ("atol", atol)):
        checks(Result.INVALID_TOLERANCE,
               f"{name} must be positive and finite, got {{value}}", _not_positive, tol)


def _not_forward(xp, a, b):
    return ~(b > a), b - a


def _not_positive_step(xp, h):
    return ~(h > 0), h


def _backwards_step(xp, a, b, h):
    return (b > a) & (h < 0), h


def check_times(checks: Checks, t0, t1, dt, *, forward_only: bool = False) -> None:
    """``t0``, ``t1`` and ``dt`` finite, ``dt`` nonzero and not pointing away from ``t1``;
    with ``forward_only`` (SDEs) ``t1 > t0`` and ``dt > 0`` (``INVALID_TIME_ARGUMENT``)."""
    code = Result.INVALID_TIME_ARGUMENT
    for name, x in (("t0", t0), ("t1", t1), ("dt", dt)):
        checks(code, f"{name} must be finite, got {{value}}", _nonfinite, x)
    if forward_only:
        checks(code, "t1 must be greater than t0 for an SDE (forward time only), got "
               "t1 - t0 = {value}", _not_forward, t0, t1)
        checks(code, "dt must be positive, got {value}", _not_positive_step, dt)
        return
    checks(code, "dt must be nonzero, got {value}", _zero, dt)
    checks(code, "dt={value} is negative but the span t0 -> t1 runs forward; give a "
           "positive dt", _backwards_step, t0, t1, dt)


def _unresolved(xp, eps, a, b, *h):
    span = xp.abs(b - a)
    step = xp.minimum(xp.abs(h[0]), span) if h else span
    floor = RESOLUTION_ULPS * eps * xp.maximum(xp.abs(a), xp.abs(b))
    return (span > 0) & (step < floor), step


def check_resolution(checks: Checks, t0, t1, dt, tdtype) -> None:
    """The step (``|dt|``, or the span when shorter or when no ``dt`` is given) at least
    ``RESOLUTION_ULPS`` spacings of ``tdtype`` at ``max(|t0|, |t1|)``
    (``TIME_NOT_RESOLVED``)."""
    eps = float(jnp.finfo(tdtype).eps)
    name = jnp.dtype(tdtype).name
    checks(Result.TIME_NOT_RESOLVED,
           "the time step {value} is below 16 units in the last place of t at "
           f"max(|t0|, |t1|) in {name}, the time's dtype: the time grid cannot be "
           "represented, and the run would end short of t1 or take the wrong steps; "
           + ("enable float64 (jax.config.update('jax_enable_x64', True)), " if eps > 1e-10
              else "") + "shift t0 and t1 towards zero, or take a larger step",
           _unresolved, eps, *((t0, t1) if dt is None else (t0, t1, dt)))


def _outside(xp, s, a, b):
    lo, hi = xp.minimum(a, b), xp.maximum(a, b)
    return (s < lo) | (s > hi) | xp.isnan(s), s


def _unordered(xp, s, a, b):
    direction = xp.where(b >= a, 1.0, -1.0)
    back = direction * (s[1:] - s[:-1]) < 0
    return xp.concatenate([xp.zeros((1,), bool), back]), s


def check_save_times(checks: Checks, ts, t0, t1) -> None:
    """Every save time within ``[t0, t1]``, ordered in the direction of integration
    (``INVALID_SAVE_TIMES``)."""
    code = Result.INVALID_SAVE_TIMES
    if is_tracer((t0, t1)):
        order = "increasing for t1 > t0, decreasing for t1 < t0"
    else:
        order = "increasing" if float(t1) >= float(t0) else "decreasing"
    checks(code, "saveat.ts must lie within [t0, t1], but saveat.ts[{index}] = {value} "
           "is outside", _outside, ts, t0, t1)
    checks(code, f"saveat.ts must be ordered in the direction of integration ({order}), "
           "but saveat.ts[{index}] = {value} comes before the save time preceding it",
           _unordered, ts, t0, t1)
