"""The native sparse LU's numeric kernel (native/linalg.cc): the grouped updates by the rows
of one supernode chain, and its edge cases, against numpy's dense solve and scipy's
spsolve."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from simlib._linalg import _kernels
from simlib._linalg._sparse import Sparse

REQUIRE_NATIVE = os.environ.get("SIMLIB_REQUIRE_NATIVE", "0") == "1"
native = pytest.mark.skipif(_kernels.load() is None and not REQUIRE_NATIVE,
                            reason=f"native kernels: {_kernels.unavailable_reason()}")


def grid_pattern(m: int) -> sp.csr_matrix:
    """Two species on a periodic m x m grid (as the 2-D Brusselator)."""
    one = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(m, m), format="lil")
    one[0, m - 1] = one[m - 1, 0] = 1
    lap = sp.kron(one, sp.eye(m)) + sp.kron(sp.eye(m), one)
    return sp.csr_matrix(sp.kron(np.ones((2, 2)), sp.eye(m * m)) + sp.kron(sp.eye(2), lap),
                         dtype=bool)


def factor_and_solve(pattern, jac, c, b, ordering="nd"):
    ls = Sparse(pattern, kernel="native", ordering=ordering)
    fac = ls.factor(jnp.asarray(jac), jnp.asarray(c))
    x = np.asarray(ls.solve(fac, jnp.asarray(b)))
    xt = np.asarray(ls.solve(fac, jnp.asarray(b), transpose=True))
    return ls, fac, x, xt


@native
@pytest.mark.parametrize("n", [20])
def test_a_dense_pattern_is_one_chain_and_solves_as_numpy(n):
    """A full pattern is one supernode (every row chains to the next): its rows update in
    groups of 8 and a remainder, and the solves match numpy's dense ones."""
    pattern = np.ones((n, n), bool)
    rng = np.random.default_rng(n)
    jac = rng.normal(size=n * n)
    b = rng.normal(size=n)
    ls, fac, x, xt = factor_and_solve(pattern, jac, 0.05, b, ordering="natural")
    a = np.eye(n) - 0.05 * jac.reshape(n, n)
    assert bool(fac.ok)
    assert _kernels.pattern_chains(_kernels.pattern_key(ls.symbolic())) == n - 1
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(xt, np.linalg.solve(a.T, b), rtol=1e-12, atol=1e-13)


