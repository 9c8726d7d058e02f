"""simlib.io: .npz solutions, H5MD and extended-XYZ trajectories, metadata, bad files, and
the runnable blocks of docs/files.md."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import particles as sp
from simlib.io import FileFormatError, load, save

PAGE = Path(__file__).resolve().parent.parent / "docs" / "files.md"


def field(t, y, a):
    return {"x": -a * y["x"], "pair": (a * y["pair"][1], -a * y["pair"][0])}


@pytest.fixture(scope="module")
def solution():
    y0 = {"x": jnp.array([1.0, 2.0]), "pair": (jnp.array(1.0), jnp.array(0.0))}
    return sl.solve(field, y0, 0.0, 1.0, solver=sl.RK4(), dt=0.01, args=0.5,
                    saveat=sl.SaveAt(ts=jnp.linspace(0.0, 1.0, 5)))


@pytest.fixture(scope="module")
def trajectory():
    positions, box = sp.lattice(2, 0.5)  # 32 atoms, fcc
    space = sp.periodic(box)
    v = sp.maxwell_boltzmann(1.0, 0.5, key=jax.random.key(0), n=len(positions))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=1.9)
    traj = sp.simulate(energy, sp.State(positions, v, 1.0), dict(sigma=1.0, epsilon=1.0),
                       space=space, dt=0.005, n_steps=20, save_every=5)
    return traj, space


def test_solution_npz_round_trip(solution, tmp_path):
    path = save(tmp_path / "sol.npz", solution, metadata=dict(solver="RK4", dt=0.01, a=0.5,
                                                              y0=jnp.array([1.0, 2.0])))
    back = load(path)
    assert back.kind == "solution"
    assert np.array_equal(back.ts, np.asarray(solution.ts))
    assert np.array_equal(back.ys["x"], np.asarray(solution.ys["x"]))
    assert isinstance(back.ys["pair"], tuple)
    assert np.array_equal(back.ys["pair"][1], np.asarray(solution.ys["pair"][1]))
    assert int(back.result) == 0 and int(back.stats["num_steps"]) == 100
    # the saved values are right: x = x0 exp(-a t), and the pair rotates at rate a
    ts = np.linspace(0.0, 1.0, 5)
    np.testing.assert_allclose(back.ys["x"][:, 1], 2.0 * np.exp(-0.5 * ts), rtol=1e-9)
    np.testing.assert_allclose(back.ys["pair"][0], np.cos(0.5 * ts), rtol=1e-9)
    meta = back.metadata
    assert meta["solver"] == "RK4" and meta["dt"] == 0.01 and meta["y0"] == [1.0, 2.0]
    assert meta["float64"] is True and meta["jax_version"] == jax.__version__
    assert meta["simlib_version"] == sl.__version__


def test_h5md_layout_follows_the_spec(trajectory, tmp_path):
    traj, space = trajectory
    path = save(tmp_path / "run.h5", traj, metadata=dict(dt=0.005, save_every=5, seed=0),
                box=space)
    with h5py.File(path, "r") as f:
        assert list(f["h5md"].attrs["version"]) == [1, 1]
        assert f["h5md/creator"].attrs["name"] == "simlib"
        assert "name" in f["h5md/author"].attrs
        box = f["particles/all/box"]
        assert box.attrs["dimension"] == 3
        assert [b.decode() if isinstance(b, bytes) else b for b in box.attrs["boundary"]] \
            == ["periodic"] * 3
        np.testing.assert_array_equal(box["edges/value"][()], np.full((5, 3), float(space.box)))
        pos = f["particles/all/position"]
        assert pos["value"].shape == (5, 32, 3)
        assert list(pos["step"][()]) == [0, 5, 10, 15, 20]  # steps of the frames
        np.testing.assert_allclose(pos["time"][()], 0.005 * np.array([0, 5, 10, 15, 20]),
                                   rtol=1e-12)
        assert f["observables/potential_energy/value"].shape == (5,)
    back = load(path)
    for name in ("times", "positions", "velocities", "potential_energy", "kinetic_energy"):
        assert np.array_equal(back[name], np.asarray(getattr(traj, name))), name
    assert back.metadata["seed"] == 0 and np.array_equal(back.box, np.full(3, space.box))
    # the stored energies are those of the stored states: U = sum of LJ pairs (numpy)
    x, L = back.positions[-1], float(space.box)
    d = x[:, None] - x[None]
    d -= L * np.round(d / L)
    r = np.sqrt((d ** 2).sum(-1))[np.triu_indices(32, 1)]
    r = r[r < 1.9]
    np.testing.assert_allclose(back.potential_energy[-1],
                               np.sum(4 * (r ** -12.0 - r ** -6.0)), rtol=1e-10)


def test_npz_and_xyz_trajectories(trajectory, tmp_path):
    traj, space = trajectory
    back = load(save(tmp_path / "run.npz", traj, box=space))
    assert back.kind == "trajectory" and np.array_equal(back.positions, traj.positions)
    path = save(tmp_path / "run.xyz", traj, metadata=dict(note='a "quoted" word'), box=space)
    text = path.read_text().splitlines()
    assert text[0] == "32"
    assert text[1].startswith('Lattice="') and "Properties=species:S:1:pos:R:3:vel:R:3" \
        in text[1] and 'pbc="T T T"' in text[1]
    back = load(path)
    assert np.array_equal(back.positions, np.asarray(traj.positions))  # %.17g is exact
    assert np.array_equal(back.velocities, np.asarray(traj.velocities))
    assert back.metadata["note"] == 'a "quoted" word'


@pytest.mark.parametrize("ext", [".npz", ".h5", ".xyz"])
def test_truncated_or_garbage_files_get_a_clear_error(trajectory, tmp_path, ext):
    traj, space = trajectory
    path = save(tmp_path / f"run{ext}", traj, box=space)
    data = path.read_bytes()
    for bad in (data[: len(data) // 2], b"garbage" * 10):
        path.write_bytes(bad)
        with pytest.raises(FileFormatError, match=re.escape(str(path))) as info:
            load(path)
        err = info.value  # no reader traceback chained behind it
        assert err.__cause__ is None and (err.__suppress_context__ or err.__context__ is None)


def test_bad_arguments(solution, tmp_path):
    with pytest.raises(ValueError, match="saved as .npz"):
        save(tmp_path / "sol.h5", solution)
    with pytest.raises(TypeError, match="expected a Solution"):
        save(tmp_path / "x.npz", [1, 2])
    with pytest.raises(FileNotFoundError, match="no file"):
        load(tmp_path / "missing.npz")
    np.savez(tmp_path / "foreign.npz", a=np.ones(2))
    with pytest.raises(FileFormatError, match="not one written by simlib"):
        load(tmp_path / "foreign.npz")


def test_docs_page_runs(tmp_path, monkeypatch):
    """The python blocks of docs/files.md run in order, in a scratch directory."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, str(PAGE), "exec"), ns)  # noqa: S102 - our own docs
    assert json.loads(json.dumps(ns["back"].metadata))["solver"] == "Tsit5"


