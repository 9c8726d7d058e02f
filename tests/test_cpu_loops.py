"""simlib.fast_cpu_loops: XLA:CPU's small-loop limit raised through XLA_FLAGS.

XLA reads XLA_FLAGS once per process, when JAX starts its CPU backend, so every check of
the flag's effect runs in a fresh Python. Checks that do not need a fresh backend (bad
arguments, the call after JAX has started, the XLA_FLAGS editing) run in this process
and never leave XLA_FLAGS changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl
from simlib import _cpu_loops

# three fresh Pythons (12 s): the slow set
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
OPT = "xla_cpu_small_while_loop_byte_threshold"

ARGS = (1.5, 1.0, 3.0, 1.0)
Y0 = (10.0, 5.0)
T1 = 5.0
STEPS = 2000

# One fresh Python: optionally fast_cpu_loops(), then (a) a while loop over 64 float64
# whose body accesses more than 1 KiB per iteration, compiled, and (b) an RK4
# Lotka-Volterra solve and its reverse-mode gradient, printed bit for bit.
CHILD = f"""
import json, os, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
import simlib as sl
if sys.argv[1] == "call":
    sl.fast_cpu_loops()
from jax._src import xla_bridge

def loop(x):
    def body(i, c):
        return jnp.sin(c) * 1.01 + jnp.cos(c[::-1])
    return jax.lax.fori_loop(0, 100, body, x)

hlo = jax.jit(loop).lower(jnp.ones(64)).compile().as_text()

def final(args, adjoint):
    sol = sl.solve(sl.systems.lotka_volterra, jnp.array({Y0!r}), 0.0, {T1!r},
                   solver=sl.RK4(), dt={T1 / STEPS!r}, args=args, max_steps={STEPS},
                   adjoint=adjoint)
    return sol.ys[-1]

