"""Step-size control: the controller object of adaptive runs and the automatic first step.

:class:`PIDController` holds everything that decides the next step from a step's
error: the exponents of the error ratios, the safety factor, the bounds on the change,
``dtmin``/``dtmax`` and the error norm. The adaptive drivers (``_adaptive.py`` and the
ensemble chunks of ``_compact.py``, through ``_stepping.py``) call its methods and hold
none of its constants.

References:
    Hairer, Norsett and Wanner, *Solving ODEs I*, 2nd ed. (1993), II.4 (initial step,
    error norm); Hairer and Wanner, *Solving ODEs II*, 2nd ed. (1996), IV.2 (the PI
    controller of Gustafsson, with exponents ``0.7/k`` and ``0.4/k``); K. Gustafsson,
    Control theoretic techniques for stepsize selection in explicit Runge-Kutta methods,
    ACM TOMS 17 (1991) 533-554; G. Soderlind, Digital filters in adaptive time-stepping,
    ACM TOMS 29 (2003) 1-26 (the PID form).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from ._solver._base import AbstractSolver, PyTree, VectorField, axpy, error_scale, safe_sqrt
from ._util import tree_where

Scalar = jax.Array | float
"""A time, step, tolerance or flag: a scalar array (traced or not) or a Python number."""

LOG_RATIO_FLOOR = math.log(1e-4)
"""``log r`` of an accepted step is floored here before it is remembered (a previous
ratio ``r_prev`` of at least ``1e-4``, as Hairer's DOPRI5 does)."""


def log_error_ratio(ratio: jax.Array) -> jax.Array:
    """``log r``, floored at ``log 1e-10``: below it the factor is clipped to
    ``factor_max`` anyway, and the floor keeps reverse mode free of ``log 0``."""
    return jnp.log(jnp.maximum(ratio, 1e-10))


def rms(tree: PyTree, scale: PyTree) -> jax.Array:
    """``sqrt(mean((tree / scale)^2))`` over every component of a pytree."""
    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, s: x / s, tree, scale))
    n = sum(x.size for x in leaves)
    return safe_sqrt(sum(jnp.sum(jnp.square(x)) for x in leaves) / n)


def _scaled_norm(norm: Callable[[PyTree], jax.Array] | None, tree: PyTree,
                 scale: PyTree) -> jax.Array:
    if norm is None:
        return rms(tree, scale)
    return norm(jax.tree_util.tree_map(lambda x, s: x / s, tree, scale))


def initial_step(f: VectorField, t0: Scalar, y0: PyTree, f0: PyTree, args: Any, direction: Scalar,
                 order: int, rtol: Scalar, atol: Scalar,
                 norm: Callable[[PyTree], jax.Array] | None = None) -> jax.Array:
    """Hairer's algorithm for the first step (Hairer et al. 1993, II.4, p. 169).

    ``d0 = ||y0||``, ``d1 = ||f0||``, ``h0 = 0.01 d0/d1``; one Euler step gives
    ``d2 = ||f(t0 + h0, y0 + h0 f0) - f0|| / h0``, and
    ``h1 = (0.01 / max(d1, d2))**(1/(order+1))``; the step is ``min(100 h0, h1)``.
    Norms are ``norm`` (``None``: the RMS norm) of the values over ``atol + rtol |y0|``.
    Returns a signed step.
    """
    scale = error_scale(y0, y0, rtol, atol)
    d0 = _scaled_norm(norm, y0, scale)
    d1 = _scaled_norm(norm, f0, scale)
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = jnp.where(small, 1e-6, 0.01 * d0 / jnp.where(small, 1.0, d1))
    y1 = axpy(y0, direction * h0, [(1.0, f0)])
    f1 = f(t0 + direction * h0, y1, args)
    d2 = _scaled_norm(norm, jax.tree_util.tree_map(lambda a, b: a - b, f1, f0), scale) / h0
    dmax = jnp.maximum(d1, d2)
    h1 = jnp.where(
        dmax <= 1e-15,
        jnp.maximum(1e-6, h0 * 1e-3),
        (0.01 / jnp.where(dmax <= 1e-15, 1.0, dmax)) ** (1.0 / (order + 1)),
    )
    return direction * jnp.minimum(100 * h0, h1)


