"""simlib.particles: pair energies and forces, mixing rules, spaces, observables, initial
conditions and FIRE minimisation.

Every value is checked against something outside simlib: plain numpy sums over all pairs
(minimum images found by trying every neighbouring image), central finite differences,
closed forms and sampling statistics.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import pdist

from simlib import particles as sp
from simlib.particles import _native

NATIVE = _native.load() is not None

# --------------------------------------------------------------------------------------
# numpy references


def np_pairs(x, box):
    """Pairs i < j and their displacement x_i - x_j, the shortest over all images."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    i, j = np.triu_indices(n, 1)
    dv = x[i] - x[j]
    if box is not None:
        box = np.broadcast_to(np.asarray(box, np.float64), (d,))
        shifts = np.array(list(itertools.product((-2, -1, 0, 1, 2), repeat=d))) * box
        cand = dv[:, None, :] + shifts[None]
        best = np.argmin(np.sum(cand * cand, axis=-1), axis=1)
        dv = cand[np.arange(len(i)), best]
    return i, j, dv


def np_lj(r, p):
    s6 = (p["sigma"] / r) ** 6
    return 4 * p["epsilon"] * (s6 * s6 - s6)


def np_lj_du(r, p):
    s6 = (p["sigma"] / r) ** 6
    return 4 * p["epsilon"] * (-12 * s6 * s6 + 6 * s6) / r


def np_wca(r, p):
    rc = 2 ** (1 / 6) * p["sigma"]
    return np.where(r < rc, np_lj(r, p) + p["epsilon"], 0.0)


def np_wca_du(r, p):
    rc = 2 ** (1 / 6) * p["sigma"]
    return np.where(r < rc, np_lj_du(r, p), 0.0)


def np_morse(r, p):
    x = 1 - np.exp(-p["alpha"] * (r - p["r0"]))
    return p["D"] * (x * x - 1)


def np_morse_du(r, p):
    e = np.exp(-p["alpha"] * (r - p["r0"]))
    return 2 * p["D"] * (1 - e) * p["alpha"] * e


def np_gravity(r, p):
    return -p["G"] * p["masses"] / np.sqrt(r * r + p["softening"] ** 2)


def np_gravity_du(r, p):
    return p["G"] * p["masses"] * r / (r * r + p["softening"] ** 2) ** 1.5


def np_coulomb(r, p):
    return p.get("k", 1.0) * p["charges"] / r


def np_coulomb_du(r, p):
    return -p.get("k", 1.0) * p["charges"] / r**2


NP_POTENTIALS = {
    sp.lennard_jones: (np_lj, np_lj_du),
    sp.wca: (np_wca, np_wca_du),
    sp.morse: (np_morse, np_morse_du),
    sp.gravity: (np_gravity, np_gravity_du),
    sp.coulomb: (np_coulomb, np_coulomb_du),
}


def np_pair_params(params, i, j, mixing=None):
    """Per-pair parameters, combined by the documented rules, written out in numpy."""
    rules = {
        "masses": lambda a, b: a * b,
        "charges": lambda a, b: a * b,
        "sigma": lambda a, b: 0.5 * (a + b),
        "epsilon": lambda a, b: np.sqrt(a * b),
        **(mixing or {}),
    }
    out = {}
    for name, value in params.items():
        value = np.asarray(value)
        if name == "species":
            continue
        if value.ndim == 0:
            out[name] = value
        elif value.ndim == 2:
            s = np.asarray(params["species"])
            out[name] = value[s[i], s[j]]
        else:
            out[name] = np.asarray(rules[name](value[i], value[j]))
    return out


def np_energy_forces(potential, x, params, box=None, r_cut=None, shift=False, mixing=None):
    u, du = NP_POTENTIALS[potential]
    x = np.asarray(x, np.float64)
    i, j, dv = np_pairs(x, box)
    r = np.linalg.norm(dv, axis=1)
    p = np_pair_params(params, i, j, mixing)
    e = u(r, p)
    if shift:
        e = e - u(np.full_like(r, r_cut), p)
    c = du(r, p) / r
    keep = np.ones_like(r, bool) if r_cut is None else r < r_cut
    e, c = np.where(keep, e, 0.0), np.where(keep, c, 0.0)
    f = -c[:, None] * dv                      # force on i from j
    forces = np.zeros_like(x)
    np.add.at(forces, i, f)
    np.add.at(forces, j, -f)
    return float(np.sum(e)), forces, float(np.sum(np.abs(e)))


def finite_difference_forces(energy_fn, x, h=1e-5):
    """-dU/dx by central differences, one coordinate at a time."""
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        out[idx] = -(float(energy_fn(xp)) - float(energy_fn(xm))) / (2 * h)
    return out


def random_positions(rng, n, d, box=None, extent=None, min_sep=0.9, near_faces=False):
    """``n`` points at least ``min_sep`` apart (over images in a periodic box). With
    ``near_faces``, the first particles sit next to faces and a corner with partners just
    across the boundary."""
    box_v = None if box is None else np.broadcast_to(np.asarray(box, float), (d,))
    hi = box_v if box_v is not None else np.full(d, extent)
    pts = []

    def far_enough(p):
        if not pts:
            return True
        dv = np.asarray(pts) - p
        if box_v is not None:
            dv = dv - box_v * np.round(dv / box_v)
        return np.min(np.linalg.norm(dv, axis=1)) >= min_sep

    if near_faces and box_v is not None:
        for k in range(d):
            # a just inside one face, b just inside the opposite one, 1.0 apart through it.
            a = rng.uniform(0.3, 0.7, d) * box_v
            a[k] = rng.uniform(0.0, 0.05) if k % 2 == 0 else box_v[k] - rng.uniform(1e-9, 0.05)
            b = a + rng.uniform(-0.3, 0.3, d)
            b[k] = (a[k] + (-1.0 if k % 2 == 0 else 1.0)) % box_v[k]
            for p in (a, b):
                if far_enough(p):
                    pts.append(p)
        for p in (np.full(d, 0.02), box_v - 0.65):        # a pair across a corner
            if far_enough(p):
                pts.append(p)
    while len(pts) < n:
        p = rng.uniform(0, 1, d) * hi
        if far_enough(p):
            pts.append(p)
    return np.asarray(pts[:n])


