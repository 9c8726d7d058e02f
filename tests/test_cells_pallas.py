"""The Pallas Lennard-Jones cell kernel (``_cells_pallas``), in Pallas's interpret mode on the
CPU: against float64 numpy sums over all pairs, the lane geometry that replaces every
per-pair index, which pass ``energy_and_forces`` takes, and its derivatives."""

from __future__ import annotations

import itertools
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from _chunks import default_sigint, wrap_chunk
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


def _mosaic_text(monkeypatch, capsys):
    """Make every ``pallas_call`` print its kernel's jaxpr and Mosaic module when lowered
    (``debug=True``); returns a function that reads what was printed."""
    pallas_call = cp.pl.pallas_call
    monkeypatch.setattr(cp.pl, "pallas_call", lambda *a, **k: pallas_call(*a, **k, debug=True))
    capsys.readouterr()
    return lambda: capsys.readouterr().out


@pytest.mark.parametrize("x64", [True, False])
def test_kernel_lowers_for_a_tpu_with_and_without_x64(x64, monkeypatch, capsys):
    """Mosaic's verifier runs when the kernel is lowered for a TPU, which works on the CPU:
    under x64 a loop bound or shift left as a Python integer becomes an int64 that Mosaic
    refuses (benchmarks/gpu.sh, which turns x64 on, failed so on the chip), and a weakly
    typed float constant a float64 that Mosaic cannot truncate to float32 (it failed so on
    the chip at compile time, after this lowering had passed). So the kernel's jaxpr and
    Mosaic module must hold no 64-bit value."""
    printed = _mosaic_text(monkeypatch, capsys)
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
    kernel = printed()
    assert "tpu.vector_load" in kernel or "vector.load" in kernel      # the module printed
    assert "f64" not in kernel
    # no op yields an int64 value (attributes such as array<i64: ...> are fine)
    assert not re.findall(r"^\s*%\S+ = .*[:x]\s*i64>?\s*$", kernel, re.M)


@pytest.mark.parametrize("x64", [True, False])
def test_the_layout_loop_lowers_for_a_tpu_with_and_without_x64(moving, x64, monkeypatch,
                                                               capsys):
    """The whole layout loop (``_layout.frames``: Verlet steps, the sort in a ``cond``, the
    kernel compiled rather than interpreted) lowers for a TPU under x64 and without, with
    no float64 in the kernel."""
    printed = _mosaic_text(monkeypatch, capsys)
    from simlib import Direct
    from simlib.particles import _layout
    from simlib.particles._model import Model
    x, v, space = moving
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel="pallas")
    model = Model(energy, space)
    params = {k: jnp.asarray(p) for k, p in PARAMS32.items()}
    carry = sp.NVE().start(model, sp.State(x, v, 1.0), params, cells)
    monkeypatch.setattr(cp, "interpret", lambda: False)
    with jax.enable_x64(x64):
        fn = jax.jit(lambda c: _layout.frames(model, sp.NVE(), c, jnp.float32(1.0), params,
                                              jnp.float32(0.005), None, 2, 3, Direct()))
        text = fn.trace(carry).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text
    assert "f64" not in printed()


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


# -- simulate with the state in the kernel's layout (_layout) ------------------------------

PARAMS32 = dict(sigma=np.float32(1.0), epsilon=np.float32(1.0))


def _run(x, v, space, kernel, *, capacity=None, masses=1.0, integrator=None, **kw):
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel=kernel, capacity=capacity)
    run = dict(space=space, dt=0.005, n_steps=20, save_every=10, neighbors=cells) | kw
    return sp.simulate(energy, sp.State(x, v, masses),
                       {k: jnp.asarray(p) for k, p in PARAMS32.items()},
                       integrator=integrator, **run)


@pytest.fixture(scope="module")
def moving(fluid32):
    x, space = fluid32
    v = jnp.asarray(sp.maxwell_boltzmann(0.7, 1.0, key=jax.random.key(1), n=len(x)),
                    jnp.float32)
    return x, v, space


