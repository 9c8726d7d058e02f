"""Rigid water: SETTLE (sp.Settle) and the SPC/E box (sp.spce_water, sp.spce_energy).

References outside simlib: a numpy SHAKE/RATTLE iteration to round-off (the same
constraint equations solved by Gauss-Seidel), the exact conservation laws (constraints,
centre of mass, momentum, energy to O(dt^2)), the gamma law of the kinetic energy under a
thermostat (scipy), and OpenMM's forces and energy on the same SPC/E box (slow, skipped
without openmm).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _native_required import native, same_bits_on_one_and_two_threads

import simlib as sl
from simlib import particles as sp
from simlib.particles._settle import settle_positions
from simlib.particles._water import BOLTZMANN_KJ, COULOMB_KJ_NM

BONDS = ((0, 1), (0, 2), (1, 2))


def _lengths(water):
    return np.array([water.d_oh, water.d_oh, water.d_hh])


def _shake(x_old, x_new, masses, lengths, box):
    """Numpy SHAKE on each molecule (3 atoms), Gauss-Seidel along the old bond vectors,
    iterated to round-off: the reference SETTLE must reproduce."""
    x = x_new.copy()
    for _ in range(60):                    # converged to round-off in ~30 sweeps
        for (i, j), d in zip(BONDS, lengths, strict=True):
            r0 = x_old[i] - x_old[j]
            r0 -= box * np.round(r0 / box)
            s = x[i] - x[j]
            s -= box * np.round(s / box)
            g = (s @ s - d * d) / (2 * (s @ r0) * (1 / masses[i] + 1 / masses[j]))
            x[i] -= g * r0 / masses[i]
            x[j] += g * r0 / masses[j]
    return x


def _rattle(x, v, masses, box):
    """Numpy RATTLE velocity stage, iterated to round-off."""
    v = v.copy()
    for _ in range(400):                   # a rigid triangle converges slowly
        for i, j in BONDS:
            r = x[i] - x[j]
            if box is not None:
                r -= box * np.round(r / box)
            k = r @ (v[i] - v[j]) / ((r @ r) * (1 / masses[i] + 1 / masses[j]))
            v[i] -= k * r / masses[i]
            v[j] += k * r / masses[j]
    return v


@pytest.fixture(scope="module")
def small():
    """8 SPC/E molecules in a small periodic box, some split across its faces."""
    water = sp.spce_water(8)
    return water, sp.periodic(water.box)


def test_settle_positions_solve_the_shake_equations(small):
    """After random drifts (0.005 nm, molecules split by the box faces), SETTLE's positions
    equal a numpy SHAKE iteration to 1e-13 nm, every distance is restored to 1e-14 nm and
    no molecule's centre of mass moves."""
    water, space = small
    rng = np.random.default_rng(0)
    x0 = np.asarray(water.positions) + 0.02          # some atoms cross the faces
    x0 %= water.box
    x1 = x0 + 0.005 * rng.normal(size=x0.shape)
    x, ok = jax.jit(settle_positions, static_argnums=0)(
        space, jnp.asarray(x0), jnp.asarray(x1), water.molecules, water.masses,
        water.d_oh, water.d_hh)
    assert bool(jnp.all(ok))
    x = np.asarray(x)
    m = np.asarray(water.masses)
    for mol in water.molecules:
        ref = _shake(x0[mol], x1[mol], m[mol], _lengths(water), water.box)
        assert np.max(np.abs(x[mol] - ref)) < 1e-13
        for (i, j), d in zip(BONDS, _lengths(water), strict=True):
            r = x[mol[i]] - x[mol[j]]
            r -= water.box * np.round(r / water.box)
            assert abs(np.linalg.norm(r) - d) < 1e-14
        moved = m[mol] @ (x[mol] - x1[mol])
        assert np.max(np.abs(moved)) < 1e-14


