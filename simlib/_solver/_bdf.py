"""Variable-order, variable-step BDF/NDF in the quasi-constant step-size form.

The method of MATLAB's ``ode15s`` and scipy's ``BDF``: L. F. Shampine and M. W. Reichelt,
The MATLAB ODE suite, SIAM J. Sci. Comput. 18 (1997) 1-22, section 2, with the modified
divided differences of G. D. Byrne and A. C. Hindmarsh, A polyalgorithm for the numerical
solution of ordinary differential equations, ACM TOMS 1 (1975) 71-96.

The solution is carried as the backward differences ``D_j = nabla^j y_n`` (``j = 0..k``)
for a constant step ``h``. The order-``k`` numerical differentiation formula (NDF) is

    sum_{j=1}^{k} (1/j) nabla^j y_{n+1} = h f(t_{n+1}, y_{n+1}) + kappa_k gamma_k
                                           (y_{n+1} - y_{n+1}^(0)),

``gamma_k = sum_{j=1}^{k} 1/j``, ``kappa_k`` of the paper's Table 1 (``kappa = 0``: BDF).
With the predictor ``y^(0) = sum_{j<=k} D_j`` and the correction ``d = y_{n+1} - y^(0)``
it reads ``d - c f(t_{n+1}, y^(0) + d) + psi = 0`` with ``alpha_k = (1 - kappa_k)
gamma_k``, ``c = h / alpha_k`` and ``psi = sum_{j=1}^{k} gamma_j D_j / alpha_k``, solved by
simplified Newton with the matrix ``I - c J``. The local error is ``(kappa_k gamma_k +
1/(k+1)) d``; the error of orders ``k - 1`` and ``k + 1`` come from ``D_k`` and
``nabla^{k+2} y``. When the step changes by ``rho`` the differences are rescaled,
``D <- (R U)^T D`` (Shampine and Reichelt, section 2.2), and ``J`` and the LU factors
of ``I - c J`` are kept from step to step while Newton converges. The step's rescaling
and its update by the correction ``d`` are one matrix on the rows of ``[D; d]``, applied
after the step is accepted or rejected (the identity then), in one pass over ``D``.

The factors are also kept when ``c`` changes (with the step size or the order) by less
than ``lu_reuse`` relative to the ``c_lu`` they were built for, as CVODE does (A. C.
Hindmarsh et al., SUNDIALS, ACM TOMS 31 (2005) 363-396, section 2.1: ``|gamma /
gamma_old - 1| < 0.3``). Newton then solves with ``I - c_lu J`` and scales each
correction by ``2 / (1 + c / c_lu)``, which makes the stale iteration exact for
eigenvalues of ``c J`` near zero and near infinity; a Newton failure with stale factors
refactors for the current ``c`` (and ``J``, if it is not fresh) before the step is
rejected.

The step rule is the solver's own: :meth:`BDF.propose_step` (the solver protocol's hook,
which :meth:`simlib.PIDController.propose` hands the attempt to in place of its PID
formula) picks the order (among ``k - 1``, ``k``, ``k + 1``, after ``k + 1`` steps of
equal size) and the step factor; the controller clips the factor to its
``[factor_min, factor_max]`` and applies its ``dtmin``, ``dtmax`` and norm.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from .._linalg._base import Factorisation, LinearSolver
from ._base import AbstractSolver, PyTree, VectorField, register_static
from ._implicit import (
    LinearAlgebra,
    check_jac,
    check_linear_solver,
    flat_field,
    identity_mass,
    initial_derivative,
    mass_matvec,
    mass_of,
    member_cond,
    newton,
    refactor_where,
    rms_norm,
    step_mass,
    tangent_solver,
)

MAX_ORDER = 5
_ROWS = MAX_ORDER + 3  # D_0 .. D_{k+2}
# Shampine and Reichelt (1997), Table 1: the NDF's kappa (zero for order 5, as in ode15s)
_KAPPA = np.array([0.0, -0.1850, -1.0 / 9.0, -0.0823, -0.0415, 0.0])
_GAMMA = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, MAX_ORDER + 1))])


class BDFState(NamedTuple):
    """The history and linear algebra carried by :class:`BDF` from step to step.

    Attributes:
        D: ``(MAX_ORDER + 3, n)`` modified divided differences, for the step ``h``.
        d_last, update: The last step's correction ``d`` and the ``(MAX_ORDER + 3,
            MAX_ORDER + 4)`` matrix taking ``[D; d]`` (``D`` before the step) to the
            differences after it (the rescaling and the update), which
            :meth:`BDF.propose_step` applies if the step is accepted
            (:func:`_apply_update`); ``[I 0]`` after it.
        order: Current order ``k``.
        h: The step size ``D`` is scaled for.
        n_equal: Steps taken at this size and order (an order change needs ``k + 1``).
        fac: The linear solver's factorisation of ``I - c J`` (``fac.jac``: ``df/dy``,
            the last one evaluated, in the linear solver's format); ``c_lu`` the ``c`` it
            was built for (``nan`` before the first).
        jac_current: Whether ``J`` was evaluated at this step (no refresh on failure).
        jac_age, lu_age: Steps attempted since ``J`` was evaluated and since the
            factorisation.
        c_ratio: ``c / c_lu`` of the last step (``1``: factors built for it).
        n_jac, n_lu, n_newton: Counters (Jacobians, factorisations, Newton iterations).
        eta: Newton's last ``eta = theta / (1 - theta)`` (``inf`` before any rate was
            measured, and always without ``carry_rate``), for the next step's first iterate.
        rtol, atol: Tolerances (set by the adaptive driver, :meth:`BDF.set_tolerances`).
    """

    D: jax.Array
    d_last: jax.Array
    update: jax.Array
    order: jax.Array
    h: jax.Array
    n_equal: jax.Array
    fac: Factorisation
    c_lu: jax.Array
    jac_current: jax.Array
    jac_age: jax.Array
    lu_age: jax.Array
    c_ratio: jax.Array
    n_jac: jax.Array
    n_lu: jax.Array
    n_newton: jax.Array
    eta: jax.Array
    rtol: jax.Array
    atol: jax.Array


class BDFError(NamedTuple):
    """A step's error data: the local error estimate (flat), Newton's outcome, the
    iterations it took (both attempts when ``J`` was refreshed), ``y_{n+1}`` (for the scale
    ``atol + rtol |y_{n+1}|``) and the iterations of the last attempt (for the safety
    factor)."""

    error: jax.Array
    newton_failed: jax.Array
    iterations: jax.Array
    y1: jax.Array
    last_iterations: jax.Array


def _rows_sum(take, D, weights=None):
    """``sum_i [take_i] w_i D_i`` over the few (static) rows of the differences ``D``,
    written out row by row: XLA fuses it into one elementwise loop, where ``jnp.sum(...,
    axis=0)`` became a reduction that took 1 to 1.5 ms for 8 x 10,000 float64 on the CPU
    (jax 0.10; the BDF step's five such sums were half of a 10,000-state solve)."""
    out = jnp.zeros_like(D[0])
    for i in range(D.shape[0]):
        term = D[i] if weights is None else weights[i] * D[i]
        out = out + jnp.where(take[i], term, 0.0)
    return out


def _apply_update(update, D, d):
    """``update @ [D; d]`` (``update``: ``(rows, rows + 1)``), written out as a sum of
    ``rows + 1`` broadcast products: one elementwise pass over ``D`` (XLA fuses it into one
    loop), where a matrix product with the stacked ``[D; d]`` first copied ``D`` into the
    stack and then ran as a library call."""
    out = update[:, -1:] * d[None, :]
    for j in range(D.shape[0]):
        out = out + update[:, j:j + 1] * D[j][None, :]
    return out


def _update_matrix(order, dtype):
    """The ``(rows, rows + 1)`` matrix taking ``[D; d]`` (the differences for this step,
    and its correction ``d = y_{n+1} - y^(0)``) to the differences after the step
    (Shampine and Reichelt 1997, section 2): ``D_{k+2} <- d - D_{k+1}``, ``D_{k+1} <-
    d``, ``D_j <- d + sum_{i=j}^{k} D_i`` for ``j <= k``, the rows above ``k + 2``
    unchanged."""
    i = np.arange(_ROWS)[:, None]  # output row
    j = np.arange(_ROWS)[None, :]  # input row
    k = order
    m = jnp.where((i <= k) & (j >= i) & (j <= k), 1.0, 0.0)
    m = jnp.where((i == k + 2) & (j == k + 1), -1.0, m)
    m = jnp.where((i > k + 2) & (i == j), 1.0, m)
    col = jnp.where(i <= k + 2, 1.0, 0.0)
    return jnp.concatenate([m, col], axis=1).astype(dtype)


def _no_update(dtype):
    """``[I 0]``: the differences ``D`` as they are."""
    return jnp.asarray(np.eye(_ROWS, _ROWS + 1), dtype)


def _rescale_matrix(order, factor, dtype):
    """``(R U)`` of Shampine and Reichelt (1997), section 2.2, as a ``(_ROWS, _ROWS)``
    matrix: the ``(k+1) x (k+1)`` block for the order ``k`` and the identity elsewhere.

    ``R_{ij} = prod_{l=1}^{i} (l - 1 - rho j) / l`` (``R_{0j} = 1``) for the factor ``rho``,
    ``U`` the same with ``rho = 1``; ``D <- (R U)^T D`` re-expresses the interpolating
    polynomial's differences for the step ``rho h``.
    """
    i = np.arange(_ROWS)[:, None]
    j = np.arange(_ROWS)[None, :]

    def r_matrix(rho):
        m = jnp.where((i >= 1) & (j >= 1), (i - 1 - rho * j) / np.maximum(i, 1), 0.0)
        m = jnp.where(i == 0, 1.0, m)
        return jnp.cumprod(m.astype(dtype), axis=0)

    block = (i <= order) & (j <= order)
    eye = jnp.eye(_ROWS, dtype=dtype)
    r = jnp.where(block, r_matrix(factor), eye)
    u = jnp.where(block, r_matrix(jnp.asarray(1.0, dtype)), eye)
    return r @ u


class BDF(LinearAlgebra, AbstractSolver):
    """Variable-order (1 to ``max_order`` <= 5), variable-step NDF/BDF in quasi-constant
    step-size form (Shampine and Reichelt 1997, the method of ``ode15s`` and scipy's
    ``BDF``), for stiff problems, large ones especially.

    One Jacobian (``jac``: ``"fwd"``, ``"rev"`` or a callable ``jac(t, y, args)``) and one
    LU factorisation of ``I - c J`` (``c = h / alpha_k``) are reused across steps: ``J`` is
    re-evaluated only when Newton fails or converges too slowly, the LU when ``c`` (the
    step size or the order) changes by ``lu_reuse`` or more relative to the ``c`` it was
    built for, Newton's corrections being scaled by ``2 / (1 + c / c_lu)`` meanwhile
    (CVODE's rule). A step whose Newton iteration fails with a fresh ``J`` and factors is
    rejected and the step halved.

    Args:
        max_order: The highest order used (1 to 5); ``max_order = 1`` is an NDF(1), a
            variant of backward Euler.
        jac: How to get ``df/dy``.
        ndf: The numerical differentiation formulas (``True``, ode15s's default) or the
            plain BDFs (``False``, ``kappa = 0``).
        newton_max_iters: Newton iterations per attempt before a Jacobian refresh.
        linear_solver: How ``I - c J`` is stored, factorised and solved: ``None`` (dense
            LU, the default), ``simlib.BandedLU(lower, upper)``,
            ``simlib.SparseLU(jac_sparsity)`` or ``simlib.NewtonKrylov(...)``; usually
            set through ``solve``'s ``jac_sparsity``/``jac_bandwidth``/``linear_solver``
            (docs/pde.md).
        lu_reuse: Keep the factors while ``|c / c_lu - 1| < lu_reuse`` (CVODE: 0.3); ``0``
            refactors at every change of ``c``, as scipy's ``BDF`` and ``ode15s`` do.
        carry_rate, newton_coef: A cheaper Newton iteration, off by default (scipy's
            rule: at least two iterations at every step, converged when ``eta ||dy||
            <= min(0.03, sqrt(rtol))`` in units of ``atol + rtol |y|``).
            ``carry_rate=True`` carries the convergence rate from step to step, so that
            a step's first iterate converges when ``eta_0 ||dy_0||`` is within the
            tolerance, ``eta_0 = max(eta_old, uround)^0.8`` (Hairer and Wanner, *Solving
            ODEs II*, IV.8, as RADAU5; forgotten after a rejected step and for new
            factors). ``newton_coef`` (in ``(0, 1]``) replaces the tolerance by
            ``newton_coef / C_k``, ``C_k`` the error constant of order ``k``: that
            fraction of what the local error test allows (CVODE's nonlinear convergence
            coefficient). Measured with ``carry_rate=True, newton_coef=0.03`` on the
            Brusselators of docs/pde.md: 40-50% fewer evaluations of ``f`` and solves,
            errors up to 1.4x the default's at ``rtol`` 1e-8; the tolerance is at least
            ``10 eps / rtol`` either way.
    """

    order = 1  # the order it starts at (and the first step's size is chosen for)
    adaptive = True
    multistep = True
    accepts_mass = True  # M y' = f: the corrector M (d + psi) = c f (ode15s's DAE form)
    reference = (
        "L. F. Shampine and M. W. Reichelt, The MATLAB ODE suite, SIAM J. Sci. Comput. 18 "
        "(1997) 1-22; G. D. Byrne and A. C. Hindmarsh, ACM TOMS 1 (1975) 71-96"
    )

    def __init__(self, max_order: int = MAX_ORDER, jac: str | Callable = "fwd",
                 ndf: bool = True, newton_max_iters: int = 4,
                 linear_solver: LinearSolver | None = None, lu_reuse: float = 0.3,
                 carry_rate: bool = False, newton_coef: float | None = None) -> None:
        if not isinstance(max_order, int) or not 1 <= max_order <= MAX_ORDER:
            raise ValueError(f"max_order must be an int from 1 to {MAX_ORDER}; got {max_order!r}")
        if not isinstance(newton_max_iters, int) or newton_max_iters < 1:
            raise ValueError(f"newton_max_iters must be a positive int; got {newton_max_iters!r}")
        if not 0.0 <= float(lu_reuse) < 1.0:
            raise ValueError(f"lu_reuse must be in [0, 1); got {lu_reuse!r}")
        if not isinstance(carry_rate, bool):
            raise ValueError(f"carry_rate must be a bool; got {carry_rate!r}")
        if newton_coef is not None and not (isinstance(newton_coef, numbers.Real)
                                            and 0.0 < float(newton_coef) <= 1.0):
            raise ValueError(f"newton_coef must be a number in (0, 1] or None; got "
                             f"{newton_coef!r}")
        self.max_order = max_order
        self.newton_coef = None if newton_coef is None else float(newton_coef)
        self.carry_rate = carry_rate
        self.lu_reuse = float(lu_reuse)
        self.jac = check_jac(jac)
        self.ndf = bool(ndf)
        self.newton_max_iters = newton_max_iters
        self.linear_solver = check_linear_solver(linear_solver, self.jac)

    # ------------------------------------------------------------------ coefficients
    def _coefficients(self, dtype):
        kappa = _KAPPA if self.ndf else np.zeros_like(_KAPPA)
        alpha = (1.0 - kappa) * _GAMMA
        error_const = kappa * _GAMMA + 1.0 / np.arange(1, MAX_ORDER + 2)
        return (jnp.asarray(_GAMMA, dtype), jnp.asarray(alpha, dtype),
                jnp.asarray(error_const, dtype))

    # ------------------------------------------------------------------ protocol
    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> BDFState:
        g, v, unravel = flat_field(f, y, args)
        dtype = v.dtype
        n = v.size
        f0v = g(t, v) if f0 is None else ravel_pytree(f0)[0].astype(dtype)
        D = jnp.zeros((_ROWS, n), dtype).at[0].set(v)
        mass = mass_of(f, args)
        # D_1 = h y'(t) for the step h: stored for h = 1 and rescaled to the first step
        D = D.at[1].set(initial_derivative(mass, g, t, v, f0v))
        ls = self.bound_linear_solver(g, t, v)
        J = lax.stop_gradient(self.linearise(ls, g, f, t, v, unravel, args))
        # A = I: a placeholder (c_lu = nan)
        fac = ls.factor(J, jnp.asarray(0.0, dtype), identity_mass(ls, mass))
        nan = jnp.asarray(jnp.nan, dtype)
        zero = jnp.asarray(0, jnp.int32)
        return BDFState(D=D, d_last=jnp.zeros((n,), dtype), update=_no_update(dtype),
                        order=jnp.asarray(1, jnp.int32), h=jnp.asarray(1.0, dtype),
                        n_equal=zero, fac=fac, c_lu=nan,
                        jac_current=jnp.asarray(True), jac_age=zero, lu_age=zero,
                        c_ratio=jnp.asarray(1.0, dtype), n_jac=jnp.asarray(1, jnp.int32),
                        n_lu=zero, n_newton=zero, eta=jnp.asarray(jnp.inf, dtype),
                        rtol=jnp.asarray(1e-3, dtype),
                        atol=jnp.asarray(1e-6, dtype))

    @property
    def init_fevals(self) -> int:
        return 1

    def set_tolerances(self, state: BDFState, rtol, atol) -> BDFState:
        dtype = state.D.dtype
        return state._replace(rtol=jnp.asarray(rtol, dtype), atol=jnp.asarray(atol, dtype))

    def step(self, f: VectorField, t, y: PyTree, h, args, state: BDFState):
        g, v, unravel = flat_field(f, y, args)
        dtype = v.dtype
        gamma, alpha, error_const = self._coefficients(dtype)
        hh = jnp.asarray(h, dtype)
        k = state.order
        rows = jnp.arange(_ROWS)[:, None]

        # 1. the differences for this step size, (R U)^T D, are not formed: the predictor
        # y^(0) = sum_{j<=k} D_j and the corrector's constant part psi = sum_{j=1}^{k}
        # gamma_j D_j / alpha_k are read from the rows of D by the rescaling's weights, and
        # propose_step applies the rescaling and the update together (one pass over D)
        changed = hh != state.h
        rho = hh / jnp.where(state.h == 0, 1.0, state.h)
        rescale = jnp.where(changed, _rescale_matrix(k, rho, dtype).T, jnp.eye(_ROWS, dtype=dtype))
        row = jnp.arange(_ROWS)
        a_k = alpha[k]
        gamma_rows = jnp.concatenate([gamma, jnp.zeros(_ROWS - gamma.size, dtype)])
        weights = jnp.stack([jnp.where(row <= k, 1.0, 0.0),
                             jnp.where((row >= 1) & (row <= k), gamma_rows / a_k, 0.0)])
        weights = weights.astype(dtype) @ rescale

        def sums():
            return (_rows_sum(row >= 0, state.D, weights[0]),
                    _rows_sum(row >= 0, state.D, weights[1]))

        # a conditional whose branches are the same: its results are materialised once
        # (XLA's CPU backend removes optimisation barriers, and fused each of their
        # consumers, the scale, y_{n+1} and the error norm, with its own pass over D)
        y_pred, psi = lax.cond(hh == hh, sums, sums)
        n_equal = jnp.where(changed, 0, state.n_equal)

        # 2. predictor and the corrector's constant part
        t_new = t + h
        scale = state.atol + state.rtol * jnp.abs(y_pred)
        c = hh / a_k
        eps = jnp.finfo(dtype).eps
        if self.newton_coef is None:  # scipy's BDF, RADAU5
            newton_tol = jnp.minimum(0.03, jnp.sqrt(state.rtol))
        else:  # CVODE: newton_coef of the error test's unit, ||C_k d|| <= 1
            newton_tol = self.newton_coef / error_const[k]
        newton_tol = jnp.maximum(10 * eps / state.rtol, newton_tol)

        sg = lax.stop_gradient
        # CVODE's rule: keep the factors while c / c_lu is within lu_reuse of 1 (never
        # when c_lu is nan, before the first factorisation)
        c_ratio = sg(c / state.c_lu)
        refactor = (c != state.c_lu) & ~(jnp.abs(c_ratio - 1) < self.lu_reuse)
        # h = 0: the placeholder attempt of a member that has finished while the others of
        # a vmap-ed batch go on (its result is discarded). Without a mass matrix its
        # system is A = I, solved exactly below without new factors.
        idle = (hh == 0) if mass_of(f, args) is None else jnp.asarray(False)
        refactor = refactor & ~idle
        ls = self.bound_linear_solver(g, t, v)
        mass = step_mass(ls, mass_of(f, args), hh)
        mass_sg = None if mass is None else sg(mass)
        fac = refactor_where(ls, refactor, state.fac, state.fac.jac, sg(c), mass_sg)

        def apply_mass(x, m=mass):
            return mass_matvec(ls, state.fac.jac, m, x)

        def residual(d):  # M y' = f: M (d + psi) - c f (Shampine, Reichelt, Kierzenka 1999)
            return apply_mass(d + psi) - c * g(t_new, y_pred + d)

        # Newton runs on values cut from the autodiff graph (its while_loop is not
        # reverse-differentiable); lax.custom_root then gives the converged correction
        # its derivatives by the implicit function theorem, with the exact I - c J(y*).
        g_sg, _, _ = flat_field(f, y, jax.tree_util.tree_map(sg, args))
        t_sg, y_pred_sg, psi_sg, c_sg = sg(t_new), sg(y_pred), sg(psi), sg(c)
        scale_sg = sg(scale)

        # the first attempt's eta_0 (inf: no rate known, at least two iterations)
        # (unknown after a rejection and for new factors, whose rate was not measured)
        eta0 = None
        if self.carry_rate:
            eta0 = sg(jnp.where(refactor, jnp.inf, jnp.maximum(state.eta, eps) ** 0.8))

        def attempt(fac_, eta0_=None):
            if ls.exact:  # direct: solve with M - c_lu J, scale by 2 / (1 + c / c_lu)
                gain = jnp.where(fac_.c == c_sg, 1.0, 2.0 / (1.0 + c_sg / fac_.c))

                def solve(b):
                    x = ls.solve(fac_, b, field=g_sg)
                    x = jnp.where(gain == 1.0, x, gain.astype(x.dtype) * x)
                    return jnp.where(idle, b, x)
            else:  # iterative: the operator with the current c, the stale preconditioner
                fac_c = fac_._replace(c=c_sg)

                def solve(b):
                    return ls.solve(fac_c, b, field=g_sg)
            if mass is None:
                def rhs(y_, d_):
                    return c_sg * g_sg(t_sg, y_) - psi_sg - d_
            else:
                def rhs(y_, d_):
                    return c_sg * g_sg(t_sg, y_) - apply_mass(psi_sg + d_, mass_sg)
            return newton(rhs, solve, y_pred_sg, scale_sg,
                          tol=sg(newton_tol), max_iters=self.newton_max_iters,
                          accept_first=False, eta0=eta0_)

        first = attempt(fac, eta0)
        stale = fac.c != c_sg  # factors kept for another c
        refreshed = ~first.converged & (~state.jac_current | stale)
        # stale factors: refactor with the J kept; fresh ones: a new J as well
        new_jac = refreshed & ~state.jac_current & ~stale

        def linearise():
            return sg(self.linearise(ls, g_sg, f, t_sg, y_pred_sg, unravel,
                                     jax.tree_util.tree_map(sg, args)))

        if ls.factors_per_member:
            # the factors stay out of the conditional's results: returned unchanged by its
            # other branch they were copied at every step (1.1 MB on the 2,048-state
            # Brusselator, a quarter of its solve); the masked kernel factorises only the
            # members that refresh, and nothing when none does
            J_ = member_cond(refreshed & new_jac, linearise, lambda: fac.jac)
            fac = ls.factor_where(refreshed, fac, J_, c_sg, mass_sg)
            second = member_cond(refreshed, lambda: attempt(fac), lambda: first)
        else:
            def refresh():
                # under vmap: a Jacobian for every member only when some member needs one
                J_ = member_cond(new_jac, linearise, lambda: fac.jac)
                fac_ = ls.factor(J_, c_sg, mass_sg)
                return fac_, attempt(fac_)

            fac, second = member_cond(refreshed, refresh, lambda: (fac, first))
        converged = second.converged
        iterations = first.iterations + jnp.where(refreshed, second.iterations, 0)
        eta = jnp.asarray(jnp.inf, dtype)  # carried only with carry_rate
        if eta0 is not None:
            # the rate measured by the last attempt (two iterations or more), else eta_0
            # kept (unknown for refreshed factors)
            theta = second.rate
            measured = jnp.where(theta < 1, theta / jnp.maximum(1 - theta, eps), jnp.inf)
            eta = jnp.where(second.iterations >= 2, measured,
                            jnp.where(refreshed, jnp.inf, eta0))

        d = lax.custom_root(residual, jnp.zeros_like(y_pred), lambda _, __: second.d,
                            tangent_solver(ls, c))
        y_new = y_pred + d
        error = error_const[k] * d

        # 3. the differences after the step, update @ [D; d], applied by propose_step if
        # the step is accepted (a failed d, which no accepted step has, is zeroed: the
        # zeros of a rejection's [I 0] would not cancel a nan)
        after = _update_matrix(k, dtype)
        update = jnp.concatenate([after[:, :_ROWS] @ rescale, after[:, _ROWS:]], axis=1)
        d_last = jnp.where(jnp.isfinite(d), d, 0.0)
        # the state after an accepted step, complete in itself; a driver that goes through
        # propose_step does not use this D (XLA drops it): propose_step forms it again
        # from the update, selected by the acceptance, in its one pass over D
        D1 = _apply_update(update, state.D, d_last)

        one = jnp.asarray(1, jnp.int32)
        state1 = BDFState(
            D=D1, d_last=d_last, update=update, order=k, h=hh,
            n_equal=n_equal + 1, fac=fac, c_lu=fac.c.astype(dtype),
            jac_current=refreshed | state.jac_current,
            jac_age=jnp.where(new_jac, 0, state.jac_age + one),
            lu_age=jnp.where(refactor | refreshed, 0, state.lu_age + one),
            c_ratio=sg(c / fac.c).astype(dtype),
            n_jac=state.n_jac + new_jac.astype(jnp.int32),
            n_lu=state.n_lu + refactor.astype(jnp.int32) + refreshed.astype(jnp.int32),
            n_newton=state.n_newton + iterations, eta=sg(eta).astype(dtype), rtol=state.rtol,
            atol=state.atol)
        err = BDFError(error=error, newton_failed=~converged, iterations=iterations,
                       y1=y_new, last_iterations=second.iterations)
        dense = jnp.where(rows[: MAX_ORDER + 1] <= k, D1[: MAX_ORDER + 1], 0.0)
        return unravel(y_new), err, dense, state1

    def error_ratio(self, y: PyTree, y1: PyTree, err: BDFError, h, rtol, atol,
                    norm: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
        """RMS norm (or ``norm``) of the local error over ``atol + rtol |y_{n+1}|`` (as
        scipy's BDF), on the flattened state."""
        scale = atol + rtol * jnp.abs(err.y1)
        ratio = rms_norm(err.error, scale) if norm is None else norm(err.error / scale)
        return jnp.where(err.newton_failed, jnp.inf, ratio)

    def step_failed(self, err: BDFError):
        return err.newton_failed

    def propose_step(self, h, ratio, accept, err: BDFError, state: BDFState,
                     state1: BDFState, rtol, atol, controller: Any) -> tuple[jax.Array, BDFState]:
        """The next step's factor and carried state (Shampine and Reichelt 1997, 2.3): the
        solver's own step rule, called by :meth:`simlib.PIDController.propose` (which
        then clips the factor to its bounds and applies ``dtmin``/``dtmax``).

        Rejected: the old differences with the newest ``J``/LU, and the factor
        ``max(factor_min, s r^(-1/(k+1)))`` (``0.5`` after a Newton failure) with the safety
        ``s = safety (2 m + 1) / (2 m + iterations)``, ``m`` the Newton iteration limit.
        Accepted: the step is kept for ``k + 1`` steps; then the orders ``k - 1``, ``k``,
        ``k + 1`` are compared by ``r_j^(-1/(j+1))`` and the largest wins (factor at most
        ``factor_max``). ``safety``, ``factor_min`` and ``factor_max`` are the
        ``controller``'s (:class:`simlib.PIDController`: 0.9, 0.2 and 10, scipy's numbers).
        """
        safety_, min_factor = controller.safety, controller.factor_min
        max_factor = controller.factor_max
        dtype = state1.D.dtype
        _, _, error_const = self._coefficients(dtype)
        m = self.newton_max_iters
        safety = safety_ * (2 * m + 1) / (2 * m + err.last_iterations.astype(dtype))
        k = state1.order
        ratio = jnp.asarray(ratio, dtype)
        kf = k.astype(dtype)
        finite = jnp.isfinite(ratio)  # double where: no nan gradient from inf ** p
        r = jnp.where(finite, jnp.maximum(ratio, 1e-10), 1.0)
        rejected_factor = jnp.where(
            err.newton_failed, 0.5,
            jnp.where(finite, jnp.maximum(min_factor, safety * r ** (-1 / (kf + 1))),
                      min_factor))

        change = state1.n_equal >= k + 1
        # D from the state before the step: the step's outputs carry no derivative on an
        # attempt that is not finite (simlib._stepping.guarded_step), which is rejected
        D, d = state.D, state1.d_last

        def new_row(i):  # row i of the differences after the step
            return _apply_update(lax.dynamic_slice_in_dim(state1.update, i, 1), D, d)[0]

        def order_norms():  # the errors of orders k - 1 and k + 1, after the step's update
            scale = jnp.asarray(atol, dtype) + jnp.asarray(rtol, dtype) * jnp.abs(err.y1)
            d_k, d_k2 = new_row(k), new_row(k + 2)
            norm_m = jnp.where(k > 1, rms_norm(error_const[k - 1] * d_k, scale), jnp.inf)
            norm_p = jnp.where(k < self.max_order,
                               rms_norm(error_const[jnp.minimum(k + 1, MAX_ORDER)] * d_k2,
                                        scale), jnp.inf)
            return norm_m, norm_p

        # only when the order may change (every k + 1 accepted steps)
        inf = jnp.asarray(jnp.inf, dtype)
        norm_m, norm_p = lax.cond(accept & change, order_norms, lambda: (inf, inf))
        tiny = jnp.asarray(1e-10, dtype)
        norms = jnp.maximum(jnp.stack([norm_m, ratio, norm_p]), tiny)
        usable = jnp.isfinite(norms)
        factors = jnp.where(usable, norms, 1.0) ** (-1.0 / (kf + jnp.arange(3, dtype=dtype)))
        factors = jnp.where(usable, factors, 0.0)
        best = jnp.argmax(factors)
        accepted_factor = jnp.where(change, jnp.minimum(max_factor, safety * factors[best]),
                                    1.0)
        new_order = jnp.where(change, k + best.astype(jnp.int32) - 1, k)

        # accepted: the rescaled and updated differences, update @ [D; d]; rejected: the
        # old ones, [I 0] @ [D; d]; the newest J and factors either way. One pass over D,
        # and no select between two D-shaped arrays.
        kept = state._replace(fac=state1.fac, c_lu=state1.c_lu,
                              jac_current=state1.jac_current, jac_age=state1.jac_age,
                              lu_age=state1.lu_age, c_ratio=state1.c_ratio,
                              n_jac=state1.n_jac,
                              n_lu=state1.n_lu, n_newton=state1.n_newton,
                              eta=jnp.asarray(jnp.inf, dtype))
        accepted = state1._replace(order=new_order, jac_current=jnp.asarray(False))
        rebuilt = ("D", "d_last", "update")
        new_state = BDFState(**{
            name: (a if name in rebuilt else
                   jax.tree_util.tree_map(lambda x, y: jnp.where(accept, x, y), a, b))
            for name, a, b in zip(BDFState._fields, accepted, kept, strict=True)})
        update = jnp.where(accept, state1.update, _no_update(dtype))
        new_state = new_state._replace(D=_apply_update(update, D, d), d_last=d,
                                       update=_no_update(dtype))
        factor = jnp.where(accept, accepted_factor, rejected_factor)
        return factor.astype(jnp.result_type(h)), new_state

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        """``y(t + theta h)`` from the interpolating polynomial through the differences:
        ``sum_j D_j prod_{i<j} (theta - 1 + i) / (i + 1)``; ``y`` itself when ``h = 0``
        (a save time at ``t0``, before any step, whose ``dense`` is a placeholder)."""
        v, unravel = ravel_pytree(y)
        th = jnp.asarray(theta, dense.dtype)
        i = jnp.arange(MAX_ORDER, dtype=dense.dtype)
        weights = jnp.concatenate([jnp.ones((1,), dense.dtype),
                                   jnp.cumprod((th - 1 + i) / (i + 1))])
        return unravel(jnp.where(h == 0, v.astype(dense.dtype), weights @ dense))

    def num_fevals(self, n_steps, n_accepted):
        """None per se: every evaluation is a Newton iteration, counted in the state."""
        return 0 * n_steps

    def state_fevals(self, state: BDFState):
        """The Newton iterations of every attempt (one evaluation of ``f`` each); the
        Jacobians (``state.n_jac``, a ``jacfwd`` or ``jacrev`` each) are not counted."""
        return state.n_newton


BDF.__module__ = "simlib"
register_static(BDF)
