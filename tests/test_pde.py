"""simlib.pde: finite-difference operators and their sparsity, against closed forms, numpy
and dense Jacobians.

References outside simlib: Taylor polynomials the stencils must reproduce exactly; the
closed-form eigenvalues of the second difference (LeVeque 2007, (2.23)) on the eigenvectors
each boundary treatment must keep (sin for Dirichlet at the vertices, cos for Neumann at
the cell centres, Fourier modes for periodic); measured convergence orders on smooth
functions and on the solution of a Neumann problem (solved with numpy); a numpy loop of
the stencil; the discrete divergence theorem; and the nonzeros of a dense ``jax.jacfwd``
for every pattern.
"""

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import scipy.sparse  # noqa: E402

from simlib import pde, systems  # noqa: E402

SIDES = ["periodic", "dirichlet", "neumann", ("dirichlet", "neumann"),
         ("neumann", "dirichlet")]
RNG = np.random.default_rng(0)

# Jitted with the grid static: eagerly, every primitive compiles anew for each grid shape.
lap = jax.jit(pde.laplacian, static_argnums=1)
grad = jax.jit(pde.gradient, static_argnums=1)
div = jax.jit(pde.divergence, static_argnums=1)


def order(hs, errors) -> float:
    """Least-squares slope of log(error) against log(h)."""
    return float(np.polyfit(np.log(hs), np.log(errors), 1)[0])


def dense_jacobian(op, grid):
    """``jax.jacfwd`` of ``op`` on the flattened field at a random point (rows: outputs,
    all components), jitted."""
    u = jnp.asarray(RNG.random(grid.size))
    jac = jax.jit(jax.jacfwd(lambda v: op(v.reshape(grid.shape)).reshape(-1)))(u)
    return np.asarray(jac)


def spatial_nonzeros(jac, size, components):
    """Collapse the output components of a ``(size * components, size)`` Jacobian."""
    return (np.abs(jac.reshape(size, components, size)) > 0).any(axis=1)


# --------------------------------------------------------------------------------------
# the grid


def test_grid_placement_follows_the_boundary_kind():
    cases = {"periodic": (0.25, [0.0, 0.25, 0.5, 0.75]),
             "dirichlet": (0.2, [0.2, 0.4, 0.6, 0.8]),
             "neumann": (0.25, [0.125, 0.375, 0.625, 0.875]),
             ("dirichlet", "neumann"): (1 / 4.5, [1 / 4.5, 2 / 4.5, 3 / 4.5, 4 / 4.5])}
    for bc, (h, xs) in cases.items():
        grid = pde.Grid.uniform((4,), lengths=1.0, bc=[bc])
        np.testing.assert_allclose(grid.spacing[0], h, rtol=1e-15)
        np.testing.assert_allclose(grid.coordinates()[0], xs, rtol=1e-14)
        np.testing.assert_allclose(grid.lengths[0], 1.0, rtol=1e-15)
    grid = pde.Grid((3, 5), spacing=(0.5, 0.1), bc=["periodic", "neumann"])
    xs, ys = grid.mesh(origin=(1.0, -1.0))
    assert xs.shape == ys.shape == (3, 5)
    np.testing.assert_allclose(xs[:, 0], [1.0, 1.5, 2.0])
    np.testing.assert_allclose(ys[0], -1.0 + 0.1 * (np.arange(5) + 0.5))
    assert grid.size == 15 and grid.ndim == 2
    assert grid.bc == (("periodic", "periodic"), ("neumann", "neumann"))


def test_grid_is_static_structure():
    grid = pde.Grid((8, 8), 0.1, "periodic")
    assert grid == pde.Grid((8, 8), (0.1, 0.1), ["periodic", ("periodic", "periodic")])
    assert hash(grid) == hash(pde.Grid((8, 8), 0.1))
    assert jax.tree_util.tree_leaves(grid) == []

    @jax.jit
    def f(u, grid):  # the grid rides in the arguments without being traced
        return pde.laplacian(u, grid)

    u = jnp.asarray(RNG.random((8, 8)))
    np.testing.assert_allclose(f(u, grid), pde.laplacian(u, grid), rtol=1e-14)


