"""Constant pressure beyond atoms: the molecular pressure, stochastic cell rescaling with
rigid water (SETTLE), orthorhombic cells, and the barostat's effective energy.

References outside simlib: numpy pair sums of the Lennard-Jones forces and of the atomic
and molecular virials (Allen & Tildesley 2017, §2.12), the constraint forces of rigid
dimers solved in numpy from the equations of motion (the atomic pressure with the
constraint virial equals the molecular pressure at every instant, a theorem), central
finite differences of the energy under centre-of-mass scaling, the exact conservation of
the constraints, the effective energy's conservation as dt -> 0 (Bernetti & Bussi 2020),
the Johnson-Zollweg-Gubbins equation of state, and the cubic symmetry of an fcc crystal.
"""

import math
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib import particles as sp
from simlib.particles import _simulate

LJ = dict(sigma=1.0, epsilon=1.0)


def _dimers(seed=0, n=8, density=0.1):
    """``n`` rigid dimers (bond 1.0) on a cubic lattice with random orientations, masses
    1 and 3, velocities with each bond's relative velocity along it removed."""
    centres = np.asarray(sp.lattice(2, density, kind="cubic")[0])[:n]
    rng = np.random.default_rng(seed)
    e = rng.normal(size=centres.shape)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    x = np.concatenate([centres - 0.75 * e, centres + 0.25 * e])      # COM at the centre
    masses = np.concatenate([np.ones(n), 3.0 * np.ones(n)])
    bonds = np.stack([np.arange(n), np.arange(n) + n], axis=1)
    v = rng.normal(size=x.shape)
    rel = np.sum((v[n:] - v[:n]) * e, axis=1, keepdims=True) * e     # along the bond
    w1, w2 = 1.0 / masses[:n, None], 1.0 / masses[n:, None]
    v[:n] += rel * w1 / (w1 + w2)
    v[n:] -= rel * w2 / (w1 + w2)
    box = float((n / density) ** (1 / 3))
    return x + 0.5, v, masses, bonds, box


def _numpy_lj(x, box, r_cut):
    """Numpy Lennard-Jones pair forces: the list of ``(i, j, r_ij, f_ij)`` (``r_ij``
    the minimum image of ``x_i - x_j``, ``f_ij`` the force on i from j) and the forces."""
    pairs, f = [], np.zeros_like(x)
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            r = x[i] - x[j]
            r -= box * np.round(r / box)
            d = np.linalg.norm(r)
            if d < r_cut:
                fij = (48 * d**-14 - 24 * d**-8) * r
                pairs.append((i, j, r, fij))
                f[i] += fij
                f[j] -= fij
    return pairs, f


def _offsets(x, masses, bonds, box):
    """Each atom's offset from its dimer's centre of mass (numpy)."""
    d = np.zeros_like(x)
    for i, j in bonds:
        r = x[j] - x[i]
        r -= box * np.round(r / box)
        mi, mj = masses[i], masses[j]
        d[i] = -mj / (mi + mj) * r
        d[j] = mi / (mi + mj) * r
    return d


def test_molecular_pressure_tensor_matches_a_numpy_pair_sum():
    """The diagonal of the atomic and the molecular pressure tensors of 8 Lennard-Jones
    dimers against numpy: sum_i m v_a^2 + sum_{i<j} r_a f_a, and sum_I M V_a^2 +
    sum_{i<j} R_IJ,a f_ij,a with R_IJ = r_ij - d_i + d_j (Allen & Tildesley 2017,
    eq. 2.131); both to 1e-12 relative, and the traces over 3 for the scalars."""
    x, v, masses, bonds, box = _dimers()
    r_cut = 2.0
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=r_cut)
    pairs, _ = _numpy_lj(x, box, r_cut)
    d = _offsets(x, masses, bonds, box)
    w_atom = sum(r * f for _, _, r, f in pairs)
    w_mol = sum((r - d[i] + d[j]) * f for i, j, r, f in pairs)
    n = len(bonds)
    vc = np.zeros_like(v)
    for i, j in bonds:
        vc[i] = vc[j] = (masses[i] * v[i] + masses[j] * v[j]) / (masses[i] + masses[j])
    volume = box**3
    atomic = (np.sum(masses[:, None] * v * v, axis=0) + w_atom) / volume
    molecular = (np.sum(masses[:, None] * vc * vc, axis=0) + w_mol) / volume
    args = (energy, jnp.asarray(x), jnp.asarray(v), jnp.asarray(masses), LJ)
    got_atomic = sp.molecular_pressure(*args, None, diagonal=True)
    got_mol = sp.molecular_pressure(*args, bonds, diagonal=True)
    np.testing.assert_allclose(got_atomic, atomic, rtol=1e-12)
    np.testing.assert_allclose(got_mol, molecular, rtol=1e-12)
    np.testing.assert_allclose(sp.molecular_pressure(*args, bonds), molecular.mean(),
                               rtol=1e-12)
    np.testing.assert_allclose(sp.molecular_pressure(*args, None), atomic.mean(), rtol=1e-12)
    assert n == 8 and abs(molecular.mean() - atomic.mean()) > 1e-3 * abs(atomic.mean())