def test_settle_velocities_solve_the_rattle_equations(cluster_runs):
    """The velocity stage equals a numpy RATTLE iteration to 1e-12, leaves no relative
    velocity along any constraint and keeps each molecule's momentum."""
    _, water, settle, state = cluster_runs
    rng = np.random.default_rng(1)
    x = np.asarray(state.positions)
    v = rng.normal(size=x.shape)
    out = np.asarray(settle.constrain_velocities(x, v, state.masses))
    m = np.asarray(state.masses)
    for mol in np.asarray(settle.molecules):
        ref = _rattle(x[mol], v[mol], m[mol], None)
        assert np.max(np.abs(out[mol] - ref)) < 1e-12
        for i, j in BONDS:
            r = x[mol[i]] - x[mol[j]]
            assert abs(r @ (out[mol[i]] - out[mol[j]])) < 1e-14
        assert np.max(np.abs(m[mol] @ (out[mol] - v[mol]))) < 1e-13


def test_spce_water_builder():
    """The SPC/E geometry, charges and density; intramolecular exclusions only; no
    intermolecular pair closer than 0.19 nm."""
    water = sp.spce_water(27)
    x = np.asarray(water.positions)
    assert x.shape == (81, 3) and water.molecules.shape == (27, 3)
    assert abs(water.density - 0.997) < 1e-12
    assert abs(float(jnp.sum(water.charges))) < 1e-12
    assert np.allclose(np.asarray(water.charges[:3]), [-0.8476, 0.4238, 0.4238])
    d = x[:, None] - x[None]
    d -= water.box * np.round(d / water.box)
    r = np.linalg.norm(d, axis=-1)
    mol = np.arange(81) // 3
    o, h1, h2 = water.molecules.T
    assert np.allclose(r[o, h1], 0.1, atol=1e-14) and np.allclose(r[o, h2], 0.1, atol=1e-14)
    cos = np.sum(d[h1, o] * d[h2, o], axis=-1) / 0.01
    assert np.allclose(np.degrees(np.arccos(cos)), 109.47, atol=1e-10)
    assert r[mol[:, None] != mol[None]].min() > 0.19
    pairs = {tuple(sorted(p)) for p in water.exclusions.tolist()}
    assert len(pairs) == 81 and all(mol[i] == mol[j] for i, j in pairs)
    with pytest.raises(ValueError, match="n_molecules"):
        sp.spce_water(0)
    with pytest.raises(ValueError, match="density"):
        sp.spce_water(8, density=-1.0)


@pytest.mark.parametrize("density", [5.0, 0.2, 1.6, 0.49])
def test_spce_water_refuses_unphysical_density(density):
    """Issue 41: density=5.0 (g/cm³) was accepted and packed the molecules into each other;
    liquid water is refused outside 0.5 to 1.5 g/cm³, and the ends are accepted."""
    with pytest.raises(ValueError, match=r"density.*0\.5 to 1\.5 g/cm³"):
        sp.spce_water(27, density=density)
    assert abs(sp.spce_water(8, density=0.5).density - 0.5) < 1e-12
    assert abs(sp.spce_water(8, density=1.5).density - 1.5) < 1e-12


def test_settle_refuses_bad_arguments():
    with pytest.raises(ValueError, match="molecules"):
        sp.Settle(np.array([[0, 1]]), 0.1, 0.16)
    with pytest.raises(ValueError, match="distinct"):
        sp.Settle(np.array([[0, 1, 2], [2, 3, 4]]), 0.1, 0.16)
    with pytest.raises(ValueError, match="d_oh"):
        sp.Settle(np.array([[0, 1, 2]]), -0.1, 0.16)
    with pytest.raises(ValueError, match="triangle"):
        sp.Settle(np.array([[0, 1, 2]]), 0.1, 0.25)
    with pytest.raises(TypeError, match="thermostat"):
        sp.Settle(np.array([[0, 1, 2]]), 0.1, 0.16, thermostat=sp.NVE())


