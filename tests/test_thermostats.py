"""Thermostats (Nose-Hoover chains, stochastic velocity rescaling): the canonical law of the
kinetic energy (a KS test against the gamma law, scipy), the conserved quantity's error
going as dt^2, checkpoint and resume with the thermostat's state; the Lennard-Jones tail
corrections against their closed forms and quadrature (scipy)."""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

import simlib as sl
from simlib import particles as sp
from simlib.particles import _simulate

KT = 1.0
CHUNK = 2000            # every run below is whole chunks of 200 frames: one compile each


def _system():
    """32 WCA atoms at density 0.8: smooth at the cutoff, so the conserved quantity's
    error is the integrator's alone."""
    x, box = sp.lattice(2, 0.8)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.wca, space, r_cut=2 ** (1 / 6))
    v = sp.maxwell_boltzmann(1.0, KT, key=jax.random.key(1), n=len(x))
    v = v - jnp.mean(v, axis=0)
    return energy, sp.State(x, v, 1.0), dict(sigma=1.0, epsilon=1.0), space


def run(integrator, dt, n_steps, **kw):
    energy, state, params, space = _system()
    return sp.simulate(energy, state, params, space=space, dt=dt, n_steps=n_steps,
                       save_every=10, integrator=integrator, key=jax.random.key(3),
                       chunk_steps=CHUNK, **kw)


THERMOSTATS = {"nose_hoover_chain": sp.NoseHooverChain(KT, 0.1), "bussi": sp.Bussi(KT, 0.1)}


# Bussi's full runs compile another simulate (~2.5 s): slow set; its kinetic-energy update is
# checked in the default set below, and NPT runs it in every step.
@pytest.fixture(scope="module", params=[
    "nose_hoover_chain", pytest.param("bussi", marks=pytest.mark.slow)])
def thermostat(request):
    return THERMOSTATS[request.param]


def test_bussi_update_keeps_the_canonical_law():
    """K' = bussi_kinetic(K) with K drawn from the gamma law (shape N_f/2, scale kT) is
    gamma-distributed again, for a short and a long time (KS test, 4,000 samples)."""
    from simlib.particles._thermostats import bussi_kinetic

    nf, kT = 12, 1.3
    keys = jax.random.split(jax.random.key(5), 4000)
    k = stats.gamma(nf / 2, scale=kT).rvs(size=4000, random_state=np.random.default_rng(1))
    step = jax.jit(jax.vmap(lambda k, c, key: bussi_kinetic(k, 0.5 * nf * kT, nf, c, key),
                            in_axes=(0, None, 0)))
    for c in (0.9, 0.1):
        new = np.asarray(step(jnp.asarray(k), c, keys))
        test = stats.kstest(new, stats.gamma(nf / 2, scale=kT).cdf)
        assert test.pvalue > 0.01, (c, test)
        assert np.corrcoef(k, new)[0, 1] == pytest.approx(c, abs=0.05)   # the decay e^{-t/tau}


@pytest.mark.parametrize("k", [200, 300, 95_997])
def test_chi_square_follows_the_chi_square_law(k):
    """chi_square(k): KS test against scipy's chi-square law (20,000 float32 draws), below
    the switch (squared normals) and above it (Marsaglia-Tsang); above it the draw takes
    24 random numbers, not k (counted in the jaxpr)."""
    from simlib.particles._thermostats import chi_square

    keys = jax.random.split(jax.random.key(11), 20_000)
    draw = jax.vmap(lambda key: chi_square(key, k, jnp.float32))
    s = np.asarray(jax.jit(draw)(keys), np.float64)
    test = stats.kstest(s, stats.chi2(k).cdf)
    assert test.pvalue > 0.01, test
    assert np.mean(s) == pytest.approx(k, rel=3 * np.sqrt(2 / k / len(s)) + 1e-6)
    jaxpr = str(jax.make_jaxpr(lambda key: chi_square(key, k, jnp.float32))(keys[0]))
    sizes = [int(n) for n in re.findall(r"random_bits\[bit_width=32 shape=\((\d+),\)\]", jaxpr)]
    assert sum(sizes) == (k if k <= 256 else 24), sizes


