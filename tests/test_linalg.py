"""The linear-solve protocol (simlib/_linalg): every linear solver against numpy/scipy,
transposed solves, vmap, derivatives through solves, and which kernel ran."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg as sla
import scipy.sparse as sp

from simlib import pde
from simlib._linalg import _kernels
from simlib._linalg._banded import (
    Banded,
    band_lu_scan,
    band_lu_solve_scan,
    dense_from_band,
    mask_band,
)
from simlib._linalg._base import jvp_map
from simlib._linalg._dense import Dense
from simlib._linalg._krylov import Krylov, gmres
from simlib._linalg._sparse import Sparse

REQUIRE_NATIVE = os.environ.get("SIMLIB_REQUIRE_NATIVE", "0") == "1"
NATIVE = _kernels.load() is not None
needs_native = pytest.mark.skipif(not NATIVE and not REQUIRE_NATIVE,
                                  reason=f"native kernels: {_kernels.unavailable_reason()}")
N = 24  # 1-D grid points, two species: n = 48, Jacobian bandwidth (2, 2) when interleaved


def field(t, v, k):
    """A 1-D two-species reaction-diffusion system, species interleaved (v = [u0, w0, u1,
    w1, ...]), Neumann boundaries: a Jacobian of bandwidth (2, 2)."""
    u, w = v[0::2], v[1::2]

    def lap(a):
        p = jnp.concatenate([a[1:2], a, a[-2:-1]])
        return (p[2:] - 2 * a + p[:-2]) * 40.0

    du = k[0] - (k[1] + 1) * u + u * u * w + 0.02 * lap(u)
    dw = k[1] * u - u * u * w + 0.02 * lap(w)
    return jnp.stack([du, dw], 1).ravel()


K = jnp.array([1.0, 3.0])
V = jnp.asarray(1.0 + 0.5 * np.sin(np.linspace(0, 3, 2 * N)))
B = jnp.asarray(np.random.default_rng(0).normal(size=2 * N))


def g(t, v):
    return field(t, v, K)


J_TRUE = np.asarray(jax.jacfwd(lambda v: g(0.0, v))(V))
PATTERN = np.abs(np.arange(2 * N)[:, None] - np.arange(2 * N)[None, :]) <= 2


def solvers(quick=()):
    """Every linear solver, marked slow unless named in ``quick`` (the default suite keeps
    a few cheap cases; CI's slow step runs them all)."""
    out = [("dense", Dense(), []), ("dense-rev", Dense("rev"), []),
           ("banded-scan", Banded(2, 2, "scan"), []),
           ("sparse-host", Sparse(PATTERN, kernel="host"), []),
           ("krylov", Krylov(rtol=1e-13, restart=48, max_restarts=3), []),
           ("krylov-bj", Krylov("block_jacobi", PATTERN, blocks=np.arange(2 * N).reshape(N, 2),
                                rtol=1e-13, restart=48, max_restarts=3), []),
           # a user's preconditioner: the FFT/DCT inverse of the diffusion part (here only
           # near: the field mirrors across the edge point, the module across the face)
           ("krylov-user", Krylov(pde.diffusion_preconditioner(
               pde.Grid((N,), spacing=40.0 ** -0.5, bc="neumann"), 0.02, species=2),
               rtol=1e-13, restart=48, max_restarts=3), []),
           ("banded-native", Banded(2, 2, "native"), [needs_native]),
           ("sparse-native-mmd", Sparse(PATTERN, kernel="native"), [needs_native]),
           ("sparse-native-rcm", Sparse(PATTERN, kernel="native", ordering="rcm"),
            [needs_native]),
           ("krylov-ilu0", Krylov("ilu0", PATTERN, rtol=1e-13, restart=48, max_restarts=3),
            [needs_native])]
    return [pytest.param(name, ls, marks=marks + ([] if name in quick else [pytest.mark.slow]),
                         id=name) for name, ls, marks in out]


@pytest.mark.parametrize("name,ls", solvers(quick=("dense", "banded-native", "sparse-native-mmd",
                                                   "krylov-user")))
def test_solve_and_transposed_solve_match_numpy(name, ls):
    a = np.eye(2 * N) - 0.05 * J_TRUE
    mass = jnp.linspace(0.5, 1.5, 2 * N)
    bs = jnp.stack([B, 2 * B + 1], 1)

    @jax.jit
    def run(v, b, bs, mass):
        jac = ls.linearise(g, 0.0, v)
        fac = ls.factor(jac, jnp.asarray(0.05))
        fac_m = ls.factor(jac, jnp.asarray(0.05), mass)
        return (fac.ok, ls.solve(fac, b, field=g), ls.solve(fac, b, field=g, transpose=True),
                ls.solve(fac, bs, field=g), ls.solve(fac_m, b, field=g))

    ok, x, xt, xs, xm = run(V, B, bs, mass)
    assert bool(ok)
    tol = 1e-11 if ls.exact else 1e-10
    np.testing.assert_allclose(x, np.linalg.solve(a, B), rtol=0, atol=tol)
    np.testing.assert_allclose(xt, np.linalg.solve(a.T, B), rtol=0, atol=tol)
    # several right-hand sides at once, and a diagonal mass matrix M - c J
    np.testing.assert_allclose(xs, np.linalg.solve(a, bs), atol=tol)
    np.testing.assert_allclose(xm, np.linalg.solve(np.diag(mass) - 0.05 * J_TRUE, B), atol=tol)


@pytest.mark.parametrize("name,ls", solvers(quick=("sparse-native-mmd",)))
def test_vmap_over_members_equals_a_loop(name, ls):
    """An ensemble: J, c and b differ per member; the pattern is shared and static."""
    ks = jnp.array([[1.0, 3.0], [1.2, 2.5], [0.8, 3.5]])
    cs = jnp.array([0.01, 0.05, 0.1])

    def one(k, c):
        gk = lambda t, v: field(t, v, k)  # noqa: E731
        fac = ls.factor(ls.linearise(gk, 0.0, V), c)
        return ls.solve(fac, B, field=gk), ls.solve(fac, B, field=gk, transpose=True)

    xs, xts = jax.jit(jax.vmap(one))(ks, cs)
    for i in range(3):
        jk = np.asarray(jax.jacfwd(lambda v, i=i: field(0.0, v, ks[i]))(V))
        a = np.eye(2 * N) - float(cs[i]) * jk
        np.testing.assert_allclose(xs[i], np.linalg.solve(a, B), atol=1e-10)
        np.testing.assert_allclose(xts[i], np.linalg.solve(a.T, B), atol=1e-10)


@pytest.mark.parametrize("name,ls", solvers(quick=("sparse-native-mmd",)))
def test_gradient_through_a_solve_matches_finite_differences(name, ls):
    """d/dk of a loss of x = (I - c J(k))^-1 b(k), in reverse mode (custom_linear_solve
    and the transposed solve), against central differences of numpy solves."""

    def loss(k, c):
        gk = lambda t, v: field(t, v, k)  # noqa: E731
        fac = ls.factor(ls.linearise(gk, 0.0, V), c)
        x = ls.solve(fac, B * k[0], field=gk)
        return jnp.sum(x ** 2 * jnp.arange(2 * N))

    def loss_np(k, c):
        jk = np.asarray(jax.jacfwd(lambda v: field(0.0, v, jnp.asarray(k)))(V))
        x = np.linalg.solve(np.eye(2 * N) - c * jk, np.asarray(B) * k[0])
        return np.sum(x ** 2 * np.arange(2 * N))

    k0, c0 = np.array([1.0, 3.0]), 0.05
    grad_k, grad_c = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(k0), jnp.asarray(c0))
    h = 1e-6
    fd = [(loss_np(k0 + h * e, c0) - loss_np(k0 - h * e, c0)) / (2 * h) for e in np.eye(2)]
    fd_c = (loss_np(k0, c0 + h) - loss_np(k0, c0 - h)) / (2 * h)
    np.testing.assert_allclose(grad_k, fd, rtol=1e-6)
    np.testing.assert_allclose(grad_c, fd_c, rtol=1e-6)


