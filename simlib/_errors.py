"""Status codes returned in ``Solution.result``, and the error raised for them."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import re
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_batching import custom_vmap


class Result(IntEnum):
    """Why an integration stopped. ``SUCCESSFUL`` is zero; every other code is a failure.

    An ``IntEnum``: a member equals its integer code, so ``sol.result == Result.SUCCESSFUL``
    compares the status array with it (also traced, and elementwise when batched), and
    ``Result(sol.result)`` names an unbatched status eagerly. ``str()`` and ``format()``
    give the name (``"MAX_STEPS_REACHED"``); ``int()`` the code.
    """

    SUCCESSFUL = 0
    MAX_STEPS_REACHED = 1
    NONFINITE_STATE = 2
    STEP_SIZE_TOO_SMALL = 3
    NEIGHBOR_LIST_OVERFLOW = 4
    NEIGHBOR_LIST_MISSED_PAIRS = 5
    UNSTABLE_DYNAMICS = 6
    NEWTON_FAILED = 7
    EVENT_CAPACITY_EXCEEDED = 8
    INVALID_SAVE_TIMES = 9
    INVALID_TOLERANCE = 10
    INVALID_TIME_ARGUMENT = 11
    TIME_NOT_RESOLVED = 12
    NONFINITE_Y0 = 13
    NONFINITE_ARGS = 14
    BOX_TOO_SMALL = 15
    INVALID_BOX = 16
    CONSTRAINTS_NOT_CONVERGED = 20
    INCONSISTENT_INITIAL_CONDITIONS = 21
    INVALID_MASS_MATRIX = 22
    SETTLE_FAILED = 23

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        # A numeric presentation type (f"{code:d}") formats the code, anything else the name.
        if spec and spec[-1] in "bcdoxXneEfFgG%":
            return int.__format__(int(self), spec)
        return format(self.name, spec)


_MESSAGES = {
    Result.SUCCESSFUL: "the integration reached t1",
    Result.MAX_STEPS_REACHED: (
        "the step budget max_steps={max_steps} was exhausted at t={t:.17g} (step {step}) "
        "before reaching t1={t1:.17g}; raise max_steps, or loosen rtol/atol"
    ),
    Result.NONFINITE_STATE: (
        "the state became non-finite (nan or inf) at t={t:.17g} (step {step}); "
        "the problem may blow up there, or dt is too large for it"
    ),
    Result.STEP_SIZE_TOO_SMALL: (
        "the step size fell below the floating-point resolution of t (or the controller's "
        "dtmin) at t={t:.17g} "
        "(step {step}); the problem may be stiff or singular there"
    ),
    Result.NEIGHBOR_LIST_OVERFLOW: (
        "the neighbour list overflowed by t={t:.17g} (step {step}): a particle had more "
        "neighbours than its capacity, or a cell more particles than its cell capacity; "
        "allocate a larger list (neighbor_list(..., capacity=...)), or let simulate() "
        "reallocate it by calling it outside jit"
    ),
    Result.NEIGHBOR_LIST_MISSED_PAIRS: (
        "the debug check found pairs within r_cut missing from the neighbour list by "
        "t={t:.17g} (step {step}); this is a bug in simlib, please report it"
    ),
    Result.UNSTABLE_DYNAMICS: (
        "the particle dynamics blew up at t={t:.17g} (step {step}): an atom's velocity "
        "carried it further in one step than half the periodic box, the neighbour list's "
        "skin or the energy's r_cut (|v| dt > limit), or an atom started so far outside the "
        "periodic box that wrapping loses its place in it; dt may be too large, or atoms "
        "overlap (traj.stats['failed_atom'] names the atom; throw=False keeps the trajectory)"
    ),
    Result.NEWTON_FAILED: (
        "the implicit solver's Newton iteration kept failing to converge at t={t:.17g} "
        "(step {step}), even after the step size was cut; the Jacobian may be wrong "
        "(check a user-supplied jac), the problem may be singular there, or a fixed dt "
        "may be too large for it"
    ),
    Result.EVENT_CAPACITY_EXCEEDED: (
        "a non-terminal event crossed zero more often than its capacity by t={t:.17g} "
        "(step {step}); crossings beyond the capacity were not recorded: raise "
        "Event(..., capacity=...)"
    ),
    # Invalid inputs found in the graph (traced arguments; simlib/_validate.py). The
    # in-graph check names the argument and value; these are the messages without them.
    Result.INVALID_SAVE_TIMES: (
        "saveat.ts must lie within [t0, t1] and be ordered in the direction of integration"
    ),
    Result.INVALID_TOLERANCE: "rtol and atol must be positive and finite",
    Result.INVALID_TIME_ARGUMENT: (
        "t0, t1 and dt must be finite, dt nonzero and pointing from t0 to t1"
    ),
    Result.TIME_NOT_RESOLVED: (
        "the time step is below 16 units in the last place of t, so the time grid "
        "cannot be represented in the time's dtype; enable float64 "
        "(jax.config.update('jax_enable_x64', True)), shift t0 towards zero, or take a "
        "larger dt"
    ),
    Result.NONFINITE_Y0: "y0 must be finite, but it contains nan or inf",
    Result.NONFINITE_ARGS: "args must not contain nan",
    Result.BOX_TOO_SMALL: (
        "the periodic box is smaller than twice the interaction range (found at t={t:.17g}, "
        "step {step}): its shortest side is below 2 r_cut (the energy's cutoff, or the "
        "neighbour list's r_cut + skin), so minimum images miss pairs within the cutoff; "
        "use a larger box or a smaller r_cut"
    ),
    Result.INVALID_BOX: (
        "the periodic box has a side length that is zero, negative or not finite (found at "
        "t={t:.17g}, step {step}); periodic(box) needs positive, finite side lengths"
    ),
    Result.CONSTRAINTS_NOT_CONVERGED: (
        "the bond constraints (SHAKE/RATTLE) did not converge to their tolerance within "
        "max_iterations sweeps at t={t:.17g} (step {step}); dt may be too large, the start "
        "state may violate the constraints, or constraints may conflict (a rigid triangle "
        "needs more sweeps: raise Rattle(..., max_iterations=...))"
    ),
    # the prefixes of the DAE checks' messages (simlib/_dae.py), which add the detail
    Result.INCONSISTENT_INITIAL_CONDITIONS: (
        "inconsistent DAE start (y0, mass_matrix, initialize):"
    ),
    Result.INVALID_MASS_MATRIX: "invalid mass_matrix:",
    Result.SETTLE_FAILED: (
        "SETTLE found no rigid placement for a water molecule at t={t:.17g} (step {step}): "
        "it moved or turned too far in one step for the analytical solution; dt may be too "
        "large, or the start state may violate the rigid geometry (sp.Settle's d_oh, d_hh)"
    ),
}


class SolverError(RuntimeError):
    """Raised by ``solve(..., throw=True)`` when an integration fails.

    Attributes:
        result: The :class:`Result` code.
        solution: The partial :class:`~simlib.Solution` (eager calls only), so
            nothing computed is lost.
        member: Under ``vmap``, the index of the failing member (the first one, in
            row-major order over nested ``vmap`` levels), which the message names
            (``"solve: member 3 of 8: ..."``); ``None`` for an unbatched call.
        jax_error: The ``jax.errors.JaxRuntimeError`` this error was recovered from
            (a failure raised inside compiled code), kept here rather than chained, so
            that the message comes first; ``None`` otherwise.
    """

    def __init__(self, message: str, result: Result, solution: Any = None, *,
                 member: int | None = None) -> None:
        super().__init__(message)
        self.result = result
        self.solution = solution
        self.member = member
        self.jax_error = None

    @classmethod
    def from_exception(cls, exc: BaseException) -> SolverError | None:
        """The :class:`SolverError` that ``exc`` carries, or ``None``.

        Under ``jax.jit`` (or any compiled call) a failure is raised by a host callback, and
        JAX re-raises it as a ``jax.errors.JaxRuntimeError`` whose message ends with the
        original ``SolverError: <message>`` line. This recovers that message and its
        :class:`Result` code (``solution`` is ``None``: a compiled call returns nothing).
        A ``SolverError`` is returned as it is.
        """
        if isinstance(exc, SolverError):
            return exc
        text = str(exc)
        matches = list(_MARKER.finditer(text))  # the last one: the innermost error
        if not matches:
            return None
        found = matches[-1]
        message = found.group(2)
        raised = _RAISED.get(message)  # the error our callback raised, when in this process
        if raised is not None:
            err = cls(message, raised.result, member=raised.member)
        else:
            code = Result.__members__.get(found.group(1) or "") or _code_of(message)
            if code is None:
                return None
            member = re.search(r": member (\d+) of \d+: ", message)
            err = cls(message, code, member=int(member.group(1)) if member else None)
        err.jax_error = exc
        _forget_failed_tokens()
        return err


def _forget_failed_tokens() -> None:
    """Let JAX forget a program that the native check stopped, once its failure has been
    delivered as a :class:`SolverError`.

    JAX keeps each device's runtime token of the last program with effects and waits on it
    at exit (and in ``jax.effects_barrier``); the token of a program stopped by the native
    check holds its error, which JAX would then raise a second time ("Exception ignored in
    atexit callback"). JAX has no public call for this: the token set is private, so any
    change there leaves the tokens as they are.
    """
    try:
        from jax._src import dispatch
        tokens = dispatch.runtime_tokens.output_runtime_tokens
    except (ImportError, AttributeError):
        return
    for device, token in list(tokens.items()):
        try:
            token.block_until_ready()
        except Exception:  # noqa: BLE001 - the failure just delivered
            tokens.pop(device, None)


# "SolverError(<code name>): <message>", as the native check writes it, or a traceback's
# "SolverError: <message>" (a host callback's); group 1 the name (or None), 2 the message
_MARKER = re.compile(r"SolverError(?:\((\w+)\))?: (.*)")


# The errors the in-graph check's callback raised, by message (the last few), so that
# SolverError.from_exception recovers the code and member from the JAX error's text.
_RAISED: dict[str, SolverError] = {}


def _remember(err: SolverError) -> SolverError:
    _RAISED[str(err)] = err
    while len(_RAISED) > 32:
        del _RAISED[next(iter(_RAISED))]
    return err


def _code_of(message: str) -> Result | None:
    """The code whose message template ``message`` was formatted from."""
    for code, template in _MESSAGES.items():
        if code and template.split("{")[0] in message:
            return code
    for code in Result:
        if code and code.name in message:
            return code
    return None


_CALLBACK_LOGGERS = ("jax._src.debugging", "jax._src.callback")


class _DropSolverErrorLogs(logging.Filter):
    """Drops JAX's log record of a callback that raised a :class:`SolverError`."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SolverError)


@contextlib.contextmanager
def raise_solver_errors() -> Iterator[None]:
    """Inside this block, a failure raised under ``jit`` arrives as a :class:`SolverError`.

    A failing ``solve``/``simulate`` inside the user's own ``jax.jit`` raises from a host
    callback, which JAX wraps in a ``jax.errors.JaxRuntimeError`` (the original message is
    the last line of its text) and logs with a traceback. In this block such an error is
    re-raised as the :class:`SolverError` it carries (with ``result`` set; the JAX error
    is its ``jax_error`` attribute, not chained, so the message is what the traceback ends
    with), and the log record is dropped. Other errors pass unchanged.
    Put the line that waits for the result (a ``float()``, ``np.asarray`` or
    ``block_until_ready``) inside the block too: JAX dispatches asynchronously.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> import simlib as sl
        >>> @jax.jit
        ... def run(y0):
        ...     return sl.solve(lambda t, y, args: -y, y0, 0.0, 1.0, solver=sl.Tsit5(),
        ...                     rtol=1e-6, atol=1e-6, max_steps=3).ys
        >>> try:
        ...     with sl.raise_solver_errors():
        ...         run(jnp.ones(1)).block_until_ready()
        ... except sl.SolverError as err:
        ...     print(err.result)
        MAX_STEPS_REACHED
    """
    # the in-graph check is a jax.debug.callback (logged by jax._src.debugging); a
    # pure_callback would be logged by jax._src.callback
    logs = [logging.getLogger(name) for name in _CALLBACK_LOGGERS]
    dropper = _DropSolverErrorLogs()
    for log in logs:
        log.addFilter(dropper)
    try:
        yield
    except SolverError as err:
        if err.__cause__ is None:
            raise
        # raised in the callback as it ran (an eager vmap executes there): a fresh error,
        # so that JAX's chained stack trace is not printed before the message
        fresh = SolverError(str(err), err.result, err.solution, member=err.member)
        fresh.jax_error = err.__cause__
        raise fresh from None
    except Exception as exc:  # noqa: BLE001 - re-raised unchanged unless it carries one
        err = SolverError.from_exception(exc)
        if err is None:
            raise
        raise err from None
    finally:
        for log in logs:
            log.removeFilter(dropper)


def result_message(code: int, *, t: float, step: int, t1: float, max_steps: int) -> str:
    """The human-readable message for a status ``code``."""
    return _MESSAGES[Result(int(code))].format(t=t, step=step, t1=t1, max_steps=max_steps)


def first_failure(result, t, step, t1) -> tuple[int, float, int, float] | None:
    """The first failing member of a (possibly batched) result, or ``None``."""
    result = np.asarray(result)
    bad = np.flatnonzero(result.ravel() != 0)
    if bad.size == 0:
        return None
    i = int(bad[0])

    def pick(x):
        x = np.asarray(x)
        return x.ravel()[i] if x.size == result.size else x.ravel()[0]

    return int(pick(result)), float(pick(t)), int(pick(step)), float(pick(t1))




def raise_on_failure(result, t, step, t1, max_steps, caller="solve"):
    failure = first_failure(result, t, step, t1)
    if failure is not None:
        code, t, step, t1 = failure
        raise SolverError(
            f"{caller}: " + result_message(code, t=t, step=step, t1=t1, max_steps=max_steps),
            Result(code),
        )


def _pick_first_failure(fields, batched):
    """In-graph reduction of a batch (axis 0 of the ``batched`` fields) to its first
    failing member. ``fields`` is ``(result, ..., member, count)``: the failure code, the
    values its message needs, and the member index among ``count`` members of the levels
    already reduced. Returns the fields of that member (of an arbitrary member, all with
    result zero, when none failed), its index in this batch folded into ``member`` and
    ``count`` (row-major over nested ``vmap`` levels).

    A variadic ``lax.reduce`` keyed on the member index, so that with the batch axis
    sharded XLA reduces each device's slice and then gathers one candidate per
    device: no device ever receives the whole batch.
    """
    result = fields[0]
    n = next(x.shape[0] for x, b in zip(fields, batched, strict=True) if b)
    bad = result != 0
    if batched[0]:
        bad = jnp.any(bad.reshape(n, math.prod(result.shape[1:])), axis=1)
    else:
        bad = jnp.broadcast_to(jnp.any(bad), (n,))
    key = jnp.where(bad, jnp.arange(n, dtype=jnp.int32), jnp.int32(n))

    def earlier(a, b):
        take_a = a[0] <= b[0]
        return tuple(jnp.where(take_a, u, v) for u, v in zip(a, b, strict=True))

    out = list(fields)
    # members' scalars share one reduction (the usual case), other shapes get one each
    groups = [[i for i, x in enumerate(fields) if batched[i] and x.ndim == 1]]
    groups += [[i] for i, x in enumerate(fields) if batched[i] and x.ndim > 1]
    for group in filter(None, groups):
        shape = fields[group[0]].shape
        k = jnp.broadcast_to(key.reshape((n,) + (1,) * (len(shape) - 1)), shape)
        init = (jnp.int32(n),) + tuple(jnp.zeros((), fields[i].dtype) for i in group)
        picked = lax.reduce((k,) + tuple(fields[i] for i in group), init, earlier, (0,))
        for i, v in zip(group, picked[1:], strict=True):
            out[i] = v
    first = jnp.minimum(jnp.min(key), n - 1)
    out[-2] = first * out[-1] + out[-2]
    out[-1] = out[-1] * n
    return tuple(out)


# Set by simlib.log_density while it traces the user's function: every solve inside it
# reports a failure in Solution.result (as with throw=False) instead of raising, since a
# sampler must see a rejected proposal, not a dead run.
_REPORTED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "simlib_failures_reported", default=False)


