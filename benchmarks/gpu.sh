#!/usr/bin/env bash
# GPU benchmarks in one script (at most 8 minutes): simlib against diffrax and jax-md on
# the same device, at GPU sizes, writing a results table under $OUT.
#
#   benchmarks/gpu.sh            # GPU sizes: 10^6 Lorenz members, 10^5 gravity bodies,
#                                # ~10^6 LJ atoms, gradients through 10^5 steps
#   benchmarks/gpu.sh --small    # CPU-sized (10^4, 4,096, 2,048, 10^3): checks it runs
#   benchmarks/gpu.sh --x32      # the ODE and gradient sections in float32 (rtol 1e-5,
#                                # atol 1e-7) instead of float64: for TPUs, which have no
#                                # float64 units (XLA emulates it there, slowly)
#   benchmarks/gpu.sh --only lj,gradients --lj-cells 32   # some sections; LJ of 4*32^3 atoms
#   benchmarks/gpu.sh --only ljcells --lj-cells 40        # LJ by the cell-dense path only
#   benchmarks/gpu.sh --only gravitybig,drift             # 10^6 bodies; a 10^4-step NVE drift
#   OUT=/tmp/gpu benchmarks/gpu.sh
#
# Sections run in order, each on its own; one that fails (a missing peer, memory) is
# reported as such and the others still run. The table ($OUT/gpu_results.md, and
# gpu_results.json) is rewritten after every section, so a run cut short by the time
# limit keeps what it measured. Timings: best of 3 after a warm-up call; compile time
# (first call minus best) separately. Peers: diffrax (pip install diffrax) and jax-md
# (pip install jax-md); absent ones are skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
small=0
x32=0
only=ode,gravity,lj,gradients
lj_cells=0
usage="usage: benchmarks/gpu.sh [--small] [--x32] [--only SECTION,...] [--lj-cells N]"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --small) small=1 ;;
        --x32) x32=1 ;;
        --only) only=${2:?$usage}; shift ;;
        --lj-cells) lj_cells=${2:?$usage}; shift ;;
        *) echo "$usage" >&2; exit 2 ;;
    esac
    shift
done
for s in ${only//,/ }; do
    case "$s" in ode|gravity|gravitybig|lj|ljcells|drift|gradients) ;; *) echo "gpu.sh: unknown section $s; $usage" >&2; exit 2 ;; esac
done
[[ "$lj_cells" =~ ^[0-9]+$ ]] || { echo "gpu.sh: --lj-cells must be a whole number; $usage" >&2; exit 2; }
OUT=${OUT:-benchmarks/results/gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu.sh: small=$small, x32=$x32, results in $OUT"
exec timeout --signal=INT 470 python - "$small" "$OUT" "$x32" "$only" "$lj_cells" <<'PYTHON'
import json
import math
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, "benchmarks")
import jax
from _timing import Timer, best_of
from _timing import timed as timed_once

X32 = sys.argv[3] == "1"
ONLY = sys.argv[4].split(",")
jax.config.update("jax_enable_x64", not X32)
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import particles as sp

SMALL = sys.argv[1] == "1"
OUT = Path(sys.argv[2])
SIZES = dict(members=10_000 if SMALL else 1_000_000, bodies=4_096 if SMALL else 100_000,
             lj_cells=int(sys.argv[5]) or (8 if SMALL else 63), lj_steps=100, grad_steps=1_000 if SMALL else 100_000)
rows, meta = [], dict(backend=jax.default_backend(), devices=[str(d) for d in jax.devices()],
                      jax=jax.__version__, small=SMALL, sizes=SIZES,
                      ode_dtype="float32" if X32 else "float64",
                      date=time.strftime("%Y-%m-%d %H:%M:%S"))
CLOCK = Timer().start()


def timed(fn, repeats=3):
    """(output, best of ``repeats`` after a warm-up, the warm-up's time less the best)."""
    t = best_of(fn, repeats, slow_s=math.inf)
    return t.out, t.best, t.warmup - t.best