# --------------------------------------------------------------------------------------
# 1. energies and forces against numpy and finite differences


def _lb(rng, n):
    return dict(sigma=rng.uniform(0.85, 1.15, n), epsilon=rng.uniform(0.5, 1.5, n))


CASES = {
    # id: (potential, dim, box, r_cut, shift, params(rng, n), mixing)
    "lj-periodic3d-cut-shift": (sp.lennard_jones, 3, (6.0, 6.5, 7.0), 2.5, True,
                                lambda rng, n: dict(sigma=1.0, epsilon=1.3), None),
    "lj-periodic3d-cut-lorentz-berthelot": (sp.lennard_jones, 3, 6.0, 2.5, False, _lb, None),
    "lj-periodic2d-cut-shift-species": (
        sp.lennard_jones, 2, 6.0, 2.5, True,
        lambda rng, n: dict(species=rng.integers(0, 3, n),
                            sigma=np.array([[1.0, 0.9, 1.05], [0.9, 1.1, 0.95],
                                            [1.05, 0.95, 0.9]]),
                            epsilon=np.array([[1.0, 1.5, 0.8], [1.5, 0.7, 1.1],
                                              [0.8, 1.1, 1.3]])), None),
    "lj-free3d-all-pairs-lorentz-berthelot": (sp.lennard_jones, 3, None, None, False, _lb, None),
    "wca-periodic3d-all-images-lorentz-berthelot": (sp.wca, 3, 5.5, None, False, _lb, None),
    "morse-periodic2d-cut-shift": (sp.morse, 2, (6.0, 6.8), 2.8, True,
                                   lambda rng, n: dict(D=1.2, alpha=1.7, r0=1.1), None),
    "morse-free3d-cut-shift-custom-mixing": (
        sp.morse, 3, None, 2.6, True,
        lambda rng, n: dict(D=rng.uniform(0.5, 1.5, n), alpha=1.5, r0=rng.uniform(1, 1.3, n)),
        {"D": lambda a, b: jnp.sqrt(a * b), "r0": lambda a, b: jnp.maximum(a, b)}),
    "gravity-free3d-softened": (
        sp.gravity, 3, None, None, False,
        lambda rng, n: dict(G=1.5, softening=0.1, masses=rng.uniform(0.5, 2.0, n)), None),
    "gravity-free2d-point-masses": (
        sp.gravity, 2, None, None, False,
        lambda rng, n: dict(G=1.0, softening=0.0, masses=rng.uniform(0.5, 2.0, n)), None),
    "coulomb-free3d": (
        sp.coulomb, 3, None, None, False,
        lambda rng, n: dict(k=2.0, charges=rng.choice([-1.0, 1.0], n) * rng.uniform(.5, 1, n)),
        None),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_energy_and_forces_against_numpy_and_finite_differences(case):
    potential, dim, box, r_cut, shift, make_params, mixing = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    n = 24 if dim == 3 else 20
    x = random_positions(rng, n, dim, box=box, extent=4.5, near_faces=box is not None)
    params = make_params(rng, n)
    space = sp.free() if box is None else sp.periodic(box)
    energy = sp.pair_energy(potential, space, r_cut, shift=shift, mixing=mixing)

    @jax.jit
    def all_of_it(x):
        return (energy(x, params), energy.forces(x, params), sp.forces(energy)(x, params),
                -jax.grad(energy)(x, params))

    e_ref, f_ref, scale = np_energy_forces(potential, x, params, box, r_cut, shift, mixing)
    e, f, f2, g = (np.asarray(a) for a in all_of_it(jnp.asarray(x)))
    f_scale = np.max(np.abs(f_ref))
    assert f_scale > 0 and scale > 0
    assert e == pytest.approx(e_ref, rel=0, abs=1e-12 * scale)
    np.testing.assert_allclose(f, f_ref, rtol=0, atol=1e-12 * f_scale)
    np.testing.assert_array_equal(f, f2)
    np.testing.assert_allclose(g, f_ref, rtol=0, atol=1e-12 * f_scale)
    fd = finite_difference_forces(lambda y: all_of_it(jnp.asarray(y))[0], x)
    np.testing.assert_allclose(fd, f_ref, rtol=0, atol=1e-6 * f_scale)

    if box is not None:
        # The configuration does test the boundary: some pairs interact only through an image.
        i, j, dv = np_pairs(x, box)
        direct = np.linalg.norm(x[i] - x[j], axis=1)
        imaged = np.linalg.norm(dv, axis=1)
        reach = np.inf if r_cut is None else r_cut
        assert np.sum((imaged < reach) & (direct > imaged + 1e-9)) >= 2
    if r_cut is not None:
        r = np.linalg.norm(np_pairs(x, box)[2], axis=1)
        assert np.any(r > r_cut) and np.any(r < r_cut)        # the cutoff is active
        assert np.min(np.abs(r - r_cut)) > 1e-4                # and no pair sits on it


def test_shift_moves_each_pair_within_the_cutoff_by_u_at_the_cutoff():
    rng = np.random.default_rng(7)
    x = random_positions(rng, 20, 3, box=6.0)
    params = dict(sigma=1.0, epsilon=1.0)
    plain = sp.pair_energy(sp.lennard_jones, sp.periodic(6.0), 2.5)
    shifted = sp.pair_energy(sp.lennard_jones, sp.periodic(6.0), 2.5, shift=True)
    (e0, f0), (e1, f1) = jax.jit(lambda x: (plain.energy_and_forces(x, params),
                                            shifted.energy_and_forces(x, params)))(x)
    r = np.linalg.norm(np_pairs(x, 6.0)[2], axis=1)
    n_inside = int(np.sum(r < 2.5))
    u_c = 4 * (2.5**-12 - 2.5**-6)
    assert n_inside > 5
    assert float(e1) == pytest.approx(float(e0) - n_inside * u_c, rel=1e-13)
    np.testing.assert_allclose(f1, f0, rtol=1e-13, atol=1e-13)


def test_a_padded_last_tile_does_not_change_the_sum():
    rng = np.random.default_rng(3)
    x = random_positions(rng, 23, 3, box=6.0)
    params = dict(sigma=1.0, epsilon=1.0)
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(6.0), 2.5, tile=5)   # 5 tiles
    e_ref, f_ref, scale = np_energy_forces(sp.lennard_jones, x, params, 6.0, 2.5)
    e, f = jax.jit(lambda x: energy.energy_and_forces(x, params))(x)
    assert float(e) == pytest.approx(e_ref, abs=1e-12 * scale)
    np.testing.assert_allclose(f, f_ref, atol=1e-12 * np.abs(f_ref).max())


