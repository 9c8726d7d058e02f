"""A blown-up particle run is an error with its step, never a crash and never garbage.

References outside simlib: the closed-form Lennard-Jones force for the first step of two
overlapping atoms, free flight ``x + v t`` for the move limit, a brute-force search over
periodic images for the minimum image, numpy pair sets and a float64 numpy gravity sum (in
``tests/_extreme_cases.py``) for the extreme-position cases, each run in a child process so
that a crash fails the test instead of killing the run.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

import simlib as sl
from simlib import particles as sp

LJ = dict(sigma=1.0, epsilon=1.0)


def overlap_setup(dtype, with_list):
    """The issue's run: two atoms of the 864-atom LJ lattice started 0.01 sigma apart."""
    positions, box = sp.lattice(6, 0.8442)
    positions = positions.astype(dtype)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    vel = sp.maxwell_boltzmann(1.0, 0.722, key=jax.random.key(0), n=len(positions)).astype(dtype)
    nb = sp.neighbor_list(space, positions, r_cut=2.5, skin=0.3) if with_list else None
    pos = positions.at[1].set(positions[0] + 0.01)
    return energy, sp.State(pos, vel, 1.0), space, nb, float(box)


def lj_force(r):
    """|F| of Lennard-Jones (sigma = epsilon = 1) at distance r: 24 (2 r^-13 - r^-7)."""
    return 24.0 * (2.0 * r**-13 - r**-7)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("with_list", [True, False], ids=["list", "no-list"])
def test_overlapping_atoms_raise_at_the_first_step(dtype, with_list):
    energy, state, space, nb, box = overlap_setup(dtype, with_list)
    # Closed form: after one velocity-Verlet step atom 1 has moved about dt^2/2 F / m.
    move = 0.5 * 0.005**2 * lj_force(0.01 * np.sqrt(3))
    limit = min(0.3 if with_list else 2.5, box / 2)
    assert move > 1e6 * limit
    kw = dict(space=space, dt=0.005, n_steps=200, save_every=100, neighbors=nb)
    match = r"blew up at t=0.00(499|500).* \(step 1\).*\[atom [01]\]"
    with pytest.raises(sl.SolverError, match=match) as err:
        sp.simulate(energy, state, LJ, **kw)
    assert err.value.result == sl.Result.UNSTABLE_DYNAMICS
    assert err.value.solution is not None
    traj = sp.simulate(energy, state, LJ, throw=False, **kw)
    assert int(traj.result) == sl.Result.UNSTABLE_DYNAMICS
    assert int(traj.stats["failed_step"]) == 1
    assert int(traj.stats["failed_atom"]) in (0, 1)


def test_blow_up_is_reported_under_jit_and_grad():
    energy, state, space, nb, _ = overlap_setup(np.float64, True)
    kw = dict(space=space, dt=0.005, n_steps=20, save_every=10, neighbors=nb)

    def run(eps, throw):
        return sp.simulate(energy, state, dict(sigma=1.0, epsilon=eps), throw=throw, **kw)

    traj = jax.jit(lambda e: run(e, False))(1.0)
    assert int(traj.result) == sl.Result.UNSTABLE_DYNAMICS
    assert int(traj.stats["failed_step"]) == 1
    with pytest.raises(Exception, match=r"blew up at .*\(step 1\)"):
        jax.block_until_ready(jax.jit(lambda e: run(e, True))(1.0).positions)

    def loss(eps, throw):
        t = run(eps, throw)
        return jnp.sum(t.final.positions), t.result

    with pytest.raises(Exception, match=r"blew up at .*\(step 1\)"):
        jax.block_until_ready(jax.grad(lambda e: loss(e, True)[0])(1.0))
    _, code = jax.grad(lambda e: loss(e, False), has_aux=True)(1.0)
    assert int(code) == sl.Result.UNSTABLE_DYNAMICS


def two_flyers(speed, box=10.0, with_list=False):
    """Two atoms 5 apart in a box of 10 (beyond r_cut = 2.5, so free flight), the second
    moving at ``speed`` along y."""
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    x = jnp.array([[1.0, 1.0, 1.0], [6.0, 1.0, 1.0]])
    v = jnp.array([[0.0, 0.0, 0.0], [0.0, speed, 0.0]])
    nb = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3) if with_list else None
    return sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=0.1, n_steps=4,
                       neighbors=nb, throw=False)


