"""Checkpoint and resume of simulate(): a Langevin Lennard-Jones run with a neighbour list
(so the PRNG key and the list both matter), stopped by a real signal part-way, resumed from
its checkpoint, ends bit for bit where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from _chunks import default_sigint, wrap_chunk

from simlib import particles as sp
from simlib.particles._checkpoint import CheckpointError

SETUP = """
import jax
from simlib import particles as sp

def setup(n_steps=240):
    positions, box = sp.lattice(3, 0.8)   # 108 atoms, fcc
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=1.8)
    nbrs = sp.neighbor_list(space, positions, r_cut=1.8, skin=0.3)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(1), n=len(positions))
    return (energy, sp.State(positions, v, 1.0), dict(sigma=1.0, epsilon=1.0)), dict(
        space=space, dt=0.005, n_steps=n_steps, save_every=10, neighbors=nbrs,
        integrator=sp.Langevin(1.0, 0.5), key=jax.random.key(7), chunk_steps=40)
"""
_ns: dict = {}
exec(SETUP, _ns)  # noqa: S102 - the same setup the subprocess test runs
setup = _ns["setup"]


def run(n_steps=240, **extra):
    args, kw = setup(n_steps)
    kw.update(extra)
    return sp.simulate(*args, **kw)


def _same(a, b):
    for name in ("times", "positions", "velocities", "potential_energy", "kinetic_energy"):
        x, y = np.asarray(getattr(a, name)), np.asarray(getattr(b, name))
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert np.array_equal(np.asarray(a.final.positions), np.asarray(b.final.positions))
    assert int(a.stats["n_builds"]) == int(b.stats["n_builds"])


@pytest.fixture(scope="module")
def reference():
    return run()


def _header(path):
    with np.load(path) as data:
        return json.loads(str(data["__checkpoint__"]))


def test_ctrl_c_writes_a_checkpoint_and_resume_is_bit_identical(reference, tmp_path,
                                                                 monkeypatch):
    path = tmp_path / "run.npz"
    # a real SIGINT to ourselves while the third chunk runs
    calls = wrap_chunk(monkeypatch, "_frames_jit", sigint_at=3)
    with default_sigint():
        with pytest.raises(KeyboardInterrupt, match="resume=True"):
            run(checkpoint=path, checkpoint_every=100)
        # simulate put back the handler it found (checked before the test puts back its own:
        # under nohup or as a background job that one is SIG_IGN)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert len(calls) == 3, calls
    monkeypatch.undo()
    assert _header(path)["done"] == 12  # three chunks of 4 frames, the third one finished
    resumed = run(checkpoint=path, resume=True)
    _same(resumed, reference)
    assert _header(path)["done"] == 24  # the finished run's checkpoint
    _same(run(checkpoint=path, resume=True), reference)  # resuming a finished run


def test_periodic_checkpoints_and_fresh_start(reference, tmp_path):
    path = tmp_path / "run.npz"
    traj = run(checkpoint=path, checkpoint_every=2)
    _same(traj, reference)
    assert _header(path)["done"] == 24
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # no leftovers


@pytest.mark.parametrize("change,field", [
    (dict(n_steps=200), "n_steps"), (dict(dt=0.004), "dt"),
    (dict(integrator=sp.NVE()), "integrator"), (dict(key=jax.random.key(8)), "key"),
    (dict(integrator=sp.Langevin(1.2, 0.5)), "integrator_parameters")])
def test_resume_refuses_other_arguments(reference, tmp_path, change, field):
    path = tmp_path / "run.npz"
    run(n_steps=40, checkpoint=path)
    kw = dict(n_steps=40, checkpoint=path, resume=True)
    kw.update(change)
    with pytest.raises(ValueError, match=f"does not match this call: its {field} is"):
        run(**kw)


def test_corrupt_or_missing_checkpoint(tmp_path):
    path = tmp_path / "run.npz"
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        run(checkpoint=path, resume=True)
    run(n_steps=40, checkpoint=path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=str(path)):
        run(n_steps=40, checkpoint=path, resume=True)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        run(n_steps=40, checkpoint=path, resume=True)


def test_a_nan_in_a_checkpoint_is_refused_naming_the_atom_and_field(tmp_path):
    # Old code: resumed, and failed at the next step naming the fastest atom (a nan on
    # atom 5 of a 4,000-atom run was reported as atom 786).
    path = tmp_path / "run.npz"
    run(n_steps=40, checkpoint=path)
    with np.load(path) as data:
        arrays = dict(data)
    header = json.loads(str(arrays["__checkpoint__"]))
    header["done"] = 0                                  # as if stopped at the start
    arrays["__checkpoint__"] = np.asarray(json.dumps(header))
    arrays["carry/0"][5, 1] = np.nan                    # the carry's positions
    np.savez(path, **arrays)
    with pytest.raises(CheckpointError, match=r"its positions of atom 5 are not finite"):
        run(n_steps=40, checkpoint=path, resume=True)


def test_checkpoint_is_refused_under_jit():
    args, kw = setup(40)
    with pytest.raises(ValueError, match="eager calls only"):
        jax.jit(lambda p: sp.simulate(args[0], args[1], p, **kw, checkpoint="x.npz")
                .positions)(args[2])


CHILD = SETUP + """
import signal, sys, time
# a shell's background job starts with SIGINT ignored and its children inherit that: take
# Python's own default, as a process started from a terminal has it
signal.signal(signal.SIGINT, signal.default_int_handler)
from simlib.particles import _simulate
frames = _simulate._frames_jit
def paced(*a, **k):  # pace the chunks so that the signal lands part-way
    time.sleep(0.15)
    return frames(*a, **k)
