"""Differential-algebraic equations ``M y' = f(t, y, args)`` with a constant mass matrix.

``M`` may be singular: the rows of ``f`` in its left null space are algebraic equations
``0 = q^T f(t, y)`` and the components of ``y`` in its (right) null space are algebraic
variables. The stiff solvers integrate index-1 problems (the algebraic equations'
Jacobian with respect to the algebraic variables, ``U_0^T J V_0``, nonsingular; Hairer and
Wanner, *Solving ODEs II*, 2nd ed., 1996, VI.1) with ``M`` in their iteration matrix
``M - c J`` (Rosenbrock: VI.4; BDF/NDF: Shampine, Reichelt and Kierzenka, SIAM Review 41,
1999; stiffly accurate ESDIRK: VI.1, the "epsilon-embedding" of the stage equations).

This module holds what ``solve`` does with ``mass_matrix`` before the run:

- :class:`MassField`: the vector field with ``M`` riding in its ``args`` (so that a traced
  ``M`` is an input of the compiled solve, not a constant): ``f(t, y, (args, M))``;
  :func:`simlib._solver._implicit.mass_of` gives ``M`` back to a solver.
- :func:`prepare_mass`: shape checks (eager, naming ``mass_matrix``), finiteness and
  pattern checks (eager, or in the graph as ``Result.INVALID_MASS_MATRIX``), and ``M``
  in the linear solver's format (dense, diagonal, a band, values on a sparse pattern).
- :func:`consistent_initial_state`: the algebraic components of ``y0`` from its
  differential ones by Newton on the algebraic equations (as SUNDIALS IDA's ``IDACalcIC``
  with ``IDA_YA_YDP_INIT``: A. C. Hindmarsh et al., ACM TOMS 31, 2005, 363-396),
  differentiable by the implicit function theorem (``lax.custom_root``).
- :func:`inconsistency`: the check made when no initialisation was asked for.

For ``M = U S V^T`` (SVD; a diagonal ``M``: its zero entries), ``Q = U_0 U_0^T`` projects
onto the algebraic equations and ``B = U_r V_r^T`` maps the differential variables onto
the differential equations. Consistent ``y`` near ``y0`` solves

    R(y) = Q f(t0, y) + B (y - y0) = 0,

which keeps the differential part ``V_r^T y`` of ``y0`` and makes the algebraic
equations hold; ``dR/dy = Q J + B`` is nonsingular exactly when the problem is index 1.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from ._errors import Result
from ._events import Event
from ._solver._base import Field, projectors
from ._util import is_tracer

INITIALIZE = ("check", "consistent", "none")
MAX_INIT_ITERS = 20
INIT_TOL = 1e-3  # Newton converged: WRMS norm of the last correction, tolerance units


class MassField(Field):
    """``f(t, y, args)`` called as ``f(t, y, (args, M))``: ``M`` travels in ``args``.
    Hashes like ``f`` (jit caches still hit)."""

    def __init__(self, f):
        self.f = f

    def __call__(self, t, y, a):
        return self.f(t, y, a[0])

    def mass(self, a):
        return a[1]

    def user_args(self, a):
        return a[0]

    def __hash__(self) -> int:
        return hash((MassField, self.f))

    def __eq__(self, other) -> bool:
        return isinstance(other, MassField) and other.f == self.f


class UserArgs:
    """An event's ``cond``/``apply`` given the user's ``args`` out of ``(args, M)``."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, t, y, a):
        return self.fn(t, y, a[0])

    def __hash__(self) -> int:
        return hash((UserArgs, self.fn))

    def __eq__(self, other) -> bool:
        return isinstance(other, UserArgs) and other.fn == self.fn


def wrap_events(events):
    """``events`` with ``cond``/``apply`` reading the user's ``args`` (see :class:`UserArgs`)."""
    if events is None:
        return None
    return tuple(Event(UserArgs(ev.cond), ev.terminal, ev.direction,
                       None if ev.apply is None else UserArgs(ev.apply), ev.capacity)
                 for ev in events)