@pytest.mark.parametrize("nf", [pytest.param(201, marks=pytest.mark.slow), 95_998])
def test_bussi_draws_follow_their_laws_and_are_two_draws(nf):
    """bussi_draws (the barostat's step: two thermostat half-steps and the cell's noise in
    one go): each chi-square variate against scipy's chi-square law of nf - 1 degrees of
    freedom and each normal against the normal law (KS, 4,000 float32 draws), the two
    chi-square variates uncorrelated, and above the switch two random-bit draws of
    2 (1 + 12) + 3 and 2 * 12 numbers in the jaxpr (separate bussi_kinetic calls: six)."""
    from simlib.particles._thermostats import bussi_draws

    keys = jax.random.split(jax.random.key(12), 4_000)
    normals, s = jax.jit(jax.vmap(lambda key: bussi_draws(key, nf, 2, 3, jnp.float32)))(keys)
    normals, s = np.asarray(normals, np.float64), np.asarray(s, np.float64)
    assert normals.shape == (4_000, 5) and s.shape == (4_000, 2)
    alpha = 0.01 / 7                     # seven KS tests: 1% for the family (Bonferroni)
    for i in range(2):
        assert stats.kstest(s[:, i], stats.chi2(nf - 1).cdf).pvalue > alpha
    for i in range(5):
        assert stats.kstest(normals[:, i], stats.norm.cdf).pvalue > alpha
    assert abs(np.corrcoef(s[:, 0], s[:, 1])[0, 1]) < 0.065                # 4 sigma
    jaxpr = str(jax.make_jaxpr(lambda key: bussi_draws(key, nf, 2, 3, jnp.float32))(keys[0]))
    shapes = re.findall(r"random_bits\[bit_width=32 shape=\(([\d, ]+)\)\]", jaxpr)
    sizes = sorted(math.prod(int(n) for n in sh.split(",") if n.strip()) for sh in shapes)
    if nf - 1 > 256:
        assert sizes == [24, 29], sizes


def test_kinetic_energy_is_canonical(thermostat):
    """K follows the gamma law of shape N_f/2 and scale kT (N_f = 3(n - 1)): KS test on
    frames 0.5 time units apart (several thermostat times, so nearly independent)."""
    traj = run(thermostat, 0.005, 10 * CHUNK)
    k = np.asarray(traj.kinetic_energy)[50::10]
    nf = 3 * (traj.positions.shape[1] - 1)
    test = stats.kstest(k, stats.gamma(nf / 2, scale=KT).cdf)
    assert len(k) >= 190 and test.pvalue > 0.01, (len(k), test)


def test_conserved_quantity_error_is_second_order(thermostat):
    """Halving dt divides the largest excursion of the conserved quantity by at least
    2^1.65 (second order; measured 2^1.92 for Nose-Hoover, 2^2.40 for Bussi)."""
    excursion = []
    for dt in (0.002, 0.001):
        h = np.asarray(run(thermostat, dt, CHUNK).conserved)
        excursion.append(np.max(np.abs(h - h[0])))
    order = math.log2(excursion[0] / excursion[1])
    assert order > 1.65, (excursion, order)


