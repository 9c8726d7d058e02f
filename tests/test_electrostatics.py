"""Ewald and smooth PME: lattice constants, a direct lattice sum, PME against Ewald at the
requested tolerance, derivatives against finite differences, bad boxes and alphas refused
eagerly and NaN under jit/vmap, and (slow, with openmm installed) OpenMM's PME."""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib import particles as sp

# Madelung constants in units of the nearest-neighbour distance: NaCl (OEIS A085469) and
# CsCl (OEIS A181152)
MADELUNG_NACL = 1.747564594633182190636
MADELUNG_CSCL = 1.76267477307099


def _rock_salt():
    """The conventional cubic cell of rock salt, a = 1 (nearest neighbours at 1/2)."""
    x = np.array([[0, 0, 0], [.5, 0, 0], [0, .5, 0], [0, 0, .5], [.5, .5, 0], [.5, 0, .5],
                  [0, .5, .5], [.5, .5, .5]])
    q = np.array([1.0, -1, -1, -1, 1, 1, 1, -1])
    return jnp.asarray(x), jnp.asarray(q)


# one set of k-vectors (converged for alpha <= 13 at r_cut = 0.5) for every unit-cell test,
# so that they share compiled programs; alpha is a leaf
def _cell_energy(alpha=11.0):
    kmax = sp.ewald_parameters(1.0, 0.5, 1e-13).kmax
    kmax = tuple(k + 4 for k in kmax)         # room for alpha up to 13
    return sp.ewald(sp.periodic(1.0), r_cut=0.5, alpha=alpha, kmax=kmax)


def test_madelung_constants_to_1e10():
    energy = _cell_energy()
    x, q = _rock_salt()
    # U = -M N_pairs / r_nn; four ion pairs at r_nn = 1/2
    assert abs(-float(energy(x, dict(charges=q))) * 0.5 / 4 - MADELUNG_NACL) < 1e-10
    # CsCl: Cs at the corner, Cl at the centre; six uncharged sites pad it to eight
    # particles so that it shares the compiled program (they add nothing)
    cscl = jnp.array([[0.0, 0, 0], [.5, .5, .5], [.25, 0, 0], [0, .25, 0], [0, 0, .25],
                      [.25, .25, 0], [.25, 0, .25], [0, .25, .25]])
    e = energy(cscl, dict(charges=jnp.array([1.0, -1.0, 0, 0, 0, 0, 0, 0])))
    assert abs(-float(e) * np.sqrt(3) / 2 - MADELUNG_CSCL) < 1e-10


@pytest.fixture(scope="module")
def cell():
    """A small random neutral box: (x, q, L) with unequal charges (eight, as rock salt's
    cell, so that the unit-cell tests share one compiled program)."""
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1.0, (8, 3))
    return jnp.asarray(x), jnp.array([1.0, -1.0, 0.5, -0.5, 0.3, -0.3, 0.7, -0.7]), 1.0


def test_direct_lattice_sum(cell):
    """Spherical summation over images (de Leeuw, Perram & Smith, Proc. R. Soc. A 373, 27
    (1980)): U_sphere = U_ewald + 2 pi |M|^2 / 3V for a neutral cell with dipole M."""
    x, q, L = cell
    xn, qn = np.asarray(x), np.asarray(q)
    R = 20
    r = np.arange(-R, R + 1)
    images = np.stack(np.meshgrid(r, r, r, indexing="ij"), -1).reshape(-1, 3).astype(float)
    images = images[np.sum(images**2, 1) <= R * R] * L
    direct = 0.0
    for i in range(len(qn)):
        d = xn[i] - xn[:, None, :] + images[None]              # (n, images, 3)
        rr = np.sqrt(np.sum(d * d, -1))
        inv = np.divide(1.0, rr, out=np.zeros_like(rr), where=rr > 0)
        direct += 0.5 * qn[i] * np.sum(qn[:, None] * inv)
    dipole = qn @ xn
    direct -= 2 * np.pi * dipole @ dipole / (3 * L**3)
    e = float(_cell_energy()(x, dict(charges=q)))
    # the spherical sum's truncation at R = 20 cells: 1.2e-7 relative (3e-8 at R = 30)
    assert abs(e - direct) < 2e-7 * abs(direct)


def test_net_charge_background_makes_energy_alpha_independent(cell):
    """With the neutralising background the converged energy of a charged box does not
    depend on alpha; without it, it shifts by -pi Q^2 / (2 V alpha^2)."""
    x, q, L = cell
    q = q.at[0].set(1.7)                                          # Q = 0.7
    e = [float(_cell_energy(a)(x, dict(charges=q))) for a in (11.0, 13.0)]
    assert abs(e[0] - e[1]) < 1e-10 * abs(e[0])


