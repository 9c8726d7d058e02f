"""simlib: differentiable physics simulation on JAX.

Integrate a vector field ``f(t, y, args)`` written in ``jax.numpy`` with
:func:`solve`, under ``jax.jit``, ``jax.vmap`` and ``jax.grad``.
simlib never changes JAX's global configuration: enable float64 yourself with
``jax.config.update("jax_enable_x64", True)`` when you need it.
"""

from . import io, particles, pde, systems
from ._adjoint import AbstractAdjoint, Checkpointed, Direct, Reversible
from ._auto import ForwardMode
from ._brownian import BrownianPath, split_keys
from ._compact import solve_ensemble
from ._control import PIDController
from ._cpu_loops import fast_cpu_loops
from ._distributed import ProcessInfo, init_distributed
from ._ensemble import ensemble, ensemble_mesh
from ._errors import Result, SolverError, raise_solver_errors
from ._events import Event, EventRecord
from ._linalg._banded import Banded as BandedLU
from ._linalg._dense import Dense as DenseLU
from ._linalg._krylov import Krylov as NewtonKrylov
from ._linalg._sparse import Sparse as SparseLU
from ._solve import SaveAt, Solution, solve
from ._solver import (
    BDF,
    PEFRL,
    RK4,
    SRA1,
    AbstractSDESolver,
    AbstractSolver,
    BackwardEuler,
    Bosh3,
    ButcherTableau,
    Dopri5,
    Dopri8,
    Euler,
    EulerMaruyama,
    ExplicitRungeKutta,
    Heun,
    ImplicitMidpoint,
    Kvaerno3,
    Kvaerno5,
    Leapfrog,
    Midpoint,
    Milstein,
    Rodas5,
    Rodas5P,
    Rosenbrock23,
    SemiImplicitEuler,
    StochasticHeun,
    SymplecticSplitting,
    Tsit5,
    VelocityVerlet,
    Yoshida4,
)
from ._version import __version__  # noqa: F401 - the package version
from .fit import (
    Bounded,
    FitResult,
    Identity,
    Positive,
    fit,
    least_squares,
    log_density,
    mse_loss,
    multiple_shooting,
    trajectory_residuals,
)


def __getattr__(name: str):
    """``simlib.plot`` is imported on first use, so that ``import simlib`` does not load
    matplotlib."""
    if name == "plot":
        import importlib

        return importlib.import_module(".plot", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AbstractAdjoint",
    "AbstractSDESolver",
    "AbstractSolver",
    "BDF",
    "BackwardEuler",
    "BandedLU",
    "Bosh3",
    "Bounded",
    "BrownianPath",
    "ButcherTableau",
    "Checkpointed",
    "DenseLU",
    "Direct",
    "Dopri5",
    "Dopri8",
    "Euler",
    "EulerMaruyama",
    "Event",
    "EventRecord",
    "ExplicitRungeKutta",
    "FitResult",
    "ForwardMode",
    "Heun",
    "Identity",
    "ImplicitMidpoint",
    "Kvaerno3",
    "Kvaerno5",
    "Leapfrog",
    "Midpoint",
    "Milstein",
    "NewtonKrylov",
    "PEFRL",
    "PIDController",
    "ProcessInfo",
    "Positive",
    "RK4",
    "Result",
    "Reversible",
    "Rodas5",
    "Rodas5P",
    "Rosenbrock23",
    "SRA1",
    "SaveAt",
    "SemiImplicitEuler",
    "Solution",
    "SparseLU",
    "SolverError",
    "StochasticHeun",
    "SymplecticSplitting",
    "Tsit5",
    "VelocityVerlet",
    "Yoshida4",
    "ensemble",
    "ensemble_mesh",
    "fast_cpu_loops",
    "fit",
    "io",
    "init_distributed",
    "least_squares",
    "log_density",
    "mse_loss",
    "multiple_shooting",
    "particles",
    "pde",
    "plot",
    "raise_solver_errors",
    "solve",
    "solve_ensemble",
    "split_keys",
    "systems",
    "trajectory_residuals",
]
