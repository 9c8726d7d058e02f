"""Ensembles and particles sharded over 8 forced host devices (one subprocess, since the
device count is fixed when JAX starts): sharded results equal unsharded ones and scipy,
outputs carry the sharding asked for, no device receives a whole batch it should only
hold a slice of, and the in-graph failure check (``throw=True``) stays per device."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl

ROOT = Path(__file__).resolve().parents[1]
N_DEV = 8
N = 32            # members: 4 per device
T1 = 0.5
RTOL = 1e-10
NP = 256          # bodies: 32 targets per device

SCRIPT = textwrap.dedent(r"""
    import json, re, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import NamedSharding, PartitionSpec as P
    import simlib as sl

    N, T1, RTOL = {N}, {T1}, {RTOL}
    out = {{"devices": jax.device_count()}}

    def lorenz(t, y, a):
        s, r, b = a
        return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])

    def member(y0, rho):
        return sl.solve(lorenz, y0, 0.0, T1, solver=sl.Tsit5(), rtol=RTOL, atol=RTOL,
                        args=(10.0, rho, 8.0 / 3.0)).ys[-1]

    y0s = jnp.stack([jnp.ones(N), jnp.linspace(0.0, 1.0, N), jnp.full(N, 20.0)], axis=1)
    rhos = jnp.linspace(20.0, 30.0, N)
    out["y0s"], out["rhos"] = np.asarray(y0s).tolist(), np.asarray(rhos).tolist()

    def collectives(hlo):
        # (op, number of elements of its result) for every cross-device op
        found = []
        for line in hlo.splitlines():
            m = re.search(r"= (\(?[a-z0-9]+\[[^=]*?) (all-gather|all-reduce|all-to-all|"
                          r"collective-permute|reduce-scatter)[-a-z]*\(", line)
            if m:
                sizes = [int(np.prod([int(d) for d in s.split(",") if d] or [1]))
                         for s in re.findall(r"\[([0-9,]*)\]", m.group(1))]
                found.append((m.group(2), max(sizes)))
        return found

    # 1. plain jit(vmap(solve)) on inputs sharded over an Auto mesh
    mesh = sl.ensemble_mesh()
    sh = NamedSharding(mesh, P("members"))
    plain = jax.jit(jax.vmap(member))
    args = (jax.device_put(y0s, sh), jax.device_put(rhos, sh))
    hlo = plain.lower(*args).compile().as_text()
    res = plain(*args)
    out["plain"] = np.asarray(res).tolist()
    out["plain_sharded"] = res.sharding.spec == P("members")
    out["plain_collectives"] = collectives(hlo)
    # the operand shapes of the host callback(s) behind throw=True
    out["plain_callback_operands"] = [
        re.findall(r"\[([0-9,]*)\]", m) for m in re.findall(
            r"custom_call_target=\"[a-z_]*callback\", operand_layout_constraints=\{{([^}}]*)\}}",
            hlo)]

    # 2. the same on one device
    one = jax.devices()[0]
    single = jax.jit(jax.vmap(member))(jax.device_put(y0s, one), jax.device_put(rhos, one))
    out["single"] = np.asarray(single).tolist()

    # 3. sl.ensemble, sharded and gathered
    ens = sl.ensemble(member)(y0s, rhos)
    out["ensemble"] = np.asarray(ens).tolist()
    out["ensemble_sharded"] = ens.sharding.spec == P("members")
    out["ensemble_shards"] = sorted({{tuple(s.data.shape) for s in ens.addressable_shards}})
    out["ensemble_shard_devices"] = len({{s.device for s in ens.addressable_shards}})
    gat = sl.ensemble(member, gather=True)(y0s, rhos)
    out["gathered_replicated"] = bool(gat.sharding.is_fully_replicated)
    out["gathered"] = np.asarray(gat).tolist()
    shared = sl.ensemble(member, in_axes=(0, None))(y0s, jnp.float64(28.0))  # IC sweep
    out["shared_rho"] = np.asarray(shared).tolist()

    # 4. members that blow up (y' = y^2 from y0 at t = 1/y0: member 5 at 0.4 on device 2,
    # member 11 at 0.25 on device 5), with throw=True
    def square(t, y, a):
        return y * y

    def blow(y0):
        return sl.solve(square, y0, 0.0, 0.5, solver=sl.RK4(), dt=0.01).ys[-1]

    bad = jnp.full((16, 1), 0.5).at[5, 0].set(2.5).at[11, 0].set(4.0)
    for name, run in (("plain", lambda y: jax.jit(jax.vmap(blow))(jax.device_put(y, sh))),
                      ("ensemble", sl.ensemble(blow))):
        try:
            jax.block_until_ready(run(bad))
            out["raise_" + name] = None
        except Exception as err:  # noqa: BLE001 - the message is what is checked
            out["raise_" + name] = str(err)

    print("RESULT " + json.dumps(out))