@contextlib.contextmanager
def failures_reported() -> Iterator[None]:
    """Inside this block, ``solve`` behaves as with ``throw=False``: a failure is reported
    in ``Solution.result`` and never raised. Read when ``solve`` is called (not inside a
    cached ``jit``), so it applies to solves traced in the block."""
    token = _REPORTED.set(True)
    try:
        yield
    finally:
        _REPORTED.reset(token)


def reporting_failures() -> bool:
    """Whether :func:`failures_reported` is active."""
    return _REPORTED.get()


# Set by sl.ensemble while it traces its shard_map body: the mesh axes over which the
# in-graph check shares its candidate, and the positions (in the mesh's device order) of
# the one device per process that raises. Every process then raises the same, first,
# failure, instead of only those holding a failing member (the others would go on to
# their next collective and wait there for a process that has died); one device per
# process, since every further raise in a process resurfaces when it exits.
_SHARED_OVER: contextvars.ContextVar[tuple[tuple[str, ...], tuple[int, ...]] | None] = (
    contextvars.ContextVar("simlib_failure_check_sharing", default=None))


@contextlib.contextmanager
def failure_check_shared_over(mesh) -> Iterator[None]:
    """While tracing a ``shard_map`` body over all axes of ``mesh``, make the in-graph
    failure check gather each device's candidate (one member's four scalars) over the
    mesh and raise it on the first device of each process."""
    first: dict[int, int] = {}
    for position, device in enumerate(mesh.devices.flat):
        first.setdefault(device.process_index, position)
    token = _SHARED_OVER.set((tuple(mesh.axis_names), tuple(sorted(first.values()))))
    try:
        yield
    finally:
        _SHARED_OVER.reset(token)


