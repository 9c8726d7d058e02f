"""Pieces shared by the implicit and linearly implicit (stiff) solvers.

- :func:`flat_field`: the vector field on the flattened state, so that the linear
  algebra sees one vector whatever the state's pytree.
- :func:`jacobian`: ``J = df/dy`` from ``jax.jacfwd`` (default), ``jax.jacrev`` (cheaper
  when evaluating ``f`` is dear and the state large) or a user-supplied ``jac``.
- :func:`check_jac`: the validation of a solver's ``jac=`` argument.
- :func:`exact_lu_solve`: ``M^-1 b`` from ``lu_factor(M)`` with the row permutation
  applied exactly (a 0/1 matrix product, not a gather that XLA may fuse inaccurately).
- :func:`refined_lu_solve`: ``M^-1 b`` from ``lu_factor(M)`` and one correction whose
  residual ``b - M x`` is computed by the caller (through the field's ``jvp``), for the
  linearly implicit (Rosenbrock) solvers that use a single solve per stage.
- :func:`newton`: a simplified Newton iteration with a fixed, already factorised
  iteration matrix and the convergence-rate test of Hairer and Wanner.

Dense linear algebra throughout (``jax.scipy.linalg.lu_factor``): ``O(n^2)`` memory and
``O(n^3)`` work per factorisation, practical up to a few thousand states.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.lax.linalg import lu_pivots_to_permutation, triangular_solve
from jax.scipy.linalg import lu_solve

from ._base import PyTree, VectorField

JAC_CHOICES = ("fwd", "rev")


def check_jac(jac) -> str | Callable:
    """``jac`` if it is ``"fwd"``, ``"rev"`` or a callable, else a ``ValueError`` naming it."""
    if callable(jac) or jac in JAC_CHOICES:
        return jac
    raise ValueError(
        f"jac must be 'fwd' (jax.jacfwd), 'rev' (jax.jacrev) or a callable "
        f"jac(t, y, args) returning df/dy as an (n, n) array; got {jac!r}"
    )


def flat_field(f: VectorField, y: PyTree, args):
    """``g(t, v) = ravel(f(t, unravel(v), args))`` in ``y``'s dtype, ``ravel(y)``, and
    ``unravel`` (``jax.flatten_util.ravel_pytree``)."""
    y_flat, unravel = ravel_pytree(y)

    def g(t, v):
        return ravel_pytree(f(t, unravel(v), args))[0].astype(y_flat.dtype)

    return g, y_flat, unravel


def jacobian(jac, g, f: VectorField, t, v: jax.Array, unravel, args) -> jax.Array:
    """``df/dy`` at ``(t, v)`` as an ``(n, n)`` matrix in ``v``'s dtype.

    Args:
        jac: ``"fwd"``, ``"rev"`` or a callable ``jac(t, y, args)`` (``y`` in the state's
            pytree) returning the matrix on the flattened state
            (``jax.flatten_util.ravel_pytree`` order), e.g. ``(n, n)`` for a vector state.
        g: The flattened field of :func:`flat_field`.
        f, unravel, args: The user's field, the map back to the state, its arguments
            (used by a callable ``jac``).
    """
    n = v.size
    if callable(jac):
        # the drivers hand solvers a closure-converted field; ``jac`` gets the user's args
        user_args = getattr(f, "user_args", None)
        m = jnp.asarray(jac(t, unravel(v), args if user_args is None else user_args(args)))
        if m.size != n * n:
            raise ValueError(
                f"jac(t, y, args) must return df/dy as an ({n}, {n}) array for a state of "
                f"{n} components; got shape {m.shape}"
            )
        return m.reshape(n, n).astype(v.dtype)
    transform = jax.jacfwd if jac == "fwd" else jax.jacrev
    return transform(g, argnums=1)(t, v).astype(v.dtype)


def exact_lu_solve(lu, b: jax.Array) -> jax.Array:
    """``M^-1 b`` from ``lu_factor(M)``, the row permutation applied as a product with the
    0/1 permutation matrix (exact) rather than a gather: XLA on the CPU fuses a gather with
    the computation of ``b`` and, in that fusion, evaluated the NDF right-hand side
    ``c f - psi - d`` less accurately (Robertson at rtol 1e-10, atol 1e-16: a residual
    ``M x - b`` of 5e-17 instead of 1e-26, 1e-2 tolerance units, above the Newton
    tolerance), which made BDF's Newton fail where scipy's converges. Used by BDF; the
    other solvers call ``jax.scipy.linalg.lu_solve``: with this instead, Rodas5P, Rodas5
    and Kvaerno5 gave bit-identical runs on E5 (Bari test set, rtol 1e-6, atol 1e-30);
    the Rosenbrock methods' loss of E5's linear invariant came from the single unrefined
    solve per stage, not from the permutation (:func:`refined_lu_solve`)."""
    lu_, piv = lu
    n = b.shape[0]
    perm = lu_pivots_to_permutation(piv, n)
    p = (jnp.arange(n)[None, :] == perm[:, None]).astype(b.dtype)
    pb = jnp.matmul(p, b, precision=lax.Precision.HIGHEST)  # exact: one 1.0 per row
    x = triangular_solve(lu_, pb[:, None], left_side=True, lower=True,
                         unit_diagonal=True)
    return triangular_solve(lu_, x, left_side=True, lower=False)[:, 0]


def refined_lu_solve(lu, apply_m: Callable[[jax.Array], jax.Array], b: jax.Array) -> jax.Array:
    """``M^-1 b`` from ``lu_factor(M)`` with one step of iterative refinement,
    ``x0 = M^-1 b``, ``x = x0 + M^-1 (b - apply_m(x0))``, where ``apply_m(x)`` computes
    ``M x`` without the assembled matrix: for ``M = I - c J``, ``x - c jvp(f)(x)``.

    A single LU solve has the backward error ``eps |L| |U| |x|`` (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., 2002, 9.3 and 12.1), which a stiff ``J``
    makes large: on E5 (Bari test set) ``|h gamma J|`` reaches 2e6 and Rodas5P's stages,
    solved once, broke the problem's linear invariant ``y2 - y3 - y4`` (exact for ``f``
    and for the method) by 1e-22 to 2e-21 per step, where the state is 1e-10; an exact
    (50-digit) step keeps it to 1e-70. A residual from the assembled matrix (``b - M x``
    or ``b - x + c J x`` in float64) carries the same rounding and does not help
    (measured); a residual from ``jvp`` goes through ``f``'s own arithmetic, in which
    the invariant holds to the rounding of ``f`` itself, and one correction brings the
    stage to that level (1e-27 per stage on E5). A Newton iteration (the implicit
    solvers) needs none of this: its residual comes from ``f`` and only the last,
    small correction meets the LU's error.
    """
    x = lu_solve(lu, b)
    return x + lu_solve(lu, b - apply_m(x))


class NewtonResult(NamedTuple):
    """The outcome of :func:`newton`.

    Attributes:
        z: The last iterate.
        converged: Whether the convergence test passed.
        iterations: Newton iterations taken.
        rate: The last estimated contraction rate ``theta`` (``0`` after one iteration).
    """

    z: jax.Array
    converged: jax.Array
    iterations: jax.Array
    rate: jax.Array


def newton(residual: Callable[[jax.Array], jax.Array], lu, z0: jax.Array, scale: jax.Array,
           *, tol: float, max_iters: int) -> NewtonResult:
    """Simplified Newton for ``residual(z) = 0`` with a fixed factorised matrix ``lu``.

    Iterates ``dz = -M^-1 residual(z)``, ``z <- z + dz`` with ``M`` (given as
    ``lu_factor(M)``) an approximation of the residual's Jacobian, measuring
    ``||dz||`` in the RMS norm weighted by ``1 / scale``. With the contraction rate
    ``theta_k = ||dz_k|| / ||dz_{k-1}||`` and ``eta = theta / (1 - theta)`` it stops
    (Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996, IV.8, eqs. 8.10-8.11):

    - converged when ``eta ||dz_k|| <= tol`` (``eta = 1`` for the first iterate, which
      has no rate yet, so it converges when ``||dz_0|| <= tol``);
    - diverged when ``theta_k >= 1`` or when the predicted final error
      ``theta^(max_iters - k) / (1 - theta) ||dz_k||`` exceeds ``tol``;
    - after ``max_iters`` iterations without convergence.

    ``tol`` is the Newton tolerance in units of ``scale`` (about ``0.03`` to ``0.1`` of
    the step's error tolerance, ``kappa`` in Hairer and Wanner). A caller rejects the step
    (adaptive) or reports ``Result.NEWTON_FAILED`` (fixed step) when not converged.
    The loop is a ``lax.while_loop``, which forward mode differentiates but reverse mode
    cannot: a solver using it makes its converged stages differentiable by the implicit
    function theorem (``lax.custom_root``), not by differentiating the iterations.
    """
    dtype = z0.dtype
    tol = jnp.asarray(tol, dtype)

    def norm(x):
        return jnp.sqrt(jnp.mean(jnp.square(x / scale)))

    def body(c):
        z, _, k, _, prev, eta, _ = c
        dz = -lu_solve(lu, residual(z))
        z = z + dz
        size = norm(dz)
        theta = jnp.where(k == 0, 0.0, size / jnp.where(prev > 0, prev, 1.0)).astype(dtype)
        eta = jnp.where(k == 0, eta, theta / jnp.maximum(1 - theta, jnp.finfo(dtype).eps))
        finite = jnp.all(jnp.isfinite(z))
        converged = finite & (eta * size <= tol)
        remaining = (max_iters - 1 - k).astype(dtype)
        hopeless = (k > 0) & ((theta >= 1) | (
            theta ** remaining / jnp.maximum(1 - theta, jnp.finfo(dtype).eps) * size > tol))
        failed = ~finite | (~converged & hopeless)
        return z, converged, k + 1, failed, size, eta, theta

    def cond(c):
        _, converged, k, failed, *_ = c
        return ~converged & ~failed & (k < max_iters)

    zero = jnp.asarray(0.0, dtype)
    init = (z0, jnp.asarray(False), jnp.asarray(0, jnp.int32), jnp.asarray(False), zero,
            jnp.asarray(1.0, dtype), zero)
    z, converged, k, _, _, _, theta = lax.while_loop(cond, body, init)
    return NewtonResult(z, converged, k, theta)