@pytest.mark.parametrize("name,ls", solvers())
def test_solve_linear_map_is_a_custom_root_tangent_solve(name, ls):
    """The root z of z - c g(z) - b = 0 differentiated by the implicit function theorem,
    with the tangent solve from the linear solver, against finite differences."""
    c = 0.05

    def root(k):
        gk = lambda v: field(0.0, v, k)  # noqa: E731

        def residual(z):
            return z - c * gk(z) - B

        def solve(f, z0):  # plain Newton with the exact dense Jacobian, enough here
            for _ in range(8):
                z0 = z0 - jnp.linalg.solve(jax.jacfwd(f)(z0), f(z0))
            return z0

        return jax.lax.custom_root(residual, V, solve, ls.solve_linear_map)

    k0 = jnp.array([1.0, 3.0])
    jac = jax.jit(jax.jacrev(lambda k: jnp.sum(root(k) ** 2)))(k0)
    loss = jax.jit(lambda k: jnp.sum(root(k) ** 2))
    h = 1e-6
    fd = [(loss(k0 + h * e) - loss(k0 - h * e)) / (2 * h) for e in jnp.eye(2)]
    np.testing.assert_allclose(jac, fd, rtol=1e-6)


@pytest.mark.slow
def test_banded_lu_matches_scipy_solve_banded_and_grows_the_upper_band():
    rng = np.random.default_rng(3)
    for n, lower, upper in [(1, 0, 0), (30, 2, 2), (17, 3, 0), (12, 0, 3), (7, 6, 6)]:
        band = mask_band(jnp.asarray(rng.normal(size=(n, lower + upper + 1))), lower)
        a = dense_from_band(band, lower)
        b = rng.normal(size=n)
        # scipy's (lower + upper + 1, n) diagonal-ordered storage
        ab = np.zeros((lower + upper + 1, n))
        for i in range(n):
            for j in range(max(0, i - lower), min(n, i + upper + 1)):
                ab[upper + i - j, j] = a[i, j]
        ref = sla.solve_banded((lower, upper), ab, b)
        lu = jax.jit(band_lu_scan, static_argnums=(1, 2))(band, lower, upper)
        solve = jax.jit(band_lu_solve_scan, static_argnums=2)
        x = solve(lu, jnp.asarray(b), False)
        np.testing.assert_allclose(x, ref, rtol=1e-10, atol=1e-10 * np.abs(ref).max())
        np.testing.assert_allclose(solve(lu, jnp.asarray(b), True),
                                   np.linalg.solve(a.T, b), rtol=1e-9,
                                   atol=1e-10 * np.abs(ref).max())
        assert lu.u.shape == (n, lower + upper + 1)  # U's upper bandwidth: lower + upper