@pytest.mark.parametrize("with_list, limit", [(False, 2.5), (True, 0.3)])
def test_the_move_limit_is_the_cutoff_or_the_skin(with_list, limit):
    # Free flight moves speed * dt per step: just under the limit is a normal run (and
    # matches x + v t); just over it, the starting velocity already carries the mover too
    # far, so the run fails at step 0 naming it.
    ok = two_flyers(0.99 * limit / 0.1, with_list=with_list)
    assert int(ok.result) == 0 and int(ok.stats["failed_step"]) == -1
    np.testing.assert_allclose(ok.final.positions[1, 1], (1.0 + 4 * 0.99 * limit) % 10.0,
                               rtol=1e-12)
    bad = two_flyers(1.01 * limit / 0.1, with_list=with_list)
    assert int(bad.result) == sl.Result.UNSTABLE_DYNAMICS
    assert (int(bad.stats["failed_step"]), int(bad.stats["failed_atom"])) == (0, 1)


def test_a_start_far_outside_the_box_or_non_finite_fails_at_step_zero():
    space = sp.periodic(10.0)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    x = jnp.array([[1.0, 1.0, 1.0], [6.0, 1.0, 1.0], [1.0, 6.0, 1.0]])
    v = jnp.zeros_like(x)

    def run(x):
        return sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=0.01, n_steps=2,
                           throw=False)

    # 300 boxes out wraps exactly (float64 resolution 1e-13): a normal start.
    assert int(run(x.at[2, 0].add(3000.0)).result) == 0
    # 1e20: eps |x| = 2e4 > L / 1024, its place in the box is lost.
    far = run(x.at[2].set(1e20))
    assert int(far.result) == sl.Result.UNSTABLE_DYNAMICS
    assert (int(far.stats["failed_step"]), int(far.stats["failed_atom"])) == (0, 2)
    nan = run(x.at[1, 2].set(jnp.nan))
    assert int(nan.result) == sl.Result.NONFINITE_STATE
    assert (int(nan.stats["failed_step"]), int(nan.stats["failed_atom"])) == (0, 1)


def test_normal_lj_run_in_float32_never_trips_the_checks():
    positions, box = sp.lattice(6, 0.8442)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    x = positions.astype(np.float32)
    v = sp.maxwell_boltzmann(1.0, 1.44, key=jax.random.key(3), n=len(x)).astype(np.float32)
    nb = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    traj = sp.simulate(energy, sp.State(x, v, 1.0), LJ, space=space, dt=0.005, n_steps=400,
                       save_every=100, neighbors=nb)
    assert int(traj.result) == 0 and int(traj.stats["failed_atom"]) == -1
    e = np.asarray(traj.total_energy, np.float64)
    assert np.ptp(e) < 1e-3 * abs(e[0])            # NVE: the energy is conserved


@pytest.mark.parametrize("call, match", [
    (lambda: sp.simulate(sp.pair_energy(sp.lennard_jones, sp.periodic(10.0), r_cut=2.5),
                         sp.State(jnp.zeros((0, 3)), jnp.zeros((0, 3)), 1.0), LJ,
                         space=sp.periodic(10.0), dt=0.01, n_steps=2),
     r"state.positions has no particles"),
    (lambda: sp.simulate(sp.pair_energy(sp.lennard_jones, sp.periodic(1e-3), r_cut=2.5),
                         sp.State(jnp.zeros((2, 3)), jnp.zeros((2, 3)), 1.0), LJ,
                         space=sp.periodic(1e-3), dt=0.01, n_steps=2),
     r"r_cut=2.5 exceeds half the shortest side of the box"),
    (lambda: sp.neighbor_list(sp.free(), jnp.zeros((0, 3)), r_cut=2.5),
     r"positions has no particles"),
    (lambda: sp.neighbor_list(sp.free(), jnp.array([[0.0, 0.0], [jnp.inf, 1.0]]), r_cut=2.5),
     r"positions must be finite; particle 1"),
    (lambda: sp.pair_energy(sp.gravity, sp.free())(jnp.zeros((0, 3)),
                                                    dict(G=1.0, softening=0.1, masses=1.0)),
     r"positions has no particles"),
])
def test_empty_and_tiny_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_long_range_potentials_are_refused_in_a_box_by_their_mark():
    @functools.wraps(sp.coulomb)
    def scaled(r, p):
        return 2.0 * sp.coulomb(r, p)

    for potential in (sp.coulomb, sp.gravity, functools.partial(sp.coulomb), scaled):
        with pytest.raises(ValueError, match="is for free space"):
            sp.pair_energy(potential, sp.periodic(5.0))
        sp.pair_energy(potential, sp.free())
    sp.pair_energy(lambda r, p: sp.coulomb(r, p), sp.periodic(5.0))   # unmarked: accepted