# ---------------------------------------------------------------------------- checks

def _nonfinite(xp, x):
    return ~xp.isfinite(x), x


def _outside(xp, m, inside):
    return (m != 0) & ~inside, m


def _bad_init(xp, res, norm):
    big = xp.abs(res)
    return (norm > 1) & (big >= xp.max(big)), res


def _not_converged(xp, ok, norm):
    return ~ok, norm


def prepare_mass(mass_matrix, solver, n: int, dtype, checks,
                 members: int | None = None) -> tuple[Any, Any]:
    """``(M as given, as an array of the state's dtype; M in the linear solver's format)``
    after the checks: shape ``(n,)`` (a diagonal) or ``(n, n)`` (eager ``ValueError``
    naming ``mass_matrix``), finite and, for a banded or sparse linear solver, zero
    outside the Jacobian's band or pattern (eager ``ValueError``, traced
    ``Result.INVALID_MASS_MATRIX``). A matrix-free Krylov solver takes a diagonal only.
    ``members``: one ``M`` per member of an ensemble, stacked on a leading axis of that
    length (``(members, n)`` or ``(members, n, n)``; both outputs keep the axis)."""
    from ._linalg._banded import Banded
    from ._linalg._krylov import Krylov
    from ._linalg._sparse import Sparse

    name = type(solver).__name__
    if not solver.accepts_mass:
        raise ValueError(
            f"mass_matrix (a DAE M y' = f) needs a stiff solver that takes it: Rodas5P, "
            f"Rodas5, Rosenbrock23, BDF, Kvaerno5, Kvaerno3 or BackwardEuler; {name} does "
            f"not (explicit, symplectic and SDE solvers, and ImplicitMidpoint, whose "
            f"y1 = 2 Z - y breaks the algebraic equations)")
    shape = tuple(np.shape(mass_matrix))
    lead = () if members is None else (members,)
    if shape not in (lead + (n,), lead + (n, n)):
        if members is None:
            raise ValueError(
                f"mass_matrix must be an ({n},) diagonal or an ({n}, {n}) matrix for a "
                f"state of {n} components (flattened, ravel_pytree order); got shape "
                f"{shape}")
        raise ValueError(
            f"mass_matrix with mass_axes=0 (one M per member) must be a ({members}, {n}) "
            f"stack of diagonals or a ({members}, {n}, {n}) stack of matrices for "
            f"{members} members of {n} state components (flattened, ravel_pytree order); "
            f"got shape {shape}")
    if not is_tracer(mass_matrix):
        arr = np.asarray(mass_matrix)
        if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr):
            raise ValueError(f"mass_matrix must be a real array; got dtype {arr.dtype}")
    m = jnp.asarray(mass_matrix).astype(dtype)
    checks(Result.INVALID_MASS_MATRIX,
           "invalid mass_matrix: mass_matrix must be finite, but it holds {value} at flat "
           "index {index}",
           _nonfinite, mass_matrix)
    ls = solver.linear_solver
    diagonal = m.ndim == 1 + len(lead)
    if ls is None or diagonal:
        return m, m
    if isinstance(ls, Krylov):
        raise ValueError(
            "mass_matrix must be a diagonal (an (n,) vector) with the matrix-free Krylov "
            "linear solver (it applies M without storing it); give a diagonal M or use the "
            "dense, banded or sparse LU")
    rows = np.arange(n)[:, None]
    cols = np.arange(n)[None, :]
    if isinstance(ls, Banded):
        inside = (cols - rows >= -ls.lower) & (cols - rows <= ls.upper)
        where = f"the Jacobian's band (lower={ls.lower}, upper={ls.upper})"
    elif isinstance(ls, Sparse):
        inside = np.zeros((n, n), bool)
        inside[ls.pattern.rows, ls.pattern.cols] = True
        where = "the Jacobian's sparsity pattern (jac_sparsity, or the detected one)"
    else:
        return m, m
    checks(Result.INVALID_MASS_MATRIX,
           f"invalid mass_matrix: mass_matrix must be zero outside {where}, which the "
           "linear solver stores M in; it holds {value} at flat index {index}: widen "
           "jac_bandwidth/jac_sparsity to cover M's pattern", _outside, mass_matrix,
           np.broadcast_to(inside, shape))
    if isinstance(ls, Banded):
        w = ls.lower + ls.upper + 1
        col = np.arange(n)[:, None] - ls.lower + np.arange(w)[None, :]
        ok = (col >= 0) & (col < n)
        band = jnp.where(jnp.asarray(ok), m[..., rows, np.clip(col, 0, n - 1)], 0.0)
        return m, band.astype(dtype)
    return m, m[..., np.asarray(ls.pattern.rows), np.asarray(ls.pattern.cols)]