def test_molecular_pressure_is_the_atomic_pressure_with_the_constraint_virial():
    """Rigid dimers: with the constraint forces g solved in numpy from the equations of
    motion (each bond's second derivative zero: lambda |r|^2 (1/m_i + 1/m_j) = -|r'|^2 -
    r . (f_j/m_j - f_i/m_i)), the atomic pressure (2K + W + sum_i x_i . g_i) / 3V equals
    the molecular pressure at every instant (for rigid molecules sum_i m_i d_i . d_i' = 0
    identically); to 1e-11, for three configurations."""
    for seed in range(3):
        x, v, masses, bonds, box = _dimers(seed)
        r_cut = 2.0
        pairs, f = _numpy_lj(x, box, r_cut)
        w = sum(r @ fij for _, _, r, fij in pairs)
        w_c = 0.0
        for i, j in bonds:
            r = x[j] - x[i]
            r -= box * np.round(r / box)
            rdot = v[j] - v[i]
            lam = (-(rdot @ rdot) - r @ (f[j] / masses[j] - f[i] / masses[i])) / (
                (r @ r) * (1 / masses[i] + 1 / masses[j]))
            w_c += lam * (r @ r)                       # x_j . (lam r) + x_i . (-lam r)
        atomic = (np.sum(masses[:, None] * v * v) + w + w_c) / (3 * box**3)
        energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=r_cut)
        got = sp.molecular_pressure(energy, jnp.asarray(x), jnp.asarray(v),
                                    jnp.asarray(masses), LJ, bonds)
        assert abs(float(got) - atomic) < 1e-11 * abs(atomic), (float(got), atomic)


def test_bad_molecules_and_cells_are_refused():
    x, v, masses, bonds, box = _dimers()
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=2.0)
    with pytest.raises(ValueError, match="two molecules"):
        sp.molecular_pressure(energy, x, v, masses, LJ, np.array([[0, 8], [8, 1]]))
    with pytest.raises(ValueError, match=r"\[0, 16\)"):
        sp.molecular_pressure(energy, x, v, masses, LJ, np.array([[0, 16]]))
    with pytest.raises(TypeError, match="Settle or a Rattle"):
        sp.StochasticCellRescaling(1.0, 1.0, 0.1, 1.0, 0.1, constraints=sp.Bussi(1.0, 0.1))
    settle = sp.Settle(np.arange(3)[None], 0.1, 0.16, thermostat=sp.Bussi(1.0, 0.1))
    with pytest.raises(ValueError, match="no thermostat"):
        sp.StochasticCellRescaling(1.0, 1.0, 0.1, 1.0, 0.1, constraints=settle)
    aniso = sp.StochasticCellRescaling(1.0, 1.0, 0.1, 1.0, 0.1, anisotropic=True)
    with pytest.raises(ValueError, match="three sides"):
        sp.simulate(energy, sp.State(x, v, masses), LJ, space=energy.space, dt=0.001,
                    n_steps=1, integrator=aniso, key=jax.random.key(0))


# -- rigid water under the barostat --------------------------------------------------------

def _water_energy(water, box, grid=16):
    """SPC/E in ``box`` (a scalar or (3,)), PME with a fixed alpha and grid."""
    return sp.spce_energy(water._replace(box=box), 0.4, tolerance=1e-4, alpha=7.0, grid=grid)


