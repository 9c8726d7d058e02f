"""The Pallas Lennard-Jones cell kernel (``_cells_pallas``), in Pallas's interpret mode on the
CPU: against float64 numpy sums over all pairs, the lane geometry that replaces every
per-pair index, which pass ``energy_and_forces`` takes, and its derivatives."""

from __future__ import annotations

import itertools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _lj_reference import numpy_lj

from simlib import particles as sp
from simlib.particles import _cells_pallas as cp

R_CUT = 2.5


def liquid(box, n, seed):
    """``n`` atoms on a jiggled simple-cubic lattice filling an orthorhombic ``box``."""
    box = np.asarray(box, float)
    per_axis = np.ceil(box * (n / np.prod(box)) ** (1 / 3)).astype(int)
    grid = np.stack(np.meshgrid(*[np.arange(k) for k in per_axis], indexing="ij"), -1)
    x = (grid.reshape(-1, 3)[:n] + 0.5) * (box / per_axis)
    assert len(x) == n
    x = x + np.random.default_rng(seed).uniform(-0.15, 0.15, x.shape)
    return np.mod(x, box)


@pytest.mark.parametrize("box, n, shift", [
    ((8.4, 8.4, 8.4), 500, False),                     # a 3 x 3 x 3 grid
    pytest.param((11.0, 8.5, 13.2), 900, True, marks=pytest.mark.slow),   # (4, 3, 5)
])
def test_kernel_matches_a_numpy_sum_over_all_pairs(box, n, shift):
    x = liquid(box, n, 0)
    space = sp.periodic(jnp.asarray(box, jnp.float32))
    x32 = jnp.asarray(x, jnp.float32)
    cells = sp.cell_list(space, x32, R_CUT)
    u, f, w = cp.lj_cells(x32, cells.slot_atom, cells.atom_slot,
                          space.box_vector(3, jnp.float32), 1.1, 0.9, grid=cells.grid,
                          capacity=cells.capacity, r_cut=R_CUT, shift=shift, interpret=True)
    u_ref, f_ref, w_ref = numpy_lj(np.asarray(x32), np.asarray(box), 1.1, 0.9, R_CUT, shift)
    assert f.shape == x.shape and f.dtype == jnp.float32
    assert abs(float(u) - u_ref) < 2e-5 * abs(u_ref)
    assert np.max(np.abs(np.asarray(f) - f_ref)) < 2e-5 * np.max(np.abs(f_ref))
    assert abs(float(w) - w_ref) < 2e-5 * abs(w_ref)


@pytest.mark.parametrize("grid", [(3, 3, 3), (4, 3, 5), (7, 9, 5)])
def test_every_window_lands_on_the_neighbour_cell(grid):
    """The mechanism that replaces per-pair indices: for every real cell and each of the 27
    offsets, the cell's lane plus the offset's fixed shift is a lane that holds the
    neighbour cell (an image of it across the box), and every window stays in the array."""
    geo = cp.geometry(grid)
    lane_cell, p, interior, cell_lane = cp._lane_tables(grid)
    assert interior.sum() == np.prod(grid)
    cells = np.stack(np.unravel_index(np.arange(np.prod(grid)), grid))
    for o, (q, r) in zip(itertools.product((-1, 0, 1), repeat=3), geo.windows, strict=True):
        lanes = cell_lane + q * cp.LANES + r
        want = np.ravel_multi_index(tuple((cells[k] + o[k]) % grid[k] for k in range(3)), grid)
        assert np.array_equal(lane_cell[lanes], want)
        # the padded cell there is the image at cell + o (its centre is where it should be)
        assert np.array_equal(p[:, lanes], cells + np.asarray(o)[:, None] + 1)
    # the kernel's target blocks cover every real cell; its windows stay inside the array
    first, last = geo.first, geo.first + geo.blocks * cp.LANES
    assert cell_lane.min() >= first and cell_lane.max() < last
    q = np.asarray([w[0] for w in geo.windows])
    assert first + q.min() * cp.LANES >= 0
    assert last - cp.LANES + q.max() * cp.LANES + 2 * cp.LANES <= geo.total


@pytest.fixture(scope="module")
def fluid32():
    """500 atoms in float32 (a 3 x 3 x 3 grid)."""
    x = jnp.asarray(liquid((8.4, 8.4, 8.4), 500, 1), jnp.float32)
    space = sp.periodic(jnp.float32(8.4))
    return x, space


def _primitives(fn, *args):
    """The names of every primitive in ``fn``'s program, inner programs included."""
    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            yield eqn.primitive.name
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                yield from walk(sub)

    return set(walk(jax.make_jaxpr(fn)(*args).jaxpr))


def test_which_pass_serves_a_cell_list(fluid32):
    """``kernel="pallas"``: the kernel (interpret mode on the CPU); ``"auto"`` and ``"jax"``:
    only the pure-JAX pass. Per-particle sigma, float64, the full shell or another
    potential take the pure-JAX pass whatever the cells say."""
    x, space = fluid32
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))

    def prims(kernel, params=params, y=x, energy=energy, shell="half"):
        cells = sp.cell_list(space, y, R_CUT, kernel=kernel, shell=shell)
        return _primitives(lambda z: energy.energy_and_forces(z, params, cells), y)

    assert "pallas_call" in prims("pallas")
    assert "pallas_call" not in prims("auto")
    assert "pallas_call" not in prims("jax")
    per_particle = dict(sigma=jnp.ones(len(x), jnp.float32), epsilon=jnp.float32(1.0))
    assert "pallas_call" not in prims("pallas", params=per_particle)
    assert "pallas_call" not in prims("pallas", y=x.astype(jnp.float64))      # x64 in tests
    assert "pallas_call" not in prims("pallas", shell="full")
    wca = sp.pair_energy(sp.wca, space, r_cut=R_CUT)
    assert "pallas_call" not in prims("pallas", energy=wca)
    with pytest.raises(ValueError, match="kernel must be"):
        sp.cell_list(space, x, R_CUT, kernel="cuda")


