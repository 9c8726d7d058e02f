"""Parameter estimation for ODE models: ``fit()``, transforms, losses, multiple shooting.

Write a loss of a parameter pytree (usually a trajectory misfit through
:func:`simlib.solve`), and :func:`fit` minimises it with any optax optimiser, in
compiled chunks with a progress bar, in an unconstrained space given by
:class:`Positive`, :class:`Bounded` and :class:`Identity` transforms, and reports
Gauss-Newton standard errors; :func:`least_squares` is Levenberg-Marquardt for residuals;
:func:`log_density` makes a log-likelihood through solves safe inside a sampler (NUTS).
:func:`multiple_shooting` builds losses for long or
chaotic horizons. See ``docs/fitting.md``.
"""

from ._bayes import log_density
from ._fit import FitResult, GaussNewton, fit, gauss_newton_covariance
from ._least_squares import least_squares
from ._losses import mse_loss, trajectory_residuals
from ._shooting import MultipleShooting, multiple_shooting
from ._transforms import Bounded, Identity, Positive, Transform

__all__ = [
    "Bounded",
    "FitResult",
    "GaussNewton",
    "Identity",
    "MultipleShooting",
    "Positive",
    "Transform",
    "fit",
    "gauss_newton_covariance",
    "least_squares",
    "log_density",
    "mse_loss",
    "multiple_shooting",
    "trajectory_residuals",
]