@pytest.mark.parametrize("kwargs, match", [
    (dict(shape=(), spacing=0.1), "1 to 3 axes"),
    (dict(shape=(4, 4, 4, 4), spacing=0.1), "1 to 3 axes"),
    (dict(shape=(1,), spacing=0.1), "integers >= 2"),
    (dict(shape=(4.0,), spacing=0.1), "integers >= 2"),
    (dict(shape=(4,), spacing=0.0), "positive and finite"),
    (dict(shape=(4,), spacing=float("nan")), "positive and finite"),
    (dict(shape=(4, 4), spacing=(0.1, 0.1, 0.1)), "spacing has 3 items"),
    (dict(shape=(4,), spacing=0.1, bc="robin"), "unknown boundary 'robin'"),
    (dict(shape=(4,), spacing=0.1, bc=("dirichlet", "neumann")),
     r"bc=\[\('dirichlet', 'neumann'\)\]"),
    (dict(shape=(4,), spacing=0.1, bc=[("periodic", "neumann")]), "periodic on one side"),
])
def test_bad_grids_fail_loudly(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pde.Grid(**kwargs)


def test_bad_fields_and_values_fail_loudly():
    grid = pde.Grid((6, 5), 0.1, ["periodic", "dirichlet"])
    u = jnp.zeros((6, 5))
    with pytest.raises(ValueError, match=r"u has shape \(5, 6\).*grid's \(6, 5\)"):
        pde.laplacian(jnp.zeros((5, 6)), grid)
    with pytest.raises(TypeError, match="floating-point"):
        pde.laplacian(jnp.zeros((6, 5), int), grid)
    with pytest.raises(TypeError, match="must be a simlib.pde.Grid"):
        pde.laplacian(u, (6, 5))
    with pytest.raises(ValueError, match="axis 0 is periodic"):
        pde.laplacian(u, grid, lower=(1.0, None))
    with pytest.raises(ValueError, match="lower has 3 items"):
        pde.laplacian(u, grid, lower=(None, 1.0, 2.0))
    with pytest.raises(ValueError, match=r"upper\[1\] has shape \(5,\).*face \(6,\)"):
        pde.laplacian(u, grid, upper=jnp.ones(5))
    with pytest.raises(ValueError, match="last axis must hold the 2 components"):
        pde.divergence(jnp.zeros((6, 5, 3)), grid)
    with pytest.raises(TypeError, match="concrete number"):
        jax.jit(lambda h: pde.Grid((4,), h))(0.1)


# --------------------------------------------------------------------------------------
# exactness, eigenvectors, convergence


@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_laplacian_is_exact_on_cubics_with_dirichlet_values(ndim):
    """The 3/5/7-point stencil reproduces u'' of a cubic exactly (its truncation error is
    h^2 u''''/12), boundary rows included when the boundary values are the cubic's."""
    shape = (7, 6, 5)[:ndim]
    grid = pde.Grid.uniform(shape, lengths=(1.0, 2.0, 0.5)[:ndim], bc="dirichlet")
    coef = RNG.normal(size=(ndim, 4))

    def cubic(xs):
        return sum(c[0] + c[1] * x + c[2] * x**2 + c[3] * x**3
                   for c, x in zip(coef, xs, strict=True))

    def second(xs):
        return sum(2 * c[2] + 6 * c[3] * x for c, x in zip(coef, xs, strict=True))

    mesh = grid.mesh()
    lower, upper = [], []
    for k, length in enumerate(grid.lengths):
        face = [np.take(m, 0, axis=k) for m in mesh]  # the face's other coordinates
        at = [np.zeros_like(face[0]) if j == k else face[j] for j in range(ndim)]
        lower.append(cubic(at))
        at[k] = np.full_like(face[0], length)
        upper.append(cubic(at))
    got = lap(jnp.asarray(cubic(mesh)), grid, lower=tuple(lower), upper=tuple(upper))
    np.testing.assert_allclose(got, second(mesh), atol=1e-9 * np.abs(coef).max() / min(
        grid.spacing) ** 2 * 1e-3)


@pytest.mark.parametrize("bc", SIDES[1:])
def test_quadratics_are_exact_at_every_non_periodic_boundary(bc):
    """u = a + b x + c x^2 with the matching boundary data: Dirichlet values or Neumann
    slopes b + 2 c x at the faces. The Neumann ghost u_0 - h g is exact for quadratics."""
    grid = pde.Grid.uniform((9,), lengths=1.3, bc=[bc])
    a, b, c = 0.7, -1.9, 2.3
    (x,) = grid.coordinates()
    lo_kind, hi_kind = grid.bc[0]
    length = grid.lengths[0]

    def data(kind, at):
        return a + b * at + c * at**2 if kind == "dirichlet" else b + 2 * c * at

    u = jnp.asarray(a + b * x + c * x**2)
    lower, upper = data(lo_kind, 0.0), data(hi_kind, length)
    np.testing.assert_allclose(lap(u, grid, lower=lower, upper=upper), 2 * c,
                               rtol=1e-10)
    np.testing.assert_allclose(grad(u, grid, lower=lower, upper=upper)[:, 0],
                               b + 2 * c * x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("bc", ["periodic", "dirichlet", "neumann"])
@pytest.mark.parametrize("ndim", [1, 2])
def test_boundary_treatment_keeps_the_closed_form_eigenvectors(bc, ndim):
    """The second difference has eigenvalues -(4/h^2) sin^2(theta/2) on the modes its
    boundary treatment keeps (LeVeque 2007, (2.23)): sin(k pi x) at the vertices of a
    Dirichlet grid (theta = k pi h), cos(k pi x) at the cell centres of a Neumann grid
    (theta = k pi h), exp(2 pi i k x / L) on a periodic one (theta = 2 pi k h / L). A ghost
    point misplaced by half a spacing breaks this at the boundary rows."""
    grid = pde.Grid.uniform((12, 9)[:ndim], lengths=(1.0, 1.7)[:ndim], bc=bc)
    ks = (3, 2)[:ndim]
    modes, eig = [], 0.0
    for x, k, h, length in zip(grid.mesh(), ks, grid.spacing, grid.lengths,
                                   strict=True):
        theta = {"dirichlet": k * np.pi * x / length, "neumann": k * np.pi * x / length,
                 "periodic": 2 * np.pi * k * x / length}[bc]
        modes.append(np.sin(theta) if bc == "dirichlet" else np.cos(theta))
        step = (k * np.pi if bc != "periodic" else 2 * np.pi * k) * h / length
        eig += -4 / h**2 * np.sin(step / 2) ** 2
    u = np.prod(modes, axis=0)
    np.testing.assert_allclose(lap(jnp.asarray(u), grid), eig * u,
                               atol=1e-11 * abs(eig))


@pytest.mark.slow  # 11 grids, one compile each; validation --quick measures the heat solve's
def test_laplacian_converges_at_second_order_on_smooth_functions():
    """Periodic (2-D) and Dirichlet (3-D) everywhere; Neumann at interior points (second
    order) and at the boundary rows (first order: the ghost point's error h^3 u'''/24 over
    h^2), as LeVeque 2007 section 2.12 says."""
    hs, e_per, e_dir, e_int, e_bnd = [], [], [], [], []
    for n in (16, 32, 64, 128):
        g = pde.Grid.uniform((n, n), lengths=1.0, bc="periodic")
        x, y = g.mesh()
        u = np.exp(np.sin(2 * np.pi * x) * np.cos(2 * np.pi * y))
        s, c = np.sin(2 * np.pi * x), np.cos(2 * np.pi * y)
        # d2/dx2 exp(s c) = (2 pi)^2 u (c^2 cos^2(2 pi x) - s c), and likewise in y
        exact = (2 * np.pi) ** 2 * u * (c**2 * np.cos(2 * np.pi * x) ** 2 - s * c
                                        + s**2 * np.sin(2 * np.pi * y) ** 2 - s * c)
        e_per.append(np.abs(lap(jnp.asarray(u), g) - exact).max())
        hs.append(g.spacing[0])
        g1 = pde.Grid.uniform((n,), lengths=2.0, bc="neumann")
        (x1,) = g1.coordinates()
        # u = cos(x) + x^3/6: u'(0) = 0, u'(2) = -sin 2 + 2; u'' = -cos x + x
        v = np.cos(x1) + x1**3 / 6
        got = np.asarray(lap(jnp.asarray(v), g1, lower=0.0, upper=-np.sin(2.0) + 2.0))
        err = np.abs(got - (-np.cos(x1) + x1))
        e_int.append(err[1:-1].max())
        e_bnd.append(max(err[0], err[-1]))
    h3 = []
    for n in (10, 20, 40):
        g3 = pde.Grid.uniform((n, n, n), lengths=1.0, bc="dirichlet")
        h3.append(g3.spacing[0])
        x, y, z = g3.mesh()
        w = np.sin(x + 2 * y) * np.exp(z)  # lap = (1 - 5) w
        lower = tuple(np.sin(2 * b) * np.exp(c) for b, c in ((y[0], z[0]),))  # x = 0 face
        lower += (np.sin(x[:, 0]) * np.exp(z[:, 0]), np.sin(x[:, :, 0] + 2 * y[:, :, 0]))
        upper = (np.sin(1 + 2 * y[0]) * np.exp(z[0]), np.sin(x[:, 0] + 2) * np.exp(z[:, 0]),
                 np.sin(x[:, :, 0] + 2 * y[:, :, 0]) * np.e)
        got = lap(jnp.asarray(w), g3, lower=lower, upper=upper)
        e_dir.append(np.abs(got + 4 * w).max())
    assert abs(order(hs, e_per) - 2) < 0.1, e_per
    assert abs(order(h3, e_dir) - 2) < 0.1, e_dir
    assert abs(order(hs, e_int) - 2) < 0.1, e_int
    assert abs(order(hs, e_bnd) - 1) < 0.1, e_bnd


@pytest.mark.slow
def test_neumann_problem_converges_at_second_order():
    """The first-order boundary rows still give a second-order solution: solve
    u - u'' = f on [0, 1] with u'(0) = a, u'(1) = b for u = cos(pi x) + x^2 (numpy solve
    of the operator's own Jacobian plus its boundary term)."""
    hs, errors = [], []
    for n in (20, 40, 80):
        grid = pde.Grid.uniform((n,), lengths=1.0, bc="neumann")
        (x,) = grid.coordinates()
        exact = np.cos(np.pi * x) + x**2
        f = exact - (-np.pi**2 * np.cos(np.pi * x) + 2)
        a, b = 0.0, 2.0  # u'(0) = 0, u'(1) = -pi sin(pi) + 2
        matrix = lap(jnp.eye(n), grid)  # trailing axis j: the Laplacian of e_j, column j
        boundary = lap(jnp.zeros(n), grid, lower=a, upper=b)
        u = np.linalg.solve(np.eye(n) - np.asarray(matrix), f + np.asarray(boundary))
        errors.append(np.abs(u - exact).max())
        hs.append(grid.spacing[0])
    assert abs(order(hs, errors) - 2) < 0.1, errors


@pytest.mark.slow
def test_gradient_and_divergence_converge_at_second_order():
    hs, e_grad, e_div = [], [], []
    for n in (16, 32, 64, 128):
        g = pde.Grid.uniform((n, n), lengths=(1.0, 2.0), bc="periodic")
        x, y = g.mesh()
        u = np.sin(2 * np.pi * x) * np.cos(np.pi * y)
        got = grad(jnp.asarray(u), g)
        exact = np.stack([2 * np.pi * np.cos(2 * np.pi * x) * np.cos(np.pi * y),
                          -np.pi * np.sin(2 * np.pi * x) * np.sin(np.pi * y)], axis=-1)
        e_grad.append(np.abs(got - exact).max())
        flux = np.stack([np.sin(2 * np.pi * x) ** 2, np.cos(np.pi * y) * x], axis=-1)
        got = div(jnp.asarray(flux), g)
        exact_div = (4 * np.pi * np.sin(2 * np.pi * x) * np.cos(2 * np.pi * x)
                     - np.pi * np.sin(np.pi * y) * x)
        e_div.append(np.abs(got - exact_div).max())
        hs.append(g.spacing[0])
    assert abs(order(hs, e_grad) - 2) < 0.1, e_grad
    assert abs(order(hs, e_div) - 2) < 0.1, e_div


# --------------------------------------------------------------------------------------
# structure: a numpy loop, conservation, symmetry, boundary data


def numpy_laplacian_loop(u, h, bc, lower, upper):
    """The 1-D stencil written point by point with explicit ghost values."""
    n = u.size
    out = np.empty(n)
    lo, hi = bc
    for i in range(n):
        if i > 0:
            left = u[i - 1]
        elif lo == "periodic":
            left = u[n - 1]
        elif lo == "dirichlet":
            left = lower
        else:
            left = u[0] - h * lower
        if i < n - 1:
            right = u[i + 1]
        elif hi == "periodic":
            right = u[0]
        elif hi == "dirichlet":
            right = upper
        else:
            right = u[n - 1] + h * upper
        out[i] = (left - 2 * u[i] + right) / h**2
    return out


@pytest.mark.parametrize("bc", SIDES)
def test_laplacian_equals_a_numpy_loop(bc):
    grid = pde.Grid((11,), 0.3, [bc])
    u = RNG.normal(size=11)
    lower, upper = (None, None) if bc == "periodic" else (0.4, -1.3)
    got = lap(jnp.asarray(u), grid, lower=lower, upper=upper)
    np.testing.assert_allclose(got, numpy_laplacian_loop(u, 0.3, grid.bc[0], lower, upper),
                               rtol=1e-13, atol=1e-12)


@pytest.mark.parametrize("bcs", [("periodic", "periodic"), ("neumann", "neumann"),
                                 pytest.param(("periodic", "neumann"), marks=pytest.mark.slow),
                                 ("neumann", "periodic", "neumann")])
def test_periodic_and_neumann_laplacian_conserve_mass_and_are_symmetric(bcs):
    shape = (6, 5, 4)[:len(bcs)]
    grid = pde.Grid(shape, (0.3, 0.2, 0.7)[:len(bcs)], list(bcs))
    u = jnp.asarray(RNG.normal(size=shape))
    assert abs(float(jnp.sum(lap(u, grid)))) < 1e-10 * float(jnp.abs(u).sum()) / 0.04
    jac = dense_jacobian(lambda v: lap(v, grid), grid)
    np.testing.assert_allclose(jac, jac.T, atol=1e-12)
    eig = np.linalg.eigvalsh(jac)
    assert eig.max() < 1e-9 * abs(eig.min()) and abs(eig.max()) < 1e-9 * abs(eig.min())  # one zero
    assert np.sum(np.abs(eig) < 1e-9 * abs(eig.min())) == 1  # the constant mode only


def test_dirichlet_laplacian_is_symmetric_negative_definite():
    grid = pde.Grid((5, 4), (0.3, 0.2), ["dirichlet", ("dirichlet", "neumann")])
    jac = dense_jacobian(lambda v: lap(v, grid), grid)
    np.testing.assert_allclose(jac, jac.T, atol=1e-12)
    assert np.linalg.eigvalsh(jac).max() < -1.0


def test_neumann_flux_obeys_the_discrete_divergence_theorem():
    """sum(lap u) h^d = the boundary flux: sum over faces of g (outward: -g below, +g
    above) times the face area, for any u (a finite-volume identity)."""
    grid = pde.Grid((7, 6), (0.25, 0.4), "neumann")
    u = jnp.asarray(RNG.normal(size=(7, 6)))
    gx0, gx1 = RNG.normal(size=6), RNG.normal(size=6)
    gy0, gy1 = RNG.normal(size=7), RNG.normal(size=7)
    got = lap(u, grid, lower=(gx0, gy0), upper=(gx1, gy1))
    hx, hy = grid.spacing
    flux = (gx1 - gx0).sum() * hy + (gy1 - gy0).sum() * hx
    np.testing.assert_allclose(float(jnp.sum(got)) * hx * hy, flux, rtol=1e-12)


def test_trailing_axes_are_independent_fields_with_their_own_boundary_values():
    grid = pde.Grid.uniform((10,), bc="dirichlet")
    y = jnp.asarray(RNG.normal(size=(10, 2)))
    both = lap(y, grid, lower=jnp.array([1.0, 3.0]), upper=jnp.array([2.0, 4.0]))
    np.testing.assert_allclose(both[:, 0], lap(y[:, 0], grid, lower=1.0, upper=2.0))
    np.testing.assert_allclose(both[:, 1], lap(y[:, 1], grid, lower=3.0, upper=4.0))
    g = grad(y, grid)
    assert g.shape == (10, 2, 1)
    np.testing.assert_allclose(g[:, 1, 0], grad(y[:, 1], grid)[:, 0])


# --------------------------------------------------------------------------------------
# JAX: dtype, jit, vmap, gradients


def test_float32_is_kept_and_jit_vmap_grad_work():
    grid = pde.Grid.uniform((16, 8), bc=["periodic", "neumann"])
    u32 = jnp.asarray(RNG.random((16, 8)), jnp.float32)
    for op in (lap, grad, div):
        field = u32[..., None].repeat(2, -1) if op is div else u32
        assert op(field, grid, upper=(None, 0.5)).dtype == jnp.float32
    batch = jnp.asarray(RNG.random((3, 16, 8)))
    vm = jax.jit(jax.vmap(lambda v, g: pde.laplacian(v, grid, upper=(None, g))))(
        batch, jnp.array([0.0, 1.0, 2.0]))
    for i in range(3):
        np.testing.assert_allclose(vm[i], lap(batch[i], grid, upper=(None, float(i))),
                                   rtol=1e-13)


def test_gradient_with_respect_to_boundary_values_matches_finite_differences():
    grid = pde.Grid.uniform((12,), bc=[("dirichlet", "neumann")])
    u = jnp.asarray(RNG.random(12))

    def loss(lo, hi):
        return jnp.sum(jnp.sin(pde.laplacian(u, grid, lower=lo, upper=hi)))

    loss = jax.jit(loss)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))(0.3, -0.2)
    eps = 1e-6
    fd = ((loss(0.3 + eps, -0.2) - loss(0.3 - eps, -0.2)) / (2 * eps),
          (loss(0.3, -0.2 + eps) - loss(0.3, -0.2 - eps)) / (2 * eps))
    np.testing.assert_allclose(g, fd, rtol=1e-6)


