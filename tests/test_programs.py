"""Compiled programs kept by fingerprint (simlib/_programs.py).

The key must tell apart everything a program is built from (the code, the closed-over and
global values, a helper's code, a user module's contents, the shapes), and must be equal
for the same work, so that a second call, or a second process with
``sl.keep_compiled_programs``, neither traces nor compiles. What the key cannot account
for gives no key, and the call takes ``jax.jit``. Tested on the mechanism (JAX's trace and
compile events name what ran) and on the numbers (closed forms and scipy)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import _errors
from simlib import _programs as programs

fingerprint = programs.fingerprint


def _decay(rate):
    def f(t, y, args):
        return -rate * y

    return f


def _module(source: str, name: str = "a_users_model") -> types.ModuleType:
    """A module of the user's, made from ``source`` (as an import would)."""
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)  # noqa: S102 - the test's own source
    return module


def test_closed_over_values_are_part_of_the_key():
    assert fingerprint(_decay(1.0)) == fingerprint(_decay(1.0))  # a new closure, same work
    assert fingerprint(_decay(1.0)) != fingerprint(_decay(2.0))
    assert fingerprint(_decay(np.array([1.0, 2.0]))) != fingerprint(_decay(np.array([1.0, 3.0])))
    assert fingerprint(_decay(np.float32(1.0))) != fingerprint(_decay(np.float64(1.0)))
    assert fingerprint(_decay(0.0)) != fingerprint(_decay(-0.0))


def test_the_code_its_globals_and_its_helpers_are_part_of_the_key():
    base = "K = 1.0\ndef helper(y):\n    return y\ndef f(t, y, args):\n    return -K * helper(y)\n"
    same = _module(base).f
    assert fingerprint(_module(base).f) == fingerprint(same)
    for changed in (base.replace("K = 1.0", "K = 2.0"),                 # a global's value
                    base.replace("return y\n", "return 2 * y\n"),      # a helper's code
                    base.replace("-K * helper(y)", "-K * helper(y) * y")):  # its own code
        assert fingerprint(_module(changed).f) != fingerprint(same), changed


def test_a_users_module_counts_whole_even_when_read_by_another_function():
    params = _module("k = 1.0", "a_users_params")
    model = _module("""
        def rate(m):
            return m.k            # reads the module passed to it
        def f(t, y, args):
            return -rate(params) * y
    """)
    model.params = params
    before = fingerprint(model.f)
    params.k = 3.0                # changed at run time, not in any source
    assert fingerprint(model.f) != before


def test_a_callable_object_is_keyed_on_its_class_and_its_state():
    source = """
        class Decay:
            def __init__(self, rate):
                self.rate = rate
            def __call__(self, t, y, args):
                return -self.rate * y
    """
    one = _module(source).Decay
    assert fingerprint(one(1.0)) == fingerprint(_module(source).Decay(1.0))
    assert fingerprint(one(1.0)) != fingerprint(one(2.0))
    assert fingerprint(one(1.0)) != fingerprint(
        _module(source.replace("-self.rate * y", "-self.rate * y * y")).Decay(1.0))


def test_the_arguments_count_by_structure_shape_and_dtype_not_value():
    key = programs.key
    assert key(dynamic=jnp.ones(2)) == key(dynamic=jnp.zeros(2))
    assert key(dynamic=jnp.ones(2)) != key(dynamic=jnp.ones(3))
    assert key(dynamic=jnp.ones(2)) != key(dynamic=jnp.ones(2, jnp.float32))
    assert key(dynamic={"a": 1.0, "b": 2.0}) != key(dynamic={"c": 1.0, "d": 2.0})
    # each dict's keys come as a new list: one freed and its id reused must not read as
    # "the same list again"
    assert key(dynamic=({"a": 1.0}, {"b": 1.0})) != key(dynamic=({"a": 1.0}, {"a": 1.0}))
    assert key(dynamic=(1.0, None)) != key(dynamic=(None, 1.0))


def test_only_the_settings_that_change_a_program_are_in_the_key(monkeypatch):
    before = programs.key(_decay(1.0))
    monkeypatch.setenv("SIMLIB_SOMETHING_ELSE", "1")   # e.g. a benchmark's own variable
    assert programs.key(_decay(1.0)) == before
    monkeypatch.setenv("SIMLIB_NATIVE", "0")            # the pure-JAX kernels instead
    assert programs.key(_decay(1.0)) != before
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false")
    assert programs.key(_decay(1.0)) != before