@pytest.mark.slow
def test_molecular_virial_is_the_energy_derivative_under_centre_of_mass_scaling():
    """27 SPC/E molecules (PME): W^mol_aa = -dU/d ln L_a with every centre of mass and the
    box side a scaled and the molecules rigid, by central differences (h = 1e-5) of the
    energy, for each side and for the three together; to 1e-6 relative."""
    water = sp.spce_water(27, key=jax.random.key(4))
    x = np.asarray(water.positions)
    masses = np.asarray(water.masses)
    box = water.box
    com = np.zeros_like(x)
    for mol in water.molecules:
        r = x[mol] - x[mol[0]]
        r -= box * np.round(r / box)
        com[mol] = x[mol[0]] + masses[mol] @ r / masses[mol].sum()
    d = x - com

    def u(scale):
        b = box * np.asarray(scale)
        return float(_water_energy(water, b)(jnp.asarray(com * scale + d), water.params))

    h = 1e-5
    fd = []
    for a in range(3):
        up, down = np.ones(3), np.ones(3)
        up[a], down[a] = math.exp(h), math.exp(-h)
        fd.append(-(u(up) - u(down)) / (2 * h))
    energy = _water_energy(water, box)
    zero = jnp.zeros_like(water.positions)
    volume = box**3
    diag = sp.molecular_pressure(energy, water.positions, zero, water.masses, water.params,
                                 water.molecules, diagonal=True) * volume
    np.testing.assert_allclose(diag, fd, rtol=1e-6)
    scalar = sp.molecular_pressure(energy, water.positions, zero, water.masses, water.params,
                                   water.molecules) * 3 * volume
    fd_all = -(u(math.exp(h)) - u(math.exp(-h))) / (2 * h)
    np.testing.assert_allclose(float(scalar), fd_all, rtol=1e-6)


def _water_npt(n_steps, rattle=False, **kwargs):
    water = sp.spce_water(27)
    space = sp.periodic(water.box)
    energy = _water_energy(water, water.box)
    kT = 0.00831446261815324 * 300
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh)
    v = settle.constrain_velocities(
        water.positions, sp.maxwell_boltzmann(water.masses, kT, key=jax.random.key(0)),
        water.masses, space)
    if rattle:
        bonds = np.concatenate([water.molecules[:, [0, 1]], water.molecules[:, [0, 2]],
                                water.molecules[:, [1, 2]]])
        lengths = np.repeat([water.d_oh, water.d_oh, water.d_hh], 27)
        constraints = sp.Rattle(bonds, jnp.asarray(lengths))
    else:
        constraints = settle
    barostat = sp.StochasticCellRescaling(kT, 0.0602, 0.1, 0.2, 0.01, constraints=constraints)
    nbrs = sp.neighbor_list(space, water.positions, r_cut=0.4, skin=0.05, capacity=80)
    traj = sp.simulate(energy, sp.State(water.positions, v, water.masses), water.params,
                       space=space, dt=0.001, n_steps=n_steps, save_every=5, chunk_steps=20,
                       integrator=barostat, key=jax.random.key(1), neighbors=nbrs, **kwargs)
    return water, traj