# --------------------------------------------------------------------------------------
# sparsity


def pattern_cases(ndim):
    """Boundary combinations: every kind of side on every axis at least once."""
    if ndim == 1:
        return [[bc] for bc in SIDES]
    return [[SIDES[(i + k) % len(SIDES)] for k in range(ndim)] for i in range(len(SIDES))]


@pytest.mark.parametrize("ndim", [1, pytest.param(2, marks=pytest.mark.slow),
                                  pytest.param(3, marks=pytest.mark.slow)])
def test_patterns_equal_the_nonzeros_of_a_dense_jacobian(ndim):
    """Every operator, each kind of boundary (mixed sides included) on every axis."""
    shape = (5, 4, 3)[:ndim]
    for bcs in pattern_cases(ndim):
        grid = pde.Grid(shape, (0.3, 0.2, 0.5)[:ndim], bcs)

        def ops(v, grid=grid):
            u = v.reshape(grid.shape)
            flux = jnp.stack([(k + 1) * u**2 for k in range(ndim)], axis=-1)  # F_k(u)
            return (pde.laplacian(u, grid).reshape(-1), pde.gradient(u, grid).reshape(-1),
                    pde.divergence(flux, grid).reshape(-1))

        u = jnp.asarray(RNG.random(grid.size))
        j_lap, j_grad, j_div = (np.asarray(j) for j in jax.jit(jax.jacfwd(ops))(u))
        np.testing.assert_array_equal(np.abs(j_lap) > 0, pde.laplacian_pattern(grid).toarray(),
                                      err_msg=str(bcs))
        np.testing.assert_array_equal(spatial_nonzeros(j_grad, grid.size, ndim),
                                      pde.gradient_pattern(grid).toarray(), err_msg=str(bcs))
        np.testing.assert_array_equal(np.abs(j_div) > 0, pde.divergence_pattern(grid).toarray(),
                                      err_msg=str(bcs))