def test_what_cannot_be_accounted_for_gives_no_key():
    lock = threading.Lock()
    assert fingerprint(lambda t, y, a: y if lock else -y) is None   # an unknown native object
    assert fingerprint(_decay(jax.random.key(0))) is None           # a typed PRNG key

    @jax.jit
    def traced(x):
        assert fingerprint(_decay(x)) is None
        return x

    traced(1.0)
    assert programs.key(_decay(1.0), dynamic=jnp.ones(2)) is not None


@contextlib.contextmanager
def _events():
    """The names of the functions JAX traces and compiles inside the block."""
    seen = {"trace": [], "compile": []}
    kinds = {"/jax/core/compile/jaxpr_trace_duration": "trace",
             "/jax/core/compile/backend_compile_duration": "compile"}
    on = [True]

    def listen(event, duration, **kw):
        if on[0] and event in kinds:
            seen[kinds[event]].append(str(kw.get("fun_name")))

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        yield seen
    finally:
        on[0] = False


def test_a_new_closure_for_the_same_work_is_neither_traced_nor_compiled_again():
    y0, t1 = jnp.array([1.0, 2.0]), 1.5
    for n, k in enumerate((0.5, 2.0, 0.5)):
        with _events() as seen:
            sol = sl.solve(_decay(1.0), y0, 0.0, t1, solver=sl.Tsit5(), rtol=1e-10,
                           atol=1e-12, args=k)  # the rate 1.0 is closed over, k unused
        np.testing.assert_allclose(sol.ys[-1], y0 * np.exp(-t1), rtol=1e-8)
        if n:
            assert "adaptive_core" not in seen["trace"] + seen["compile"]
    with _events() as seen:
        sol = sl.solve(_decay(2.0), y0, 0.0, t1, solver=sl.Tsit5(), rtol=1e-10, atol=1e-12)
    assert "adaptive_core" in seen["trace"]       # another closed-over value: built anew
    np.testing.assert_allclose(sol.ys[-1], y0 * np.exp(-2.0 * t1), rtol=1e-8)


def test_least_squares_and_fit_compile_once_for_the_same_problem():
    ts = jnp.linspace(0.0, 2.0, 9)
    obs = 3.0 * jnp.exp(-1.5 * ts)

    def run():
        return (sl.least_squares(lambda p: p[0] * jnp.exp(-p[1] * ts) - obs,
                                 jnp.array([1.0, 1.0])),
                sl.fit(lambda p: jnp.sum((p[0] * jnp.exp(-p[1] * ts) - obs) ** 2),
                       jnp.array([2.5, 1.2]), steps=5, progress=False))

    run()
    with _events() as seen:
        ls, ft = run()
    assert not [n for n in seen["trace"] + seen["compile"] if "run" in n], seen
    np.testing.assert_allclose(ls.params, [3.0, 1.5], rtol=1e-9)
    assert ft.n_steps == 5 and ft.history[-1] < ft.history[0]


_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import simlib as sl
    sl.keep_compiled_programs(sys.argv[1])
    RATE = float(sys.argv[2])       # a global the vector field reads
    seen = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, d, **kw: seen.append(str(kw.get("fun_name")))
        if event.endswith(("jaxpr_trace_duration", "backend_compile_duration")) else None)

    def decay(t, y, k):
        return -RATE * k * y

    def robertson(t, y, k):
        return jnp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                          k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                          k[1] * y[1] ** 2])

    ts = jnp.array([1.0, 10.0, 100.0])
    rob = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 100.0, solver=sl.Rodas5P(),
                   rtol=1e-8, atol=1e-12, args=jnp.array([0.04, 3e7, 1e4]),
                   saveat=sl.SaveAt(ts=ts)).ys
    dec = sl.solve(decay, jnp.array([1.0]), 0.0, 2.0, solver=sl.Tsit5(), rtol=1e-10,
                   atol=1e-12, args=1.0).ys[-1, 0]
    # a sparse LU: its native kernel finds the pattern by key in the process's registry
    n = 12
    a = -2.0 * jnp.eye(n) + jnp.eye(n, k=1) + jnp.eye(n, k=-1)
    sparse = sl.solve(lambda t, y, a: a @ y, jnp.linspace(0.0, 1.0, n), 0.0, 1.0,
                      solver=sl.BDF(), rtol=1e-10, atol=1e-12, args=a,
                      jac_sparsity=a != 0, linear_solver="sparse").ys[-1]
    obs = 3.0 * jnp.exp(-1.5 * ts)
    fitted = sl.least_squares(lambda p: p[0] * jnp.exp(-p[1] * ts) - obs,
                              jnp.array([1.0, 1.0])).params
    try:
        sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 100.0, solver=sl.Rodas5P(),
                 rtol=1e-8, atol=1e-12, args=jnp.array([0.04, 3e7, 1e4]), max_steps=5)
        error = None
    except sl.SolverError as err:
        error = [err.result.name, str(err)]
    print(json.dumps(dict(rob=rob.tolist(), dec=float(dec), fitted=fitted.tolist(),
                          sparse=sparse.tolist(),
                          error=error, seen=seen)))