# A cluster of 4 SPC/E molecules in free space, Lennard-Jones + Coulomb over all pairs (the
# intramolecular pairs only add constant energy and forces along the constraints).
@pytest.fixture(scope="module")
def cluster_runs():
    water = sp.spce_water(8)
    x = np.asarray(water.positions)[:12]
    x = x - x.mean(axis=0)
    masses = water.masses[:12]
    params = dict(sigma=water.sigma[:12], epsilon=water.epsilon[:12],
                  charges=water.charges[:12], k=COULOMB_KJ_NM)
    energy = (sp.pair_energy(sp.lennard_jones, sp.free())
              + sp.pair_energy(sp.coulomb, sp.free()))
    settle = sp.Settle(water.molecules[:4], water.d_oh, water.d_hh)
    rng = np.random.default_rng(3)
    v = rng.normal(size=x.shape) * np.sqrt(BOLTZMANN_KJ * 300 / np.asarray(masses))[:, None]
    v = settle.constrain_velocities(x, v - v.mean(axis=0), masses)
    state = sp.State(jnp.asarray(x), v, masses)

    def run(dt, n_steps=400, throw=True):
        return sp.simulate(energy, state, params, space=sp.free(), dt=dt, n_steps=n_steps,
                           save_every=20, integrator=settle, throw=throw)
    return run, water, settle, state


@pytest.mark.slow
def test_settle_nve_keeps_constraints_and_conserves_energy(cluster_runs):
    """Rigid to 1e-14 nm at every frame, no relative velocity along the constraints, the
    momentum kept, and the total energy's largest excursion goes as dt^2."""
    run, water, _, _ = cluster_runs
    excursion = []
    for dt in (0.002, 0.001):
        traj = run(dt)
        x, v = np.asarray(traj.positions), np.asarray(traj.velocities)
        for mol in water.molecules[:4]:
            for (i, j), d in zip(BONDS, _lengths(water), strict=True):
                r = x[:, mol[i]] - x[:, mol[j]]
                assert np.max(np.abs(np.linalg.norm(r, axis=-1) - d)) < 1e-14
                rate = np.sum(r * (v[:, mol[i]] - v[:, mol[j]]), axis=-1)
                assert np.max(np.abs(rate)) < 1e-12
        p = np.asarray(sp.total_momentum(traj.velocities, water.masses[:12]))
        assert np.max(np.abs(p - p[0])) < 1e-12 * np.max(np.abs(p[0]))
        e = np.asarray(traj.total_energy)
        excursion.append(np.max(np.abs(e - e[0])))
    order = math.log2(excursion[0] / excursion[1])
    assert abs(order - 2.0) < 0.3, (excursion, order)


@pytest.fixture(scope="module")
def three_settle_steps(cluster_runs):
    """Three SETTLE steps of 2 fs of the 4-molecule cluster, every step saved: the largest
    ``| |r_ij| - d |`` and the largest ``|r_ij . v_ij|`` (half the rate of change of
    ``|r_ij|^2``) over the cluster's bonds and the frames after the start. The cheap
    siblings of the slow NVE test check them against its bounds."""
    _, water, settle, state = cluster_runs
    energy = (sp.pair_energy(sp.lennard_jones, sp.free())
              + sp.pair_energy(sp.coulomb, sp.free()))
    params = dict(sigma=water.sigma[:12], epsilon=water.epsilon[:12],
                  charges=water.charges[:12], k=COULOMB_KJ_NM)
    traj = sp.simulate(energy, state, params, space=sp.free(), dt=0.002, n_steps=3,
                       save_every=1, integrator=settle)
    x, v = np.asarray(traj.positions)[1:], np.asarray(traj.velocities)[1:]
    length, rate = 0.0, 0.0
    for mol in water.molecules[:4]:
        for (i, j), d in zip(BONDS, _lengths(water), strict=True):
            r = x[:, mol[i]] - x[:, mol[j]]
            length = max(length, np.max(np.abs(np.linalg.norm(r, axis=-1) - d)))
            rate = max(rate, np.max(np.abs(np.sum(r * (v[:, mol[i]] - v[:, mol[j]]), -1))))
    return length, rate