@pytest.mark.parametrize("box", [7.0, (3.0, 5.0, 11.0)])
def test_minimum_image_is_the_shortest_periodic_image(box):
    rng = np.random.default_rng(0)
    d = rng.uniform(-40, 40, (200, 3))
    L = np.broadcast_to(np.asarray(box), (3,))
    images = np.array(list(itertools.product(range(-20, 21), repeat=1)))[:, 0]
    brute = np.stack([d[:, k][:, None] + L[k] * images[None, :] for k in range(3)], -1)
    shortest = np.take_along_axis(brute, np.argmin(np.abs(brute), axis=1)[:, None], 1)[:, 0]
    space = sp.periodic(box)
    np.testing.assert_allclose(space.minimum_image(jnp.asarray(d)), shortest, atol=1e-12)
    per_axis = [space.minimum_image(jnp.asarray(d[:, k]), k) for k in range(3)]
    np.testing.assert_allclose(np.stack(per_axis, -1), shortest, atol=1e-12)


def numpy_pairs(x, box, radius):
    d = x[:, None, :] - x[None, :, :]
    d = d - box * np.round(d / box)
    i, j = np.nonzero(np.triu(np.sum(d * d, -1) < radius**2, 1))
    return set(zip(i.tolist(), j.tolist(), strict=True))


def test_pure_neighbor_build_is_right_for_positions_a_billion_boxes_away(monkeypatch):
    # The cell of a position 1e9 boxes out must be its wrapped cell (int32 overflows there).
    from simlib.particles import _native
    monkeypatch.setattr(_native, "load", lambda: None)
    x, box = sp.lattice(6, 0.8442)
    space = sp.periodic(box)
    nb = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    assert nb.grid is not None
    shifted = x + 1e9 * box
    out = nb.build(shifted)
    got = {(min(i, int(j)), max(i, int(j))) for i, row in enumerate(np.asarray(out.idx))
           for j in row if j < len(x)}
    assert not bool(out.overflow)
    assert got == numpy_pairs(np.asarray(shifted), float(box), 2.8)
    # A non-finite position triggers a rebuild, and that atom is no one's neighbour.
    bad = nb.update(x.at[7].set(jnp.nan))
    assert int(bad.n_builds) == int(nb.n_builds) + 1
    assert np.all(np.asarray(bad.idx[7]) == len(x))
    assert not np.any(np.asarray(bad.idx) == 7)


# -- extreme positions, each batch in a child process -----------------------------------------

PATTERNS = ("normal", "overlap", "huge", "inf", "nan", "far", "empty", "tiny_box")
CHILD = Path(__file__).with_name("_extreme_cases.py")


def case_strategy(pattern):
    common = dict(pattern=st.just(pattern), seed=st.integers(0, 9), atom=st.integers(0, 200),
                  axis=st.integers(0, 2), delta=st.sampled_from([0.0, 0.01]),
                  boxes=st.sampled_from([3, -2]))
    simulate = st.fixed_dictionaries(dict(
        kind=st.just("simulate"), dtype=st.sampled_from(["float32", "float64"]),
        periodic=st.booleans(), with_list=st.booleans(), **common))
    neighbors = st.fixed_dictionaries(dict(kind=st.just("neighbors"), periodic=st.booleans(),
                                           **common))
    gravity = st.fixed_dictionaries(dict(kind=st.just("gravity"), n=st.integers(2, 20),
                                         softening=st.sampled_from([0.0, 0.1]), **common))
    return st.one_of(simulate, neighbors, gravity)