""")

_BUILT = ("adaptive_core", "run")  # the solve's and least_squares' programs (their names)


def _run(folder, rate):
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(folder), repr(rate)],
                         capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    names = {n.removeprefix("jit(").removesuffix(")") for n in got.pop("seen")}
    got["built"] = names & set(_BUILT)  # traced or compiled
    return got


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="programs are stored on the CPU")
def test_a_second_process_neither_traces_nor_compiles_and_a_change_is_seen(tmp_path):
    """Process 1 builds and stores the programs; process 2, the same script, loads them:
    no trace or compile of the solve's or least_squares' program, the same numbers to the
    bit, and the same SolverError. Process 3 changes a global the vector field reads: that
    program is built anew and its answer follows. Process 4 finds damaged files: it builds
    everything anew, and is right."""
    from scipy.integrate import solve_ivp
    from scipy.linalg import expm

    first = _run(tmp_path, 1.0)
    assert first["built"] == set(_BUILT)
    stored = sorted(p.name for p in (tmp_path / "programs").iterdir())
    assert len(stored) >= 3 and all(name.endswith(".bin") for name in stored)

    second = _run(tmp_path, 1.0)
    assert second["built"] == set()
    for name in ("rob", "dec", "fitted", "sparse", "error"):
        assert second[name] == first[name], name
    assert first["error"][0] == "MAX_STEPS_REACHED" and "max_steps=5" in first["error"][1]

    k = (0.04, 3e7, 1e4)
    ref = solve_ivp(lambda t, y: [-k[0] * y[0] + k[2] * y[1] * y[2],
                                  k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                                  k[1] * y[1] ** 2], (0.0, 100.0), [1.0, 0.0, 0.0],
                    method="Radau", t_eval=[1.0, 10.0, 100.0], rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.array(second["rob"]), ref.y.T, rtol=1e-5, atol=1e-12)
    assert abs(second["dec"] - np.exp(-2.0)) < 1e-9
    np.testing.assert_allclose(second["fitted"], [3.0, 1.5], rtol=1e-9)
    a = -2.0 * np.eye(12) + np.eye(12, k=1) + np.eye(12, k=-1)
    np.testing.assert_allclose(second["sparse"], expm(a) @ np.linspace(0.0, 1.0, 12),
                               rtol=1e-7, atol=1e-9)

    third = _run(tmp_path, 2.0)
    assert "adaptive_core" in third["built"]
    assert abs(third["dec"] - np.exp(-4.0)) < 1e-9

    for path in (tmp_path / "programs").iterdir():
        path.write_bytes(b"damaged")
    fourth = _run(tmp_path, 1.0)
    assert fourth["built"] == set(_BUILT)
    for name in ("rob", "dec", "fitted", "sparse", "error"):
        assert fourth[name] == first[name], name


def test_a_program_built_with_native_kernels_loaded_needs_them_to_load(tmp_path,
                                                                      monkeypatch):
    """Whether a program calls simlib's native kernels (the failure check, the sparse LU)
    depends on the machine, not on the key: a program stored while they were loaded is not
    loaded back where they do not load (it would call a kernel nobody registered and crash
    the process)."""
    if not _errors.uses_native_check():
        pytest.skip("the native failure check did not build here")
    monkeypatch.setattr(programs, "_folder", [tmp_path])
    monkeypatch.setattr(programs, "_memory", programs._Memory(4))
    # a program JAX's own cache (conftest's) cannot hold yet: one loaded from it is not
    # stored (serialised again, it fails to run)
    scale = float(np.random.default_rng().uniform(2.0, 3.0))
    jitted = jax.jit(lambda x: scale * x)
    program = programs.compiled(jitted, jnp.ones(3))
    k = programs.key(jitted, (), [], dynamic=(jnp.ones(3),))
    assert len(list(tmp_path.iterdir())) == 1
    programs._memory.cache_clear()
    assert "libsimlib_failure.so" in programs.load(k)[1]["native"]
    programs._memory.cache_clear()
    monkeypatch.setattr(programs, "load_by_name", lambda name: False)
    assert programs.load(k) is None
    np.testing.assert_array_equal(program(jnp.ones(3)), scale * np.ones(3))