def _share_candidate(picked, sharing):
    """The first failure among the devices' candidates (device order is member order),
    with its code kept only on the devices that raise."""
    axes, raisers = sharing
    gathered = tuple(lax.all_gather(x, axes, tiled=False) for x in picked)
    out = _pick_first_failure(gathered, (True,) * len(gathered))
    here = jnp.isin(lax.axis_index(axes), jnp.asarray(raisers, jnp.int32))
    return (jnp.where(here, out[0], jnp.zeros_like(out[0])),) + out[1:]


class _Field:
    """A value of the in-graph check's message, by its operand position: formatting it
    writes the field of :func:`render`'s template (``{N}``, ``{N:d}`` or ``{N:r}``)."""

    def __init__(self, position: int, kind: str = ""):
        self.position, self.kind = position, kind

    def __format__(self, spec: str) -> str:
        if spec.endswith("g"):
            return f"{{{self.position}}}"
        if spec:
            raise ValueError(f"a message field takes '.17g' or no format, not {spec!r}")
        return f"{{{self.position}:{self.kind}}}" if self.kind else f"{{{self.position}}}"


_FIELD = re.compile(r"\{(where:(\d+),(\d+)|(\d+)(?::([dr]))?)\}")


def render(template: str, values) -> str:
    """The message of ``template`` with the check's ``values`` (its operands) filled in.

    The template language that ``simlib/native/failure.cc`` renders too: ``{N}`` is operand
    ``N`` with 17 significant digits, ``{N:d}`` an integer, ``{N:r}`` ``repr(float)``, and
    ``{where:M,C}`` reads ``"member <M> of <C>: "`` when the count ``C`` is above 1.
    """

    def field(match: re.Match) -> str:
        if match.group(2) is not None:
            member, count = int(values[int(match.group(2))]), int(values[int(match.group(3))])
            return f"member {member} of {count}: " if count > 1 else ""
        value, kind = values[int(match.group(4))], match.group(5)
        if kind == "d":
            return str(int(value))
        if kind == "r":
            return repr(float(value))
        return f"{float(value):.17g}"

    return _FIELD.sub(field, template)


