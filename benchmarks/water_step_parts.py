"""Per-part profile of simulate's SPC/E SETTLE step (float32): CPU time (all threads) and
wall, best of 7 round-robin; each part jitted alone, the energy passed as an argument as
simulate passes it.

    python benchmarks/water_step_parts.py ALPHA GRID [MOLECULES=1000]

(docs/electrostatics.md used OpenMM's parameters at 1,000 molecules: 2.9202898720871846 28.)
"""
import sys
import time

import jax
import jax.numpy as jnp

import simlib
import simlib.particles as sp
from simlib.particles import _health, _settle
from simlib.particles._model import Model

print(simlib.__file__)
w = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
water = sp.spce_water(w)
alpha, grid = float(sys.argv[1]), int(sys.argv[2])
space = sp.periodic(water.box)
energy = sp.spce_energy(water, 0.9, tolerance=5e-4, alpha=alpha, grid=grid)
settle = sp.Settle(water.molecules, water.d_oh, water.d_hh)
v = sp.maxwell_boltzmann(water.masses, 0.00831446 * 300, key=jax.random.key(1))
v = settle.constrain_velocities(water.positions, v, water.masses, space)
x, m, p = water.positions, water.masses, water.params
nbrs = sp.neighbor_list(space, x, r_cut=0.9, skin=0.1)
dt = jnp.asarray(0.002, x.dtype)
model = Model(energy, space, box_checked=True)
carry = settle.start(model, sp.State(x, v, m), p, nbrs)
limit = _health.move_limit(model, nbrs, x.dtype)
x1 = x + dt * v
N = 200
run = dict(space=space, dt=0.002, n_steps=N, save_every=N, neighbors=nbrs, integrator=settle)
traj = sp.simulate(energy, sp.State(x, v, m), p, **run)
builds = int(traj.stats["n_builds"]) - int(nbrs.n_builds)
jf = jax.jit(lambda e, x, p, nb: e.energy_and_forces(x, p, nb))
jsp = jax.jit(lambda mol, a, b, m: _settle.settle_positions(space, a, b, mol, m, water.d_oh,
                                                            water.d_hh))
jsv = jax.jit(lambda mol, a, b, m: _settle.settle_velocities(space, a, b, mol, m))
ju = jax.jit(lambda nl, a: nl.update(a))
jb = jax.jit(lambda nl, a: nl.build(a))
jc = jax.jit(lambda s, c, m, dt: _health.checked_status(s, c, m, dt, limit))
def sim():
    return sp.simulate(energy, sp.State(x, v, m), p, **run).positions
calls = {
  "force call (energy_and_forces)": (lambda: jf(energy, x, p, nbrs), 1),
  "SETTLE positions": (lambda: jsp(settle.molecules, x, x1, m), 1),
  "SETTLE velocities": (lambda: jsv(settle.molecules, x, v, m), 1),
  "list check (no rebuild)": (lambda: ju(nbrs, x + 1e-4), 1),
  "list build": (lambda: jb(nbrs, x), 1),
  "health checks": (lambda: jc(settle, carry, m, dt), 1),
  f"simulate, per step ({N} steps)": (sim, N),
}
for f, _ in calls.values():
    jax.block_until_ready(f())
wall = {k: 1e9 for k in calls}
cpu = {k: 1e9 for k in calls}
for _ in range(7):
    for k, (f, n) in calls.items():
        t, c = time.perf_counter(), time.process_time()
        jax.block_until_ready(f())
        wall[k] = min(wall[k], (time.perf_counter() - t) / n)
        cpu[k] = min(cpu[k], (time.process_time() - c) / n)
print(f"{w} molecules, alpha {alpha} grid {grid}: {builds} list builds in {N} steps")
for k in calls:
    print(f"  {k:32s} cpu {1e3*cpu[k]:7.3f} ms   wall {1e3*wall[k]:7.3f} ms")
print(f"  list builds per step x build     cpu {1e3*cpu['list build']*builds/N:7.3f} ms")