_simulate._frames_jit = paced
args, kw = setup()
sp.simulate(*args, **kw, checkpoint=sys.argv[1])
"""


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_killed_subprocess_resumes_bit_identically(reference, tmp_path, sig):
    path = tmp_path / "run.npz"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = dict(os.environ, JAX_ENABLE_X64="1",
               PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.Popen([sys.executable, str(script), str(path)], env=env,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -sig, err  # the run ended as the signal ends a process
    assert f"stopped by {sig.name}" in err
    done = _header(path)["done"]
    assert 0 < done < 24
    _same(run(checkpoint=path, resume=True), reference)


def test_metadata_is_stored_checked_and_read_without_running(tmp_path):
    """checkpoint_metadata rides in the signature: checkpoint_info reads it (and the
    progress) from the header alone; a resume with other metadata names the key."""
    path = tmp_path / "run.npz"
    meta = {"seed": 3, "kT": 0.722, "equilibration": [200, "Langevin"]}
    run(n_steps=40, checkpoint=path, checkpoint_metadata=meta)
    info = sp.checkpoint_info(path)
    assert info["metadata"] == meta and info["signature"]["metadata"] == meta
    assert (info["steps_done"], info["n_steps"], info["finished"], info["result"]) == \
        (40, 40, True, 0)
    run(n_steps=40, checkpoint=path, resume=True, checkpoint_metadata=meta)  # matches
    with pytest.raises(sp.CheckpointError, match=r"its metadata\['seed'\] is 3, this call "
                                                 r"has 4"):
        run(n_steps=40, checkpoint=path, resume=True, checkpoint_metadata={**meta, "seed": 4})
    with pytest.raises(sp.CheckpointError, match="its metadata is"):
        run(n_steps=40, checkpoint=path, resume=True)  # the metadata left out
    with pytest.raises(TypeError, match="checkpoint_metadata must hold JSON values"):
        run(n_steps=40, checkpoint=path, checkpoint_metadata={"kT": float("nan")})
    with pytest.raises(ValueError, match="checkpoint_metadata needs checkpoint=PATH"):
        run(n_steps=40, checkpoint_metadata=meta)


def test_checkpoint_info_refuses_what_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        sp.checkpoint_info(tmp_path / "none.npz")
    (tmp_path / "bad.npz").write_bytes(b"not a zip file")
    with pytest.raises(sp.CheckpointError, match="cannot be read"):
        sp.checkpoint_info(tmp_path / "bad.npz")
    np.savez(tmp_path / "other.npz", x=np.zeros(3))
    with pytest.raises(sp.CheckpointError, match="is not a simulate"):
        sp.checkpoint_info(tmp_path / "other.npz")