def add(section, name, size, best, compile_s, rate, unit, note=""):
    rows.append(dict(section=section, name=name, size=size, best_s=best, compile_s=compile_s,
                     rate=rate, unit=unit, note=note))
    write()


def write():
    lines = [f"# simlib accelerator benchmarks ({meta['backend']}, {meta['devices'][0]}, "
             f"jax {meta['jax']}, {'--small' if SMALL else 'GPU sizes'}, ODE and gradients "
             f"in {meta['ode_dtype']}, {meta['date']})", "",
             "| section | contender | size | best | compile | throughput | note |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        best = "-" if r["best_s"] is None else f"{r['best_s']:.4g} s"
        comp = "-" if r["compile_s"] is None else f"{r['compile_s']:.3g} s"
        rate = "-" if r["rate"] is None else f"{r['rate']:.4g} {r['unit']}"
        lines.append(f"| {r['section']} | {r['name']} | {r['size']} | {best} | {comp} "
                     f"| {rate} | {r['note']} |")
    lines.append(f"\nwall time so far {CLOCK.elapsed:.0f} s")
    (OUT / "gpu_results.md").write_text("\n".join(lines) + "\n")
    (OUT / "gpu_results.json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


def section(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - reported in the table, the rest runs
        traceback.print_exc()
        add(fn.__name__, "FAILED", "-", None, None, None, "",
            f"{type(err).__name__}: {str(err)[:120]}")


def lorenz(t, y, a):
    s, r, b = a
    return jnp.stack([s * (y[..., 1] - y[..., 0]), y[..., 0] * (r - y[..., 2]) - y[..., 1],
                      y[..., 0] * y[..., 1] - b * y[..., 2]], axis=-1)


ARGS = (10.0, 28.0, 8.0 / 3.0)
RTOL, ATOL = (1e-5, 1e-7) if X32 else (1e-6, 1e-9)


def ode():
    """Lorenz ensemble, Tsit5, rtol 1e-6, atol 1e-9 (float64; 1e-5, 1e-7 with --x32), t in
    [0, 1], t1 saved."""
    n = SIZES["members"]
    y0 = 1.0 + 0.1 * jax.random.normal(jax.random.key(0), (n, 3))
    run = jax.jit(jax.vmap(lambda y: sl.solve(lorenz, y, 0.0, 1.0, solver=sl.Tsit5(),
                                                 rtol=RTOL, atol=ATOL, args=ARGS).ys[-1]))
    ours, best, comp = timed(lambda: run(y0))
    add("ode", "simlib jit(vmap(solve))", f"{n:,} members", best, comp, n / best, "members/s")
    try:
        import diffrax
    except ImportError:
        add("ode", "diffrax", f"{n:,} members", None, None, None, "", "not installed")
        return
    term = diffrax.ODETerm(lambda t, y, a: lorenz(t, y, a))
    ctrl = diffrax.PIDController(rtol=RTOL, atol=ATOL, pcoeff=0.4, icoeff=0.3)

    def one(y):
        return diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, 1.0, None, y, args=ARGS,
                                   stepsize_controller=ctrl, max_steps=4096).ys[-1]

    drun = jax.jit(jax.vmap(one))
    theirs, best, comp = timed(lambda: drun(y0))
    diff = float(jnp.max(jnp.abs(theirs - ours)))
    add("ode", "diffrax jit(vmap(diffeqsolve))", f"{n:,} members", best, comp, n / best,
        "members/s", f"max |diffrax - simlib| {diff:.1e}")


def gravity(n=None, section="gravity"):
    """Direct-sum gravity, float32, one force evaluation, against a plain jnp sum (on a
    TPU simlib runs its Pallas kernel)."""
    n = SIZES["bodies"] if n is None else n
    x = jax.random.normal(jax.random.key(1), (n, 3), jnp.float32)
    params = dict(G=jnp.float32(1.0), softening=jnp.float32(0.01),
                  masses=jnp.full((n,), 1.0 / n, jnp.float32))
    energy = sp.pair_energy(sp.gravity, sp.free())
    ef = jax.jit(energy.energy_and_forces)
    (_, f), best, comp = timed(lambda: ef(x, params))
    add(section, "simlib pair_energy(gravity)", f"{n:,} bodies", best, comp,
        n * n / best / 1e9, "G pairs/s")

    from gravity_tiles import plain  # the same sum written directly, in row blocks

    plain = jax.jit(plain)
    ref, best, comp = timed(lambda: plain(x, params["masses"], params["softening"]))
    rel = float(jnp.max(jnp.abs(ref - f)) / jnp.max(jnp.abs(ref)))
    add(section, "plain jnp all-pairs (peer)", f"{n:,} bodies", best, comp,
        n * n / best / 1e9, "G pairs/s", f"max rel force diff {rel:.1e}")


def lj():
    """LJ fluid, float32, NVE with a neighbour list, rho 0.8442, T 1.44, dt 0.005."""
    cells, steps = SIZES["lj_cells"], SIZES["lj_steps"]
    pos, box = sp.lattice(cells, 0.8442)
    pos = jnp.asarray(pos, jnp.float32)
    n = pos.shape[0]
    space = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    nbrs, secs = timed_once(lambda: sp.neighbor_list(space, pos, r_cut=2.5, skin=0.3))
    add("lj", "simlib neighbor_list (allocate and build)", f"{n:,} atoms", None, None, None, "",
        f"{secs:.3g} s with compilation, capacity {nbrs.capacity}")
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(2), n=n), jnp.float32)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    forces = jax.jit(energy.energy_and_forces)
    _, best, comp = timed(lambda: forces(pos, params, nbrs))
    add("lj", "simlib one force evaluation (list given)", f"{n:,} atoms", best, comp, n / best,
        "atoms/s")

    def run():
        return sp.simulate(energy, sp.State(pos, v, 1.0), params, space=space, dt=0.005,
                           n_steps=steps, save_every=steps, neighbors=nbrs).positions

    _, best, comp = timed(run)
    add("lj", "simlib simulate (neighbour list)", f"{n:,} atoms x {steps} steps", best, comp,
        n * steps / best, "atom-steps/s")
    try:
        sys.path.insert(0, "benchmarks")
        from _particle_peers import available, jaxmd_lj
        if not available("jax_md"):
            raise ImportError
    except ImportError:
        add("lj", "jax-md", f"{n:,} atoms", None, None, None, "", "not installed")
        return
    r = jaxmd_lj(cells, steps, dtype="float32", repeats=3, chunk=steps, warmup=steps)
    add("lj", "jax-md (OrderedSparse list)", f"{r['n']:,} atoms x {steps} steps", r["seconds"],
        None, r["rate"], "atom-steps/s")