@pytest.mark.parametrize("periodic", [True, False])
def test_harmonic_bonds_against_numpy(periodic):
    rng = np.random.default_rng(11)
    d, n = (3, 12) if periodic else (2, 10)
    box = 5.0 if periodic else None
    x = random_positions(rng, n, d, box=box, extent=4.0, min_sep=0.5, near_faces=periodic)
    bonds = np.array([[k, k + 1] for k in range(n - 1)] + [[0, n - 1], [2, 7]])
    k_bond = rng.uniform(50, 150, len(bonds))
    params = dict(k=k_bond, r0=1.0)
    space = sp.periodic(box) if periodic else sp.free()
    energy = sp.bond_energy(sp.harmonic, space, bonds)

    dv = x[bonds[:, 0]] - x[bonds[:, 1]]
    if periodic:
        dv = dv - box * np.round(dv / box)
        assert np.any(np.abs(x[bonds[:, 0]] - x[bonds[:, 1]]) > box / 2)   # bonds wrap
    r = np.linalg.norm(dv, axis=1)
    e_ref = np.sum(0.5 * k_bond * (r - 1.0) ** 2)
    fb = -(k_bond * (r - 1.0) / r)[:, None] * dv
    f_ref = np.zeros_like(x)
    np.add.at(f_ref, bonds[:, 0], fb)
    np.add.at(f_ref, bonds[:, 1], -fb)

    e, f, g = jax.jit(lambda x: (*energy.energy_and_forces(x, params),
                                 -jax.grad(energy)(x, params)))(jnp.asarray(x))
    scale = np.abs(f_ref).max()
    assert float(e) == pytest.approx(e_ref, rel=1e-13)
    np.testing.assert_allclose(f, f_ref, atol=1e-12 * scale)
    np.testing.assert_allclose(g, f_ref, atol=1e-12 * scale)
    energy_jit = jax.jit(lambda x: energy(x, params))
    fd = finite_difference_forces(lambda y: energy_jit(jnp.asarray(y)), x)
    np.testing.assert_allclose(fd, f_ref, atol=1e-6 * scale)


def test_sum_of_pair_and_bond_energies():
    rng = np.random.default_rng(5)
    x = random_positions(rng, 16, 3, box=6.0, min_sep=0.95)
    bonds = np.array([[0, 1], [1, 2], [5, 9]])
    space = sp.periodic(6.0)
    energy = sp.pair_energy(sp.wca, space, 1.5) + sp.bond_energy(sp.harmonic, space, bonds)
    params = dict(sigma=1.0, epsilon=1.0, k=30.0, r0=1.5)
    e_pair, f_pair, _ = np_energy_forces(sp.wca, x, dict(sigma=1.0, epsilon=1.0), 6.0, 1.5)
    dv = x[bonds[:, 0]] - x[bonds[:, 1]]
    dv = dv - 6.0 * np.round(dv / 6.0)
    r = np.linalg.norm(dv, axis=1)
    fb = -(30.0 * (r - 1.5) / r)[:, None] * dv
    np.add.at(f_pair, bonds[:, 0], fb)
    np.add.at(f_pair, bonds[:, 1], -fb)
    e, f, g = jax.jit(lambda x: (*energy.energy_and_forces(x, params),
                                 -jax.grad(energy)(x, params)))(jnp.asarray(x))
    assert float(e) == pytest.approx(e_pair + np.sum(15.0 * (r - 1.5) ** 2), rel=1e-13)
    np.testing.assert_allclose(f, f_pair, atol=1e-12 * np.abs(f_pair).max())
    np.testing.assert_allclose(g, f_pair, atol=1e-12 * np.abs(f_pair).max())