@pytest.mark.slow
def test_water_stays_rigid_as_the_box_moves_and_resumes_bit_for_bit(tmp_path, monkeypatch):
    """27 SPC/E molecules, PME, a fast barostat (compressibility 0.01 nm^3 mol/kJ, 13
    times water's) from the lattice: the box changes by over 1% (5%) while every O-H and
    H-H distance stays exact to 1e-12 nm at every frame, and a run stopped after its
    first chunk and resumed from the checkpoint ends bit for bit where an uninterrupted
    one does."""
    water, reference = _water_npt(40)
    assert int(reference.result) == 0
    boxes = np.asarray(reference.box)[:, 0]
    assert np.ptp(boxes) > 0.01 * boxes[0], boxes
    x = np.asarray(reference.positions)
    for frame, box in zip(x, np.asarray(reference.box), strict=True):
        for (i, j), length in zip(((0, 1), (0, 2), (1, 2)),
                                  (water.d_oh, water.d_oh, water.d_hh), strict=True):
            r = frame[water.molecules[:, i]] - frame[water.molecules[:, j]]
            r -= box * np.round(r / box)
            assert np.max(np.abs(np.linalg.norm(r, axis=1) - length)) < 1e-12
    path = tmp_path / "water.npz"
    original, calls = _simulate._frames_jit, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(*args)

    monkeypatch.setattr(_simulate, "_frames_jit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _water_npt(40, checkpoint=path)
    monkeypatch.setattr(_simulate, "_frames_jit", original)
    assert sp.checkpoint_info(path)["steps_done"] == 20
    _, resumed = _water_npt(40, checkpoint=path, resume=True)
    for name in ("positions", "velocities", "conserved", "box"):
        assert np.array_equal(np.asarray(getattr(resumed, name)),
                              np.asarray(getattr(reference, name))), name


@pytest.mark.slow
def test_rattle_under_the_barostat_is_settle():
    """The same 27 molecules with each held by three RATTLE bonds (tolerance 1e-13)
    instead of SETTLE: the barostat finds the molecules from the bonds, and the runs
    agree to 1e-12 nm in every position and box side over 40 steps (measured 3e-14;
    SETTLE solves the same constraints exactly)."""
    _, settle = _water_npt(40)
    _, rattle = _water_npt(40, rattle=True)
    assert int(settle.result) == 0 and int(rattle.result) == 0
    np.testing.assert_allclose(rattle.box, settle.box, rtol=0, atol=1e-12)
    np.testing.assert_allclose(rattle.positions, settle.positions, rtol=0, atol=1e-12)


# -- the effective energy ------------------------------------------------------------------

def soft(r, params):
    """A smooth soft sphere (continuous to the 3rd derivative at its cutoff)."""
    return params["epsilon"] * jnp.clip(1.0 - r / params["sigma"], 0.0, None) ** 4


def _effective_energy_increments(dt, anisotropic, window=0.5, total=10.0):
    x, box = sp.lattice(3, 0.8)
    side = jnp.full(3, box) if anisotropic else box
    space = sp.periodic(side)
    energy = sp.pair_energy(soft, space, r_cut=1.5)
    nbrs = sp.neighbor_list(space, x, r_cut=1.5, skin=0.3, capacity=len(x) - 1)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(x))
    barostat = sp.StochasticCellRescaling(1.0, 2.0, 0.1, 0.2, 0.05, anisotropic=anisotropic)
    every = int(round(window / dt))
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0),
                       dict(sigma=1.5, epsilon=10.0), space=space, dt=dt,
                       n_steps=int(round(total / dt)), save_every=every,
                       chunk_steps=every * 4, integrator=barostat, key=jax.random.key(3),
                       neighbors=nbrs)
    assert int(traj.result) == 0
    boxes = np.asarray(traj.box)
    assert np.ptp(boxes[:, 0]) > 0.02 * boxes[0, 0]          # the box does move
    return np.diff(np.asarray(traj.conserved))[int(round(2.0 / window)):] / len(x)


@pytest.mark.slow
def test_effective_energy_is_conserved_as_dt_goes_to_zero():
    """108 smooth soft spheres at kT = 1, P = 2, a fast barostat (tau_p = 0.2) and
    thermostat (tau_t = 0.1), melting from a lattice: after 2 time units, the effective
    energy K + U + P0 V + heat + work (Bernetti & Bussi 2020) changes over 0.5 time
    units by a root mean square below 1e-4 kT per atom at dt = 0.004, and by at least
    2.4 times less at dt = 0.001 (first order, from the Euler-Maruyama cell step, would
    give 4; measured 7.7 isotropic, over 12 time units)."""
    for anisotropic in (False, True):
        coarse = np.sqrt(np.mean(_effective_energy_increments(0.004, anisotropic) ** 2))
        fine = np.sqrt(np.mean(_effective_energy_increments(0.001, anisotropic) ** 2))
        assert coarse < 1e-4 and coarse / fine > 2.4, (anisotropic, coarse, fine)


# -- orthorhombic cells ----------------------------------------------------------------------

def _jzg():
    sys.path.insert(0, str(Path(__file__).parents[1] / "validation"))
    from lj_reference import jzg_pressure
    return jzg_pressure


