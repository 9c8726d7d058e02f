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
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import lu_factor, lu_solve

from ._base import AbstractSolver, PyTree, VectorField, register_static
from ._implicit import flat_field

_D = 1.0 / (2.0 + math.sqrt(2.0))
_E32 = 6.0 + math.sqrt(2.0)


class Rosenbrock23(AbstractSolver):
    """Shampine and Reichelt's L-stable Rosenbrock 2(3) pair, the method of MATLAB's
    ``ode23s`` (SIAM J. Sci. Comput. 18, 1997): order 2 with a third-order error estimate,
    its own dense output, a Jacobian from ``jax.jacfwd`` and one LU factorisation per step.

    For stiff problems at modest accuracy (``rtol`` about 1e-3 to 1e-6). ``num_fevals``
    counts the two evaluations of ``f`` per step (and one for the first ``f(t0, y0)``),
    not the Jacobian (a forward-mode ``jacfwd``) and ``df/dt`` (one ``jvp``) also
    evaluated once per step.
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
        g, v, unravel = flat_field(f, y, args)
        dtype = v.dtype
        hh = jnp.asarray(h, dtype)
        tt = jnp.asarray(t, jnp.result_type(t))
        f0 = ravel_pytree(state)[0].astype(dtype)
        jac = jax.jacfwd(g, argnums=1)(tt, v)
        _, dfdt = jax.jvp(lambda s: g(s, v), (tt,), (jnp.ones_like(tt),))
        dfdt = dfdt.astype(dtype)
        w = jnp.eye(v.size, dtype=dtype) - (hh * _D) * jac
        lu = lu_factor(w)
        hdt = (hh * _D) * dfdt
        k1 = lu_solve(lu, f0 + hdt)
        f1 = g(t + 0.5 * h, v + (0.5 * hh) * k1)
        k2 = lu_solve(lu, f1 - k1) + k1
        v1 = v + hh * k2
        f2 = g(t + h, v1)
        k3 = lu_solve(lu, f2 - _E32 * (k2 - f1) - 2.0 * (k1 - f0) + hdt)
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
