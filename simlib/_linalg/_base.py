"""The linear-solve protocol of the implicit solvers.

Every implicit and linearly implicit method solves linear systems with the matrix

    A = M - c J,       J = dg/dv (t, v),

``g`` the vector field on the flattened state, ``c`` the method's ``h gamma`` (BDF:
``h / alpha_k``) and ``M`` the identity or a constant mass matrix (a DAE's
``M / (h gamma) - J`` is ``A / (h gamma)``). A :class:`LinearSolver` does it in three
steps, each a pure function of pytrees, so that a solver can carry the results in its
state and reuse them:

1. ``op = ls.linearise(g, t, v)``: ``J`` in the linear solver's own format (a dense
   matrix, a band, the values of a sparse pattern) or, matrix-free, only the point
   ``(t, v)``. :meth:`LinearSolver.materialise` builds the same format from any linear
   map (a JVP), which is how the tangent solves of ``lax.custom_root`` get it.
2. ``fac = ls.factor(op, c, mass=None)``: the factorisation of ``A`` (or a
   preconditioner for it), with the operator kept beside it.
3. ``x = ls.solve(fac, b, field=g)``: ``A^-1 b`` for ``b`` of shape ``(n,)`` or
   ``(n, k)`` (``transpose=True``: ``A^-T b``). The solve is a
   ``lax.custom_linear_solve`` whose matrix-vector product is ``A`` itself (from the
   stored ``J``), so derivatives of ``x`` with respect to ``b``, ``c`` and the stored
   ``J`` come out by the implicit function theorem in forward and reverse mode, and the
   kernels inside (LAPACK, a ``lax.scan``, a native ``jax.ffi`` call, a host callback)
   never need derivative rules of their own.

What is reused (``reuses_jacobian``): a direct solver keeps ``J`` and can refactor it for
a new ``c`` without evaluating ``g`` (BDF's strategy); a matrix-free one stores no ``J``
and re-linearises at no cost. Linear solvers are small immutable pytrees without leaves
that compare and hash by their settings, like the ODE solvers (``register_static``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .._static import Settings


class LazyModule:
    """A module imported on its first attribute access. ``scipy.sparse`` and its
    ``csgraph`` and ``linalg`` take about 0.2 s to import, and only the sparse and banded
    linear solvers use them: a dense solve need not pay it."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        import importlib

        return getattr(importlib.import_module(self._name), attr)

Array = jax.Array
Field = Callable[[Any, Array], Array]  # g(t, v) on the flattened state


def jvp_map(g: Field, t, v: Array) -> Callable[[Array], Array]:
    """``u -> J u`` with ``J = dg/dv (t, v)``, by forward mode (``g`` evaluated once per
    call, and once for a whole ``vmap``-ed batch of ``u``)."""

    def apply(u):
        return jax.jvp(lambda w: g(t, w), (v,), (u.astype(v.dtype),))[1]

    return apply


class Factorisation(NamedTuple):
    """What :meth:`LinearSolver.factor` returns.

    Attributes:
        jac: ``J`` in the solver's format (the matrix-vector product of ``A`` uses it).
        c: The ``c`` of ``A = M - c J``.
        mass: ``M`` (``None``: the identity; an ``(n,)`` diagonal; or a matrix in the
            solver's format).
        data: The factorisation or preconditioner (cut from the autodiff graph).
        ok: ``False`` where the factorisation met a zero or non-finite pivot (direct
            solvers), so that a caller can fail the step instead of using it.
    """

    jac: Any
    c: Array
    mass: Any
    data: Any
    ok: Array


