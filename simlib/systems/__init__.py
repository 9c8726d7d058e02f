"""Standard ODE systems as pure ``jax.numpy`` vector fields, plus ready-made problems.

Every vector field has the signature ``f(t, y, args)``: ``y`` is an array (or a
tuple ``(q, p)`` of arrays for the separable Hamiltonian systems) of float32 or
float64, whose precision is kept; ``args`` is a tuple of scalar parameters in
the documented order, and ``args=None`` selects the defaults (also available as
the ``*_DEFAULT_ARGS`` constants). The functions are ``jit``/``vmap``/``grad``
friendly.

Systems:
    * :func:`harmonic_oscillator` (with :func:`harmonic_oscillator_energy`,
      :func:`harmonic_oscillator_exact`)
    * :func:`damped_driven_pendulum`
    * :func:`lotka_volterra` (with :func:`lotka_volterra_invariant`)
    * :func:`lorenz`
    * :func:`van_der_pol`
    * :func:`kepler` (with :func:`kepler_energy`, :func:`kepler_angular_momentum`,
      :func:`kepler_exact`, :func:`kepler_elements`, :func:`solve_kepler_equation`)
    * :func:`double_pendulum` (with :func:`double_pendulum_energy`)

Reaction-diffusion PDEs by the method of lines (built on :mod:`simlib.pde`; the state's
leading axes are the grid, its last axis the species):
    * :func:`brusselator_1d` (with :func:`brusselator_1d_grid`,
      :func:`brusselator_1d_initial`): Hairer and Wanner's BRUSS, Dirichlet boundaries
    * :func:`brusselator_2d` (with :func:`brusselator_2d_grid`,
      :func:`brusselator_2d_initial`): the SciMLBenchmarks problem, periodic

Stochastic (drift and diffusion for ``simlib.solve(..., diffusion=)``):
    * :func:`ornstein_uhlenbeck_drift`, :func:`ornstein_uhlenbeck_diffusion` (with
      :func:`ornstein_uhlenbeck_moments`)
    * :func:`geometric_brownian_motion_drift`, :func:`geometric_brownian_motion_diffusion`
      (with :func:`geometric_brownian_motion_exact`,
      :func:`geometric_brownian_motion_moments`)

Index-1 differential-algebraic problems ``M y' = f(t, y, args)`` of the Bari test set
(Mazzia and Magherini), with their mass matrices, consistent initial values and published
reference solutions at ``t1``:
    * :func:`akzo_nobel` (:data:`AKZO_NOBEL`): the chemical Akzo Nobel problem
    * :func:`transistor_amplifier` (:data:`TRANSISTOR_AMPLIFIER`): the transistor amplifier
    :class:`DAEProblem` describes one, :data:`DAE_PROBLEMS` holds both and :func:`scd`
    counts significant correct digits as the test set does.

Problems:
    :class:`Problem` describes a standard set-up; :data:`PROBLEMS` holds one per
    system and :func:`get_problem` looks one up by name.
"""