def _positive(name: str, value: object, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"PIDController: {name} must be a positive finite number, "
                         f"got {value!r}")


@dataclasses.dataclass(frozen=True)
class PIDController:
    r"""The step-size controller of adaptive runs: a PID controller on the error ratio.

    A step of size ``h`` with scaled error ``r_n`` (``norm`` of the solver's local error
    estimate over ``atol + rtol max(|y_n|, |y_{n+1}|)``) is accepted when ``r_n <= 1``.
    With ``k`` the order of the error estimate plus one, the next step is ``h`` times

        accepted:  ``safety * r_n^(-beta1/k) * r_{n-1}^(beta2/k) * r_{n-2}^(-beta3/k)``
        rejected:  ``min(safety * r_n^(-1/k), factor_reject)``

    clipped to ``[factor_min, factor_max]`` (``factor_min`` when the error is not finite:
    a failed Newton iteration, a NaN). ``r_{n-1}``, ``r_{n-2}`` are the ratios of the
    last accepted steps (``1`` before there are any, floored at ``1e-4``). The default
    ``beta1 = 0.7``, ``beta2 = 0.4``, ``beta3 = 0`` is Gustafsson's PI controller (Hairer
    and Wanner, *Solving ODEs II*, 1996, IV.2; Gustafsson, ACM TOMS 17, 1991), which
    damps the oscillating step sizes an elementary ``r_n^(-1/k)`` controller
    (``beta1 = 1``, ``beta2 = 0``) shows where stability bounds the step. In the gains of
    Soderlind's digital filters (ACM TOMS 29, 2003), which diffrax's ``pcoeff``,
    ``icoeff``, ``dcoeff`` are, ``beta1 = kI + kP + kD``, ``beta2 = kP + 2 kD``,
    ``beta3 = kD``.

    Then the next step is capped at ``dtmax``; a proposed step shorter than ``dtmin``
    that does not reach ``t1`` stops the run with ``Result.STEP_SIZE_TOO_SMALL`` (so does
    a step below the resolution of ``t``, with or without ``dtmin``). The automatic first
    step (Hairer, Norsett and Wanner, *Solving ODEs I*, 1993, II.4), or ``dt``, is
    clipped to ``[dtmin, dtmax]``.

    A solver that chooses its own step and order (:class:`BDF`, through the solver
    protocol's ``propose_step``, Shampine and Reichelt 1997, 2.3) proposes the factor
    itself; the controller still clips it to ``[factor_min, factor_max]``, applies
    ``dtmin``/``dtmax`` and supplies the norm.

    The fields are static: a controller is part of what a compiled solve is specialised
    to (as the solver is), and a different one compiles anew.

    Args:
        beta1, beta2, beta3: Exponents (times ``k``) of this step's error ratio and of
            the last two accepted steps'.
        safety: Safety factor, in ``(0, 1]``.
        factor_min, factor_max: Bounds on the change of the step from one attempt to
            the next (``factor_min <= 1 <= factor_max``).
        factor_reject: The largest factor after a rejected step (``1``: a rejected step
            is never followed by a longer one).
        dtmin: The shortest step allowed (``None``: no bound but the resolution of ``t``).
        dtmax: The longest step allowed (``None``: no bound).
        norm: ``norm(tree) -> scalar`` of the scaled error (and of the scaled state and
            derivative in the first-step choice), e.g. a max norm
            ``lambda e: max(jnp.max(jnp.abs(x)) for x in jax.tree_util.tree_leaves(e))``;
            ``None``: the RMS norm ``sqrt(mean(e^2))`` over every component.
        differentiate_steps: ``False`` (the default): the step sequence is frozen for
            derivatives (the factors and the automatic first step carry none): the
            gradient is the derivative of the discrete solution on the steps taken, which
            converges to the derivative of the exact solution as the tolerances shrink
            (Bock's internal numerical differentiation: H. G. Bock, in *Modelling of
            Chemical Reaction Systems*, Springer 1981, 102-125; diffrax holds the steps
            fixed too). ``True``: the exact derivative of the whole computation, the step
            sizes' dependence on the inputs through the error estimates included, which is
            what central differences of the same adaptive solve give while no attempt
            flips between accepted and rejected; on the transistor amplifier that gave
            gradients 30x off converged central differences where ``False`` agrees to
            1e-5, and on ``y' = -p sinh(y)`` 1.4e-4 off the closed form where ``False``
            is 3e-7 off (docs/dae.md, "Gradients: which adjoint").

    Example:
        >>> import jax.numpy as jnp, simlib as sl
        >>> sol = sl.solve(lambda t, y, a: -y, jnp.ones(1), 0.0, 10.0, solver=sl.Tsit5(),
        ...                rtol=1e-6, controller=sl.PIDController(dtmax=0.5))
        >>> int(sol.stats["num_steps"]) >= 20
        True
    """

    beta1: float = 0.7
    beta2: float = 0.4
    beta3: float = 0.0
    safety: float = 0.9
    factor_min: float = 0.2
    factor_max: float = 10.0
    factor_reject: float = 1.0
    dtmin: float | None = None
    dtmax: float | None = None
    norm: Callable[[PyTree], jax.Array] | None = None
    differentiate_steps: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.differentiate_steps, bool):
            raise TypeError(f"PIDController: differentiate_steps must be a bool, got "
                            f"{self.differentiate_steps!r}")
        for name in ("beta1", "beta2", "beta3"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not \
                    math.isfinite(value):
                raise ValueError(f"PIDController: {name} must be a finite number, got "
                                 f"{value!r}")
        for name in ("safety", "factor_min", "factor_max", "factor_reject"):
            _positive(name, getattr(self, name))
        _positive("dtmin", self.dtmin, allow_none=True)
        _positive("dtmax", self.dtmax, allow_none=True)
        if self.safety > 1:
            raise ValueError(f"PIDController: safety must be at most 1, got {self.safety!r}")
        if not self.factor_min <= 1.0 <= self.factor_max:
            raise ValueError(f"PIDController: need factor_min <= 1 <= factor_max, got "
                             f"{self.factor_min!r} and {self.factor_max!r}")
        if self.dtmin is not None and self.dtmax is not None and self.dtmin > self.dtmax:
            raise ValueError(f"PIDController: dtmin={self.dtmin!r} exceeds "
                             f"dtmax={self.dtmax!r}")
        if self.norm is not None and not callable(self.norm):
            raise TypeError(f"PIDController: norm must be callable or None, got "
                            f"{self.norm!r}")

    # ---- the first step
    def first_step(self, f: VectorField, solver: AbstractSolver, t0: Scalar, y0: PyTree,
                   f0: PyTree | None, args: Any, direction: Scalar, dt0: Scalar | None,
                   rtol: Scalar, atol: Scalar) -> jax.Array:
        """The signed first step: ``dt0`` if given, else Hairer's choice
        (:func:`initial_step`, from ``f0 = f(t0, y0)``), clipped to
        ``[dtmin, dtmax]``."""
        if dt0 is None:
            h0 = initial_step(f, t0, y0, f0, args, direction, solver.order, rtol, atol,
                              self.norm)
            if not self.differentiate_steps:  # frozen, as the factors are (``propose``)
                h0 = jax.lax.stop_gradient(h0)
        else:
            h0 = direction * jnp.abs(jnp.asarray(dt0, jnp.result_type(t0)))
        if self.dtmin is not None or self.dtmax is not None:
            h0 = direction * jnp.clip(jnp.abs(h0), self.dtmin, self.dtmax)
        return h0

    def init_memory(self, dtype: Any) -> tuple[jax.Array, ...]:
        """The carried ``log r`` of the last accepted steps (two with a ``beta3``)."""
        zero = jnp.asarray(0.0, dtype)
        return (zero, zero) if self.beta3 else (zero,)

    # ---- one attempt
    def error_ratio(self, solver: AbstractSolver, y: PyTree, y1: PyTree, err: PyTree, h: Scalar,
                    rtol: Scalar, atol: Scalar) -> jax.Array:
        """The step's scaled error: ``solver.error_ratio``, given ``norm`` if one is set."""
        if self.norm is None:
            return solver.error_ratio(y, y1, err, h, rtol, atol)
        return solver.error_ratio(y, y1, err, h, rtol, atol, norm=self.norm)

    def factor(self, log_ratio: jax.Array, memory: tuple[jax.Array, ...],
               k: int) -> jax.Array:
        """The step factor (the class docstring's formula) from ``log r_n`` and the
        remembered ``log r`` of earlier accepted steps, as one ``exp`` of a combination
        of logarithms rather than three ``pow`` calls (their cost: docs/benchmarks.md,
        "Design measurements")."""
        log_safety = math.log(self.safety)
        accepted = self.beta2 / k * memory[0] - self.beta1 / k * log_ratio
        if self.beta3:
            accepted = accepted - self.beta3 / k * memory[1]
        rejected = jnp.minimum(-log_ratio / k, math.log(self.factor_reject) - log_safety)
        log_factor = log_safety + jnp.where(log_ratio <= 0.0, accepted, rejected)
        log_min = math.log(self.factor_min)
        log_factor = jnp.clip(log_factor, log_min, math.log(self.factor_max))
        return jnp.exp(jnp.where(jnp.isfinite(log_ratio), log_factor, log_min))

    def propose(self, solver: AbstractSolver, h: Scalar, ratio: Scalar, accept: Scalar, err: PyTree,
                state: PyTree, state1: PyTree, memory: tuple[jax.Array, ...], k: int, rtol: Scalar,
                atol: Scalar) -> tuple[jax.Array, PyTree, tuple[jax.Array, ...]]:
        """``(factor, state_next, memory_next)`` after an attempt with error ratio
        ``ratio``: the PID factor, the solver's carried state (``state1`` if accepted,
        else ``state``), and the remembered ratios. A solver with its own rule
        (``propose_step``) gives the factor and the state itself, clipped here."""
        log_ratio = log_error_ratio(ratio)
        if solver.propose_step is None:
            factor = self.factor(log_ratio, memory, k)
            state_next = tree_where(accept, state1, state)
        else:
            factor, state_next = solver.propose_step(h, ratio, accept, err, state, state1,
                                                     rtol, atol, self)
            # a select, not jnp.clip: at a bound the solver's own min/max (BDF's
            # min(10, ...)) keeps its whole derivative
            factor = jnp.where(factor > self.factor_max, self.factor_max,
                               jnp.where(factor < self.factor_min, self.factor_min, factor))
        remembered = jnp.maximum(log_ratio, LOG_RATIO_FLOOR)
        memory_next = (jnp.where(accept, remembered, memory[0]),) + tuple(
            jnp.where(accept, memory[i - 1], memory[i]) for i in range(1, len(memory)))
        if not self.differentiate_steps:  # the class docstring, ``differentiate_steps``
            factor = jax.lax.stop_gradient(factor)
        return factor, state_next, memory_next

    def next_step(self, h: Scalar, factor: Scalar, direction: Scalar) -> jax.Array:
        """``h * factor``, capped at ``dtmax``."""
        h_next = h * factor
        if self.dtmax is not None:
            h_next = direction * jnp.minimum(jnp.abs(h_next), self.dtmax)
        return h_next

    def too_small(self, h_next: Scalar, t: Scalar, t_new: Scalar, t1: Scalar,
                  direction: Scalar) -> jax.Array:
        """Whether the step ``h_next`` proposed by an attempt from ``t`` (the run now at
        ``t_new``) is below what is allowed: the resolution of ``t`` (ten ulps), or
        ``dtmin`` where it does not reach ``t1``. The driver stops the run there
        (``Result.STEP_SIZE_TOO_SMALL``, or the reason the step failed)."""
        tiny = 10 * jnp.finfo(jnp.result_type(t)).eps * jnp.maximum(jnp.abs(t), 1.0)
        small = jnp.abs(h_next) < tiny
        if self.dtmin is not None:
            short = jnp.abs(h_next) < jnp.minimum(self.dtmin, direction * (t1 - t_new))
            small = small | short
        return small


jax.tree_util.register_pytree_node(PIDController, lambda c: ((), c), lambda c, _: c)
PIDController.__module__ = "simlib"

DEFAULT_CONTROLLER = PIDController()
"""The controller of adaptive runs given none."""