def test_nose_hoover_resume_is_bit_identical(tmp_path, monkeypatch):
    """A run stopped after its first chunk and resumed from the checkpoint ends bit for bit
    where an uninterrupted one does: the chain's state is in the checkpoint."""
    nhc = THERMOSTATS["nose_hoover_chain"]
    reference = run(nhc, 0.005, 2 * CHUNK)
    path = tmp_path / "nhc.npz"
    original, calls = _simulate._frames_jit, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(_simulate, "_frames_jit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(nhc, 0.005, 2 * CHUNK, checkpoint=path)
    monkeypatch.setattr(_simulate, "_frames_jit", original)
    assert sp.checkpoint_info(path)["steps_done"] == CHUNK
    resumed = run(nhc, 0.005, 2 * CHUNK, checkpoint=path, resume=True)
    for name in ("positions", "velocities", "conserved"):
        assert np.array_equal(np.asarray(getattr(resumed, name)),
                              np.asarray(getattr(reference, name))), name


# -- Lennard-Jones tail corrections -------------------------------------------------------

def _tail_closed_forms(rho, r_cut, sigma, epsilon):
    """U_tail/n and P_tail by quadrature of the full potential beyond r_cut (g = 1):
    U/n = 2 pi rho int r^2 u dr, P = -(2 pi / 3) rho^2 int r^3 u'(r) dr."""
    def u(r):
        return 4 * epsilon * ((sigma / r) ** 12 - (sigma / r) ** 6)

    def du(r):
        return 4 * epsilon * (-12 * sigma**12 / r**13 + 6 * sigma**6 / r**7)

    u_n = 2 * np.pi * rho * integrate.quad(lambda r: r * r * u(r), r_cut, np.inf)[0]
    p = -2 * np.pi / 3 * rho**2 * integrate.quad(lambda r: r**3 * du(r), r_cut, np.inf)[0]
    return u_n, p


def test_tail_corrections_match_quadrature():
    """The energy, virial and pressure that tail_correction=True adds equal the integrals of
    the full potential beyond r_cut (scipy quad) to 1e-12, at the triple-point density where
    the pressure tail is -0.762 (sigma = epsilon = 1, r_c = 2.5), and with sigma, epsilon != 1."""
    x, box = sp.lattice(3, 0.8442)   # the tails depend on n / V alone (box 5.04 > 2 r_cut)
    space = sp.periodic(box)
    v = jnp.zeros_like(x)
    plain = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    tailed = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)

    @jax.jit
    def differences(params):
        u0, f0 = plain.energy_and_forces(x, params)
        u1, f1 = tailed.energy_and_forces(x, params)
        dp = sp.pressure(tailed, x, v, 1.0, params) - sp.pressure(plain, x, v, 1.0, params)
        return tailed(x, params) - plain(x, params), u1 - u0, dp, jnp.max(jnp.abs(f1 - f0))

    for sigma, epsilon in ((1.0, 1.0), (1.1, 0.7)):
        u_n, p_tail = _tail_closed_forms(0.8442, 2.5, sigma, epsilon)
        du, de, dp, df = differences(dict(sigma=jnp.asarray(sigma), epsilon=jnp.asarray(epsilon)))
        n = len(x)
        assert float(du) / n == pytest.approx(u_n, rel=1e-12, abs=0)
        assert float(de) / n == pytest.approx(u_n, rel=1e-12, abs=0)
        assert float(dp) == pytest.approx(p_tail, rel=1e-12, abs=0)
        assert float(df) == 0.0
        if sigma == 1.0:
            assert p_tail == pytest.approx(-0.76213, abs=1e-5)


def test_tail_correction_is_refused_where_it_does_not_apply():
    space = sp.periodic(10.0)
    with pytest.raises(ValueError, match="shift"):
        sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True, tail_correction=True)
    with pytest.raises(ValueError, match="lennard_jones"):
        sp.pair_energy(sp.wca, space, r_cut=2.5, tail_correction=True)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)
    with pytest.raises(ValueError, match="scalars"):
        energy(jnp.ones((4, 3)), dict(sigma=jnp.ones(4), epsilon=1.0))


# -- constant pressure -------------------------------------------------------------------

def _npt(pressure, n_steps=400, sigma=1.0, compressibility=0.1, throw=False, cells=False):
    """LJ atoms at density 0.7 and T = 1, a fast barostat (tau_p = 0.05), saved every step,
    and a neighbour list checked against all pairs at every update (debug): 108 atoms with
    room for all pairs (one compile for every test), or 256 in 3x3x3 cells (``cells``)."""
    x, box = sp.lattice(4 if cells else 3, 0.7)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=1.8)
    nbrs = sp.neighbor_list(space, x, r_cut=1.8, skin=0.3, debug=True,
                            capacity=None if cells else len(x) - 1)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(x))
    barostat = sp.StochasticCellRescaling(1.0, pressure, 0.1, 0.05, compressibility)
    return sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0),
                       dict(sigma=sigma, epsilon=1.0), space=space, dt=0.004, n_steps=n_steps,
                       save_every=1, integrator=barostat, key=jax.random.key(3), neighbors=nbrs,
                       throw=throw, chunk_steps=400)


def test_neighbour_list_follows_a_shrinking_box():
    """Compressed to P = 5, the box shrinks by ~10% and the list, checked against all pairs
    at every step, misses none (a half-skin rebuild test that ignores the shrinking would)."""
    traj = _npt(5.0)
    box = np.asarray(traj.box)[:, 0]
    assert int(traj.result) == 0
    assert box[-1] < 0.92 * box[0]
    assert int(traj.neighbors.missed_pairs) == 0


