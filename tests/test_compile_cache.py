"""Programs built from simlib can be kept in JAX's persistent compilation cache, with the
default ``throw=True``: the in-graph failure check is the native custom call
``simlib_failure_check`` (simlib/native/failure.cc), not a Python host callback, which JAX
refuses to store. Tested on the mechanism (what the lowered program holds, what JAX writes
to and reads from its cache in two processes) and on the messages, which the native check
renders from the same templates as Python (``simlib._errors.render``)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import _errors

pytestmark = pytest.mark.skipif(not _errors.uses_native_check(),
                                reason="the native failure check did not build here")


def robertson(t, y, k):
    return jnp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                      k[1] * y[1] ** 2])


def _loss(k):
    sol = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 10.0, solver=sl.Rodas5P(),
                   rtol=1e-6, atol=1e-10, args=k, saveat=sl.SaveAt(ts=jnp.array([1.0, 10.0])))
    return jnp.sum(sol.ys[:, 1])


def test_the_gradient_program_holds_the_custom_call_and_no_host_callback():
    text = jax.jit(jax.grad(_loss)).lower(jnp.array([0.04, 3e7, 1e4])).as_text()
    assert "simlib_failure_check" in text
    assert "callback" not in text.lower()  # xla_python_cpu_callback, xla_ffi_python_...


_TWO_PROCESSES = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    sys.path.insert(0, sys.argv[2])
    from test_compile_cache import _loss
    k = jax.block_until_ready(jnp.array([0.04, 3e7, 1e4]))
    events = []  # JAX's cache events while the gradient's program is compiled or loaded
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    g = jax.jit(jax.grad(_loss))(k)
    print(json.dumps(dict(grad=[float(x) for x in g],
                          hits=events.count("/jax/compilation_cache/cache_hits"))))
""")


def test_a_second_process_loads_the_gradient_from_the_cache(tmp_path):
    """``jax.jit(jax.grad(loss))`` of a ``throw=True`` Rodas5P solve: the first process
    compiles and stores the program (its file in the cache folder), the second loads it
    (JAX's cache-hit event, with only that entry in its folder), and both give the same
    gradient, equal to central finite differences of the loss. (With the host callback,
    JAX writes no file: "Not writing persistent cache entry ... because it uses host
    callbacks"; checked by hand with SIMLIB_NATIVE=0: no file, no hit.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION")}

    def run(cache):
        cmd = [sys.executable, "-c", _TWO_PROCESSES, str(cache), os.path.dirname(__file__)]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
        return json.loads(out.stdout.splitlines()[-1])

    cache = tmp_path / "cache"
    first = run(cache)
    # the second process finds the gradient's entry alone, so that its one hit is that one
    # (the folder stays: JAX's key holds options that name it)
    stored = [p for p in cache.iterdir() if p.name.startswith("jit__loss")]
    for p in cache.iterdir():
        if p not in stored:
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    second = run(cache)
    assert first["hits"] == 0 and stored
    assert second["hits"] == 1
    assert first["grad"] == second["grad"]
    k = np.array([0.04, 3e7, 1e4])
    for i, h in enumerate(k * 1e-5):
        e = np.zeros(3)
        e[i] = h
        fd = (float(_loss(jnp.asarray(k + e))) - float(_loss(jnp.asarray(k - e)))) / (2 * h)
        assert first["grad"][i] == pytest.approx(fd, rel=1e-4, abs=1e-12)


# The values each kind of field prints: Python's repr(float) rules (positional between 1e-4
# and 1e16, shortest round-trip digits, ".0" on integers), 17 digits, integers.
_VALUES = (0.1, 1e-05, 1e16, 123456789.0, -2.5e-300, 1.0 / 3.0, 5e-324, 1.7976931348623157e308,
           -0.0, float("nan"), float("inf"), 12345.678, 1e-4, 9.999999999999999e15)


@pytest.fixture(scope="module")
def raise_with():
    """A compiled check whose key and values are inputs: one program serves every case."""
    table = ((1, "SolverError(MAX_STEPS_REACHED): t: {where:5,6}r={2:r} g={3} d={4:d}"),)

    @jax.jit
    def run(key, r, g, d, member, count):
        check = _errors._in_graph_check(table)
        return check(key, jnp.int32(1), r, g, d, member, count)

    def call(*values):
        try:
            jax.block_until_ready(run(*values))
        except jax.errors.JaxRuntimeError as err:
            found = sl.SolverError.from_exception(err)
            assert found is not None and found.result is sl.Result.MAX_STEPS_REACHED
            return str(found)
        return None

    return table[0][1], call


@pytest.mark.parametrize("value", _VALUES)
def test_native_messages_are_the_python_renderings(raise_with, value):
    template, call = raise_with
    args = (jnp.int32(1), jnp.float64(value), jnp.float64(value), jnp.int32(-7),
            jnp.int32(3), jnp.int32(8))
    native = call(*args)
    python = _errors.render(template, (1, 1, *map(np.asarray, args[1:])))
    assert native == python.removeprefix("SolverError(MAX_STEPS_REACHED): ")
    # the fields as Python formats them (the renderer's own rules, checked once more)
    assert f"r={value!r} " in native and f"g={value:.17g} " in native and "d=-7" in native
    assert native.startswith("t: member 3 of 8: ")
    if math.isfinite(value):
        assert float(native.split("r=")[1].split()[0]) == value


def test_no_failure_raises_nothing_and_one_member_is_not_named(raise_with):
    _, call = raise_with
    assert call(jnp.int32(0), 1.0, 1.0, jnp.int32(1), jnp.int32(0), jnp.int32(1)) is None
    assert call(jnp.int32(1), 1.0, 1.0, jnp.int32(1), jnp.int32(0), jnp.int32(1)).startswith(
        "t: r=1.0 ")
