"""Rosenbrock (linearly implicit) methods for stiff problems.

``Rosenbrock23`` is the modified Rosenbrock triple of Shampine and Reichelt (L. F. Shampine
and M. W. Reichelt, The MATLAB ODE suite, SIAM J. Sci. Comput. 18 (1997) 1-22, section 3),
the method of MATLAB's ``ode23s``. With ``d = 1 / (2 + sqrt 2)``, ``e32 = 6 + sqrt 2``,
``J = df/dy (t, y)``, ``T = df/dt (t, y)`` and ``W = I - h d J``, a step from ``(t, y)`` is

    F0 = f(t, y)
    k1 = W^-1 (F0 + h d T)
    F1 = f(t + h/2, y + h/2 k1)
    k2 = W^-1 (F1 - k1) + k1
    y1 = y + h k2
    F2 = f(t + h, y1)
    k3 = W^-1 (F2 - e32 (k2 - F1) - 2 (k1 - F0) + h d T)
    err = h / 6 (k1 - 2 k2 + k3)

``y1`` is second order and L-stable; ``err`` estimates its local error with a
third-order formula. ``F2`` is the next step's ``F0`` (carried, so two evaluations of
``f`` per step), and the continuous extension

    y(t + theta h) = y + h (theta (1 - theta) k1 + theta (theta - 2 d) k2) / (1 - 2 d)

is the paper's interpolant. ``J`` comes from ``jax.jacfwd`` and ``T`` from one ``jvp`` in
``t``, both on the flattened state (``jax.flatten_util.ravel_pytree``), and ``W`` is
factorised once per step (LU with partial pivoting) for the three solves: dense linear
algebra, ``O(n^3)`` per step, practical up to a few thousand states.

Every stage solve ``W x = b`` (``W = I - c J``, ``c = h d`` here, ``h gamma`` in the Rodas
methods) is refined once, ``x <- x + W^-1 (b - x + c J x)``, with ``J x`` from
``jax.linearize`` of ``f`` (one ``jvp`` per solve, on top of the factorisation of the
assembled ``J``; :func:`simlib._solver._implicit.refined_lu_solve`). A Rosenbrock
method takes each stage from a single linear solve, so the LU's backward error
``eps |L| |U| |x|`` stays in the stage, and with a stiff ``J`` it is large: on the E5
pyrolysis problem (Bari test set) it breaks the linear invariant ``y2 - y3 - y4 = 0``,
which an exact step keeps, enough to spoil the solution; refined, the drift falls close
to what the same steps give with exact linear algebra (the figures: docs/benchmarks.md,
"Design measurements", and docs/stiff.md). The correction uses ``f``'s own derivative: a
callable ``jac`` must be ``df/dy`` (one that is not is partly corrected towards it).

``Rodas5`` is the order-5(4) stiffly accurate Rosenbrock method RODAS5 of G. Di Marzo
(Universite de Geneve, 1993; see Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996,
IV.7), eight stages in the form of Hairer and Wanner's eq. (7.25), which needs no
matrix-vector product with ``J``: with ``M = I - h gamma J`` factorised once per step,

    (I / (h gamma) - J) u_i = f(t + c_i h, y + sum_j a_ij u_j) + sum_j C_ij / h u_j
                              + d_i h T,                           i = 1 .. 8,
    y1 = y + sum_j a_8j u_j + u_8,        err = u_8.

The last three stages sit at ``t + h`` and each adds its ``u`` to the previous stage's
argument (``c_6 = c_7 = c_8 = 1``, ``d_6 = d_7 = d_8 = 0``): the method is stiffly
accurate (``y1`` is the last stage's argument plus ``u_8``, so ``R(inf) = 0``), and
``u_8`` is the difference to the embedded order-4 solution (the eighth stage's argument).
Its continuous extension (order 4) is

    y(t + theta h) = (1 - theta) y + theta (y1 + (1 - theta) (K1 + theta (K2 + theta K3)))

with ``K_m = sum_j H_mj u_j``. ``Rodas5P`` (G. Steinebach, BIT Numer. Math. 63, 27, 2023)
has the same structure with other coefficients (``gamma = 0.2119...``), chosen for a
smaller error on stiff Prothero-Robinson problems ``y' = -lam (y - phi(t)) + phi'(t)`` and a
better dense output. The coefficients (``gamma``, ``a``, ``C``, ``c``, ``d`` and the dense
``H``) are those of the ``Rodas5`` and ``Rodas5P`` tableaus of OrdinaryDiffEq.jl (SciML);
tests/test_rosenbrock.py measures their orders. Every method here takes ``J`` from
:class:`simlib._solver._implicit.LinearAlgebra` (``jac="fwd"``, ``"rev"`` or a callable, and
the ``linear_solver``: dense LU by default, banded, sparse or Newton-Krylov).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._linalg._base import LinearSolver
from ._base import AbstractSolver, PyTree, VectorField, register_static
from ._implicit import (
    LinearAlgebra,
    check_jac,
    check_linear_solver,
    flat_field,
    mass_matvec,
    mass_of,
    refined_solve,
    step_mass,
)

_D = 1.0 / (2.0 + math.sqrt(2.0))
_E32 = 6.0 + math.sqrt(2.0)


class _Rosenbrock(LinearAlgebra, AbstractSolver):
    """What the Rosenbrock methods share: the ``jac=``/``linear_solver=`` settings and
    ``J``, ``df/dt`` and the stage solves."""

    accepts_mass = True  # M y' = f: solve's mass_matrix (Hairer and Wanner, VI.4)

    def __init__(self, jac: str | Callable = "fwd",
                 linear_solver: LinearSolver | None = None) -> None:
        self.jac = check_jac(jac)
        self.linear_solver = check_linear_solver(linear_solver, self.jac)

    def _linearise(self, f, t, y, args, c):
        """``g`` (flat field), ``v`` (flat ``y``), ``unravel``, ``T = df/dt``,
        ``solve(b)``, which solves ``(M - c J) x = b`` with ``J = df/dy`` at ``(t, y)``
        (``M = I`` for an ODE, the mass matrix of a DAE), and ``mass(x) = M x``: one
        factorisation by the linear solver and one refinement whose residual takes
        ``J x`` from ``f``'s ``jvp`` (see :func:`refined_solve`)."""
        g, v, unravel = flat_field(f, y, args)
        tt = jnp.asarray(t, jnp.result_type(t))
        ls = self.bound_linear_solver(g, tt, v)
        jac = self.linearise(ls, g, f, tt, v, unravel, args)
        _, tangent = jax.linearize(g, tt, v)  # (dt, dv) -> df/dt dt + df/dy dv
        dfdt = tangent(jnp.ones_like(tt), jnp.zeros_like(v)).astype(v.dtype)
        c = jnp.asarray(c, v.dtype)
        mass = step_mass(ls, mass_of(f, args), c)
        fac = ls.factor(jac, c, mass)
        zero_t = jnp.zeros_like(tt)

        def apply_mass(x):
            return mass_matvec(ls, jac, mass, x)

        def apply_a(x):  # A x through f's own jvp: the refinement's residual
            return apply_mass(x) - c * tangent(zero_t, x).astype(x.dtype)

        def operator(x):  # A x from the stored J: what the derivatives see
            return ls.matvec(fac.jac, fac.c, fac.mass, x, field=g)

        def refined(_, r):
            return refined_solve(ls, fac, apply_a, r, field=g)

        def transposed(_, r):
            return ls.solve(fac, r, field=g, transpose=True)

        def solve(b):
            # x = A^-1 b, differentiated as the exact solve it approximates (implicit
            # function theorem: dx = A^-1 (db - dA x), x the refined solution), not through
            # the refinement's arithmetic, whose derivative is the same up to round-off
            # but costs a second solve and a jvp of f per stage in reverse mode
            return lax.custom_linear_solve(operator, b, refined, transposed)

        return g, v, unravel, dfdt, solve, apply_mass


