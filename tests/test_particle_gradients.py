"""Gradients through particle simulations: strategies against each other and finite
differences, the reversible adjoint over 10^5 steps, and fitting LJ parameters to forces
computed by an independent numpy implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import simlib as sl
from simlib import particles as sp

N_CHAIN = 8
CHAIN_X0 = jnp.stack([jnp.arange(N_CHAIN) * 1.1, 0.1 * jnp.sin(jnp.arange(N_CHAIN)),
                      jnp.zeros(N_CHAIN)], 1)
CHAIN_V0 = 0.1 * jax.random.normal(jax.random.key(0), (N_CHAIN, 3))
CHAIN_M = jnp.linspace(1.0, 2.0, N_CHAIN)
CHAIN = sp.bond_energy(sp.harmonic, sp.free(),
                       jnp.stack([jnp.arange(N_CHAIN - 1), jnp.arange(1, N_CHAIN)], 1))


def chain_loss(x0, v0, m, k, adjoint, n_steps=400):
    t = sp.simulate(CHAIN, sp.State(x0, v0, m), dict(k=k, r0=1.0), space=sp.free(), dt=0.01,
                    n_steps=n_steps, save_every=n_steps // 4, adjoint=adjoint)
    return (jnp.sum(t.positions[:, :, 0] ** 2) + jnp.sum(t.velocities ** 2)
            + jnp.sum(t.potential_energy) + jnp.sum(t.kinetic_energy)
            + jnp.sum(t.final.positions))


@pytest.fixture(scope="module")
def chain_gradients():
    grad = jax.jit(jax.grad(chain_loss, argnums=(0, 1, 2, 3)), static_argnums=4)
    return {type(a).__name__: grad(CHAIN_X0, CHAIN_V0, CHAIN_M, 2.0, a)
            for a in (sl.Direct(), sl.Checkpointed(), sl.Reversible())}


def test_strategies_agree_on_a_harmonic_chain(chain_gradients):
    ref = jax.tree_util.tree_leaves(chain_gradients["Checkpointed"])
    for name in ("Direct", "Reversible"):
        for a, b in zip(jax.tree_util.tree_leaves(chain_gradients[name]), ref, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("which", ["x0", "v0", "m", "k"])
def test_reversible_gradient_matches_finite_differences(chain_gradients, which):
    args = dict(x0=CHAIN_X0, v0=CHAIN_V0, m=CHAIN_M, k=2.0)
    index = {"x0": (3, 1), "v0": (5, 0), "m": (2,), "k": ()}[which]
    grad = chain_gradients["Reversible"][list(args).index(which)]
    h = 1e-6

    def shifted(s):
        a = dict(args)
        a[which] = (jnp.asarray(a[which]).at[index].add(s) if index else a[which] + s)
        return float(chain_loss(a["x0"], a["v0"], a["m"], a["k"], sl.Checkpointed()))

    fd = (shifted(h) - shifted(-h)) / (2 * h)
    got = float(grad[index]) if index else float(grad)
    assert abs(got - fd) < 1e-6 * max(1.0, abs(fd))


@pytest.mark.slow
def test_reversible_agrees_with_checkpointed_over_1e5_steps():
    """Two-body gravity (an integrable orbit) over 10^5 velocity Verlet steps."""
    x = jnp.array([[1.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    v = jnp.array([[0.0, 0.5, 0.1], [0.0, -0.5, -0.1]])
    m = jnp.array([1.0, 1.0])
    gravity = sp.pair_energy(sp.gravity, sp.free())

    def loss(x, v, G, adjoint):
        t = sp.simulate(gravity, sp.State(x, v, m), dict(G=G, softening=0.0, masses=m),
                        space=sp.free(), dt=1e-3, n_steps=100_000, save_every=10_000,
                        adjoint=adjoint)
        return jnp.sum(t.positions[:, 0, 0]) + t.kinetic_energy[-1]

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)), static_argnums=3)
    rev = grad(x, v, 1.0, sl.Reversible())
    chk = grad(x, v, 1.0, sl.Checkpointed())
    for a, b in zip(jax.tree_util.tree_leaves(rev), jax.tree_util.tree_leaves(chk), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-8 * float(jnp.max(jnp.abs(b))))


def test_reversible_runs_eagerly():
    """An eager (undifferentiated) run with adjoint=Reversible() is the plain run; it raised
    a TypeError (the chunked driver's scan had no backward integration to call)."""
    state = sp.State(CHAIN_X0, CHAIN_V0, CHAIN_M)
    kwargs = dict(space=sp.free(), dt=0.01, n_steps=10, save_every=5)
    rev = sp.simulate(CHAIN, state, dict(k=1.0, r0=1.0), adjoint=sl.Reversible(), **kwargs)
    ref = sp.simulate(CHAIN, state, dict(k=1.0, r0=1.0), adjoint=sl.Direct(), **kwargs)
    np.testing.assert_array_equal(rev.positions, ref.positions)


def test_reversible_needs_nve():
    with pytest.raises(ValueError, match="Reversible"):
        sp.simulate(CHAIN, sp.State(CHAIN_X0, CHAIN_V0, CHAIN_M), dict(k=1.0, r0=1.0),
                    space=sp.free(), dt=0.01, n_steps=10, adjoint=sl.Reversible(),
                    integrator=sp.Langevin(1.0, 1.0), key=jax.random.key(0))


def test_reversible_refuses_a_gradient_with_respect_to_dt():
    def final(dt, adjoint):
        t = sp.simulate(CHAIN, sp.State(CHAIN_X0, CHAIN_V0, CHAIN_M), dict(k=1.0, r0=1.0),
                        space=sp.free(), dt=dt, n_steps=10, adjoint=adjoint)
        return jnp.sum(t.final.positions ** 2)

    with pytest.raises(ValueError, match="Reversible.*times"):
        jax.jit(jax.grad(final), static_argnums=1)(0.01, sl.Reversible())
    g = float(jax.jit(jax.grad(final), static_argnums=1)(0.01, sl.Checkpointed()))
    forward = jax.jit(final, static_argnums=1)
    h = 1e-7
    fd = (float(forward(0.01 + h, sl.Checkpointed()))
          - float(forward(0.01 - h, sl.Checkpointed()))) / (2 * h)
    assert abs(fd) > 1e-3
    assert g == pytest.approx(fd, rel=1e-6)


@pytest.fixture(scope="module")
def lj_setup():
    """108 LJ atoms (perturbed fcc, density 0.8, box 5.13) cut at 2.0, so that a list with
    skin 0.3 fits the minimum image (2.3 < box / 2)."""
    x, box = sp.lattice(3, 0.8)
    x = x + 0.05 * jax.random.normal(jax.random.key(1), x.shape)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.0, shift=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.0, skin=0.3)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(2), n=x.shape[0])
    return x, v, box, energy, nbrs


