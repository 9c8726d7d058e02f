"""``simulate`` on the accelerator path, the state kept in the Pallas kernel's cell layout,
against the same run through the pure-JAX cell pass and against simlib on 2 CPU cores.

    python benchmarks/ljcells_simulate.py [--cells 40 63] [--steps 100] [--skin 0.42]
                                          [--json results.json]

Per size: a float32 Lennard-Jones liquid (``ljcells_variants.lj_liquid``: ``4 cells^3``
atoms, density 0.8442, melted by 100 NVE steps at T = 1.44), cells with ``--skin`` and
capacity 40, then ``simulate`` NVE (``dt`` 0.005, ``--steps`` steps, the start and the end
saved) with ``kernel="pallas"`` (the layout path, ``simlib/particles/_layout.py``) and with
``kernel="jax"`` (the pure-JAX cell pass, a gather per step). Best of 3 after a warm-up
call, compile time (first call less best) apart. Rows: atom-steps per second, the cells'
builds, the largest difference between the two end states (float32 round-off) and the
ratio to simlib on the 2-core CPU at 256,000 atoms (benchmarks/results/particles_lj.json).
The default skin 0.42 is what fills the 23 cells a side of the 256,000-atom box (width
2.92 = r_cut + 0.42): rebuilt less often than at 0.3, for the same pair slots.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of  # noqa: E402
from ljcells_variants import lj_liquid  # noqa: E402

import simlib.particles as sp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_rate(n: int) -> float | None:
    """simlib's atom-steps per second on the 2-core CPU at ``n`` atoms (particles_lj.json)."""
    rows = json.loads((RESULTS / "particles_lj.json").read_text())["parts"]["lj"]["rows"]
    return next((r["simlib"]["rate"] for r in rows if r["n"] == n), None)


def one_size(cells: int, steps: int, skin: float) -> dict:
    x, box, space, energy, params = lj_liquid(cells, 0.1, 100, skin=0.3)
    n = x.shape[0]
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(5), n=n), jnp.float32)
    v = v - v.mean(0)
    out = dict(n=n, steps=steps, skin=skin, rows={})
    if jax.default_backend() == "tpu":   # else the layout path runs in interpret mode
        from simlib.particles import _cells_pallas, _gravity_pallas
        grid = sp.cell_list(space, x, r_cut=2.5, skin=skin, capacity=40).grid
        out["kernel_fits_vmem"] = _cells_pallas.fits(grid, 40, _gravity_pallas.vmem_capacity())
    ends = {}
    for kernel in ("pallas", "jax"):
        cl = sp.cell_list(space, x, r_cut=2.5, skin=skin, capacity=40, kernel=kernel)

        def run(cl=cl):
            return sp.simulate(energy, sp.State(x, v, 1.0), params, space=space, dt=0.005,
                               n_steps=steps, save_every=steps, neighbors=cl)

        timing = best_of(run, repeats=3, slow_s=float("inf"))
        traj = timing.out
        e = np.asarray(traj.total_energy, np.float64)
        ends[kernel] = np.asarray(traj.positions[-1])
        out["rows"][kernel] = dict(
            seconds=timing.best, compile_s=timing.warmup - timing.best,
            atom_steps_per_s=n * steps / timing.best, builds=int(traj.stats["n_builds"]),
            reallocations=int(traj.stats["n_reallocations"]), result=int(traj.result),
            grid=cl.grid, capacity=cl.capacity,
            energy_change_per_atom=float(abs(e[-1] - e[0]) / n))
        print(cells, kernel, out["rows"][kernel], flush=True)
    d = np.mod(ends["pallas"] - ends["jax"] + 0.5 * box, box) - 0.5 * box
    out["max_position_diff"] = float(np.max(np.abs(d)))
    cpu = cpu_rate(n)
    if cpu:
        out["cpu_atom_steps_per_s"] = cpu
        out["pallas_over_cpu"] = out["rows"]["pallas"]["atom_steps_per_s"] / cpu
    out["pallas_over_jax"] = out["rows"]["jax"]["seconds"] / out["rows"]["pallas"]["seconds"]
    print(cells, {k: out[k] for k in out if k != "rows"}, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, nargs="+", default=[40])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skin", type=float, default=0.42)
    ap.add_argument("--json")
    a = ap.parse_args()
    res = dict(backend=jax.default_backend(), device=str(jax.devices()[0]), sizes=[])
    for cells in a.cells:
        try:
            res["sizes"].append(one_size(cells, a.steps, a.skin))
        except Exception as err:  # noqa: BLE001 - a size that fails (memory) is reported
            res["sizes"].append(dict(cells=cells, error=repr(err)[:500]))
            print(cells, "failed:", repr(err)[:500], flush=True)
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
