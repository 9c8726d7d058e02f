"""Pieces shared by the implicit and linearly implicit (stiff) solvers.

Every stiff solver (:class:`BDF`, the Rosenbrock methods, the ESDIRK methods,
:class:`BackwardEuler`, :class:`ImplicitMidpoint`) does its linear algebra through one
linear solver of :mod:`simlib._linalg` (dense LU by default; banded, sparse or
matrix-free Newton-Krylov on request), one Newton iteration (:func:`newton`) and one RMS
norm (:func:`rms_norm`):

- :func:`flat_field`: the vector field on the flattened state, so that the linear
  algebra sees one vector whatever the state's pytree.
- :func:`check_jac`, :func:`check_linear_solver`: the validation of a solver's ``jac=``
  and ``linear_solver=`` arguments; :class:`LinearAlgebra`: the mixin that holds them.
- :meth:`LinearAlgebra.bound_linear_solver` and :meth:`LinearAlgebra.linearise`: the
  linear solver for a given field (a sparsity pattern detected from it when none was
  given) and ``J = df/dy`` in its format (from a callable ``jac``: a dense matrix).
- :func:`refined_solve`: ``A^-1 b`` with one correction whose residual comes from
  ``f``'s ``jvp``, for the Rosenbrock methods' single solve per stage.
- :func:`newton`: simplified Newton with a fixed, already factorised iteration matrix and
  the convergence-rate test of Hairer and Wanner (``accept_first=True``) or of scipy's
  ``BDF`` (``accept_first=False``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
from jax import lax
from jax.flatten_util import ravel_pytree

from .._linalg._base import LinearSolver
from .._linalg._dense import Dense
from .._linalg._sparse import Sparse
from ._base import PyTree, VectorField, mass_matrix, projectors, safe_sqrt, user_args

JAC_CHOICES = ("fwd", "rev")


def check_jac(jac) -> str | Callable:
    """``jac`` if it is ``"fwd"``, ``"rev"`` or a callable, else a ``ValueError`` naming it."""
    if callable(jac) or jac in JAC_CHOICES:
        return jac
    raise ValueError(
        f"jac must be 'fwd' (jax.jacfwd), 'rev' (jax.jacrev) or a callable "
        f"jac(t, y, args) returning df/dy as an (n, n) array; got {jac!r}"
    )


def check_linear_solver(linear_solver, jac) -> LinearSolver | None:
    """``linear_solver`` if it is ``None`` (dense LU, the default) or a linear solver of
    :mod:`simlib._linalg`; ``jac`` other than ``"fwd"`` needs the dense one."""
    if linear_solver is None:
        return None
    if not isinstance(linear_solver, LinearSolver):
        raise TypeError(
            f"linear_solver must be a linear solver (simlib.DenseLU(), simlib.BandedLU(lower, "
            f"upper), simlib.SparseLU(jac_sparsity), simlib.NewtonKrylov()) or None; got "
            f"{linear_solver!r}")
    if jac != "fwd" and not isinstance(linear_solver, Dense):
        raise ValueError(
            f"jac={jac!r} builds a dense Jacobian and applies to the dense linear solver only; "
            f"{type(linear_solver).__name__} builds its own (leave jac='fwd')")
    return linear_solver


def flat_field(f: VectorField, y: PyTree, args):
    """``g(t, v) = ravel(f(t, unravel(v), args))`` in ``y``'s dtype, ``ravel(y)``, and
    ``unravel`` (``jax.flatten_util.ravel_pytree``)."""
    y_flat, unravel = ravel_pytree(y)

    def g(t, v):
        return ravel_pytree(f(t, unravel(v), args))[0].astype(y_flat.dtype)

    return g, y_flat, unravel


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    """``sqrt(mean((x / scale)^2))``, the one weighted RMS norm of the implicit solvers
    (Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996, IV.8), with a zero (not nan)
    gradient at ``x = 0``."""
    return safe_sqrt(jnp.mean(jnp.square(x / scale)))


def user_jacobian(jac: Callable, f: VectorField, t, v: jax.Array, unravel, args) -> jax.Array:
    """``df/dy`` from a callable ``jac(t, y, args)`` (``y`` in the state's pytree) returning
    the matrix on the flattened state (``ravel_pytree`` order), as ``(n, n)`` in ``v``'s
    dtype."""
    n = v.size
    # the drivers hand solvers a closure-converted field; ``jac`` gets the user's args
    m = jnp.asarray(jac(t, unravel(v), user_args(f, args)))
    if m.size != n * n:
        raise ValueError(
            f"jac(t, y, args) must return df/dy as an ({n}, {n}) array for a state of "
            f"{n} components; got shape {m.shape}"
        )
    return m.reshape(n, n).astype(v.dtype)


def mass_of(f: VectorField, args):
    """The mass matrix ``M`` of a DAE ``M y' = f`` in the linear solver's format (``None``:
    an ODE, ``M = I``), from the field's ``args`` (simlib/_dae.py)."""
    return mass_matrix(f, args)


def mass_matvec(ls: LinearSolver, jac, mass, x: jax.Array) -> jax.Array:
    """``M x`` for ``M`` in ``ls``'s format (``None``: ``x``; an ``(n,)`` diagonal)."""
    if mass is None:
        return x
    if mass.shape == x.shape:  # a diagonal (a sparse pattern with n entries is one too)
        return mass.astype(x.dtype) * x
    zero = jnp.zeros((), x.dtype)
    return ls.matvec(jax.tree_util.tree_map(jnp.zeros_like, jac), zero, mass, x)


def identity_mass(ls: LinearSolver, mass):
    """The identity in ``mass``'s format (a placeholder factorisation's ``M``)."""
    if mass is None:
        return None
    from .._linalg._banded import Banded

    n = ls.pattern.n if isinstance(ls, Sparse) else mass.shape[0]
    if mass.shape == (n,):
        return jnp.ones_like(mass)
    if isinstance(ls, Banded):
        return jnp.zeros_like(mass).at[:, ls.lower].set(1.0)
    if isinstance(ls, Sparse):
        return jnp.zeros_like(mass).at[jnp.asarray(ls.pattern.diag)].set(1.0)
    return jnp.eye(mass.shape[0], dtype=mass.dtype)


def step_mass(ls: LinearSolver, mass, h):
    """The ``M`` a step of size ``h`` uses: ``mass``, and ``M + I`` for ``h = 0`` (the
    masked attempts of a finished adaptive run, replayed by reverse mode), where
    ``M - 0 J = M`` is singular and its solves, though discarded, would put NaN into the
    derivatives (``0 * nan``)."""
    if mass is None:
        return None
    return jnp.where(h == 0, mass + identity_mass(ls, mass), mass)


def initial_derivative(mass, g, t, v: jax.Array, f0: jax.Array, dense_mass=None
                       ) -> jax.Array:
    """``y'(t0)`` of ``M y' = f`` for a multistep or ESDIRK start (``f0`` for an ODE).

    With ``Q`` the projector onto ``M``'s left null space (simlib/_dae.py), ``y'`` solves
    ``M y' = (I - Q) f`` on the differential equations and the derivative of the algebraic
    ones, ``Q (J y' + df/dt) = 0``: ``(M + Q J) y' = (I - Q) f - Q df/dt`` (dense, for an
    ``(n,)`` diagonal ``M`` up to 1,000 states or a dense ``M``). Otherwise (a banded or
    sparse ``M``, a larger diagonal one) the differential part ``f / M_ii`` of a diagonal
    ``M`` and zero elsewhere: a rougher first predictor that the first step's error
    control absorbs."""
    if mass is None:
        return f0
    n = v.size
    m = dense_mass
    if m is None and mass.ndim == 1 and mass.shape == (n,) and n <= 1000:
        m = mass
    if m is None and mass.shape == (n, n):
        m = mass
    if m is None:
        if mass.shape == (n,):
            nz = mass != 0
            return jnp.where(nz, f0 / jnp.where(nz, mass, 1.0), 0.0)
        return jnp.zeros_like(f0)

    q, _ = projectors(m.astype(v.dtype))
    md = jnp.diag(m) if m.ndim == 1 else m
    tt = jnp.asarray(t)
    jac = jax.jacfwd(lambda w: g(tt, w))(v)
    dfdt = jax.jvp(lambda s: g(s, v), (tt,), (jnp.ones_like(tt),))[1].astype(v.dtype)
    a = md.astype(v.dtype) + q @ jac
    yp = jnp.linalg.solve(a, f0 - q @ f0 - q @ dfdt)
    return jnp.where(jnp.all(jnp.isfinite(yp)), yp, jnp.zeros_like(yp))


class LinearAlgebra:
    """The ``jac``/``linear_solver`` settings of a stiff solver and what it does with
    them. ``linear_solver=None`` is dense LU (``simlib.DenseLU(jac)``)."""

    jac: str | Callable = "fwd"
    linear_solver: LinearSolver | None = None

    def bound_linear_solver(self, g, t, v: jax.Array) -> LinearSolver:
        """The linear solver for the flat field ``g`` (a :class:`~simlib._linalg._sparse.
        Sparse` without a pattern detects it from ``g``; the driver normally binds it once,
        :func:`simlib._solver._implicit.configure`)."""
        ls = self.linear_solver
        if ls is None:
            return Dense(self.jac if self.jac in JAC_CHOICES else "fwd")
        if isinstance(ls, Sparse) and ls.pattern is None:
            return ls.bind(g, t, v)
        return ls

    def linearise(self, ls: LinearSolver, g, f: VectorField, t, v: jax.Array, unravel,
                  args):
        """``J = df/dy (t, v)`` in ``ls``'s format (a callable ``jac``: its matrix)."""
        if callable(self.jac):
            return user_jacobian(self.jac, f, t, v, unravel, args)
        return ls.linearise(g, t, v)

    def settings(self) -> tuple:
        """The solver's settings; ``linear_solver`` only when one is set (so the default
        reads, compares and hashes as before it existed)."""
        return tuple((k, v) for k, v in super().settings()
                     if not (k == "linear_solver" and v is None))

    def with_linear_solver(self, linear_solver: LinearSolver | None):
        """A copy of this solver using ``linear_solver``."""
        new = copy.copy(self)
        new.linear_solver = check_linear_solver(linear_solver, self.jac)
        return new


def tangent_solver(ls: LinearSolver, c: Any = None) -> Callable:
    """The ``tangent_solve`` of ``lax.custom_root`` for a converged implicit stage: the
    residual's linearisation ``M - c J(z*)`` (exact, at the root) materialised in ``ls``'s
    format, factorised and solved (its transpose, in reverse mode, with the same
    factors). ``c`` (no derivative taken) is passed on for a preconditioner that needs it
    (:class:`simlib.NewtonKrylov` with a user's ``(c, x) -> z``)."""

    def tangent_solve(lin, b):
        return ls.solve_linear_map(lin, b, c=None if c is None else lax.stop_gradient(c))

    return tangent_solve


def refined_solve(ls: LinearSolver, fac, apply_a: Callable[[jax.Array], jax.Array],
                  b: jax.Array, field=None) -> jax.Array:
    """``A^-1 b`` from the factorisation ``fac`` with one step of iterative refinement,
    ``x0 = A^-1 b``, ``x = x0 + A^-1 (b - apply_a(x0))``, where ``apply_a(x)`` computes
    ``A x`` without the assembled matrix: for ``A = I - c J``, ``x - c jvp(f)(x)``.

    A single LU solve has the backward error ``eps |L| |U| |x|`` (Higham, *Accuracy and
    Stability of Numerical Algorithms*, 2nd ed., 2002, 9.3 and 12.1), which a stiff ``J``
    makes large: on E5 (Bari test set) Rodas5P's stages, solved once, broke the
    problem's linear invariant ``y2 - y3 - y4`` (exact for ``f`` and for the method) far
    above the state's rounding. A residual from the assembled matrix (``b - M x`` or
    ``b - x + c J x``) carries the same rounding and does not help; a residual from
    ``jvp`` goes through ``f``'s own arithmetic, in which the invariant holds to the
    rounding of ``f`` itself, and one correction brings the stage to that level (the
    figures: docs/benchmarks.md, "Design measurements"). A Newton iteration (the implicit
    solvers) needs none of this: its residual comes from ``f`` and only the last,
    small correction meets the LU's error.
    """
    x = ls.solve(fac, b, field=field)
    return x + ls.solve(fac, b - apply_a(x), field=field)


class NewtonResult(NamedTuple):
    """The outcome of :func:`newton`.

    Attributes:
        z: The last iterate ``y``.
        d: The accumulated correction ``y - y0``.
        converged: Whether the convergence test passed.
        iterations: Newton iterations taken.
        rate: The last estimated contraction rate ``theta`` (``0`` after one iteration).
    """

    z: jax.Array
    d: jax.Array
    converged: jax.Array
    iterations: jax.Array
    rate: jax.Array


def newton(rhs: Callable[[jax.Array, jax.Array], jax.Array],
           solve: Callable[[jax.Array], jax.Array], y0: jax.Array, scale: jax.Array, *,
           tol, max_iters: int, accept_first: bool,
           eta0: jax.Array | None = None) -> NewtonResult:
    """Simplified Newton with a fixed, already factorised iteration matrix ``A``.

    Iterates ``dy = solve(rhs(y, d))`` (``solve``: ``A^-1``, ``A`` an approximation of the
    residual's Jacobian; ``rhs``: minus the residual at ``y = y0 + d``),
    ``y <- y + dy``, ``d <- d + dy``, from ``y = y0``, ``d = 0``. ``y`` is accumulated
    rather than recomputed as ``y0 + d``: once the corrections fall below half an ulp of
    a large component, that component stops moving, whereas re-rounding ``y0 + d`` at
    every iteration can flip it by an ulp back and forth, and through a conservation law
    feed an error of that size into a small component (BDF on Robertson at atol 1e-16: a
    floor near 1e-2 tolerance units, far above the Newton tolerance).

    With ``||.||`` the RMS norm over ``scale`` (:func:`rms_norm`), the rate
    ``theta_k = ||dy_k|| / ||dy_{k-1}||`` and ``eta = theta / (1 - theta)``, iteration
    ``k`` (from 0) (Hairer and Wanner, *Solving ODEs II*, 2nd ed., 1996, IV.8, eqs.
    8.10-8.11):

    - converges when ``||dy_k|| = 0`` or ``eta ||dy_k|| <= tol``. The first iterate has
      no rate: with ``accept_first`` (the ESDIRK methods, as RADAU5) ``eta = 1`` there, so
      ``||dy_0|| <= tol`` converges; without it (BDF, as scipy's ``BDF`` and ``ode15s``) a
      rate is needed, unless ``eta0`` is given: the first iterate then converges when
      ``eta0 ||dy_0|| <= tol``, ``eta0`` carried from the previous step (Hairer and
      Wanner's ``eta_0 = max(eta_old, uround)^0.8``, IV.8; BDF);
    - diverges, its ``dy`` not applied, when ``theta_k >= 1`` or when the predicted final
      error ``theta^r / (1 - theta) ||dy_k||`` exceeds ``tol``, ``r = max_iters - 1 - k``
      with ``accept_first`` (RADAU5) and ``max_iters - k`` without (scipy);
    - stops unconverged after ``max_iters`` iterations.

    The two variants are the measured behaviours of the two families before they shared
    this function (their step counts are unchanged by it; docs/design.md). ``tol`` is in
    units of ``scale``. A caller rejects the step (adaptive) or reports
    ``Result.NEWTON_FAILED`` (fixed step) when not converged. The loop is a
    ``lax.while_loop``, which forward mode differentiates but reverse mode cannot: callers
    run it on values cut from the autodiff graph and give the converged solution its
    derivatives by the implicit function theorem (``lax.custom_root``).
    """
    dtype = y0.dtype
    tol = jnp.asarray(tol, dtype)
    tiny = jnp.finfo(dtype).eps
    lookahead = max_iters - 1 if accept_first else max_iters

    def body(carry):
        y, d, _, k, _, prev, _ = carry
        dy = solve(rhs(y, d))
        size = rms_norm(dy, scale)
        has_rate = k > 0
        theta = jnp.where(has_rate, size / jnp.where(prev > 0, prev, 1.0), 0.0).astype(dtype)
        one_minus = jnp.maximum(1 - theta, tiny)
        eta = theta / one_minus
        finite = jnp.all(jnp.isfinite(dy))
        if accept_first:
            small = jnp.where(has_rate, eta, 1.0) * size <= tol
        elif eta0 is not None:
            small = jnp.where(has_rate, eta, eta0) * size <= tol
        else:
            small = has_rate & (eta * size <= tol)
        converged = finite & ((size == 0) | small)
        remaining = (lookahead - k).astype(dtype)
        diverged = ~finite | (~converged & has_rate & (
            (theta >= 1) | (theta ** remaining / one_minus * size > tol)))
        y = jnp.where(diverged, y, y + dy)
        d = jnp.where(diverged, d, d + dy)
        return y, d, converged, k + 1, diverged, size, theta

    def cond(carry):
        _, _, converged, k, diverged, *_ = carry
        return ~converged & ~diverged & (k < max_iters)

    zero = jnp.asarray(0.0, dtype)
    init = (y0, jnp.zeros_like(y0), jnp.asarray(False), jnp.asarray(0, jnp.int32),
            jnp.asarray(False), zero, zero)
    y, d, converged, k, _, _, theta = lax.while_loop(cond, body, init)
    return NewtonResult(y, d, converged, k, theta)


# ---------------------------------------------------------------------------- choice

LINEAR_SOLVERS = ("auto", "dense", "banded", "sparse", "krylov")
AUTO_DETECT_MIN_STATES = 256  # below this, "auto" keeps dense LU without looking
AUTO_SPARSE_MAX_DENSITY = 0.1  # "auto" goes sparse when nnz(J) <= this n^2
AUTO_BAND_MAX_WIDTH = 16  # "auto" takes a known pattern's band when this narrow


def _bandwidth(pattern) -> tuple[int, int]:
    from .._linalg._coloring import as_pattern

    m = as_pattern(pattern).tocoo()
    if m.nnz == 0:
        return 0, 0
    return int(max(0, (m.row - m.col).max())), int(max(0, (m.col - m.row).max()))


def detect_sparsity(f: VectorField, y0: PyTree, t0, args):
    """The pattern of ``df/dy`` on the flattened state, from ``f``'s jaxpr
    (:func:`simlib._linalg._sparsity.jacobian_sparsity`), with ``args`` as inputs of
    unknown value: they may be tracers (``solve`` under ``jax.grad`` or ``vmap``), and the
    pattern must hold for every value of them."""
    import numpy as np
    import scipy.sparse as sp

    from .._linalg._sparsity import Dep, Free
    from .._linalg._sparsity import Interpreter as _Interpreter
    from .._linalg._sparsity import pattern as _norm
    from .._linalg._sparsity import rows_of as _rows_of
    from .._linalg._sparsity import size_of as _size

    v, unravel = ravel_pytree(y0)
    leaves, treedef = jax.tree_util.tree_flatten(args)
    specs = [jax.ShapeDtypeStruct(jnp.shape(x), jnp.result_type(x)) for x in leaves]

    def g(t, w, *arg_leaves):
        a = jax.tree_util.tree_unflatten(treedef, arg_leaves)
        return ravel_pytree(f(t, unravel(w), a))[0].astype(v.dtype)

    t_spec = jax.ShapeDtypeStruct(jnp.shape(t0), jnp.result_type(t0))
    closed = jax.make_jaxpr(g)(t_spec, jax.ShapeDtypeStruct(v.shape, v.dtype), *specs)
    n = v.size
    interp = _Interpreter(n)
    start = Dep(v.shape, _norm(sp.identity(n, dtype=np.int32, format="csr")))
    # the interpreter runs primitives on arrays of element numbers: eagerly, even when
    # solve is being traced (under jit, grad or vmap)
    with jax.ensure_compile_time_eval():
        (out,) = interp.run(closed, [Free(t_spec.shape), start,
                                     *[Free(spec.shape) for spec in specs]])
    m = sp.csr_matrix(_rows_of(out, n, _size(out.shape)), dtype=bool)
    m.sort_indices()
    return m


def configure(solver, f: VectorField, y0: PyTree, t0, args, *, jac_sparsity=None,
              jac_bandwidth=None, linear_solver=None):
    """``solver`` with the linear solver that ``solve``'s options ask for (see
    :func:`simlib.solve`): ``jac_bandwidth`` gives a banded LU, ``jac_sparsity`` a sparse
    LU on that pattern, ``linear_solver`` names one (``"dense"``, ``"banded"``,
    ``"sparse"``, ``"krylov"``, ``"auto"``) or is one. ``"auto"`` (the default) with
    neither pattern nor bandwidth keeps dense LU below 256 states; from 256 states it
    detects the pattern from ``f`` and, when at most 10% of ``J`` may be non-zero, takes a
    pattern's LU. A pattern (given or detected) goes to the banded LU when its band is at
    most 16 wide, else to the sparse LU. A sparse solver without a pattern is bound here,
    once per call."""
    from .._linalg._banded import Banded
    from .._linalg._kernels import load as load_native
    from .._linalg._krylov import Krylov

    asked = (jac_sparsity is not None or jac_bandwidth is not None
             or linear_solver not in (None, "auto"))
    if not isinstance(solver, LinearAlgebra):
        if asked:
            raise ValueError(
                f"jac_sparsity, jac_bandwidth and linear_solver are options of the implicit "
                f"solvers (BDF, Rodas5P, Rodas5, Rosenbrock23, Kvaerno3, Kvaerno5, "
                f"BackwardEuler, ImplicitMidpoint); {type(solver).__name__} solves no "
                f"linear systems")
        return solver
    if solver.linear_solver is not None:
        if asked:
            raise ValueError(
                f"{type(solver).__name__} was built with linear_solver="
                f"{solver.linear_solver!r}; give jac_sparsity/jac_bandwidth/linear_solver "
                f"either to the solver or to solve(), not both")
        ls = solver.linear_solver
        if isinstance(ls, Sparse) and ls.pattern is None:
            return solver.with_linear_solver(
                Sparse(detect_sparsity(f, y0, t0, args), ls.kernel, ls.ordering,
                       ls.color_order))
        return solver
    if isinstance(linear_solver, LinearSolver):
        if jac_sparsity is not None or jac_bandwidth is not None:
            raise ValueError("linear_solver is an instance: give its pattern or bandwidth "
                             "to it, not jac_sparsity/jac_bandwidth to solve()")
        return configure(solver.with_linear_solver(linear_solver), f, y0, t0, args)
    if linear_solver is None:
        linear_solver = "auto"
    if linear_solver not in LINEAR_SOLVERS:
        raise ValueError(f"linear_solver must be one of {LINEAR_SOLVERS} or a linear solver "
                         f"instance (simlib.DenseLU, BandedLU, SparseLU, NewtonKrylov); got "
                         f"{linear_solver!r}")
    if jac_bandwidth is not None:
        if (not isinstance(jac_bandwidth, tuple | list) or len(jac_bandwidth) != 2):
            raise ValueError(f"jac_bandwidth must be a pair (lower, upper) of non-negative "
                             f"ints; got {jac_bandwidth!r}")
        if linear_solver not in ("auto", "banded"):
            raise ValueError(f"jac_bandwidth asks for a banded solver; linear_solver="
                             f"{linear_solver!r} contradicts it")
        if jac_sparsity is not None:
            raise ValueError("give jac_sparsity or jac_bandwidth, not both")
    _, v, _ = flat_field(f, y0, args)
    n = v.size
    if jac_sparsity is not None:
        from .._linalg._coloring import as_pattern

        as_pattern(jac_sparsity, n)  # names the shape and the state's size if they differ

    def pattern():
        return detect_sparsity(f, y0, t0, args) if jac_sparsity is None else jac_sparsity

    if linear_solver == "dense":
        if jac_sparsity is not None:
            raise ValueError("jac_sparsity was given with linear_solver='dense', which does "
                             "not use it")
        return solver.with_linear_solver(None)
    if linear_solver == "banded" or jac_bandwidth is not None:
        lower, upper = jac_bandwidth if jac_bandwidth is not None else _bandwidth(pattern())
        if callable(solver.jac) or solver.jac != "fwd":
            raise ValueError(f"jac={solver.jac!r} builds a dense Jacobian: leave it 'fwd' "
                             f"with a banded solver")
        return solver.with_linear_solver(Banded(lower, upper))
    if linear_solver == "krylov":
        if jac_sparsity is None and load_native() is None:
            return solver.with_linear_solver(Krylov())
        ilu = "ilu0" if load_native() is not None else None
        return solver.with_linear_solver(Krylov(ilu, pattern() if ilu else None))
    if linear_solver == "sparse":
        return solver.with_linear_solver(Sparse(pattern()))
    if jac_sparsity is not None:
        return solver.with_linear_solver(_sparse_or_banded(jac_sparsity))
    # auto without a pattern
    if n < AUTO_DETECT_MIN_STATES or callable(solver.jac) or solver.jac != "fwd":
        return solver
    detected = detect_sparsity(f, y0, t0, args)
    if detected.nnz <= AUTO_SPARSE_MAX_DENSITY * n * n:
        return solver.with_linear_solver(_sparse_or_banded(detected))
    return solver


def _sparse_or_banded(pattern) -> LinearSolver:
    """``"auto"``'s choice for a known pattern: the banded LU when the band is narrow
    (``lower + upper + 1 <= AUTO_BAND_MAX_WIDTH``: 1-D grids, chains), else the sparse LU
    (the banded LU is the faster where both apply: docs/benchmarks.md)."""
    from .._linalg._banded import Banded

    lower, upper = _bandwidth(pattern)
    if lower + upper + 1 <= AUTO_BAND_MAX_WIDTH:
        return Banded(lower, upper)
    return Sparse(pattern)


T = TypeVar("T")


def member_cond(pred: jax.Array, true_fun: Callable[[], T],
                false_fun: Callable[[], T]) -> T:
    """``lax.cond(pred, true_fun, false_fun)``, whose ``vmap`` with a batched ``pred``
    runs ``true_fun`` only when some member takes it (then for every member, each keeping
    its own branch's result), where ``lax.cond`` under ``vmap`` becomes a ``select`` that
    runs both branches at every call (``jax.custom_batching.custom_vmap``). For branches
    on values cut from the autodiff graph (a factorisation, a Newton iteration): the
    result carries no derivatives."""
    true_j, false_j = jax.make_jaxpr(true_fun)(), jax.make_jaxpr(false_fun)()
    example = jax.eval_shape(false_fun)
    treedef = jax.tree_util.tree_structure(example)
    consts, consts_f = true_j.consts, false_j.consts

    def true_c(*c):
        return jax.tree_util.tree_unflatten(treedef, jax.core.eval_jaxpr(true_j.jaxpr, c))

    def false_c(*c):
        return jax.tree_util.tree_unflatten(treedef, jax.core.eval_jaxpr(false_j.jaxpr, c))

    @jax.custom_batching.custom_vmap
    def run(pred, consts, consts_f):
        return lax.cond(pred, lambda: true_c(*consts), lambda: false_c(*consts_f))

    @run.def_vmap
    def rule(axis_size, in_batched, pred, consts, consts_f):
        pred_b, consts_b, consts_f_b = in_batched
        axes = [0 if b else None for b in consts_b]
        axes_f = [0 if b else None for b in consts_f_b]
        v_true = jax.vmap(lambda *c: true_c(*c), in_axes=axes, axis_size=axis_size)
        v_false = jax.vmap(lambda *c: false_c(*c), in_axes=axes_f, axis_size=axis_size)
        if not pred_b:
            out = lax.cond(pred, lambda: v_true(*consts), lambda: v_false(*consts_f))
        else:
            def both():
                a, b = v_true(*consts), v_false(*consts_f)
                return jax.tree_util.tree_map(
                    lambda x, y: jnp.where(pred.reshape((-1,) + (1,) * (x.ndim - 1)), x, y),
                    a, b)

            out = lax.cond(jnp.any(pred), both, lambda: v_false(*consts_f))
        return out, jax.tree_util.tree_map(lambda _: True, example)

    # the branches' values carry no derivatives (custom_vmap has no transpose rule)
    sg = lax.stop_gradient
    return run(sg(pred), [sg(c) for c in consts], [sg(c) for c in consts_f])


def refactor_where(ls: LinearSolver, pred: jax.Array, old, jac, c: jax.Array, mass):
    """``ls.factor(jac, c, mass)`` where ``pred``, ``old`` elsewhere. A linear solver that
    factorises member by member (``ls.factors_per_member``: the native sparse LU) gets the
    batched ``pred`` itself under ``vmap``, so that only the members that ask are
    factorised; for the others this is :func:`member_cond`, which factorises every member
    when some member asks."""
    if ls.factors_per_member:
        return ls.factor_where(pred, old, jac, c, mass)
    return member_cond(pred, lambda: ls.factor(jac, c, mass), lambda: old)
