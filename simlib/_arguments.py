"""The arguments of ``solve``, its SDE path and ``solve_ensemble``: one keyword list and
one normalisation and validation step.

Each entry point is a short driver over this module:

1. :func:`check_keywords` refuses an unknown keyword against the one table
   :data:`KEYWORDS` (which entry points take each keyword);
2. :func:`normalise` checks what every run shares (``saveat``, ``max_steps``, the
   adjoint, the controller, ``y0``, the times, ``args``) and returns a :class:`Problem`:
   the arrays as the drivers take them, the time dtype and the
   :class:`~simlib._validate.Checks` of the call (concrete values refused at once,
   traced ones pending);
3. the caller adds what its kind of problem needs (the ODE's vector field, events, mass
   matrix and linear solver in ``_solve.py``; the SDE's diffusion and Brownian path in
   ``_sde.py``; the ensemble's members and ``args_axes`` in ``_compact.py``);
4. :func:`complete` checks the step against the time resolution, the save times and the
   tolerances, and says whether the run is traced.

The value checks themselves (concrete or traced) are :mod:`simlib._validate`'s; this
module decides which of them a run makes, in one order for every entry point, so that a
run with several bad traced arguments reports the same one whichever path it takes.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._adjoint import AbstractAdjoint
from ._control import PIDController
from ._dae import INITIALIZE
from ._solution import SaveAt
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._solver._sde import AbstractSDESolver
from ._util import inside_trace, is_tracer, time_dtype
from ._validate import (
    Checks,
    check_args,
    check_resolution,
    check_save_times,
    check_state,
    check_times,
    check_tolerances,
)

__all__ = [
    "DEFAULT_MAX_STEPS", "KEYWORDS", "SAVE_T1", "CastToState", "Problem", "as_array_tree",
    "as_members", "check_adjoint", "check_callable", "check_controller", "check_count",
    "check_field", "check_initialize", "check_keywords", "check_member_save_times",
    "check_saveat", "check_scalar", "check_solver", "complete", "describe", "is_sde",
    "keywords", "member_spans", "normalise", "save_times", "tolerances",
]

DEFAULT_MAX_STEPS = 4096
"""``max_steps`` when not given: the bound on an adaptive run's step attempts."""

SAVE_T1 = SaveAt(t1=True)
"""``saveat`` when not given: the final state only."""

# ---- the one keyword list

SOLVE, ENSEMBLE = "solve", "solve_ensemble"
_BOTH = (SOLVE, ENSEMBLE)

KEYWORDS: Mapping[str, tuple[str, ...]] = {
    # every run
    "solver": _BOTH, "dt": _BOTH, "rtol": _BOTH, "atol": _BOTH, "args": _BOTH,
    "saveat": _BOTH, "max_steps": _BOTH, "throw": _BOTH,
    # the step-size controller: taken by both, passed through (see check_controller)
    "controller": _BOTH,
    # gradients, events, progress
    "adjoint": (SOLVE,), "events": (SOLVE,), "progress": _BOTH,
    # SDEs
    "diffusion": (SOLVE,), "key": (SOLVE,), "noise": (SOLVE,), "brownian": (SOLVE,),
    # the implicit solvers' linear algebra
    "jac_sparsity": (SOLVE,), "jac_bandwidth": (SOLVE,), "linear_solver": (SOLVE,),
    # DAEs
    "mass_matrix": _BOTH, "initialize": _BOTH,
    # the ensemble's members and chunks
    "args_axes": (ENSEMBLE,), "chunk_steps": (ENSEMBLE,), "min_bucket": (ENSEMBLE,),
    "mass_axes": (ENSEMBLE,),
}
"""Every keyword of the entry points, with the entry points that take it (in the order
their error messages list them)."""


def keywords(entry: str) -> tuple[str, ...]:
    """The keywords ``entry`` (``"solve"`` or ``"solve_ensemble"``) takes."""
    return tuple(name for name, takers in KEYWORDS.items() if entry in takers)