def test_settle_steps_keep_the_bond_lengths(three_settle_steps):
    """After each SETTLE step every O-H and H-H distance is d_oh, d_hh to 1e-14 nm
    (measured 4e-17). Guards Settle.step against skipping its position stage
    (settle_positions): the unconstrained drift leaves the bonds 0.05 nm off."""
    length, _ = three_settle_steps
    assert length < 1e-14, length


def test_settle_steps_leave_no_velocity_along_the_bonds(three_settle_steps):
    """After each SETTLE step no bond length changes: d|r_ij|^2/dt = 2 r_ij . v_ij = 0 to
    1e-12 nm^2/ps (measured 8e-16). Guards Settle.step against skipping its velocity
    stage (settle_velocities): the second half kick leaves r . v = 1 nm^2/ps."""
    _, rate = three_settle_steps
    assert rate < 1e-12, rate


@pytest.mark.slow
def test_settle_failure_is_reported(cluster_runs):
    """A step far too long for the molecules (0.2 ps): Result.SETTLE_FAILED, not a quiet
    wrong geometry; eagerly, and under jit and vmap."""
    run, *_ = cluster_runs
    traj = run(0.2, throw=False)
    assert traj.result == sl.Result.SETTLE_FAILED, sl.Result(int(traj.result))
    # the same traced, one member of a vmap failing
    codes = jax.jit(jax.vmap(lambda dt: run(dt, n_steps=40, throw=False).result))(
        jnp.array([0.001, 0.2]))
    assert codes.tolist() == [0, sl.Result.SETTLE_FAILED]


# ----------------------------------------------------------------------------------------
# slow: SPC/E boxes with PME


def _box(n_molecules, r_cut, tolerance=1e-6, grid=24, shift=True):
    """A small SPC/E box; LJ shifted, real-space Coulomb small at the cutoff (alpha from
    1e-6) and a coarse PME grid for the dynamics tests (the
    forces are the exact gradient of the energy at any grid, so it is conserved)."""
    water = sp.spce_water(n_molecules)
    space = sp.periodic(water.box)
    energy = sp.spce_energy(water, r_cut, tolerance=tolerance, grid=grid, shift=shift)
    return water, space, energy


@pytest.mark.slow
def test_settle_agrees_with_rattle_and_conserves_energy_in_an_spce_box():
    """27 SPC/E molecules with PME (float64): Settle and Rattle (three rigid bonds a
    molecule, tolerance 1e-13) follow the same trajectory to 1e-9 nm over 100 steps; over
    1,000 steps of 1 fs from the melting lattice the constraints hold to 1e-13 nm, the
    total energy fluctuates by less than 0.01 kJ/mol per molecule (0.4% of kT) and
    drifts by less than 1e-3."""
    water, space, energy = _box(27, 0.45)
    masses = water.masses
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh)
    v = sp.maxwell_boltzmann(masses, BOLTZMANN_KJ * 300, key=jax.random.key(0))
    state = sp.State(water.positions, settle.constrain_velocities(water.positions, v, masses,
                                                                    space), masses)
    bonds = np.concatenate([water.molecules[:, [0, 1]], water.molecules[:, [0, 2]],
                            water.molecules[:, [1, 2]]])
    lengths = np.repeat(_lengths(water), len(water.molecules))
    common = dict(space=space, dt=0.001, n_steps=100, save_every=10)
    a = sp.simulate(energy, state, water.params, integrator=settle, **common)
    b = sp.simulate(energy, state, water.params, integrator=sp.Rattle(bonds, lengths),
                    **common)
    diff = np.asarray(space.displacement(a.positions, b.positions))
    assert np.max(np.abs(diff)) < 1e-9, np.max(np.abs(diff))
    traj = sp.simulate(energy, a.final, water.params, integrator=settle, space=space,
                       dt=0.001, n_steps=1000, save_every=100)
    x = np.asarray(traj.positions)
    for (i, j), d in zip(BONDS, _lengths(water), strict=True):
        r = np.asarray(space.displacement(x[:, water.molecules[:, i]],
                                          x[:, water.molecules[:, j]]))
        assert np.max(np.abs(np.linalg.norm(r, axis=-1) - d)) < 1e-13
    e = np.asarray(traj.total_energy) / 27
    assert np.max(np.abs(e - e[0])) < 1e-2, np.max(np.abs(e - e[0]))    # measured 7.3e-3
    assert abs(e[-1] - e[0]) < 1e-3, e[-1] - e[0]                       # measured 4e-5