class Rosenbrock23(_Rosenbrock):
    """Shampine and Reichelt's L-stable Rosenbrock 2(3) pair, the method of MATLAB's
    ``ode23s`` (SIAM J. Sci. Comput. 18, 1997): order 2 with a third-order error estimate,
    its own dense output, a Jacobian from ``jax.jacfwd`` and one LU factorisation per step
    (each of its three solves refined once through a ``jvp`` of ``f``).

    Args:
        jac: ``"fwd"`` (``jax.jacfwd``, the default), ``"rev"`` (``jax.jacrev``) or a
            callable ``jac(t, y, args)`` returning ``df/dy`` on the flattened state, an
            ``(n, n)`` array (a hashable function: the solver compares by it).

    For stiff problems at modest accuracy (``rtol`` about 1e-3 to 1e-6). ``num_fevals``
    counts the two evaluations of ``f`` per step (and one for the first ``f(t0, y0)``),
    not the Jacobian (a forward-mode ``jacfwd``) and ``df/dt`` (one ``jvp``) also
    evaluated once per step, nor the three ``jvp`` products of the solves' refinement.
    """

    order = 2
    adaptive = True
    error_order = 2
    reference = (
        "L. F. Shampine and M. W. Reichelt, The MATLAB ODE suite, SIAM J. Sci. Comput. 18 "
        "(1997) 1-22"
    )
    fevals_per_step = 2
    init_fevals = 1

    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> PyTree:
        """``f(t, y)``, the first stage's right-hand side, reused from step to step."""
        return f(t, y, args) if f0 is None else f0

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        """One step of size ``h``. Returns ``(y1, err, (k1, k2), f(t + h, y1))``."""
        dtype = ravel_pytree(y)[0].dtype
        hh = jnp.asarray(h, dtype)
        g, v, unravel, dfdt, solve, mass = self._linearise(f, t, y, args, hh * _D)
        f0 = ravel_pytree(state)[0].astype(dtype)
        hdt = (hh * _D) * dfdt
        # M y' = f: W = M - h d J, and M multiplies the k terms (Hairer and Wanner VI.4)
        k1 = solve(f0 + hdt)
        f1 = g(t + 0.5 * h, v + (0.5 * hh) * k1)
        k2 = solve(f1 - mass(k1)) + k1
        v1 = v + hh * k2
        f2 = g(t + h, v1)
        k3 = solve(f2 - _E32 * (mass(k2) - f1) - 2.0 * (mass(k1) - f0) + hdt)
        err = (hh / 6.0) * (k1 - 2.0 * k2 + k3)
        return unravel(v1), unravel(err), (k1, k2), unravel(f2)

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        """``y(t + theta h)`` from the paper's interpolant (Shampine and Reichelt, sec. 3)."""
        k1, k2 = dense
        v, unravel = ravel_pytree(y)
        th = jnp.asarray(theta, v.dtype)
        hh = jnp.asarray(h, v.dtype)
        c1 = th * (1 - th) / (1 - 2 * _D)
        c2 = th * (th - 2 * _D) / (1 - 2 * _D)
        return unravel(v + hh * (c1 * k1 + c2 * k2))


