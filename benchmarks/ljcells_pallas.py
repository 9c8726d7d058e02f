"""The Pallas Lennard-Jones cell kernel against the pure-JAX cell pass, on one device.

    python benchmarks/ljcells_pallas.py --cells 40 --melt 100 --simulate 100 --json out.json

Float32 LJ (r_c 2.5, density 0.8442) at ``4 cells^3`` atoms, from an fcc lattice displaced
by 0.1 sigma and melted by ``--melt`` NVE steps at T = 1.44 (a liquid's cell occupancy).
Rows, each best of ``--repeats`` after a warm-up (compile time apart):

* one force evaluation (``energy_and_forces``) by the pure-JAX pass (``kernel="jax"``,
  half shell) and by the Pallas kernel (half and full shell) at each ``--capacities``, with
  the
  largest force difference from the pure-JAX pass relative to the largest force;
* the kernel's input layout alone, in its two parts: the slots' particles into lanes and
  their coordinates gathered;
* ``simulate``: NVE, ``--simulate`` steps, for each ``--configs KERNEL:CAPACITY:SKIN[:SHELL]``
  (``cell_list(kernel=, capacity=, skin=, shell=)``; CAPACITY ``auto`` is 1.25x the fullest
  cell; SHELL ``half`` by default).
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
from ljcells_variants import lj_liquid  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles._cells_pallas import lane_atoms, lane_positions  # noqa: E402

ATOMS = jax.jit(lane_atoms, static_argnums=(1, 2, 3))
COORDS = jax.jit(lane_positions, static_argnums=(2,))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=40)
    ap.add_argument("--melt", type=int, default=100)
    ap.add_argument("--capacities", type=int, nargs="*", default=[])
    ap.add_argument("--simulate", type=int, default=100)
    ap.add_argument("--configs", nargs="*", default=["jax:auto:0.3", "pallas:auto:0.3"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", action=argparse.BooleanOptionalAction, default=True,
                    help="the single-evaluation rows (--no-passes: simulate rows only)")
    ap.add_argument("--json")
    a = ap.parse_args()
    started = time.perf_counter()
    x, box, space, energy, params = lj_liquid(a.cells, 0.1, a.melt, skin=0.3)
    n = x.shape[0]
    meta = dict(n=n, backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
                jax=jax.__version__, melt_s=time.perf_counter() - started)
    print(meta, flush=True)
    ref_cells = sp.cell_list(space, x, r_cut=2.5, kernel="jax")
    lib = jax.jit(energy.energy_and_forces)
    e_ref, f_ref = lib(x, params, ref_cells)
    f_ref = np.asarray(f_ref, np.float64)
    rows = []

    def row(name, fn, extra=None):
        try:
            t = best_of(fn, repeats=a.repeats)
        except Exception as err:  # out of VMEM or memory on the chip is a result
            rows.append(dict(name=name, error=f"{type(err).__name__}: {str(err)[:300]}"))
            print(json.dumps(rows[-1]), flush=True)
            return
        r = dict(name=name, best_s=t.best, compile_s=t.warmup - t.best, **(extra or {}))
        out = t.out
        if isinstance(out, tuple) and len(out) == 2 and np.shape(out[1]) == f_ref.shape:
            f = np.asarray(out[1], np.float64)
            r["max_rel_force_diff"] = float(np.max(np.abs(f - f_ref)) / np.max(np.abs(f_ref)))
            r["energy_rel_diff"] = float(abs(float(out[0]) - float(e_ref)) / abs(float(e_ref)))
        rows.append(r)
        print(json.dumps(r), flush=True)

    if a.passes:
        row(f"pure-JAX pass, half shell, capacity {ref_cells.capacity}",
            lambda: lib(x, params, ref_cells), dict(capacity=ref_cells.capacity))
    caps = a.capacities or [sp.cell_list(space, x, r_cut=2.5, capacity_multiplier=1.25).capacity]
    for cap in caps if a.passes else []:
        for shell in ("half", "full"):
            c = sp.cell_list(space, x, r_cut=2.5, capacity=cap, kernel="pallas", shell=shell)
            row(f"Pallas kernel, {shell} shell, capacity {cap}", lambda c=c: lib(x, params, c),
                dict(capacity=cap, fullest=int(c.max_cell_occupancy), grid=c.grid))
        row(f"layout: slots into lanes (lane_atoms), capacity {cap}",
            lambda c=c: ATOMS(c.slot_atom, c.grid, c.capacity, n), dict(capacity=cap))
        lanes = ATOMS(c.slot_atom, c.grid, c.capacity, n)
        row(f"layout: positions into lanes (lane_positions), capacity {cap}",
            lambda c=c, lanes=lanes: COORDS(x, lanes, c.grid, c.space.box_vector(3, x.dtype)),
            dict(capacity=cap))
    if a.simulate:
        v = jnp.asarray(sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(3), n=n),
                        jnp.float32)
        state = sp.State(x, v - v.mean(0), 1.0)
        for config in a.configs:
            kernel, cap, skin, *shell = config.split(":")
            c = sp.cell_list(space, x, r_cut=2.5, skin=float(skin), kernel=kernel,
                             shell=shell[0] if shell else "half",
                             capacity=None if cap == "auto" else int(cap),
                             capacity_multiplier=1.25)

            def run(c=c):
                tr = sp.simulate(energy, state, params, space=space, dt=0.005,
                                 n_steps=a.simulate, save_every=a.simulate, neighbors=c)
                return tr.positions

            name = f"simulate {a.simulate} NVE steps ({config})"
            row(name, run, dict(capacity=c.capacity, grid=c.grid))
            if "best_s" in rows[-1]:
                rows[-1]["atom_steps_per_s"] = n * a.simulate / rows[-1]["best_s"]
                print(f"  {n * a.simulate / rows[-1]['best_s'] / 1e6:.2f} M atom-steps/s",
                      flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
