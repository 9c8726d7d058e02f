"""Matrix-free Newton-Krylov: restarted GMRES on Jacobian-vector products.

``A = M - c J`` is never stored: ``A x = M x - c jvp(g, v; x)`` (and ``A^T x`` by a VJP for
transposed solves). GMRES (Saad and Schultz, SIAM J. Sci. Stat. Comput. 7, 1986, 856-869)
with right preconditioning, so that the residual it monitors is the true one:
Arnoldi with classical Gram-Schmidt applied twice (CGS2, as stable as modified
Gram-Schmidt and one matrix product per pass), Givens rotations for the least-squares
problem, a restart every ``restart`` iterations and at most ``restart * max_restarts``
iterations in all: static shapes, one ``lax.while_loop`` inside another, jit- and
vmap-able.

Preconditioners, built from the sparse Jacobian's values on a static pattern (one JVP per
colour, :mod:`._coloring`):

- ``"block_jacobi"``: ``A``'s diagonal blocks (``blocks``: the state indices of each
  block, e.g. the species at one grid point), inverted densely in a batch (pure JAX);
- ``"ilu0"``: incomplete LU without fill on ``A``'s own pattern (Saad, *Iterative Methods
  for Sparse Linear Systems*, 2nd ed., 2003, 10.3), the native sparse kernel of
  :mod:`._sparse`.

Or the user's own: a callable ``(c, x) -> z ~ (M - c J)^-1 x``, given the ``c`` of each
factorisation, such as :func:`simlib.pde.diffusion_preconditioner` (the exact inverse of a
reaction-diffusion system's diffusion part by FFT). It serves transposed solves too, which
suits a symmetric ``P``; GMRES's answer does not depend on ``P``, only its iterations do.
:meth:`Krylov.solve_linear_map` (a converged stage's implicit-function solve, ``M - c J``
with the stage's ``c``) gives it that ``c``, and leaves it out where no ``c`` is known.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._static import register_static
from . import _kernels
from ._base import Array, Factorisation, Field, LinearSolver
from ._coloring import CompressedPattern
from ._sparse import Sparse, SymbolicLU


class GMRESInfo(NamedTuple):
    """``iterations`` (matrix-vector products), ``residual`` (``||b - A x|| / ||b||``) and
    ``converged`` of one :func:`gmres` call."""

    iterations: jax.Array
    residual: jax.Array
    converged: jax.Array


def gmres(matvec, b, precondition=None, *, rtol: float = 1e-8, restart: int = 20,
          max_restarts: int = 10, x0=None):
    """Solve ``A x = b`` by restarted, right-preconditioned GMRES(``restart``).

    Args:
        matvec: ``x -> A x``.
        b: ``(n,)`` right-hand side.
        precondition: ``x -> P^-1 x`` with ``P ~ A`` (``None``: the identity).
        rtol: Stop when ``||b - A x|| <= rtol ||b||``.
        restart, max_restarts: The Krylov basis size and the number of cycles.

    Returns:
        ``(x, GMRESInfo)``.
    """
    precondition = (lambda z: z) if precondition is None else precondition
    n = b.shape[0]
    dtype = b.dtype
    m = restart
    bnorm = jnp.linalg.norm(b)
    target = rtol * bnorm
    tiny = jnp.finfo(dtype).tiny
    # the residual of each cycle's start is carried from the previous cycle's end (which
    # computes it to test convergence): one product with A per cycle, none for x0 = 0
    x = jnp.zeros_like(b) if x0 is None else x0
    r = b if x0 is None else b - matvec(x0)

    def cycle(state):
        x, r, its, _, k_cycle = state
        beta = jnp.linalg.norm(r)
        V = jnp.zeros((m + 1, n), dtype).at[0].set(r / jnp.maximum(beta, tiny))
        H = jnp.zeros((m + 1, m), dtype)
        cs = jnp.zeros((m,), dtype)
        sn = jnp.zeros((m,), dtype)
        g = jnp.zeros((m + 1,), dtype).at[0].set(beta)

        def arnoldi(s):
            V, H, cs, sn, g, k, _ = s
            w = matvec(precondition(V[k]))
            mask = (jnp.arange(m + 1) <= k).astype(dtype)
            h = (V @ w) * mask
            w = w - V.T @ h
            h2 = (V @ w) * mask          # second Gram-Schmidt pass
            w = w - V.T @ h2
            h = h + h2
            hk1 = jnp.linalg.norm(w)
            V = V.at[k + 1].set(w / jnp.maximum(hk1, tiny))
            col = h.at[k + 1].set(hk1)

            def rotate(i, c):  # apply the earlier rotations to the new column
                a, bb = c[i], c[i + 1]
                ok = i < k
                return c.at[i].set(jnp.where(ok, cs[i] * a + sn[i] * bb, a)).at[i + 1].set(
                    jnp.where(ok, -sn[i] * a + cs[i] * bb, bb))

            col = lax.fori_loop(0, m, rotate, col)
            a, bb = col[k], col[k + 1]
            rad = jnp.hypot(a, bb)
            c_k = jnp.where(rad > 0, a / jnp.maximum(rad, tiny), 1.0)
            s_k = jnp.where(rad > 0, bb / jnp.maximum(rad, tiny), 0.0)
            col = col.at[k].set(rad).at[k + 1].set(0.0)
            H = H.at[:, k].set(col)
            cs, sn = cs.at[k].set(c_k), sn.at[k].set(s_k)
            gk = g[k]
            g = g.at[k].set(c_k * gk).at[k + 1].set(-s_k * gk)
            return V, H, cs, sn, g, k + 1, jnp.abs(g[k + 1])

        def go_on(s):
            *_, k, res = s
            return (k < m) & (res > target)

        V, H, cs, sn, g, k, _ = lax.while_loop(
            go_on, arnoldi, (V, H, cs, sn, g, jnp.asarray(0), beta))
        # y = H[:k, :k]^-1 g[:k], padded with the identity beyond k
        used = jnp.arange(m) < k
        Hk = jnp.where(used[:, None] & used[None, :], H[:m], jnp.eye(m, dtype=dtype))
        y = jax.scipy.linalg.solve_triangular(Hk, jnp.where(used, g[:m], 0.0), lower=False)
        x = x + precondition(V[:m].T @ y)
        r = b - matvec(x)
        return x, r, its + k, jnp.linalg.norm(r), k_cycle + 1

    def more(state):
        *_, res, k_cycle = state
        return (res > target) & (k_cycle < max_restarts)

    x, _, its, res, _ = lax.while_loop(
        more, cycle, (x, r, jnp.asarray(0), jnp.asarray(jnp.inf, dtype), jnp.asarray(0)))
    rel = res / jnp.maximum(bnorm, tiny)
    return x, GMRESInfo(its, rel, res <= target)


class KrylovOperator(NamedTuple):
    """What :meth:`Krylov.linearise` keeps: the point ``(t, v)`` of the JVPs and, with a
    preconditioner, ``J``'s values on the pattern."""

    t: jax.Array
    v: jax.Array
    values: jax.Array | None


