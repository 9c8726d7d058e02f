"""SPC/E water MD steps per second: simlib against OpenMM's CPU platform, one run.

    python benchmarks/water_speed.py --molecules 1000 8000 --steps 200 --json out.json

The same box for both: ``sp.spce_water(w)`` (a lattice at 0.997 g/cm^3), rigid SPC/E
(SETTLE in both), the oxygen Lennard-Jones plainly truncated and smooth PME at the same
cutoff (0.9 nm), Ewald alpha, grid and order 5 (simlib's, chosen from ``--tolerance``, handed
to OpenMM), NVE with a 2 fs step from 300 K velocities, float32 (OpenMM's CPU platform
computes in single precision). simlib keeps a neighbour list (skin 0.1 nm) and runs
``simulate`` with ``Settle``; OpenMM runs ``VerletIntegrator.step`` with ``Threads`` set to
the machine's core count (``--threads``). Each contender is warmed up first (simlib's
compilation is reported apart), then timed ``--repeats`` times, round-robin; the best is
kept. Sizes: 1,000 and 8,000 molecules are the issue's ~3,000 and ~24,000 atoms.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import fmt_load, load_average, round_robin, timed  # noqa: E402

import simlib  # noqa: E402
import simlib.particles as sp  # noqa: E402

KB = 0.00831446261815324  # kJ/mol/K


def simlib_runner(water, r_cut, tolerance, steps, dt, temperature):
    """``run()`` for ``steps`` NVE SETTLE steps, its compile time, and the PME settings."""
    space = sp.periodic(water.box)
    energy = sp.spce_energy(water, r_cut, tolerance=tolerance)
    pme = energy.terms[1]
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh)
    v = sp.maxwell_boltzmann(water.masses, KB * temperature, key=jax.random.key(1))
    v = settle.constrain_velocities(water.positions, v, water.masses, space)
    nbrs = sp.neighbor_list(space, water.positions, r_cut=r_cut, skin=0.1)
    state = sp.State(water.positions, v, water.masses)

    def run():
        return sp.simulate(energy, state, water.params, space=space, dt=dt, n_steps=steps,
                           save_every=steps, neighbors=nbrs, integrator=settle).positions

    _, first = timed(run)
    return run, first, (float(pme.alpha), tuple(int(g) for g in pme.grid), int(pme.order))


def openmm_runner(water, r_cut, pme_settings, steps, dt, temperature, threads):
    """``run()`` for ``steps`` OpenMM Verlet steps on the CPU platform (SETTLE, PME)."""
    import openmm as mm

    alpha, grid, order = pme_settings
    system = mm.System()
    force = mm.NonbondedForce()
    for m, q, s, e in zip(*(np.asarray(a, float) for a in (water.masses, water.charges,
                                                           water.sigma, water.epsilon)),
                          strict=True):
        system.addParticle(m)
        force.addParticle(q, s if e > 0 else 1.0, e)
    for i, j in np.asarray(water.exclusions):
        force.addException(int(i), int(j), 0.0, 1.0, 0.0)
    for o, h1, h2 in np.asarray(water.molecules):
        system.addConstraint(int(o), int(h1), water.d_oh)
        system.addConstraint(int(o), int(h2), water.d_oh)
        system.addConstraint(int(h1), int(h2), water.d_hh)
    box = float(water.box)
    system.setDefaultPeriodicBoxVectors(mm.Vec3(box, 0, 0), mm.Vec3(0, box, 0),
                                        mm.Vec3(0, 0, box))
    force.setNonbondedMethod(mm.NonbondedForce.PME)
    force.setCutoffDistance(r_cut)
    force.setPMEParameters(alpha, *grid)
    force.setUseDispersionCorrection(False)
    force.setUseSwitchingFunction(False)
    system.addForce(force)
    if order != 5:
        raise ValueError("OpenMM's PME uses order 5")
    platform = mm.Platform.getPlatformByName("CPU")
    integrator = mm.VerletIntegrator(dt)
    context = mm.Context(system, integrator, platform, {"Threads": str(threads)})
    context.setPositions([mm.Vec3(*map(float, r)) for r in np.asarray(water.positions)])
    context.setVelocitiesToTemperature(temperature, 1)
    context.applyVelocityConstraints(1e-6)

    def run():
        integrator.step(steps)
        return context.getState(getEnergy=True).getPotentialEnergy()

    run()                                  # warm-up (neighbour grids, FFT plans)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--molecules", type=int, nargs="+", default=[1000, 8000])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--r-cut", type=float, default=0.9)
    ap.add_argument("--tolerance", type=float, default=5e-4)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default="benchmarks/results/water_speed.json")
    a = ap.parse_args()
    dt, temperature = 0.002, 300.0
    start_load = load_average()
    rows = []
    for w in a.molecules:
        water = sp.spce_water(w)
        n = water.positions.shape[0]
        run_simlib, first, settings = simlib_runner(water, a.r_cut, a.tolerance, a.steps, dt,
                                                    temperature)
        calls = {"simlib": run_simlib}
        try:
            calls["openmm"] = openmm_runner(water, a.r_cut, settings, a.steps, dt, temperature,
                                            a.threads)
        except ImportError:
            print("openmm not installed: pip install openmm (benchmarks/install_peers.sh)")
        best = round_robin(calls, a.repeats, warmup=False)
        row = dict(molecules=w, atoms=n, steps=a.steps, pme=dict(alpha=settings[0],
                   grid=settings[1], order=settings[2]), simlib_compile_s=first - best[
                   "simlib"].best)
        for name, t in best.items():
            row[f"{name}_steps_per_s"] = a.steps / t.best
        if "openmm" in best:
            row["ratio_simlib_over_openmm"] = row["simlib_steps_per_s"] / row[
                "openmm_steps_per_s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = dict(simlib=simlib.__version__, jax=jax.__version__, cpus=os.cpu_count(),
               threads=a.threads, dtype=str(jnp.zeros(()).dtype), r_cut=a.r_cut,
               tolerance=a.tolerance, load_start=fmt_load(start_load),
               load_end=fmt_load(load_average()), rows=rows)
    try:
        import openmm
        out["openmm"] = openmm.__version__
    except ImportError:
        pass
    Path(a.json).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