def test_gravity_with_a_scalar_mass_has_forces_that_are_minus_the_energy_gradient():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(5, 3)))
    energy = sp.pair_energy(sp.gravity, sp.free())
    params = dict(G=1.0, softening=0.1, masses=2.0)
    e, f = jax.jit(energy.energy_and_forces)(x, params)
    g = jax.jit(jax.grad(energy))(x, params)
    assert float(e) == pytest.approx(float(jax.jit(energy)(x, params)), rel=1e-12)
    np.testing.assert_allclose(f, -g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,softening", [(jnp.float64, 0.05), (jnp.float64, 0.0),
                                              (jnp.float32, 0.05)])
def test_direct_gravity_kernel_matches_a_numpy_pair_sum_and_the_generic_kernel(dtype,
                                                                               softening):
    """The kernel that serves plain gravity off the CPU (and its gradients everywhere):
    against a numpy double sum, 103 bodies in tiles of 32 (the last one padded)."""
    from simlib.particles._energy import _gravity_arguments, _gravity_direct

    rng = np.random.default_rng(11)
    x = rng.normal(size=(103, 3))
    m = rng.uniform(0.5, 2.0, 103)
    energy = sp.pair_energy(sp.gravity, sp.free(), tile=32)
    params = dict(G=1.3, softening=jnp.asarray(softening, dtype), masses=jnp.asarray(m, dtype))
    xj = jnp.asarray(x, dtype)
    e, f = jax.jit(lambda x, p: _gravity_direct(energy, x, *_gravity_arguments(x, p)))(xj,
                                                                                      params)
    d = x[:, None, :] - x[None, :, :]
    r2 = np.sum(d * d, -1) + softening**2
    np.fill_diagonal(r2, np.inf)
    s = r2**-0.5
    e_np = -0.5 * 1.3 * np.sum(m[:, None] * m[None, :] * s)
    f_np = -1.3 * m[:, None] * np.sum((m[None, :] * s**3)[:, :, None] * d, axis=1)
    tol = 1e-5 if dtype == jnp.float32 else 1e-13
    assert abs(float(e) - e_np) < tol * abs(e_np)
    np.testing.assert_allclose(np.asarray(f, np.float64), f_np, rtol=0,
                               atol=tol * np.abs(f_np).max())
    if dtype == jnp.float64 and softening > 0:   # gradients: the same as the generic kernel's
        def loss(fn):
            return lambda x, p: fn(x, p)[0] + jnp.sum(jnp.sin(fn(x, p)[1]))

        direct = jax.grad(loss(lambda x, p: _gravity_direct(
            energy, x, *_gravity_arguments(x, p))), argnums=(0, 1))(xj, params)
        generic = jax.grad(loss(energy._energy_and_forces), argnums=(0, 1))(xj, params)
        for a, b in zip(jax.tree_util.tree_leaves(direct), jax.tree_util.tree_leaves(generic),
                        strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def test_gravity_honours_a_custom_mixing_rule_for_masses():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 3))
    m = rng.uniform(0.5, 2.0, 6)
    rule = {"masses": lambda a, b: jnp.sqrt(a * b)}
    energy = sp.pair_energy(sp.gravity, sp.free(), mixing=rule)
    params = dict(G=1.0, softening=0.1, masses=m)
    e_ref, f_ref, _ = np_energy_forces(sp.gravity, x, params, mixing=rule)
    assert float(jax.jit(energy)(x, params)) == pytest.approx(e_ref, rel=1e-12)
    e, f = jax.jit(energy.energy_and_forces)(x, params)
    assert float(e) == pytest.approx(e_ref, rel=1e-12)
    np.testing.assert_allclose(f, f_ref, rtol=1e-12, atol=1e-12)


def test_forces_of_a_plain_function_are_its_negative_gradient():
    def trap(x, params):
        return 0.5 * params["k"] * jnp.sum(x**4)

    x = jnp.asarray(np.random.default_rng(0).normal(size=(7, 3)))
    np.testing.assert_allclose(sp.forces(trap)(x, dict(k=3.0)), -6.0 * np.asarray(x) ** 3,
                               rtol=1e-14)


def test_per_particle_parameter_without_a_mixing_rule_is_an_error():
    energy = sp.pair_energy(sp.morse, sp.free())
    x = jnp.asarray(np.random.default_rng(0).uniform(0, 3, (5, 3)))
    with pytest.raises(ValueError, match=r"params\['D'\] has one value per particle.*mixing"):
        energy(x, dict(D=jnp.ones(5), alpha=1.0, r0=1.0))
    with pytest.raises(ValueError, match=r"params\['alpha'\] must be a scalar"):
        energy(x, dict(D=1.0, alpha=jnp.ones(4), r0=1.0))
    with pytest.raises(KeyError, match=r"params\['r0'\]"):
        energy(x, dict(D=1.0, alpha=1.0))


def test_coulomb_constant_defaults_to_one():
    x = random_positions(np.random.default_rng(2), 6, 2, extent=3.0)
    q = np.array([1.0, -1.0, 2.0, 1.0, -0.5, 1.0])
    energy = sp.pair_energy(sp.coulomb, sp.free())
    e_ref, _, _ = np_energy_forces(sp.coulomb, x, dict(charges=q))
    assert float(energy(x, dict(charges=q))) == pytest.approx(e_ref, rel=1e-13)
    assert float(energy(x, dict(charges=q, k=3.0))) == pytest.approx(3 * e_ref, rel=1e-13)


def test_coulomb_in_a_periodic_box_is_refused():
    with pytest.raises(ValueError, match="coulomb is for free space"):
        sp.pair_energy(sp.coulomb, sp.periodic(5.0))