def test_simulate_keeps_the_state_in_the_kernels_layout(moving, monkeypatch):
    """``kernel="pallas"`` with NVE and one mass: ``simulate`` runs the layout path
    (``_layout.frames``), and its frames (positions, velocities, energies) and builds equal
    the pure-JAX pass's to float32 round-off."""
    x, v, space = moving
    layout = wrap_chunk(monkeypatch, "_layout_frames_jit")
    plain = wrap_chunk(monkeypatch, "_frames_jit")
    a = _run(x, v, space, "pallas")
    assert len(layout) == 1 and not plain
    b = _run(x, v, space, "jax")
    assert len(layout) == 1 and len(plain) == 1
    assert int(a.neighbors.n_builds) == int(b.neighbors.n_builds) > 1
    box = 8.4
    d = np.mod(np.asarray(a.positions - b.positions) + box / 2, box) - box / 2
    assert np.max(np.abs(d)) < 1e-4
    assert np.max(np.abs(np.asarray(a.velocities - b.velocities))) < 1e-3
    e_scale = np.max(np.abs(np.asarray(b.potential_energy)))
    for name in ("potential_energy", "kinetic_energy", "total_energy"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0,
                                   atol=2e-6 * e_scale)
    # the end state comes back in atom order, as the last frame
    np.testing.assert_array_equal(a.final.positions, a.positions[-1])
    np.testing.assert_array_equal(a.final.velocities, a.velocities[-1])


def test_a_layout_step_gathers_nothing_outside_a_sort(moving):
    """The mechanism: in ``_layout.frames`` the step (the inner scan) moves atoms between
    atom and cell order only inside the ``cond`` that sorts the cells again; the plain
    loop's step through the same kernel gathers the atoms into cells at every step."""
    from simlib import Direct
    from simlib.particles import _layout, _loop
    from simlib.particles._dynamics import NVE
    from simlib.particles._model import Model
    x, v, space = moving
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel="pallas")
    model = Model(energy, space)
    params = {k: jnp.asarray(p) for k, p in PARAMS32.items()}
    carry = NVE().start(model, sp.State(x, v, 1.0), params, cells)

    def step_gathers(frames):
        jaxpr = jax.make_jaxpr(lambda c: frames(model, NVE(), c, jnp.float32(1.0), params,
                                                jnp.float32(0.005), jax.random.key(0), 2, 3,
                                                Direct()))(carry)
        outer = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
        inner = [e for e in outer[-1].params["jaxpr"].jaxpr.eqns if e.primitive.name == "scan"]
        body = inner[0].params["jaxpr"].jaxpr

        def count(jx, skip_cond):
            n = 0
            for e in jx.eqns:
                if e.primitive.name == "gather":
                    n += 1
                if skip_cond and e.primitive.name == "cond":
                    continue
                for sub in jax.extend.core.jaxprs_in_params(e.params):
                    n += count(sub, skip_cond)
            return n

        return count(body, True), count(body, False)

    outside, everywhere = step_gathers(_layout.frames)
    assert outside == 0 and everywhere >= 2          # to atom order, and back into cells
    plain_outside, _ = step_gathers(_loop.frames)
    assert plain_outside >= 2


def test_the_layout_path_serves_nve_with_one_mass_and_the_kernels_energy(moving):
    """``_layout.applies``: NVE, one mass, cells with ``kernel="pallas"`` (or ``"auto"`` on
    a TPU) and an energy the kernel takes; anything else runs the plain loop (which takes
    the kernel for ``"pallas"`` cells, the pure-JAX pass otherwise, for its forces)."""
    from simlib.particles import _layout
    from simlib.particles._model import Model
    x, v, space = moving
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = {k: jnp.asarray(p) for k, p in PARAMS32.items()}
    cells = sp.cell_list(space, x, R_CUT, skin=0.2, kernel="pallas")
    model = Model(energy, space)

    nve, one = sp.NVE(), jnp.float32(1.0)

    def applies(integrator=nve, masses=one, positions=x, params=params, cells=cells,
                model=model):
        return _layout.applies(model, integrator, positions, masses, params, cells)

    assert applies()
    assert not applies(integrator=sp.Langevin(1.0, 1.0))
    assert not applies(masses=jnp.ones(len(x), jnp.float32))
    assert not applies(positions=x.astype(jnp.float64))                # x64 in tests
    assert not applies(params=dict(params, sigma=jnp.ones(len(x), jnp.float32)))
    assert not applies(cells=sp.cell_list(space, x, R_CUT, skin=0.2, kernel="jax"))
    auto = sp.cell_list(space, x, R_CUT, skin=0.2)           # "auto": on a TPU only
    assert applies(cells=auto) == (jax.default_backend() == "tpu")
    from simlib.particles._cells import keeps_layout
    assert keeps_layout("pallas", "cpu") and keeps_layout("pallas", "tpu")
    assert keeps_layout("auto", "tpu") and not keeps_layout("auto", "cpu")
    assert not keeps_layout("auto", "gpu") and not keeps_layout("jax", "tpu")
    assert not applies(cells=None)
    assert not applies(model=Model(sp.pair_energy(sp.wca, space, r_cut=R_CUT), space))


