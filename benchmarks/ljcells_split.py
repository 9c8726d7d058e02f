"""Where a cell-list NVE step's time goes on an accelerator: force pass, cell build, step.

    python benchmarks/ljcells_split.py --cells 40 63 --json out.json

LJ float32, r_cut 2.5, density 0.8442, from the fcc lattice melted by ``--melt`` NVE steps
at T 1.44; cells ``cell_list(capacity=40, skin=0.3, shell="half")`` (what ``pair_search``
builds on accelerators). Rows: one ``energy_and_forces`` over the cells, one build (the
sort by cell), and ``simulate`` for ``--steps`` NVE steps with its number of builds. Warm-up
first, best of ``--repeats``, compile time apart. ``--block-elements`` times the force pass
at each chunk size of the cell pass (``_cells.BLOCK_ELEMENTS``: pair slots per chunk).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles import _cells  # noqa: E402


def split(n_cells: int, melt: int, steps: int, repeats: int, block_elements=()) -> dict:
    pos, box = sp.lattice(n_cells, 0.8442)
    n = pos.shape[0]
    x = jnp.asarray(np.mod(np.asarray(pos), box), jnp.float32)
    space = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))

    def cells(x):
        return sp.cell_list(space, x, r_cut=2.5, capacity=40, skin=0.3, shell="half",
                            kernel="jax")          # the pure-JAX pass, on a TPU too

    def run(x, v, c, n_steps):
        return sp.simulate(energy, sp.State(x, v - v.mean(0), 1.0), params, space=space,
                           dt=0.005, n_steps=n_steps, save_every=n_steps, neighbors=c)

    t0 = time.perf_counter()
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(2), n=n), jnp.float32)
    if melt:
        x = jnp.asarray(np.mod(np.asarray(run(x, v, cells(x), melt).positions[-1]), box),
                        jnp.float32)
    melt_s = time.perf_counter() - t0
    c = cells(x)
    v = jnp.asarray(sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(3), n=n), jnp.float32)
    force = jax.jit(energy.energy_and_forces)
    build = jax.jit(lambda c, x: c.build(x).slot_atom)
    out = dict(n=n, grid=list(c.grid), capacity=c.capacity, melt_steps=melt, melt_s=melt_s,
               block_elements=_cells.BLOCK_ELEMENTS)
    default = _cells.BLOCK_ELEMENTS
    for b in block_elements:
        _cells.BLOCK_ELEMENTS = b
        pass_b = jax.jit(lambda x, params, c: energy.energy_and_forces(x, params, c))  # a new
        t = best_of(lambda f=pass_b: f(x, params, c), repeats=repeats)     # trace per size
        chunks = -(-c.capacity ** 2 * c.n_cells // b)
        out[f"force pass, {chunks} chunks"] = dict(best_s=t.best, first_s=t.warmup,
                                                   block_elements=b)
        print(f"{n:>9,} force pass, {chunks:3d} chunks {1e3 * t.best:9.2f} ms", flush=True)
    _cells.BLOCK_ELEMENTS = default
    for name, fn in (("force pass", lambda: force(x, params, c)),
                     ("build (sort)", lambda: build(c, x)),
                     (f"simulate {steps} steps", lambda: run(x, v, c, steps))):
        t = best_of(fn, repeats=repeats)
        out[name] = dict(best_s=t.best, first_s=t.warmup)
        print(f"{n:>9,} {name:22s} {1e3 * t.best:9.2f} ms  first {t.warmup:6.2f} s", flush=True)
    traj = t.out
    out["n_builds"] = int(traj.stats["n_builds"])
    out["atom_steps_per_s"] = n * steps / out[f"simulate {steps} steps"]["best_s"]
    per_step = out[f"simulate {steps} steps"]["best_s"] / steps
    out["per_step_ms"] = 1e3 * per_step
    print(f"  builds {out['n_builds']} in {steps} steps; {1e3 * per_step:.1f} ms/step; "
          f"{out['atom_steps_per_s'] / 1e6:.2f} M atom-steps/s", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[40])
    ap.add_argument("--melt", type=int, default=100)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-elements", type=int, nargs="*", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [split(k, a.melt, a.steps, a.repeats, a.block_elements) for k in a.cells]
    if a.json:
        Path(a.json).write_text(json.dumps(dict(backend=jax.default_backend(), rows=rows),
                                           indent=1))


if __name__ == "__main__":
    main()