def test_reaction_diffusion_pattern_equals_the_brusselator_jacobian():
    """The 2-D Brusselator built from the operators, in both layouts, and a system where
    only one species diffuses and the coupling is one-way."""
    n = 6
    y = jnp.asarray(RNG.random((n, n, 2)) + 0.5)
    grid = systems.brusselator_2d_grid(n)
    jac = jax.jit(jax.jacfwd(lambda v: systems.brusselator_2d(2.0, v.reshape(n, n, 2))
                             .reshape(-1)))(y.reshape(-1))
    S = pde.pattern(grid, pde.laplacian_pattern(grid), species=2)
    assert isinstance(S, scipy.sparse.sparray) and S.dtype == bool
    np.testing.assert_array_equal(np.abs(np.asarray(jac)) > 0, S.toarray())

    def blocked(v):  # the same system on a (u, v) state, one field after the other
        u_, v_ = v[: n * n].reshape(n, n), v[n * n:].reshape(n, n)
        out = systems.brusselator_2d(2.0, jnp.stack([u_, v_], axis=-1))
        return jnp.concatenate([out[..., 0].reshape(-1), out[..., 1].reshape(-1)])

    yb = jnp.concatenate([y[..., 0].reshape(-1), y[..., 1].reshape(-1)])
    jb = jax.jit(jax.jacfwd(blocked))(yb)
    Sb = pde.pattern(grid, pde.laplacian_pattern(grid), species=2, layout="blocked")
    np.testing.assert_array_equal(np.abs(np.asarray(jb)) > 0, Sb.toarray())

    g1 = pde.Grid.uniform((7,), bc="neumann")

    def one_way(v):  # u diffuses and decays; v is made from u and decays, does not move
        u_, w = v[:, 0], v[:, 1]
        return jnp.stack([lap(u_, g1) - u_, u_**2 - w], axis=-1)

    y1 = jnp.asarray(RNG.random((7, 2)))
    j1 = jax.jit(jax.jacfwd(lambda v: one_way(v.reshape(7, 2)).reshape(-1)))(y1.reshape(-1))
    S1 = pde.pattern(g1, [pde.laplacian_pattern(g1), None], species=2,
                     reaction=[[True, False], [True, True]])
    np.testing.assert_array_equal(np.abs(np.asarray(j1)) > 0, S1.toarray())