@pytest.mark.parametrize("bad, match", [
    (dict(r_cut=-1.0), "r_cut must be positive"),
    (dict(shift=True), "shift=True needs an r_cut"),
    (dict(tile=0), "tile must be a positive integer"),
])
def test_pair_energy_argument_errors(bad, match):
    kw = dict(r_cut=None)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        sp.pair_energy(sp.lennard_jones, sp.free(), **kw)


@pytest.mark.parametrize("box, match", [
    (None, "box must be given"), (-1.0, "positive and finite"), (np.ones((2, 2)), "shape"),
    (np.array([1.0, np.inf]), "positive and finite"),
])
def test_periodic_box_errors(box, match):
    with pytest.raises(ValueError, match=match):
        sp.periodic(box)


def test_minimum_image_displacement_across_the_faces():
    space = sp.periodic(np.array([10.0, 4.0]))
    d = space.displacement(jnp.array([9.5, 0.1]), jnp.array([0.5, 3.9]))
    np.testing.assert_allclose(d, [-1.0, 0.2], atol=1e-14)
    np.testing.assert_allclose(space.wrap(jnp.array([[-0.5, 4.5], [10.0, -8.0]])),
                               [[9.5, 0.5], [0.0, 0.0]], atol=1e-14)
    assert float(space.volume(2)) == 40.0
    with pytest.raises(ValueError, match="free space has no volume"):
        sp.free().volume(3)


# --------------------------------------------------------------------------------------
# 4. symmetries (hypothesis)

N_SYM = {2: 14, 3: 16}
LJ = dict(sigma=1.0, epsilon=1.0)


@jax.jit
def _lj_periodic(x, box):
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), 2.4, shift=True)
    return energy.energy_and_forces(x, LJ)


@jax.jit
def _morse_free(x):
    energy = sp.pair_energy(sp.morse, sp.free())
    return energy.energy_and_forces(x, dict(D=1.0, alpha=1.4, r0=1.1))


def _rotation(rng, d):
    q, r = np.linalg.qr(rng.normal(size=(d, d)))
    q = q * np.sign(np.diag(r))
    if np.linalg.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), dim=st.sampled_from([2, 3]),
       sides=st.lists(st.floats(5.0, 8.0, allow_subnormal=False), min_size=3, max_size=3),
       shift=st.lists(st.floats(-20.0, 20.0, allow_subnormal=False), min_size=3, max_size=3))
def test_periodic_energy_is_invariant_under_translation_and_images(seed, dim, sides, shift):
    rng = np.random.default_rng(seed)
    box = np.asarray(sides[:dim])
    x = random_positions(rng, N_SYM[dim], dim, box=box, min_sep=0.85, near_faces=True)
    e0, f0 = (np.asarray(a) for a in _lj_periodic(jnp.asarray(x), jnp.asarray(box)))
    e_ref, _, scale = np_energy_forces(sp.lennard_jones, x, LJ, box, 2.4, True)
    assert float(e0) == pytest.approx(e_ref, abs=1e-12 * scale)
    tol_e, tol_f = 1e-11 * (1 + scale), 1e-10 * (1 + np.abs(f0).max())
    # Newton's third law: the forces sum to zero.
    np.testing.assert_allclose(f0.sum(0), 0.0, atol=tol_f)
    for moved in (x + np.asarray(shift[:dim]), (x + np.asarray(shift[:dim])) % box):
        e1, f1 = _lj_periodic(jnp.asarray(moved), jnp.asarray(box))
        assert float(e1) == pytest.approx(float(e0), abs=tol_e)
        np.testing.assert_allclose(f1, f0, atol=tol_f)
    # One particle moved by whole box vectors: the same configuration.
    k = rng.integers(0, len(x))
    imaged = x.copy()
    imaged[k] += rng.integers(-3, 4, dim) * box
    e2, f2 = _lj_periodic(jnp.asarray(imaged), jnp.asarray(box))
    assert float(e2) == pytest.approx(float(e0), abs=tol_e)
    np.testing.assert_allclose(f2, f0, atol=tol_f)


@settings(max_examples=15)
@given(seed=st.integers(0, 2**32 - 1), dim=st.sampled_from([2, 3]),
       shift=st.lists(st.floats(-50.0, 50.0, allow_subnormal=False), min_size=3, max_size=3))
def test_free_energy_is_invariant_under_rotation_and_translation(seed, dim, shift):
    rng = np.random.default_rng(seed)
    x = random_positions(rng, N_SYM[dim], dim, extent=4.0, min_sep=0.7)
    rot = _rotation(rng, dim)
    e0, f0 = (np.asarray(a) for a in _morse_free(jnp.asarray(x)))
    e_ref, f_ref, scale = np_energy_forces(sp.morse, x, dict(D=1.0, alpha=1.4, r0=1.1))
    assert float(e0) == pytest.approx(e_ref, abs=1e-12 * scale)
    tol_e, tol_f = 1e-11 * (1 + scale), 1e-10 * (1 + np.abs(f0).max())
    np.testing.assert_allclose(f0.sum(0), 0.0, atol=tol_f)
    moved = x @ rot.T + np.asarray(shift[:dim])
    e1, f1 = _morse_free(jnp.asarray(moved))
    assert float(e1) == pytest.approx(float(e0), abs=tol_e)
    np.testing.assert_allclose(f1, f0 @ rot.T, atol=tol_f)       # forces rotate along


# --------------------------------------------------------------------------------------
# 10. observables


@jax.jit
def _kinetic_observables(x, v, m):
    return dict(k=sp.kinetic_energy(v, m), k_scalar=sp.kinetic_energy(v, 2.5),
                t=sp.temperature(v, m), t_all=sp.temperature(v, m, remove_momentum=False),
                p=sp.total_momentum(v, m), l=sp.angular_momentum(x, v, m))