@pytest.mark.slow
@pytest.mark.parametrize("thermostat", ["bussi", "nose-hoover"])
def test_settle_with_a_thermostat_samples_the_canonical_kinetic_energy(thermostat):
    """27 rigid SPC/E molecules at 300 K: the kinetic energy follows the gamma law of
    shape N_f/2 with N_f = 6w - 3 (a KS test, scipy), and the conserved quantity stays
    within 0.05 kJ/mol per molecule."""
    from scipy import stats

    water, space, energy = _box(27, 0.45)
    kT = BOLTZMANN_KJ * 300
    th = sp.Bussi(kT, 0.05) if thermostat == "bussi" else sp.NoseHooverChain(kT, 0.05)
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh, thermostat=th)
    v = sp.maxwell_boltzmann(water.masses, kT, key=jax.random.key(1))
    v = settle.constrain_velocities(water.positions, v, water.masses, space)
    state = sp.State(water.positions, v, water.masses)
    key = jax.random.key(2)
    eq = sp.simulate(energy, state, water.params, integrator=settle, space=space,
                     dt=0.002, n_steps=1000, save_every=100, key=key)
    traj = sp.simulate(energy, eq.final, water.params, integrator=settle, space=space,
                       dt=0.002, n_steps=8000, save_every=40, key=jax.random.key(3))
    nf = 6 * 27 - 3
    k = np.asarray(traj.kinetic_energy)[1:]                  # 200 frames, 0.08 ps apart
    p = stats.kstest(k, stats.gamma(nf / 2, scale=kT).cdf).pvalue
    assert p > 1e-3, p
    c = np.asarray(traj.conserved) / 27
    assert np.max(np.abs(c - c[0])) < 0.05, np.max(np.abs(c - c[0]))


def _openmm_spce(water, r_cut, alpha, grid):
    import openmm as mm

    system = mm.System()
    force = mm.NonbondedForce()
    for m, q, s, e in zip(*(np.asarray(a) for a in (water.masses, water.charges,
                                                    water.sigma, water.epsilon)), strict=True):
        system.addParticle(float(m))
        force.addParticle(float(q), float(s) if e > 0 else 1.0, float(e))
    for i, j in water.exclusions:
        force.addException(int(i), int(j), 0.0, 1.0, 0.0)
    L = water.box
    system.setDefaultPeriodicBoxVectors(mm.Vec3(L, 0, 0), mm.Vec3(0, L, 0), mm.Vec3(0, 0, L))
    force.setNonbondedMethod(mm.NonbondedForce.PME)
    force.setCutoffDistance(r_cut)
    force.setPMEParameters(alpha, *grid)
    force.setUseDispersionCorrection(False)
    force.setUseSwitchingFunction(False)
    system.addForce(force)
    context = mm.Context(system, mm.VerletIntegrator(1e-3),
                         mm.Platform.getPlatformByName("Reference"))
    context.setPositions([mm.Vec3(*map(float, r)) for r in np.asarray(water.positions)])
    state = context.getState(getEnergy=True, getForces=True)
    return (state.getPotentialEnergy()._value,
            np.asarray(state.getForces(asNumpy=True)._value))


@pytest.mark.slow
def test_spce_box_matches_openmm():
    """216 SPC/E molecules (randomly oriented on the lattice), PME with the same alpha, grid,
    order 5 and cutoff 0.9 nm, LJ plainly truncated: OpenMM's reference platform gives the
    same energy to 1e-9 and forces to 1e-5 relative (RMS)."""
    pytest.importorskip("openmm")
    water = sp.spce_water(216, key=jax.random.key(4))      # random orientations
    energy = sp.spce_energy(water, 0.9, tolerance=1e-6)
    coulomb = energy.terms[1]
    e0, f0 = _openmm_spce(water, 0.9, float(coulomb.alpha), coulomb.grid)
    e, f = energy.energy_and_forces(water.positions, water.params)
    f = np.asarray(f)
    assert abs(float(e) - e0) < 1e-9 * abs(e0), (float(e), e0)
    rel = np.sqrt(np.mean((f - f0) ** 2)) / np.sqrt(np.mean(f0 ** 2))
    assert rel < 1e-5, rel