@pytest.mark.slow
def test_anisotropic_fluid_density_matches_the_equation_of_state():
    """256 LJ atoms (r_c = 2.5, tail corrections) at T = 2 and the JZG pressure of density
    0.8, started in a 1.15 x 1 x 0.87 box: each side moves on its own, and the mean
    density over the last 4,000 of 6,000 steps is 0.8 within three block-average standard
    errors. (A fluid has no shear modulus: its box shape diffuses, it does not return to
    a cube; the crystal below does.)"""
    jzg_pressure = _jzg()
    x, box = sp.lattice(4, 0.8)
    stretch = np.array([1.15, 1.0, 1 / 1.15])
    x = x * stretch
    side = jnp.asarray(box * stretch)
    space = sp.periodic(side)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    v = sp.maxwell_boltzmann(1.0, 2.0, key=jax.random.key(1), n=len(x))
    p0 = jzg_pressure(0.8, 2.0)
    barostat = sp.StochasticCellRescaling(2.0, p0, 0.1, 1.0, 0.1, anisotropic=True)
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0), LJ, space=space,
                       dt=0.004, n_steps=6_000, save_every=20, integrator=barostat,
                       key=jax.random.key(3), neighbors=nbrs)
    assert int(traj.result) == 0
    boxes = np.asarray(traj.box)[100:]
    assert np.ptp(boxes[:, 0] / boxes[:, 2]) > 0.01           # the sides move apart
    rho = len(x) / np.prod(boxes, axis=1)
    blocks = np.array([b.mean() for b in np.array_split(rho, 8)])
    error = blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert abs(rho.mean() - 0.8) < 3 * error and error < 0.006, (rho.mean(), error)


@pytest.mark.slow
def test_strained_crystal_relaxes_to_a_cube():
    """An fcc Lennard-Jones crystal (256 atoms, kT = 0.3, P0 = 1) started with its box
    stretched 6% along x and squeezed 3% along y and z: under the orthorhombic barostat
    the crystal's shear stiffness brings the box back to cubic (fcc symmetry: the mean
    side ratios over the last half within 1% of 1), where the isotropic barostat keeps
    the starting shape (ratio 1.06/0.97 to 1e-12)."""
    x, box = sp.lattice(4, 1.05)
    stretch = np.array([1.06, 0.97, 0.97])
    side = jnp.asarray(box * stretch)
    space = sp.periodic(side)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)
    v = sp.maxwell_boltzmann(1.0, 0.3, key=jax.random.key(1), n=len(x))
    results = {}
    for anisotropic in (True, False):
        nbrs = sp.neighbor_list(space, x * stretch, r_cut=2.5, skin=0.3)
        barostat = sp.StochasticCellRescaling(0.3, 1.0, 0.1, 0.5, 0.02,
                                              anisotropic=anisotropic)
        traj = sp.simulate(energy, sp.State(x * stretch, v - jnp.mean(v, axis=0), 1.0), LJ,
                           space=space, dt=0.004, n_steps=3_000, save_every=20,
                           integrator=barostat, key=jax.random.key(3), neighbors=nbrs)
        assert int(traj.result) == 0
        results[anisotropic] = np.asarray(traj.box)
    late = results[True][len(results[True]) // 2:]
    assert np.all(np.abs(late[:, 0] / late[:, 1] - 1).mean() < 0.01), late[-1]
    assert np.all(np.abs(late[:, 0] / late[:, 2] - 1).mean() < 0.01), late[-1]
    iso = results[False]
    np.testing.assert_allclose(iso[:, 0] / iso[:, 1], 1.06 / 0.97, rtol=1e-12)


def test_spce_dispersion_tail_matches_quadrature():
    """spce_energy(tail_correction=True)'s extra term for 216 molecules: U = (2 pi / V)
    N_O^2 int_rc^inf r^2 u(r) dr and W = (2 pi / V) N_O^2 int_rc^inf r^2 (-r u'(r)) dr
    with the oxygens' Lennard-Jones u (scipy quadrature; hydrogens have epsilon 0), to
    1e-10; no force; the diagonal of its virial tensor a third of W each."""
    from scipy.integrate import quad

    water = sp.spce_water(216)
    r_cut = 0.75
    tail = sp.spce_energy(water, r_cut, tolerance=1e-4, tail_correction=True).terms[-1]
    s, e = 0.3166, 0.650
    volume, n_o = water.box**3, 216

    def u(r):
        return 4 * e * ((s / r) ** 12 - (s / r) ** 6)

    def minus_r_du(r):
        return 4 * e * (12 * (s / r) ** 12 - 6 * (s / r) ** 6)

    u_ref = 2 * np.pi / volume * n_o**2 * quad(lambda r: r * r * u(r), r_cut, np.inf)[0]
    w_ref = 2 * np.pi / volume * n_o**2 * quad(lambda r: r * r * minus_r_du(r), r_cut,
                                               np.inf)[0]
    x = water.positions
    energy, forces = tail.energy_and_forces(x, water.params)
    assert abs(float(energy) / u_ref - 1) < 1e-10 and abs(float(tail.virial(
        x, water.params)) / w_ref - 1) < 1e-10
    assert not np.any(np.asarray(forces))
    np.testing.assert_allclose(np.diagonal(tail.virial_tensor(x, water.params)), w_ref / 3,
                               rtol=1e-10)


@pytest.mark.slow
def test_ideal_gas_volume_has_the_isothermal_isobaric_mean():
    """4 non-interacting atoms (total momentum zero, 9 thermostatted degrees of freedom)
    at kT = 1, P0 = 1: the isothermal-isobaric volume law is proportional to
    V^N exp(-P0 V / kT), mean (N + 1) kT / P0 = 5 and variance 5 (McDonald, Mol. Phys. 23,
    41 (1972)). Over 2,000 time units the mean volume is 5 within three block-average
    standard errors (measured 4.95 +- 0.08; the law without Bernetti & Bussi's kT/V term
    would give 4) and the variance within 20% of 5 (measured 4.81)."""
    n = 4
    space = sp.periodic(1.6)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=0.05)
    x = jax.random.uniform(jax.random.key(0), (n, 3)) * 1.6
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=n)
    barostat = sp.StochasticCellRescaling(1.0, 1.0, 0.1, 1.0, 1.0)
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0),
                       dict(sigma=0.01, epsilon=0.0), space=space, dt=0.005, n_steps=400_000,
                       save_every=20, chunk_steps=100_000, integrator=barostat,
                       key=jax.random.key(3))
    assert int(traj.result) == 0
    volume = np.prod(np.asarray(traj.box), axis=1)[1000:]
    blocks = np.array([b.mean() for b in np.array_split(volume, 20)])
    error = blocks.std(ddof=1) / np.sqrt(len(blocks))
    assert abs(volume.mean() - (n + 1)) < 3 * error and error < 0.15, (volume.mean(), error)
    assert abs(volume.var() / (n + 1) - 1) < 0.2, volume.var()


