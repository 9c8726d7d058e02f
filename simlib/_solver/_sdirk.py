"""Diagonally implicit Runge-Kutta methods solved by simplified Newton.

A (singly) diagonally implicit Runge-Kutta method with diagonal ``gamma`` computes its
stages one after the other: with ``k_j = f(t + c_j h, Z_j)``, stage ``i`` solves

    Z_i = y + h sum_{j<i} a_ij k_j + h gamma f(t + c_i h, Z_i)             (*)

for ``Z_i``. Every stage shares the iteration matrix ``M = I - h gamma J``, ``J = df/dy``
at the start of the step, so one Jacobian and one LU factorisation serve the whole step:
each stage runs the simplified Newton iteration of :func:`~simlib._solver._implicit.newton`
(Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996, IV.8) from the previous stage's value,
and ``k_i = (Z_i - y - h sum_{j<i} a_ij k_j) / (h gamma)`` is taken from the converged
stage (no extra evaluation of ``f``, and no amplification of the Newton error by the stiff
``h J``). A stage whose Newton iteration does not converge fails the step
(``step_failed``): an adaptive run rejects it and retries with a smaller step, a
fixed-step run reports ``Result.NEWTON_FAILED``.

Gradients: reverse mode cannot go through the Newton ``while_loop``, so each converged
stage is made differentiable by the implicit function theorem (``lax.custom_root``): the
tangent of ``Z_i`` solves ``(I - h gamma df/dy(Z_i)) dZ_i = d(rhs)`` with the exact
Jacobian at the converged stage. This is the derivative of the exact stage solution; it
differs from the derivative of the computed one by the Newton tolerance.

Newton tolerance: converged when the predicted remaining error of the stage, in RMS norm
relative to a scale, is at most one; the scale is floored at the round-off
``eps (10 (|y| + |h gamma f|) + rms(y))`` of a stage residual. In an adaptive run the
adaptive driver hands the run's ``rtol``/``atol`` to the carried state
(``set_tolerances``) and the scale is ``kappa (atol + rtol |y|)`` with
``kappa = 0.1 min(0.03, sqrt(rtol))`` (a tenth of the rule of Hairer and Wanner's RADAU5,
1996, IV.8, which BDF uses): 1e-3 at ``rtol`` 1e-4, 1e-6 at 1e-10; the factor and the
``sqrt(rtol)`` were chosen on Robertson, Van der Pol (mu = 1000) and the Oregonator against
the published values (the errors and step counts, and those of a constant ``kappa``:
docs/benchmarks.md, "Design measurements"). In a fixed-step run the scale is
``max(1e-10, 100 eps) |y|``. ``newton_rtol``/``newton_atol``, when given, override both:
the scale is then ``newton_atol + newton_rtol |y|``.

The linear algebra (one Jacobian and one factorisation of ``I - h gamma J`` per step) is
the solver's ``linear_solver`` (:mod:`simlib._linalg`): dense LU by default, ``O(n^3)``
per step and practical up to a few thousand states; banded, sparse or Newton-Krylov for
larger systems (docs/pde.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from .._linalg._base import LinearSolver
from ._base import AbstractSolver, PyTree, VectorField, register_static
from ._implicit import (
    LinearAlgebra,
    check_jac,
    check_linear_solver,
    flat_field,
    initial_derivative,
    mass_matvec,
    mass_of,
    newton,
    rms_norm,
    step_mass,
    tangent_solver,
)


def _check_tol(value, name: str):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | np.floating) or not (
            math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite float or None, got {value!r}")
    return float(value)


def _safe_div(x, d):
    """``x / d`` with ``0`` where ``d == 0`` (and no nan in its gradient)."""
    nonzero = d != 0
    return jnp.where(nonzero, x / jnp.where(nonzero, d, 1.0), 0.0)


class _ImplicitRK(LinearAlgebra, AbstractSolver):
    """Settings and the Newton stage solve shared by the diagonally implicit methods.

    Args:
        jac: ``"fwd"`` (``jax.jacfwd``, the default), ``"rev"`` (``jax.jacrev``) or a
            callable ``jac(t, y, args)`` returning ``df/dy`` as an ``(n, n)`` array on the
            flattened state.
        newton_rtol, newton_atol: Newton stops when its predicted remaining error, in RMS
            norm relative to ``newton_atol + newton_rtol |y|``, is at most one (a missing
            one of the two: ``max(1e-10, 100 eps)`` of the state's dtype, ``0``). Both
            ``None`` (the default): ``kappa (atol + rtol |y|)`` with the run's tolerances
            and ``kappa = 0.1 min(0.03, sqrt(rtol))`` in an adaptive run,
            ``max(1e-10, 100 eps) |y|`` at fixed steps. Floored at the round-off
            ``eps (10 (|y| + |h gamma f|) + rms(y))`` of a stage residual.
        max_newton_iters: Newton iterations per stage before the step fails (``None``:
            10 for the adaptive methods, where a failure only rejects the step, and 20 for
            the fixed-step ones, where it ends the run). The rate test also fails the
            iteration early when ``max_newton_iters`` cannot reach the tolerance at the
            observed contraction rate.
        linear_solver: How ``I - h gamma J`` is stored, factorised and solved: ``None``
            (dense LU, the default), ``simlib.BandedLU(lower, upper)``,
            ``simlib.SparseLU(jac_sparsity)`` or ``simlib.NewtonKrylov(...)``; usually set
            through ``solve``'s ``jac_sparsity``/``jac_bandwidth``/``linear_solver``
            (docs/pde.md).
    """

    default_newton_iters = 10

    def __init__(self, jac: str | Callable = "fwd", newton_rtol: float | None = None,
                 newton_atol: float | None = None, max_newton_iters: int | None = None,
                 linear_solver: LinearSolver | None = None) -> None:
        if max_newton_iters is None:
            max_newton_iters = self.default_newton_iters
        self.jac = check_jac(jac)
        self.newton_rtol = _check_tol(newton_rtol, "newton_rtol")
        self.newton_atol = _check_tol(newton_atol, "newton_atol")
        if isinstance(max_newton_iters, bool) or not isinstance(
                max_newton_iters, int | np.integer) or max_newton_iters < 1:
            raise ValueError(
                f"max_newton_iters must be a positive integer, got {max_newton_iters!r}")
        self.max_newton_iters = int(max_newton_iters)
        self.linear_solver = check_linear_solver(linear_solver, self.jac)

    kappa_factor: float = 0.1  # Newton tolerance / step tolerance: 0.1 min(0.03, sqrt(rtol))

    def _newton_scale(self, v: jax.Array, change: jax.Array, rtol=None, atol=None
                      ) -> jax.Array:
        """The Newton scale, at least ``10 eps (|v| + |change|) + eps rms(v)``: the
        round-off in evaluating a stage residual whose terms are about ``v`` and
        ``change`` (``h gamma f``), which no tolerance below it could ever meet.

        ``newton_atol + newton_rtol |v|`` when either is set; otherwise, in an adaptive
        run (``rtol > 0``: the run's tolerances, :meth:`set_tolerances`),
        ``kappa (atol + rtol |v|)`` with ``kappa = kappa_factor min(0.03, sqrt(rtol))``,
        and in a fixed-step run ``max(1e-10, 100 eps) |v|``."""
        eps = float(jnp.finfo(v.dtype).eps)
        if self.newton_rtol is None and self.newton_atol is None:
            fixed = max(1e-10, 100 * eps) * jnp.abs(v)
            if rtol is None:
                scale = fixed
            else:
                rtol, atol = lax.stop_gradient(rtol), lax.stop_gradient(atol)
                kappa = self.kappa_factor * jnp.minimum(0.03, jnp.sqrt(rtol))
                tied = kappa * (atol + rtol * jnp.abs(v))
                scale = jnp.where(rtol > 0, tied, fixed)
        else:
            nrtol = max(1e-10, 100 * eps) if self.newton_rtol is None else self.newton_rtol
            natol = 0.0 if self.newton_atol is None else self.newton_atol
            scale = natol + nrtol * jnp.abs(v)
        floor = eps * (10 * (jnp.abs(v) + jnp.abs(change)) + rms_norm(v, 1.0))
        return lax.stop_gradient(jnp.maximum(scale, floor))

    def _setup(self, f, t, y, h, args, gamma, k=None, rtol=None, atol=None):
        """The flattened field, state, ``h``, the linear solver, the factorisation of
        ``I - h gamma J(t, y)`` and the Newton scale (``k``: ``f(t, y)`` flattened, when
        known; ``rtol``/``atol``: the run's tolerances, when known)."""
        g, v, unravel = flat_field(f, y, args)
        dtype = v.dtype
        hh = jnp.asarray(h, dtype)
        ls = self.bound_linear_solver(g, t, v)
        jac = lax.stop_gradient(self.linearise(ls, g, f, t, v, unravel, args))
        mass = step_mass(ls, mass_of(f, args), hh)
        fac = ls.factor(jac, lax.stop_gradient(hh * gamma),
                        None if mass is None else lax.stop_gradient(mass))
        change = jnp.zeros_like(v) if k is None else (hh * gamma) * k
        scale = self._newton_scale(v, change, rtol, atol)
        return g, v, unravel, hh, (ls, fac, mass), scale

    def _stage(self, g, ts, base, hg, z0, linear, scale):
        """Solve ``Z = base + hg g(ts, Z)``: ``(Z, converged, iterations)``, differentiable in
        ``base``, ``hg``, ``ts`` and whatever ``g`` closes over by the implicit function
        theorem."""
        max_iters = self.max_newton_iters
        ls, fac, mass = linear

        def residual(z):  # M y' = f: M (Z - base) = hg f(Z) (Hairer and Wanner VI.1)
            if mass is None:
                return z - base - hg * g(ts, z)
            return mass_matvec(ls, fac.jac, mass, z - base) - hg * g(ts, z)

        def solve(fun, x0):
            res = newton(lambda z, _: -fun(z),
                         lambda b: ls.solve(fac, b, field=g), x0, scale, tol=1.0,
                         max_iters=max_iters, accept_first=True)
            # the flags travel as floats: custom_root gives a bool aux a bool tangent
            return res.z, (res.converged.astype(z0.dtype), res.iterations.astype(z0.dtype))

        z, (converged, iters) = lax.custom_root(residual, z0, solve, tangent_solver(ls, hg),
                                                has_aux=True)
        return (z, lax.stop_gradient(converged) > 0.5,
                lax.stop_gradient(iters).astype(jnp.int32))

    def step_failed(self, err: PyTree) -> jax.Array:
        """Whether a stage's Newton iteration did not converge in this step."""
        return err[1]


# ---------------------------------------------------------------------------- ESDIRK


class ESDIRKState(NamedTuple):
    """The state an ESDIRK method carries from step to step.

    Attributes:
        k: ``f(t, y)`` at the current point (first same as last).
        rtol, atol: The run's tolerances (:meth:`ESDIRK.set_tolerances`); ``0`` in a
            fixed-step run.
        n_newton: Newton iterations beyond the first of each stage (accepted steps).
    """

    k: PyTree
    rtol: jax.Array
    atol: jax.Array
    n_newton: jax.Array


class ESDIRK(_ImplicitRK):
    """A stiffly accurate ESDIRK pair: explicit first stage, diagonal ``gamma``, embedded
    solution equal to the second-to-last stage (so ``err = Z_s - Z_{s-1}``).

    Subclasses set ``gamma`` and ``a`` (the strictly lower rows 2..s of the Butcher
    matrix; the diagonal is ``gamma``, ``c_i`` their sums plus ``gamma``). ``y1 = Z_s``,
    whose ``k_s`` is ``f(t + h, y1)`` and starts the next step (first same as last).
    Dense output: the cubic Hermite interpolant of ``y``, ``f(t, y)``, ``y1`` and
    ``f(t + h, y1)`` (order 3).
    """

    adaptive = True
    accepts_mass = True  # stiffly accurate: y1 = Z_s solves the algebraic equations
    gamma: float = 0.0
    a: tuple[tuple[float, ...], ...] = ()
    init_fevals = 1

    @property
    def fevals_per_step(self) -> int:  # one per implicit stage: a lower bound
        return len(self.a)

    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> ESDIRKState:
        """``f(t, y)`` (the explicit first stage, carried from step to step), no
        tolerances yet (``0``: a fixed-step run) and the Newton counter."""
        k = f(t, y, args) if f0 is None else f0
        dtype = ravel_pytree(y)[0].dtype
        mass = mass_of(f, args)
        if mass is not None:  # the first stage's k is y'(t) of M y' = f
            g, v, unravel = flat_field(f, y, args)
            k = unravel(initial_derivative(mass, g, t, v, ravel_pytree(k)[0].astype(dtype)))
        zero = jnp.asarray(0.0, dtype)
        return ESDIRKState(k, zero, zero, jnp.asarray(0, jnp.int32))

    def set_tolerances(self, state: ESDIRKState, rtol, atol) -> ESDIRKState:
        """The run's ``rtol``/``atol``, which set the Newton tolerance (``newton_kappa``
        times them) when ``newton_rtol``/``newton_atol`` are not given."""
        dtype = state.rtol.dtype
        return state._replace(rtol=jnp.asarray(rtol, dtype), atol=jnp.asarray(atol, dtype))

    def state_fevals(self, state: ESDIRKState):
        """Newton iterations beyond the first of each stage, in accepted steps (the
        state of a rejected step is dropped, and its extra iterations with it)."""
        return state.n_newton

    def step(self, f: VectorField, t, y: PyTree, h, args, state: ESDIRKState):
        """One step. Returns ``(y1, (err, newton_failed), (k_1, k_s), state1)``."""
        gamma = self.gamma
        k_first = ravel_pytree(state.k)[0].astype(
            jnp.result_type(*jax.tree_util.tree_leaves(y)))
        g, v, unravel, hh, linear, scale = self._setup(f, t, y, h, args, gamma, k_first,
                                                   state.rtol, state.atol)
        hg = hh * gamma
        ks, z, ok = [k_first], v, jnp.asarray(True)
        z_prev = v
        extra = jnp.asarray(0, jnp.int32)
        for row in self.a:
            base = v
            for a_ij, k_j in zip(row, ks, strict=True):
                if a_ij != 0.0:
                    base = base + (hh * a_ij) * k_j
            c_i = sum(row) + gamma
            z_prev = z
            z, converged, iters = self._stage(g, t + c_i * h, base, hg, z, linear, scale)
            ks.append(_safe_div(z - base, hg))
            ok = ok & converged
            extra = extra + iters - 1
        err = z - z_prev
        k_last = jnp.where(hh == 0, k_first, ks[-1])
        state1 = state._replace(k=unravel(k_last), n_newton=state.n_newton + extra)
        return unravel(z), (unravel(err), ~ok), (k_first, k_last), state1

    def error_ratio(self, y: PyTree, y1: PyTree, err: PyTree, h, rtol, atol,
                    norm: Callable[[PyTree], jax.Array] | None = None) -> jax.Array:
        """The RMS (or ``norm``) error ratio of ``Z_s - Z_{s-1}``, ``inf`` when Newton
        failed."""
        ratio = super().error_ratio(y, y1, err[0], h, rtol, atol, norm=norm)
        return jnp.where(err[1], jnp.inf, ratio)

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        """Cubic Hermite ``y(t + theta h)`` from ``y, f(t, y), y1, f(t + h, y1)``."""
        v, unravel = ravel_pytree(y)
        th = jnp.asarray(theta, v.dtype)
        hh = jnp.asarray(h, v.dtype)
        k0, k1 = dense
        v1 = ravel_pytree(y1)[0]
        h00 = (1 + 2 * th) * (1 - th) ** 2
        h10 = th * (1 - th) ** 2
        h01 = th**2 * (3 - 2 * th)
        h11 = th**2 * (th - 1)
        return unravel(h00 * v + h01 * v1 + hh * (h10 * k0 + h11 * k1))


# Kvaerno, Singly diagonally implicit Runge-Kutta methods with an explicit first stage,
# BIT 44 (2004) 489-502. Order 3 with an embedded order 2, 4 stages: coefficients as
# closed forms in gamma (the paper's table for the 3(2) pair).
_G3 = 0.4358665215
_KVAERNO3_A = (
    (_G3,),
    ((-4 * _G3**2 + 6 * _G3 - 1) / (4 * _G3), (-2 * _G3 + 1) / (4 * _G3)),
    ((6 * _G3 - 1) / (12 * _G3), -1 / ((24 * _G3 - 12) * _G3),
     (-6 * _G3**2 + 6 * _G3 - 1) / (6 * _G3 - 3)),
)

# Kvaerno (2004), the 5(4) pair with 7 stages (gamma = 0.26); the same digits are in
# diffrax's and OrdinaryDiffEq.jl's Kvaerno5 tableaus.
_G5 = 0.26
_KVAERNO5_A = (
    (_G5,),
    (0.13, 0.84033320996790809),
    (0.22371961478320505, 0.47675532319799699, -0.06470895363112615),
    (0.16648564323248321, 0.10450018841591720, 0.03631482272098715,
     -0.13090704451073998),
    (0.13855640231268224, 0.0, -0.04245337201752043, 0.02446657898003141,
     0.61943039072480676),
    (0.13659751177640291, 0.0, -0.05496908796538376, -0.04118626728321046,
     0.62993304899016403, 0.06962479448202728),
)


class Kvaerno3(ESDIRK):
    """Kvaerno's ESDIRK 3(2) (BIT 44, 2004): 4 stages (3 implicit), stiffly accurate,
    L-stable, order 3 with an embedded L-stable order-2 estimate, cubic Hermite dense
    output. One Jacobian and one LU of ``I - h gamma J`` (``gamma = 0.4358665215``) per
    step, simplified Newton per stage. For stiff problems at ``rtol`` about 1e-3 to 1e-6.

    Args: see the module (``jac``, ``newton_rtol``, ``newton_atol``,
    ``max_newton_iters``). ``num_fevals`` counts one evaluation per implicit stage and
    attempt, plus the Newton iterations beyond the first of each stage in accepted steps
    (those of rejected steps are not counted: a lower bound).
    """

    order = 3
    error_order = 2
    gamma = _G3
    a = _KVAERNO3_A
    reference = (
        "A. Kvaerno, Singly diagonally implicit Runge-Kutta methods with an explicit first "
        "stage, BIT 44 (2004) 489-502"
    )


class Kvaerno5(ESDIRK):
    """Kvaerno's ESDIRK 5(4) (BIT 44, 2004): 7 stages (6 implicit), stiffly accurate,
    L-stable, order 5 with an embedded order-4 estimate, cubic Hermite dense output. One
    Jacobian and one LU of ``I - h gamma J`` (``gamma = 0.26``) per step, simplified
    Newton per stage. For stiff problems at ``rtol`` about 1e-6 to 1e-10. Arguments and
    the counting of ``num_fevals``: as :class:`Kvaerno3`.
    """

    order = 5
    error_order = 4
    gamma = _G5
    a = _KVAERNO5_A
    reference = Kvaerno3.reference


# ---------------------------------------------------------------------- fixed step


class _OneStage(_ImplicitRK):
    """A one-stage implicit method ``Z = y + h gamma f(t + gamma h, Z)``,
    ``y1 = y + (Z - y) / gamma``; fixed step, linear dense output."""

    adaptive = False
    fevals_per_step = 1
    default_newton_iters = 20
    gamma: float = 1.0

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        """One step. Returns ``(y1, (None, newton_failed), (), None)``."""
        gamma = self.gamma
        g, v, unravel, hh, linear, scale = self._setup(f, t, y, h, args, gamma)
        z, converged, _ = self._stage(g, t + gamma * h, v, hh * gamma, v, linear, scale)
        v1 = v + (z - v) / gamma
        return unravel(v1), (None, ~converged), (), None

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        """Linear interpolation between ``y`` and ``y1``."""
        return jax.tree_util.tree_map(lambda a, b: a + theta * (b - a), y, y1)


class BackwardEuler(_OneStage):
    """Backward (implicit) Euler, ``y1 = y + h f(t + h, y1)``: order 1, L-stable, fixed
    step. One Jacobian, one LU of ``I - h J`` and a simplified Newton iteration per step;
    ``Result.NEWTON_FAILED`` when it does not converge.

    Args: see ``Kvaerno5``. ``num_fevals`` counts one evaluation per step (a lower bound).
    """

    order = 1
    gamma = 1.0
    accepts_mass = True  # M (y1 - y) = h f(y1)
    reference = "Hairer and Wanner, Solving ODEs II, 2nd ed. (1996), IV.3"


class ImplicitMidpoint(_OneStage):
    """The implicit midpoint rule ``y1 = y + h f(t + h/2, (y + y1)/2)``: order 2, fixed
    step, A-stable (not L-stable), symplectic and time-symmetric, on any state (not only
    ``(q, p)``): it conserves quadratic invariants and keeps energy errors bounded over
    long runs (Hairer, Lubich and Wanner, *Geometric Numerical Integration*, 2nd ed.,
    2006, VI.3).

    Time symmetry, ``Phi_{-h}(Phi_h(y)) = y``, holds exactly for the exact solution of the
    midpoint equation, hence up to the Newton tolerance (``newton_rtol``/``newton_atol``,
    1e-10 relative by default in float64) for the computed one; so
    ``adjoint=sl.Reversible()`` accepts it, with a reconstruction error that grows with the
    number of steps times that tolerance. Solved as ``Z = y + h/2 f(t + h/2, Z)``,
    ``y1 = 2 Z - y``, with one LU of ``I - h/2 J`` per step.

    Args: see ``Kvaerno5``. ``num_fevals`` counts one evaluation per step (a lower bound).
    """

    order = 2
    gamma = 0.5
    time_symmetric = True
    reference = "Hairer, Lubich and Wanner, Geometric Numerical Integration (2006), VI.3"


for _cls in (ESDIRK, Kvaerno3, Kvaerno5, BackwardEuler, ImplicitMidpoint):
    _cls.__module__ = "simlib"
    register_static(_cls)
