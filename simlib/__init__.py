"""simlib: differentiable physics simulation on JAX.

Integrate a vector field ``f(t, y, args)`` written in ``jax.numpy`` with
:func:`solve`, under ``jax.jit``, ``jax.vmap`` and ``jax.grad``.
simlib never changes JAX's global configuration: enable float64 yourself with
``jax.config.update("jax_enable_x64", True)`` when you need it.

``import simlib`` loads nothing but this file: each public name imports its module on first
use (PEP 562), so a command that only parses its arguments, or a script that uses the ODE
solvers alone, never loads the particle engine, file formats or plotting.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING

from ._version import __version__  # noqa: F401 - the package version

if TYPE_CHECKING:  # what each name is, for type checkers and the API reference
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
    from ._programs import keep_compiled_programs
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

# public name -> (module, attribute); attribute None: the name is the module itself
_LAZY = {
    "io": (".io", None),
    "particles": (".particles", None),
    "pde": (".pde", None),
    "systems": (".systems", None),
    "AbstractAdjoint": ("._adjoint", "AbstractAdjoint"),
    "Checkpointed": ("._adjoint", "Checkpointed"),
    "Direct": ("._adjoint", "Direct"),
    "Reversible": ("._adjoint", "Reversible"),
    "ForwardMode": ("._auto", "ForwardMode"),
    "BrownianPath": ("._brownian", "BrownianPath"),
    "split_keys": ("._brownian", "split_keys"),
    "solve_ensemble": ("._compact", "solve_ensemble"),
    "PIDController": ("._control", "PIDController"),
    "fast_cpu_loops": ("._cpu_loops", "fast_cpu_loops"),
    "ProcessInfo": ("._distributed", "ProcessInfo"),
    "init_distributed": ("._distributed", "init_distributed"),
    "ensemble": ("._ensemble", "ensemble"),
    "ensemble_mesh": ("._ensemble", "ensemble_mesh"),
    "Result": ("._errors", "Result"),
    "SolverError": ("._errors", "SolverError"),
    "raise_solver_errors": ("._errors", "raise_solver_errors"),
    "Event": ("._events", "Event"),
    "EventRecord": ("._events", "EventRecord"),
    "keep_compiled_programs": ("._programs", "keep_compiled_programs"),
    "BandedLU": ("._linalg._banded", "Banded"),
    "DenseLU": ("._linalg._dense", "Dense"),
    "NewtonKrylov": ("._linalg._krylov", "Krylov"),
    "SparseLU": ("._linalg._sparse", "Sparse"),
    "SaveAt": ("._solve", "SaveAt"),
    "Solution": ("._solve", "Solution"),
    "solve": ("._solve", "solve"),
    "BDF": ("._solver", "BDF"),
    "PEFRL": ("._solver", "PEFRL"),
    "RK4": ("._solver", "RK4"),
    "SRA1": ("._solver", "SRA1"),
    "AbstractSDESolver": ("._solver", "AbstractSDESolver"),
    "AbstractSolver": ("._solver", "AbstractSolver"),
    "BackwardEuler": ("._solver", "BackwardEuler"),
    "Bosh3": ("._solver", "Bosh3"),
    "ButcherTableau": ("._solver", "ButcherTableau"),
    "Dopri5": ("._solver", "Dopri5"),
    "Dopri8": ("._solver", "Dopri8"),
    "Euler": ("._solver", "Euler"),
    "EulerMaruyama": ("._solver", "EulerMaruyama"),
    "ExplicitRungeKutta": ("._solver", "ExplicitRungeKutta"),
    "Heun": ("._solver", "Heun"),
    "ImplicitMidpoint": ("._solver", "ImplicitMidpoint"),
    "Kvaerno3": ("._solver", "Kvaerno3"),
    "Kvaerno5": ("._solver", "Kvaerno5"),
    "Leapfrog": ("._solver", "Leapfrog"),
    "Midpoint": ("._solver", "Midpoint"),
    "Milstein": ("._solver", "Milstein"),
    "Rodas5": ("._solver", "Rodas5"),
    "Rodas5P": ("._solver", "Rodas5P"),
    "Rosenbrock23": ("._solver", "Rosenbrock23"),
    "SemiImplicitEuler": ("._solver", "SemiImplicitEuler"),
    "StochasticHeun": ("._solver", "StochasticHeun"),
    "SymplecticSplitting": ("._solver", "SymplecticSplitting"),
    "Tsit5": ("._solver", "Tsit5"),
    "VelocityVerlet": ("._solver", "VelocityVerlet"),
    "Yoshida4": ("._solver", "Yoshida4"),
    "Bounded": (".fit", "Bounded"),
    "FitResult": (".fit", "FitResult"),
    "Identity": (".fit", "Identity"),
    "Positive": (".fit", "Positive"),
    "fit": (".fit", "fit"),
    "least_squares": (".fit", "least_squares"),
    "log_density": (".fit", "log_density"),
    "mse_loss": (".fit", "mse_loss"),
    "multiple_shooting": (".fit", "multiple_shooting"),
    "trajectory_residuals": (".fit", "trajectory_residuals"),
    "plot": (".plot", None),
}


def __getattr__(name: str):
    """Import a public name's module on first use, and keep the name here after that."""
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = importlib.import_module(module, __name__)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """This package's module type: the public ``simlib.fit`` is the function, not the
    subpackage of the same name, whose first import sets the package's attribute to the
    module (the function is taken from it then)."""

    def __setattr__(self, name: str, value) -> None:
        if name == "fit" and isinstance(value, types.ModuleType):
            value = value.fit
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


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
    "keep_compiled_programs",
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
