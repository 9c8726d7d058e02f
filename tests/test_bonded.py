"""Bond angles and dihedrals: closed-form geometries, forces against finite differences,
the conservation laws of a rigid-motion-invariant energy, the virial against the
derivative of the energy under box scaling, and refused inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib import particles as sp

TETRAHEDRAL = np.degrees(np.arccos(-1.0 / 3.0))      # 109.4712...
PARAMS = dict(k_theta=80.0, theta0=1.91, k_phi=1.4, n_phi=3.0, phi0=0.3, k_xi=40.0, xi0=0.1)


def chain(phi_deg):
    """Four atoms i-j-k-l, bonds of length 1.5, bond angles 111 degrees, with the dihedral
    made by rotating l about the j-k axis by phi (IUPAC: phi = 180 is trans)."""
    theta = np.radians(111.0)
    j = np.zeros(3)
    k = np.array([1.5, 0.0, 0.0])
    i = j + 1.5 * np.array([np.cos(theta), np.sin(theta), 0.0])
    phi = np.radians(phi_deg)
    # l: bond angle theta at k, turned about +x (the j -> k axis) by phi from cis (on i's
    # side, +y). The sign: the example of test_tetrahedral_angle_and_the_iupac_sign (i on
    # +x, axis +y, l on +z: -90) turned by the proper rotation x -> y, y -> x, z -> -z is
    # i on +y, axis +x, l on -z: -90, so +phi puts l towards +z.
    r = 1.5 * np.array([np.cos(np.pi - theta), np.sin(theta) * np.cos(phi),
                        np.sin(theta) * np.sin(phi)])
    return np.stack([i, j, k, k + r])


@pytest.mark.parametrize("phi", [180.0, 0.0, 60.0, -60.0, 120.0, -150.0])
def test_dihedral_and_angles_of_built_geometries(phi):
    x = jnp.asarray(chain(phi) + np.array([9.3, 0.2, 4.9]))       # straddles the box edge
    space = sp.periodic(10.0)
    x = space.wrap(x)
    d = sp.dihedral_energy(sp.periodic_torsion, space, [[0, 1, 2, 3]])
    a = sp.angle_energy(sp.harmonic_angle, space, [[0, 1, 2], [1, 2, 3]])
    got = float(np.degrees(d.angles(x)[0]))
    assert min(abs(got - phi), abs(abs(got - phi) - 360.0)) < 1e-9
    np.testing.assert_allclose(np.degrees(np.asarray(a.angles(x))), [111.0, 111.0],
                               atol=1e-10)


def test_tetrahedral_angle_and_the_iupac_sign():
    v = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1]], float)
    x = jnp.asarray(np.vstack([v[0], np.zeros(3), v[1]]))
    a = sp.angle_energy(sp.harmonic_angle, sp.free(), [[0, 1, 2]])
    assert abs(float(np.degrees(a.angles(x)[0])) - TETRAHEDRAL) < 1e-10
    # i on +x, j at 0, k on +y, l on +z: seen along j -> k, i (at 3 o'clock) turns
    # counterclockwise to l (12 o'clock): -90 degrees by the IUPAC convention
    x = jnp.asarray([[1.0, 0, 0], [0, 0, 0], [0, 1, 0], [0, 1, 1]])
    d = sp.dihedral_energy(sp.periodic_torsion, sp.free(), [[0, 1, 2, 3]])
    assert abs(float(np.degrees(d.angles(x)[0])) + 90.0) < 1e-12


def numpy_energy(x):
    """The same terms written out in numpy (arccos and an explicit sign)."""
    def angle(i, j, k):
        a, b = x[i] - x[j], x[k] - x[j]
        return np.arccos(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))

    def dihedral(i, j, k, l):
        b1, b2, b3 = x[j] - x[i], x[k] - x[j], x[l] - x[k]
        n1, n2 = np.cross(b1, b2), np.cross(b2, b3)
        c = np.dot(n1, n2) / np.linalg.norm(n1) / np.linalg.norm(n2)
        return np.sign(np.dot(b1, n2)) * np.arccos(np.clip(c, -1, 1))

    p = PARAMS
    u = sum(0.5 * p["k_theta"] * (angle(*t) - p["theta0"]) ** 2 for t in ANGLES)
    u += sum(p["k_phi"] * (1 + np.cos(p["n_phi"] * dihedral(*t) - p["phi0"]))
             for t in PROPER)
    xi = dihedral(*IMPROPER[0]) - p["xi0"]
    return u + 0.5 * p["k_xi"] * xi**2


ANGLES = [[0, 1, 2], [1, 2, 3], [1, 2, 4]]
PROPER = [[0, 1, 2, 3], [0, 1, 2, 4]]
IMPROPER = [[2, 1, 3, 4]]


@pytest.fixture(scope="module")
def molecule():
    rng = np.random.default_rng(3)
    x = chain(70.0)
    x = np.vstack([x, x[2] + np.array([0.4, -1.1, 0.9])]) + 0.05 * rng.standard_normal((5, 3))
    space = sp.free()
    energy = (sp.angle_energy(sp.harmonic_angle, space, ANGLES)
              + sp.dihedral_energy(sp.periodic_torsion, space, PROPER)
              + sp.dihedral_energy(sp.harmonic_improper, space, IMPROPER))
    return x, energy


def test_energy_and_forces_against_numpy_and_finite_differences(molecule):
    x, energy = molecule
    e, f = jax.jit(energy.energy_and_forces)(jnp.asarray(x), PARAMS)
    assert abs(float(e) - numpy_energy(x)) < 1e-10 * abs(numpy_energy(x))
    h = 1e-6
    fd = np.zeros_like(x)
    for a in range(x.shape[0]):
        for c in range(3):
            xp, xm = x.copy(), x.copy()
            xp[a, c] += h
            xm[a, c] -= h
            fd[a, c] = -(numpy_energy(xp) - numpy_energy(xm)) / (2 * h)
    np.testing.assert_allclose(np.asarray(f), fd, atol=1e-6 * np.max(np.abs(fd)))
    # translation and rotation invariance: no net force, no net torque
    assert np.max(np.abs(np.sum(np.asarray(f), axis=0))) < 1e-10
    assert np.max(np.abs(np.sum(np.cross(x, np.asarray(f)), axis=0))) < 1e-10


def test_virial_is_minus_the_energy_derivative_under_box_scaling(molecule):
    """W = -dU/d(eps) for x -> (1 + eps) x and box -> (1 + eps) box, here with the
    molecule wrapped across the periodic boundary (minimum images inside each term)."""
    x, _ = molecule
    box = 6.0
    x = np.asarray(x) + np.array([5.2, 0.3, 5.6])

    def terms(scale):
        space = sp.periodic(box * scale)
        e = (sp.angle_energy(sp.harmonic_angle, space, ANGLES)
             + sp.dihedral_energy(sp.periodic_torsion, space, PROPER)
             + sp.dihedral_energy(sp.harmonic_improper, space, IMPROPER))
        return e, space.wrap(jnp.asarray(x) * scale)

    @jax.jit
    def u_and_w(scale):
        e, xs = terms(scale)
        return e(xs, PARAMS), e.virial(xs, PARAMS)

    w = float(u_and_w(1.0)[1])
    h = 1e-6
    fd = -(float(u_and_w(1 + h)[0]) - float(u_and_w(1 - h)[0])) / (2 * h)
    assert abs(w - fd) < 1e-6 * max(1.0, abs(fd))


def test_bad_inputs_are_refused():
    space = sp.free()
    with pytest.raises(ValueError, match=r"\(m, 3\) integer"):
        sp.angle_energy(sp.harmonic_angle, space, [[0, 1]])
    with pytest.raises(ValueError, match=r"\(m, 4\) integer"):
        sp.dihedral_energy(sp.periodic_torsion, space, [[0.0, 1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="twice"):
        sp.angle_energy(sp.harmonic_angle, space, [[0, 1, 0]])
    with pytest.raises(ValueError, match="non-negative"):
        sp.angle_energy(sp.harmonic_angle, space, [[0, 1, -2]])
    x = jnp.asarray(chain(60.0))
    e = sp.dihedral_energy(sp.periodic_torsion, space, [[0, 1, 2, 7]])
    with pytest.raises(ValueError, match="names atom 7"):
        e(x, PARAMS)
    with pytest.raises(ValueError, match=r"shape \(n, 3\)"):
        sp.angle_energy(sp.harmonic_angle, space, [[0, 1, 2]])(x[:, :2], PARAMS)

    # traced: an index outside [0, n) cannot be clamped quietly; the energy is NaN
    @jax.jit
    def traced(atoms, x):
        return sp.dihedral_energy(sp.periodic_torsion, space, atoms)(x, PARAMS)

    assert np.isnan(float(traced(jnp.asarray([[0, 1, 2, 7]]), x)))
    assert np.isfinite(float(traced(jnp.asarray([[0, 1, 2, 3]]), x)))


def test_pair_correction_leaves_out_and_scales_pairs_as_a_numpy_sum_does():
    """LJ with per-particle sigma over a 12-atom jiggled grid in a periodic box: pair energy plus
    corrections equals a numpy sum in which 1-2/1-3 pairs are left out and 1-4 pairs are
    halved; the virial likewise (the box-scaling derivative)."""
    rng = np.random.default_rng(11)
    n, box, r_cut = 12, 7.0, 3.0
    grid = np.stack(np.meshgrid(np.arange(3), np.arange(2), np.arange(2), indexing="ij"), -1)
    x = 1.2 + 1.6 * grid.reshape(-1, 3) + 0.1 * rng.standard_normal((n, 3))   # no overlaps
    sigma = 1.0 + 0.1 * rng.random(n)
    bonds = np.array([[k, k + 1] for k in range(5)])           # a chain of 6 atoms
    ex = sp.excluded_pairs(bonds, n)
    out = np.vstack([ex[1], ex[2]])
    params = dict(sigma=jnp.asarray(sigma), epsilon=1.0)

    def total(scale_box):
        space = sp.periodic(box * scale_box)
        lj = sp.pair_energy(sp.lennard_jones, space, r_cut=r_cut, shift=True)
        return (lj + sp.pair_correction(lj, out) + sp.pair_correction(lj, ex[3], 0.5)), \
            jnp.asarray(x * scale_box)

    @jax.jit
    def energy_and_virial(scale):
        e, xs = total(scale)
        return e(xs, params), e.virial(xs, params)

    u_sim, w_sim = energy_and_virial(1.0)
    i, j = np.triu_indices(n, 1)
    d = x[i] - x[j]
    d -= box * np.round(d / box)
    r = np.linalg.norm(d, axis=1)
    s = 0.5 * (sigma[i] + sigma[j])

    def lj(r, s):
        return 4 * ((s / r) ** 12 - (s / r) ** 6)

    u = np.where(r < r_cut, lj(r, s) - lj(r_cut, s), 0.0)
    weight = np.ones(len(i))
    index = {(a, b): k for k, (a, b) in enumerate(zip(i, j, strict=True))}
    for p in out.tolist():
        weight[index[tuple(p)]] = 0.0
    for p in ex[3].tolist():
        weight[index[tuple(p)]] = 0.5
    ref = float(np.sum(weight * u))
    assert abs(float(u_sim) - ref) < 1e-10 * max(1.0, abs(ref))

    h = 1e-6
    fd = -(float(energy_and_virial(1 + h)[0]) - float(energy_and_virial(1 - h)[0])) / (2 * h)
    assert abs(float(w_sim) - fd) < 1e-6 * max(1.0, abs(fd))
    with pytest.raises(ValueError, match="listed twice"):
        sp.pair_correction(sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=r_cut),
                           [[0, 1], [1, 0]])


def test_virial_tensor_against_the_energy_derivative_under_shear():
    """W_ba = -dU/d(eps) for x -> (I + eps E_ab) x (E_ab: 1 at (a, b)), by central finite
    differences, on a free cluster held by LJ, bonds, angles, torsions and a 1-4 scaling."""
    rng = np.random.default_rng(5)
    x = chain(70.0)
    x = np.vstack([x, x + np.array([0.3, 3.2, 0.5])]) + 0.05 * rng.standard_normal((8, 3))
    space = sp.free()
    lj = sp.pair_energy(sp.lennard_jones, space, r_cut=None)
    bonds = np.array([[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]])
    ex = sp.excluded_pairs(bonds, 8)
    energy = (lj + sp.pair_correction(lj, np.vstack([ex[1], ex[2]]))
              + sp.pair_correction(lj, ex[3], 0.5)
              + sp.bond_energy(sp.harmonic, space, bonds)
              + sp.angle_energy(sp.harmonic_angle, space, [[0, 1, 2], [1, 2, 3], [4, 5, 6]])
              + sp.dihedral_energy(sp.periodic_torsion, space, [[0, 1, 2, 3]]))
    params = dict(PARAMS, sigma=3.0, epsilon=0.2, k=300.0, r0=1.5)

    @jax.jit
    def u_sheared(eps, a, b):
        strain = jnp.eye(3) + eps * jnp.zeros((3, 3)).at[a, b].set(1.0)
        return energy(jnp.asarray(x) @ strain.T, params)

    w = np.asarray(jax.jit(energy.virial_tensor)(jnp.asarray(x), params))
    h = 1e-6
    for a, b in [(0, 1), (2, 0), (1, 1)]:
        fd = -(float(u_sheared(h, a, b)) - float(u_sheared(-h, a, b))) / (2 * h)
        assert abs(w[b, a] - fd) < 1e-6 * max(1.0, np.max(np.abs(w)))
    assert abs(np.trace(w) - float(jax.jit(energy.virial)(jnp.asarray(x), params))) < 1e-9


@pytest.mark.slow
def test_pressure_tensor_of_a_periodic_fluid_against_stretching_the_box():
    """Per axis: W_aa = -dU/d(eps) with the box and positions stretched along that axis;
    the trace over d of pressure_tensor is pressure; a neighbour list gives the tensor
    of all pairs."""
    rng = np.random.default_rng(5)
    h = 1e-6
    xl, box = sp.lattice(3, 0.8442)                                  # 108 atoms, box 5.04
    xl = np.asarray(xl) + 0.05 * rng.standard_normal(np.shape(xl))
    v = rng.standard_normal(xl.shape)

    @jax.jit
    def stretched(eps, axis):
        scale = jnp.ones(3).at[axis].add(eps)
        fluid = sp.pair_energy(sp.lennard_jones, sp.periodic(box * scale), r_cut=2.5)
        return fluid(jnp.asarray(xl) * scale, dict(sigma=1.0, epsilon=1.0))

    fluid = sp.pair_energy(sp.lennard_jones, sp.periodic(jnp.full(3, box)), r_cut=2.5)
    p = dict(sigma=1.0, epsilon=1.0)
    wf = np.asarray(jax.jit(fluid.virial_tensor)(jnp.asarray(xl), p))
    for axis in range(3):
        fd = -(float(stretched(h, axis)) - float(stretched(-h, axis))) / (2 * h)
        assert abs(wf[axis, axis] - fd) < 1e-6 * max(1.0, abs(fd))
    nbrs = sp.neighbor_list(fluid.space, jnp.asarray(xl), r_cut=2.5, skin=0.0)
    np.testing.assert_allclose(
        np.asarray(jax.jit(fluid.virial_tensor)(jnp.asarray(xl), p, nbrs)), wf,
        atol=1e-9 * np.max(np.abs(wf)))

    @jax.jit
    def both(x, v):
        return (sp.pressure_tensor(fluid, x, v, 1.0, p), sp.pressure(fluid, x, v, 1.0, p))

    tensor, scalar = both(jnp.asarray(xl), jnp.asarray(v))
    assert abs(float(jnp.trace(tensor)) / 3 - float(scalar)) < 1e-10 * abs(float(scalar))


@pytest.mark.slow
def test_langevin_butane_samples_the_boltzmann_law_of_its_torsion():
    """A four-atom chain alone (harmonic bonds and angles, a 1-fold torsion
    k (1 + cos phi), no nonbonded terms) under Langevin dynamics: with bonds and angles
    independent of the dihedral, its marginal law is exp(-U(phi)/kT) / Z exactly, a von
    Mises law about pi with concentration k/kT, so <cos phi> = -I1(k/kT)/I0(k/kT). The
    sampled dihedrals must match that mean (4 standard errors from block averages) and
    pass a KS test against the law (exact <cos phi> = -0.513 here). Checked against the
    law at half the strength (<cos phi> = -0.287), it fails: KS p = 7.9e-5."""
    from scipy import special, stats

    kT = 1.0
    params = dict(k=400.0, r0=1.5, k_theta=60.0, theta0=1.91, k_phi=1.2, n_phi=1.0,
                  phi0=0.0)
    space = sp.free()
    energy = (sp.bond_energy(sp.harmonic, space, [[0, 1], [1, 2], [2, 3]])
              + sp.angle_energy(sp.harmonic_angle, space, [[0, 1, 2], [1, 2, 3]])
              + sp.dihedral_energy(sp.periodic_torsion, space, [[0, 1, 2, 3]]))
    x0 = jnp.asarray(chain(180.0))
    v0 = jnp.zeros_like(x0)
    traj = sp.simulate(energy, sp.State(x0, v0, 1.0), params, space=space, dt=0.01,
                       n_steps=400_000, save_every=200, integrator=sp.Langevin(kT, 1.0),
                       key=jax.random.key(0))
    tors = sp.dihedral_energy(sp.periodic_torsion, space, [[0, 1, 2, 3]])
    phi = np.asarray(jax.vmap(tors.angles)(traj.positions))[200:, 0]   # after 200 frames
    grid = np.linspace(-np.pi, np.pi, 20001)
    density = np.exp(-params["k_phi"] * (1 + np.cos(grid)) / kT)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1])
                                           * np.diff(grid))])
    cdf /= cdf[-1]
    # frames 200 steps apart (2 time units, a few torsional relaxation times) are close to
    # independent; thin further to be safe
    sample = phi[::4]
    p = stats.kstest(sample, lambda q: np.interp(q, grid, cdf)).pvalue
    assert p > 1e-3, p
    kappa = params["k_phi"] / kT
    exact = -special.i1(kappa) / special.i0(kappa)
    blocks = np.cos(phi[: len(phi) // 10 * 10]).reshape(10, -1).mean(axis=1)
    assert abs(blocks.mean() - exact) < 4 * blocks.std(ddof=1) / np.sqrt(10), \
        (blocks.mean(), exact)