def ljcells():
    """LJ fluid as in lj(), by the cell-dense path (pair_search's cells): the accelerator
    path."""
    cells, steps = SIZES["lj_cells"], SIZES["lj_steps"]
    pos, box = sp.lattice(cells, 0.8442)
    pos = jnp.asarray(pos, jnp.float32)
    n = pos.shape[0]
    space = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    # what simulate(neighbors="auto") builds on an accelerator: cells with a skin of 0.3
    cl, alloc = timed_once(lambda: sp.pair_search(space, pos, 2.5, method="cells"))
    build = jax.jit(lambda c, x: c.build(x))
    _, best, comp = timed(lambda: build(cl, pos))
    wasted = 1.0 - (4 / 3 * np.pi * 2.5**3 * 0.8442 * n / 2) / cl.pair_slots()
    add("ljcells", "simlib cell_list build (sort)", f"{n:,} atoms", best, comp, n / best,
        "atoms/s", f"allocate {alloc:.3g} s, grid {cl.grid}, capacity {cl.capacity}, "
        f"{cl.pair_slots() / n:.0f} pair slots per atom ({100 * wasted:.0f}% wasted)")
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(2), n=n), jnp.float32)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    forces = jax.jit(energy.energy_and_forces)
    for kernel, name in (("auto", "simlib one force evaluation (cells given, pure-JAX pass)"),
                         ("pallas", "simlib one force evaluation (cells given, Pallas kernel)")):
        _, best, comp = timed(lambda: forces(pos, params, cl.replace(kernel=kernel)))
        add("ljcells", name, f"{n:,} atoms", best, comp, n / best, "atoms/s")

    def run(cl):
        return sp.simulate(energy, sp.State(pos, v, 1.0), params, space=space, dt=0.005,
                           n_steps=steps, save_every=steps, neighbors=cl)

    # kernel="auto": on a TPU simulate keeps the state in the Pallas kernel's layout; then
    # the same cells through the pure-JAX pass (kernel="jax")
    for kernel, name in (("auto", "simlib simulate (cell-dense, auto: Pallas layout on a TPU)"),
                         ("jax", "simlib simulate (cell-dense, pure-JAX pass)")):
        traj, best, comp = timed(lambda: run(cl.replace(kernel=kernel)))
        e = np.asarray(traj.total_energy, np.float64)
        note = f"energy change {abs(e[-1] - e[0]) / n:.2e} per atom over the run"
        add("ljcells", name, f"{n:,} atoms x {steps} steps", best, comp, n * steps / best,
            "atom-steps/s", note)