Rosenbrock23.__module__ = "simlib"
register_static(Rosenbrock23)


class _RodasTableau(NamedTuple):
    """An eight-stage stiffly accurate Rosenbrock method in Hairer and Wanner's form (7.25):
    ``gamma``, the stage nodes ``c``, ``a`` and ``C`` (rows 1 to 8, strictly lower), the
    ``d_i = sum_j gamma_ij`` of the ``df/dt`` term and the dense-output matrix ``H``
    (3 x 8). Rows 7 and 8 of ``a`` continue row 6 by adding ``u_6``, then ``u_7``."""

    gamma: float
    c: tuple
    a: tuple
    C: tuple
    d: tuple
    H: tuple


def _rodas_a(rows5, row6):
    return (*rows5, row6, (*row6, 1.0), (*row6, 1.0, 1.0))


# Di Marzo's RODAS5 (1993), as in OrdinaryDiffEq.jl's Rodas5Tableau.
_RODAS5 = _RodasTableau(
    gamma=0.19,
    c=(0.0, 0.38, 0.3878509998321533, 0.4839718937873840, 0.4570477008819580, 1.0, 1.0, 1.0),
    a=_rodas_a(
        ((), (2.0,), (3.040894194418781, 1.041747909077569),
         (2.576417536461461, 1.622083060776640, -0.9089668560264532),
         (2.760842080225597, 1.446624659844071, -0.3036980084553738, 0.2877498600325443)),
        (-14.09640773051259, 6.925207756232704, -41.47510893210728, 2.343771018586405,
         24.13215229196062)),
    C=((), (-10.31323885133993,), (-21.04823117650003, -7.234992135176716),
       (32.22751541853323, -4.943732386540191, 19.44922031041879),
       (-20.69865579590063, -8.816374604402768, 1.260436877740897, -0.7495647613787146),
       (-46.22004352711257, -17.49534862857472, -289.6389582892057, 93.60855400400906,
        318.3822534212147),
       (34.20013733472935, -14.15535402717690, 57.82335640988400, 25.83362985412365,
        1.408950972071624, -6.551835421242162),
       (42.57076742291101, -13.80770672017997, 93.98938432427124, 18.77919633714503,
        -31.58359187223370, -6.685968952921985, -5.810979938412932)),
    d=(0.19, -0.1823079225333714636, -0.319231832186874912, 0.3449828624725343,
       -0.377417564392089818, 0.0, 0.0, 0.0),
    H=((27.354592673333357, -6.925207756232857, 26.40037733258859, 0.5635230501052979,
        -4.699151156849391, -1.6008677469422725, -1.5306074446748028, -1.3929872940716344),
       (44.19024239501722, 1.3677947663381929e-13, 202.93261852171622, -35.5669339789154,
        -181.91095152160645, 3.4116351403665033, 2.5793540257308067, 2.2435122582734066),
       (-44.0988150021747, -5.755396159656812e-13, -181.26175034586677, 56.99302194811676,
        183.21182741427398, -7.480257918273637, -5.792426076169686, -5.32503859794143)),
)

