"""``ensemble(..., sequential=True)``: members solved one at a time (``lax.map``) in one
compiled program. Each member takes its own steps and factorisations (the native sparse
LU's counter against a loop of single solves), the kernels see one member per call (the
jaxpr), results equal ``vmap``'s, a failing member raises, and gradients match the closed
form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

import simlib as sl
from simlib._linalg import _kernels

pytestmark = pytest.mark.skipif(_kernels.load() is None,
                                reason=f"native kernels: {_kernels.unavailable_reason()}")


def _chain(n: int = 12):
    """A stiff linear chain ``y_i' = -k_i y_i + (y_{i-1} - 2 y_i + y_{i+1})``, periodic (so
    the LU fills), with its sparsity pattern."""
    lap = sp.diags([1.0, -2.0, 1.0], [-1, 0, 1], shape=(n, n), format="lil")
    lap[0, n - 1] = lap[n - 1, 0] = 1.0
    lap = lap.tocsr()
    dense = jnp.asarray(lap.toarray())

    def f(t, y, k):
        return -k * y + 50.0 * (dense @ y)

    return f, (abs(lap) + sp.identity(n)).astype(bool), n


def _member(f, pattern, n):
    ls = sl.SparseLU(pattern, kernel="native")

    def member(k):
        sol = sl.solve(f, jnp.ones(n), 0.0, 1.0, solver=sl.BDF(), rtol=1e-8, atol=1e-10,
                       args=k, linear_solver=ls)
        return sol.ys[-1], sol.stats["num_steps"]

    return member


@pytest.mark.slow
def test_sequential_members_take_their_own_factorisations_one_at_a_time():
    f, pattern, n = _chain()
    member = _member(f, pattern, n)
    ks = jnp.asarray(np.random.default_rng(0).uniform(1.0, 200.0, size=(4, n)))
    seq = sl.ensemble(member, sequential=True)
    one = jax.jit(member)
    jax.block_until_ready((seq(ks), one(ks[0]), sl.ensemble(member)(ks)))
    before = _kernels.sparse_lu_count()
    singles = [jax.block_until_ready(one(k)) for k in ks]
    loop_count = _kernels.sparse_lu_count() - before
    before = _kernels.sparse_lu_count()
    ys, steps = jax.block_until_ready(seq(ks))
    assert _kernels.sparse_lu_count() - before == loop_count
    assert np.asarray(steps).tolist() == [int(s[1]) for s in singles]
    assert len({int(s) for s in steps}) > 1  # members differ
    for k in range(len(ks)):  # the same program per member: equal to the last bit
        np.testing.assert_array_equal(ys[k], singles[k][0])
    # and equal, to round-off, to the vmap-ed ensemble and to the matrix exponential
    yv, sv = sl.ensemble(member)(ks)
    np.testing.assert_allclose(ys, yv, rtol=1e-12, atol=1e-14)
    lap = np.asarray(jax.jacfwd(lambda y: f(0.0, y, jnp.zeros(n)))(jnp.ones(n)))
    for k in range(len(ks)):
        exact = sla.expm(lap - np.diag(np.asarray(ks[k]))) @ np.ones(n)
        np.testing.assert_allclose(ys[k], exact, rtol=1e-6, atol=1e-9)


def test_sequential_kernels_get_one_member_per_call():
    f, pattern, n = _chain()
    member = _member(f, pattern, n)
    ks = jnp.ones((3, n))
    lowered = jax.jit(sl.ensemble(member, sequential=True)).lower(ks).as_text()
    vmapped = jax.jit(sl.ensemble(member)).lower(ks).as_text()
    nnz = sl.SparseLU(pattern, kernel="native").symbolic().nnz

    def lu_shapes(text):
        return [line for line in text.splitlines()
                if "simlib_sparse_lu_masked" in line and "custom_call" in line]

    seq_calls, vmap_calls = lu_shapes(lowered), lu_shapes(vmapped)
    assert seq_calls and vmap_calls
    # sequential: one member's factors (nnz,) per call; vmap: the batch's (3, nnz)
    assert all(f"tensor<{nnz}xf64>, tensor<i32>)" in c and f"3x{nnz}x" not in c
               for c in seq_calls), seq_calls
    assert all(f"tensor<3x{nnz}xf64>" in c for c in vmap_calls), vmap_calls


@pytest.mark.slow
def test_sequential_failing_member_raises():
    f, pattern, n = _chain()
    ls = sl.SparseLU(pattern, kernel="native")

    def member(k):
        return sl.solve(f, jnp.ones(n), 0.0, 1.0, solver=sl.BDF(), rtol=1e-8, atol=1e-10,
                        args=k, linear_solver=ls, max_steps=5).ys[-1]

    ks = jnp.stack([jnp.ones(n), jnp.full(n, 1e4)])
    with pytest.raises(sl.SolverError) as err, sl.raise_solver_errors():
        jax.block_until_ready(sl.ensemble(member, sequential=True)(ks))
    assert err.value.result == sl.Result.MAX_STEPS_REACHED
    assert err.value.member is None  # member by member: the check names none (documented)


@pytest.mark.slow
def test_sequential_gradient_matches_the_closed_form():
    # y' = -k y (diagonal pattern): y(1) = exp(-k), d sum(y(1)) / dk_i = -exp(-k_i)
    n = 5
    ls = sl.SparseLU(sp.identity(n, format="csr").astype(bool), kernel="native")

    def loss(k):
        sol = sl.solve(lambda t, y, k: -k * y, jnp.ones(n), 0.0, 1.0, solver=sl.BDF(),
                       rtol=1e-10, atol=1e-12, args=k, linear_solver=ls)
        return jnp.sum(sol.ys[-1])

    ks = jnp.asarray(np.random.default_rng(1).uniform(0.5, 3.0, size=(3, n)))
    grads = sl.ensemble(jax.grad(loss), sequential=True)(ks)
    np.testing.assert_allclose(grads, -np.exp(-np.asarray(ks)), rtol=1e-6)
