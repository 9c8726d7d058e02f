"""Particle checks hold however a value arrives: eagerly, under ``jit`` and under ``vmap``.

Each case goes through the harness of ``tests/_traced.py``. Where a function has a
:class:`simlib.Result` path (``simulate``, ``minimize``) a traced bad value ends in a
failure code and a :class:`simlib.SolverError` naming the cause; an energy, its forces and
the pressure have none, so a traced bad box gives NaN there (docs/particles.md, "Bad
boxes"). Shapes are static, so a box of the wrong shape is refused in every mode.

Kept cheap: 8 atoms, one step. The default set has every eager case and one traced
representative per check; the rest of the eager x jit x vmap sweep is ``slow``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _traced import MODES, call, failure_code, refuse

import simlib as sl
from simlib import particles as sp
from simlib.particles._dynamics import Carry
from simlib.particles._simulate import _status

LJ = dict(sigma=1.0, epsilon=1.0)
X, BOX = sp.lattice(2, 0.8442, kind="cubic")        # 8 atoms, box 2.116: r_cut <= 1.058
TOO_SMALL = "exceeds half the shortest side|smaller than twice the interaction range"
NOT_POSITIVE = "must be positive and finite|side length that is zero, negative"


def _modes(*default):
    """``MODES`` with those not in ``default`` marked slow."""
    return [m if m in default else pytest.param(m, marks=pytest.mark.slow) for m in MODES]


def _energy(box, r_cut=1.0):
    return sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=r_cut)


def refuse_or_nan(mode, fn, args, *, match):
    """An energy-like function: eagerly a ``ValueError`` matching ``match``; traced (no
    Result path there) every output NaN, never a number."""
    if mode == "eager":
        return refuse(mode, fn, args, match=match, errors=ValueError)
    out = call(mode, fn, args)
    for leaf in jax.tree_util.tree_leaves(out):
        assert np.all(np.isnan(np.asarray(leaf))), f"{mode}: returned {leaf}"


# -- energy functions: r_cut above half the box, a box of zero -------------------------

ENERGY_CALLS = {
    "pair_energy": lambda box, r_cut: _energy(box, r_cut)(X, LJ),
    "forces": lambda box, r_cut: sp.forces(_energy(box, r_cut))(X, LJ),
    "pressure": lambda box, r_cut: sp.pressure(_energy(box, r_cut), X, X, 1.0, LJ),
}


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
@pytest.mark.parametrize("what", list(ENERGY_CALLS))
def test_energy_functions_refuse_r_cut_above_half_the_box(what, mode):
    # old code: all-pair sums over minimum images, quietly missing the second images
    refuse_or_nan(mode, lambda box: ENERGY_CALLS[what](box, 1.5), (BOX,), match=TOO_SMALL)


@pytest.mark.parametrize("what, mode", [
    (what, mode) if (what, mode) == ("pair_energy", "jit") else
    pytest.param(what, mode, marks=pytest.mark.slow)
    for what in ENERGY_CALLS for mode in MODES])
def test_energy_functions_refuse_a_box_of_zero(what, mode):
    # old code: 0.0 from pair_energy under jit (every displacement nan, every pair masked)
    if mode == "eager":
        with pytest.raises(ValueError, match=NOT_POSITIVE):
            ENERGY_CALLS[what](0.0, 1.0)
        return
    refuse_or_nan(mode, lambda box: ENERGY_CALLS[what](box, 1.0), (0.0,), match=NOT_POSITIVE)


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
def test_bond_energy_refuses_a_box_of_zero(mode):
    bonds = jnp.array([[0, 1], [2, 3]])

    def energy(box):
        return sp.bond_energy(sp.harmonic, sp.periodic(box), bonds)(X, dict(k=1.0, r0=0.5))

    if mode == "eager":
        with pytest.raises(ValueError, match=NOT_POSITIVE):
            energy(0.0)
        return
    refuse_or_nan(mode, energy, (0.0,), match=NOT_POSITIVE)


@pytest.mark.parametrize("mode", MODES)          # static: refused while tracing, cheap
def test_positions_of_another_dimension_than_the_box_are_refused(mode):
    # old code: nan energy for (n, 2) positions in a box of three sides
    box3 = jnp.full(3, 4.0)
    refuse(mode, lambda x: _energy(box3)(x, LJ), (X[:, :2],),
           match=r"box has side lengths of shape \(3,\), but positions are 2-dimensional")


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
def test_maxwell_boltzmann_refuses_a_negative_temperature(mode):
    # old code: nan velocities, eagerly too
    refuse_or_nan(mode, lambda kT: sp.maxwell_boltzmann(1.0, kT, key=jax.random.key(0), n=4),
                  (-1.0,), match="kT must be a finite temperature >= 0")


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
def test_a_nan_position_gives_nan_energy_and_forces(mode):
    # old code: energy 0.0 (the nan atom's pairs failed the cutoff test and were dropped)
    x = jnp.asarray(X).at[5, 1].set(jnp.nan)
    out = call(mode, lambda x: (_energy(BOX)(x, LJ), sp.forces(_energy(BOX))(x, LJ)), (x,))
    for leaf in out:
        assert np.all(np.isnan(np.asarray(leaf))), f"{mode}: returned {leaf}"


def _all_images_lj(x, box, r_cut):
    """Lennard-Jones (sigma = epsilon = 1) summed over every periodic image within r_cut,
    in numpy: the lattice sum that the minimum image equals only when r_cut <= box / 2."""
    d = x[:, None, :] - x[None, :, :]
    reach = int(np.ceil(r_cut / box)) + 1
    total = 0.0
    for shift in itertools.product(range(-reach, reach + 1), repeat=3):
        r2 = np.sum((d + box * np.array(shift)) ** 2, axis=-1)
        if shift == (0, 0, 0):
            np.fill_diagonal(r2, np.inf)
        inv6 = 1.0 / r2[r2 < r_cut**2] ** 3
        total += np.sum(4.0 * (inv6 * inv6 - inv6))
    return 0.5 * total


def test_r_cut_above_half_the_box_is_refused_where_images_would_be_missed():
    x, box = sp.lattice(3, 0.8442)                   # 108 atoms, side 5.039
    x64 = np.asarray(x, np.float64)
    reference = _all_images_lj(x64, box, 3.0)
    assert reference == pytest.approx(-749.1056, abs=1e-3)
    # what the minimum image would give at r_cut 3.0 (the old answer): 7.4 off
    d = x64[:, None] - x64[None]
    d -= box * np.round(d / box)
    r2 = np.sum(d * d, axis=-1)
    np.fill_diagonal(r2, np.inf)
    inv6 = 1.0 / r2[r2 < 9.0] ** 3
    assert abs(0.5 * np.sum(4.0 * (inv6 * inv6 - inv6)) - reference) > 7.0
    energy = sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=3.0)
    for run in (lambda: energy(x, LJ), lambda: sp.forces(energy)(x, LJ),
                lambda: sp.pressure(energy, x, x, 1.0, LJ),
                lambda: sp.minimize(energy, x, LJ, space=sp.periodic(box), max_steps=1)):
        with pytest.raises(ValueError, match=r"r_cut=3.0 exceeds half the shortest side"):
            run()
    # below half the box the minimum image is the all-images sum, and it is accepted
    allowed = sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=2.5)
    assert float(allowed(x, LJ)) == pytest.approx(_all_images_lj(x64, box, 2.5), rel=1e-12)


# -- simulate and minimize: a traced box ends in a Result code -------------------------

def _simulate(box, r_cut=1.0, throw=True):
    space = sp.periodic(box)
    traj = sp.simulate(_energy(box, r_cut), sp.State(X, jnp.zeros_like(X), 1.0), LJ,
                       space=space, dt=0.001, n_steps=1, throw=throw)
    return traj.result


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
def test_simulate_refuses_a_traced_box_below_twice_r_cut(mode):
    # old code under jit: ran, missing images, and reported SUCCESSFUL
    err = refuse(mode, lambda box: _simulate(box, 1.5), (BOX,), match=TOO_SMALL)
    if mode != "eager":
        assert err.result == sl.Result.BOX_TOO_SMALL


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_simulate_reports_box_codes_without_throw(mode):
    code = failure_code(mode, lambda box: _simulate(box, 1.5, throw=False), (BOX,))
    assert np.all((code == -1) | (code == sl.Result.BOX_TOO_SMALL))
    code = failure_code(mode, lambda box: _simulate(box, throw=False), (0.0,))
    assert np.all((code == -1) | (code == sl.Result.INVALID_BOX))


@pytest.mark.parametrize("mode", _modes("eager"))
def test_simulate_refuses_a_traced_box_of_zero(mode):
    if mode == "eager":
        with pytest.raises(ValueError, match=NOT_POSITIVE):
            _simulate(0.0)
        return
    err = refuse(mode, _simulate, (0.0,), match=NOT_POSITIVE)
    assert err.result == sl.Result.INVALID_BOX


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["jit", "vmap"])
def test_simulate_refuses_a_traced_box_below_the_neighbour_lists_reach(mode):
    # the list is sized in a box of 2.5 (reach 1.2); the run's box shrinks to 2.116
    nbrs = sp.neighbor_list(sp.periodic(2.5), X, r_cut=1.0, skin=0.2)

    def run(box):
        space = sp.periodic(box)
        return sp.simulate(_energy(box), sp.State(X, jnp.zeros_like(X), 1.0), LJ,
                           space=space, dt=0.001, n_steps=1,
                           neighbors=nbrs.replace(space=space)).result

    err = refuse(mode, run, (BOX,), match=TOO_SMALL)
    assert err.result == sl.Result.BOX_TOO_SMALL


def _minimize(box, throw=True):
    space = sp.periodic(box)
    return sp.minimize(_energy(box, 1.5), X, LJ, space=space, max_steps=2, throw=throw).result


@pytest.mark.parametrize("mode", _modes("eager", "jit"))
def test_minimize_refuses_a_traced_box_below_twice_r_cut(mode):
    # old code: relaxed on the minimum-image surface and returned, eagerly and traced
    err = refuse(mode, _minimize, (BOX,), match=TOO_SMALL)
    if mode != "eager":
        assert err.result == sl.Result.BOX_TOO_SMALL


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["jit", "vmap"])
def test_minimize_reports_the_box_code_without_throw(mode):
    code = failure_code(mode, lambda box: _minimize(box, throw=False), (BOX,))
    assert np.all(code == sl.Result.BOX_TOO_SMALL)


# -- a non-finite state names the right atom -------------------------------------------

def test_a_nonfinite_state_names_its_first_nonfinite_atom():
    # atom 5 has a nan position; atom 7 is the fastest. Old code: named atom 7 (the
    # fastest, as argmax of the speeds), which is how a nan planted on atom 5 of a
    # checkpoint was reported as atom 786.
    x = jnp.asarray(X).at[5, 1].set(jnp.nan)
    v = jnp.zeros_like(x).at[7].set(1.0)
    carry = Carry(x, v, jnp.zeros_like(x), jnp.zeros(()), None, jnp.int32(3))
    code, atom = jax.jit(_status)(carry, 1.0, jnp.asarray(1e-3), jnp.asarray(1.0))
    assert (int(code), int(atom)) == (sl.Result.NONFINITE_STATE, 5)
