import jax, jax.numpy as jnp, numpy as np, json, os
import simlib.particles as sp
from simlib.particles import _energy
n = 20000
x = jax.random.normal(jax.random.key(3), (n, 3), jnp.float32)
m = jax.random.uniform(jax.random.key(4), (n,), jnp.float32) / n
p = dict(G=jnp.float32(1.0), softening=jnp.float32(0.01), masses=m)
e = sp.pair_energy(sp.gravity, sp.free())
u, f = jax.jit(e.energy_and_forces)(x, p)
u0, f0 = jax.jit(lambda x: _energy._gravity_direct(e, x, m, jnp.stack([1.0, 0.01]).astype(jnp.float32)))(x)
g = jax.jit(jax.grad(lambda x: e.energy(x, p)))(x)
out = dict(energy_rel=float(abs(u - u0) / abs(u0)), force_rel=float(jnp.max(jnp.abs(f - f0)) / jnp.max(jnp.abs(f0))),
           grad_vs_minus_force=float(jnp.max(jnp.abs(g + f0)) / jnp.max(jnp.abs(f0))),
           hlo_has_pallas="tpu_custom_call" in jax.jit(e.energy_and_forces).lower(x, p).compile().as_text())
print(out); json.dump(out, open(os.environ["OUT"] + "/check.json", "w"))