def _message_table(caller: str, max_steps, n_detail: int, messages) -> tuple[tuple[int, str],
                                                                             ...]:
    """The in-graph check's messages, by key: ``(key, template)`` for every code (the key
    is the code) and for each of ``messages`` (``(key, code, template, kinds)``, whose
    format fields are named after the detail values, kinds giving each one's ``d`` or
    ``r``). Each starts ``SolverError(<code name>): <caller>: ``, which
    :meth:`SolverError.from_exception` reads back.

    The operands are ``(key, code, t, step, t1, *detail, member, count)``.
    """
    t, step, t1 = _Field(2), _Field(3, "d"), _Field(4)
    where = f"{{where:{5 + n_detail},{6 + n_detail}}}"

    def head(code: Result) -> str:
        return f"SolverError({code.name}): {caller}: {where}"

    table = [(int(code), head(code) + template.format(t=t, step=step, t1=t1,
                                                      max_steps=max_steps))
             for code, template in _MESSAGES.items() if code]
    for key, code, template, kinds in messages:
        fields = {name: _Field(5 + i, kind) for i, (name, kind) in enumerate(kinds)}
        table.append((int(key), head(Result(code)) + template.format(**fields)))
    return tuple(table)


@functools.cache
def native_library():
    """The native check's library (``simlib/native/failure.cc``, a
    :class:`simlib._native.NativeLibrary`): a custom call, so the programs that hold it can
    be kept in JAX's persistent cache. Built on first use, once per machine."""
    from pathlib import Path

    from ._native import NativeLibrary

    return NativeLibrary(Path(__file__).parent / "native", sources=("failure.cc",),
                         targets=("simlib_failure_check",), library="libsimlib_failure.so")


