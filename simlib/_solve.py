"""``solve()``: the one entry point for fixed-step and adaptive integration.

It checks its arguments eagerly (naming the bad one), then calls the jitted fixed-step
core (``_fixed.py``) or adaptive core (``_adaptive.py``), and raises ``SolverError``
when a run fails and ``throw=True``.
"""

from __future__ import annotations

import difflib
import functools
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np

from ._adaptive import adaptive_jit as _adaptive_jit
from ._adjoint import AbstractAdjoint, Reversible, is_time_symmetric
from ._auto import AUTOMATIC
from ._control import PIDController, check_controller
from ._dae import INITIALIZE, MassField, initialise, prepare_mass, wrap_events
from ._errors import (
    Result,
    SolverError,
    raise_solver_errors,
    reporting_failures,
    result_message,
)
from ._events import Event, as_events, check_events
from ._fixed import fixed_iterations, grid_count, has_interpolant
from ._fixed import fixed_jit as _fixed_jit
from ._sde import solve_sde
from ._solution import SaveAt, Solution
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._solver._implicit import configure as configure_linear_solver
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
from .progress import active
from .progress import bar as progress_bar

DEFAULT_MAX_STEPS = 4096
_SAVE_T1 = SaveAt(t1=True)

__all__ = ["DEFAULT_MAX_STEPS", "SaveAt", "Solution", "solve"]

# --------------------------------------------------------------------------------------
# the entry point

_KEYWORDS = ("solver", "dt", "rtol", "atol", "args", "saveat", "max_steps", "throw", "adjoint",
             "events", "progress", "diffusion", "key", "noise", "brownian", "jac_sparsity",
             "jac_bandwidth", "linear_solver", "mass_matrix", "initialize", "controller")


def _as_array_tree(y0, name: str) -> PyTree:
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


def _check_scalar(x, name: str):
    """``x`` a scalar (a structural check, also for tracers); its value is checked by
    :func:`simlib._validate.check_times`, concrete or traced."""
    if x is None:
        return
    shape = jnp.shape(x)
    if shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {shape}")


class _CastToState:
    """``f`` with its output cast to the state's dtypes (a float32 state stays float32 when
    float64 parameters promote ``f``'s result). Hashes like ``f``, so jit caches still hit."""

    def __init__(self, f: VectorField):
        self.f = f

    def __call__(self, t, y, args):
        return jax.tree_util.tree_map(lambda o, x: o.astype(x.dtype), self.f(t, y, args), y)

    def __hash__(self) -> int:
        return hash((_CastToState, self.f))

    def __eq__(self, other) -> bool:
        return isinstance(other, _CastToState) and other.f == self.f


def _tolerances(rtol, atol, checks: Checks | None = None):
    """``(rtol, atol)`` of an adaptive run, one standing in for the other when missing;
    both must be positive and finite (concrete: refused now; traced: in the graph through
    ``checks``)."""
    rtol = atol if rtol is None else rtol
    atol = rtol if atol is None else atol
    _check_scalar(rtol, "rtol")
    _check_scalar(atol, "atol")
    check_tolerances(Checks("solve") if checks is None else checks, rtol, atol)
    return rtol, atol


def _raise_if_failed(sol, t1, max_steps: int) -> None:
    """Raise the :class:`SolverError` of an eager run whose ``sol.result`` is a failure."""
    code = int(sol.result)
    if code != 0:
        message = result_message(code, t=float(sol.stats["t_final"]),
                                 step=int(sol.stats["num_steps"]), t1=float(t1),
                                 max_steps=max_steps)
        raise SolverError("solve: " + message, Result(code), sol)


def _bar(on, total, unit: str):
    """The progress bar of an eager run (``simlib.progress``), receiving the compiled
    loop's reports while it is open; a do-nothing one when ``on`` is 0."""
    the_bar = progress_bar(bool(on), total, "solve", unit)
    return _Open(the_bar) if on else the_bar


class _Open:
    def __init__(self, the_bar):
        self.bar, self.route = the_bar, active("solve", the_bar)

    def __enter__(self):
        self.route.__enter__()
        return self.bar

    def __exit__(self, *exc):
        self.route.__exit__(*exc)
        self.bar.close()
        return False


def _describe(tree) -> str:
    return str(jax.tree_util.tree_map(lambda x: f"{x.dtype}{list(x.shape)}", tree))