@pytest.fixture(scope="module")
def box():
    """32 random +-1 charges in a box of side 2 with two excluded pairs."""
    rng = np.random.default_rng(0)
    n, L = 32, 2.0
    x = rng.uniform(0, L, (n, 3))
    x[1] = x[0] + [0.1, 0.0, 0.0]
    x[3] = (x[2] + [0.0, 0.12, 0.05]) % L
    q = np.tile([1.0, -1.0], n // 2)
    return jnp.asarray(x), jnp.asarray(q), L, jnp.array([[0, 1], [2, 3]])


TOLERANCE = 1e-4


def _pme(L, **kw):
    """The PME energy all default tests share (one compiled program per method)."""
    box = jnp.broadcast_to(jnp.asarray(L, jnp.float64), (3,))     # one shape for every box
    return sp.pme(sp.periodic(box), 0.9, exclusions=jnp.array([[0, 1], [2, 3]]),
                  exclusion_scale=jnp.zeros(2), **kw)


@pytest.fixture(scope="module")
def reference(box):
    x, q, L, excl = box
    energy = sp.ewald(sp.periodic(L), 0.9, tolerance=1e-8, exclusions=excl,
                      exclusion_scale=jnp.zeros(2))
    return energy, energy.energy_and_forces(x, dict(charges=q))


def _force_error(f, f0, n, L):
    """RMS force error in units of q_rms^2 / l^2 (l = (V/n)^(1/3)), as the tolerance."""
    return np.sqrt(np.mean(np.sum((f - f0) ** 2, axis=1))) * (L**3 / n) ** (2 / 3)


def test_pme_forces_within_tolerance_of_ewald(box, reference):
    x, q, L, _ = box
    _, (_, f0) = reference
    _, f = _pme(L, tolerance=TOLERANCE).energy_and_forces(x, dict(charges=q))
    assert _force_error(f, f0, len(q), L) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("order, tolerance", [(4, 1e-4), (5, 1e-6), (6, 1e-6), (8, 1e-6)])
def test_pme_forces_within_tolerance_other_orders(box, reference, order, tolerance):
    x, q, L, _ = box
    _, (_, f0) = reference
    _, f = _pme(L, tolerance=tolerance, order=order).energy_and_forces(x, dict(charges=q))
    assert _force_error(f, f0, len(q), L) < tolerance


def test_exclusions_remove_the_minimum_image_pair(box, reference):
    """Excluding (i, j) removes exactly k q_i q_j / r_ij of the minimum image (scale 1
    keeps the pair: the plain Ewald sum)."""
    x, q, L, excl = box
    energy, (e, _) = reference
    children, static = energy.tree_flatten()
    kept = type(energy).tree_unflatten(static, (*children[:4], jnp.ones(2)))
    full, _ = kept.energy_and_forces(x, dict(charges=q))
    d = np.asarray(x)[[0, 2]] - np.asarray(x)[[1, 3]]
    d -= L * np.round(d / L)
    r = np.sqrt(np.sum(d * d, 1))
    pairs = np.asarray(q)[[0, 2]] * np.asarray(q)[[1, 3]] / r
    assert abs(float(e) - (float(full) - pairs.sum())) < 1e-11 * abs(float(full))


def test_forces_and_charge_gradients_match_finite_differences(box):
    x, q, L, _ = box
    energy = _pme(L, tolerance=TOLERANCE)
    _, f = energy.energy_and_forces(x, dict(charges=q))
    dq = jax.grad(lambda q: energy(x, dict(charges=q)))(q)
    h = 1e-5

    def e_fn(x, q):                        # the compiled program of energy_and_forces
        return float(energy.energy_and_forces(x, dict(charges=q))[0])

    for i, a in ((0, 0), (5, 2)):
        step = jnp.zeros_like(x).at[i, a].set(h)
        fd = (e_fn(x + step, q) - e_fn(x - step, q)) / (2 * h)
        assert abs(-fd - float(f[i, a])) < 1e-6 * abs(float(f[i, a])) + 1e-8
    for i in (0, 7):
        step = jnp.zeros_like(q).at[i].set(h)
        fd = (e_fn(x, q + step) - e_fn(x, q - step)) / (2 * h)
        assert abs(fd - float(dq[i])) < 1e-7 * abs(float(dq[i]))


@pytest.mark.slow
def test_virial_matches_box_derivative(box):
    """W_yy = -L_y dU/dL_y at fixed scaled coordinates, by central differences."""
    x, q, L, _ = box
    params = dict(charges=q)
    energy = _pme(L, tolerance=TOLERANCE)
    w = energy.virial_tensor(x, params)
    h = 1e-6

    def scaled(s):
        lam = jnp.array([1.0, 1.0 + s, 1.0])
        other = _pme(L * lam, alpha=energy.alpha, grid=energy.grid)
        return float(other.energy_and_forces(x * lam, params)[0])

    assert abs(-(scaled(h) - scaled(-h)) / (2 * h) - float(w[1])) < 1e-6 * abs(float(w[1]))


@pytest.mark.slow
def test_ewald_virial_is_energy_for_coulomb(box):
    """Coulomb is homogeneous of degree -1, so for a converged Ewald sum of a neutral box
    without exclusions W = sum_a W_aa = U."""
    x, q, L, _ = box
    energy = sp.ewald(sp.periodic(L), 0.9, tolerance=1e-10)
    w = jnp.sum(energy.virial_tensor(x, dict(charges=q)))
    assert abs(float(w) - float(energy(x, dict(charges=q)))) < 1e-9 * abs(float(w))


@pytest.mark.slow
def test_neighbor_list_equals_all_pairs(box):
    x, q, L, _ = box
    energy = _pme(L, tolerance=TOLERANCE)
    nbrs = sp.neighbor_list(sp.periodic(L), x, r_cut=0.9, skin=0.05)
    e0, f0 = energy.energy_and_forces(x, dict(charges=q))
    e1, f1 = energy.energy_and_forces(x, dict(charges=q), neighbors=nbrs)
    assert abs(float(e1 - e0)) < 1e-12 * abs(float(e0))
    assert float(jnp.max(jnp.abs(f1 - f0))) < 1e-11 * float(jnp.max(jnp.abs(f0)))


BAD = {"small_box": (1.5, None), "negative_box": (-2.0, None), "alpha": (2.0, -1.0),
       "nan_alpha": (2.0, np.nan)}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_bad_box_or_alpha_refused_eagerly(box, bad):
    x, q, L, _ = box
    side, alpha = BAD[bad]
    with pytest.raises(ValueError, match="2 \\* r_cut|alpha|positive"):
        energy = _pme(L, tolerance=TOLERANCE)
        children, static = energy.tree_flatten()
        alpha = energy.alpha if alpha is None else alpha
        type(energy).tree_unflatten(static, (sp.periodic(jnp.full(3, side)), alpha,
                                             *children[2:]))(
            x, dict(charges=q))


def test_bad_box_or_alpha_nan_when_traced(box):
    """Traced (jit of vmap), each bad member gives NaN energies and forces; a good member
    does not."""
    x, q, L, _ = box
    energy = _pme(L, tolerance=TOLERANCE)
    children, static = energy.tree_flatten()

    def run(side, alpha, method):
        e = type(energy).tree_unflatten(static, (sp.periodic(jnp.full(3, side)), alpha,
                                                 *children[2:]))
        return getattr(e, method)(x, dict(charges=q))

    sides = jnp.array([L] + [BAD[k][0] for k in sorted(BAD)])
    alphas = jnp.array([energy.alpha] + [energy.alpha if BAD[k][1] is None else BAD[k][1]
                                         for k in sorted(BAD)])
    e, f = jax.jit(jax.vmap(lambda s, a: run(s, a, "energy_and_forces")))(sides, alphas)
    assert np.isfinite(e[0]) and np.all(np.isfinite(f[0]))
    assert np.all(np.isnan(e[1:])) and np.all(np.isnan(f[1:]))


def test_construction_refuses_bad_arguments():
    with pytest.raises(ValueError, match="periodic"):
        sp.ewald(sp.free(), 1.0)
    with pytest.raises(ValueError, match="half"):
        sp.pme(sp.periodic(1.0), 0.6)
    with pytest.raises(ValueError, match="tolerance"):
        sp.ewald_parameters(2.0, 0.9, 1.5)
    with pytest.raises(ValueError, match="order"):
        sp.pme(sp.periodic(2.0), 0.9, order=2)


def test_tolerance_whose_grid_does_not_fit_is_refused_before_allocating(monkeypatch):
    """Issue 41: tolerance=1e-15 on a 16-ion box sized a 43740^3 PME grid (1.6 PB asked of
    XLA). The builders refuse it eagerly, naming the tolerance, the grid and its memory and
    suggesting a tolerance that fits; nothing is allocated (the builder never reaches JAX
    arrays), and it takes milliseconds."""
    import time

    from simlib.particles import _electrostatics

    def no_allocation(*args, **kwargs):
        raise AssertionError("the reciprocal-space arrays were built")

    monkeypatch.setattr(_electrostatics, "_spread_pure", no_allocation)
    monkeypatch.setattr(_electrostatics, "_half_kvectors", no_allocation)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"tolerance=1e-15.*43740x43740x43740 grid") as info:
        sp.pme(sp.periodic(2.0), r_cut=0.9, tolerance=1e-15)
    with pytest.raises(ValueError, match=r"tolerance=1e-06.*kmax=\(370, 370, 370\)"):
        sp.ewald(sp.periodic(40.0), r_cut=0.5, tolerance=1e-6)
    assert time.perf_counter() - start < 0.5
    message = str(info.value)
    assert "GiB" in message or "PiB" in message or "TiB" in message
    suggested = float(re.search(r"tolerance=(\S+) is the smallest", message).group(1))
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # near the limit: it warns
        grid = sp.pme(sp.periodic(2.0), r_cut=0.9, tolerance=suggested).grid
    assert 256**3 < np.prod(grid) and 1e-15 < suggested < 1e-6