@pytest.mark.slow
def test_banded_lu_pivots():
    """A matrix that needs row interchanges (zero diagonal) is solved exactly."""
    a = np.array([[0.0, 1.0, 0.0], [2.0, 0.0, 1.0], [0.0, 3.0, 0.5]])
    band = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            if abs(i - j) <= 1:
                band[i, j - i + 1] = a[i, j]
    lu = band_lu_scan(jnp.asarray(band), 1, 1)
    assert int(lu.pivot[0]) == 1
    b = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(band_lu_solve_scan(lu, jnp.asarray(b)), np.linalg.solve(a, b),
                               atol=1e-14)
    bad = Banded(0, 0, "scan").factor(jnp.zeros((3, 1)), jnp.asarray(1.0), jnp.zeros(3))
    assert not bool(bad.ok)  # a zero pivot is reported


@needs_native
@pytest.mark.parametrize("n, lower, upper", [(30, 2, 2), (9, 1, 1), (40, 4, 4), (25, 3, 1),
                                             (20, 1, 6), (3, 2, 2), (15, 5, 2), (16, 2, 7)])
def test_native_band_solve_with_pivots_matches_scipy(n, lower, upper):
    """The native banded solve (register sweeps for lower <= 4 and lower + upper <= 8, the
    general loops past them: (5, 2) and (2, 7)) against scipy's solve_banded, on random
    bands whose factorisation interchanges rows."""
    from simlib._linalg._kernels import band_lu_native, band_solve_native

    rng = np.random.default_rng(n + 10 * lower + 100 * upper)
    band = mask_band(jnp.asarray(rng.normal(size=(n, lower + upper + 1))), lower)
    a = dense_from_band(band, lower)
    ab = np.zeros((lower + upper + 1, n))
    for i in range(n):
        for j in range(max(0, i - lower), min(n, i + upper + 1)):
            ab[upper + i - j, j] = a[i, j]
    b = rng.normal(size=n)
    lu = band_lu_native(band, lower, upper)
    assert n < 5 or int(jnp.count_nonzero(lu[2])) > 0  # rows were interchanged
    ref = sla.solve_banded((lower, upper), ab, b)
    scale = np.abs(ref).max()
    np.testing.assert_allclose(band_solve_native(lu, jnp.asarray(b), False), ref, rtol=1e-9,
                               atol=1e-11 * scale)
    np.testing.assert_allclose(band_solve_native(lu, jnp.asarray(b), True),
                               np.linalg.solve(a.T, b), rtol=1e-9, atol=1e-11 * scale)