""").format(N=N, T1=T1, RTOL=RTOL)

PARTICLES = textwrap.dedent(r"""
    import json
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from jax.sharding import PartitionSpec as P
    out = {{"devices": jax.device_count()}}

    # docs/ensembles.md: its python blocks, in order, in one namespace
    import re
    page = open("docs/ensembles.md").read()
    ns = {{}}
    for block in re.findall(r"```python\n(.*?)```", page, flags=re.S):
        exec(compile(block, "docs/ensembles.md", "exec"), ns)
    out["docs"] = dict(blocks=len(re.findall(r"```python\n", page)),
                       sharded=ns["sharded"].sharding.spec == P("members"),
                       codes=np.asarray(ns["codes"]).tolist())

    # 5. particles: direct-sum gravity and LJ (neighbour list) with the targets split
    from simlib import particles as sp
    x = jax.random.normal(jax.random.key(0), ({NP}, 3))
    m = jax.random.uniform(jax.random.key(1), ({NP},)) + 0.5
    params = dict(G=1.0, softening=0.05, masses=m)
    grav = sp.pair_energy(sp.gravity, sp.free())
    e1, f1 = jax.jit(grav.energy_and_forces)(x, params)
    es, fs = jax.jit(sp.sharded(grav).energy_and_forces)(x, params)
    out["gravity"] = dict(x=np.asarray(x).tolist(), m=np.asarray(m).tolist(),
                          e1=float(e1), f1=np.asarray(f1).tolist(),
                          es=float(es), fs=np.asarray(fs).tolist(),
                          sharded=fs.sharding.spec == P("particles"),
                          shards=sorted({{tuple(q.data.shape) for q in fs.addressable_shards}}))
    state = sp.State(x, jnp.zeros_like(x), m)
    runs = [sp.simulate(e, state, params, space=sp.free(), dt=1e-3, n_steps=20, save_every=10)
            for e in (grav, sp.sharded(grav))]
    out["gravity_simulate"] = [np.asarray(t.positions).tolist() for t in runs]
    pos, box = sp.lattice(4, 0.8442)
    pos = pos + 0.05 * jax.random.normal(jax.random.key(2), pos.shape)
    space = sp.periodic(box)
    lj = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    nbrs = sp.neighbor_list(space, pos, r_cut=2.5, skin=0.3)
    lj_params = dict(sigma=1.0, epsilon=1.0)
    out["lj"] = [[float(e), np.asarray(f).tolist()] for e, f in (
        lj.energy_and_forces(pos, lj_params, nbrs),
        sp.sharded(lj).energy_and_forces(pos, lj_params, nbrs))]

    print("RESULT " + json.dumps(out))
