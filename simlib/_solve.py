"""``solve()``: the one entry point for fixed-step and adaptive integration.

A short driver over ``_arguments.py`` (one keyword list, one normalisation and validation
step, shared with the SDE form in ``_sde.py`` and with ``solve_ensemble``): it checks its
arguments eagerly (naming the bad one), adds what an ODE needs (the vector field's
output, events, the implicit solvers' linear algebra, a mass matrix), then runs the
jitted fixed-step core (``_fixed.py``) or adaptive core (``_adaptive.py``) through
``_run.py``, which raises ``SolverError`` when a run fails and ``throw=True``.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.flatten_util
import jax.numpy as jnp

from ._adjoint import AbstractAdjoint
from ._arguments import (
    DEFAULT_MAX_STEPS,
    SAVE_T1,
    Problem,
    check_callable,
    check_field,
    check_initialize,
    check_keywords,
    check_solver,
    complete,
    is_sde,
    normalise,
)
from ._control import PIDController
from ._dae import MassField, initialise, prepare_mass, wrap_events
from ._errors import raise_solver_errors, reporting_failures
from ._events import Event, as_events, check_events
from ._run import fixed_count, run_adaptive, run_fixed
from ._sde import solve_sde
from ._solution import SaveAt, Solution
from ._solver._base import AbstractSolver, PyTree, VectorField
from ._solver._implicit import configure as configure_linear_solver

__all__ = ["DEFAULT_MAX_STEPS", "SaveAt", "Solution", "solve"]


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
    saveat: SaveAt = SAVE_T1,
    max_steps: int = DEFAULT_MAX_STEPS,
    throw: bool = True,
    controller: PIDController | None = None,
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
        controller: The step-size controller of an adaptive run, a
            :class:`PIDController`: its coefficients, bounds on the step change,
            ``dtmin``/``dtmax`` and error norm (docs/solving-odes.md); ``None`` (the
            default) is ``PIDController()``, the PI controller described above.
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

    Returns:
        A :class:`Solution`.

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> sol = sl.solve(lambda t, y, a: -a * y, jnp.array([1.0]), 0.0, 1.0,
        ...                solver=sl.Tsit5(), rtol=1e-8, atol=1e-10, args=2.0)
        >>> float(sol.ys[-1, 0])  # exp(-2)  # doctest: +ELLIPSIS
        0.1353...
    """
    check_keywords("solve", unknown)
    if reporting_failures():  # inside simlib.log_density: a failure is a result, not a raise
        throw = False
    check_solver(solver)
    check_callable(f, "f")
    check_initialize(initialize, mass_matrix)
    common = dict(solver=solver, dt=dt, rtol=rtol, atol=atol, args=args, saveat=saveat,
                  max_steps=max_steps, throw=throw, adjoint=adjoint, progress=progress,
                  controller=controller)
    linear = dict(jac_sparsity=jac_sparsity, jac_bandwidth=jac_bandwidth,
                  linear_solver=linear_solver)
    if is_sde(solver, diffusion, key, noise, brownian):
        if mass_matrix is not None:
            raise ValueError("mass_matrix (a DAE M y' = f) is not supported for SDEs; "
                             f"{type(solver).__name__} cannot take it")
        return solve_sde(f, y0, t0, t1, diffusion=diffusion, key=key, noise=noise,
                         brownian=brownian, events=events, **common, **linear)
    _check_symplectic(solver, y0)
    p = normalise("solve", f, y0, t0, t1, events=as_events(events), **common)
    p = _prepare_ode(p, mass_matrix, initialize, **linear)
    _check_stepping(p)
    p = complete(p)
    if p.adaptive:
        return run_adaptive(p)
    n_iter, n_grid = fixed_count(p)
    if p.events is not None:  # a step cut by an event with apply adds one step
        n_iter += sum(ev.capacity for ev in p.events
                      if ev.apply is not None and not ev.terminal)
    return run_fixed(p, n_iter, n_grid)


def _check_symplectic(solver: AbstractSolver, y0: Any) -> None:
    if solver.symplectic and not (isinstance(y0, tuple) and len(y0) == 2):
        raise TypeError(
            f"{type(solver).__name__} is a symplectic solver for separable systems: y0 must "
            f"be a tuple (q, p), got {type(y0).__name__}"
        )


def _prepare_ode(p: Problem, mass_matrix: Any, initialize: str, **linear: Any) -> Problem:
    """``p`` with what an ODE adds: ``f`` checked against ``y0`` (and cast to its dtypes),
    the events checked, the implicit solver's linear algebra configured, and a mass
    matrix checked, ``y0`` initialised on its algebraic equations and ``f`` wrapped as
    ``M y' = f`` (docs/dae.md)."""
    f = check_field(p.f, p.y0, p.args, p.tdtype)
    if p.events is not None:
        check_events(p.events, p.y0, p.args, p.tdtype)
    solver = configure_linear_solver(p.solver, f, p.y0, jnp.zeros((), p.tdtype), p.args,
                                     **linear)
    p = p._replace(f=f, solver=solver)
    if mass_matrix is None:
        return p
    flat = jax.flatten_util.ravel_pytree(p.y0)[0]
    m, m_fmt = prepare_mass(mass_matrix, solver, flat.size, flat.dtype, p.checks)
    rtol = p.atol if p.rtol is None else p.rtol
    atol = p.rtol if p.atol is None else p.atol
    y0 = initialise(f, p.y0, jnp.asarray(p.t0, p.tdtype), p.args, m, rtol, atol, initialize,
                    p.checks)
    return p._replace(f=MassField(f), y0=y0, args=(p.args, m_fmt),
                      events=wrap_events(p.events))


def _check_stepping(p: Problem) -> None:
    """The solver can take this run: an adaptive one needs an error estimate (and, with
    events, dense output); a fixed-step one needs ``dt`` and a solver that does not
    choose its own steps."""
    name = type(p.solver).__name__
    if p.adaptive:
        if not p.solver.adaptive:
            raise ValueError(
                f"rtol/atol were given, but {name} has no embedded error "
                "estimate; use an adaptive solver (Bosh3, Tsit5, Dopri5, Dopri8, Heun) or "
                "give dt without tolerances for a fixed-step run"
            )
        if p.events is not None and not p.solver.has_interpolant:
            raise ValueError(
                f"events need the solver's dense output to locate crossings in an adaptive "
                f"run, and {name} has no interpolate(); use a solver with "
                "one (the explicit Runge-Kutta methods, Rosenbrock23) or a fixed-step run")
        return
    if p.solver.propose_step is not None:
        raise ValueError(
            f"{name} chooses its own step size and order: give rtol/atol "
            "(an adaptive run); dt is then only its first step"
        )
    if p.dt is None:
        raise ValueError(
            f"{name} needs a step size: give dt for a fixed-step run"
            + (", or rtol/atol for an adaptive one" if p.solver.adaptive else "")
        )