@pytest.mark.parametrize("d", [2, 3])
def test_kinetic_observables_against_numpy(d):
    rng = np.random.default_rng(d)
    n = 9
    x, v, m = rng.normal(size=(n, d)), rng.normal(size=(n, d)), rng.uniform(0.5, 2, n)
    obs = _kinetic_observables(x, v, m)
    k_ref = 0.5 * np.sum(m[:, None] * v * v)
    assert float(obs["k"]) == pytest.approx(k_ref, rel=1e-14)
    assert float(obs["k_scalar"]) == pytest.approx(1.25 * np.sum(v * v), rel=1e-14)
    assert float(obs["t"]) == pytest.approx(2 * k_ref / (d * (n - 1)), rel=1e-14)
    assert float(obs["t_all"]) == pytest.approx(2 * k_ref / (d * n), rel=1e-14)
    p = m[:, None] * v
    np.testing.assert_allclose(obs["p"], p.sum(0), rtol=1e-14)
    if d == 3:
        l_ref = np.sum(np.cross(x, p), axis=0)
    else:
        l_ref = np.sum(x[:, 0] * p[:, 1] - x[:, 1] * p[:, 0])
    np.testing.assert_allclose(obs["l"], l_ref, rtol=1e-13)
    # Frames at once: (n_frames, n, d).
    vs = rng.normal(size=(4, n, d))
    np.testing.assert_allclose(jax.jit(sp.kinetic_energy)(vs, m),
                               0.5 * np.sum(m[None, :, None] * vs**2, axis=(1, 2)), rtol=1e-14)


def test_pressure_without_interactions_is_the_ideal_gas_law():
    # A cutoff below every distance: no pair interacts, P V = N kT exactly.
    x, box = sp.lattice(3, 0.5)
    rng = np.random.default_rng(1)
    m = rng.uniform(1, 2, len(x))
    v = np.asarray(jax.jit(sp.maxwell_boltzmann)(m, 1.7, key=jax.random.key(2)))
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), 0.5)
    p = jax.jit(lambda v: sp.pressure(energy, x, v, m, LJ))(v)
    kT = np.sum(m[:, None] * v * v) / (3 * len(x))       # kinetic temperature, 3n dof
    assert float(p) == pytest.approx(len(x) * kT / box**3, rel=1e-13)


@pytest.mark.parametrize("dim", [2, 3])
def test_virial_pressure_is_minus_the_volume_derivative_of_the_energy(dim):
    """Scaling positions and box by lambda: dU/dlambda = sum r u'(r) = -W and
    dV/dlambda = dV, so -dU/dV = W / (dV) and P = (2K + W) / (dV). LJ pairs plus harmonic
    bonds, some of them through the boundary."""
    rng = np.random.default_rng(dim)
    box = np.array([6.0, 6.5, 7.0])[:dim]
    x = random_positions(rng, 40 if dim == 3 else 30, dim, box=box, min_sep=0.9,
                         near_faces=True)
    v = rng.normal(size=x.shape)
    m = rng.uniform(1, 2, len(x))
    i, j, dv = np_pairs(x, box)
    close = np.linalg.norm(dv, axis=1) < 1.5
    bonds = np.stack([i[close], j[close]], 1)
    assert len(bonds) >= 3
    assert np.any(np.abs(x[bonds[:, 0]] - x[bonds[:, 1]]) > box / 2)    # through a face
    params = dict(LJ, k=20.0, r0=1.2)
    nbrs = sp.neighbor_list(sp.periodic(box), x, 2.5, 0.3)

    @jax.jit
    def u_and_p(lam, v, nbrs):
        # U with positions and box scaled by lam; P at lam = 1, with and without the list.
        space = sp.periodic(box * lam)
        energy = (sp.pair_energy(sp.lennard_jones, space, 2.5, shift=True)
                  + sp.bond_energy(sp.harmonic, space, bonds))
        p = sp.pressure(energy, x, v, m, params)
        return energy(x * lam, params), p, sp.pressure(energy, x, v, m, params, neighbors=nbrs)

    h = 1e-6
    du_dlam = (float(u_and_p(1 + h, v, nbrs)[0]) - float(u_and_p(1 - h, v, nbrs)[0])) / (2 * h)
    volume = np.prod(box)
    k = 0.5 * np.sum(m[:, None] * v * v)
    _, p, p_nbrs = u_and_p(1.0, v, nbrs)
    assert float(p) == pytest.approx(2 * k / (dim * volume) - du_dlam / (dim * volume),
                                     rel=1e-7)
    assert float(p_nbrs) == pytest.approx(float(p), rel=1e-12)
    _, p_config, _ = u_and_p(1.0, np.zeros_like(v), nbrs)
    assert float(p_config) == pytest.approx(-du_dlam / (dim * volume), rel=1e-7)
    assert abs(float(p_config)) > 0.1 * abs(float(p))         # the virial part matters


_rdf = jax.jit(sp.radial_distribution, static_argnames=("r_max", "n_bins"))


