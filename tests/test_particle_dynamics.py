"""simlib.particles dynamics: gravity against scipy's DOP853 and Kepler's closed form, NVE
energy conservation and its dt^2 scaling, BAOAB Langevin sampling, simulate()'s
neighbour-list reallocation, errors, recompilation, vmap, and gradients against finite
differences.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from scipy.integrate import solve_ivp

import simlib as sl
from simlib import particles as sp
from simlib.particles import _simulate

LJ = dict(sigma=1.0, epsilon=1.0)


# --------------------------------------------------------------------------------------
# 5. gravity


def np_gravity_rhs(masses, G, softening):
    """dy/dt for y = (x, v) flattened: a_i = G sum_j m_j (x_j - x_i) / (r^2 + eps^2)^1.5."""
    n = len(masses)

    def rhs(t, y):
        x = y[: y.size // 2].reshape(n, -1)
        dv = x[None, :, :] - x[:, None, :]
        r2 = np.sum(dv * dv, axis=-1) + softening**2
        np.fill_diagonal(r2, np.inf)
        a = G * np.sum((masses[None, :] / r2**1.5)[:, :, None] * dv, axis=1)
        return np.concatenate([y[y.size // 2:], a.ravel()])

    return rhs


def np_gravity_energy(x, v, masses, G, softening):
    """Total energy of frames ``(..., n, d)``."""
    k = 0.5 * np.sum(masses[:, None] * v * v, axis=(-2, -1))
    i, j = np.triu_indices(len(masses), 1)
    r = np.linalg.norm(x[..., i, :] - x[..., j, :], axis=-1)
    return k - G * np.sum(masses[i] * masses[j] / np.sqrt(r**2 + softening**2), axis=-1)


def run_gravity(x0, v0, masses, G, softening, t1, n_steps, save_every):
    energy = sp.pair_energy(sp.gravity, sp.free())
    params = dict(G=G, softening=softening, masses=jnp.asarray(masses))
    return sp.simulate(energy, sp.State(jnp.asarray(x0), jnp.asarray(v0), jnp.asarray(masses)),
                       params, space=sp.free(), dt=t1 / n_steps, n_steps=n_steps,
                       save_every=save_every)


def compare_with_dop853(x0, v0, masses, G, softening, t1, n_steps, save_every):
    """Position errors (max over frames and particles) at dt and dt/2 against DOP853."""
    n, d = x0.shape
    errors, trajs = [], []
    for refine in (1, 2):
        traj = run_gravity(x0, v0, masses, G, softening, t1, refine * n_steps,
                           save_every)
        times = np.asarray(traj.times)[::refine]
        ref = solve_ivp(np_gravity_rhs(masses, G, softening), (0, t1),
                        np.concatenate([x0.ravel(), v0.ravel()]), method="DOP853",
                        t_eval=times, rtol=1e-12, atol=1e-12)
        assert ref.success
        ref_x = ref.y[: n * d].T.reshape(-1, n, d)
        errors.append(np.abs(np.asarray(traj.positions)[::refine] - ref_x).max())
        trajs.append(traj)
    return errors, trajs


def test_figure_eight_three_body_orbit_against_dop853():
    """Chenciner & Montgomery's figure-eight choreography (G = m = 1), one full period
    T = 6.32591398: velocity Verlet converges to DOP853 at second order and the bodies
    come back to where they started."""
    x1 = np.array([0.97000436, -0.24308753])
    v3 = np.array([-0.93240737, -0.86473146])
    x0 = np.array([x1, -x1, [0.0, 0.0]])
    v0 = np.array([-v3 / 2, -v3 / 2, v3])
    m = np.ones(3)
    period = 6.32591398
    (coarse, fine), trajs = compare_with_dop853(x0, v0, m, 1.0, 0.0, period, 4000, 200)
    assert coarse / fine == pytest.approx(4.0, rel=0.05)          # second order
    assert fine < 1e-5
    # Back at the start after one period (the 8-digit initial data limit this to ~1e-7).
    np.testing.assert_allclose(np.asarray(trajs[1].final.positions), x0, atol=fine + 1e-7)
    e = np_gravity_energy(np.asarray(trajs[1].positions), np.asarray(trajs[1].velocities), m,
                          1.0, 0.0)
    np.testing.assert_allclose(np.asarray(trajs[1].total_energy), e, rtol=1e-12)
    assert np.abs(e - e[0]).max() < 1e-5 * abs(e[0])
    np.testing.assert_allclose(sp.total_momentum(trajs[1].velocities, m), 0.0, atol=1e-13)


def test_ten_bodies_with_softening_against_dop853():
    rng = np.random.default_rng(0)
    n = 10
    x0 = rng.normal(size=(n, 3))
    m = rng.uniform(0.5, 1.5, n) / n
    v0 = 0.3 * rng.normal(size=(n, 3))
    v0 -= (m[:, None] * v0).sum(0) / m.sum()
    (coarse, fine), trajs = compare_with_dop853(x0, v0, m, 1.0, 0.1, 2.0, 1000, 100)
    assert coarse / fine == pytest.approx(4.0, rel=0.05)
    assert fine < 1e-5
    traj = trajs[1]
    e = np_gravity_energy(np.asarray(traj.positions), np.asarray(traj.velocities), m, 1.0, 0.1)
    np.testing.assert_allclose(np.asarray(traj.total_energy), e, rtol=1e-12)
    p = np.asarray(sp.total_momentum(traj.velocities, m))
    np.testing.assert_allclose(p, 0.0, atol=1e-13)
    l_frames = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, m))
    np.testing.assert_allclose(l_frames - l_frames[0], 0.0, atol=1e-12 * np.abs(l_frames).max())


def kepler_closed_form(t, a, e, G, m1, m2, rot):
    """Positions and velocities of two bodies on a Kepler ellipse with pericentre at t = 0,
    centre of mass at rest at the origin, orbital plane rotated by ``rot``."""
    mass = m1 + m2
    n_mean = math.sqrt(G * mass / a**3)
    mean_anomaly = n_mean * np.asarray(t)
    ecc = mean_anomaly.copy()
    for _ in range(50):                       # Newton on E - e sin E = M
        ecc -= (ecc - e * np.sin(ecc) - mean_anomaly) / (1 - e * np.cos(ecc))
    b = a * math.sqrt(1 - e**2)
    e_dot = n_mean / (1 - e * np.cos(ecc))
    zeros = np.zeros_like(ecc)
    r = np.stack([a * (np.cos(ecc) - e), b * np.sin(ecc), zeros], -1) @ rot.T
    v = np.stack([-a * np.sin(ecc) * e_dot, b * np.cos(ecc) * e_dot, zeros], -1) @ rot.T
    x = np.stack([m2 / mass * r, -m1 / mass * r], -2)
    u = np.stack([m2 / mass * v, -m1 / mass * v], -2)
    return x, u


def test_kepler_orbit_against_its_closed_form():
    a, e, G, m1, m2 = 1.0, 0.6, 1.0, 1.0, 0.3
    q, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(3, 3)))
    period = 2 * math.pi * math.sqrt(a**3 / (G * (m1 + m2)))
    m = np.array([m1, m2])
    x0, v0 = kepler_closed_form(0.0, a, e, G, m1, m2, q)
    errors, energy_errors = [], []
    for n_steps in (4000, 8000):
        traj = run_gravity(x0, v0, m, G, 0.0, period, n_steps, 200)
        x_ref, _ = kepler_closed_form(np.asarray(traj.times), a, e, G, m1, m2, q)
        errors.append(np.abs(np.asarray(traj.positions) - x_ref).max())
        total = np.asarray(traj.total_energy)
        energy_errors.append(np.abs(total - total[0]).max())
    assert errors[0] / errors[1] == pytest.approx(4.0, rel=0.05)
    assert errors[1] < 1e-4
    # Energy -G m1 m2 / (2a), its error second order; angular momentum
    # mu sqrt(G M a (1 - e^2)) along the orbit normal.
    assert total[0] == pytest.approx(-G * m1 * m2 / (2 * a), rel=1e-14)
    assert energy_errors[0] / energy_errors[1] == pytest.approx(4.0, rel=0.05)
    assert energy_errors[1] < 1e-5 * abs(total[0])
    l_frames = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, m))
    mu = m1 * m2 / (m1 + m2)
    l_ref = mu * math.sqrt(G * (m1 + m2) * a * (1 - e**2)) * q[:, 2]
    np.testing.assert_allclose(l_frames[0], l_ref, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(l_frames - l_frames[0], 0.0, atol=1e-13)    # exact for Verlet
    np.testing.assert_allclose(sp.total_momentum(traj.velocities, m), 0.0, atol=1e-13)
    # Back at pericentre after one period.
    np.testing.assert_allclose(np.asarray(traj.final.positions), x0, atol=errors[1])


# --------------------------------------------------------------------------------------
# 6. NVE Lennard-Jones fluid


@pytest.fixture(scope="module")
def lj():
    """108 particles from an fcc lattice at density 0.8 and kT = 1.2 (it melts), LJ cut at
    2.2 and shifted, a neighbour list with skin 0.3."""
    x, box = sp.lattice(3, 0.8)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, 2.2, shift=True)
    nbrs = sp.neighbor_list(space, x, 2.2, 0.3)
    v = sp.maxwell_boltzmann(1.0, 1.2, key=jax.random.key(0), n=len(x))
    return dict(x=x, v=v, box=box, space=space, energy=energy, nbrs=nbrs)


def nve(lj, dt, n_steps, **kw):
    kw.setdefault("neighbors", lj["nbrs"])
    kw.setdefault("params", LJ)
    return sp.simulate(lj["energy"], sp.State(lj["x"], lj["v"], 1.0), kw.pop("params"),
                       space=lj["space"], dt=dt, n_steps=n_steps, save_every=10,
                       chunk_steps=500, **kw)


@pytest.fixture(scope="module")
def nve_runs(lj):
    return {dt: nve(lj, dt, round(5.0 / dt)) for dt in (0.005, 0.0025)}


def test_nve_conserves_energy_and_momentum(lj, nve_runs):
    traj = nve_runs[0.005]
    assert int(traj.result) == 0 and int(traj.stats["n_steps"]) == 1000
    assert int(traj.stats["n_builds"]) > 20                    # the list was rebuilt often
    e = np.asarray(traj.total_energy)
    fifth = len(e) // 5
    drift = abs(e[-fifth:].mean() - e[:fifth].mean()) / abs(e[0])
    assert drift < 1e-4
    assert np.abs(e - e[0]).max() < 1e-3 * abs(e[0])
    p = np.asarray(sp.total_momentum(traj.velocities, 1.0))
    np.testing.assert_allclose(p, 0.0, atol=1e-12)
    # The run went somewhere: the lattice melted, kinetic and potential energy exchanged.
    k = np.asarray(traj.kinetic_energy)
    assert k.min() < 0.8 * k[0]
    # The saved energies are those of the saved states (numpy pair sum on a frame).
    x = np.asarray(traj.positions[-1])
    dv = x[:, None] - x[None]
    dv -= lj["box"] * np.round(dv / lj["box"])
    r = np.linalg.norm(dv, axis=-1)
    np.fill_diagonal(r, np.inf)
    u = np.where(r < 2.2, 4 * (r**-12 - r**-6) - 4 * (2.2**-12 - 2.2**-6), 0.0)
    assert float(traj.potential_energy[-1]) == pytest.approx(0.5 * u.sum(), rel=1e-12)
    assert float(traj.kinetic_energy[-1]) == pytest.approx(
        0.5 * np.sum(np.asarray(traj.velocities[-1]) ** 2), rel=1e-13)


def test_nve_energy_error_scales_as_dt_squared(nve_runs):
    big = np.asarray(nve_runs[0.005].total_energy)
    small = np.asarray(nve_runs[0.0025].total_energy)
    assert len(big) == 101 and len(small) == 201         # the same 5 time units
    ratio = np.std(big) / np.std(small)
    assert ratio == pytest.approx(4.0, rel=0.1)


# --------------------------------------------------------------------------------------
# 7. Langevin


@pytest.fixture(scope="module")
def langevin_run(lj):
    m = 1.0 + 0.5 * (jnp.arange(len(lj["x"])) % 2)
    traj = sp.simulate(lj["energy"], sp.State(lj["x"], jnp.zeros_like(lj["x"]), m), LJ,
                       space=lj["space"], dt=0.005, n_steps=5000, save_every=10,
                       chunk_steps=500, neighbors=lj["nbrs"], integrator=sp.Langevin(1.2, 2.0),
                       key=jax.random.key(3))
    return traj, np.asarray(m)


def test_langevin_kinetic_temperature(langevin_run):
    """From rest to kT = 1.2: after 5 time units (10 friction times), the mean kinetic
    temperature (3n degrees of freedom: Langevin does not conserve momentum) matches kT
    within 4.5 standard errors, estimated from 8 blocks of 2.5 time units."""
    traj, m = langevin_run
    temps = np.asarray(sp.temperature(traj.velocities, m, remove_momentum=False))[101:]
    blocks = temps.reshape(8, -1).mean(axis=1)
    se = blocks.std(ddof=1) / math.sqrt(len(blocks))
    assert 0 < se < 0.05
    assert abs(temps.mean() - 1.2) < 4.5 * se
    assert temps[0] > 1.0                  # warmed up from zero already in the kept part


def test_langevin_velocities_are_maxwell_boltzmann(langevin_run):
    traj, m = langevin_run
    # Frames one time unit (2 friction times) apart, scaled by sqrt(m / kT): unit normals.
    v = np.asarray(traj.velocities)[101::20] * np.sqrt(m / 1.2)[None, :, None]
    assert v.size > 6000
    assert stats.kstest(v.ravel(), "norm").pvalue > 1e-3
    # And not trivially: at twice the temperature the same test fails.
    assert stats.kstest(v.ravel() / math.sqrt(2.0), "norm").pvalue < 1e-6


def short_langevin(lj, key, **kw):
    return sp.simulate(lj["energy"], sp.State(lj["x"], lj["v"], 1.0), LJ, space=lj["space"],
                       dt=0.005, n_steps=200, save_every=10, neighbors=lj["nbrs"],
                       integrator=sp.Langevin(1.2, 2.0), key=key, **kw)


def test_langevin_needs_a_key_and_is_reproducible(lj):
    with pytest.raises(ValueError, match="stochastic and needs an explicit key"):
        short_langevin(lj, None)
    a = short_langevin(lj, jax.random.key(7), chunk_steps=50)
    b = short_langevin(lj, jax.random.key(7), chunk_steps=50)
    c = short_langevin(lj, jax.random.key(8), chunk_steps=50)
    np.testing.assert_array_equal(a.positions, b.positions)
    np.testing.assert_array_equal(a.velocities, b.velocities)
    assert np.abs(np.asarray(a.velocities[-1]) - np.asarray(c.velocities[-1])).max() > 0.1
    # The chunked eager run (4 chunks of 50 steps) equals one traced scan under jit.
    traced = jax.jit(lambda key: short_langevin(lj, key))(jax.random.key(7))
    np.testing.assert_allclose(traced.positions, a.positions, rtol=0, atol=1e-11)
    np.testing.assert_allclose(traced.velocities, a.velocities, rtol=0, atol=1e-11)
    np.testing.assert_allclose(traced.times, a.times, rtol=1e-15)
    assert int(traced.stats["n_builds"]) == int(a.stats["n_builds"])


# --------------------------------------------------------------------------------------
# 8. simulate: neighbour-list overflow, errors, recompilation, vmap, debug


def test_eager_overflow_reallocates_and_matches_a_large_list(lj):
    """A list sized exactly for the lattice overflows as the lattice melts; the eager run
    reallocates and re-runs the chunk, giving the trajectory of a large enough list."""
    tight = sp.neighbor_list(lj["space"], lj["x"], 2.2, 0.3, capacity_multiplier=1.0)
    assert not bool(tight.overflow)
    traj = nve(lj, 0.005, 400, neighbors=tight)
    assert traj.stats["n_reallocations"] >= 1
    assert int(traj.result) == 0 and not bool(traj.neighbors.overflow)
    assert traj.neighbors.capacity > tight.capacity
    roomy = sp.neighbor_list(lj["space"], lj["x"], 2.2, 0.3,
                             capacity=traj.neighbors.capacity,
                             cell_capacity=traj.neighbors.cell_capacity)
    ref = nve(lj, 0.005, 400, neighbors=roomy)
    assert ref.stats["n_reallocations"] == 0
    # Equal up to round-off (the same pairs, summed from lists of another layout).
    np.testing.assert_allclose(traj.positions, ref.positions, rtol=0, atol=1e-12)
    np.testing.assert_allclose(traj.total_energy, ref.total_energy, rtol=1e-13)
    # Each reallocation is one more build.
    assert int(traj.stats["n_builds"]) == (int(ref.stats["n_builds"])
                                           + int(traj.stats["n_reallocations"]))


@pytest.mark.slow
def test_eager_overflow_of_a_debug_list_is_reallocated(lj):
    tight = sp.neighbor_list(lj["space"], lj["x"], 2.2, 0.3, capacity_multiplier=1.0,
                             debug=True)
    traj = nve(lj, 0.005, 400, neighbors=tight)
    assert traj.stats["n_reallocations"] >= 1
    assert int(traj.result) == 0 and int(traj.neighbors.missed_pairs) == 0


@pytest.fixture(scope="module")
def small():
    """A dilute LJ gas for tests of simulate's machinery: 108 particles (perturbed fcc,
    density 0.3, box 7.1), cut at 2.0; lists with skin 0.3 use 3 x 3 x 3 cells."""
    x, box = sp.lattice(3, 0.3)
    x = x + 0.05 * jax.random.normal(jax.random.key(0), x.shape)
    space = sp.periodic(box)
    return dict(x=x, v=sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(x)),
                m=jnp.ones(len(x)), space=space,
                energy=sp.pair_energy(sp.lennard_jones, space, 2.0, shift=True))


def small_run(s, nbrs, v=None, **kw):
    v = s["v"] if v is None else v
    return sp.simulate(s["energy"], sp.State(s["x"], v, s["m"]), LJ, space=s["space"],
                       dt=0.005, n_steps=40, save_every=10, neighbors=nbrs, **kw)


def test_overflow_under_jit_raises_or_is_reported(small):
    full = sp.neighbor_list(small["space"], small["x"], 2.0, 0.3)
    tiny = sp.neighbor_list(small["space"], small["x"], 2.0, 0.3,
                            capacity=int(full.max_neighbors) - 2)
    assert bool(tiny.overflow)
    with pytest.raises(Exception, match="neighbour list overflowed"):
        jax.block_until_ready(jax.jit(lambda nb: small_run(small, nb))(tiny).positions)
    traj = jax.jit(lambda nb: small_run(small, nb, throw=False))(tiny)
    assert int(traj.result) == sl.Result.NEIGHBOR_LIST_OVERFLOW
    # Eagerly, the same list is reallocated before the run starts.
    eager = small_run(small, tiny)
    assert eager.stats["n_reallocations"] >= 1 and int(eager.result) == 0


def test_verlet_on_a_harmonic_trap_is_its_exact_discrete_solution():
    """For U = k x^2 / 2 and x(0) = 1, v(0) = 0, velocity Verlet gives exactly
    x_n = cos(n theta), v_n = -sin(theta) sin(n theta) / h with cos(theta) = 1 - (w h)^2 / 2
    (w = 1 here). A plain function energy (forces by jax.grad), a scalar mass and
    save_every left out (the start and the end only)."""
    def trap(x, params):
        return 0.5 * params["k"] * jnp.sum(x**2)

    h, n_steps = 0.1, 250
    x0 = np.array([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    traj = sp.simulate(trap, sp.State(x0, np.zeros_like(x0), 2.0), dict(k=2.0),
                       space=sp.free(), dt=h, n_steps=n_steps)
    assert traj.positions.shape == (2, 2, 3)
    theta = math.acos(1 - h**2 / 2)
    np.testing.assert_allclose(traj.final.positions, math.cos(n_steps * theta) * x0,
                               atol=1e-12)
    np.testing.assert_allclose(traj.final.velocities,
                               -math.sin(theta) * math.sin(n_steps * theta) / h * x0,
                               atol=1e-12)
    np.testing.assert_allclose(traj.times, [0.0, n_steps * h], rtol=1e-15)


def test_non_finite_state_raises_with_the_partial_trajectory():
    def blow_up(x, params):            # U = -x^4: x reaches infinity in finite time
        return -jnp.sum(x**4)

    state = sp.State(jnp.ones((2, 1)), jnp.zeros((2, 1)), 1.0)
    with pytest.raises(sl.SolverError, match="non-finite") as err:
        sp.simulate(blow_up, state, {}, space=sp.free(), dt=0.01, n_steps=400, save_every=10)
    assert err.value.result == sl.Result.NONFINITE_STATE
    assert err.value.solution is not None
    traj = sp.simulate(blow_up, state, {}, space=sp.free(), dt=0.01, n_steps=400, save_every=10,
                       throw=False)
    assert int(traj.result) == sl.Result.NONFINITE_STATE
    assert np.all(np.isfinite(np.asarray(traj.positions[0])))


@pytest.mark.parametrize("change, match", [
    (dict(n_steps=45), r"n_steps=45 must be a multiple of save_every=10"),
    (dict(n_steps=-10), "n_steps must be a non-negative integer"),
    (dict(n_steps=10.0), "n_steps must be a non-negative integer"),
    (dict(save_every=0), "save_every must be a positive integer"),
    (dict(velocities=np.zeros((108, 2))), r"state.velocities has shape \(108, 2\)"),
    (dict(positions=np.zeros(108)), r"state.positions must have shape \(n, d\)"),
    (dict(masses=np.ones(107)), r"state.masses must be a scalar or have shape \(108,\)"),
    (dict(dt=np.ones(2)), "dt must be a scalar"),
    (dict(integrator="verlet"), "integrator must be NVE"),
    (dict(integrator=sp.Langevin(1.0, 1.0)), "needs an explicit key"),
    (dict(space=5.0), "space must be free"),
    (dict(neighbors="list"), "neighbors must come from neighbor_list"),
    (dict(adjoint="checkpointed"), "adjoint must be simlib.Direct"),
])
def test_simulate_argument_errors_name_the_argument(small, change, match):
    args = dict(positions=small["x"], velocities=small["v"], masses=1.0, dt=0.005,
                n_steps=40, save_every=10, integrator=sp.NVE(), space=small["space"],
                neighbors=None, adjoint=None)
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=match):
        sp.simulate(small["energy"], sp.State(args.pop("positions"), args.pop("velocities"),
                                              args.pop("masses")), LJ, **args)


def test_a_list_for_other_particles_or_an_energy_without_cutoff_is_refused(small):
    nbrs = sp.neighbor_list(small["space"], small["x"][:20], 2.0, 0.3)
    with pytest.raises(ValueError, match="neighbour list is for 20 particles"):
        small_run(small, nbrs)
    nbrs = sp.neighbor_list(small["space"], small["x"], 2.0, 0.3)
    with pytest.raises(ValueError, match="energy has no r_cut"):
        sp.simulate(sp.pair_energy(sp.lennard_jones, small["space"]),
                    sp.State(small["x"], small["v"], 1.0), LJ, space=small["space"], dt=0.005,
                    n_steps=10, neighbors=nbrs)


def _cache_sizes():
    """Entries in the jit caches of simulate's compiled pieces."""
    return tuple(fn._cache_size() for fn in (
        _simulate._frames_jit, _simulate._begin_jit,
        _simulate._assemble_jit, _simulate._concatenate))


