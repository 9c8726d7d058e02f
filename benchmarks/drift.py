"""Energy drift of a long NVE run in float32, on whatever backend runs it.

    python benchmarks/drift.py --cells 10 --steps 10000 --methods list cells --json out.json

Lennard-Jones fluid (density 0.8442, T 1.44, r_cut 2.5, dt 0.005) from a lattice, velocity
Verlet, float32. For each pair search (neighbour list, cell-dense) it records the total
energy every ``--every`` steps and reports the largest change per atom from the start
and the slope of a least-squares line through E(t) per atom per 1,000 steps. Run it on
the CPU and on an accelerator and compare: the issue's target is the chip within 2x of
the CPU run's drift. ``pallas``: cells summed by the Pallas kernel (``kernel="pallas"``), which
in ``simulate`` keeps the state in the kernel's cell layout (a TPU path; interpret mode,
slow, elsewhere).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from _timing import Timer  # benchmarks/_timing.py, next to this file

import simlib.particles as sp


def run(cells: int, steps: int, every: int, method: str) -> dict:
    pos, box = sp.lattice(cells, 0.8442)
    pos = jnp.asarray(pos, jnp.float32)
    n = pos.shape[0]
    space = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(2), n=n), jnp.float32)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    if method == "pallas":     # the cells summed by the Pallas kernel, the state kept in
        search = sp.cell_list(space, pos, 2.5, skin=0.3, capacity_multiplier=1.25,  # its layout
                              kernel="pallas")
    else:
        search = sp.pair_search(space, pos, 2.5, 0.3, method=method)
        if method == "cells":      # the pure-JAX cell pass (on a TPU "auto" keeps the layout)
            search = search.replace(kernel="jax")
    with Timer() as clock:
        traj = sp.simulate(energy, sp.State(pos, v, 1.0), params, space=space, dt=0.005,
                           n_steps=steps, save_every=every, neighbors=search)
        e = np.asarray(traj.total_energy, np.float64) / n
    seconds = clock.wall
    k = np.arange(len(e)) * every / 1000.0
    slope = float(np.polyfit(k, e, 1)[0])
    return dict(backend=jax.default_backend(), method=method, atoms=n, steps=steps,
                dtype="float32", e0_per_atom=float(e[0]),
                max_change_per_atom=float(np.max(np.abs(e - e[0]))),
                slope_per_atom_per_1000_steps=slope, seconds_with_compile=seconds,
                finite=bool(np.all(np.isfinite(e))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=10, help="lattice cells per side (4 n^3 atoms)")
    ap.add_argument("--steps", type=int, default=10_000)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--methods", nargs="+", default=["list", "cells"],
                    choices=["list", "cells", "pallas"])
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    for method in a.methods:
        r = run(a.cells, a.steps, a.every, method)
        rows.append(r)
        print(f"{r['backend']:>4} {method:<6} {r['atoms']:,} atoms x {r['steps']:,} steps: "
              f"max |E - E0| {r['max_change_per_atom']:.2e} per atom, slope "
              f"{r['slope_per_atom_per_1000_steps']:+.2e} per atom per 1000 steps "
              f"({r['seconds_with_compile']:.1f} s with compilation)", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(rows=rows), indent=1))


if __name__ == "__main__":
    main()