def uses_native_check() -> bool:
    """Whether in-graph failure checks traced now are native custom calls (cacheable
    programs) rather than Python host callbacks: on the CPU backend with one device, when
    the native library builds (``SIMLIB_NATIVE=0`` turns it off). With several devices
    (forced host devices, or several processes) the program may be partitioned, and XLA's
    partitioner needs a side effect's placement, which JAX gives its own callbacks only:
    the host callback runs there."""
    return (jax.default_backend() == "cpu" and jax.device_count() == 1
            and native_library().load() is not None)


def _in_graph_check(table: tuple[tuple[int, str], ...]):
    """A ``custom_vmap`` function ``check(key, code, t, step, t1, *detail, member, count)``
    that raises :class:`SolverError` with the message ``table`` holds for ``key`` when the
    key is nonzero; it returns an int32 zero.

    On the CPU the check is the native custom call ``simlib_failure_check``, whose error
    JAX raises as a ``JaxRuntimeError`` carrying the message; elsewhere a host callback
    raises the :class:`SolverError` itself. Under ``vmap`` the batch is first reduced in
    the graph to its first failing member (:func:`_pick_first_failure`), so the check only
    ever receives one member's values (one call per program, however many ``vmap`` levels),
    never the batch: with the batch sharded over devices, each device sends one candidate.
    """
    templates = dict(table)
    native = uses_native_check()
    packed = "\x1e".join(f"{key}\x1f{template}" for key, template in table)

    def callback(key, *values):
        key = int(key)
        if key == 0:
            return
        message = _MARKER.match(render(templates[key], (key, *values)))
        count = int(values[-1])
        member = int(values[-2]) if count > 1 else None
        raise _remember(SolverError(message.group(2), Result[message.group(1)],
                                    member=member))

    @custom_vmap
    def check(*fields):
        if native:
            return jax.ffi.ffi_call("simlib_failure_check",
                                    jax.ShapeDtypeStruct((), jnp.int32),
                                    has_side_effect=True)(*fields, table=packed)
        jax.debug.callback(callback, *fields)
        return jnp.zeros((), jnp.int32)

    @check.def_vmap
    def _rule(axis_size, in_batched, *fields):
        del axis_size
        if not any(in_batched):
            return check(*fields), False
        picked = _pick_first_failure(fields, tuple(in_batched))
        sharing = _SHARED_OVER.get()
        if sharing is not None:
            picked = _share_candidate(picked, sharing)
        return check(*picked), False

    # Nothing to differentiate (the inputs are stop_gradient-ed, the output is an integer
    # zero); a custom JVP keeps autodiff away from custom_vmap, which some JAX versions
    # cannot linearise.
    @jax.custom_jvp
    def guarded(*fields):
        return check(*fields)

    @guarded.defjvp
    def _jvp(primals, tangents):
        del tangents
        return guarded(*primals), np.zeros((), jax.dtypes.float0)

    return guarded