# Steinebach's Rodas5P (BIT 63, 27, 2023), as in OrdinaryDiffEq.jl's Rodas5PTableau.
_RODAS5P = _RodasTableau(
    gamma=0.21193756319429014,
    c=(0.0, 0.6358126895828704, 0.4095798393397535, 0.9769306725060716, 0.4288403609558664,
       1.0, 1.0, 1.0),
    a=_rodas_a(
        ((), (3.0,), (2.849394379747939, 0.45842242204463923),
         (-6.954028509809101, 2.489845061869568, -10.358996098473584),
         (2.8029986275628964, 0.5072464736228206, -0.3988312541770524,
          -0.04721187230404641)),
        (-7.502846399306121, 2.561846144803919, -11.627539656261098, -0.18268767659942256,
         0.030198172008377946)),
    C=((), (-14.155112264123755,), (-17.97296035885952, -2.859693295451294),
       (147.12150275711716, -1.41221402718213, 71.68940251302358),
       (165.43517024871676, -0.4592823456491126, 42.90938336958603, -5.961986721573306),
       (24.854864614690072, -3.0009227002832186, 47.4931110020768, 5.5814197821558125,
        -0.6610691825249471),
       (30.91273214028599, -3.1208243349937974, 77.79954646070892, 34.28646028294783,
        -19.097331116725623, -28.087943162872662),
       (37.80277123390563, -3.2571969029072276, 112.26918849496327, 66.9347231244047,
        -40.06618937091002, -54.66780262877968, -9.48861652309627)),
    d=(0.21193756319429014, -0.42387512638858027, -0.3384627126235924, 1.8046452872882734,
       2.325825639765069, 0.0, 0.0, 0.0),
    H=((25.948786856663858, -2.5579724845846235, 10.433815404888879, -2.3679251022685204,
        0.524948541321073, 1.1241088310450404, 0.4272876194431874, -0.17202221070155493),
       (-9.91568850695171, -0.9689944594115154, 3.0438037242978453, -24.495224566215796,
        20.176138334709044, 15.98066361424651, -6.789040303419874, -6.710236069923372),
       (11.419903575922262, 2.8879645146136994, 72.92137995996029, 80.12511834622643,
        -52.072871366152654, -59.78993625266729, -0.15582684282751913, 4.883087185713722)),
)


