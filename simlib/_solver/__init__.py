"""Solvers: explicit Runge-Kutta tableaus, Rosenbrock methods, BDF and symplectic splittings."""

from ._base import AbstractSolver
from ._bdf import BDF
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
from ._rosenbrock import Rodas5, Rodas5P, Rosenbrock23
from ._sde import SRA1, AbstractSDESolver, EulerMaruyama, Milstein, StochasticHeun
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
    "AbstractSDESolver",
    "AbstractSolver",
    "BDF",
    "BackwardEuler",
    "ButcherTableau",
    "Bosh3",
    "Dopri5",
    "Dopri8",
    "Euler",
    "EulerMaruyama",
    "ExplicitRungeKutta",
    "Heun",
    "ImplicitMidpoint",
    "Kvaerno3",
    "Kvaerno5",
    "Leapfrog",
    "Midpoint",
    "Milstein",
    "PEFRL",
    "RK4",
    "Rodas5",
    "Rodas5P",
    "Rosenbrock23",
    "SRA1",
    "SemiImplicitEuler",
    "StochasticHeun",
    "SymplecticSplitting",
    "Tsit5",
    "VelocityVerlet",
    "Yoshida4",
]