def expectation(c):
    """What a case must end in: ``"ok"``, ``"fail"`` (an error or a failure code) or
    ``"value_error"`` (a ValueError naming the argument)."""
    p, kind = c["pattern"], c["kind"]
    if p == "empty":
        return "value_error"
    if kind == "simulate":
        if p == "tiny_box":
            return "value_error" if c["periodic"] else "fail"    # 108 atoms in 1e-3^3
        if p in ("overlap", "inf", "nan") or (p == "huge" and c["periodic"]):
            return "fail"
        return "ok"
    if kind == "neighbors":
        if p in ("inf", "nan") or (p in ("tiny_box", "huge") and c["periodic"]):
            return "value_error"
        return "ok"
    # gravity: non-finite inputs or two point masses on top of each other give a
    # non-finite energy or force, everything else the float64 direct sum.
    if p in ("inf", "nan") or (p == "overlap" and c["delta"] == 0 and c["softening"] == 0):
        return "nonfinite"
    return "ok"


def check(c, out):
    want = expectation(c)
    if "error" in out:
        assert want in ("fail", "value_error"), (c, out)
        if want == "value_error":
            assert out["error"] == "ValueError", (c, out)
            assert any(w in out["message"] for w in ("positions", "r_cut", "box")), (c, out)
        return
    assert want != "value_error", (c, out)
    if c["kind"] == "simulate":
        assert (out["code"] != 0) == (want == "fail"), (c, out)
        if want == "fail":
            assert out["step"] >= 0, (c, out)
    elif c["kind"] == "neighbors":
        assert out["missed"] == 0 and out["missed_after_nan"] == 0, (c, out)
        assert not out["lists_nan_atom"], (c, out)
    else:
        if want == "nonfinite":
            assert not out["finite"], (c, out)
        else:
            assert out["finite"], (c, out)
            assert out["energy_error"] < 1e-10 and out["force_error"] < 1e-10, (c, out)


_COMMON = dict(seed=0, atom=3, axis=0, delta=0.01, boxes=3)
# The cases that crashed the native kernels of simlib 6788d6c (segmentation faults).
KNOWN_CRASHES = (
    dict(kind="simulate", pattern="overlap", dtype="float32", periodic=True, with_list=True,
         **_COMMON),
    dict(kind="simulate", pattern="huge", dtype="float32", periodic=True, with_list=True,
         **_COMMON),
    dict(kind="neighbors", pattern="huge", periodic=True, **_COMMON),
    dict(kind="gravity", pattern="overlap", n=8, softening=0.0, **{**_COMMON, "delta": 0.0}),
)


# the pure-JAX kernels ("0") in the slow set (23 s): the default suite keeps the native ones
@pytest.mark.parametrize("native", [pytest.param("0", marks=pytest.mark.slow), "1"])
@settings(max_examples=2, phases=[Phase.explicit, Phase.generate])   # no shrinking: each
@given(cases=st.permutations(PATTERNS).flatmap(
    lambda ps: st.tuples(*[case_strategy(p) for p in ps])))
@example(cases=KNOWN_CRASHES)
def test_extreme_positions_never_crash_and_never_pass_quietly(native, cases):
    """Every pattern once per example (example = one child process), kinds and sizes drawn;
    shrinking is off (each example costs a process) and the failure names the case."""
    env = dict(os.environ, SIMLIB_NATIVE=native, JAX_PLATFORMS="cpu")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, str(CHILD)], input=json.dumps(list(cases)),
                          capture_output=True, text=True, env=env, timeout=300)
    lines = [json.loads(s) for s in proc.stdout.splitlines() if s.startswith("{")]
    started = [s["start"] for s in lines if "start" in s]
    assert proc.returncode == 0, (
        f"the child exited with {proc.returncode} (SIMLIB_NATIVE={native}) in case "
        f"{cases[started[-1]] if started else None}:\n{proc.stderr[-3000:]}")
    outs = {s["case"]: s for s in lines if "case" in s}
    assert sorted(outs) == list(range(len(cases)))
    for i, c in enumerate(cases):
        check(c, outs[i])