class _Rodas(_Rosenbrock):
    """An eight-stage stiffly accurate Rosenbrock 5(4) method given by ``_tableau``."""

    _tableau: _RodasTableau
    order = 5
    adaptive = True
    error_order = 4
    fevals_per_step = 8
    init_fevals = 0

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        """One step of size ``h``. Returns ``(y1, u_8, (K1, K2, K3), None)``."""
        tab = self._tableau
        dtype = ravel_pytree(y)[0].dtype
        hh = jnp.asarray(h, dtype)
        hg = hh * tab.gamma
        g, v, unravel, dfdt, solve, mass = self._linearise(f, t, y, args, hg)
        dae = mass_of(f, args) is not None
        # w_i = u_i / (h gamma), so that C_ij / h u_j = gamma C_ij w_j: no division by h
        # (a zero step, as in the masked attempts of a finished replay, stays finite)
        ws = []
        arg = v
        for i in range(8):
            arg = v
            for a, w in zip(tab.a[i], ws, strict=True):
                arg = arg + (a * hg) * w
            rhs = g(t + tab.c[i] * h, arg)
            if tab.d[i] != 0.0:
                rhs = rhs + (tab.d[i] * hh) * dfdt
            if ws and dae:  # M y' = f: M sum_j C_ij / h u_j (Hairer and Wanner VI.4)
                cw = sum((c * tab.gamma) * w for c, w in zip(tab.C[i], ws, strict=True))
                rhs = rhs + mass(cw)
            elif ws:
                for c, w in zip(tab.C[i], ws, strict=True):
                    rhs = rhs + (c * tab.gamma) * w
            ws.append(solve(rhs))  # (M - h gamma J) w = rhs
        err = hg * ws[-1]
        v1 = arg + err
        stack = jnp.stack(ws)
        dense = tuple(hg * (jnp.asarray(row, dtype) @ stack) for row in tab.H)
        return unravel(v1), unravel(err), dense, None

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, dense, theta):
        """``(1 - theta) y + theta (y1 + (1 - theta) (K1 + theta (K2 + theta K3)))``."""
        k1, k2, k3 = dense
        v, unravel = ravel_pytree(y)
        v1 = ravel_pytree(y1)[0]
        th = jnp.asarray(theta, v.dtype)
        return unravel((1 - th) * v + th * (v1 + (1 - th) * (k1 + th * (k2 + th * k3))))


class Rodas5P(_Rodas):
    """Steinebach's Rodas5P: an L-stable, stiffly accurate Rosenbrock method of order 5
    with an embedded order-4 estimate and an order-4 continuous extension (eight stages,
    eight evaluations of ``f``, one Jacobian, one ``df/dt`` and one LU per step; each
    stage's solve refined once through a ``jvp`` of ``f``).

    The recommended stiff method for ``rtol`` about 1e-4 to 1e-10: Rodas5's structure
    with coefficients chosen for a smaller error on stiff (Prothero-Robinson) problems and
    a more accurate dense output (G. Steinebach, BIT Numer. Math. 63, 27, 2023). See the
    module docstring for the scheme. ``num_fevals`` counts the eight evaluations of ``f``
    per step attempt, not the Jacobian (``n`` forward passes with ``jac="fwd"``) and
    ``df/dt`` (one ``jvp``) also evaluated once per attempt, nor the eight ``jvp``
    products of the stage solves' refinement.

    Args:
        jac: ``"fwd"`` (``jax.jacfwd``, the default), ``"rev"`` (``jax.jacrev``) or a
            callable ``jac(t, y, args)`` returning ``df/dy`` on the flattened state, an
            ``(n, n)`` array (a hashable function: the solver compares by it).
    """

    _tableau = _RODAS5P
    reference = (
        "G. Steinebach, Construction of Rosenbrock-Wanner method Rodas5P and numerical "
        "benchmarks within the Julia Differential Equations package, BIT Numer. Math. 63, "
        "27 (2023)"
    )


class Rodas5(_Rodas):
    """Di Marzo's RODAS5: an L-stable, stiffly accurate Rosenbrock method of order 5 with
    an embedded order-4 estimate and an order-4 continuous extension (eight stages, eight
    evaluations of ``f``, one Jacobian, one ``df/dt`` and one LU per step; each stage's
    solve refined once through a ``jvp`` of ``f``).

    The classical order-5 Rodas (Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996,
    IV.7); on stiff problems its error is less well controlled than :class:`Rodas5P`'s
    (order reduction on Prothero-Robinson-type problems), which is preferred. The scheme,
    the counting of ``num_fevals`` and the arguments are those of :class:`Rodas5P`; only
    the coefficients differ.
    """

    _tableau = _RODAS5
    reference = (
        "G. Di Marzo, RODAS5(4), Universite de Geneve (1993); E. Hairer and G. Wanner, "
        "Solving Ordinary Differential Equations II, 2nd ed. (1996), IV.7"
    )


for _cls in (Rodas5, Rodas5P):
    _cls.__module__ = "simlib"
    register_static(_cls)