PRECONDITIONERS = (None, "block_jacobi", "ilu0")


class Krylov(LinearSolver):
    """Matrix-free ``A = M - c J`` solves by GMRES on JVPs, optionally preconditioned.

    Args:
        preconditioner: ``None``, ``"block_jacobi"`` (needs ``blocks``) or ``"ilu0"``
            (needs the native kernels); both need ``jac_sparsity``. Or a callable
            ``(c, x) -> z ~ (M - c J)^-1 x`` for flat ``x``, traceable (no gradient flows
            through it).
        jac_sparsity: The Jacobian's pattern (for the preconditioner's values).
        blocks: ``(n_blocks, block_size)`` state indices of each diagonal block.
        rtol: GMRES's relative residual target.
        restart, max_restarts: GMRES's basis size and number of cycles.
    """

    reuses_jacobian = False
    exact = False

    def __init__(self, preconditioner: str | None = None, jac_sparsity: Any = None,
                 blocks: Any = None, rtol: float = 1e-8, restart: int = 20,
                 max_restarts: int = 10) -> None:
        if not callable(preconditioner) and preconditioner not in PRECONDITIONERS:
            raise ValueError(f"preconditioner must be one of {PRECONDITIONERS} or a callable "
                             f"(c, x) -> z; got {preconditioner!r}")
        if isinstance(preconditioner, str) and jac_sparsity is None:
            raise ValueError(f"preconditioner={preconditioner!r} needs jac_sparsity")
        if preconditioner == "block_jacobi" and blocks is None:
            raise ValueError("preconditioner='block_jacobi' needs blocks")
        self.preconditioner = preconditioner
        self.pattern = (None if jac_sparsity is None else jac_sparsity
                        if isinstance(jac_sparsity, CompressedPattern)
                        else CompressedPattern(jac_sparsity))
        self.blocks = None if blocks is None else tuple(map(tuple, np.asarray(blocks).tolist()))
        self.rtol = float(rtol)
        self.restart = int(restart)
        self.max_restarts = int(max_restarts)

    # ------------------------------------------------------------------ building
    def linearise(self, g: Field, t: Any, v: Array) -> KrylovOperator:
        values = None
        if isinstance(self.preconditioner, str):
            values = self.pattern.jacobian(
                lambda u: jax.jvp(lambda w: g(t, w), (v,), (u,))[1], v.dtype)
        return KrylovOperator(jnp.asarray(t), v, values)

    def materialise(self, linear_map: Callable[[Array], Array], n: int, dtype: Any) -> Any:
        values = (self.pattern.jacobian(linear_map, dtype)
                  if isinstance(self.preconditioner, str) else None)
        return KrylovOperator(jnp.zeros((), dtype), jnp.zeros((n,), dtype), values)

    def matvec(self, jac: Any, c: Array, mass: Any, x: Array, *, field: Field | None = None,
               transpose: bool = False) -> Array:
        if field is None:
            raise ValueError("Krylov solves need field=g (the vector field)")
        gv = lambda w: field(jac.t, w)  # noqa: E731
        if not transpose:
            jx = jax.jvp(gv, (jac.v,), (x,))[1]
        else:
            jx = jax.vjp(gv, jac.v)[1](x)[0]
        mx = x if mass is None else jnp.asarray(mass, x.dtype) * x
        return mx - c.astype(x.dtype) * jx

    # ------------------------------------------------------------------ preconditioner
    def _block_index(self):
        pat = self.pattern
        blocks = np.asarray(self.blocks, np.int64)
        nb, bs = blocks.shape
        keys = pat.rows * pat.n + pat.cols
        want = (blocks[:, :, None] * pat.n + blocks[:, None, :]).ravel()
        pos = np.searchsorted(keys, want)
        pos = np.minimum(pos, keys.size - 1)
        found = keys[pos] == want
        return blocks, pos.reshape(nb, bs, bs), found.reshape(nb, bs, bs)

    def _factor(self, jac, c, mass):
        if self.preconditioner is None:
            return None, jnp.asarray(True)
        if callable(self.preconditioner):    # the user's: it needs only c
            return c, jnp.asarray(True)
        a = Sparse(self.pattern).operator(jac.values, c, mass)
        if self.preconditioner == "block_jacobi":
            _, pos, found = self._block_index()
            blocks = jnp.where(jnp.asarray(found), a[jnp.asarray(pos)], 0.0)
            inv = jnp.linalg.inv(blocks)
            return inv, jnp.all(jnp.isfinite(inv))
        sym = self._ilu_symbolic()
        vals = jnp.zeros((sym.nnz,), a.dtype).at[sym.position].set(a)
        lu, info = _kernels.sparse_lu_native(vals, _kernels.pattern_key(sym))
        return lu, (info == 0) & jnp.all(jnp.isfinite(lu))

    def _ilu_symbolic(self) -> SymbolicLU:
        cache = self.pattern.__dict__.setdefault("_symbolic", {})
        if "ilu0" not in cache:
            cache["ilu0"] = SymbolicLU(self.pattern, "natural", fill=False)
        return cache["ilu0"]

    def _precondition(self, data, transpose: bool):
        if self.preconditioner is None:
            return None
        if callable(self.preconditioner):
            if data is None:             # no c known (a tangent solve without one)
                return None
            user = self.preconditioner
            return lambda x: user(data, x).astype(x.dtype)
        if self.preconditioner == "block_jacobi":
            blocks = jnp.asarray(np.asarray(self.blocks, np.int64))
            inv = jnp.swapaxes(data, 1, 2) if transpose else data

            def apply(x):
                return x.at[blocks].set(jnp.einsum("bij,bj->bi", inv, x[blocks]))

            return apply
        sym = self._ilu_symbolic()

        def apply(x):
            return _kernels.sparse_solve_native(data, _kernels.pattern_key(sym), x, transpose)

        return apply

    def _solve(self, fac, b, transpose, field, strict: bool = False):
        def mv(x):
            return self.matvec(fac.jac, fac.c, fac.mass, x, field=field, transpose=transpose)

        x, info = gmres(mv, b, self._precondition(fac.data, transpose), rtol=self.rtol,
                        restart=self.restart, max_restarts=self.max_restarts)
        # strict (a tangent solve): not converged is nan; a Newton iteration tests its own
        # residual instead
        return jnp.where(info.converged, x, jnp.nan) if strict else x

    def solve_linear_map(self, linear_map: Callable[[Array], Array], b: Array,
                         c: Array | None = None) -> Array:
        """As :meth:`LinearSolver.solve_linear_map` (a converged stage's implicit-function
        solve, ``L = M - c J``), by GMRES on ``L`` itself. A user's preconditioner is given
        the stage's ``c``; without one (``c`` not known) it is left out, since ``P(-1, x)``
        may be near singular (``(I + D lap)^-1`` for
        :func:`simlib.pde.diffusion_preconditioner`). A solve that does not reach
        ``rtol`` within ``restart * max_restarts`` iterations returns ``nan``: a
        derivative from it would be wrong by an unknown amount, never quietly so."""
        n, dtype = b.shape[0], b.dtype
        jac = self.materialise(linear_map, n, dtype)
        # A = M - c J with M = 0, c = -1: A = L, the map itself
        fac = self.factor(jac, jnp.asarray(-1.0, dtype), self._zero_mass(n, dtype))
        if callable(self.preconditioner):
            fac = fac._replace(data=None if c is None else jnp.asarray(c, dtype))
        return self._linear_solve(fac, b, lambda t, v: linear_map(v), False,
                                  functools.partial(self._solve, strict=True))

    def solve_with_info(self, fac: Factorisation, b: Array, *, field: Field,
                        transpose: bool = False) -> tuple[Array, GMRESInfo]:
        """``(x, GMRESInfo)``: the solve with its iteration count (not differentiable)."""
        def mv(x):
            return self.matvec(fac.jac, fac.c, fac.mass, x, field=field, transpose=transpose)

        return gmres(mv, b, self._precondition(fac.data, transpose), rtol=self.rtol,
                     restart=self.restart, max_restarts=self.max_restarts)


register_static(Krylov)
