"""Ready-made initial value problems for the systems in :mod:`simlib.systems`."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._biology import LOTKA_VOLTERRA_DEFAULT_ARGS, lotka_volterra, lotka_volterra_invariant
from ._chaos import LORENZ_DEFAULT_ARGS, VAN_DER_POL_DEFAULT_ARGS, lorenz, van_der_pol
from ._kepler import (
    KEPLER_DEFAULT_ARGS,
    kepler,
    kepler_energy,
    kepler_exact,
)
from ._mechanics import (
    DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS,
    DOUBLE_PENDULUM_DEFAULT_ARGS,
    HARMONIC_OSCILLATOR_DEFAULT_ARGS,
    damped_driven_pendulum,
    double_pendulum,
    double_pendulum_energy,
    harmonic_oscillator,
    harmonic_oscillator_energy,
    harmonic_oscillator_exact,
)


def _read_only_copy(x: Any) -> np.ndarray:
    """A read-only float64 numpy copy of ``x``."""
    a = np.array(x, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class Problem:
    """A standard initial value problem ``y' = f(t, y, args)``, ``y(t0) = y0`` on ``[t0, t1]``.

    ``y0`` is stored as read-only float64 numpy arrays (a single array, or a
    tuple of arrays for the separable Hamiltonian systems; anything else given
    is converted with ``np.array``), so the caller
    chooses the working precision, e.g. ``jax.tree_util.tree_map(jnp.asarray,
    problem.y0)``. ``args`` is a tuple of Python floats in the order documented
    by ``vector_field``. Problems compare by identity (arrays are not hashable).

    Attributes:
        name: Short identifier, the name of the vector field function.
        vector_field: ``f(t, y, args)``.
        y0: Initial state at ``t0``.
        t0: Initial time.
        t1: Final time.
        args: Parameters passed as the third argument of ``vector_field``.
        description: One-line human-readable description of the set-up.
        energy: A conserved quantity ``energy(y, args)``, or ``None`` if the
            system has none.
        exact: The closed-form solution ``exact(t, y0, args)`` (with ``y0``
            given at ``t = 0``), or ``None``.
    """

    name: str
    vector_field: Callable[..., Any]
    y0: Any
    t0: float
    t1: float
    args: tuple[float, ...]
    description: str
    energy: Callable[..., Any] | None = None
    exact: Callable[..., Any] | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Problem.name must be a non-empty string.")
        if not callable(self.vector_field):
            raise TypeError(f"Problem {self.name!r}: vector_field must be callable.")
        if not self.t1 > self.t0:
            raise ValueError(f"Problem {self.name!r}: need t1 > t0, got {self.t0}, {self.t1}.")
        if isinstance(self.y0, tuple):
            y0 = tuple(_read_only_copy(part) for part in self.y0)
        else:
            y0 = _read_only_copy(self.y0)
        object.__setattr__(self, "y0", y0)
        object.__setattr__(self, "args", tuple(float(a) for a in self.args))
        object.__setattr__(self, "t0", float(self.t0))
        object.__setattr__(self, "t1", float(self.t1))


def _kepler_perihelion(e: float, a: float = 1.0, mu: float = 1.0) -> tuple[np.ndarray, ...]:
    """``(q0, p0)`` at perihelion on the x axis, counter-clockwise, for given ``e``, ``a``."""
    r_peri = a * (1.0 - e)
    v_peri = math.sqrt(mu / a * (1.0 + e) / (1.0 - e))
    return np.array([r_peri, 0.0]), np.array([0.0, v_peri])


_KEPLER_E = 0.6

PROBLEMS: tuple[Problem, ...] = (
    Problem(
        name="harmonic_oscillator",
        vector_field=harmonic_oscillator,
        y0=(np.array([1.0]), np.array([0.0])),
        t0=0.0,
        t1=10.0,
        args=HARMONIC_OSCILLATOR_DEFAULT_ARGS,
        description="Harmonic oscillator, k = m = 1, from q = 1, p = 0 over about 1.6 periods.",
        energy=harmonic_oscillator_energy,
        exact=harmonic_oscillator_exact,
    ),
    Problem(
        name="damped_driven_pendulum",
        vector_field=damped_driven_pendulum,
        y0=np.array([0.2, 0.0]),
        t0=0.0,
        t1=30.0,
        args=DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS,
        description=(
            "Damped pendulum (g/L = 9.81, gamma = 0.5) driven at Omega = 2/3 with "
            "A = 1.2, from theta = 0.2 at rest; settles onto the driven response."
        ),
    ),
    Problem(
        name="lotka_volterra",
        vector_field=lotka_volterra,
        y0=np.array([10.0, 5.0]),
        t0=0.0,
        t1=15.0,
        args=LOTKA_VOLTERRA_DEFAULT_ARGS,
        description=(
            "Lotka-Volterra predator-prey cycles (alpha, beta, gamma, delta) = "
            "(1.5, 1, 3, 1) from 10 prey and 5 predators (the scipy solve_ivp example)."
        ),
        energy=lotka_volterra_invariant,
    ),
    Problem(
        name="lorenz",
        vector_field=lorenz,
        y0=np.array([1.0, 1.0, 1.0]),
        t0=0.0,
        t1=10.0,
        args=LORENZ_DEFAULT_ARGS,
        description="Lorenz attractor (sigma, rho, beta) = (10, 28, 8/3) from [1, 1, 1].",
    ),
    Problem(
        name="van_der_pol",
        vector_field=van_der_pol,
        y0=np.array([2.0, 0.0]),
        t0=0.0,
        t1=20.0,
        args=VAN_DER_POL_DEFAULT_ARGS,
        description="Van der Pol oscillator, mu = 1, from [2, 0]: about three limit-cycle periods.",
    ),
    Problem(
        name="kepler",
        vector_field=kepler,
        y0=_kepler_perihelion(_KEPLER_E),
        t0=0.0,
        t1=4.0 * math.pi,
        args=KEPLER_DEFAULT_ARGS,
        description=(
            f"Kepler orbit, mu = 1, a = 1, e = {_KEPLER_E}, starting at perihelion: "
            "two full periods (2 pi each)."
        ),
        energy=kepler_energy,
        exact=kepler_exact,
    ),
    Problem(
        name="double_pendulum",
        vector_field=double_pendulum,
        y0=np.array([math.pi / 2, math.pi / 2, 0.0, 0.0]),
        t0=0.0,
        t1=10.0,
        args=DOUBLE_PENDULUM_DEFAULT_ARGS,
        description=(
            "Double pendulum, unit masses and lengths, released from rest with both "
            "rods horizontal: chaotic."
        ),
        energy=double_pendulum_energy,
    ),
)
"""Ready-made problems, one per system, in a fixed order."""


def get_problem(name: str) -> Problem:
    """Look up a ready-made problem in :data:`PROBLEMS` by name.

    Args:
        name: One of ``"harmonic_oscillator"``, ``"damped_driven_pendulum"``,
            ``"lotka_volterra"``, ``"lorenz"``, ``"van_der_pol"``,
            ``"kepler"``, ``"double_pendulum"``.

    Returns:
        The :class:`Problem`.

    Raises:
        ValueError: If ``name`` is not the name of a problem; the message lists
            the valid names.
    """
    for problem in PROBLEMS:
        if problem.name == name:
            return problem
    valid = ", ".join(repr(p.name) for p in PROBLEMS)
    raise ValueError(f"Unknown problem {name!r}; valid names are: {valid}.")


__all__ = ["PROBLEMS", "Problem", "get_problem"]
