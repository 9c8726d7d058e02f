"""simlib.pde.diffusion_preconditioner and NewtonKrylov with a user's preconditioner.

References outside simlib: the dense operator ``I - c D L`` with ``L`` the second
difference built with scipy.sparse (circulant on a periodic axis, the cell-centred mirror
on a Neumann axis), solved by numpy; a 2-D Brusselator solved by scipy's ``BDF`` with
``jac_sparsity`` at rtol 1e-10; GMRES iteration counts (the mechanism: the preconditioner
is applied, and it is the exact inverse of the diffusion part).
"""

import jax
import jax.extend

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.integrate  # noqa: E402
import scipy.sparse as sps  # noqa: E402

import simlib as sl  # noqa: E402
from simlib import pde  # noqa: E402
from validation import pde_reference as ref  # noqa: E402


def _second_difference(n, h, bc):
    d = sps.diags([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)], [-1, 0, 1]).tolil()
    if bc == "periodic":
        d[0, n - 1] = d[n - 1, 0] = 1
    else:                                  # Neumann, the ghost mirrors the edge point
        d[0, 0] = d[n - 1, n - 1] = -1
    return d.tocsr() / h**2


def _laplacian_matrix(shape, spacing, bcs):
    out = 0
    for axis, (n, h, bc) in enumerate(zip(shape, spacing, bcs, strict=True)):
        factors = [sps.identity(m) for m in shape]
        factors[axis] = _second_difference(n, h, bc)
        k = factors[0]
        for f in factors[1:]:
            k = sps.kron(k, f)
        out = out + k
    return out.toarray()


@pytest.mark.parametrize("shape, spacing, bcs", [
    ((6, 5), (0.1, 0.2), ("periodic", "periodic")),            # rfft on every axis
    ((7,), (0.1,), ("neumann",)),                               # DCT-II
    ((4, 6, 5), (0.3, 0.1, 0.2), ("periodic", "neumann", "periodic")),  # both, mixed
])
@pytest.mark.parametrize("layout", ["interleaved",
                                    pytest.param("blocked", marks=pytest.mark.slow)])
def test_it_inverts_the_diffusion_operator(shape, spacing, bcs, layout):
    grid = pde.Grid(shape, spacing, bc=list(bcs))
    lap = _laplacian_matrix(shape, spacing, bcs)
    u = np.random.default_rng(0).normal(size=shape)
    np.testing.assert_allclose(np.asarray(pde.laplacian(jnp.asarray(u), grid)).ravel(),
                               lap @ u.ravel(), atol=1e-10)   # the same stencil as simlib's
    d, c = np.array([0.5, 2.0]), 0.03
    a = np.eye(2 * lap.shape[0]) - c * (np.kron(lap, np.diag(d)) if layout == "interleaved"
                                        else np.kron(np.diag(d), lap))
    x = np.random.default_rng(1).normal(size=a.shape[0])
    precondition = jax.jit(pde.diffusion_preconditioner(grid, d, species=2, layout=layout))
    z = np.asarray(precondition(c, jnp.asarray(x)))
    np.testing.assert_allclose(a @ z, x, atol=1e-12)
    z32 = precondition(np.float32(c), jnp.asarray(x, jnp.float32))
    assert z32.dtype == jnp.float32