def test_bandwidth_of_patterns():
    g = systems.brusselator_1d_grid(50)
    S = pde.pattern(g, pde.laplacian_pattern(g), species=2)
    assert pde.bandwidth(S) == (2, 2)
    j = jax.jit(jax.jacfwd(lambda v: systems.brusselator_1d(0.0, v.reshape(50, 2))
                           .reshape(-1)))(jnp.asarray(systems.brusselator_1d_initial(50))
                                          .reshape(-1))
    rows, cols = np.nonzero(np.asarray(j))
    assert pde.bandwidth(S) == ((rows - cols).max(), (cols - rows).max())
    assert pde.bandwidth(pde.pattern(g, pde.laplacian_pattern(g), species=2,
                                     layout="blocked")) == (50, 50)
    assert pde.bandwidth(pde.laplacian_pattern(pde.Grid((9,), 1.0))) == (8, 8)  # periodic
    g2 = pde.Grid((6, 5), 1.0, "dirichlet")
    assert pde.bandwidth(pde.laplacian_pattern(g2)) == (5, 5)  # one row of the grid
    assert pde.bandwidth(np.triu(np.ones((4, 4)), 1)) == (0, 3)
    assert pde.bandwidth(scipy.sparse.csr_array((3, 3))) == (0, 0)
    with pytest.raises(ValueError, match="square"):
        pde.bandwidth(np.ones((3, 4)))


