"""The native sparse LU's pattern registry: the symbolic structure stays out of the
compiled program (the kernels take a key), equal patterns share one entry, a bad pattern
or an unknown key fails loudly, and solves through it agree with scipy's ``spsolve``."""

from __future__ import annotations

import pickle
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from simlib._linalg import _kernels
from simlib._linalg._sparse import Sparse, SymbolicLU

pytestmark = pytest.mark.skipif(_kernels.load() is None,
                                reason=f"native kernels: {_kernels.unavailable_reason()}")
N = 30
C = 0.2


def pattern_and_values(seed: int = 0, density: float = 0.1):
    rng = np.random.default_rng(seed)
    extra = sp.random(N, N, density=density, random_state=seed, format="csr")
    pattern = (abs(extra) + sp.identity(N)).astype(bool).tocsr()
    pattern.sort_indices()
    rows, cols = pattern.nonzero()
    order = np.lexsort((cols, rows))
    return pattern, rows[order], cols[order], rng.normal(size=rows.size)


def test_the_compiled_solve_holds_no_pattern_array():
    """Mechanism: the lowered program of a factorisation and two solves (one transposed,
    through the gradient) calls the kernels with the key attribute and holds no array of
    the fill pattern's length (fi, the filled factor's columns, was such a constant)."""
    pattern, rows, cols, jac = pattern_and_values()
    ls = Sparse(pattern, kernel="native")
    sym = ls.symbolic()
    assert sym.nnz > pattern.nnz  # the LU fills, so a length-nnz(F) array is fi's

    def loss(j, b):
        fac = ls.factor(j, jnp.asarray(C))
        return jnp.sum(ls.solve(fac, b) ** 2)

    text = jax.jit(jax.grad(loss, argnums=1)).lower(jnp.asarray(jac), jnp.ones(N)).as_text()
    assert f"pattern = {_kernels.pattern_key(sym)}" in text
    assert "simlib_sparse_lu_f64" in text and "simlib_sparse_solve_f64" in text
    assert "transpose = 1" in text  # the reverse pass solves with A^T
    assert f"tensor<{sym.nnz}xi32>" not in text and f"tensor<{sym.nnz}xi64>" not in text
    assert f"tensor<{N + 1}xi32>" not in text  # nor the row pointers


def test_solves_through_the_registry_agree_with_scipy():
    pattern, rows, cols, jac = pattern_and_values(1)
    a = sp.identity(N) - C * sp.csr_matrix((jac, (rows, cols)), shape=(N, N))
    b = np.random.default_rng(2).normal(size=N)
    ls = Sparse(pattern, kernel="native")

    @jax.jit
    def run(j, b):
        fac = ls.factor(j, jnp.asarray(C))
        return ls.solve(fac, b), ls.solve(fac, b, transpose=True), fac.ok

    x, xt, ok = run(jnp.asarray(jac), jnp.asarray(b))
    assert bool(ok)
    np.testing.assert_allclose(x, spla.spsolve(a.tocsc(), b), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(xt, spla.spsolve(a.T.tocsc(), b), rtol=1e-12, atol=1e-12)


def test_equal_patterns_share_one_entry_and_distinct_ones_do_not():
    pattern, *_ = pattern_and_values(3)
    other, *_ = pattern_and_values(4)
    first = Sparse(pattern, kernel="native", ordering="mmd").symbolic()
    key = _kernels.pattern_key(first)
    count = _kernels.registered_patterns()
    # a new pattern object with the same content: a new symbolic analysis, the same key
    twin = SymbolicLU(Sparse(sp.csr_matrix(pattern), kernel="native")._pattern(), "mmd")
    assert twin is not first
    assert _kernels.pattern_key(twin) == key
    assert _kernels.registered_patterns() == count
    # a different pattern, and the same pattern in another ordering: new entries
    assert _kernels.pattern_key(Sparse(other, kernel="native").symbolic()) != key
    assert _kernels.pattern_key(Sparse(pattern, kernel="native", ordering="natural")
                                .symbolic()) != key
    assert _kernels.registered_patterns() == count + 2


def test_registration_from_threads_gives_one_key():
    pattern, *_ = pattern_and_values(5)
    syms = [SymbolicLU(Sparse(pattern)._pattern(), "rcm") for _ in range(4)]
    count = _kernels.registered_patterns()
    keys = []
    threads = [threading.Thread(target=lambda s=s: keys.append(_kernels.pattern_key(s)))
               for s in syms]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys) == 4
    assert _kernels.registered_patterns() == count + 1