@pytest.mark.slow
def test_neighbour_cells_follow_an_orthorhombic_box():
    """256 LJ atoms in 3x3x3 cells compressed to P = 5 by the orthorhombic barostat: the
    sides shrink by different amounts (7-12%), the list is reallocated for the smaller box
    and, checked against all pairs at every step (debug), misses no pair."""
    x, box = sp.lattice(4, 0.7)
    space = sp.periodic(jnp.full(3, box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=1.8)
    nbrs = sp.neighbor_list(space, x, r_cut=1.8, skin=0.3, debug=True)
    assert nbrs.grid == (3, 3, 3)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(x))
    barostat = sp.StochasticCellRescaling(1.0, 5.0, 0.1, 0.05, 0.1, anisotropic=True)
    traj = sp.simulate(energy, sp.State(x, v - jnp.mean(v, axis=0), 1.0), LJ, space=space,
                       dt=0.004, n_steps=400, save_every=1, integrator=barostat,
                       key=jax.random.key(3), neighbors=nbrs, chunk_steps=400)
    boxes = np.asarray(traj.box)
    assert int(traj.result) == 0
    assert np.all(boxes[-1] < 0.95 * boxes[0]) and np.ptp(boxes[-1]) > 0.1, boxes[-1]
    assert int(traj.stats["n_reallocations"]) >= 1
    assert int(traj.neighbors.missed_pairs) == 0


# -- one pass over the pairs: the fused virial -------------------------------------------