@pytest.mark.parametrize("adjoint, use_list", [(sl.Checkpointed(), True), (sl.Direct(), False)],
                         ids=["ckpt-list", "direct-all-pairs"])
def test_lj_parameter_gradients_match_finite_differences(lj_setup, adjoint, use_list):
    x, v, box, energy, nbrs = lj_setup
    nbrs = nbrs if use_list else None
    space = sp.periodic(box)

    def loss(sigma, epsilon, m):
        t = sp.simulate(energy, sp.State(x, v, m), dict(sigma=sigma, epsilon=epsilon),
                        space=space, dt=0.002, n_steps=10, save_every=5, neighbors=nbrs,
                        adjoint=adjoint)
        return t.potential_energy[-1] + 0.1 * jnp.sum(t.positions[-1, :, 0])

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(1.0, 1.0, 1.0)
    forward = jax.jit(loss)
    h = 1e-6
    for i, g in enumerate(grads):
        plus = [1.0, 1.0, 1.0]
        minus = [1.0, 1.0, 1.0]
        plus[i] += h
        minus[i] -= h
        fd = (float(forward(*plus)) - float(forward(*minus))) / (2 * h)
        assert abs(float(g) - fd) < 1e-6 * max(1.0, abs(fd)), (i, float(g), fd)


@pytest.mark.parametrize("adjoint, use_list", [
    pytest.param(sl.Checkpointed(), True, marks=pytest.mark.slow),   # 6 s
    (sl.Reversible(), True)], ids=["ckpt-list", "reversible-list"])