def gradients():
    """d(final state)/d(params) through a fixed-step Tsit5 Lorenz run of many steps."""
    steps = SIZES["grad_steps"]
    dt = 1e-4
    y0 = jnp.array([1.0, 1.0, 1.0])
    p = jnp.array(ARGS)

    def loss(p):
        sol = sl.solve(lambda t, y, a: lorenz(t, y, (a[0], a[1], a[2])), y0, 0.0, steps * dt,
                       solver=sl.Tsit5(), dt=dt, args=p)
        return jnp.sum(sol.ys[-1] ** 2)

    grad = jax.jit(jax.grad(loss))
    g, best, comp = timed(lambda: grad(p))
    add("gradients", "simlib grad (default adjoint)", f"{steps:,} Tsit5 steps", best,
        comp, steps / best, "steps/s")
    try:
        import diffrax
    except ImportError:
        add("gradients", "diffrax", f"{steps:,} steps", None, None, None, "", "not installed")
        return
    term = diffrax.ODETerm(lambda t, y, a: lorenz(t, y, (a[0], a[1], a[2])))

    def dloss(p):
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), 0.0, steps * dt, dt, y0, args=p,
                                  max_steps=steps + 1,
                                  adjoint=diffrax.RecursiveCheckpointAdjoint())
        return jnp.sum(sol.ys[-1] ** 2)

    dgrad = jax.jit(jax.grad(dloss))
    h, best, comp = timed(lambda: dgrad(p))
    rel = float(jnp.max(jnp.abs(g - h)) / jnp.max(jnp.abs(h)))
    add("gradients", "diffrax grad (RecursiveCheckpointAdjoint)", f"{steps:,} Tsit5 steps",
        best, comp, steps / best, "steps/s", f"max rel gradient diff {rel:.1e}")


def gravitybig():
    """Direct-sum gravity at 10^6 bodies (10^4 with --small): the Pallas kernel's size."""
    gravity(10_000 if SMALL else 1_000_000, "gravitybig")


def drift():
    """Energy drift of a 10^4-step float32 LJ NVE run (4,000 atoms; 864 atoms and 200
    steps with --small), by the cell-dense path: compare with benchmarks/drift.py on the
    CPU."""
    from drift import run as drift_run

    steps = 200 if SMALL else 10_000
    r = drift_run(6 if SMALL else 10, steps, 100, "cells")
    add("drift", "simlib simulate NVE (cell-dense), float32", f"{r['atoms']:,} atoms x "
        f"{steps:,} steps", None, None, None, "",
        f"slope {r['slope_per_atom_per_1000_steps']:+.2e} per atom per 1,000 steps, "
        f"max change of E {r['max_change_per_atom']:.2e} per atom")


for fn in (ode, gravity, gravitybig, lj, ljcells, drift, gradients):
    if fn.__name__ not in ONLY:
        continue
    print(f"-- {fn.__name__}", flush=True)
    section(fn)
write()
print((OUT / "gpu_results.md").read_text())
PYTHON