def test_large_grid_warns_and_usual_tolerances_are_quiet():
    """Above 256^3 grid points (27 waters' box at tolerance 1e-7: 288^3) a UserWarning gives
    the grid and its memory; the usual tolerances build silently, and an explicit grid is
    the caller's choice."""
    with pytest.warns(UserWarning, match=r"tolerance=1e-07.*288x288x288 grid.*MiB"):
        sp.pme(sp.periodic(0.93), r_cut=0.45, tolerance=1e-7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for tolerance in (1e-4, 1e-5, 1e-6):
            sp.pme(sp.periodic(0.93), r_cut=0.45, tolerance=tolerance)
            sp.ewald(sp.periodic(0.93), r_cut=0.45, tolerance=tolerance)
        sp.ewald(sp.periodic(1.0), r_cut=0.5, tolerance=1e-12)
        assert sp.pme(sp.periodic(2.0), 0.9, tolerance=1e-15, grid=32).grid == (32, 32, 32)


def _openmm(x, q, L, alpha, grid, r_cut, exclusions, platform="Reference"):
    import openmm as mm

    system = mm.System()
    force = mm.NonbondedForce()
    for qi in np.asarray(q):
        system.addParticle(1.0)
        force.addParticle(float(qi), 1.0, 0.0)
    for i, j in np.asarray(exclusions):
        force.addException(int(i), int(j), 0.0, 1.0, 0.0)
    system.setDefaultPeriodicBoxVectors(mm.Vec3(L, 0, 0), mm.Vec3(0, L, 0), mm.Vec3(0, 0, L))
    force.setNonbondedMethod(mm.NonbondedForce.PME)
    force.setCutoffDistance(r_cut)
    force.setPMEParameters(alpha, *grid)
    force.setUseDispersionCorrection(False)
    system.addForce(force)
    context = mm.Context(system, mm.VerletIntegrator(1e-3),
                         mm.Platform.getPlatformByName(platform))
    context.setPositions([mm.Vec3(*map(float, r)) for r in np.asarray(x)])
    state = context.getState(getEnergy=True, getForces=True)
    return (state.getPotentialEnergy()._value,
            np.asarray(state.getForces(asNumpy=True)._value))


@pytest.mark.slow
def test_pme_matches_openmm():
    """OpenMM's reference PME (kJ/mol, nm) on the same box, charges, alpha, grid and cutoff."""
    pytest.importorskip("openmm")
    rng = np.random.default_rng(1)
    n, L = 96, 2.5
    x = rng.uniform(0, L, (n, 3))
    x[1] = x[0] + [0.1, 0, 0]
    q = np.tile([0.8, -0.8], n // 2)
    excl = np.array([[0, 1]])
    energy = sp.pme(sp.periodic(L), 1.0, tolerance=TOLERANCE, exclusions=excl,
                    coulomb_constant=138.935457644382)   # OpenMM's ONE_4PI_EPS0
    e0, f0 = _openmm(x, q, L, energy.alpha, energy.grid, 1.0, excl)
    e, f = energy.energy_and_forces(jnp.asarray(x), dict(charges=jnp.asarray(q)))
    assert abs(float(e) - e0) < 1e-10 * abs(e0)
    assert np.sqrt(np.mean((f - f0) ** 2)) / np.sqrt(np.mean(f0**2)) < 1e-5