def test_radial_distribution_counts_against_a_numpy_histogram():
    rng = np.random.default_rng(4)
    box = 5.0
    x = rng.uniform(0, box, (3, 40, 3))
    r_max, n_bins = 2.5, 25
    r, g = _rdf(x, sp.periodic(box), r_max=r_max, n_bins=n_bins)
    counts = np.zeros(n_bins)
    for frame in x:
        _, _, dv = np_pairs(frame, box)
        counts += np.histogram(np.linalg.norm(dv, axis=1), bins=n_bins, range=(0, r_max))[0]
    edges = np.linspace(0, r_max, n_bins + 1)
    shell = 4 / 3 * np.pi * (edges[1:] ** 3 - edges[:-1] ** 3)
    np.testing.assert_allclose(r, 0.5 * (edges[1:] + edges[:-1]), rtol=1e-14)
    # g is proportional to counts / shell with a constant normalisation.
    g = np.asarray(g)
    seen = counts > 0
    assert seen.sum() >= 20
    ratio = g[seen] / (counts[seen] / shell[seen])
    np.testing.assert_allclose(ratio, ratio[0], rtol=1e-12)
    np.testing.assert_array_equal(g[~seen], 0.0)


def test_radial_distribution_of_uniform_random_points_is_one():
    n, frames, box = 10, 600, 3.0
    x = np.random.default_rng(0).uniform(0, box, (frames, n, 3))
    _, g = _rdf(x, sp.periodic(box), r_max=1.5, n_bins=5)
    # ~12,000 pair distances below r_max: the mean of g is 1 to about 1%.
    assert float(np.mean(g)) == pytest.approx(1.0, abs=0.03)


def test_radial_distribution_of_many_uniform_points_approaches_one():
    n, box = 400, 8.0
    x = np.random.default_rng(1).uniform(0, box, (4, n, 3))
    _, g = _rdf(x, sp.periodic(box), r_max=4.0, n_bins=8)
    # 4 frames x ~42,000 pairs within r_max per frame; the outer bins hold the most.
    np.testing.assert_allclose(np.asarray(g)[2:], 1.0, atol=0.03)


@pytest.mark.parametrize("periodic", [True, False])
def test_mean_square_displacement_of_ballistic_motion(periodic):
    rng = np.random.default_rng(9)
    n, d, box = 50, 3, 4.0
    x0 = rng.uniform(0, box, (n, d))
    v = rng.normal(size=(n, d))
    t = np.arange(12) * 0.3          # no particle moves half a box between frames
    frames = x0[None] + t[:, None, None] * v[None]
    space = sp.periodic(box) if periodic else None
    if periodic:
        frames = frames % box
        assert np.any(np.abs(t[-1] * v) > box)       # particles cross the box, more than once
    msd = jax.jit(sp.mean_square_displacement)(frames, space)
    np.testing.assert_allclose(msd, np.mean(np.sum(v * v, 1)) * t**2, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------
# initial conditions


@pytest.mark.parametrize("kind, dim, per_cell", [("fcc", 3, 4), ("cubic", 3, 1),
                                                  ("cubic", 2, 1)])
def test_lattice_counts_density_and_neighbours(kind, dim, per_cell):
    n_cells, density = 3, 0.8
    x, box = sp.lattice(n_cells, density, kind=kind, dim=dim)
    x = np.asarray(x)
    n = per_cell * n_cells**dim
    assert x.shape == (n, dim)
    assert n / box**dim == pytest.approx(density, rel=1e-14)
    assert np.all((x >= 0) & (x < box))
    r = np.linalg.norm(np_pairs(x, box)[2], axis=1)
    a = box / n_cells
    nearest = a / math.sqrt(2) if kind == "fcc" else a
    assert r.min() == pytest.approx(nearest, rel=1e-12)
    # Every site has 12 (fcc), 6 (simple cubic) or 4 (square) nearest neighbours.
    coordination = {"fcc": 12, "cubic": 2 * dim}[kind]
    close = np.abs(r - nearest) < 1e-9
    i, j, _ = np_pairs(x, box)
    per_site = np.bincount(np.concatenate([i[close], j[close]]), minlength=n)
    np.testing.assert_array_equal(per_site, coordination)


def test_lattice_errors():
    with pytest.raises(ValueError, match="fcc lattice is 3D"):
        sp.lattice(2, 1.0, kind="fcc", dim=2)
    with pytest.raises(ValueError, match="kind must be"):
        sp.lattice(2, 1.0, kind="bcc")
    with pytest.raises(ValueError, match="density > 0"):
        sp.lattice(2, -1.0)


def test_maxwell_boltzmann_moments():
    n, kT = 20_000, 1.7
    m = np.random.default_rng(0).uniform(0.5, 4.0, n)
    v = np.asarray(jax.jit(sp.maxwell_boltzmann)(m, kT, key=jax.random.key(3)))
    np.testing.assert_allclose((m[:, None] * v).sum(0), 0.0, atol=1e-10)
    z = v * np.sqrt(m / kT)[:, None]           # unit normal per component
    # Variance 1 with standard error sqrt(2 / 60000) = 0.006; 4.5 standard errors.
    assert np.var(z) == pytest.approx(1.0, abs=0.026)
    v2 = np.asarray(jax.jit(sp.maxwell_boltzmann, static_argnames=("n", "dim", "zero_momentum"))(
        2.0, kT, key=jax.random.key(4), n=n, dim=2, zero_momentum=False))
    assert v2.shape == (n, 2)
    assert np.var(v2) == pytest.approx(kT / 2.0, rel=4.5 * math.sqrt(2 / (2 * n)))
    assert np.abs(v2.mean(0)).max() < 4.5 * math.sqrt(kT / 2.0 / n)
    with pytest.raises(ValueError, match="give n"):
        sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(0))


