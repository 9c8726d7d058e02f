"""Check on an accelerator that ``pair_energy(gravity)`` ran the Pallas kernel and agrees.

    OUT=dir python benchmarks/gravity_check_tpu.py

20,000 bodies, float32: the public energy and forces against the pure-JAX kernel, the
gradient of the energy against minus the forces, and whether the compiled program holds
the Pallas custom call. Writes ``$OUT/check.json`` (default: the current folder).
"""

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp

import simlib.particles as sp
from simlib.particles import _energy
from simlib.particles._gravity_pallas import symmetric_fits, vmem_capacity


def main() -> None:
    n = 20_000
    x = jax.random.normal(jax.random.key(3), (n, 3), jnp.float32)
    m = jax.random.uniform(jax.random.key(4), (n,), jnp.float32) / n
    p = dict(G=jnp.float32(1.0), softening=jnp.float32(0.01), masses=m)
    e = sp.pair_energy(sp.gravity, sp.free())
    u, f = jax.jit(e.energy_and_forces)(x, p)
    constants = jnp.stack([1.0, 0.01]).astype(jnp.float32)
    u0, f0 = jax.jit(lambda x: _energy._gravity_direct(e, x, m, constants))(x)
    g = jax.jit(jax.grad(lambda x: e(x, p)))(x)
    scale = jnp.max(jnp.abs(f0))
    out = dict(backend=jax.default_backend(), energy_rel=float(abs(u - u0) / abs(u0)),
               force_rel=float(jnp.max(jnp.abs(f - f0)) / scale),
               grad_vs_minus_force=float(jnp.max(jnp.abs(g + f0)) / scale),
               symmetric_kernel=symmetric_fits(n, 4, vmem_capacity()),
               vmem_capacity=vmem_capacity(),
               hlo_has_pallas="tpu_custom_call" in
               jax.jit(e.energy_and_forces).lower(x, p).compile().as_text())
    print(out)
    Path(os.environ.get("OUT", "."), "check.json").write_text(json.dumps(out))


if __name__ == "__main__":
    main()