def test_mixing_gradient_with_zero_epsilon_is_finite():
    """A hydrogen without Lennard-Jones (epsilon 0): the mixed epsilon of a pair and its
    derivative are 0, not nan (sqrt's derivative at 0); a negative product stays nan."""
    from simlib.particles._mixing import geometric_mean

    g = jax.grad(lambda s: geometric_mean(0.65 * s, 0.0 * s))(1.0)
    assert float(g) == 0.0
    assert float(jax.grad(lambda s: geometric_mean(0.65 * s, 0.65 * s))(2.0)) == 0.65
    assert math.isnan(float(geometric_mean(-1.0, 1.0)))


@pytest.mark.slow
def test_gradient_through_settle_matches_finite_differences(cluster_runs):
    """d U(t) / d (epsilon scale) after 50 SETTLE steps: reverse mode through the whole
    run against a central difference, to 1e-6 relative."""
    _, water, settle, state = cluster_runs
    energy = (sp.pair_energy(sp.lennard_jones, sp.free())
              + sp.pair_energy(sp.coulomb, sp.free()))

    def final_energy(scale):
        p = dict(sigma=water.sigma[:12], epsilon=water.epsilon[:12] * scale,
                 charges=water.charges[:12], k=COULOMB_KJ_NM)
        traj = sp.simulate(energy, state, p, space=sp.free(), dt=0.001, n_steps=50,
                           integrator=settle)
        return traj.potential_energy[-1]

    h = 1e-5
    fd = (final_energy(1.0 + h) - final_energy(1.0 - h)) / (2 * h)
    g = jax.grad(final_energy)(1.0)
    assert abs(float(g) - float(fd)) < 1e-6 * abs(float(fd)), (float(g), float(fd))


def test_pressure_tensor_of_water_is_nan_where_pme_gives_no_value():
    """PME's virial is known on the diagonal only: the water pressure tensor's diagonal is
    the pair tensor's diagonal plus PME's (its trace over 3 is the pressure), its
    off-diagonal entries are NaN, never the pair terms with PME's diagonal broadcast onto
    them (the defect this guards against)."""
    water = sp.spce_water(27)
    energy = sp.spce_energy(water, 0.45, tolerance=1e-4)
    v = sp.maxwell_boltzmann(water.masses, 2.5, key=jax.random.key(0))
    p = sp.pressure_tensor(energy, water.positions, v, water.masses, water.params)
    lj, pme = energy.terms
    m = np.asarray(water.masses)[:, None]
    kinetic = np.einsum("na,nb->ab", m * np.asarray(v), np.asarray(v))
    expected = (np.diag(kinetic) + np.diagonal(lj.virial_tensor(water.positions, water.params))
                + np.asarray(pme.virial_tensor(water.positions, water.params))) / water.box**3
    np.testing.assert_allclose(np.diagonal(p), expected, rtol=1e-12)
    assert np.all(np.isnan(np.asarray(p)[~np.eye(3, dtype=bool)]))
    scalar = sp.pressure(energy, water.positions, v, water.masses, water.params)
    assert abs(float(np.trace(p)) / 3 - float(scalar)) < 1e-10 * abs(float(scalar))