@pytest.mark.slow
def test_neighbour_cells_follow_a_shrinking_box():
    """256 atoms in 3x3x3 cells: when the shrinking box makes the cells narrower than
    r_cut + skin, the list is reallocated (fewer cells) and still misses no pair."""
    traj = _npt(5.0, cells=True)
    box = np.asarray(traj.box)[:, 0]
    assert int(traj.result) == 0
    assert box[-1] < 0.92 * box[0]
    assert int(traj.stats["n_reallocations"]) >= 1
    assert int(traj.neighbors.missed_pairs) == 0


def test_box_collapse_is_a_failure():
    """A near-ideal gas (sigma = 0.3) at P = 50 collapses: the run fails with
    UNSTABLE_DYNAMICS at the first step whose box is below twice the cutoff, no atom named."""
    traj = _npt(50.0, sigma=0.3, compressibility=0.01)
    box = np.asarray(traj.box)[:, 0]
    step = int(traj.stats["failed_step"])
    assert traj.status == sl.Result.UNSTABLE_DYNAMICS
    assert int(traj.stats["failed_atom"]) == -1
    assert box[step] < 3.6 <= box[step - 1]
    with pytest.raises(sl.SolverError, match="blew up"):
        _npt(50.0, sigma=0.3, compressibility=0.01, throw=True)


@pytest.mark.slow
def test_lennard_jones_density_matches_the_equation_of_state():
    """256 LJ atoms (r_c = 2.5 with tail corrections) at T = 2 and the pressure that the
    Johnson-Zollweg-Gubbins (1993) equation of state gives at density 0.8: the mean density
    over 7,500 steps (after 2,500) is 0.8 within three block-average standard errors
    (measured: 0.7989 +- 0.0019)."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parents[1] / "validation"))
    from lj_reference import jzg_pressure

    x, box = sp.lattice(4, 0.75)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    v = sp.maxwell_boltzmann(1.0, 2.0, key=jax.random.key(1), n=len(x))
    barostat = sp.StochasticCellRescaling(2.0, jzg_pressure(0.8, 2.0), 0.1, 1.0, 0.1)
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0),
                       dict(sigma=1.0, epsilon=1.0), space=space, dt=0.004, n_steps=10_000,
                       save_every=20, integrator=barostat, key=jax.random.key(3),
                       neighbors=nbrs)
    rho = len(x) / np.asarray(traj.box)[125:, 0] ** 3
    blocks = np.array([b.mean() for b in np.array_split(rho, 10)])
    error = blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert abs(rho.mean() - 0.8) < 3 * error and error < 0.005, (rho.mean(), error)


@pytest.mark.slow
def test_nose_hoover_drift_over_a_hundred_thousand_steps():
    """10^5 steps (dt = 0.001) of 32 soft spheres (smooth at the cutoff): the conserved
    quantity's mean over the last tenth of the run differs from its mean over the first
    tenth by less than 1e-5 per atom (measured at dt = 0.002: 2.3e-5; 0.004: 7.5e-5)."""
    x, box = sp.lattice(2, 0.8)
    space = sp.periodic(box)
    v = sp.maxwell_boltzmann(1.0, KT, key=jax.random.key(1), n=len(x))
    traj = sp.simulate(sp.pair_energy(soft, space, r_cut=1.5),
                       sp.State(x, v - jnp.mean(v, axis=0), 1.0), SOFT, space=space, dt=0.001,
                       n_steps=50 * CHUNK, save_every=10, chunk_steps=CHUNK,
                       integrator=THERMOSTATS["nose_hoover_chain"])
    h = np.asarray(traj.conserved)
    tenth = len(h) // 10
    drift = abs(h[-tenth:].mean() - h[:tenth].mean()) / len(x)
    assert drift < 1e-5, drift


# -- constraints ---------------------------------------------------------------------------

def soft(r, params):
    """A smooth soft sphere, eps (1 - r/sigma)^4 inside sigma (continuous to the 3rd
    derivative at the cutoff), so energy errors are the integrator's alone."""
    return params["epsilon"] * jnp.clip(1.0 - r / params["sigma"], 0.0, None) ** 4


SOFT = dict(sigma=1.5, epsilon=10.0)


