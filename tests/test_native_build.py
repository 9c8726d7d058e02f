"""Building and loading the native kernels: cache keying, the fallback to pure JAX, repair.

Each case runs in a subprocess with its own ``SIMLIB_CACHE`` (``load`` decides once per
process) and computes a gravity force and a neighbour list through the public API. Whether
native or fallen back, the results must agree with numpy (direct sums, brute-force pairs)
and, for a fallback, equal the ``SIMLIB_NATIVE=0`` run exactly.
"""

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from simlib.particles import _native

REQUIRE_NATIVE = os.environ.get("SIMLIB_REQUIRE_NATIVE", "0") == "1"
GXX = shutil.which("g++")
needs_compiler = pytest.mark.skipif(GXX is None and not REQUIRE_NATIVE, reason="no g++ here")

N_GRAVITY, N_PAIRS, DENSITY, R_CUT, SKIN = 40, 200, 0.7, 1.2, 0.3
BOX = (N_PAIRS / DENSITY) ** (1 / 3)

_SCRIPT = textwrap.dedent(f"""
    import json, warnings
    import numpy as np
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as caught:
        from simlib import particles as sp
        from simlib.particles import _native
        lib = _native.load()
    q = jnp.asarray(np.random.default_rng(5).normal(size=({N_GRAVITY}, 3)))
    params = dict(G=1.3, softening=0.05, masses=jnp.linspace(0.5, 1.5, {N_GRAVITY}))
    g = sp.pair_energy(sp.gravity, sp.free())
    e, f = jax.jit(g.energy_and_forces)(q, params)
    y = jnp.asarray(np.random.default_rng(6).uniform(0, {BOX!r}, ({N_PAIRS}, 3)))
    nb = sp.neighbor_list(sp.periodic({BOX!r}), y, r_cut={R_CUT}, skin={SKIN})
    print(json.dumps(dict(
        native=lib is not None, gravity_native=bool(g._native_gravity(q, params, None)),
        grid=nb.grid, reason=_native.unavailable_reason(),
        warnings=[str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
        energy=float(e), forces=np.asarray(f).tolist(), idx=np.asarray(nb.idx).tolist())))
""")


def _run(env_changes, cache):
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "SIMLIB_NATIVE")}
    env.update(SIMLIB_CACHE=str(cache), **env_changes)
    run = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-3000:]}"
    return json.loads(run.stdout.strip().splitlines()[-1])


def _numpy_reference():
    q = np.random.default_rng(5).normal(size=(N_GRAVITY, 3))
    m = np.linspace(0.5, 1.5, N_GRAVITY)
    d = q[None, :, :] - q[:, None, :]
    r2 = np.sum(d * d, -1) + 0.05**2
    np.fill_diagonal(r2, np.inf)
    inv = r2**-0.5
    forces = 1.3 * m[:, None] * np.sum((m[None, :] * inv**3)[:, :, None] * d, axis=1)
    energy = -0.5 * 1.3 * np.sum(m[:, None] * m[None, :] * inv)
    y = np.random.default_rng(6).uniform(0, BOX, (N_PAIRS, 3))
    dy = y[:, None, :] - y[None, :, :]
    dy -= BOX * np.round(dy / BOX)
    r = np.sqrt(np.sum(dy * dy, -1))
    np.fill_diagonal(r, np.inf)
    pairs = [set(np.flatnonzero(row < R_CUT + SKIN).tolist()) for row in r]
    return energy, forces, pairs


def _check_results(out):
    energy, forces, pairs = _numpy_reference()
    assert out["grid"] is not None                      # the cell-list (native-capable) path
    assert abs(out["energy"] - energy) <= 1e-12 * abs(energy)
    f = np.asarray(out["forces"])
    assert np.max(np.abs(f - forces)) <= 1e-12 * np.max(np.abs(forces))
    idx = np.asarray(out["idx"])
    assert [set(row[row < N_PAIRS].tolist()) for row in idx] == pairs


@pytest.fixture(scope="module")
def pure(tmp_path_factory):
    out = _run(dict(SIMLIB_NATIVE="0"), tmp_path_factory.mktemp("cache"))
    assert not out["native"] and out["reason"] == "disabled by SIMLIB_NATIVE"
    _check_results(out)
    return out


