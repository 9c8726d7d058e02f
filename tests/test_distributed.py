"""Multi-process runs: ``sl.init_distributed`` argument checks (in this process, without
joining anything) and two processes on localhost, 2 CPU devices each, joined by JAX's CPU
collectives (gloo): a sharded ensemble equals the one-process run and scipy, and each
process holds only its own members."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl

ROOT = Path(__file__).resolve().parents[1]
N = 16
T1 = 0.5

WORKER = textwrap.dedent(r"""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import simlib as sl

    info = sl.init_distributed(sys.argv[1], 2, int(sys.argv[2]), timeout=120)

    def lorenz(t, y, a):
        s, r, b = a
        return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])

    def member(y0, rho):
        return sl.solve(lorenz, y0, 0.0, {T1}, solver=sl.Tsit5(), rtol=1e-10, atol=1e-10,
                        args=(10.0, rho, 8.0 / 3.0)).ys[-1]

    y0s = np.stack([np.ones({N}), np.linspace(0.0, 1.0, {N}), np.full({N}, 20.0)], axis=1)
    rhos = np.linspace(20.0, 30.0, {N})
    gathered = sl.ensemble(member, gather=True)(y0s, rhos)
    sharded = sl.ensemble(member)(y0s, rhos)
    shards = sorted(sharded.addressable_shards, key=lambda s: s.index[0].start)
    print("RESULT " + json.dumps(dict(
        info=list(info), gathered=np.asarray(gathered).tolist(),
        rows=[[s.index[0].start, s.index[0].stop] for s in shards],
        local=[np.asarray(s.data).tolist() for s in shards])), flush=True)
""").format(N=N, T1=T1)


# A member held by process 1 (member 11 of 16, y' = y^2 from 4.0: non-finite near
# t = 0.25) fails; process 0 holds no failing member and must raise all the same, instead
# of going on to its next collective and waiting there for a process that has died.
WORKER_FAIL = textwrap.dedent(r"""
    import sys
    import jax, jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    import simlib as sl

    sl.init_distributed(sys.argv[1], 2, int(sys.argv[2]), timeout=120)

    def blow(y0):
        return sl.solve(lambda t, y, a: y * y, y0, 0.0, 0.5, solver=sl.RK4(), dt=0.01).ys[-1]

    try:
        with sl.raise_solver_errors():   # JAX wraps a callback's exception; unwrap it
            jax.block_until_ready(sl.ensemble(blow, gather=True)(
                jnp.full((16, 1), 0.5).at[11, 0].set(4.0)))
        print("RESULT no error", flush=True)
    except sl.SolverError as err:
        print("RESULT raised " + str(err).splitlines()[0], flush=True)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(timeout: float = 300.0, worker: str = WORKER):
    """Both processes' (returncode, stdout, stderr); kills both on a timeout."""
    address = f"127.0.0.1:{_free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    for name in ("SIMLIB_COORDINATOR", "SIMLIB_NUM_PROCESSES", "SIMLIB_PROCESS_ID"):
        env.pop(name, None)
    procs = [subprocess.Popen([sys.executable, "-c", worker, address, str(i)], env=env,
                              cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for i in range(2)]
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append((p.returncode, out, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        outs = [p.communicate() for p in procs]
        pytest.fail("the two-process run timed out after {} s:\n{}".format(timeout, "\n".join(
            f"--- process {i} stdout:\n{o[-2000:]}\n--- stderr:\n{e[-4000:]}"
            for i, (o, e) in enumerate(outs))))
    return results


def _parse(results):
    parsed = []
    for i, (code, out, err) in enumerate(results):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert code == 0 and lines, (f"process {i} failed (exit {code}):\n{out[-2000:]}\n"
                                     f"--- stderr:\n{err[-6000:]}")
        parsed.append(json.loads(lines[-1][len("RESULT "):]))
    return parsed


@pytest.mark.slow
def test_two_processes_give_the_one_process_ensemble():
    results = _launch()
    if any(code != 0 and "ddress already in use" in err for code, _, err in results):
        results = _launch()            # the free port was taken in between: once more
    p0, p1 = _parse(results)
    assert p0["info"] == [0, 2, 2, 4] and p1["info"] == [1, 2, 2, 4]

    import jax
    import jax.numpy as jnp

    def lorenz(t, y, a):
        s, r, b = a
        return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])

    def member(y0, rho):
        return sl.solve(lorenz, y0, 0.0, T1, solver=sl.Tsit5(), rtol=1e-10, atol=1e-10,
                        args=(10.0, rho, 8.0 / 3.0)).ys[-1]

    y0s = np.stack([np.ones(N), np.linspace(0.0, 1.0, N), np.full(N, 20.0)], axis=1)
    rhos = np.linspace(20.0, 30.0, N)
    one = np.asarray(jax.jit(jax.vmap(member))(y0s, rhos))       # one process, one device
    for i in (0, N - 1):
        y0, rho = y0s[i], rhos[i]
        ref = solve_ivp(lambda t, y, rho=rho: [10.0 * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1],
                                               y[0] * y[1] - 8.0 / 3.0 * y[2]],
                        (0.0, T1), y0, method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1]
        np.testing.assert_allclose(one[i], ref, rtol=1e-7)
    for p in (p0, p1):
        np.testing.assert_allclose(np.asarray(p["gathered"]), one, rtol=1e-12, atol=1e-12)
    # each process holds its own half of the members, one quarter per device
    assert p0["rows"] == [[0, 4], [4, 8]] and p1["rows"] == [[8, 12], [12, 16]]
    for p in (p0, p1):
        for (a, b), local in zip(p["rows"], p["local"], strict=True):
            np.testing.assert_allclose(np.asarray(local), one[a:b], rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_a_failing_member_raises_on_every_process():
    """Both processes raise the same SolverError (their exit status is not checked: the
    callback's error stays in JAX's effect tokens, and at exit JAX's distributed service
    then ends the processes with an abort, after they have reported)."""
    results = _launch(timeout=200.0, worker=WORKER_FAIL)
    if any("ddress already in use" in err for _, _, err in results):
        results = _launch(timeout=200.0, worker=WORKER_FAIL)
    for i, (code, out, err) in enumerate(results):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert lines, f"process {i} (exit {code}):\n{out[-2000:]}\n{err[-4000:]}"
        assert lines[-1].startswith("RESULT raised "), (i, lines[-1])
        t = float(re.search(r"at t=([0-9.e+-]+)", lines[-1]).group(1))
        assert 0.25 <= t < 0.3, (i, lines[-1])


def test_init_distributed_names_bad_arguments(monkeypatch):
    """Checked before anything is joined (this process stays single)."""
    with pytest.raises(ValueError, match="'host:port'"):
        sl.init_distributed("localhost", 2, 0)
    with pytest.raises(ValueError, match=r"process_id must be an integer in \[0, num_processes=2"):
        sl.init_distributed("localhost:1234", 2, 2)
    with pytest.raises(ValueError, match="num_processes must be a positive integer"):
        sl.init_distributed("localhost:1234", 0, 0)
    with pytest.raises(TypeError, match="coordinator_address must be"):
        sl.init_distributed(1234, 2, 0)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        sl.init_distributed("localhost:1234", 2, 0, timeout=0)
    monkeypatch.setenv("SIMLIB_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="SIMLIB_NUM_PROCESSES must be an integer, got 'two'"):
        sl.init_distributed("localhost:1234")