@native
def test_grid_factors_use_chains_and_agree_with_spsolve():
    """On the Brusselator's grid pattern after nested dissection the separators are
    chains (the mechanism), and A = I - c J solves as scipy's spsolve, for a small and a
    large c (far from diagonal dominance: static pivots, still exact here)."""
    pattern = grid_pattern(16)
    ls = Sparse(pattern, kernel="native", ordering="nd")
    sym = ls.symbolic()
    chains = _kernels.pattern_chains(_kernels.pattern_key(sym))
    assert chains > 0.2 * sym.order.size, chains
    pat = ls.pattern
    rng = np.random.default_rng(5)
    jac = rng.normal(size=pat.nnz)
    b = rng.normal(size=pat.n)
    for c in (1e-3, 0.3):
        _, fac, x, xt = factor_and_solve(pattern, jac, c, b)
        a = (sp.eye(pat.n) - c * sp.csr_matrix((jac, (pat.rows, pat.cols)),
                                               shape=(pat.n, pat.n))).tocsc()
        assert bool(fac.ok)
        np.testing.assert_allclose(x, spla.spsolve(a, b), rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(xt, spla.spsolve(a.T.tocsc(), b), rtol=1e-10, atol=1e-11)


@native
def test_a_zero_pivot_inside_a_chain_fails_the_factorisation():
    """A singular matrix (a zero pivot in the middle of a grouped chain) takes the failure
    path: ok is False, and the solve is not trusted."""
    n = 12
    jac = np.zeros((n, n))
    jac[5, 5] = 1.0  # c = 1: A[5, 5] = 1 - 1 = 0, A upper triangular otherwise
    jac[np.triu_indices(n, 1)] = -0.5
    ls, fac, _, _ = factor_and_solve(np.ones((n, n), bool), jac.ravel(), 1.0, np.ones(n),
                                     ordering="natural")
    assert not bool(fac.ok)


@native
def test_a_one_by_one_system():
    ls, fac, x, xt = factor_and_solve(np.ones((1, 1), bool), [3.0], 0.5, [2.0])
    assert bool(fac.ok)
    np.testing.assert_allclose(x, [2.0 / (1.0 - 1.5)], rtol=1e-15)
    np.testing.assert_allclose(xt, [2.0 / (1.0 - 1.5)], rtol=1e-15)


def test_an_empty_system_solves_to_an_empty_vector():
    """Zero states: nothing to factorise (the native kernel is not called), an empty
    solution, with either kernel choice."""
    for kernel in ("auto", "host"):
        ls = Sparse(np.zeros((0, 0), bool), kernel=kernel)
        fac = ls.factor(jnp.zeros(0), jnp.asarray(0.1))
        assert bool(fac.ok)
        assert ls.solve(fac, jnp.zeros(0)).shape == (0,)


def test_a_non_square_pattern_is_refused():
    with pytest.raises(ValueError, match="jac_sparsity must be square"):
        Sparse(np.ones((3, 4), bool))


@native
def test_the_symbolic_analysis_is_done_once_per_pattern(monkeypatch):
    """Factorisations with new values (eager and compiled, several c) reuse one symbolic
    factorisation and one registered pattern (its runs and chains built at
    registration), instead of redoing the analysis per factorisation."""
    import jax

    from simlib._linalg import _sparse

    calls = []
    init = _sparse.SymbolicLU.__init__

    def counting(self, *args, **kwargs):
        calls.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(_sparse.SymbolicLU, "__init__", counting)
    pattern = grid_pattern(6)
    ls = Sparse(pattern, kernel="native", ordering="nd")
    rng = np.random.default_rng(2)
    factor = jax.jit(lambda j, c: ls.factor(j, c).data)
    before = _kernels.registered_patterns()
    for c in (1e-3, 1e-2, 0.1):
        jac = jnp.asarray(rng.normal(size=ls.pattern.nnz))
        ls.factor(jac, jnp.asarray(c))
        factor(jac, jnp.asarray(c))
    assert len(calls) == 1
    assert _kernels.registered_patterns() - before <= 1


def ladder_pattern(m: int) -> sp.csr_matrix:
    """Two species on a 1-D grid of m points, interleaved (as the 1-D Brusselator): each
    species couples to itself at the neighbours and to the other species at its point."""
    chain = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(m, m))
    return sp.csr_matrix(sp.kron(chain, sp.eye(2)) + sp.kron(sp.eye(m), np.ones((2, 2))),
                         dtype=bool)


@native
@pytest.mark.parametrize("m, ordering, band", [(5, "rcm", (2, 2)), (400, "rcm", (2, 2)),
                                               (400, "natural", (2, 2)), (8, "nd", (0, 0))])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_band_shaped_factors_take_the_banded_sweeps_and_solve_as_spsolve(m, ordering, band,
                                                                          dtype):
    """A 1-D ladder in band order factorises into a full (2, 2) band: the solves take the
    register sweeps (the mechanism: the pattern's band, as the kernel reads it) and agree
    with scipy's spsolve, first and last rows included; nested dissection's factors are no
    band and take the general sweeps."""
    pattern = ladder_pattern(m)
    if ordering == "nd":
        pattern = grid_pattern(4)  # 2-D: never a band
    rng = np.random.default_rng(m)
    ls = Sparse(pattern, kernel="native", ordering=ordering)
    jac = rng.normal(size=ls._pattern().nnz)  # J's values on the pattern, in its order
    b = rng.normal(size=pattern.shape[0])
    fac = ls.factor(jnp.asarray(jac, dtype), jnp.asarray(0.05, dtype))
    x = np.asarray(ls.solve(fac, jnp.asarray(b, dtype)))
    assert _kernels.pattern_band(_kernels.pattern_key(ls.symbolic())) == band
    a = sp.identity(pattern.shape[0], format="csc") - 0.05 * sp.csc_matrix(
        ls._pattern().matrix(jac))
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(x, spla.spsolve(a, b), rtol=tol, atol=tol)
