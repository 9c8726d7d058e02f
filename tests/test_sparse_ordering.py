"""The native sparse LU's fill-reducing orderings (simlib/_linalg/_sparse.py, nested
dissection in native/linalg.cc): solves against scipy's spsolve, the symbolic fill against
a dense elimination of the same matrix, and why nested dissection is the default on
2-D grids (less fill than reverse Cuthill-McKee)."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as spla

from simlib._linalg import _kernels
from simlib._linalg._coloring import CompressedPattern
from simlib._linalg._sparse import Sparse, SymbolicLU

REQUIRE_NATIVE = os.environ.get("SIMLIB_REQUIRE_NATIVE", "0") == "1"
pytestmark = pytest.mark.skipif(_kernels.load() is None and not REQUIRE_NATIVE,
                                reason=f"native kernels: {_kernels.unavailable_reason()}")


def grid_pattern(m: int) -> sp.csr_matrix:
    """Two species on a periodic m x m grid (as the 2-D Brusselator): each species'
    5-point Laplacian, and the two species coupled at each point."""
    one = sp.diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(m, m), format="lil")
    one[0, m - 1] = one[m - 1, 0] = 1
    lap = sp.kron(one, sp.eye(m)) + sp.kron(sp.eye(m), one)
    return sp.csr_matrix(sp.kron(np.ones((2, 2)), sp.eye(m * m)) + sp.kron(sp.eye(2), lap),
                         dtype=bool)


def random_pattern(n: int, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    s = sp.random(n, n, density=4.0 / n, random_state=rng, format="csr")
    return sp.csr_matrix(s + sp.eye(n), dtype=bool)


def solve_both(pattern: sp.csr_matrix, ordering: str, seed: int = 0):
    """simlib's native LU solve of A = I - c J (J random on the pattern) and scipy's."""
    pat = CompressedPattern(pattern)
    rng = np.random.default_rng(seed)
    jac = rng.normal(size=pat.nnz)
    c = 0.05
    b = rng.normal(size=pat.n)
    a = sp.eye(pat.n) - c * sp.csr_matrix((jac, (pat.rows, pat.cols)), shape=(pat.n, pat.n))
    ls = Sparse(pattern, kernel="native", ordering=ordering)
    fac = ls.factor(jnp.asarray(jac), jnp.asarray(c))
    x = np.asarray(ls.solve(fac, jnp.asarray(b)))
    xt = np.asarray(ls.solve(fac, jnp.asarray(b), transpose=True))
    return bool(fac.ok), x, xt, spla.spsolve(a.tocsc(), b), spla.spsolve(a.T.tocsc(), b), ls


@pytest.mark.parametrize(("kind", "ordering"), [("grid", "nd"), ("grid", "auto"),
                                                 ("random", "nd"), ("random", "auto"),
                                                 ("grid", "mmd")])
def test_nested_dissection_solves_agree_with_spsolve(kind, ordering):
    """Factor and solve (and the transposed solve) against scipy's spsolve; "mmd" (the
    previous default) stays selectable."""
    pattern = grid_pattern(12) if kind == "grid" else random_pattern(300, 1)
    ok, x, xt, x_ref, xt_ref, ls = solve_both(pattern, ordering)
    assert ok
    np.testing.assert_allclose(x, x_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(xt, xt_ref, rtol=1e-11, atol=1e-12)
    assert ls.symbolic().ordering == ("mmd" if ordering == "mmd" else "nd")


def dense_fill(pattern: sp.csr_matrix, order: np.ndarray) -> int:
    """Nonzeros of L + U (diagonal once) of P A P^T by dense Gaussian elimination without
    pivoting, with random values on A's pattern and a dominant diagonal (no cancellation):
    the structural fill, independent of the symbolic code."""
    n = pattern.shape[0]
    s = sp.csr_matrix(pattern, dtype=float)
    rng = np.random.default_rng(3)
    s.data = rng.uniform(0.5, 1.0, s.data.size)
    a = (s[order][:, order]).toarray() + np.eye(n) * 4 * n
    for k in range(n - 1):
        a[k + 1:, k] /= a[k, k]
        a[k + 1:, k + 1:] -= np.outer(a[k + 1:, k], a[k, k + 1:])
    return int(np.count_nonzero(a))


def test_symbolic_fill_matches_dense_elimination_and_nd_fills_less_than_rcm():
    """The mechanism: on a 2-D grid, nested dissection's fill (from the symbolic
    structure, checked against a dense elimination) is well below reverse Cuthill-McKee's,
    and its last block is a separator (removing it disconnects the graph)."""
    pattern = grid_pattern(10)
    pat = CompressedPattern(pattern)
    nd, rcm = SymbolicLU(pat, "nd"), SymbolicLU(pat, "rcm")
    for sym in (nd, rcm):
        assert np.array_equal(np.sort(sym.order), np.arange(pat.n))
        assert sym.nnz == dense_fill(pattern, sym.order)
    assert nd.nnz < 0.7 * rcm.nnz, (nd.nnz, rcm.nnz)
    # the top separator: the trailing rows of the factor are dense; removing them splits
    # the graph into at least two components
    dense_tail = 0
    for i in range(pat.n - 1, -1, -1):
        if nd.fp[i + 1] - nd.diag[i] - 1 != pat.n - 1 - i:
            break
        dense_tail += 1
    keep = nd.order[: pat.n - dense_tail]
    g = sp.csr_matrix(pattern + pattern.T)[keep][:, keep]
    assert 0 < dense_tail < 0.25 * pat.n
    assert csgraph.connected_components(g, directed=False)[0] >= 2


def test_auto_takes_rcm_on_a_banded_pattern():
    """On a 1-D (banded) pattern reverse Cuthill-McKee's envelope is below nested
    dissection's fill, so "auto" takes it (its solves: test_linalg's "sparse-native-rcm")."""
    n = 200
    band = sp.csr_matrix(sp.diags([1.0] * 5, [-2, -1, 0, 1, 2], shape=(n, n)), dtype=bool)
    pat = CompressedPattern(band)
    auto, nd = SymbolicLU(pat, "auto"), SymbolicLU(pat, "nd")
    assert auto.ordering == "rcm" and auto.nnz <= nd.nnz
    assert auto.nnz == dense_fill(band, auto.order)
