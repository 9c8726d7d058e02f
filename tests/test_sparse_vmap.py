"""The native sparse LU and ILU(0) under ``vmap``: a batch of matrices on one pattern,
inside a ``lax.cond`` whose predicate is batched (as BDF's refactorisation is), against
scipy's ``spsolve`` member by member."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from simlib._linalg import _kernels
from simlib._linalg._krylov import Krylov
from simlib._linalg._sparse import Sparse

pytestmark = pytest.mark.skipif(_kernels.load() is None,
                                reason=f"native kernels: {_kernels.unavailable_reason()}")
N = 40
C = 0.1


@pytest.fixture(scope="module")
def problem():
    """A batch of 3 Jacobians on the pattern of a periodic 1-D Laplacian plus random
    couplings (not banded, so the LU fills), and right-hand sides."""
    rng = np.random.default_rng(1)
    lap = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(N, N), format="lil")
    lap[0, N - 1] = lap[N - 1, 0] = 1.0
    extra = sp.random(N, N, density=0.05, random_state=2, format="csr")
    pattern = (abs(lap.tocsr()) + abs(extra) + sp.identity(N)).astype(bool).tocsr()
    pattern.sort_indices()
    rows, cols = pattern.nonzero()
    order = np.lexsort((cols, rows))
    rows, cols = rows[order], cols[order]
    jacs = rng.normal(size=(3, rows.size))
    bs = rng.normal(size=(3, N))
    mats = [sp.identity(N) - C * sp.csr_matrix((j, (rows, cols)), shape=(N, N))
            for j in jacs]
    return pattern, jacs, bs, mats


def batched_solve(ls, pattern_jacs, bs, transpose):
    """``vmap`` over members of ``cond(pred, solve, identity)`` with a batched ``pred``."""
    def member(jac, b, pred):
        def solve():
            fac = ls.factor(jac, jnp.float64(C))
            return ls.solve(fac, b, field=None, transpose=transpose)

        return jax.lax.cond(pred, solve, lambda: b)

    preds = jnp.asarray([True, False, True])
    return np.asarray(jax.jit(jax.vmap(member))(jnp.asarray(pattern_jacs), jnp.asarray(bs),
                                                preds))


@pytest.mark.parametrize("transpose", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_sparse_lu_vmap_inside_cond_against_scipy(problem, transpose):
    pattern, jacs, bs, mats = problem
    x = batched_solve(Sparse(pattern, kernel="native"), jacs, bs, transpose)
    for k in (0, 2):
        a = (mats[k].T if transpose else mats[k]).tocsc()
        np.testing.assert_allclose(x[k], spla.spsolve(a, bs[k]), rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(x[1], bs[1])  # the member whose predicate was False


@pytest.mark.slow
def test_ilu0_preconditioner_vmap_inside_cond(problem):
    # ILU(0) of each member, applied to b: for this pattern (the LU fills) it is not the
    # exact inverse; check P x = b member by member with scipy's ILU of no fill and
    # the member's own matrix: x equals the member's unbatched result and reduces the
    # residual of A x = b below that of x = b
    pattern, jacs, bs, mats = problem
    ls = Krylov("ilu0", pattern)

    def precondition(jac, b):
        fac = ls.factor(ls.materialise(lambda u: u, N, jnp.float64)._replace(values=jac),
                        jnp.float64(C))
        return ls._precondition(fac.data, False)(b)

    def member(jac, b, pred):
        return jax.lax.cond(pred, lambda: precondition(jac, b), lambda: b)

    preds = jnp.asarray([True, False, True])
    x = np.asarray(jax.jit(jax.vmap(member))(jnp.asarray(jacs), jnp.asarray(bs), preds))
    for k in (0, 2):
        single = np.asarray(jax.jit(precondition)(jnp.asarray(jacs[k]), jnp.asarray(bs[k])))
        np.testing.assert_allclose(x[k], single, rtol=1e-12, atol=1e-14)
        assert (np.linalg.norm(mats[k] @ x[k] - bs[k])
                < 0.5 * np.linalg.norm(mats[k] @ bs[k] - bs[k]))
    np.testing.assert_array_equal(x[1], bs[1])


def test_nested_vmap(problem):
    pattern, jacs, bs, mats = problem
    ls = Sparse(pattern, kernel="native")

    def solve(jac, b):
        return ls.solve(ls.factor(jac, jnp.float64(C)), b)

    x = np.asarray(jax.jit(jax.vmap(jax.vmap(solve, in_axes=(None, 0)), in_axes=(0, None)))(
        jnp.asarray(jacs), jnp.asarray(bs)))  # x[i, j] = A_i^-1 b_j
    for i in range(3):
        for j in range(3):
            np.testing.assert_allclose(x[i, j], spla.spsolve(mats[i].tocsc(), bs[j]),
                                       rtol=1e-10, atol=1e-12)


@pytest.mark.slow
def test_nested_vmap_factors_inside(problem):
    # the other nesting: the outer vmap over b, the inner over the factors
    pattern, jacs, bs, mats = problem
    ls = Sparse(pattern, kernel="native")

    def solve(jac, b):
        return ls.solve(ls.factor(jac, jnp.float64(C)), b)

    x = np.asarray(jax.jit(jax.vmap(jax.vmap(solve, in_axes=(0, None)), in_axes=(None, 0)))(
        jnp.asarray(jacs), jnp.asarray(bs)))  # x[j, i] = A_i^-1 b_j
    for i in range(3):
        for j in range(3):
            np.testing.assert_allclose(x[j, i], spla.spsolve(mats[i].tocsc(), bs[j]),
                                       rtol=1e-10, atol=1e-12)
