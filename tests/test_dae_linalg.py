"""The dense LU's stage solves (``simlib._linalg._dense.exact_lu_solve``), which every
Rosenbrock and implicit step of a small DAE or ODE makes: up to ``UNROLL_MAX`` unknowns
written-out substitution instead of LAPACK's ``trsm`` (the batched-ensemble speed-up of
benchmarks/dae.py's profile), checked against numpy's solver, for ``A`` and ``A^T``, one
and several right-hand sides, batched under ``vmap``, and by the jaxpr it traces."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.lax.linalg import lu_pivots_to_permutation
from jax.scipy.linalg import lu_factor

from simlib._linalg._dense import UNROLL_MAX, exact_lu_solve

solve = jax.jit(exact_lu_solve, static_argnums=3)


@jax.jit
def _factor(a):
    lu, piv = lu_factor(a)
    return lu, lu_pivots_to_permutation(piv, a.shape[0])


def _system(n, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)) + n * np.eye(n)[rng.permutation(n)]  # pivoting needed
    return a, rng.standard_normal((n, 3))


@pytest.mark.parametrize("n", [1, 7, UNROLL_MAX + 1])
@pytest.mark.parametrize("transpose", [False, True])
def test_lu_solve_matches_numpy(n, transpose):
    a, b = _system(n)
    lu, perm = _factor(jnp.asarray(a))
    ref_a = a.T if transpose else a
    for rhs in (b, b[:, 0]):
        x = np.asarray(solve(lu, perm, jnp.asarray(rhs), transpose))
        ref = np.linalg.solve(ref_a, rhs)
        assert x.shape == ref.shape
        np.testing.assert_allclose(x, ref, rtol=1e-13, atol=1e-14 * np.abs(ref).max())


def test_small_systems_trace_no_triangular_solve_and_batch_under_vmap():
    """Up to UNROLL_MAX unknowns the jaxpr holds no ``triangular_solve`` (the substitution
    ran), above it LAPACK's; under vmap each member equals numpy's solve."""
    for n, expect in ((6, False), (UNROLL_MAX + 1, True)):
        a, b = _system(n)
        lu, perm = _factor(jnp.asarray(a))
        for transpose in (False, True):
            jaxpr = str(jax.make_jaxpr(exact_lu_solve, static_argnums=3)(
                lu, perm, jnp.asarray(b[:, 0]), transpose))
            assert ("triangular_solve" in jaxpr) is expect, (n, transpose)
    systems = [_system(6, seed) for seed in range(5)]
    a = jnp.asarray(np.stack([s[0] for s in systems]))
    b = jnp.asarray(np.stack([s[1][:, 0] for s in systems]))
    lu, perm = jax.vmap(_factor)(a)
    x = np.asarray(jax.jit(jax.vmap(exact_lu_solve))(lu, perm, b))
    for i, (ai, bi) in enumerate(systems):
        np.testing.assert_allclose(x[i], np.linalg.solve(ai, bi[:, 0]), rtol=1e-13,
                                   atol=1e-15)