@pytest.mark.slow
@needs_native
def test_native_banded_factors_equal_the_scan_bitwise():
    from simlib._linalg._kernels import band_lu_native, band_solve_native

    rng = np.random.default_rng(4)
    for n, lower, upper in [(1, 0, 0), (33, 4, 1), (8, 7, 7)]:
        band = mask_band(jnp.asarray(rng.normal(size=(n, lower + upper + 1))), lower)
        a = jax.jit(band_lu_scan, static_argnums=(1, 2))(band, lower, upper)
        b = band_lu_native(band, lower, upper)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        rhs = jnp.asarray(rng.normal(size=n))
        for t in (False, True):
            ref = jax.jit(band_lu_solve_scan, static_argnums=2)(a, rhs, t)
            np.testing.assert_allclose(band_solve_native(b, rhs, t), ref, rtol=0,
                                       atol=1e-13 * float(jnp.abs(ref).max()))


def _ffi_targets(fun, *args):
    text = str(jax.make_jaxpr(fun)(*args))
    return text


@needs_native
def test_the_native_kernels_are_what_runs():
    """Mechanism: the jaxpr of a native solve holds the FFI calls; the host kernel's holds a
    pure_callback and no FFI call; the scan kernel neither."""
    for ls, present, absent in [
            (Banded(2, 2, "native"), ["simlib_band_lu_f64", "simlib_band_solve_f64"], []),
            (Banded(2, 2, "scan"), ["scan"], ["ffi_call", "pure_callback"]),
            (Sparse(PATTERN, kernel="native"), ["simlib_sparse_lu_f64"], ["pure_callback"]),
            (Sparse(PATTERN, kernel="host"), ["pure_callback"], ["ffi_call"])]:
        def run(v, ls=ls):
            fac = ls.factor(ls.linearise(g, 0.0, v), jnp.asarray(0.05))
            return ls.solve(fac, B)

        text = _ffi_targets(run, V)
        for s in present:
            assert s in text, (ls, s)
        for s in absent:
            assert s not in text, (ls, s)


@needs_native
def test_sparse_static_pivot_failure_is_reported():
    """A zero pivot (no pivoting in the native sparse LU) gives ok = False, not a number."""
    pattern = np.ones((2, 2), bool)
    ls = Sparse(pattern, kernel="native", ordering="natural")
    jac = jnp.array([1.0, 1.0, 1.0, 0.0])  # J = [[1, 1], [1, 0]]; A = I - J = [[0,-1],[-1,1]]
    fac = ls.factor(jac, jnp.asarray(1.0))
    assert not bool(fac.ok)