def check_keywords(entry: str, unknown: Mapping[str, Any]) -> None:
    """Refuse the first of ``unknown`` (a ``**kwargs`` catch-all) with a ``TypeError``
    suggesting the closest valid keyword (``difflib``) and listing them all."""
    if not unknown:
        return
    valid = keywords(entry)
    bad = next(iter(unknown))
    close = difflib.get_close_matches(bad, valid, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise TypeError(f"{entry}() got an unknown keyword argument {bad!r}{hint} "
                    f"(valid keywords: {', '.join(valid)})")


# ---- checks of single arguments

def check_solver(solver: Any) -> None:
    """``solver`` a simlib solver instance (not its class)."""
    if isinstance(solver, type):
        raise TypeError(f"solver must be an instance, e.g. {solver.__name__}(), not the class")
    if not isinstance(solver, AbstractSolver):
        raise TypeError(
            f"solver must be a simlib solver instance such as simlib.Tsit5(), got {solver!r}"
        )


def check_callable(fn: Any, name: str) -> None:
    """``fn`` callable as ``fn(t, y, args)``."""
    if not callable(fn):
        shown = "g" if name == "diffusion" else name
        raise TypeError(f"{name} must be callable as {shown}(t, y, args), got {fn!r}")


def check_initialize(initialize: Any, mass_matrix: Any) -> None:
    """``initialize`` one of :data:`simlib._dae.INITIALIZE`, other than ``"check"`` only
    with a ``mass_matrix``."""
    if initialize not in INITIALIZE:
        raise ValueError(f"initialize must be one of {INITIALIZE}; got {initialize!r}")
    if mass_matrix is None and initialize != "check":
        raise ValueError(f"initialize={initialize!r} applies to a DAE: give mass_matrix")


def check_count(value: Any, name: str) -> int:
    """``value`` a positive integer (``bool`` refused: ``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_saveat(saveat: Any) -> str:
    """``saveat`` a :class:`SaveAt`; its mode (``"t1"``, ``"ts"`` or ``"steps"``)."""
    if not isinstance(saveat, SaveAt):
        raise TypeError(f"saveat must be a simlib.SaveAt, got {saveat!r}")
    return saveat.mode()


def check_adjoint(adjoint: Any, solver: AbstractSolver, events: Any) -> None:
    """``adjoint`` ``None`` or a simlib adjoint that can differentiate this run, as the
    strategy itself says (:meth:`~simlib.AbstractAdjoint.check`: :class:`Reversible` needs
    a time-symmetric solver, which no SDE method is, and no events)."""
    if adjoint is not None and not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(
            "adjoint must be simlib.Direct(), simlib.Checkpointed(), simlib.Reversible() or "
            f"simlib.ForwardMode(), got {adjoint!r}"
        )
    if adjoint is not None:
        adjoint.check(solver, events, where="solve")


def check_controller(controller: Any, adaptive: bool = True) -> PIDController | None:
    """The step-size controller of an adaptive run: ``None`` (the default
    :class:`~simlib.PIDController`) or a ``PIDController``; refused for a fixed-step run
    (which has no step-size control)."""
    if controller is None:
        return None
    if not isinstance(controller, PIDController):
        raise TypeError(f"controller must be a simlib.PIDController, got {controller!r}")
    if not adaptive:
        raise ValueError("controller applies to adaptive runs: give rtol/atol (a fixed-step "
                         "run, dt alone, takes every step of size dt)")
    return controller


def is_sde(solver: AbstractSolver, diffusion: Any, key: Any, noise: Any,
           brownian: Any) -> bool:
    """Whether a ``solve`` call is an SDE: an SDE method, or any SDE keyword given."""
    return (diffusion is not None or key is not None or noise is not None
            or brownian is not None or isinstance(solver, AbstractSDESolver))


def check_scalar(x: Any, name: str) -> None:
    """``x`` a scalar (a structural check, also for tracers); its value is checked by
    :func:`simlib._validate.check_times`, concrete or traced."""
    if x is None:
        return
    shape = jnp.shape(x)
    if shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {shape}")


def as_array_tree(y0: Any, name: str) -> PyTree:
    """``y0`` with every leaf an array of an inexact dtype (integers become the default
    float); a tree without leaves is refused."""
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


def describe(tree: PyTree) -> str:
    """``tree``'s leaves as ``dtype[shape]``, for messages."""
    return str(jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape)}", tree))


def tolerances(rtol: Any, atol: Any, checks: Checks | None = None) -> tuple[Any, Any]:
    """``(rtol, atol)`` of an adaptive run, one standing in for the other when missing;
    both must be positive and finite (concrete: refused now; traced: in the graph through
    ``checks``)."""
    rtol = atol if rtol is None else rtol
    atol = rtol if atol is None else atol
    check_scalar(rtol, "rtol")
    check_scalar(atol, "atol")
    check_tolerances(Checks("solve") if checks is None else checks, rtol, atol)
    return rtol, atol