def test_plummer_sphere_is_in_virial_equilibrium():
    n, mass, scale, G = 2000, 3.0, 0.7, 1.3
    plummer = jax.jit(sp.plummer, static_argnames=("n", "total_mass", "scale", "G"))
    x, v, m = (np.asarray(a) for a in plummer(n, key=jax.random.key(0), total_mass=mass,
                                               scale=scale, G=G))
    np.testing.assert_allclose(m, mass / n, rtol=1e-15)
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(v.mean(0), 0.0, atol=1e-12)
    k = 0.5 * np.sum(m[:, None] * v * v)
    u = -G * (mass / n) ** 2 * np.sum(1.0 / pdist(x))
    energy = sp.pair_energy(sp.gravity, sp.free())
    u_simlib = jax.jit(energy)(x, dict(G=G, softening=0.0, masses=m))
    assert float(u_simlib) == pytest.approx(u, rel=1e-12)
    # The analytic potential energy of a Plummer sphere, -3 pi G M^2 / (32 a).
    assert u == pytest.approx(-3 * np.pi * G * mass**2 / (32 * scale), rel=0.05)
    # Virial ratio: seed-to-seed scatter at n = 2000 is about 1%.
    assert 2 * k / abs(u) == pytest.approx(1.0, abs=0.04)
    # The half-mass radius is a / sqrt(2^(2/3) - 1); the median of n radii is within ~3%.
    r_half = np.median(np.linalg.norm(x, axis=1))
    assert r_half == pytest.approx(scale / math.sqrt(2 ** (2 / 3) - 1), rel=0.06)


# --------------------------------------------------------------------------------------
# 11. FIRE


@pytest.mark.parametrize("use_list", [False, True])
def test_fire_relaxes_a_perturbed_fcc_crystal_to_the_lattice_energy(use_list):
    x, box = sp.lattice(3, 1.0)                          # 108 particles
    space = sp.periodic(box)
    r_cut = 2.2                                         # between the 3rd and 4th shells
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut, shift=True)
    e_lattice, f_lattice, _ = np_energy_forces(sp.lennard_jones, x, LJ, box, r_cut, True)
    assert np.abs(f_lattice).max() < 1e-10               # the lattice is a stationary point
    rng = np.random.default_rng(0)
    x1 = np.asarray(x) + rng.normal(0, 0.05, x.shape)
    e_start, _, _ = np_energy_forces(sp.lennard_jones, x1 % box, LJ, box, r_cut, True)
    assert e_start > e_lattice + 1.0
    nbrs = sp.neighbor_list(space, x1, r_cut, 0.15) if use_list else None
    res = jax.jit(lambda y, nb: sp.minimize(energy, y, LJ, space=space, neighbors=nb,
                                            ftol=1e-8))(jnp.asarray(x1), nbrs)
    if use_list:
        assert not bool(res.neighbors.overflow) and int(res.neighbors.n_builds) >= 1
        assert int(sp.missing_pairs(res.neighbors, res.positions)) == 0
    assert bool(res.converged)
    assert float(res.max_force) < 1e-8
    assert 0 < int(res.n_steps) < 10_000
    assert float(res.energy) == pytest.approx(e_lattice, rel=1e-12)
    # Back on the lattice, up to a rigid translation.
    d = np.asarray(space.displacement(res.positions, x))
    np.testing.assert_allclose(d - d.mean(0), 0.0, atol=1e-6)
    e_np, f_np, _ = np_energy_forces(sp.lennard_jones, np.asarray(res.positions), LJ, box,
                                     r_cut, True)
    assert float(res.energy) == pytest.approx(e_np, rel=1e-13)
    assert np.abs(f_np).max() < 1e-8


def test_fire_stops_at_max_steps_without_converging():
    x, box = sp.lattice(2, 1.0)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, 1.5)
    x1 = np.asarray(x) + np.random.default_rng(1).normal(0, 0.05, x.shape)
    res = jax.jit(lambda y: sp.minimize(energy, y, LJ, space=space, ftol=1e-12,
                                        max_steps=5))(jnp.asarray(x1))
    assert int(res.n_steps) == 5 and not bool(res.converged)
    assert float(res.max_force) >= 1e-12


def test_diffusion_coefficient_of_exact_brownian_walkers_across_the_boundary():
    """Walkers with independent Gaussian steps of variance 2 D dt per axis (numpy), wrapped
    into a small periodic box: the MSD unwraps them and the Einstein slope gives D within
    its statistical error (1,000 walkers, 3 sigma)."""
    rng = np.random.default_rng(7)
    D, dt, n, frames, box = 0.35, 0.01, 1000, 201, 3.0
    steps = rng.normal(0.0, np.sqrt(2 * D * dt), (frames - 1, n, 3))
    x = np.concatenate([np.zeros((1, n, 3)), np.cumsum(steps, axis=0)]) + 1.5
    space = sp.periodic(box)
    msd = sp.mean_square_displacement(jnp.asarray(np.mod(x, box)), space)
    times = dt * np.arange(frames)
    got = sp.diffusion_coefficient(times, msd, dim=3)
    # the error of the slope, from 12 independent repeats of the same estimate in numpy
    repeats = []
    for _ in range(12):
        s = rng.normal(0.0, np.sqrt(2 * D * dt), (frames - 1, n, 3))
        xx = np.concatenate([np.zeros((1, n, 3)), np.cumsum(s, axis=0)])
        m = np.mean(np.sum(xx**2, axis=-1), axis=-1)
        repeats.append(np.polyfit(times[40:161], m[40:161], 1)[0] / 6)
    assert abs(got - D) < 3 * np.std(repeats) + 1e-12
    with pytest.raises(ValueError, match="window"):
        sp.diffusion_coefficient(times, msd, dim=3, window=(0.9, 0.5))
    with pytest.raises(ValueError, match="equal length"):
        sp.diffusion_coefficient(times[:-1], msd, dim=3)