@pytest.mark.parametrize("x64", [True, False])
def test_kernel_lowers_for_a_tpu_with_and_without_x64(x64):
    """Mosaic's verifier runs when the kernel is lowered for a TPU, which works on the CPU:
    under x64 a loop bound or shift left as a Python integer becomes an int64 that Mosaic
    refuses (benchmarks/gpu.sh, which turns x64 on, failed so on the chip)."""
    x = jnp.asarray(liquid((8.4, 8.4, 8.4), 500, 2), jnp.float32)
    space = sp.periodic(jnp.float32(8.4))
    cells = sp.cell_list(space, x, R_CUT)
    with jax.enable_x64(x64):
        fn = jax.jit(lambda y: cp.lj_cells(
            y, cells.slot_atom, cells.atom_slot, space.box_vector(3, jnp.float32),
            jnp.float32(1.0), jnp.float32(1.0), grid=cells.grid, capacity=cells.capacity,
            r_cut=R_CUT, shift=True))
        text = fn.trace(x).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text


def test_the_vmem_rule():
    """On a TPU the kernel serves only where its resident arrays fit VMEM: 256,000 LJ atoms
    (grid 23, capacity 40) fit a v5e core's 128 MiB, a grid of 60^3 does not."""
    assert cp.fits((23, 23, 23), 40, 128 * 2**20)
    assert not cp.fits((60, 60, 60), 40, 128 * 2**20)
    assert cp.fits((60, 60, 60), 40, None)            # off a TPU: interpret mode


@pytest.mark.slow  # interpret mode, three passes
def test_kernel_path_energy_forces_virial_and_gradients(fluid32):
    """Through ``energy_and_forces``/``virial`` with ``kernel="pallas"``: the numpy sums to
    float32 round-off, ``grad`` of the energy equals minus the kernel's forces (the
    derivative comes from the pure-JAX pass), and the ``epsilon`` gradient is U / epsilon."""
    x, space = fluid32
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT, shift=True)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.3))
    cells = sp.cell_list(space, x, R_CUT, kernel="pallas")
    u, f = energy.energy_and_forces(x, params, cells)
    w = energy.virial(x, params, cells)
    u_ref, f_ref, w_ref = numpy_lj(np.asarray(x), 8.4, 1.0, 1.3, R_CUT, True)
    assert abs(float(u) - u_ref) < 2e-5 * abs(u_ref)
    assert np.max(np.abs(np.asarray(f) - f_ref)) < 2e-5 * np.max(np.abs(f_ref))
    assert abs(float(w) - w_ref) < 2e-5 * abs(w_ref)

    def total(y, eps):
        return energy.energy_and_forces(y, dict(sigma=params["sigma"], epsilon=eps), cells)[0]

    g_x, g_eps = jax.grad(total, argnums=(0, 1))(x, params["epsilon"])
    assert np.max(np.abs(np.asarray(g_x + f))) < 2e-5 * np.max(np.abs(f_ref))
    assert abs(float(g_eps) - u_ref / 1.3) < 2e-5 * abs(u_ref / 1.3)


def test_overlapping_atoms_give_a_non_finite_energy(fluid32):
    """Two atoms at one point: the kernel's energy is not finite (broken physics fails
    loudly; the slot's own pair is left out by slot, not by distance)."""
    x, space = fluid32
    x = x.at[1].set(x[0])
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    cells = sp.cell_list(space, x, R_CUT, kernel="pallas")
    u, f = energy.energy_and_forces(x, dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0)),
                                    cells)
    assert not np.isfinite(float(u))


@pytest.mark.slow  # interpret mode at every step
def test_simulate_through_the_kernel_matches_the_pure_jax_pass(fluid32):
    """20 NVE steps with cells and a skin: the kernel's trajectory equals the pure-JAX
    pass's to float32 round-off, rebuilds included."""
    x, space = fluid32
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    v = jnp.asarray(sp.maxwell_boltzmann(0.7, 1.0, key=jax.random.key(1), n=len(x)),
                    jnp.float32)

    def run(kernel):
        cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel=kernel)
        return sp.simulate(energy, sp.State(x, v, 1.0),
                           dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0)),
                           space=space, dt=0.005, n_steps=20, save_every=10, neighbors=cells)

    a, b = run("pallas"), run("jax")
    assert int(a.neighbors.n_builds) == int(b.neighbors.n_builds) > 1
    assert np.max(np.abs(np.asarray(a.positions - b.positions))) < 1e-4


@pytest.mark.slow  # interpret mode, batched
def test_kernel_under_vmap_equals_each_system_alone(fluid32):
    """Two configurations batched by ``vmap`` through the kernel equal each one alone."""
    x, space = fluid32
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel="pallas")
    noise = 0.05 * jax.random.normal(jax.random.key(4), x.shape, jnp.float32)
    xs = jnp.stack([x, x + noise])
    ub, fb = jax.vmap(lambda y: energy.energy_and_forces(y, params, cells))(xs)
    for k in range(2):
        u, f = energy.energy_and_forces(xs[k], params, cells)
        assert abs(float(ub[k]) - float(u)) <= 1e-6 * abs(float(u))
        assert np.max(np.abs(np.asarray(fb[k] - f))) <= 1e-6 * np.max(np.abs(np.asarray(f)))