def _ffi_targets(fn, *args):
    """The native kernels (FFI custom calls) in ``fn``'s compiled CPU program."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    return {name for name in ("simlib_ewald_lj_f64", "simlib_ewald_f64", "simlib_lj_f64")
            if f'"{name}"' in text}


def _fused_and_apart(shift=False):
    """64 molecules with a neighbour list: spce_energy and its terms summed apart."""
    from simlib.particles._energy import SumEnergy

    water = sp.spce_water(64, key=jax.random.key(5))
    nbrs = sp.neighbor_list(sp.periodic(water.box), water.positions, r_cut=0.5, skin=0.1)
    energy = sp.spce_energy(water, 0.5, tolerance=1e-4, shift=shift)
    return water, nbrs, energy, SumEnergy(energy.terms)


@native
@pytest.mark.parametrize("shift", [pytest.param(False, marks=pytest.mark.slow), True])
def test_spce_forces_take_one_fused_pair_pass_equal_to_the_terms_apart(shift):
    """Mechanism: with a neighbour list, spce_energy's forces run one native pass for the
    Lennard-Jones and real-space Coulomb pairs (``simlib_ewald_lj``, no separate LJ or Ewald
    kernel), and its energy and forces equal the two terms summed apart (each checked
    against OpenMM and the pure-JAX sums elsewhere) to round-off."""
    water, nbrs, energy, apart = _fused_and_apart(shift)
    x, p = water.positions, water.params
    assert _ffi_targets(lambda x: energy.energy_and_forces(x, p, nbrs), x) == {
        "simlib_ewald_lj_f64"}
    # the energy as a traced argument, as simulate passes it (one box leaf for both terms)
    assert _ffi_targets(lambda e, x: e.energy_and_forces(x, p, nbrs), energy, x) == {
        "simlib_ewald_lj_f64"}
    assert _ffi_targets(lambda x: apart.energy_and_forces(x, p, nbrs), x) == {
        "simlib_ewald_f64", "simlib_lj_f64"}
    e1, f1 = energy.energy_and_forces(x, p, nbrs)
    e0, f0 = apart.energy_and_forces(x, p, nbrs)
    assert abs(float(e1 - e0)) < 1e-12 * abs(float(e0))
    assert float(jnp.max(jnp.abs(f1 - f0))) < 1e-12 * float(jnp.max(jnp.abs(f0)))


@pytest.mark.slow
@native
def test_fused_water_pass_has_the_gradients_of_the_terms_apart():
    """Gradients of the fused pass's energy with respect to positions, charges, sigma and
    epsilon are those of the terms apart (its custom JVP differentiates them)."""
    water, nbrs, energy, apart = _fused_and_apart()

    def total(e):
        return lambda x, p: e.energy_and_forces(x, p, nbrs)[0]

    g1 = jax.grad(total(energy), argnums=(0, 1))(water.positions, water.params)
    g0 = jax.grad(total(apart), argnums=(0, 1))(water.positions, water.params)
    for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0), strict=True):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-10 * (1 + float(jnp.max(jnp.abs(b))))


@pytest.mark.slow
@native
def test_spce_box_with_a_neighbour_list_matches_openmm():
    """As test_spce_box_matches_openmm, through a neighbour list (the fused native pass of
    Lennard-Jones and real-space Coulomb): OpenMM's reference platform gives the same
    energy to 1e-9 and forces to 1e-5 relative (RMS)."""
    pytest.importorskip("openmm")
    water = sp.spce_water(216, key=jax.random.key(4))
    energy = sp.spce_energy(water, 0.9, tolerance=1e-6)
    coulomb = energy.terms[1]
    nbrs = sp.neighbor_list(sp.periodic(water.box), water.positions, r_cut=0.9, skin=0.02)
    e0, f0 = _openmm_spce(water, 0.9, float(coulomb.alpha), coulomb.grid)
    e, f = energy.energy_and_forces(water.positions, water.params, nbrs)
    f = np.asarray(f)
    assert abs(float(e) - e0) < 1e-9 * abs(e0), (float(e), e0)
    rel = np.sqrt(np.mean((f - f0) ** 2)) / np.sqrt(np.mean(f0 ** 2))
    assert rel < 1e-5, rel


@pytest.mark.slow
@native
def test_fused_water_pass_is_deterministic_across_thread_counts(tmp_path):
    """The fused pass adds each pair's reaction into fixed blocks' buffers summed in block
    order: one and two OpenMP threads give the same bits (energy and forces)."""
    same_bits_on_one_and_two_threads(_FUSED_THREADS_SCRIPT, tmp_path)


_FUSED_THREADS_SCRIPT = """
import sys
import jax, numpy as np
from simlib import particles as sp
from simlib.particles import _native
assert _native.load() is not None
water = sp.spce_water(125, key=jax.random.key(6))
nbrs = sp.neighbor_list(sp.periodic(water.box), water.positions, r_cut=0.6, skin=0.1)
energy = sp.spce_energy(water, 0.6, tolerance=1e-4)
e, f = energy.energy_and_forces(water.positions, water.params, nbrs)
np.save(sys.argv[1], np.concatenate([np.ravel(e), np.ravel(f)]))
"""


_FUSED_EXTREMES_SCRIPT = """
import sys
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
from simlib import particles as sp
from simlib.particles._energy import SumEnergy