def _check_fallback(out, pure, reason):
    assert not out["native"] and not out["gravity_native"]
    assert reason in out["reason"], out["reason"]
    assert any(reason in w and "using pure JAX" in w for w in out["warnings"]), out["warnings"]
    _check_results(out)
    for key in ("energy", "forces", "idx"):            # the fallback is the pure-JAX path
        assert out[key] == pure[key], key


def _script(path, body):
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_fallback_when_cxx_names_a_missing_program(tmp_path, pure):
    out = _run(dict(CXX=str(tmp_path / "no-such-g++") + " -O2"), tmp_path / "cache")
    _check_fallback(out, pure, "C++ compiler not found")


def test_fallback_when_no_compiler_is_on_path(tmp_path, pure):
    (tmp_path / "empty").mkdir()
    out = _run(dict(PATH=str(tmp_path / "empty")), tmp_path / "cache")
    _check_fallback(out, pure, "no C++ compiler found")


def test_fallback_when_compiling_fails(tmp_path, pure):
    out = _run(dict(CXX="false"), tmp_path / "cache")
    _check_fallback(out, pure, "compiling failed (exit 1)")
    broken = _script(tmp_path / "broken-cxx", "echo 'broken-cxx: internal error' >&2\nexit 1\n")
    out = _run(dict(CXX=broken), tmp_path / "cache2")
    _check_fallback(out, pure, "compiling failed (exit 1)")
    assert "broken-cxx: internal error" in out["reason"]
    assert not any((tmp_path / "cache2").rglob("*.so"))


@needs_compiler
def test_corrupt_cached_library_is_rebuilt(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("SIMLIB_CACHE", str(cache))
    monkeypatch.delenv("CXX", raising=False)
    lib = _native.library_path()                      # where this machine's build goes
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF" + b"garbage, as left by a full disk" * 10)
    out = _run({}, cache)
    assert out["native"] and out["gravity_native"], out["reason"]
    assert any("does not load" in w and "rebuilding" in w for w in out["warnings"])
    assert lib.read_bytes()[:4] == b"\x7fELF" and lib.stat().st_size > 10_000
    _check_results(out)


@pytest.mark.slow
@needs_compiler
def test_cxx_with_a_wrapper_and_flags_builds(tmp_path):
    cache = tmp_path / "cache"
    out = _run(dict(CXX="env g++ -DSIMLIB_CXX_FLAG_SEEN=1"), cache)
    assert out["native"] and out["gravity_native"], out["reason"]
    assert out["warnings"] == []
    (build,) = cache.rglob("build.txt")
    assert build.read_text().startswith("env g++ -DSIMLIB_CXX_FLAG_SEEN=1 -march=native")
    _check_results(out)


def test_cache_key_follows_the_cpu_target(tmp_path, monkeypatch):
    """Machines whose compilers resolve ``-march=native`` differently never share a build;
    one whose compiler cannot resolve it gets a portable build without ``-march=native``."""
    monkeypatch.setenv("SIMLIB_CACHE", str(tmp_path / "cache"))
    # One compiler command on three machines: it reports the CPU given in FAKE_TARGET.
    fake = _script(tmp_path / "cxx-fake", 'echo "gcc version 12.2.0 (fake)" >&2\n'
                                          'echo " /fake/cc1plus -E -quiet $FAKE_TARGET" >&2\n')
    monkeypatch.setenv("CXX", fake)
    paths, flags = {}, {}
    for cpu, target in (("A", "-march=cpuA -mavx2 -mno-avx512f"),
                        ("A+avx512", "-march=cpuA -mavx2 -mavx512f"),
                        ("B", "-march=cpuB -mno-avx2 -mno-avx512f")):
        monkeypatch.setenv("FAKE_TARGET", target)
        paths[cpu] = _native.library_path()
        flags[cpu] = _native._plan()[1]
        assert _native.library_path() == paths[cpu]      # stable on one machine
    monkeypatch.setenv("CXX", fake.replace(str(tmp_path), str(tmp_path) + "/."))
    assert _native.library_path() != paths["B"]          # the compiler command is keyed too
    assert len(set(paths.values())) == 3
    assert all("-march=native" in f for f in flags.values())
    silent = _script(tmp_path / "cxx-silent", "exit 0\n")
    monkeypatch.setenv("CXX", silent)
    assert "-march=native" not in _native._plan()[1]
    assert _native._plan()[3].startswith("portable")
    if GXX is not None:                                   # the real compiler resolves it
        monkeypatch.setenv("CXX", GXX)
        assert "-march=native" in _native._plan()[1]
        assert "-march=native" not in _native._plan()[3].split()