p = jnp.array({ARGS!r})
y = jax.jit(lambda p: final(p, sl.Checkpointed()))(p)
g = jax.jit(jax.grad(lambda p: final(p, sl.Checkpointed())[0]))(p)
gf = jax.jit(jax.grad(lambda p: final(p, sl.ForwardMode())[0]))(p)
print(json.dumps(dict(
    hoisted="xla_cpu_small_call" in hlo,
    flags=os.environ.get("XLA_FLAGS"),
    y=[float(v).hex() for v in y], g=[float(v).hex() for v in g],
    gf=[float(v).hex() for v in gf],
)))
"""


def _child(mode: str, xla_flags: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    if xla_flags is not None:
        env["XLA_FLAGS"] = xla_flags
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", CHILD, mode], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


USER_FLAGS = "--xla_dump_hlo_as_text --xla_backend_extra_options=xla_cpu_disable_loop_unrolling"


@pytest.fixture(scope="module")
def runs():
    return dict(plain=_child("none"), fast=_child("call"),
                user=_child("call", xla_flags=USER_FLAGS))


def test_call_hoists_a_small_loop_over_1kib(runs):
    assert not runs["plain"]["hoisted"]
    assert runs["plain"]["flags"] is None
    assert runs["fast"]["hoisted"]
    n = _cpu_loops.DEFAULT_THRESHOLD_BYTES
    assert runs["fast"]["flags"] == f"--xla_backend_extra_options={OPT}={n}"


def test_user_flags_are_kept_and_extra_options_merged(runs):
    n = _cpu_loops.DEFAULT_THRESHOLD_BYTES
    assert runs["user"]["flags"] == (
        "--xla_dump_hlo_as_text "
        f"--xla_backend_extra_options=xla_cpu_disable_loop_unrolling,{OPT}={n}")
    assert runs["user"]["hoisted"]


def test_results_are_bit_identical_and_right(runs):
    plain, fast = runs["plain"], runs["fast"]
    for key in ("y", "g"):
        assert fast[key] == plain[key], key
    # The forward-mode gradient (a custom JVP through the loop since fixed-step ForwardMode
    # supports every transformation) is compiled into a different outlined call, whose
    # fusion rounds differently: 22 ulps apart here, so equal to round-off, not to the bit.
    gf_plain = np.array([float.fromhex(v) for v in plain["gf"]])
    gf_fast = np.array([float.fromhex(v) for v in fast["gf"]])
    np.testing.assert_allclose(gf_fast, gf_plain, rtol=1e-13, atol=0)
    y = np.array([float.fromhex(v) for v in fast["y"]])
    g = np.array([float.fromhex(v) for v in fast["g"]])

    # Outside simlib: scipy's DOP853 at rtol 1e-12, and central differences of it.
    def prey(p):
        sol = solve_ivp(lambda t, u: [p[0] * u[0] - p[1] * u[0] * u[1],
                                      -p[2] * u[1] + p[3] * u[0] * u[1]],
                        (0.0, T1), Y0, method="DOP853", rtol=1e-12, atol=1e-12)
        return sol.y[:, -1]

    ref = prey(np.array(ARGS))
    np.testing.assert_allclose(y, ref, rtol=1e-6)  # RK4 at dt = 2.5e-3
    h = 1e-6
    fd = np.array([(prey(np.array(ARGS) + h * e)[0] - prey(np.array(ARGS) - h * e)[0]) / (2 * h)
                   for e in np.eye(4)])
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-5 * np.abs(fd).max())


def test_call_after_jax_started_raises(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    jnp.ones(3).block_until_ready()  # JAX's CPU backend is running in this process
    with pytest.raises(RuntimeError, match="before any JAX computation") as err:
        sl.fast_cpu_loops()
    assert "XLA_FLAGS" in str(err.value)
    assert "XLA_FLAGS" not in os.environ


def test_call_after_jax_started_is_a_no_op_when_already_set(monkeypatch):
    flags = f"--xla_backend_extra_options={OPT}=100000000"
    monkeypatch.setenv("XLA_FLAGS", flags)
    jnp.ones(3).block_until_ready()
    sl.fast_cpu_loops()
    sl.fast_cpu_loops(16384)
    assert os.environ["XLA_FLAGS"] == flags
    with pytest.raises(RuntimeError, match="before any JAX computation"):
        sl.fast_cpu_loops(200_000_000)


def test_call_after_jax_started_on_an_accelerator_returns(monkeypatch):
    # The option only concerns XLA:CPU: with a GPU or TPU as the default backend a late
    # call changes nothing and does not raise (no accelerator here, so the check is faked).
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    jnp.ones(3).block_until_ready()
    monkeypatch.setattr(_cpu_loops, "_default_backend_is_cpu", lambda: False)
    sl.fast_cpu_loops()
    assert "XLA_FLAGS" not in os.environ


@pytest.mark.parametrize("bad", [0, 512, -1, 2**63, 1.5, 1e6, "1048576", True, [4096]])
def test_bad_threshold(bad):
    with pytest.raises(ValueError, match="threshold_bytes"):
        sl.fast_cpu_loops(bad)


@pytest.mark.parametrize("flags, n, expected", [
    ("", 4096, f"--xla_backend_extra_options={OPT}=4096"),
    ("--xla_cpu_enable_fast_math=false", 4096,
     f"--xla_cpu_enable_fast_math=false --xla_backend_extra_options={OPT}=4096"),
    (f"--xla_backend_extra_options=a,{OPT}=2048,b=1", 4096,
     f"--xla_backend_extra_options=a,{OPT}=4096,b=1"),
    ("--xla_backend_extra_options=a  --xla_backend_extra_options=b=2 --x", 4096,
     f"--xla_backend_extra_options=a --xla_backend_extra_options=b=2,{OPT}=4096 --x"),
])
def test_flag_editing(flags, n, expected):
    assert _cpu_loops._with_threshold(flags, n) == expected
    assert _cpu_loops._threshold_in(expected) == n


def test_threshold_reading_follows_xla():
    # XLA applies the extra-options flags in order; a later value of a key wins.
    assert _cpu_loops._threshold_in("") is None
    assert _cpu_loops._threshold_in(f"--xla_backend_extra_options={OPT}=5") == 5
    assert _cpu_loops._threshold_in(
        f"--xla_backend_extra_options={OPT}=5 --xla_backend_extra_options=a,{OPT}=7") == 7
    assert _cpu_loops._threshold_in(f"--xla_dump_to=/tmp/{OPT}=9") is None