def check_in_graph(outputs, result, t, step, t1, max_steps, caller="solve", *,  # noqa: D417
                   detail=(), key=None, messages=()):
    """Raise from inside a traced computation when ``result`` reports a failure.

    An effect that runs whether or not the outputs are used (a native custom call on the
    CPU, else a host callback; see :func:`_in_graph_check`), and that nothing waits for,
    so a raise on one device cannot leave the others blocked in a collective. Under
    ``vmap`` it is called once, with the first failing member only, and the message names
    that member; a batch sharded over devices is checked on each device's slice, then one
    candidate per device is gathered.

    The message is the code's own (``t`` and ``step`` filled in), unless ``key`` (an
    in-graph integer, nonzero where ``result`` is) selects one of ``messages``:
    ``(key, code, template, kinds)`` with format fields named after ``detail``'s values
    (``kinds``: ``((name, "d" or "r"), ...)`` in ``detail``'s order; simlib/_validate.py).
    Returns ``outputs`` plus a zero.
    """
    result = jnp.asarray(result)
    key = result if key is None else jnp.asarray(key)
    fields = [lax.stop_gradient(jnp.asarray(x))
              for x in (key.astype(jnp.int32), result, t, step, t1, *detail)]
    fields += [jnp.zeros((), jnp.int32), jnp.ones((), jnp.int32)]  # member, count
    table = _message_table(caller, max_steps, len(detail), messages)
    zero = _in_graph_check(table)(*fields)
    # the zero ties the check to the outputs; no device waits for it
    return jax.tree_util.tree_map(lambda x: x + zero.astype(x.dtype), outputs)


def check_solution(sol, in_graph_check: bool, t1, max_steps: int):
    """``sol``, tied to the in-graph failure check when ``in_graph_check``."""
    if not in_graph_check:
        return sol
    ts, ys, stats, result = check_in_graph(
        tuple(sol), sol.result, sol.stats["t_final"], sol.stats["num_steps"], t1, max_steps)
    return type(sol)(ts, ys, stats, result)
