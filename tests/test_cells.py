"""The cell-dense pair sum (``cell_list``): against numpy all-pairs sums, the neighbour-list
path and finite differences, and the mechanism itself (no per-pair gather in the compiled
program; overflow repaired by ``simulate``)."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _lj_reference import numpy_lj

from simlib import particles as sp

R_CUT = 2.5


def assert_matches_numpy(results, x, box, sigma, epsilon):
    """Energy ``u`` and ``e``, forces ``f`` and ``-g``, virial ``w`` equal the numpy sum to
    1e-10 relative."""
    u, f, w, e, g = results
    u_ref, f_ref, w_ref = numpy_lj(x, box, sigma, epsilon, R_CUT)
    for value in (u, e):
        assert abs(float(value) - u_ref) < 1e-10 * abs(u_ref)
    for value in (f, -g):
        assert np.max(np.abs(np.asarray(value) - f_ref)) < 1e-10 * np.max(np.abs(f_ref))
    assert abs(float(w) - w_ref) < 1e-10 * abs(w_ref)


@pytest.fixture(scope="module")
def fluid():
    """500 atoms (fcc 5^3, density 0.8442, box 8.40: a 3 x 3 x 3 grid at r_cut 2.5), jiggled."""
    x, box = sp.lattice(5, 0.8442)
    x = x + 0.08 * jax.random.normal(jax.random.key(0), x.shape, x.dtype)
    space = sp.periodic(box)
    n = len(x)
    sigma = 1.0 + 0.05 * (np.arange(n) % 3) / 2
    epsilon = 1.0 + 0.2 * (np.arange(n) % 2)
    return x, float(box), space, sigma, epsilon


@pytest.mark.parametrize("shell", ["half", pytest.param("full", marks=pytest.mark.slow)])
def test_energy_forces_virial_against_a_numpy_sum_over_all_pairs(fluid, shell):
    x, box, space, sigma, epsilon = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=jnp.asarray(sigma), epsilon=jnp.asarray(epsilon))
    cells = sp.cell_list(space, x, R_CUT, shell=shell)
    assert cells.grid == (3, 3, 3)

    @jax.jit
    def everything(y, params, cells):
        u, f = energy.energy_and_forces(y, params, cells)
        # the energy alone, differentiated in reverse mode, gives the forces too
        e, g = jax.value_and_grad(lambda z: energy(z, params, cells))(y)
        return u, f, energy.virial(y, params, cells), e, g

    u, f, w, e, g = everything(x, params, cells)
    assert_matches_numpy((u, f, w, e, g), x, box, sigma, epsilon)


@pytest.mark.parametrize("shell", ["half", pytest.param("full", marks=pytest.mark.slow)])
def test_cells_taken_in_chunks_give_the_numpy_sum(fluid, shell, monkeypatch):
    """Above ``BLOCK_ELEMENTS`` slots per shell offset the cells go in chunks (27 cells in 6
    chunks of 5, the last padded): the same sums, and the chunk loop is in the program."""
    from simlib.particles import _cells

    x, box, space, sigma, epsilon = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=jnp.asarray(sigma), epsilon=jnp.asarray(epsilon))
    cells = sp.cell_list(space, x, R_CUT, shell=shell)
    monkeypatch.setattr(_cells, "BLOCK_ELEMENTS", 5 * cells.capacity ** 2)

    def everything(y, params, cells):
        u, f = energy.energy_and_forces(y, params, cells)
        e, g = jax.value_and_grad(lambda z: energy(z, params, cells))(y)
        return u, f, energy.virial(y, params, cells), e, g

    u, f, w, e, g = jax.jit(everything)(x, params, cells)
    assert_matches_numpy((u, f, w, e, g), x, box, sigma, epsilon)
    text = str(jax.make_jaxpr(lambda y: energy.energy_and_forces(y, params, cells))(x))
    assert "length=6" in text
    monkeypatch.undo()
    text = str(jax.make_jaxpr(lambda y: energy.energy_and_forces(y, params, cells))(x))
    assert "length=6" not in text


def test_gradient_in_a_parameter_against_finite_differences(fluid):
    x, box, space, sigma, epsilon = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT, shift=True)
    cells = sp.cell_list(space, x, R_CUT)

    @jax.jit
    def u(eps):
        return energy(x, dict(sigma=1.0, epsilon=eps), cells)

    g = jax.jit(jax.grad(u))(1.3)
    h = 1e-5
    fd = (u(1.3 + h) - u(1.3 - h)) / (2 * h)
    assert abs(float(g) - float(fd)) < 1e-8 * abs(float(fd))


@pytest.mark.slow
def test_float32_agrees_with_the_neighbour_list_to_round_off(fluid):
    x, box, space, *_ = fluid
    x32 = x.astype(jnp.float32)
    space32 = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space32, r_cut=R_CUT)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    u_c, f_c = jax.jit(energy.energy_and_forces)(x32, params,
                                                  sp.cell_list(space32, x32, R_CUT))
    u_ref, f_ref, _ = numpy_lj(x, box, np.ones(len(x)), np.ones(len(x)), R_CUT)
    assert f_c.dtype == jnp.float32
    assert abs(float(u_c) - u_ref) < 2e-5 * abs(u_ref)
    assert np.max(np.abs(np.asarray(f_c) - f_ref)) < 2e-5 * np.max(np.abs(f_ref))


def test_a_skin_rebuilds_after_half_a_skin_and_misses_no_pair(fluid):
    """Cells r_cut + skin wide, kept until some atom has moved skin / 2: the forces equal
    the all-pairs numpy sum after every move, the cells are re-sorted only when the largest
    move since the last sort passes skin / 2 (counted by ``n_builds``), and at every update
    without a skin. The full shell serves here (the half shell is checked above)."""
    x, box, space, *_ = fluid
    skin = 0.2
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=1.0, epsilon=1.0)
    cells = sp.cell_list(space, x, R_CUT, skin=skin, shell="full")
    plain = sp.cell_list(space, x, R_CUT)
    assert cells.grid == (3, 3, 3) and cells.skin == skin
    direction = np.array(jax.random.normal(jax.random.key(4), x.shape, x.dtype))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    forces = jax.jit(energy.energy_and_forces)
    ones = np.ones(len(x))
    moved_at_build, builds = 0.0, int(cells.n_builds)
    for k in range(1, 9):
        y = jnp.asarray(x + 0.03 * k * direction)              # each atom moves 0.03 a step
        cells, plain = cells.update(y), plain.update(y)
        expected = builds + (0.03 * k - moved_at_build > 0.5 * skin)
        assert int(cells.n_builds) == expected, (k, int(cells.n_builds))
        if expected > builds:
            moved_at_build, builds = 0.03 * k, expected
        _, f = forces(y, params, cells)
        _, f_ref, _ = numpy_lj(y, box, ones, ones, R_CUT)
        assert np.max(np.abs(np.asarray(f) - f_ref)) < 1e-10 * np.max(np.abs(f_ref))
    assert int(cells.n_builds) == 3 and int(plain.n_builds) == 9
    with pytest.raises(ValueError, match="skin"):
        sp.cell_list(space, x, R_CUT, skin=-0.1)
    with pytest.raises(ValueError, match="shell"):
        sp.cell_list(space, x, R_CUT, shell="quarter")


def test_no_per_pair_gather_in_the_compiled_forces(fluid):
    """The mechanism: every gather reads at most one row per cell slot (laying particles out,
    reading forces back), never one per pair as the neighbour-list path does."""
    x, box, space, *_ = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=1.0, epsilon=1.0)
    cells = sp.cell_list(space, x, R_CUT)
    slots = cells.n_cells * cells.capacity

    def gather_sizes(fn, nbrs):
        jaxpr = jax.make_jaxpr(lambda y: fn(y, params, nbrs))(x)
        sizes = []

        def walk(j):
            for eqn in j.eqns:
                if eqn.primitive.name == "gather":
                    sizes.append(int(np.prod(eqn.outvars[0].aval.shape)))
                for value in eqn.params.values():
                    for sub in value if isinstance(value, (list, tuple)) else [value]:
                        if isinstance(sub, jax.extend.core.ClosedJaxpr):
                            walk(sub.jaxpr)
                        elif isinstance(sub, jax.extend.core.Jaxpr):
                            walk(sub)

        walk(jaxpr.jaxpr)
        return sizes

    cell_sizes = gather_sizes(energy.energy_and_forces, cells)
    n, d = x.shape
    assert cell_sizes and max(cell_sizes) <= max(slots, n) * d
    nbrs = sp.neighbor_list(space, x, r_cut=R_CUT, skin=0.3)
    assert max(gather_sizes(energy._energy_and_forces, nbrs)) >= len(x) * nbrs.capacity


@pytest.fixture(scope="module")
def nve(fluid):
    """``run(neighbors)``: 40 NVE steps of the fluid at T = 0.7, and the same run over a
    neighbour list (the reference)."""
    x, box, space, *_ = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    v = sp.maxwell_boltzmann(0.7, 1.0, key=jax.random.key(1), n=len(x))

    def run(neighbors):
        return sp.simulate(energy, sp.State(x, v, 1.0), dict(sigma=1.0, epsilon=1.0),
                           space=space, dt=0.005, n_steps=40, save_every=20,
                           neighbors=neighbors)

    return run, run(sp.neighbor_list(space, x, R_CUT, 0.3))


@pytest.mark.slow
def test_simulate_repairs_an_overflow_and_matches_the_neighbour_list(fluid, nve):
    x, box, space, *_ = fluid
    run, ref = nve
    small = sp.cell_list(space, x, R_CUT, capacity=8)      # far too small: overflows
    out = run(small)
    assert out.neighbors.capacity > 8 and not out.neighbors.did_overflow()
    assert np.max(np.abs(np.asarray(out.positions - ref.positions))) < 1e-12


@pytest.mark.slow
def test_simulate_with_a_skin_sorts_less_and_matches_the_neighbour_list(fluid, nve):
    x, box, space, *_ = fluid
    run, ref = nve
    out = run(sp.cell_list(space, x, R_CUT, skin=0.2, shell="full"))
    assert np.max(np.abs(np.asarray(out.positions - ref.positions))) < 1e-12
    assert 1 < int(out.neighbors.n_builds) < 20        # 41 without a skin


def test_a_box_narrower_than_the_grid_is_flagged_and_bad_boxes_refused(fluid):
    x, box, space, *_ = fluid
    cells = sp.cell_list(space, x, R_CUT)
    shrunk = cells.replace(space=sp.periodic(0.8 * box)).build(x)    # cells 2.24 < r_cut
    assert int(shrunk.missed_pairs) == 1
    with pytest.raises(ValueError, match="fewer than 3 cells"):
        sp.cell_list(sp.periodic(7.0), x, R_CUT)
    with pytest.raises(ValueError, match="periodic"):
        sp.cell_list(sp.free(), x, R_CUT)
    with pytest.raises(ValueError, match="r_cut"):
        sp.cell_list(space, x, -1.0)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=3.0)
    with pytest.raises(ValueError, match="below the energy's r_cut"):
        energy(x, dict(sigma=1.0, epsilon=1.0), cells)


@pytest.mark.slow  # builds six lists and cell grids eagerly (~5 s idle)
def test_pair_search_picks_cells_on_accelerators_and_the_list_on_cpu(fluid):
    x, box, space, sigma, epsilon = fluid
    assert isinstance(sp.pair_search(space, x, R_CUT, backend="cpu"), sp.NeighborList)
    on_chip = sp.pair_search(space, x, R_CUT, skin=0.1, backend="tpu")
    assert isinstance(on_chip, sp.CellList) and on_chip.grid == (3, 3, 3)
    assert on_chip.skin == 0.1 and on_chip.shell == "half"
    # the box (8.40) holds fewer than 3 cells of r_cut + the default skin 0.3
    assert isinstance(sp.pair_search(space, x, R_CUT, backend="tpu"), sp.NeighborList)
    assert isinstance(sp.pair_search(space, x, R_CUT, skin=0.1, method="cells"), sp.CellList)
    assert isinstance(sp.pair_search(space, x, R_CUT, method="list", backend="gpu"),
                      sp.NeighborList)
    # where cells cannot serve, the list: a box under 3 r_cut, and free space
    assert isinstance(sp.pair_search(space, x, 3.0, backend="tpu"), sp.NeighborList)
    assert isinstance(sp.pair_search(sp.free(), x, R_CUT, backend="tpu"), sp.NeighborList)
    with pytest.raises(ValueError, match="method"):
        sp.pair_search(space, x, R_CUT, method="dense")


@pytest.mark.slow  # two simulate compilations (~8 s idle)
def test_simulate_auto_picks_the_pair_structure_by_backend(fluid, monkeypatch):
    """``neighbors="auto"``: a neighbour list on the CPU, cells when the backend is an
    accelerator (the backend faked here), and clear errors where it cannot serve."""
    x, box, space, *_ = fluid
    # r_cut 2.3: the box (8.40) holds 3 cells of r_cut + the default skin 0.3
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.3)
    params = dict(sigma=1.0, epsilon=1.0)
    state = sp.State(x, jnp.zeros_like(x), 1.0)
    run = dict(space=space, dt=0.002, n_steps=2, save_every=2, neighbors="auto")
    on_cpu = sp.simulate(energy, state, params, **run)
    assert isinstance(on_cpu.neighbors, sp.NeighborList)
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    on_chip = sp.simulate(energy, state, params, **run)
    assert isinstance(on_chip.neighbors, sp.CellList) and on_chip.neighbors.skin == 0.3
    assert np.max(np.abs(np.asarray(on_chip.positions - on_cpu.positions))) < 1e-12


def test_simulate_auto_refuses_what_it_cannot_serve(fluid):
    x, box, space, *_ = fluid
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=1.0, epsilon=1.0)
    state = sp.State(x, jnp.zeros_like(x), 1.0)
    run = dict(space=space, dt=0.002, n_steps=2, save_every=2, neighbors="auto")
    with pytest.raises(ValueError, match="neighbors"):
        sp.simulate(energy, state, params, **{**run, "neighbors": "cells please"})
    with pytest.raises(ValueError, match="r_cut"):
        sp.simulate(sp.pair_energy(sp.lennard_jones, space), state, params, **run)
    with pytest.raises(TypeError, match="concrete positions"):    # traced: built outside jit
        jax.jit(lambda y: sp.simulate(energy, sp.State(y, jnp.zeros_like(y), 1.0), params,
                                      **run).positions)(x)