def test_a_bad_pattern_is_refused_and_an_unknown_key_fails_loudly():
    fp = np.array([0, 2, 3], np.int32)
    diag = np.array([0, 2], np.int32)
    with pytest.raises(ValueError, match="sparse pattern"):  # column 5 in a 2 x 2 matrix
        _kernels.register_pattern(fp, np.array([0, 5, 1], np.int32), diag,
                                  np.array([0, 2], np.int32))
    with pytest.raises(ValueError, match="sparse pattern"):  # row 1's diagonal missing
        _kernels.register_pattern(fp, np.array([0, 1, 0], np.int32), diag,
                                  np.array([0, 2], np.int32))
    unknown = 12345  # not a registered key (a key is a content hash)
    with pytest.raises(Exception, match="not registered"):
        jax.block_until_ready(_kernels.sparse_lu_native(jnp.ones(3), unknown))


def test_a_pickled_solver_solves_alike():
    """A solver sent elsewhere (pickled: the symbolic analysis is redone or carried, and its
    key found or registered again) gives the same solution."""
    pattern, rows, cols, jac = pattern_and_values(6)
    ls = Sparse(pattern, kernel="native")
    ls.symbolic()
    clone = pickle.loads(pickle.dumps(ls))
    b = jnp.arange(N, dtype=jnp.float64)

    @jax.jit
    def run(solver, j):
        fac = solver.factor(j, jnp.asarray(C))
        return solver.solve(fac, b)

    np.testing.assert_array_equal(run(clone, jnp.asarray(jac)), run(ls, jnp.asarray(jac)))


def _ilu0_dense(a: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """ILU(0) by the textbook IKJ loop on a dense copy (Saad 2003, Algorithm 10.3): updates
    outside ``keep`` are dropped. The L (unit diagonal, strict lower) and U in one array."""
    lu = a.copy()
    n = a.shape[0]
    for i in range(1, n):
        for k in range(i):
            if not keep[i, k]:
                continue
            lu[i, k] /= lu[k, k]
            for j in range(k + 1, n):
                if keep[i, j]:
                    lu[i, j] -= lu[i, k] * lu[k, j]
    return np.where(keep, lu, 0.0)


def test_a_symbolic_fill_is_closed_and_a_chordless_cycle_is_not():
    # The kernel skips the per-entry pattern check only on a closed pattern (registration
    # checks it). A symbolic fill is closed; a 4-cycle (0-1-2-3-0, no chord: not closed
    # under elimination) is not, and its ILU(0), which must drop the fill entry (1, 3) and
    # (3, 1), equals the textbook ILU(0) on a dense copy, not the exact LU
    pattern, *_ = pattern_and_values(4)
    sym = Sparse(pattern, kernel="native").symbolic()
    assert _kernels.pattern_is_closed(_kernels.pattern_key(sym))
    cycle = sp.csr_matrix(np.eye(4) + np.roll(np.eye(4), 1, 1) + np.roll(np.eye(4), -1, 1))
    cycle.sort_indices()
    ilu = SymbolicLU(Sparse(cycle, kernel="native")._pattern(), "natural", fill=False)
    key = _kernels.pattern_key(ilu)
    assert not _kernels.pattern_is_closed(key)
    a = np.where(cycle.toarray() > 0, np.random.default_rng(5).normal(size=(4, 4)), 0.0)
    a += 4 * np.eye(4)
    vals = np.zeros(ilu.nnz)
    rows, cols = cycle.nonzero()
    vals[ilu.position] = a[np.sort(rows), cols[np.lexsort((cols, rows))]]
    lu, info = jax.jit(lambda v: _kernels.sparse_lu_native(v, key))(jnp.asarray(vals))
    assert int(info) == 0
    got = sp.csr_matrix((np.asarray(lu), ilu.fi, ilu.fp), shape=(4, 4)).toarray()
    np.testing.assert_allclose(got, _ilu0_dense(a, cycle.toarray() > 0), rtol=1e-14,
                               atol=1e-14)
    with pytest.raises(KeyError):
        _kernels.pattern_is_closed(12345)