def test_pattern_arguments_fail_loudly():
    g = pde.Grid((4,), 1.0)
    with pytest.raises(ValueError, match=r"operators\[0\] has shape \(3, 3\)"):
        pde.pattern(g, scipy.sparse.eye_array(3))
    with pytest.raises(ValueError, match="one per species"):
        pde.pattern(g, [pde.laplacian_pattern(g)], species=2)
    with pytest.raises(ValueError, match=r"reaction has shape \(3, 3\)"):
        pde.pattern(g, species=2, reaction=np.ones((3, 3)))
    with pytest.raises(ValueError, match="species must be an integer"):
        pde.pattern(g, species=0)
    with pytest.raises(ValueError, match="layout"):
        pde.pattern(g, layout="species-first")


def test_patterns_are_what_scipy_takes():
    """scipy's BDF takes the pattern (a scipy sparse array) and, with it, solves the 1-D
    Brusselator as with a dense finite-difference Jacobian: one entry per nonzero of the
    4-nonzeros-a-row band."""
    from scipy.integrate import solve_ivp

    n = 40
    g = systems.brusselator_1d_grid(n)
    S = pde.pattern(g, pde.laplacian_pattern(g), species=2)
    f = jax.jit(lambda y: systems.brusselator_1d(0.0, y.reshape(n, 2)).reshape(-1))
    y0 = systems.brusselator_1d_initial(n).reshape(-1)
    runs = [solve_ivp(lambda t, y: np.asarray(f(y)), (0.0, 1.0), y0, method="BDF", rtol=1e-6,
                      atol=1e-6, **kw) for kw in (dict(jac_sparsity=S), dict())]
    assert runs[0].success and runs[1].success
    np.testing.assert_allclose(runs[0].y[:, -1], runs[1].y[:, -1], rtol=1e-4)
    assert abs(runs[0].t.size - runs[1].t.size) <= 1
    assert S.nnz == 8 * n - 4  # u_i: u_{i-1}, u_i, u_{i+1}, v_i (and v_i likewise), less the ends