from ._biology import LOTKA_VOLTERRA_DEFAULT_ARGS, lotka_volterra, lotka_volterra_invariant
from ._chaos import LORENZ_DEFAULT_ARGS, VAN_DER_POL_DEFAULT_ARGS, lorenz, van_der_pol
from ._dae import (
    AKZO_NOBEL,
    AKZO_NOBEL_DEFAULT_ARGS,
    AKZO_NOBEL_REFERENCE,
    AKZO_NOBEL_T1,
    DAE_PROBLEMS,
    TRANSISTOR_AMPLIFIER,
    TRANSISTOR_AMPLIFIER_DEFAULT_ARGS,
    TRANSISTOR_AMPLIFIER_REFERENCE,
    TRANSISTOR_AMPLIFIER_T1,
    DAEProblem,
    akzo_nobel,
    akzo_nobel_initial,
    akzo_nobel_mass_matrix,
    scd,
    transistor_amplifier,
    transistor_amplifier_initial,
    transistor_amplifier_initial_derivative,
    transistor_amplifier_mass_matrix,
)
from ._kepler import (
    KEPLER_DEFAULT_ARGS,
    KEPLER_NEWTON_ITERATIONS,
    KeplerElements,
    kepler,
    kepler_angular_momentum,
    kepler_elements,
    kepler_energy,
    kepler_exact,
    solve_kepler_equation,
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
from ._pde import (
    BRUSSELATOR_1D_DEFAULT_ARGS,
    BRUSSELATOR_2D_DEFAULT_ARGS,
    brusselator_1d,
    brusselator_1d_grid,
    brusselator_1d_initial,
    brusselator_2d,
    brusselator_2d_grid,
    brusselator_2d_initial,
)
from ._problem import PROBLEMS, Problem, get_problem
from ._stochastic import (
    GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS,
    ORNSTEIN_UHLENBECK_DEFAULT_ARGS,
    geometric_brownian_motion_diffusion,
    geometric_brownian_motion_drift,
    geometric_brownian_motion_exact,
    geometric_brownian_motion_moments,
    ornstein_uhlenbeck_diffusion,
    ornstein_uhlenbeck_drift,
    ornstein_uhlenbeck_moments,
)

__all__ = [
    "AKZO_NOBEL",
    "AKZO_NOBEL_DEFAULT_ARGS",
    "AKZO_NOBEL_REFERENCE",
    "AKZO_NOBEL_T1",
    "DAE_PROBLEMS",
    "TRANSISTOR_AMPLIFIER",
    "TRANSISTOR_AMPLIFIER_DEFAULT_ARGS",
    "TRANSISTOR_AMPLIFIER_REFERENCE",
    "TRANSISTOR_AMPLIFIER_T1",
    "DAEProblem",
    "akzo_nobel",
    "akzo_nobel_initial",
    "akzo_nobel_mass_matrix",
    "scd",
    "transistor_amplifier",
    "transistor_amplifier_initial",
    "transistor_amplifier_initial_derivative",
    "transistor_amplifier_mass_matrix",
    "BRUSSELATOR_1D_DEFAULT_ARGS",
    "BRUSSELATOR_2D_DEFAULT_ARGS",
    "DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS",
    "DOUBLE_PENDULUM_DEFAULT_ARGS",
    "GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS",
    "HARMONIC_OSCILLATOR_DEFAULT_ARGS",
    "KEPLER_DEFAULT_ARGS",
    "KEPLER_NEWTON_ITERATIONS",
    "LORENZ_DEFAULT_ARGS",
    "LOTKA_VOLTERRA_DEFAULT_ARGS",
    "ORNSTEIN_UHLENBECK_DEFAULT_ARGS",
    "PROBLEMS",
    "VAN_DER_POL_DEFAULT_ARGS",
    "KeplerElements",
    "Problem",
    "brusselator_1d",
    "brusselator_1d_grid",
    "brusselator_1d_initial",
    "brusselator_2d",
    "brusselator_2d_grid",
    "brusselator_2d_initial",
    "damped_driven_pendulum",
    "double_pendulum",
    "double_pendulum_energy",
    "geometric_brownian_motion_diffusion",
    "geometric_brownian_motion_drift",
    "geometric_brownian_motion_exact",
    "geometric_brownian_motion_moments",
    "get_problem",
    "harmonic_oscillator",
    "harmonic_oscillator_energy",
    "harmonic_oscillator_exact",
    "kepler",
    "kepler_angular_momentum",
    "kepler_elements",
    "kepler_energy",
    "kepler_exact",
    "lorenz",
    "lotka_volterra",
    "lotka_volterra_invariant",
    "ornstein_uhlenbeck_diffusion",
    "ornstein_uhlenbeck_drift",
    "ornstein_uhlenbeck_moments",
    "solve_kepler_equation",
    "van_der_pol",
]