def _dimers():
    """8 rigid dimers (bond 1.0, WCA between all atoms) in a periodic box, velocities
    with the bonds' relative velocity along them removed (numpy)."""
    centres = np.asarray(sp.lattice(2, 0.1, kind="cubic")[0])
    rng = np.random.default_rng(0)
    e = rng.normal(size=centres.shape)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    x = np.concatenate([centres - 0.5 * e, centres + 0.5 * e])
    n = len(centres)
    bonds = np.stack([np.arange(n), np.arange(n) + n], axis=1)
    v = rng.normal(size=x.shape)
    v -= v.mean(axis=0)
    along = np.sum((v[:n] - v[n:]) * e, axis=1, keepdims=True) * e    # (v_i - v_j) . e e
    v[:n] -= 0.5 * along
    v[n:] += 0.5 * along
    box = float((n / 0.1) ** (1 / 3))
    return jnp.asarray(x + 0.5), jnp.asarray(v), bonds, box


@pytest.mark.slow
def test_rattle_keeps_bonds_and_conserves_energy():
    """Bond lengths stay 1 to 1e-12 at every saved frame; the total energy's largest
    excursion goes as dt^2 (halving dt divides it by 4)."""
    x, v, bonds, box = _dimers()
    space = sp.periodic(box)
    energy = sp.pair_energy(soft, space, r_cut=1.5)
    excursion = []
    for dt in (0.002, 0.001):
        traj = sp.simulate(energy, sp.State(x, v, 1.0), SOFT,
                           space=space, dt=dt, n_steps=CHUNK, save_every=10,
                           integrator=sp.Rattle(bonds, 1.0), chunk_steps=CHUNK)
        xs = np.asarray(traj.positions)
        d = xs[:, bonds[:, 0]] - xs[:, bonds[:, 1]]
        d -= box * np.round(d / box)
        assert np.max(np.abs(np.linalg.norm(d, axis=-1) - 1.0)) < 1e-12
        vs = np.asarray(traj.velocities)
        rate = np.sum(d * (vs[:, bonds[:, 0]] - vs[:, bonds[:, 1]]), axis=-1)
        assert np.max(np.abs(rate)) < 1e-10
        e = np.asarray(traj.total_energy)
        excursion.append(np.max(np.abs(e - e[0])))
    order = math.log2(excursion[0] / excursion[1])
    assert abs(order - 2.0) < 0.35, (excursion, order)


@pytest.mark.slow
def test_rattle_rigid_rotor_against_the_exact_rotation():
    """A free rigid dimer spinning at omega = 2: the angular momentum stays exact (1e-12),
    and the rotation angle's error per unit time goes as dt^2 against theta = omega t."""
    omega = 2.0
    x = jnp.array([[-0.5, 0.0, 0.0], [0.5, 0.0, 0.0]])
    v = jnp.array([[0.0, -0.5 * omega, 0.0], [0.0, 0.5 * omega, 0.0]])
    no_force = sp.pair_energy(soft, sp.free(), r_cut=0.5)         # the atoms stay 1 apart
    errors = []
    for dt in (0.01, 0.005):
        n_steps = 400
        traj = sp.simulate(no_force, sp.State(x, v, 1.0), dict(sigma=0.5, epsilon=1.0),
                           space=sp.free(), dt=dt, n_steps=n_steps, save_every=100,
                           integrator=sp.Rattle(np.array([[0, 1]]), 1.0))
        spin = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, 1.0))[:, 2]
        assert np.max(np.abs(spin / omega * 2.0 - 1.0)) < 1e-12, spin
        bonds = np.asarray(traj.positions[:, 1] - traj.positions[:, 0])
        assert np.max(np.abs(np.linalg.norm(bonds, axis=-1) - 1.0)) < 1e-12
        bond = np.asarray(traj.positions[-1, 1] - traj.positions[-1, 0])
        theta = np.arctan2(bond[1], bond[0])
        errors.append(abs(np.angle(np.exp(1j * (theta - omega * n_steps * dt)))) / (n_steps * dt))
    order = math.log2(errors[0] / errors[1])
    assert abs(order - 2.0) < 0.2, (errors, order)


@pytest.mark.slow
def test_rattle_failure_to_converge_is_reported():
    """One sweep allowed and a start that breaks the bonds: CONSTRAINTS_NOT_CONVERGED."""
    x, v, bonds, box = _dimers()
    space = sp.periodic(box)
    energy = sp.pair_energy(soft, space, r_cut=1.5)
    traj = sp.simulate(energy, sp.State(x, v, 1.0), SOFT,
                       space=space, dt=0.002, n_steps=10, save_every=10, throw=False,
                       integrator=sp.Rattle(bonds, 1.2, max_iterations=1))
    assert traj.status == sl.Result.CONSTRAINTS_NOT_CONVERGED
    assert int(traj.stats["failed_step"]) == 1