# --------------------------------------------------------------------------------------
# the benchmark's NumPy fields (validation/pde_reference.py) are simlib's problems


def test_numpy_fields_of_the_peers_equal_the_jax_ones():
    """scipy and SUNDIALS in benchmarks/pde.py solve the same systems as simlib: the
    vectorised NumPy fields equal the JAX ones (2-D with the forcing off and on), the
    exact sparse Jacobian equals jacfwd, and the FFT preconditioner inverts I - gamma
    alpha lap exactly."""
    from validation import pde_reference as ref

    for prob in (ref.bruss1d_problem(20), ref.bruss2d_problem(16)):
        y = prob.y0 + 0.1 * RNG.random(prob.states)
        f = jax.jit(prob.f)
        for t in (0.5, 2.0):  # the 2-D forcing switches on at t = 1.1
            np.testing.assert_allclose(prob.f_np(t, y, prob.args), f(t, jnp.asarray(y),
                                                                     prob.args),
                                       rtol=1e-12, atol=1e-9)
    jac = jax.jit(jax.jacfwd(prob.f, argnums=1))(2.0, jnp.asarray(y), prob.args)
    exact = ref.bruss2d_jac_np(2.0, y, prob.args)
    np.testing.assert_allclose(exact.toarray(), jac, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(exact.toarray() != 0, prob.sparsity.toarray())
    r, z, gamma = RNG.random(prob.states), np.empty(prob.states), 3e-3
    ref.fft_preconditioner(prob)(0.0, y, None, r, z, gamma, 0.0, 1)
    diffusion = prob.args[2] * np.kron(ref._laplacian_matrix_2d(16).toarray() * 15**2,
                                       np.eye(2))
    np.testing.assert_allclose((np.eye(prob.states) - gamma * diffusion) @ z, r, atol=1e-12)
