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


# --------------------------------------------------------------------------------------
# per-member factorisation (Sparse.factor_where, the native kernel's masked batch)


def test_factor_where_factorises_only_the_members_asked_for(problem):
    # mechanism: the library's own counter of member factorisations; numbers: each
    # refactorised member against scipy's spsolve, each kept member bit for bit the old
    pattern, jacs, bs, mats = problem
    ls = Sparse(pattern, kernel="native")
    old = jax.vmap(lambda j: ls.factor(j, jnp.float64(0.5 * C)))(jnp.asarray(jacs))

    def member(pred, old_fac, jac, b):
        fac = ls.factor_where(pred, old_fac, jac, jnp.float64(C))
        return fac.data, fac.c, fac.ok, ls.solve(fac, b)

    run = jax.jit(jax.vmap(member))
    preds = jnp.asarray([True, False, True])
    jax.block_until_ready(run(preds, old, jnp.asarray(jacs), jnp.asarray(bs)))  # compile
    for ask in ([True, False, True], [False, False, False], [False, True, False]):
        before = _kernels.sparse_lu_count()
        data, c, ok, x = jax.block_until_ready(
            run(jnp.asarray(ask), old, jnp.asarray(jacs), jnp.asarray(bs)))
        assert _kernels.sparse_lu_count() - before == sum(ask)
        assert np.all(np.asarray(ok))
        for k in range(3):
            if ask[k]:
                assert float(c[k]) == C
                np.testing.assert_allclose(x[k], spla.spsolve(mats[k].tocsc(), bs[k]),
                                           rtol=1e-10, atol=1e-12)
            else:
                assert float(c[k]) == 0.5 * C
                np.testing.assert_array_equal(data[k], np.asarray(old.data[k]))
    # unbatched: a lax.cond
    single = jax.jit(lambda pred: ls.factor_where(pred, jax.tree_util.tree_map(
        lambda x: x[0], old), jnp.asarray(jacs[0]), jnp.float64(C)).data)
    jax.block_until_ready(single(True))
    before = _kernels.sparse_lu_count()
    kept = single(False)
    assert _kernels.sparse_lu_count() == before
    np.testing.assert_array_equal(kept, np.asarray(old.data[0]))


@pytest.mark.slow
def test_factor_where_reports_a_zero_pivot_per_member(problem):
    # a member whose matrix is singular (a zero row) fails alone; the other is fine
    pattern, jacs, bs, mats = problem
    ls = Sparse(pattern, kernel="native")
    rows = np.repeat(np.arange(N), np.diff(pattern.indptr))
    bad = np.where(rows == 3, 0.0, jacs[0])
    bad[(rows == 3) & (pattern.indices == 3)] = 1.0 / C  # 1 - C J_33 = 0, row 3 zero
    old = jax.vmap(lambda j: ls.factor(j, jnp.float64(C)))(jnp.asarray(jacs[:2]))
    fac = jax.jit(jax.vmap(lambda p, o, j: ls.factor_where(p, o, j, jnp.float64(C))))(
        jnp.asarray([True, True]), old, jnp.asarray(np.stack([bad, jacs[1]])))
    assert np.asarray(fac.ok).tolist() == [False, True]


@pytest.mark.slow
def test_bdf_ensemble_factorises_per_member_and_equals_single_solves():
    # BDF with the sparse LU under vmap: each member refactorises when it needs to (CVODE's
    # rule), not when another member does, so the batch does exactly the factorisations
    # of a loop of single solves (counted by the kernel), every member equals its single
    # solve to round-off, and each is within 10 tolerance units of scipy Radau
    # (jac_sparsity, rtol 1e-10) on the periodic 2-D Brusselator across its forcing switch
    import simlib as sl
    from validation import pde_reference as ref

    prob = ref.problem("bruss2d", 6).with_t1(2.0)
    rng = np.random.default_rng(0)
    params = np.asarray(prob.args) * np.exp(0.1 * rng.standard_normal((3, 3)))
    ls = sl.SparseLU(prob.sparsity, kernel="native")
    rtol = 1e-6

    def member(p):
        sol = sl.solve(prob.f, jnp.asarray(prob.y0), 0.0, prob.t1, solver=sl.BDF(),
                       rtol=rtol, atol=rtol, args=(p[0], p[1], p[2]), linear_solver=ls)
        return sol.ys[-1], sol.stats["num_steps"]

    one, many = jax.jit(member), jax.jit(jax.vmap(member))
    jax.block_until_ready((one(jnp.asarray(params[0])), many(jnp.asarray(params))))
    before = _kernels.sparse_lu_count()
    singles = [jax.block_until_ready(one(jnp.asarray(p))) for p in params]
    loop_count = _kernels.sparse_lu_count() - before
    before = _kernels.sparse_lu_count()
    ys, steps = jax.block_until_ready(many(jnp.asarray(params)))
    assert _kernels.sparse_lu_count() - before == loop_count
    assert len({int(s[1]) for s in singles}) > 1  # the members differ in their steps
    assert np.asarray(steps).tolist() == [int(s[1]) for s in singles]
    for k, p in enumerate(params):
        # round-off only (vectorised and scalar code differ in the last bits; measured
        # 4e-12 after ~100 steps)
        np.testing.assert_allclose(ys[k], singles[k][0], rtol=1e-10, atol=1e-12)
        y_ref, _ = ref.scipy_solve(ref.PDEProblem(**{**prob.__dict__, "args": tuple(p)}),
                                   "Radau", 1e-10, 1e-10)
        units = np.max(np.abs(np.asarray(ys[k]) - y_ref) / (rtol * (np.abs(y_ref) + 1.0)))
        assert units < 10, (k, units)