class _CompileCounter:
    """Counts XLA backend compilations (every jit cache miss, eager op dispatch included)."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.count = 0

    def __call__(self, event, duration, **kwargs):
        if event == self.EVENT:
            self.count += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self)


def test_new_values_do_not_recompile(small):
    nbrs = sp.neighbor_list(small["space"], small["x"], 2.0, 0.3)
    rng = np.random.default_rng(0)

    def run(dt, sigma, save_every=10):
        return sp.simulate(
            small["energy"],
            sp.State(small["x"] + 0.01 * rng.normal(size=small["x"].shape), small["v"] * 1.1,
                     1.3 * jnp.ones(len(small["x"]))),
            dict(sigma=sigma, epsilon=1.1), space=small["space"], dt=dt, n_steps=40,
            save_every=save_every, neighbors=nbrs)

    assert float(run(0.005, 1.0).times[-1]) == pytest.approx(0.2)   # compiles everything
    before = _cache_sizes()
    assert before[0] >= 1 and before[1] >= 1
    with _CompileCounter() as counter:
        for dt, sigma in ((0.004, 0.98), (0.003, 1.02)):
            traj = run(dt, sigma)
            assert float(traj.times[-1]) == pytest.approx(40 * dt)
    assert counter.count == 0
    assert _cache_sizes() == before
    # Positive control: a new save_every (a static argument) must show up in both counters.
    with _CompileCounter() as counter:
        run(0.003, 1.02, save_every=20)
    assert counter.count >= 1
    assert _cache_sizes()[0] == before[0] + 1


def test_vmap_over_initial_velocities_equals_a_loop(small):
    nbrs = sp.neighbor_list(small["space"], small["x"], 2.0, 0.3)
    keys = jax.random.split(jax.random.key(5), 3)
    vs = jnp.stack([sp.maxwell_boltzmann(1.0, 1.0, key=k, n=len(small["x"])) for k in keys])
    batched = jax.jit(jax.vmap(lambda v: small_run(small, nbrs, v)))(vs)
    for b, v in enumerate(vs):
        one = small_run(small, nbrs, v)
        np.testing.assert_allclose(batched.positions[b], one.positions, rtol=0, atol=1e-12)
        np.testing.assert_allclose(batched.total_energy[b], one.total_energy, rtol=1e-12)
    assert batched.positions.shape == (3, 5, len(small["x"]), 3)


def roomy_debug_list(s):
    """A debug list that cannot overflow (the test above covers one that does)."""
    n = len(s["x"])
    return sp.neighbor_list(s["space"], s["x"], 2.0, 0.3, capacity=n - 1, cell_capacity=n,
                            debug=True)


def test_debug_list_reports_no_missed_pairs(small):
    nbrs = roomy_debug_list(small)
    traj = small_run(small, nbrs, v=3 * small["v"])
    assert int(traj.result) == 0
    assert int(traj.neighbors.missed_pairs) == 0
    assert int(traj.stats["n_builds"]) >= 3                   # rebuilt along the way


def test_debug_list_raises_when_pairs_are_missed(small):
    """A corrupted list (one row emptied; rebuilt only after moves of skin / 2) must be
    caught by the debug check."""
    nbrs = roomy_debug_list(small)
    idx = np.asarray(nbrs.idx).copy()
    idx[0] = len(small["x"])
    broken = nbrs.replace(idx=jnp.asarray(idx))
    traj = small_run(small, broken, throw=False)
    assert int(traj.result) == sl.Result.NEIGHBOR_LIST_MISSED_PAIRS
    with pytest.raises(sl.SolverError, match="missing from the neighbour list"):
        small_run(small, broken)


# --------------------------------------------------------------------------------------
# 9. gradients


@pytest.fixture(scope="module")
def grad_setup():
    """16 particles in 2D, LJ without a list; a loss on a 16-step run."""
    x, box = sp.lattice(4, 0.5, kind="cubic", dim=2)
    x = x + 0.1 * jax.random.normal(jax.random.key(0), x.shape)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, 2.5, shift=True)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(x), dim=2)
    m = 1.0 + 0.1 * jnp.arange(len(x)) / len(x)

    def loss(theta, adjoint):
        traj = sp.simulate(energy, sp.State(theta["x"], theta["v"], theta["m"]),
                           dict(sigma=theta["sigma"], epsilon=theta["epsilon"]), space=space,
                           dt=0.005, n_steps=16, save_every=4, adjoint=adjoint)
        return (jnp.sum(traj.potential_energy) + jnp.sum(jnp.sin(traj.positions[-1]))
                + jnp.sum(traj.kinetic_energy) + jnp.sum(traj.velocities[-1] ** 2))

    theta = dict(x=x, v=v, m=m, sigma=jnp.asarray(1.0), epsilon=jnp.asarray(1.2))
    return loss, theta, box


def test_gradients_through_simulate_match_finite_differences(grad_setup):
    loss, theta, box = grad_setup
    g_ck = jax.jit(jax.grad(lambda t: loss(t, sl.Checkpointed())))(theta)
    g_direct = jax.jit(jax.grad(lambda t: loss(t, sl.Direct())))(theta)
    for name in theta:
        np.testing.assert_allclose(g_direct[name], g_ck[name], rtol=1e-10, atol=1e-10)
    forward = jax.jit(lambda t: loss(t, sl.Direct()))
    h = 1e-6
    picks = [("sigma", ()), ("epsilon", ()), ("m", (3,)), ("m", (10,)), ("x", (5, 1)),
             ("x", (0, 0)), ("v", (7, 0)), ("v", (12, 1))]
    for name, idx in picks:
        def bumped(s, name=name, idx=idx):
            t = dict(theta)
            t[name] = jnp.asarray(np.asarray(theta[name], float).copy())
            t[name] = t[name].at[idx].add(s)
            return float(forward(t))
        fd = (bumped(h) - bumped(-h)) / (2 * h)
        assert float(g_ck[name][idx]) == pytest.approx(fd, rel=1e-6, abs=1e-8), (name, idx)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in g_ck.values())


def test_gradients_are_finite_at_the_cutoff_and_through_padded_slots():
    box = 10.0
    space = sp.periodic(box)
    x = jnp.array([[1.0, 1.0, 1.0], [3.5, 1.0, 1.0], [1.0, 2.2, 1.0], [6.0, 6.0, 6.0]])
    assert float(jnp.linalg.norm(x[1] - x[0])) == 2.5     # a pair exactly at r_cut
    energy = sp.pair_energy(sp.lennard_jones, space, 2.5, shift=True)
    nbrs = sp.neighbor_list(space, x, 2.5, 0.5, capacity=3)   # particle 3 has none: padded
    assert np.sum(np.asarray(nbrs.idx) == 4) > 0

    def loss(x, sigma, nb):
        e, f = energy.energy_and_forces(x, dict(sigma=sigma, epsilon=1.0), nb)
        return e + jnp.sum(f**2)

    for nb in (None, nbrs):
        value, grads = jax.value_and_grad(loss, argnums=(0, 1))(x, 1.0, nb)
        assert np.isfinite(float(value))
        assert all(np.all(np.isfinite(np.asarray(g))) for g in grads)
        # At exactly r_cut the pair does not interact (r < r_cut), so only pair (0, 2) counts.
        r = 1.2
        u = 4 * (r**-12 - r**-6) - 4 * (2.5**-12 - 2.5**-6)
        du = 4 * (-12 * r**-13 + 6 * r**-7)
        assert float(value) == pytest.approx(u + 2 * du**2, rel=1e-12)
        g = np.asarray(grads[0])
        np.testing.assert_allclose(g[[1, 3]], 0.0, atol=0)
        if nb is None:   # all pairs: covered by the finite differences through simulate
            continue
        # Through the padded list: central differences in directions that do not move pair
        # (0, 1) across r_cut (a sideways shift of particle 0 keeps r_01 > r_cut both ways).
        h, picks = 1e-6, ((0, 1), (2, 1), (2, 0), (0, 2))
        bumps = np.zeros((2 * len(picks) + 2,) + x.shape)
        for k, idx in enumerate(picks):
            bumps[(2 * k, *idx)], bumps[(2 * k + 1, *idx)] = h, -h
        sigmas = np.ones(len(bumps))
        sigmas[-2:] += (h, -h)
        value_at = jax.jit(loss)
        values = np.array([float(value_at(jnp.asarray(np.asarray(x) + b), s, nb))
                           for b, s in zip(bumps, sigmas, strict=True)])
        fd = (values[0::2] - values[1::2]) / (2 * h)
        for k, idx in enumerate(picks):
            assert g[idx] == pytest.approx(fd[k], rel=1e-6, abs=1e-6), idx
        assert float(grads[1]) == pytest.approx(fd[-1], rel=1e-6)