def _scale(v, rtol, atol):
    eps = jnp.finfo(v.dtype).eps
    if rtol is None:
        rtol = atol = jnp.sqrt(eps)
    return jnp.maximum(atol + rtol * jnp.abs(v), 100 * eps * (jnp.abs(v) + 1e-300))


def _wrms(x, scale):
    return jnp.sqrt(jnp.mean(jnp.square(x / scale)))


def _residual_fn(f, t0, y0, args, m):
    v0, unravel = ravel_pytree(y0)
    q, b = projectors(m)

    def g(v):
        return ravel_pytree(f(t0, unravel(v), args))[0].astype(v0.dtype)

    def residual(v):
        return q @ g(v) + b @ (v - v0)

    return v0, unravel, q, g, residual


def inconsistency(f, t0, y0, args, m, rtol, atol):
    """``(r, norm)``: the algebraic equations' residual ``Q f(t0, y0)`` and the WRMS norm
    (over ``atol + rtol |y0|``) of the Newton correction of the algebraic components it
    asks for, ``(Q J + B)^-1 Q f``: above one, ``y0`` is off the constraint by more than
    the tolerance."""
    v0, _, q, g, residual = _residual_fn(f, t0, y0, args, m)
    r = residual(v0)
    a = jax.jacfwd(residual)(v0)
    delta = jnp.linalg.solve(a, r)
    norm = _wrms(delta, _scale(v0, rtol, atol))
    return r, jnp.where(jnp.isfinite(norm), norm, jnp.inf)


def index_one_margin(f, t0, y0, args, m):
    """``s_min / (n eps s_max)`` of ``dR/dy = Q J + B`` at ``y0``: below one, the
    algebraic equations do not determine the algebraic variables (not index 1)."""
    v0, _, _, _, residual = _residual_fn(f, t0, y0, args, m)
    s = jnp.linalg.svd(jax.jacfwd(residual)(v0), compute_uv=False)
    tol = v0.size * jnp.finfo(v0.dtype).eps * jnp.max(s)
    return jnp.where(jnp.all(jnp.isfinite(s)), jnp.min(s) / tol, 0.0)


def _singular(xp, margin):
    return ~(margin > 1), margin