""").format(NP=NP)


def _run_on_8_devices(script):
    env = dict(os.environ, PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEV}",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"the 8-device script failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
        f"{proc.stderr[-6000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["devices"] == N_DEV
    return out, proc.stderr


@pytest.fixture(scope="module")
def run():
    return _run_on_8_devices(SCRIPT)


@pytest.fixture(scope="module")
def particles():
    return _run_on_8_devices(PARTICLES)[0]


def _scipy(y0, rho):
    def rhs(t, y):
        return [10.0 * (y[1] - y[0]), y[0] * (rho - y[2]) - y[1], y[0] * y[1] - 8.0 / 3.0 * y[2]]

    return solve_ivp(rhs, (0.0, T1), y0, method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1]


def test_sharded_runs_equal_one_device_and_scipy(run):
    out, _ = run
    assert out["devices"] == N_DEV
    single = np.asarray(out["single"])
    ref = np.array([_scipy(y0, rho) for y0, rho in zip(out["y0s"], out["rhos"], strict=True)])
    np.testing.assert_allclose(single, ref, rtol=1e-7, atol=1e-8)
    for key in ("plain", "ensemble", "gathered"):   # the same members, split 8 ways
        np.testing.assert_allclose(np.asarray(out[key]), single, rtol=1e-12, atol=1e-12)
    shared = np.array([_scipy(y0, 28.0) for y0 in out["y0s"]])
    np.testing.assert_allclose(np.asarray(out["shared_rho"]), shared, rtol=1e-7, atol=1e-8)


def test_outputs_carry_the_sharding_asked_for(run):
    out, _ = run
    assert out["plain_sharded"]
    assert out["ensemble_sharded"]
    assert out["ensemble_shards"] == [[N // N_DEV, 3]]       # a slice per device ...
    assert out["ensemble_shard_devices"] == N_DEV            # ... on each of the 8
    assert out["gathered_replicated"]


def test_failure_check_does_not_gather_the_batch(run):
    """The issue's symptom: XLA warned that the check's callback pulled every member's
    status onto device 0. No warning now, and no collective moves as much as a batch."""
    out, stderr = run
    assert "Involuntary full rematerialization" not in stderr, stderr[-3000:]
    assert len(out["plain_callback_operands"]) == 1, "expected one in-graph check callback"
    assert all(dims == "" for dims in out["plain_callback_operands"][0]), (
        f"the check's callback receives arrays, not one member's scalars: "
        f"{out['plain_callback_operands']}")
    sizes = [size for _, size in out["plain_collectives"]]
    assert sizes, "expected the per-device candidates to be gathered"
    assert max(sizes) <= N_DEV < N, out["plain_collectives"]


def _failure_time(message):
    assert message is not None, "the blow-up was not reported"
    match = re.search(r"non-finite \(nan or inf\) at t=([0-9.e+-]+)", message)
    assert match, message[-2000:]
    return float(match.group(1))


def test_a_failing_member_raises_from_sharded_runs(run):
    """y' = y^2 blows up at t = 1/y0; RK4 with dt = 0.01 meets a non-finite state within
    a few steps after it. Both the plain run and the ensemble name the first failing
    member (5, t = 0.4), not member 11 (t = 0.25) of a later device: the ensemble's devices
    share their candidates before raising."""
    out, _ = run
    t = _failure_time(out["raise_plain"])
    assert 0.4 <= t < 0.45
    t = _failure_time(out["raise_ensemble"])
    assert 0.4 <= t < 0.45


@pytest.mark.slow
def test_sharded_gravity_equals_one_device_and_a_numpy_pair_sum(particles):
    out = particles
    g = out["gravity"]
    x, m = np.asarray(g["x"]), np.asarray(g["m"])
    d = x[:, None] - x[None]
    r2 = (d**2).sum(-1) + 0.05**2
    np.fill_diagonal(r2, np.inf)
    forces = -(m[:, None, None] * m[None, :, None] * d / r2[..., None] ** 1.5).sum(axis=1)
    energy = -0.5 * (m[:, None] * m[None] / np.sqrt(r2)).sum()
    scale = np.abs(forces).max()
    np.testing.assert_allclose(np.asarray(g["fs"]), forces, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(g["es"], energy, rtol=1e-13)
    np.testing.assert_allclose(np.asarray(g["fs"]), np.asarray(g["f1"]), rtol=0,
                               atol=1e-14 * scale)
    assert abs(g["es"] - g["e1"]) <= 1e-14 * abs(g["e1"])
    assert g["sharded"] and g["shards"] == [[NP // N_DEV, 3]]   # forces stay split
    one, split = (np.asarray(p) for p in out["gravity_simulate"])
    np.testing.assert_allclose(split, one, rtol=0, atol=1e-13)


@pytest.mark.slow
def test_sharded_lj_with_a_neighbour_list_equals_one_device(particles):
    (e1, f1), (es, fs) = particles["lj"]
    assert abs(es - e1) <= 1e-13 * abs(e1)
    np.testing.assert_allclose(np.asarray(fs), np.asarray(f1), rtol=0, atol=1e-12)
    assert np.abs(np.asarray(f1).sum(axis=0)).max() < 1e-10   # Newton's third law


@pytest.mark.slow
def test_the_docs_page_runs_on_8_devices(particles):
    docs = particles["docs"]
    assert docs["blocks"] == 5 and docs["sharded"]
    # 16 steps cannot cover the chaotic Lorenz span at rtol 1e-8: every member says so
    assert docs["codes"] == [int(sl.Result.MAX_STEPS_REACHED)] * 64


# -- in this process (one device): argument checks and the first-failure pick -----------

def test_ensemble_names_bad_arguments():
    import jax.numpy as jnp

    def f(a, b):
        return a + b

    with pytest.raises(ValueError, match="disagree on the number of members: 3 .*, 4"):
        sl.ensemble(f)(jnp.ones(3), jnp.ones(4))
    with pytest.raises(ValueError, match="in_axes has 1 entries"):
        sl.ensemble(f, in_axes=(0,))(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match=r"in_axes\[1\] must be 0"):
        sl.ensemble(f, in_axes=(0, 1))(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="no argument is batched"):
        sl.ensemble(f, in_axes=None)(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="argument 1 is batched .* scalar leaf"):
        sl.ensemble(f)(jnp.ones(3), 2.0)
    with pytest.raises(TypeError, match="mesh must be a jax.sharding.Mesh"):
        sl.ensemble(f, mesh="all")
    np.testing.assert_array_equal(sl.ensemble(f, in_axes=(0, None))(jnp.arange(3.0), 1.0),
                                  [1.0, 2.0, 3.0])


def test_nested_vmap_reports_the_first_failing_member_in_row_major_order():
    """y' = y^2 blows up at t = 1/y0. Members (0, 1) and (1, 0) fail, (1, 0) first in time;
    the error must name (0, 1), the first in order, as the unsharded check always did."""
    import jax
    import jax.numpy as jnp

    def one(y0):
        return sl.solve(lambda t, y, a: y * y, y0, 0.0, 0.5, solver=sl.RK4(), dt=0.01).ys

    y0 = jnp.array([[[0.5], [2.5]], [[4.0], [0.5]]])
    with pytest.raises(Exception, match="non-finite") as err:
        jax.block_until_ready(jax.jit(jax.vmap(jax.vmap(one)))(y0))
    assert 0.4 <= _failure_time(str(err.value)) < 0.45