class CastToState:
    """``f`` with its output cast to the state's dtypes (a float32 state stays float32 when
    float64 parameters promote ``f``'s result). Hashes like ``f``, so jit caches still hit."""

    def __init__(self, f: VectorField) -> None:
        self.f = f

    def __call__(self, t: Any, y: PyTree, args: Any) -> PyTree:
        return jax.tree_util.tree_map(lambda o, x: o.astype(x.dtype), self.f(t, y, args), y)

    def __hash__(self) -> int:
        return hash((CastToState, self.f))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CastToState) and other.f == self.f


def check_field(f: VectorField, y: PyTree, args: Any, tdtype: Any, *, name: str = "f",
                where: str = "", like: str = "") -> VectorField:
    """``f(t, y, args)`` must return ``y``'s structure and shapes (checked on shapes only,
    ``jax.eval_shape``); ``f``, wrapped in :class:`CastToState` when its dtypes differ.
    ``name`` is the function's name in the messages, ``where`` ends that of a failing
    call (e.g. ``" for one member"``), ``like`` that of wrong shapes."""
    try:
        out = jax.eval_shape(f, jax.ShapeDtypeStruct((), tdtype), y, args)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling {name}(t0, y0, args){where} failed: {err}") from err
    in_struct = jax.tree_util.tree_structure(y)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(f"{name} must return the same pytree structure as y0: y0 is "
                         f"{in_struct}, {name} returned {out_struct}")
    pairs = list(zip(jax.tree_util.tree_leaves(y), jax.tree_util.tree_leaves(out),
                     strict=True))
    if any(a.shape != b.shape for a, b in pairs):
        raise ValueError(f"{name} must return arrays shaped like y0{like}: y0 is "
                         f"{describe(y)}, {name} returned {describe(out)}")
    if any(a.dtype != b.dtype for a, b in pairs):
        return CastToState(f)
    return f


# ---- the problem, normalised

class Problem(NamedTuple):
    """One run's arguments, checked and normalised: what the drivers take."""
    f: VectorField
    y0: PyTree           # arrays of inexact dtypes
    t0: Any
    t1: Any
    dt: Any
    rtol: Any            # after complete(): both set for an adaptive run
    atol: Any
    args: Any
    solver: AbstractSolver
    saveat: SaveAt
    mode: str            # saveat.mode()
    ts: Any              # after complete(): the save times in the time dtype, or None
    n_save: int
    max_steps: int
    throw: bool
    adjoint: AbstractAdjoint | None
    events: Any
    progress: bool
    controller: PIDController | None
    tdtype: Any          # the time dtype (that of y0's leaves)
    checks: Checks       # the call's traced checks, applied to the run's solution
    adaptive: bool       # rtol or atol given
    traced: bool = False  # after complete(): any argument traced, or inside a trace
    members: int = 0     # solve_ensemble: the number of members (0: one problem)


def normalise(caller: str, f: VectorField, y0: Any, t0: Any, t1: Any, *,
              solver: AbstractSolver, dt: Any, rtol: Any, atol: Any, args: Any,
              saveat: Any, max_steps: Any, throw: Any, adjoint: Any = None,
              events: Any = None, progress: Any = False, controller: Any = None,
              sde: bool = False, members: bool = False) -> Problem:
    """The checks every run shares, in one order: ``saveat``, ``max_steps``, the adjoint
    (with the events it must allow), the controller, then the values (``y0`` finite, the
    times finite and ``dt`` pointing towards ``t1``, forward only for an SDE, ``args``
    without NaN: :mod:`simlib._validate`). ``members`` (``solve_ensemble``): ``y0`` is
    ``y0s``, every leaf with a leading member axis, and ``t0``/``t1`` scalars or one per
    member, returned as float64 NumPy arrays of shape ``(n,)``."""
    mode = check_saveat(saveat)
    max_steps = check_count(max_steps, "max_steps")
    check_adjoint(adjoint, solver, events)
    controller = check_controller(controller, rtol is not None or atol is not None)
    if members:
        check_scalar(dt, "dt")
        y0, n = as_members(y0)
        t0, t1 = member_spans(t0, t1, n)
    else:
        y0, n = as_array_tree(y0, "y0"), 0
        for name, x in (("t0", t0), ("t1", t1), ("dt", dt)):
            check_scalar(x, name)
    checks = Checks(caller)
    check_state(checks, y0, "y0s" if members else "y0")
    check_times(checks, t0, t1, dt, forward_only=sde)
    check_args(checks, args)
    return Problem(f, y0, t0, t1, dt, rtol, atol, args, solver, saveat, mode, None, 0,
                   max_steps, bool(throw), adjoint, events, progress, controller,
                   time_dtype(y0), checks, rtol is not None or atol is not None, members=n)