def consistent_initial_state(f, t0, y0, args, m, rtol, atol):
    """``(y, converged)``: ``y0`` with its algebraic components solving the algebraic
    equations (full Newton on ``R(y) = Q f(t0, y) + B (y - y0)``, at most 20 iterations,
    converged when a correction's WRMS norm is at most 1e-3 tolerance units), the
    differential part kept. Differentiable in ``y0`` and ``args`` by the implicit function
    theorem: ``dy = -(Q J + B)^-1 (Q df + B (-dy0))``."""
    v0, unravel, _, _, residual = _residual_fn(f, t0, y0, args, m)
    scale = lax.stop_gradient(_scale(v0, rtol, atol))
    eps = jnp.finfo(v0.dtype).eps

    def solve(fun, x0):
        def body(c):
            v, _, k, _ = c
            dv = jnp.linalg.solve(jax.jacfwd(fun)(v), fun(v))
            size = _wrms(dv, scale)
            tiny = jnp.all(jnp.abs(dv) <= 4 * eps * jnp.abs(v))
            finite = jnp.all(jnp.isfinite(dv))
            return v - jnp.where(finite, dv, 0.0), (size <= INIT_TOL) | tiny, k + 1, ~finite

        def cond(c):
            _, done, k, bad = c
            return ~done & ~bad & (k < MAX_INIT_ITERS)

        v, done, _, bad = lax.while_loop(
            cond, body, (x0, jnp.asarray(False), jnp.asarray(0), jnp.asarray(False)))
        return v, (done & ~bad).astype(v.dtype)

    def tangent_solve(lin, b):
        return jnp.linalg.solve(jax.jacfwd(lin)(jnp.zeros_like(b)), b)

    v, ok = lax.custom_root(residual, lax.stop_gradient(v0), solve, tangent_solve,
                            has_aux=True)
    return unravel(v), lax.stop_gradient(ok) > 0.5


@functools.partial(jax.jit, static_argnums=(0, 1))
def _initial_values(f, consistent: bool, t0, y0, args, m, rtol, atol):
    """One compiled call: the index-1 margin, then the consistent ``y0`` and Newton's
    outcome, or the residual and the correction's norm."""
    sg = lax.stop_gradient  # the checks' values take no part in derivatives
    margin = index_one_margin(f, t0, sg(y0), sg(args), sg(m))
    if consistent:
        return margin, consistent_initial_state(f, t0, y0, args, m, rtol, atol)
    return margin, inconsistency(f, t0, sg(y0), sg(args), sg(m), rtol, atol)


def initialise(f, y0, t0, args, m, rtol, atol, initialize: str, checks):
    """``y0`` after ``solve``'s ``initialize=`` (see :func:`simlib.solve`), with the
    failures recorded in ``checks`` (eager ``ValueError``, traced
    ``Result.INCONSISTENT_INITIAL_CONDITIONS``)."""
    if initialize == "none":
        return y0
    if m.ndim == 1 and not is_tracer(m) and bool(np.all(np.asarray(m) != 0)):
        return y0  # no algebraic equations
    margin, out = _initial_values(f, initialize == "consistent", t0, y0, args, m, rtol, atol)
    checks(Result.INCONSISTENT_INITIAL_CONDITIONS,
           "inconsistent DAE start (y0, mass_matrix, initialize): the algebraic "
           "equations of M y' = f do not determine the algebraic variables "
           "at t0: the Jacobian of the rows of f in the left null space of mass_matrix "
           "with respect to the variables in its null space is singular (index margin "
           "{value}), so the DAE is not index 1 (a pendulum in Cartesian coordinates with "
           "its length constraint is index 3: differentiate the constraint twice and "
           "stabilise it, docs/dae.md)", _singular, margin)
    if initialize == "consistent":
        y, ok = out
        checks(Result.INCONSISTENT_INITIAL_CONDITIONS,
               "inconsistent DAE start (y0, mass_matrix, initialize): "
               "initialize='consistent': the Newton iteration on the algebraic equations "
               "did not converge in 20 iterations (flag {value}); the problem may not be "
               "index 1 (the algebraic equations' Jacobian with respect to the algebraic "
               "variables singular), or y0's differential part admits no solution",
               _not_converged, ok, jnp.asarray(0.0))
        return y
    r, norm = out
    checks(Result.INCONSISTENT_INITIAL_CONDITIONS,
           "inconsistent DAE start (y0, mass_matrix, initialize): "
           "y0 is inconsistent: the residual of the algebraic equations of M y' = f at t0 "
           "(the rows of f in the null space of mass_matrix, projected) is {value} in "
           "equation {index}, which needs a larger change of the algebraic components than "
           "the tolerance; pass initialize='consistent' to compute them from the "
           "differential ones (or initialize='none' to start anyway)", _bad_init, r, norm)
    return y0