@pytest.mark.slow  # interpret mode, five runs
@pytest.mark.parametrize("gap, code", [(0.3, "UNSTABLE_DYNAMICS"),
                                       (1e-3, "NONFINITE_STATE")])
def test_a_blown_up_layout_run_names_the_step_and_atom_as_the_plain_loop(moving, gap, code):
    """Two atoms ``gap`` apart at the start: their first step flies them apart
    (``UNSTABLE_DYNAMICS``) or their forces overflow float32 (``NONFINITE_STATE``). The
    layout path reports the same code, step and atom as the plain loop, and raises the same
    error with ``throw=True``."""
    from simlib import Result, SolverError
    x, v, space = moving
    i, j = 137, 300
    y = x.at[i].set(x[j] + jnp.asarray([gap, 0.0, 0.0], jnp.float32))
    runs = [_run(y, v, space, kernel, throw=False) for kernel in ("pallas", "jax")]
    a, b = ({k: int(t.stats[k]) for k in ("failed_step", "failed_atom")} | dict(
        result=int(t.result)) for t in runs)
    assert a == b
    assert a["result"] == Result[code] and a["failed_step"] == 1
    assert a["failed_atom"] >= 0     # a crowded neighbour of atom j may be the fastest
    with pytest.raises(SolverError, match=f"atom {a['failed_atom']}"):
        _run(y, v, space, "pallas")


@pytest.mark.slow  # interpret mode, three runs
def test_a_layout_run_that_overflows_its_cells_is_reallocated_and_run_again(moving):
    """Cells of capacity 8 (the fullest holds more): the overflow in the layout path is
    repaired as in the plain loop (larger cells, the chunk again), to the same trajectory;
    and chunks of 10 steps give the run in one chunk."""
    x, v, space = moving
    a = _run(x, v, space, "pallas", capacity=8)
    b = _run(x, v, space, "jax", capacity=8)
    assert int(a.stats["n_reallocations"]) == int(b.stats["n_reallocations"]) >= 1
    assert int(a.result) == int(b.result) == 0
    assert np.max(np.abs(np.asarray(a.positions - b.positions))) < 1e-4
    c = _run(x, v, space, "pallas", capacity=8, chunk_steps=10)
    assert np.max(np.abs(np.asarray(a.positions - c.positions))) < 1e-4


@pytest.mark.slow  # interpret mode, three runs
def test_a_layout_run_stopped_by_ctrl_c_resumes_bit_identically(moving, tmp_path,
                                                                monkeypatch):
    """Checkpoints hold the layout path's end carry in atom order: a run stopped by SIGINT
    in its first chunk and resumed ends bit for bit where the run without a stop ends."""
    x, v, space = moving
    path = tmp_path / "run.npz"
    kw = dict(n_steps=30, chunk_steps=10)
    reference = _run(x, v, space, "pallas", **kw)
    # a real SIGINT while the first chunk runs
    calls = wrap_chunk(monkeypatch, "_layout_frames_jit", sigint_at=1)
    with default_sigint(), pytest.raises(KeyboardInterrupt, match="resume=True"):
        _run(x, v, space, "pallas", checkpoint=path, **kw)
    assert len(calls) == 1
    monkeypatch.undo()
    resumed = _run(x, v, space, "pallas", checkpoint=path, resume=True, **kw)
    for name in ("positions", "velocities", "potential_energy", "kinetic_energy"):
        assert np.array_equal(np.asarray(getattr(resumed, name)),
                              np.asarray(getattr(reference, name))), name
    assert int(resumed.stats["n_builds"]) == int(reference.stats["n_builds"])