water = sp.spce_water(64, key=jax.random.key(5))
nbrs = sp.neighbor_list(sp.periodic(water.box), water.positions, r_cut=0.5, skin=0.1)
energy = sp.spce_energy(water, 0.5, tolerance=1e-4)
apart = SumEnergy(energy.terms)
x = np.asarray(water.positions)
cases = dict(normal=x.copy(), nan=x.copy(), inf=x.copy(), overlap=x.copy(), huge=x.copy())
cases["nan"][7, 1] = np.nan
cases["inf"][11, 0] = np.inf
cases["overlap"][3] = cases["overlap"][30]        # atoms of two molecules on one point
cases["huge"][20] = [1e30, -1e30, 1e30]
# a list built with the overlap in it (the others use the list of the unspoilt positions)
overlap_nbrs = sp.neighbor_list(sp.periodic(water.box), cases["overlap"], r_cut=0.5, skin=0.1)
out = {}
for name, y in cases.items():
    for label, e in (("fused", energy), ("apart", apart)):
        u, f = e.energy_and_forces(y, water.params, overlap_nbrs if name == "overlap" else nbrs)
        out[f"{name}_{label}_u"] = np.asarray(u)
        out[f"{name}_{label}_f"] = np.asarray(f)
try:
    sp.spce_energy(sp.spce_water(0), 0.5, tolerance=1e-4)
    out["empty"] = "no error"
except Exception as err:
    out["empty"] = f"{type(err).__name__}: {err}"
np.savez(sys.argv[1], **out)
"""


@pytest.mark.slow
@native
def test_fused_water_pass_survives_extreme_positions(tmp_path):
    """NaN, inf, overlapping and huge positions through the fused native pass, in a
    subprocess: no crash; rows of forces finite where the two kernels apart give finite
    ones (and equal to them), non-finite where they do; the energy likewise."""
    import subprocess
    import sys

    path = tmp_path / "extremes.npz"
    run = subprocess.run([sys.executable, "-c", _FUSED_EXTREMES_SCRIPT, str(path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = np.load(path)
    for name in ("normal", "nan", "inf", "overlap", "huge"):
        u1, u0 = float(out[f"{name}_fused_u"]), float(out[f"{name}_apart_u"])
        f1, f0 = out[f"{name}_fused_f"], out[f"{name}_apart_f"]
        assert np.isfinite(u1) == np.isfinite(u0), name
        if np.isfinite(u0):
            assert abs(u1 - u0) <= 1e-10 * abs(u0), name
        ok = np.all(np.isfinite(f0), axis=1)
        np.testing.assert_array_equal(np.all(np.isfinite(f1), axis=1), ok, err_msg=name)
        scale = np.max(np.abs(f0[ok]), initial=1.0)
        assert np.max(np.abs(f1[ok] - f0[ok]), initial=0.0) <= 1e-10 * scale, name
    assert not np.isfinite(float(out["nan_fused_u"]))
    assert not np.isfinite(float(out["overlap_fused_u"]))
    assert "Error" in str(out["empty"]), str(out["empty"])
