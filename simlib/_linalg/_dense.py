"""Dense Jacobians and LU with partial pivoting (LAPACK ``getrf``), for small systems.

``O(n^2)`` memory and ``O(n^3)`` work per factorisation: the right choice up to a few
hundred states, and for any Jacobian without exploitable structure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.lax.linalg import lu_pivots_to_permutation, triangular_solve
from jax.scipy.linalg import lu_factor

from .._static import register_static
from ._base import Array, Field, LinearSolver

JAC_MODES = ("fwd", "rev")


UNROLL_MAX = 16
"""Systems of at most this many unknowns are solved by substitution written out
(:func:`_substitute`) instead of LAPACK's ``trsm``: 2.7x faster for 1,000 batched 6 x 6
systems under ``vmap`` on the CPU (benchmarks/dae.py, ``--parts profile``)."""


def _substitute(lu: Array, rhs: Array, lower: bool, unit: bool, transpose: bool) -> Array:
    """``T^-1 rhs`` for the triangle ``T`` of ``lu`` (``T^T`` with ``transpose``) by
    forward or back substitution written out row by row (Golub and Van Loan, *Matrix
    Computations*, 4th ed., 2013, 3.1.1-3.1.2): ``O(n^2)`` element-wise operations that XLA
    fuses, batched without a loop under ``vmap``. ``rhs`` is ``(n, k)``."""
    n = lu.shape[0]
    # the entries and rows as arrays of their own, split off in one operation each: one
    # indexing operation per entry would be traced (and lowered) n^2 times per solve
    entry = lax.split(lu.reshape(n * n), (1,) * (n * n))
    rows = lax.split(rhs, (1,) * n)

    def t(i, j):  # T[i, j] of the (possibly transposed) triangle, shape (1,)
        return entry[j * n + i] if transpose else entry[i * n + j]

    forward = lower != transpose  # a lower triangle (after the transpose) goes forward
    order = range(n) if forward else range(n - 1, -1, -1)
    x: list = [None] * n
    for i in order:
        s = rows[i]
        for j in (range(i) if forward else range(i + 1, n)):
            s = s - t(i, j) * x[j]
        x[i] = s if unit else s / entry[i * n + i]
    return jnp.concatenate(x)


def exact_lu_solve(lu: Array, perm: Array, b: Array, transpose: bool = False) -> Array:
    """``A^-1 b`` (``A^-T b``) from ``P A = L U`` (``lu`` packed as LAPACK's, ``perm`` the
    permutation of ``lu_pivots_to_permutation``), ``b`` of shape ``(n,)`` or ``(n, k)``.

    The permutation is applied as a product with the 0/1 matrix (exact: one ``1.0`` per
    row) rather than as a gather: XLA on the CPU fused a gather with the computation of
    ``b`` and, in that fusion, evaluated BDF's right-hand side less accurately (Robertson
    at rtol 1e-10, atol 1e-16: a residual ``A x - b`` of 5e-17 instead of 1e-26), which made
    Newton fail where scipy's converges (see simlib/_solver/_implicit.py). Up to
    :data:`UNROLL_MAX` unknowns the triangular solves are written-out substitution, else
    LAPACK's ``trsm``.
    """
    n = lu.shape[0]
    p = (jnp.arange(n)[None, :] == perm[:, None]).astype(b.dtype)
    vec = b.ndim == 1
    rhs = b[:, None] if vec else b
    hi = lax.Precision.HIGHEST
    small = n <= UNROLL_MAX
    if not transpose:
        x = jnp.matmul(p, rhs, precision=hi)
        if small:
            x = _substitute(lu, x, lower=True, unit=True, transpose=False)
            x = _substitute(lu, x, lower=False, unit=False, transpose=False)
        else:
            x = triangular_solve(lu, x, left_side=True, lower=True, unit_diagonal=True)
            x = triangular_solve(lu, x, left_side=True, lower=False)
    else:  # A^T = U^T L^T P: U^T z = b, L^T w = z, x = P^T w
        if small:
            z = _substitute(lu, rhs, lower=False, unit=False, transpose=True)
            w = _substitute(lu, z, lower=True, unit=True, transpose=True)
        else:
            z = triangular_solve(lu, rhs, left_side=True, lower=False, transpose_a=True)
            w = triangular_solve(lu, z, left_side=True, lower=True, unit_diagonal=True,
                                 transpose_a=True)
        x = jnp.matmul(p.T, w, precision=hi)
    return x[:, 0] if vec else x


class Dense(LinearSolver):
    """``J`` as an ``(n, n)`` matrix and ``A = M - c J`` factorised by LU with partial
    pivoting.

    Args:
        jac: ``"fwd"`` (``n`` forward-mode products, vectorised: ``jax.jacfwd``) or
            ``"rev"`` (``n`` reverse-mode products: ``jax.jacrev``, cheaper when ``g`` is
            dear and the state large, at reverse mode's memory cost).
    """

    def __init__(self, jac: str = "fwd") -> None:
        if jac not in JAC_MODES:
            raise ValueError(f"jac must be one of {JAC_MODES}; got {jac!r}")
        self.jac = jac

    def materialise(self, linear_map: Callable[[Array], Array], n: int, dtype: Any) -> Any:
        eye = jnp.eye(n, dtype=dtype)
        if self.jac == "fwd":
            return jax.vmap(linear_map, in_axes=1, out_axes=1)(eye)
        _, vjp = jax.vjp(linear_map, jnp.zeros((n,), dtype))
        return jax.vmap(lambda e: vjp(e)[0])(eye)  # rows e_i^T J

    def linearise(self, g: Field, t: Any, v: Array) -> Array:
        transform = jax.jacfwd if self.jac == "fwd" else jax.jacrev
        return transform(lambda w: g(t, w))(v).astype(v.dtype)

    @staticmethod
    def operator(jac: Array, c: Array, mass: Any) -> Array:
        """``A = M - c J`` as a dense matrix."""
        n = jac.shape[0]
        if mass is None:
            m = jnp.eye(n, dtype=jac.dtype)
        else:
            mass = jnp.asarray(mass, jac.dtype)
            m = jnp.diag(mass) if mass.ndim == 1 else mass
        return m - c.astype(jac.dtype) * jac

    def matvec(self, jac: Any, c: Array, mass: Any, x: Array, *, field: Field | None = None,
               transpose: bool = False) -> Array:
        a = self.operator(jac, c, mass)
        return (a.T if transpose else a) @ x

    def _factor(self, jac, c, mass):
        lu, piv = lu_factor(self.operator(jac, c, mass))
        perm = lu_pivots_to_permutation(piv, lu.shape[0])
        d = jnp.diagonal(lu)
        ok = jnp.all(jnp.isfinite(lu)) & jnp.all(d != 0)
        return (lu, perm), ok

    def _solve(self, fac, b, transpose, field):
        lu, perm = fac.data
        return exact_lu_solve(lu, perm, b, transpose)


register_static(Dense)
