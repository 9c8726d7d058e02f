"""Solvers: explicit Runge-Kutta tableaus, Rosenbrock methods and symplectic splittings."""

from ._base import AbstractSolver
from ._explicit_rk import (
    RK4,
    Bosh3,
    Dopri5,
    Dopri8,
    Euler,
    ExplicitRungeKutta,
    Heun,
    Midpoint,
    Tsit5,
)
from ._rosenbrock import Rosenbrock23
from ._sdirk import BackwardEuler, ImplicitMidpoint, Kvaerno3, Kvaerno5
from ._symplectic import (
    PEFRL,
    Leapfrog,
    SemiImplicitEuler,
    SymplecticSplitting,
    VelocityVerlet,
    Yoshida4,
)
from ._tableau import ButcherTableau

__all__ = [
    "AbstractSolver",
    "BackwardEuler",
    "ButcherTableau",
    "Bosh3",
    "Dopri5",
    "Dopri8",
    "Euler",
    "ExplicitRungeKutta",
    "Heun",
    "ImplicitMidpoint",
    "Kvaerno3",
    "Kvaerno5",
    "Leapfrog",
    "Midpoint",
    "PEFRL",
    "RK4",
    "Rosenbrock23",
    "SemiImplicitEuler",
    "SymplecticSplitting",
    "Tsit5",
    "VelocityVerlet",
    "Yoshida4",
]