def _fft_types(fn, *args):
    def eqns(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from eqns(sub)
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    return [jax.lax.FftType(e.params["fft_type"]) for e in eqns(jaxpr)
            if e.primitive.name == "fft"]


@pytest.mark.parametrize("shape, spacing, d", [
    ((6, 5), (0.1, 0.2), [0.7, 0.7]),                       # one pair: u + i v
    ((4, 3, 5), (0.3, 0.1, 0.2), [0.5, 0.5, 2.0, 2.0]),     # two pairs, 3-D
])
@pytest.mark.parametrize("layout", ["interleaved", "blocked"])
def test_paired_species_take_one_complex_fft_and_invert_the_operator(shape, spacing, d,
                                                                     layout):
    """Species in pairs of equal diffusivity on a periodic grid: one complex FFT per pair
    (the mechanism: complex FFTs in the jaxpr, no real one), the same inverse (numpy)."""
    species = len(d)
    grid = pde.Grid(shape, spacing, bc="periodic")
    lap = _laplacian_matrix(shape, spacing, ["periodic"] * len(shape))
    c = 0.03
    a = np.eye(species * lap.shape[0]) - c * (
        np.kron(lap, np.diag(d)) if layout == "interleaved" else np.kron(np.diag(d), lap))
    x = np.random.default_rng(2).normal(size=a.shape[0])
    precondition = pde.diffusion_preconditioner(grid, d, species=species, layout=layout)
    z = np.asarray(jax.jit(precondition)(c, jnp.asarray(x)))
    np.testing.assert_allclose(a @ z, x, atol=1e-12)
    fft_types = _fft_types(precondition, c, x)
    assert set(fft_types) == {jax.lax.FftType.FFT, jax.lax.FftType.IFFT}, fft_types
    z32 = precondition(np.float32(c), jnp.asarray(x, jnp.float32))
    assert z32.dtype == jnp.float32
    np.testing.assert_allclose(a @ np.asarray(z32, np.float64), x, atol=1e-4)
    # unequal pairs take the real transform
    unequal = pde.diffusion_preconditioner(grid, np.arange(1.0, species + 1), species=species,
                                           layout=layout)
    assert jax.lax.FftType.RFFT in _fft_types(unequal, c, x)


def test_bad_arguments_fail_loudly():
    grid = pde.Grid((8, 8), 0.1, bc="periodic")
    with pytest.raises(ValueError, match="grid.bc of axis 1"):
        pde.diffusion_preconditioner(pde.Grid((8, 8), 0.1, bc=["periodic", "dirichlet"]), 1.0)
    with pytest.raises(ValueError, match="grid.bc of axis 0"):
        pde.diffusion_preconditioner(pde.Grid((8,), 0.1, bc=[("neumann", "dirichlet")]), 1.0)
    with pytest.raises(ValueError, match="diffusivity"):
        pde.diffusion_preconditioner(grid, [1.0, 2.0, 3.0], species=2)
    with pytest.raises(ValueError, match="diffusivity"):
        pde.diffusion_preconditioner(grid, np.nan)
    with pytest.raises(ValueError, match="species"):
        pde.diffusion_preconditioner(grid, 1.0, species=0)
    with pytest.raises(ValueError, match="layout"):
        pde.diffusion_preconditioner(grid, 1.0, layout="planar")
    with pytest.raises(TypeError, match="grid"):
        pde.diffusion_preconditioner((8, 8), 1.0)
    with pytest.raises(ValueError, match="callable"):
        sl.NewtonKrylov("fft")


N = 16
PROB = ref.problem("bruss2d", N).with_t1(1.0)      # before the forcing switches on at 1.1
GRID = pde.Grid((N, N), spacing=1.0 / (N - 1), bc="periodic")
ALPHA = PROB.args[2]


def test_gmres_needs_few_iterations_with_it():
    """The mechanism: on the Newton matrix ``I - c J`` of the Brusselator (8 x 8), GMRES
    with the exact inverse of the diffusion part converges in a few iterations; without,
    in many more. The answers agree with numpy's dense solve either way."""
    prob = ref.problem("bruss2d", 8)
    grid = pde.Grid((8, 8), spacing=1.0 / 7, bc="periodic")
    args = tuple(jnp.asarray(a) for a in prob.args)
    f = lambda t, v: prob.f(t, v, args)  # noqa: E731
    y = jnp.asarray(prob.y0)
    b = jnp.asarray(np.random.default_rng(2).normal(size=y.size))
    c = 0.05
    jac = np.asarray(jax.jit(jax.jacfwd(lambda v: f(0.0, v)))(y))
    exact = np.linalg.solve(np.eye(y.size) - c * jac, np.asarray(b))
    its = {}
    for name, precondition in [("fft", pde.diffusion_preconditioner(grid, prob.args[2],
                                                                     species=2)),
                               ("none", None)]:
        ls = sl.NewtonKrylov(precondition, rtol=1e-10, restart=40, max_restarts=4)

        @jax.jit
        def solve(y, b, ls=ls):
            fac = ls.factor(ls.linearise(f, 0.0, y), jnp.asarray(c))
            return ls.solve_with_info(fac, b, field=f)

        x, info = solve(y, b)
        np.testing.assert_allclose(x, exact, atol=1e-8)
        its[name] = int(info.iterations)
    assert its["fft"] <= 8 and its["none"] >= 4 * its["fft"], its


@pytest.fixture(scope="module")
def scipy_reference():
    sol = scipy.integrate.solve_ivp(lambda t, y: PROB.f_np(t, y, PROB.args), (0.0, PROB.t1),
                                    PROB.y0, method="BDF", rtol=1e-10, atol=1e-10,
                                    jac_sparsity=PROB.sparsity)
    assert sol.success
    return sol.y[:, -1]


@pytest.mark.slow  # two BDF compilations and scipy at rtol 1e-10: about 15 s
def test_bdf_with_it_matches_scipy(scipy_reference):
    """BDF with ``NewtonKrylov(diffusion_preconditioner(...))``, as a user writes it, within
    10 tolerance units of scipy's BDF at rtol 1e-10, in about the steps of the sparse LU."""
    args = tuple(jnp.asarray(a) for a in PROB.args)
    ls = sl.NewtonKrylov(pde.diffusion_preconditioner(GRID, ALPHA, species=2), rtol=1e-4,
                         restart=5)

    @jax.jit
    def run(y0, args):
        return sl.solve(PROB.f, y0, 0.0, PROB.t1, solver=sl.BDF(), rtol=1e-6, atol=1e-6,
                        args=args, linear_solver=ls)

    sol = run(jnp.asarray(PROB.y0), args)
    assert int(sol.result) == 0
    y = np.asarray(sol.ys[-1])
    err = np.max(np.abs(y - scipy_reference) / (1e-6 + 1e-6 * np.abs(scipy_reference)))
    assert err <= 10, err
    lu = jax.jit(lambda y0, args: sl.solve(
        PROB.f, y0, 0.0, PROB.t1, solver=sl.BDF(), rtol=1e-6, atol=1e-6, args=args,
        jac_sparsity=PROB.sparsity, linear_solver="sparse"))(jnp.asarray(PROB.y0), args)
    steps, steps_lu = int(sol.stats["num_accepted"]), int(lu.stats["num_accepted"])
    assert steps <= 1.2 * steps_lu, (steps, steps_lu)


def test_tangent_solves_leave_a_users_preconditioner_out():
    """A converged stage's linearisation ``L`` (the implicit-function-theorem solve) is
    solved as ``0 - (-1) L``, which no user's ``(c, x) -> (M - c J)^-1 x`` approximates:
    ``diffusion_preconditioner`` would give ``(I + D lap)^-1``, near singular. Krylov
    leaves the callable out there; a callable poisoned for ``c < 0`` shows it is not
    called, and the answer is numpy's. (Before, the solve came out NaN.)"""
    n = 12
    rng = np.random.default_rng(3)
    lin = np.eye(n) + 0.3 * rng.normal(size=(n, n)) / np.sqrt(n)
    b = rng.normal(size=n)

    def poisoned(c, x):
        return jnp.where(c < 0, jnp.nan, 1.0) * x

    ls = sl.NewtonKrylov(poisoned, rtol=1e-12, restart=n + 1)
    x = jax.jit(lambda b: ls.solve_linear_map(lambda v: jnp.asarray(lin) @ v, b))(
        jnp.asarray(b))
    np.testing.assert_allclose(x, np.linalg.solve(lin, b), atol=1e-10)


def test_tangent_solves_give_a_users_preconditioner_the_stages_c():
    """Given the stage's ``c`` (``L = I - c J``), the tangent solve hands it to the user's
    preconditioner: one poisoned for any other ``c`` still gives numpy's answer. A tangent
    solve that does not converge returns nan (before, its last iterate, silently)."""
    n, c = 12, 0.07
    rng = np.random.default_rng(4)
    jac = -np.diag(np.linspace(1.0, 400.0, n)) + 0.3 * rng.normal(size=(n, n))
    lin = np.eye(n) - c * jac
    b = rng.normal(size=n)

    def exact_for_c(c_, x):  # (I - c J)^-1 for the stage's c only
        inv = jnp.asarray(np.linalg.inv(lin))
        return jnp.where(jnp.abs(c_ - c) < 1e-12, 1.0, jnp.nan) * (inv @ x)

    ls = sl.NewtonKrylov(exact_for_c, rtol=1e-12, restart=2, max_restarts=1)
    x = jax.jit(lambda b: ls.solve_linear_map(lambda v: jnp.asarray(lin) @ v, b, c=c))(
        jnp.asarray(b))
    np.testing.assert_allclose(x, np.linalg.solve(lin, b), atol=1e-10)
    # without c the map is solved unpreconditioned: two iterations cannot solve it
    x = jax.jit(lambda b: ls.solve_linear_map(lambda v: jnp.asarray(lin) @ v, b))(
        jnp.asarray(b))
    assert np.all(np.isnan(np.asarray(x)))


@pytest.mark.slow  # three BDF gradient compilations: about 40 s
def test_gradient_through_bdf_with_it_matches_finite_differences():
    """The gradient of ``mean(y(t1)^2)`` w.r.t. ``(A, B, alpha)`` through BDF with
    ``NewtonKrylov(diffusion_preconditioner(...))``, against central finite differences of
    the sparse-LU solve at rtol 1e-10, on a span with the forcing and large steps. Before
    the tangent solves took the preconditioner, unpreconditioned GMRES did not converge
    within its 10 iterations and the gradient was wrong with a success code (on the 32 x
    32 grid over [0, 11.5], with the default 50 iterations: -5.5e18 for about -8)."""
    prob = ref.problem("bruss2d", N).with_t1(6.0)
    y0 = jnp.asarray(prob.y0)

    def loss(p, ls, rtol, **options):
        sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=sl.BDF(), rtol=rtol, atol=rtol,
                       args=(p[0], p[1], p[2]), linear_solver=ls, **options)
        return jnp.mean(sol.ys[-1] ** 2)

    p0 = jnp.asarray(prob.args, jnp.float64)
    ls = sl.NewtonKrylov(pde.diffusion_preconditioner(GRID, ALPHA, species=2), rtol=1e-10,
                         restart=5, max_restarts=2)
    g = np.asarray(jax.jit(jax.grad(lambda p: loss(p, ls, 1e-9)))(p0))
    f = jax.jit(lambda p: loss(p, "sparse", 1e-10, jac_sparsity=prob.sparsity))
    h = 1e-5 * np.asarray(p0)
    fd = np.array([(f(p0.at[i].add(h[i])) - f(p0.at[i].add(-h[i]))) / (2 * h[i])
                   for i in range(3)])
    np.testing.assert_allclose(g, fd, rtol=2e-3)