def test_linear_solver_settings_are_static_and_compare_by_value():
    assert Banded(1, 2) == Banded(1, 2) and hash(Banded(1, 2)) == hash(Banded(1, 2))
    assert Banded(1, 2) != Banded(2, 1)
    assert Sparse(PATTERN) == Sparse(sp.csr_matrix(PATTERN))
    assert Sparse(PATTERN) != Sparse(PATTERN, ordering="rcm")
    assert jax.tree_util.tree_leaves(Sparse(PATTERN)) == []
    assert Dense() != Dense("rev")


def test_bad_settings_fail_loudly():
    with pytest.raises(ValueError, match="lower"):
        Banded(-1, 2)
    with pytest.raises(ValueError, match="jac_sparsity"):
        Sparse(np.ones((3, 4), bool))
    with pytest.raises(ValueError, match="jac_sparsity is for"):
        Sparse(np.ones((3, 3), bool)).bind(g, 0.0, V)
    with pytest.raises(ValueError, match="bind"):
        Sparse().linearise(g, 0.0, V)
    with pytest.raises(ValueError, match="jac_sparsity"):
        Krylov("ilu0")
    with pytest.raises(ValueError, match="preconditioner"):
        Krylov("multigrid", PATTERN)


def test_sparse_bind_detects_the_pattern_from_the_field():
    ls = Sparse(kernel="host").bind(g, 0.0, V)
    dense = ls.pattern.matrix().toarray() != 0
    np.testing.assert_array_equal(dense, (J_TRUE != 0) | np.eye(2 * N, dtype=bool))
    jac = ls.linearise(g, 0.0, V)
    np.testing.assert_array_equal(ls.pattern.matrix(np.asarray(jac)).toarray(), J_TRUE)


@pytest.mark.slow
def test_gmres_matches_jax_scipy_gmres_and_numpy():
    a = np.eye(2 * N) - 0.1 * J_TRUE
    x, info = jax.jit(lambda b: gmres(lambda z: jnp.asarray(a) @ z, b, rtol=1e-12,
                                      restart=10, max_restarts=40))(B)
    ref = np.linalg.solve(a, B)
    assert bool(info.converged) and float(info.residual) <= 1e-12
    np.testing.assert_allclose(x, ref, atol=1e-10)
    xj, _ = jax.scipy.sparse.linalg.gmres(lambda z: jnp.asarray(a) @ z, B, tol=1e-12,
                                          restart=10, maxiter=40)
    np.testing.assert_allclose(x, xj, atol=1e-9)


@pytest.mark.parametrize("restart, cycles", [(10, 1), (2, 1), (2, 2)])
def test_gmres_takes_one_product_with_a_per_iteration_and_cycle(restart, cycles):
    """The mechanism: A x is evaluated once per Arnoldi iteration and once at each cycle's
    end (the residual that tests convergence, carried into the next cycle), and not for
    the start x0 = 0. ``A`` has three distinct eigenvalues: GMRES(10) converges in three
    iterations (numpy's solve is the reference); GMRES(2) does not, and runs its
    ``cycles`` cycles of two."""
    a = np.diag(np.repeat([1.0, 2.0, 5.0], 4))
    b = np.random.default_rng(3).normal(size=12)
    calls = []

    def matvec(z):
        jax.debug.callback(lambda: calls.append(1))
        return jnp.asarray(a) @ z

    x, info = jax.jit(lambda b: gmres(matvec, b, rtol=1e-12, restart=restart,
                                      max_restarts=cycles))(jnp.asarray(b))
    jax.block_until_ready(x)
    if restart == 10:
        np.testing.assert_allclose(x, np.linalg.solve(a, b), atol=1e-12)
        assert int(info.iterations) == 3 and bool(info.converged)
    else:
        assert int(info.iterations) == 2 * cycles and not bool(info.converged)
    assert len(calls) == int(info.iterations) + cycles


def test_jvp_map_is_the_jacobian():
    e = jnp.eye(2 * N)
    np.testing.assert_allclose(jax.vmap(jvp_map(g, 0.0, V), out_axes=1)(e), J_TRUE, atol=1e-13)