def as_members(y0s: Any) -> tuple[PyTree, int]:
    """``(y0s as arrays, n)``: every leaf with the same leading member axis, ``n > 0``."""
    y0s = as_array_tree(y0s, "y0s")
    leaves = jax.tree_util.tree_leaves(y0s)
    if any(leaf.ndim == 0 for leaf in leaves):
        raise ValueError(f"y0s needs a leading member axis on every leaf, got {describe(y0s)}")
    sizes = {leaf.shape[0] for leaf in leaves}
    if len(sizes) != 1:
        raise ValueError(f"y0s's leaves disagree on the number of members: {describe(y0s)}")
    n = sizes.pop()
    if n == 0:
        raise ValueError(f"y0s has no members (leading axis of length 0): {describe(y0s)}")
    return y0s, n


def member_spans(t0: Any, t1: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``t0`` and ``t1`` as float64 arrays of shape ``(n,)`` (a scalar is shared)."""
    spans = []
    for name, t in (("t0", t0), ("t1", t1)):
        arr = np.asarray(t, np.float64)
        if arr.ndim == 0:
            arr = np.full((n,), float(arr))
        if arr.shape != (n,):
            raise ValueError(f"{name} must be a scalar or have shape ({n},) (one per member), "
                             f"got shape {arr.shape}")
        spans.append(arr)
    return spans[0], spans[1]


def complete(p: Problem, *also_traced: Any) -> Problem:
    """``p`` with the step checked against the time resolution, the save times checked
    and converted (``ts``, ``n_save``), the tolerances of an adaptive run checked and
    filled in, and ``traced`` set (judged on what the caller passed, and ``also_traced``:
    under an outer ``jit`` ``jnp.asarray`` of a NumPy array is already a tracer)."""
    checks = p.checks
    check_resolution(checks, p.t0, p.t1, p.dt, p.tdtype)
    ts, n_save = save_times(checks, p.saveat, p.mode, p.t0, p.t1, p.tdtype,
                            members=bool(p.members))
    rtol, atol = tolerances(p.rtol, p.atol, checks) if p.adaptive else (p.rtol, p.atol)
    traced = is_tracer((p.y0, p.t0, p.t1, p.dt, p.rtol, p.atol, p.args, p.saveat.ts,
                        *also_traced)) or inside_trace()
    return p._replace(ts=ts, n_save=n_save, rtol=rtol, atol=atol, traced=traced)


def save_times(checks: Checks, saveat: SaveAt, mode: str, t0: Any, t1: Any, tdtype: Any,
               *, members: bool = False) -> tuple[Any, int]:
    """``(ts, n_save)``: ``saveat.ts`` in the time dtype, a non-empty 1-D array within
    ``[t0, t1]`` and ordered in the direction of integration (``members``: within every
    member's span, see :func:`check_member_save_times`); ``(None, 0)`` unless
    ``mode == "ts"``."""
    if mode != "ts":
        return None, 0
    given = np.asarray(saveat.ts, np.float64) if members else saveat.ts
    ts = jnp.asarray(given, tdtype)
    if ts.ndim != 1 or ts.shape[0] == 0:
        raise ValueError(f"saveat.ts must be a non-empty 1-D array, got shape {ts.shape}")
    if members:
        check_member_save_times(checks, given, t0, t1)
    else:
        check_save_times(checks, saveat.ts, t0, t1)
    return ts, int(ts.shape[0])


def check_member_save_times(checks: Checks, ts: np.ndarray, t0s: np.ndarray,
                            t1s: np.ndarray) -> None:
    """``solve``'s save-time checks (:func:`simlib._validate.check_save_times`, its
    messages) for every member's span: on the first member whose span misses a save time
    (or that is NaN), else on the first member of each direction of integration; the
    message names the member."""
    lo, hi = np.minimum(t0s, t1s), np.maximum(t0s, t1s)
    missed = ((ts[None, :] < lo[:, None]) | (ts[None, :] > hi[:, None])
              | np.isnan(ts)[None, :]).any(axis=1)
    if missed.any():
        members = [int(np.argmax(missed))]
    else:
        forward = t1s >= t0s
        members = [int(np.argmax(forward == d)) for d in (True, False) if (forward == d).any()]
    for i in members:
        try:
            check_save_times(checks, ts, t0s[i], t1s[i])
        except ValueError as err:
            span = f"t0 = {float(t0s[i])!r}, t1 = {float(t1s[i])!r}"
            raise ValueError(f"{err} (member {i}: {span})") from None