class LinearSolver(Settings):
    """The protocol; see the module docstring. Subclasses set the class attributes and
    provide ``materialise``, ``matvec``, ``_factor`` and ``_solve``.

    Attributes:
        reuses_jacobian: ``linearise`` stores ``J``, which stays valid for a refactor with
            another ``c`` (``False``: matrix-free, nothing worth keeping).
        exact: ``solve`` is exact up to round-off (direct); ``False`` for iterative solves.
    """

    reuses_jacobian: bool = True
    exact: bool = True

    # ------------------------------------------------------------------ building J
    def materialise(self, linear_map: Callable[[Array], Array], n: int, dtype: Any) -> Any:
        """The matrix of ``linear_map`` (``R^n -> R^n``) in this solver's format."""
        raise NotImplementedError

    def linearise(self, g: Field, t: Any, v: Array) -> Any:
        """``J = dg/dv (t, v)`` in this solver's format."""
        return self.materialise(jvp_map(g, t, v), v.size, v.dtype)

    # ------------------------------------------------------------------ A = M - c J
    def matvec(self, jac: Any, c: Array, mass: Any, x: Array, *, field: Field | None = None,
               transpose: bool = False) -> Array:
        """``A x`` (``transpose``: ``A^T x``) for a vector ``x``."""
        raise NotImplementedError

    def factor(self, jac: Any, c: Array, mass: Any = None) -> Factorisation:
        """Factorise ``A = M - c J`` (``mass``: ``None`` for the identity, an ``(n,)``
        diagonal, or a matrix in this solver's format)."""
        c = jnp.asarray(c)
        data, ok = self._factor(jax.tree_util.tree_map(lax.stop_gradient, jac),
                                lax.stop_gradient(c),
                                jax.tree_util.tree_map(lax.stop_gradient, mass))
        data = jax.tree_util.tree_map(lax.stop_gradient, data)
        return Factorisation(jac, c, mass, data, ok)

    def _factor(self, jac, c, mass):
        raise NotImplementedError

    #: :meth:`factor_where` factorises member by member under ``vmap`` (the members whose
    #: ``pred`` is false cost nothing); ``False``: it is a ``lax.cond``, which ``vmap``
    #: turns into a factorisation of every member.
    factors_per_member: bool = False

    def factor_where(self, pred: Array, old: Factorisation, jac: Any, c: Array,
                     mass: Any = None) -> Factorisation:
        """:meth:`factor` where ``pred``, ``old`` (a factorisation of the same solver, with
        the same structure) elsewhere: the refactorisation of a step that keeps its
        factors unless ``c`` (or ``J``) changed enough."""
        return lax.cond(pred, lambda: self.factor(jac, c, mass), lambda: old)

    def _solve(self, fac: Factorisation, b: Array, transpose: bool, field) -> Array:
        """``A^-1 b`` (``A^-T b``) for a vector ``b``, no derivative rules needed."""
        raise NotImplementedError

    def solve(self, fac: Factorisation, b: Array, *, field: Field | None = None,
              transpose: bool = False) -> Array:
        """``A^-1 b`` (``transpose``: ``A^-T b``) for ``b`` of shape ``(n,)`` or ``(n, k)``,
        differentiable in ``b`` and in the operator (``J``, ``c``, ``M``) by the implicit
        function theorem (``lax.custom_linear_solve``). ``field``: the ``g`` given to
        :meth:`linearise`, needed by a matrix-free solver only."""
        if b.ndim == 2:
            return jax.vmap(lambda col: self.solve(fac, col, field=field, transpose=transpose),
                            in_axes=1, out_axes=1)(b)
        return self._linear_solve(fac, b, field, transpose, self._solve)

    def _linear_solve(self, fac: Factorisation, b: Array, field, transpose: bool,
                      inner: Callable) -> Array:
        """``lax.custom_linear_solve`` of ``A`` (``A^T``) with ``inner(fac, r, transpose,
        field)`` for the solve and its transpose."""
        def mv(x):
            return self.matvec(fac.jac, fac.c, fac.mass, x, field=field, transpose=transpose)

        def solve(_, r):
            return inner(fac, r, transpose, field)

        def transpose_solve(_, r):
            return inner(fac, r, not transpose, field)

        return lax.custom_linear_solve(mv, b, solve, transpose_solve)

    def solve_linear_map(self, linear_map: Callable[[Array], Array], b: Array,
                         c: Array | None = None) -> Array:
        """``L^-1 b`` for a linear map ``L`` on ``R^n`` (the ``tangent_solve`` of
        ``lax.custom_root``: ``L`` is the residual's linearisation at the root). ``L`` is
        materialised in this solver's format, factorised and solved; its transposed solve
        (reverse mode) reuses the factorisation. ``c``: where ``L = M - c J`` (an implicit
        stage's linearisation), its ``c``, for a preconditioner that needs it; a direct
        solver does not."""
        n, dtype = b.shape[0], b.dtype
        jac = self.materialise(linear_map, n, dtype)
        # A = M - c J with M = 0, c = -1: A = J, the map itself
        zero_mass = self._zero_mass(n, dtype)
        fac = self.factor(jac, jnp.asarray(-1.0, dtype), zero_mass)
        return self.solve(fac, b, field=lambda t, v: linear_map(v))

    def _zero_mass(self, n, dtype):
        return jnp.zeros((n,), dtype)


def diagonal_mass(mass, n: int, dtype) -> Array:
    """``M`` as an ``(n,)`` diagonal (``None``: ones), or ``None`` if it is not one."""
    if mass is None:
        return jnp.ones((n,), dtype)
    mass = jnp.asarray(mass)
    return mass.astype(dtype) if mass.shape == (n,) else None