@pytest.mark.slow
def test_mdanalysis_reads_the_h5md_file(trajectory, tmp_path):
    mda = pytest.importorskip("MDAnalysis")
    traj, space = trajectory
    path = save(tmp_path / "run.h5", traj, metadata=dict(dt=0.005, save_every=5), box=space)
    u = mda.Universe.empty(32, trajectory=True)  # H5MD has no topology to infer
    u.load_new(str(path), format="H5MD", convert_units=False)  # reduced units: none stored
    assert len(u.trajectory) == 5
    for i, ts in enumerate(u.trajectory):
        np.testing.assert_allclose(ts.positions, np.asarray(traj.positions[i]), rtol=1e-6)
        np.testing.assert_allclose(ts.velocities, np.asarray(traj.velocities[i]), rtol=1e-6)
        np.testing.assert_allclose(ts.dimensions, [float(space.box)] * 3 + [90] * 3,
                                   rtol=1e-6)
        assert ts.time == pytest.approx(0.005 * 5 * i)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_files_get_the_mode_open_would_give(solution, trajectory, tmp_path, umask, mode):
    """Files are written to a temporary file and renamed; they still get 0666 less the
    umask, as ``open(path, "w")`` gives (tempfile.mkstemp's 0600 did not)."""
    import os
    import stat

    traj, space = trajectory
    old = os.umask(umask)
    try:
        paths = [save(tmp_path / "sol.npz", solution),
                 save(tmp_path / "traj.h5", traj, box=space),
                 save(tmp_path / "traj.xyz", traj, box=space)]
    finally:
        os.umask(old)
    for path in paths:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