def _message_first(fn):
    """``fn`` with a failure raised by compiled code while it runs (an eager ``vmap`` of
    ``solve`` executes there) re-raised as the :class:`SolverError` it carries: the
    message first, naming the member, the JAX error kept as ``err.jax_error`` instead of
    55 lines of chained traceback (:func:`simlib.raise_solver_errors`)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with raise_solver_errors():
            return fn(*args, **kwargs)

    return wrapped


@_message_first
def solve(
    f: VectorField,
    y0: PyTree,
    t0: float,
    t1: float,
    *,
    solver: AbstractSolver,
    dt: float | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    args: Any = None,
    saveat: SaveAt = _SAVE_T1,
    max_steps: int = DEFAULT_MAX_STEPS,
    throw: bool = True,
    adjoint: AbstractAdjoint | None = None,
    events: Event | list[Event] | tuple[Event, ...] | None = None,
    progress: bool = False,
    diffusion: VectorField | None = None,
    key: Any = None,
    noise: str | None = None,
    brownian: str | None = None,
    jac_sparsity: Any = None,
    jac_bandwidth: tuple[int, int] | None = None,
    linear_solver: Any = None,
    mass_matrix: Any = None,
    initialize: str = "check",
    controller: PIDController | None = None,
    **unknown: Any,
) -> Solution:
    """Integrate ``dy/dt = f(t, y, args)`` from ``t0`` to ``t1``.

    Fixed step when ``dt`` is given without tolerances: a ``lax.scan`` of steps of
    size ``dt`` whose last step lands exactly on ``t1``. Adaptive when ``rtol`` or
    ``atol`` is given: each step's embedded error estimate, scaled by
    ``atol + rtol * |y|`` componentwise, must have RMS norm at most one (Hairer,
    Norsett and Wanner 1993, II.4); a PI controller picks the next step; ``dt``, if
    given, is the first step, else Hairer's algorithm chooses it. Integration
    backwards (``t1 < t0``) works as well.

    Args:
        f: Vector field ``f(t, y, args)`` returning a pytree like ``y``.
        y0: Initial state, any pytree of arrays. For symplectic solvers a tuple ``(q, p)``.
        t0, t1: Start and end times.
        solver: A solver instance, e.g. ``simlib.Tsit5()``.
        dt: Fixed step size, or the first step of an adaptive run. Its sign may be
            omitted; a negative ``dt`` is only valid for a backward span.
        rtol, atol: Relative and absolute tolerances (adaptive runs). If only one is
            given, the other takes the same value.
        args: Parameters passed to ``f``; any pytree. Gradients flow to it.
        saveat: Which times to return, see :class:`SaveAt`.
        max_steps: Bound on the number of step attempts (adaptive runs, and fixed-step
            runs whose span or ``dt`` are traced under an outer ``jit``).
        throw: Raise :class:`SolverError` on failure (default). With ``False`` the
            failure is reported in ``Solution.result``, so one bad member of a
            ``vmap``-ped ensemble does not stop the others.
        adjoint: How ``jax.grad`` goes through the solve: :class:`Direct`,
            :class:`Checkpointed` (memory ~ sqrt of the steps) or :class:`Reversible`
            (fixed-step time-symmetric symplectic solvers; memory independent of the
            steps) or :class:`ForwardMode` (forward-mode Jacobian, for a few inputs).
            The default (``None``) chooses when the gradient is taken: forward mode for
            at most 8 differentiated input components, else reverse mode
            (``Checkpointed()`` for fixed-step runs of more than 1,024 steps,
            ``Direct()`` otherwise); the ``simlib`` logger reports the choice at level
            INFO (docs/gradients.md).
        events: An :class:`Event` or a list of them: zeros of ``cond(t, y, args)`` located
            on the dense output, recorded in ``Solution.events``, ending the run
            (``terminal``) or changing the state (``apply``). See docs/events.md.
        progress: Show a progress bar (off by default): steps for a fixed-step run, time
            for an adaptive one; a plain line every few seconds when standard error is not
            a terminal. Eager calls only: ignored under ``jit``, ``vmap`` and ``grad``.
            It never changes the result (docs/files.md).
        diffusion: For an SDE ``dy = f dt + g dW``: ``g(t, y, args)``, shaped as ``noise``
            implies; needs an SDE method (:class:`EulerMaruyama`, :class:`Milstein`,
            :class:`StochasticHeun`, :class:`SRA1`), ``dt`` and ``key`` (or, for
            :class:`StochasticHeun`, ``rtol``/``atol``: adaptive steps). See docs/sde.md.
        key: The JAX PRNG key of the SDE's Brownian path (one key, one path, whatever
            ``dt``).
        noise: ``"diagonal"`` (default: ``g`` like ``y``, one Brownian motion per
            component), ``"scalar"`` (``g`` like ``y``, one Brownian motion) or
            ``"general"`` (each leaf of ``g`` shaped like ``y``'s plus ``(m,)``).
        brownian: How the SDE's Brownian motion is drawn: ``"tree"`` (default: a
            :class:`BrownianPath`, the same path whatever ``dt``) or ``"steps"`` (a
            ``BrownianSteps``: one normal per step, fastest, but the path depends on
            the step sequence). See docs/sde.md.
        jac_sparsity: For the implicit solvers: the pattern of ``df/dy`` on the
            flattened state (a boolean ``(n, n)`` array or a scipy sparse matrix, as
            scipy's ``solve_ivp`` takes it; ``simlib.pde.pattern`` builds it for PDEs).
            ``J`` then comes from one JVP per colour of the pattern's columns and
            ``I - c J`` is factorised by a sparse LU.
        jac_bandwidth: For the implicit solvers: ``(lower, upper)``, ``df_i/dy_j = 0``
            for ``j < i - lower`` or ``j > i + upper``: ``J`` from ``lower + upper + 1``
            JVPs and a banded LU.
        linear_solver: ``"auto"`` (default), ``"dense"``, ``"banded"``, ``"sparse"``,
            ``"krylov"`` (matrix-free GMRES, ILU(0)-preconditioned when the native kernels
            load) or a linear-solver instance (:class:`DenseLU`, :class:`BandedLU`,
            :class:`SparseLU`, :class:`NewtonKrylov`). ``"auto"`` takes the banded LU for
            ``jac_bandwidth``; for ``jac_sparsity`` the banded LU when the pattern's band
            is at most 16 wide, else the sparse LU; with neither, dense LU below 256
            states, and from 256 states the pattern detected from ``f`` (banded or sparse
            as before) when at most 10% of ``J`` may be non-zero. ``"banded"``,
            ``"sparse"`` and ``"krylov"`` without a pattern detect it. The method and its
            step sequence are the same whichever is used (docs/pde.md).
        mass_matrix: A constant ``M`` for a differential-algebraic equation
            ``M y' = f(t, y, args)`` (docs/dae.md): an ``(n,)`` diagonal or an ``(n, n)``
            matrix on the flattened state, possibly singular (its zero rows/columns, or
            null spaces, are algebraic equations and variables; index-1 problems). Taken
            by :class:`Rodas5P`, :class:`Rodas5`, :class:`Rosenbrock23`, :class:`BDF`,
            :class:`Kvaerno5`, :class:`Kvaerno3` and :class:`BackwardEuler`, with any
            linear solver (banded/sparse: ``M`` zero outside the Jacobian's band or
            pattern; Krylov: a diagonal ``M`` only).
        initialize: With a singular ``mass_matrix``: ``"check"`` (default) refuses a
            ``y0`` off the algebraic equations by more than the tolerance (a
            ``ValueError`` naming the residual; traced:
            ``Result.INCONSISTENT_INITIAL_CONDITIONS``); ``"consistent"`` computes the
            algebraic components from the differential ones by Newton (as SUNDIALS IDA's
            ``IDACalcIC``), differentiably; ``"none"`` starts from ``y0`` unchecked.
        controller: The step-size controller of an adaptive run (default:
            ``PIDController()``, the PI controller): its coefficients, bounds on the
            step change, ``dtmin``/``dtmax`` and error norm (docs/solvers.md).

    Returns:
        A :class:`Solution`.

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> sol = sl.solve(lambda t, y, a: -a * y, jnp.array([1.0]), 0.0, 1.0,
        ...                solver=sl.Tsit5(), rtol=1e-8, atol=1e-10, args=2.0)
        >>> float(sol.ys[-1, 0])  # exp(-2)  # doctest: +ELLIPSIS
        0.1353...
    """
    if unknown:
        bad = next(iter(unknown))
        close = difflib.get_close_matches(bad, _KEYWORDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise TypeError(
            f"solve() got an unknown keyword argument {bad!r}{hint} "
            f"(valid keywords: {', '.join(_KEYWORDS)})"
        )
    if reporting_failures():  # inside simlib.log_density: a failure is a result, not a raise
        throw = False
    if isinstance(solver, type):
        raise TypeError(f"solver must be an instance, e.g. {solver.__name__}(), not the class")
    if not isinstance(solver, AbstractSolver):
        raise TypeError(
            f"solver must be a simlib solver instance such as simlib.Tsit5(), got {solver!r}"
        )
    if not callable(f):
        raise TypeError(f"f must be callable as f(t, y, args), got {f!r}")
    if initialize not in INITIALIZE:
        raise ValueError(f"initialize must be one of {INITIALIZE}; got {initialize!r}")
    if mass_matrix is None and initialize != "check":
        raise ValueError(f"initialize={initialize!r} applies to a DAE: give mass_matrix")
    if (diffusion is not None or key is not None or noise is not None
            or brownian is not None or isinstance(solver, AbstractSDESolver)):
        if mass_matrix is not None:
            raise ValueError("mass_matrix (a DAE M y' = f) is not supported for SDEs; "
                             f"{type(solver).__name__} cannot take it")
        return solve_sde(f, y0, t0, t1, solver=solver, diffusion=diffusion, key=key,
                         noise=noise, brownian=brownian, dt=dt, rtol=rtol, atol=atol,
                         args=args, saveat=saveat, max_steps=max_steps, throw=throw,
                         adjoint=adjoint, events=events, progress=progress,
                         controller=controller)
    check_controller(controller, rtol is not None or atol is not None)
    if adjoint is not None and not isinstance(adjoint, AbstractAdjoint):
        raise TypeError(
            "adjoint must be simlib.Direct(), simlib.Checkpointed(), simlib.Reversible() or "
            f"simlib.ForwardMode(), "
            f"got {adjoint!r}"
        )
    if isinstance(adjoint, Reversible) and not is_time_symmetric(solver):
        raise ValueError(
            f"adjoint=Reversible() needs a time-symmetric symplectic solver (VelocityVerlet, "
            f"Yoshida4, PEFRL, ImplicitMidpoint), got {type(solver).__name__}()"
        )
    events = as_events(events)
    if events is not None and isinstance(adjoint, Reversible):
        raise ValueError("events cannot be used with adjoint=Reversible() (its backward pass "
                         "retraces a fixed grid); use Direct(), Checkpointed() or "
                         "ForwardMode()")
    if not isinstance(saveat, SaveAt):
        raise TypeError(f"saveat must be a simlib.SaveAt, got {saveat!r}")
    mode = saveat.mode()
    if not isinstance(max_steps, int | np.integer) or max_steps <= 0:
        raise ValueError(f"max_steps must be a positive integer, got {max_steps!r}")
    max_steps = int(max_steps)

    if solver.symplectic and not (isinstance(y0, tuple) and len(y0) == 2):
        raise TypeError(
            f"{type(solver).__name__} is a symplectic solver for separable systems: y0 must "
            f"be a tuple (q, p), got {type(y0).__name__}"
        )
    y0 = _as_array_tree(y0, "y0")
    for name, x in (("t0", t0), ("t1", t1), ("dt", dt)):
        _check_scalar(x, name)
    checks = Checks("solve")
    check_state(checks, y0)
    check_times(checks, t0, t1, dt)
    check_args(checks, args)

    # The vector field must map y0's structure, shapes and dtypes onto themselves.
    tdtype = time_dtype(y0)
    try:
        out = jax.eval_shape(f, jax.ShapeDtypeStruct((), tdtype), y0, args)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling f(t0, y0, args) failed: {err}") from err
    in_struct = jax.tree_util.tree_structure(y0)
    out_struct = jax.tree_util.tree_structure(out)
    if in_struct != out_struct:
        raise ValueError(
            f"f must return the same pytree structure as y0: y0 is {in_struct}, "
            f"f returned {out_struct}"
        )
    for a, b in zip(jax.tree_util.tree_leaves(y0), jax.tree_util.tree_leaves(out), strict=True):
        if a.shape != b.shape:
            raise ValueError(
                f"f must return arrays shaped like y0: y0 is {_describe(y0)}, "
                f"f returned {_describe(out)}"
            )
    if any(a.dtype != b.dtype for a, b in zip(jax.tree_util.tree_leaves(y0),
                                               jax.tree_util.tree_leaves(out), strict=True)):
        f = _CastToState(f)

    if events is not None:
        check_events(events, y0, args, tdtype)
    solver = configure_linear_solver(solver, f, y0, jnp.zeros((), tdtype), args,
                                     jac_sparsity=jac_sparsity, jac_bandwidth=jac_bandwidth,
                                     linear_solver=linear_solver)
    if mass_matrix is not None:
        flat = jax.flatten_util.ravel_pytree(y0)[0]
        m, m_fmt = prepare_mass(mass_matrix, solver, flat.size, flat.dtype, checks)
        y0 = initialise(f, y0, jnp.asarray(t0, tdtype), args, m,
                        atol if rtol is None else rtol, rtol if atol is None else atol,
                        initialize, checks)
        f, args = MassField(f), (args, m_fmt)
        events = wrap_events(events)

    adaptive = rtol is not None or atol is not None
    check_resolution(checks, t0, t1, dt, tdtype)
    if mode == "ts":
        ts = jnp.asarray(saveat.ts, tdtype)
        if ts.ndim != 1 or ts.shape[0] == 0:
            raise ValueError(f"saveat.ts must be a non-empty 1-D array, got shape {ts.shape}")
        check_save_times(checks, saveat.ts, t0, t1)
        n_save = int(ts.shape[0])
    else:
        ts, n_save = None, 0

    # Concreteness is judged on what the caller passed: under an outer jit, jnp.asarray of
    # a numpy array is already a tracer, and the step count must still come from the host.
    traced = is_tracer((y0, t0, t1, dt, rtol, atol, args, saveat.ts)) or inside_trace()

    if adaptive:
        if not solver.adaptive:
            raise ValueError(
                f"rtol/atol were given, but {type(solver).__name__} has no embedded error "
                "estimate; use an adaptive solver (Bosh3, Tsit5, Dopri5, Dopri8, Heun) or "
                "give dt without tolerances for a fixed-step run"
            )
        if events is not None and not has_interpolant(solver):
            raise ValueError(
                f"events need the solver's dense output to locate crossings in an adaptive "
                f"run, and {type(solver).__name__} has no interpolate(); use a solver with "
                "one (the explicit Runge-Kutta methods, Rosenbrock23) or a fixed-step run")
        rtol, atol = _tolerances(rtol, atol, checks)
        # the run's own failures and the traced argument checks share one in-graph check
        in_graph_check = bool(throw) and traced and not checks.pending
        every = max(64, min(4096, max_steps // 100)) if progress and not traced else 0
        with _bar(every, abs(float(t1) - float(t0)) if every else 0.0, "t") as bar:
            sol = _adaptive_jit(f, solver, mode, saveat.t0, n_save, in_graph_check, max_steps,
                                AUTOMATIC if adjoint is None else adjoint,
                                y0, t0, t1, dt, rtol, atol, ts, args, events=events,
                                progress=every, controller=controller)
            if every:
                jax.block_until_ready(sol)
                bar.set(abs(float(sol.stats["t_final"]) - float(t0)))
    else:
        if solver.propose_step is not None:
            raise ValueError(
                f"{type(solver).__name__} chooses its own step size and order: give rtol/atol "
                "(an adaptive run); dt is then only its first step"
            )
        if dt is None:
            raise ValueError(
                f"{type(solver).__name__} needs a step size: give dt for a fixed-step run"
                + (", or rtol/atol for an adaptive one" if solver.adaptive else "")
            )
        if not is_tracer((t0, t1, dt, saveat.ts)):
            ts_np = None if ts is None else np.asarray(saveat.ts, np.float64)
            n_grid_host = grid_count(float(t0), float(t1), float(dt))
            n_iter = fixed_iterations(float(t0), float(t1), float(dt), ts_np)
            n_grid = jnp.asarray(n_grid_host, jnp.int32)
        else:
            n_iter = max_steps + n_save
            n_grid = None
        if events is not None:  # a step cut by an event with apply adds one step
            n_iter += sum(ev.capacity for ev in events
                          if ev.apply is not None and not ev.terminal)
        in_graph_check = bool(throw) and traced and not checks.pending
        every = -(-n_iter // 100) if progress and not traced and n_iter > 0 else 0
        with _bar(every, n_iter, "step") as bar:
            sol = _fixed_jit(f, solver, mode, saveat.t0, n_iter, n_save, in_graph_check,
                             max_steps, AUTOMATIC if adjoint is None else adjoint,
                             y0, t0, t1, dt, n_grid, ts, args, events=events, progress=every)
            if every:
                jax.block_until_ready(sol)
                bar.set(n_iter)

    sol = checks.apply(sol, throw=bool(throw), t1=t1, max_steps=max_steps)
    if throw and not traced:
        _raise_if_failed(sol, t1, max_steps)
    return sol