def _lj_box_system(mixed):
    """A perturbed fcc block of 256 atoms in an orthorhombic box (float64)."""
    x, box = sp.lattice(4, 0.8442, dtype=jnp.float64)
    sides = jnp.asarray([1.0, 1.07, 0.96]) * box
    x = x * sides / box + jnp.asarray(np.random.default_rng(3).normal(scale=0.07,
                                                                      size=x.shape))
    space = sp.periodic(sides)
    x = space.wrap(x)
    n = x.shape[0]
    if mixed:
        kind = np.arange(n) % 3 == 0
        params = dict(sigma=jnp.asarray(np.where(kind, 1.08, 0.97)),
                      epsilon=jnp.asarray(np.where(kind, 0.8, 1.1)))
    else:
        params = dict(sigma=1.02, epsilon=0.95)
    return x, sides, params


@pytest.mark.parametrize("mixed", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_fused_virial_is_the_energy_derivative_under_box_scaling(mixed):
    """energy_forces_virial's W and W_aa (one pass with the forces; the native kernel's
    where it is built, and the pure-JAX pass of an unrecognised potential) against central
    differences of the energy when axis a and the box are scaled by 1 + h (W_aa =
    -dU/d ln L_a for a pair potential; shifted, so U is continuous, and no pair crosses
    the cutoff),
    and the energy and forces against energy_and_forces."""
    from simlib.particles import _native

    if not jax.config.jax_enable_x64:
        pytest.skip("needs float64")
    x, sides, params = _lj_box_system(mixed)
    # A cutoff with no pair within 0.01% of it (numpy distances), so that no pair crosses it
    # under the scalings below (the shifted force jumps there).
    d = np.asarray(x)[:, None, :] - np.asarray(x)[None, :, :]
    d -= np.asarray(sides) * np.round(d / np.asarray(sides))
    r = np.sqrt(np.sum(d * d, axis=-1))[np.triu_indices(len(d), 1)]
    grid = np.linspace(2.3, 2.7, 4001)
    gaps = np.array([np.min(np.abs(r - c)) / c for c in grid])
    r_cut = float(grid[np.argmax(gaps)])
    assert np.max(gaps) > 1e-4
    nbrs = sp.neighbor_list(sp.periodic(sides), x, r_cut=r_cut, skin=0.3)

    def energy_in(s, potential=sp.lennard_jones):
        return sp.pair_energy(potential, sp.periodic(s), r_cut=r_cut, shift=True)

    @jax.jit
    def energy_scaled(scale):
        return energy_in(sides * scale)(x * scale, params, nbrs)

    def u(a, h):                    # axis a (and the box) scaled by 1 + h; the same list
        return float(energy_scaled(jnp.ones(3).at[a].set(1.0 + h)))

    h = 1e-5
    fd = np.array([-(u(a, h) - u(a, -h)) / (2 * h) for a in range(3)])
    native = energy_in(sides)
    pure = energy_in(sides, lambda r, p: sp.lennard_jones(r, p))
    assert not pure._native_lj(x, params, nbrs)
    assert native._native_lj(x, params, nbrs) == (_native.load() is not None)
    e_ref, f_ref = native.energy_and_forces(x, params, nbrs)
    for energy in (native, pure):
        e, f, w = jax.jit(energy.energy_forces_virial)(x, params, nbrs)
        ed, fd_, wd = jax.jit(lambda y, p, nb, en=energy: en.energy_forces_virial(
            y, p, nb, diagonal=True))(x, params, nbrs)
        assert wd.shape == (3,) and w.shape == ()
        # central differences err by ~h^2 U''' ~ 1e-6 of the energy's scale
        scale = np.max(np.abs(fd))
        np.testing.assert_allclose(np.asarray(wd), fd, rtol=0, atol=1e-8 * scale)
        np.testing.assert_allclose(float(w), fd.sum(), rtol=0, atol=3e-8 * scale)
        # the same pairs as the separate calls, to round-off
        np.testing.assert_allclose(np.asarray(wd),
                                   np.diagonal(np.asarray(energy.virial_tensor(x, params,
                                                                               nbrs))),
                                   rtol=1e-12)
        np.testing.assert_allclose(float(w), float(energy.virial(x, params, nbrs)),
                                   rtol=1e-12)
        for ee, ff in ((e, f), (ed, fd_)):
            np.testing.assert_allclose(float(ee), float(e_ref), rtol=1e-12)
            np.testing.assert_allclose(np.asarray(ff), np.asarray(f_ref),
                                       atol=1e-12 * float(jnp.max(jnp.abs(f_ref))))


@pytest.mark.slow
def test_fused_virial_has_derivatives():
    """Gradients of the fused W_aa (the native kernel's custom_jvp rule) in epsilon and in
    the positions, against central differences of the same call."""
    if not jax.config.jax_enable_x64:
        pytest.skip("needs float64")
    x, sides, params = _lj_box_system(False)
    nbrs = sp.neighbor_list(sp.periodic(sides), x, r_cut=2.5, skin=0.3)
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(sides), r_cut=2.5,
                            tail_correction=True)
    weights = jnp.asarray([1.0, -0.7, 0.4])

    def g(eps, y):
        return jnp.sum(weights * energy.energy_forces_virial(
            y, dict(params, epsilon=eps), nbrs, diagonal=True)[2])

    de, dx = jax.jit(jax.grad(g, argnums=(0, 1)))(0.95, x)
    g = jax.jit(g)
    h = 1e-6
    fd_e = (g(0.95 + h, x) - g(0.95 - h, x)) / (2 * h)
    assert abs(float(de) - float(fd_e)) < 1e-7 * abs(float(fd_e))
    direction = jnp.asarray(np.random.default_rng(5).normal(size=x.shape))
    fd_x = (g(0.95, x + h * direction) - g(0.95, x - h * direction)) / (2 * h)
    assert abs(float(jnp.sum(dx * direction)) - float(fd_x)) < 1e-6 * abs(float(fd_x))