def test_box_gradient_matches_finite_differences(lj_setup, adjoint, use_list):
    """d/dL at fixed positions (docs/particles.md), together with d/dsigma: the box enters
    the energy's and the integrator's space; the list, built for the nominal box, is fixed."""
    x, v, box, _, nbrs = lj_setup
    nbrs = nbrs if use_list else None

    def loss(L, sigma):
        space = sp.periodic(L)
        energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.0, shift=True)
        t = sp.simulate(energy, sp.State(x, v, 1.0), dict(sigma=sigma, epsilon=1.0),
                        space=space, dt=0.002, n_steps=10, save_every=5, neighbors=nbrs,
                        adjoint=adjoint)
        return t.potential_energy[-1] + jnp.sum(t.final.velocities[:, 0] ** 2)

    g_box, g_sigma = jax.jit(jax.grad(loss, argnums=(0, 1)))(box, 1.0)
    forward = jax.jit(loss)
    h = 1e-6
    fd_box = (float(forward(box + h, 1.0)) - float(forward(box - h, 1.0))) / (2 * h)
    fd_sigma = (float(forward(box, 1.0 + h)) - float(forward(box, 1.0 - h))) / (2 * h)
    assert abs(fd_box) > 1.0
    assert float(g_box) == pytest.approx(fd_box, rel=1e-6)
    assert float(g_sigma) == pytest.approx(fd_sigma, rel=1e-6)


def langevin_loss(kT, gamma, adjoint=None):
    t = sp.simulate(CHAIN, sp.State(CHAIN_X0, CHAIN_V0, CHAIN_M), dict(k=2.0, r0=1.0),
                    space=sp.free(), dt=0.01, n_steps=200, save_every=50,
                    integrator=sp.Langevin(kT, gamma), key=jax.random.key(3), adjoint=adjoint)
    return jnp.sum(t.kinetic_energy) + jnp.sum(t.final.positions[:, 1] ** 2)


@pytest.mark.parametrize("adjoint", [sl.Checkpointed(), sl.Direct()], ids=["ckpt", "direct"])
def test_langevin_kT_and_gamma_gradients_match_finite_differences(adjoint):
    """With a fixed key, BAOAB is a deterministic smooth map of kT and gamma."""
    g_kT, g_gamma = jax.jit(jax.grad(langevin_loss, argnums=(0, 1)), static_argnums=2)(
        0.5, 2.0, adjoint)
    forward = jax.jit(langevin_loss)
    h = 1e-6
    fd_kT = (float(forward(0.5 + h, 2.0)) - float(forward(0.5 - h, 2.0))) / (2 * h)
    fd_gamma = (float(forward(0.5, 2.0 + h)) - float(forward(0.5, 2.0 - h))) / (2 * h)
    assert abs(fd_kT) > 1e-2 and abs(fd_gamma) > 1e-2, (fd_kT, fd_gamma)
    assert float(g_kT) == pytest.approx(fd_kT, rel=1e-6)
    assert float(g_gamma) == pytest.approx(fd_gamma, rel=1e-6)


def _numpy_lj_forces(x, box, sigma, epsilon, r_cut=2.5):
    d = x[:, None, :] - x[None, :, :]
    d -= box * np.round(d / box)
    r2 = np.sum(d * d, axis=-1)
    np.fill_diagonal(r2, np.inf)
    inside = r2 < r_cut**2
    s6 = (sigma**2 / np.where(inside, r2, 1.0)) ** 3
    coef = np.where(inside, 24.0 * epsilon * (2.0 * s6 * s6 - s6) / r2, 0.0)
    return np.sum(coef[:, :, None] * d, axis=1)


def test_fit_recovers_lj_sigma_and_epsilon_from_numpy_forces():
    """Forces from an independent numpy implementation at sigma=1.05, epsilon=0.85."""
    x, box = sp.lattice(3, 0.75)
    frames = [x + 0.08 * jax.random.normal(jax.random.key(i), x.shape) for i in range(2)]
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    observed = jnp.stack([_numpy_lj_forces(np.asarray(f), box, 1.05, 0.85) for f in frames])

    def loss(p):
        predicted = jnp.stack([energy.forces(f, p) for f in frames])
        return jnp.mean((predicted - observed) ** 2)

    res = sl.fit(loss, dict(sigma=0.95, epsilon=1.1), optimizer=optax.lbfgs(), steps=60,
                 tol=1e-14, transforms=dict(sigma=sl.Positive(), epsilon=sl.Positive()),
                 progress=False)
    assert abs(float(res.params["sigma"]) - 1.05) < 1e-6
    assert abs(float(res.params["epsilon"]) - 0.85) < 1e-6