@pytest.mark.parametrize("anisotropic,compiled", [
    (False, False), pytest.param(True, True, marks=pytest.mark.slow),
    pytest.param(False, True, marks=pytest.mark.slow)])
def test_npt_step_visits_the_pairs_once(anisotropic, compiled, monkeypatch):
    """A StochasticCellRescaling step evaluates the pair kernel once: energy, forces and
    virial (or its diagonal) from one call. Natively: one custom call of the Lennard-Jones
    kernel in the step's jaxpr and in its compiled program; in pure JAX (the kernel
    switched off): one pass over the neighbour list traced. The code before evaluated the
    virial in a second pass (two of each)."""
    from simlib.particles import _energy, _native

    x, sides, params = _lj_box_system(False)
    x, sides = x.astype(jnp.float32), sides.astype(jnp.float32)
    space = sp.periodic(sides)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, tail_correction=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    integrator = sp.StochasticCellRescaling(1.0, 1.0, 0.1, 1.0, 0.1, anisotropic=anisotropic)
    model = sp.Model(energy, space)
    masses = jnp.float32(1.0)
    carry = integrator.start(model, sp.State(x, jnp.zeros_like(x), masses), params, nbrs)

    def step(c):
        return integrator.step(model, c, masses, params, jnp.float32(0.005),
                               jax.random.key(0))

    if _native.load() is not None:
        assert energy._native_lj(x, params, nbrs)
        text = str(jax.make_jaxpr(step)(carry))        # the diagonal: simlib_lj_diag_f32
        assert text.count("simlib_lj_f32") + text.count("simlib_lj_diag_f32") == 1
        if compiled:     # steps in a loop: one kernel call, the list updated in place
            hlo = jax.jit(lambda c: jax.lax.fori_loop(0, 2, lambda i, c: step(c), c)).lower(
                carry).compile().as_text()
            assert len(re.findall(r'custom_call_target="simlib_lj_(diag_)?f32"', hlo)) == 1
            idx = f"s32[{x.shape[0]},{nbrs.idx.shape[1]}]"
            body = hlo[:hlo.index("\nENTRY")]                  # the loop, not its entry
            assert body.count(f"{idx}{{1,0}} copy(") == 0, "the loop copies the list"
    monkeypatch.setattr(_native, "load", lambda: None)            # the pure-JAX path
    assert not energy._native_lj(x, params, nbrs)
    passes = []
    pass_ = _energy.PairEnergy._neighbor_pass

    def counted(self, *args):
        passes.append(1)
        return pass_(self, *args)

    monkeypatch.setattr(_energy.PairEnergy, "_neighbor_pass", counted)
    jax.make_jaxpr(lambda c: step(c))(carry)          # a new function: traced afresh
    assert len(passes) == 1, len(passes)
