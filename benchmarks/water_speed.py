"""SPC/E water MD steps per second: simlib against OpenMM's CPU platform and LAMMPS, one run.

    python benchmarks/water_speed.py --molecules 1000 8000 --steps 200 --json out.json

The same box for both: ``sp.spce_water(w)`` (a lattice at 0.997 g/cm^3), rigid SPC/E
(SETTLE in both), the oxygen Lennard-Jones plainly truncated and smooth PME at the same
cutoff (0.9 nm), Ewald alpha, grid and order 5 the same for every contender: by default
(``--pme openmm``) OpenMM's own choice for its default ``ewaldErrorTolerance`` 5e-4
(``getPMEParametersInContext``: alpha 2.92/nm, grid 28³ at 1,000 molecules, 56³ at 8,000),
handed to simlib and LAMMPS, a like-for-like comparison; ``--pme simlib`` takes simlib's
from ``--tolerance`` instead (its rule is sized for random charges and picks 40³ and 80³
here: docs/electrostatics.md). NVE with a 2 fs step from 300 K velocities, float32
(OpenMM's CPU platform computes in single precision). simlib keeps a neighbour list (skin
0.1 nm) and runs ``simulate`` with ``Settle``; OpenMM runs ``VerletIntegrator.step`` with
``Threads`` set to the machine's core count (``--threads``). Each contender is warmed up
first (simlib's compilation is reported apart), then timed ``--repeats`` times,
round-robin; the best is kept. Sizes: 1,000 and 8,000 molecules are the issue's ~3,000
and ~24,000 atoms.

LAMMPS (``mpiexec -n --lammps-ranks lmp``, one thread a rank; ``--lammps`` variants) runs
the same box from a data file of the same coordinates and the same initial velocities
(simlib's, also given to OpenMM): ``units real``, ``pair_style lj/cut/coul/long`` (plain
truncation at the same cutoff, ``-sf --lammps-suffix``), intramolecular pairs excluded
(``special_bonds lj/coul 0 0 0``), ``kspace_style pppm`` of order 5, rigid water by ``fix
shake`` (tolerance 1e-6; LAMMPS has no SETTLE), ``fix nve``, 2 fs, skin 0.1 nm. PPPM
settings: ``same`` takes the shared alpha and grid (``kspace_modify gewald``, ``mesh``);
``auto`` lets LAMMPS choose them for the same accuracy (simlib's relative force error is
in units of ``k_e q_rms^2 / l^2``, l the mean spacing (V/N)^(1/3), LAMMPS's in ``k_e e^2/Å^2``:
``accuracy = tolerance q_rms^2 / l^2``, l in Å). Every LAMMPS process does ``run 0`` (the
initial energy and forces), a 10-step warm-up and one timed run of ``--steps`` (its "Loop
time"), one process per round. The initial potential energies and RMS force differences
of the three codes are printed (units of simlib's tolerance), with LAMMPS's timing
breakdown and its FFT share of Kspace (``kspace_modify fftbench yes``). ``--split`` also
times simlib's force call apart (Lennard-Jones, PME, both; one jitted call each, best of 7).
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
import _particle_peers as peers  # noqa: E402
from _timing import fmt_load, load_average, round_robin, timed  # noqa: E402

import simlib  # noqa: E402
import simlib.particles as sp  # noqa: E402

KB = 0.00831446261815324  # kJ/mol/K
COULOMB_KJ_NM = 138.935457644382  # kJ nm/mol/e^2 (CODATA 2018, as OpenMM)


def openmm_pme_parameters(water, r_cut, tolerance):
    """OpenMM's own PME parameters ``(alpha, grid, order)`` for ``ewaldErrorTolerance``
    ``tolerance`` on this box (``NonbondedForce.getPMEParametersInContext``)."""
    import openmm as mm

    system = mm.System()
    force = mm.NonbondedForce()
    for q in np.asarray(water.charges, float):
        system.addParticle(1.0)
        force.addParticle(q, 1.0, 0.0)
    box = float(water.box)
    system.setDefaultPeriodicBoxVectors(mm.Vec3(box, 0, 0), mm.Vec3(0, box, 0),
                                        mm.Vec3(0, 0, box))
    force.setNonbondedMethod(mm.NonbondedForce.PME)
    force.setCutoffDistance(r_cut)
    force.setEwaldErrorTolerance(tolerance)
    system.addForce(force)
    context = mm.Context(system, mm.VerletIntegrator(0.001),
                         mm.Platform.getPlatformByName("Reference"))
    alpha, nx, ny, nz = force.getPMEParametersInContext(context)
    return float(alpha), (int(nx), int(ny), int(nz)), 5


def simlib_runner(water, r_cut, tolerance, steps, dt, temperature, pme_settings=None):
    """``run()`` for ``steps`` NVE SETTLE steps, its compile time, and the PME settings
    (simlib's from ``tolerance``, or ``pme_settings`` ``(alpha, grid, order)`` given)."""
    space = sp.periodic(water.box)
    if pme_settings is None:
        energy = sp.spce_energy(water, r_cut, tolerance=tolerance)
    else:
        alpha, grid, order = pme_settings
        energy = sp.spce_energy(water, r_cut, tolerance=tolerance, alpha=alpha, grid=grid,
                                order=order)
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
    e0, f0 = jax.jit(energy.energy_and_forces)(water.positions, water.params, nbrs)
    initial = dict(pe0=float(e0), forces0=np.asarray(f0, float), velocities=np.asarray(v))

    def split(repeats=7):
        """One jitted force call of each term and of the sum at the start, ms (best of)."""
        calls = {name: (lambda f: lambda: f(water.positions, water.params, nbrs))(
                     jax.jit(term.energy_and_forces))
                 for name, term in (("lj", energy.terms[0]), ("pme", pme), ("total", energy))}
        best = round_robin(calls, repeats)
        return {name: 1e3 * t.best for name, t in best.items()}

    initial["split"] = split
    return (run, first, (float(pme.alpha), tuple(int(g) for g in pme.grid), int(pme.order)),
            initial)


def openmm_runner(water, r_cut, pme_settings, steps, dt, velocities, threads):
    """``run()`` for ``steps`` OpenMM Verlet steps on the CPU platform (SETTLE, PME), from
    ``velocities``, and the initial potential energy and forces (kJ/mol, kJ/mol/nm)."""
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
    context.setVelocities([mm.Vec3(*map(float, v)) for v in velocities])
    context.applyVelocityConstraints(1e-6)
    state = context.getState(getEnergy=True, getForces=True)
    initial = dict(pe0=state.getPotentialEnergy()._value,
                   forces0=np.asarray(state.getForces(asNumpy=True)._value, float))

    def run():
        integrator.step(steps)
        return context.getState(getEnergy=True).getPotentialEnergy()

    run()                                  # warm-up (neighbour grids, FFT plans)
    return run, initial


def lammps_runner(water, r_cut, pme_settings, tolerance, steps, dt, velocities, ranks,
                  pppm, suffix, records):
    """``run()``: one LAMMPS process (``run 0``, warm-up, ``steps`` timed), its result
    appended to ``records``; ``pppm`` ``"same"`` (the shared alpha and grid) or ``"auto"``."""
    alpha, grid, order = pme_settings
    q = np.asarray(water.charges, float)
    m = np.asarray(water.masses, float)
    o, h = np.asarray(water.molecules)[0, :2]                 # the SPC/E parameters of water
    spacing = (water.box**3 / q.size) ** (1 / 3) * 10.0                     # Angstrom
    accuracy = tolerance * float(np.mean(q**2)) / spacing**2
    angle = float(np.degrees(2.0 * np.arcsin(water.d_hh / (2.0 * water.d_oh))))

    def run():
        r = peers.lammps_mpi_water(
            np.asarray(water.positions, float), velocities, water.box, water.molecules,
            steps=steps, r_cut=r_cut, sigma=float(water.sigma[o]),
            epsilon=float(water.epsilon[o]), masses=(m[o], m[h]), charges=(q[o], q[h]),
            d_oh=water.d_oh, angle=angle, accuracy=accuracy,
            alpha=alpha if pppm == "same" else None,
            grid=grid if pppm == "same" else None, order=order, dt=dt, ranks=ranks,
            suffix=suffix)
        records.append(r)
        return r["seconds"]

    return run


def force_unit(water) -> float:
    """simlib's unit of force error, ``k_e q_rms^2 / l^2`` (kJ/mol/nm), ``l = (V/N)^(1/3)``."""
    q = np.asarray(water.charges, float)
    spacing = (water.box**3 / q.size) ** (1 / 3)
    return COULOMB_KJ_NM * float(np.mean(q**2)) / spacing**2


def compare_initial(water, initial: dict) -> dict:
    """Initial potential energies and pairwise RMS force differences (in simlib's unit of
    force error and relative to the RMS force) of the contenders."""
    unit = force_unit(water)
    out = dict(pe0_kj_mol={k: v["pe0"] for k, v in initial.items()}, force_unit_kj_mol_nm=unit)
    names = list(initial)
    for a_i, a in enumerate(names):
        for b in names[a_i + 1:]:
            fa, fb = initial[a]["forces0"], initial[b]["forces0"]
            d = float(np.sqrt(np.mean(np.sum((fa - fb) ** 2, axis=1))))
            rms = float(np.sqrt(np.mean(np.sum(fb**2, axis=1))))
            out[f"{a}_vs_{b}"] = dict(rms_force_diff_over_unit=d / unit,
                                      rms_force_diff_over_rms_force=d / rms,
                                      pe0_rel_diff=abs(initial[a]["pe0"] - initial[b]["pe0"])
                                      / abs(initial[b]["pe0"]))
    return out


def lammps_summary(records: list[dict]) -> dict:
    """The best of one LAMMPS variant's processes, with every loop time."""
    best = min(records, key=lambda r: r["seconds"])
    keep = {k: v for k, v in best.items() if k != "forces0"}
    keep["times"] = [r["seconds"] for r in records]
    return keep


def print_row(row: dict) -> None:
    """A readable summary of one size: rates, ratios, agreement, LAMMPS's breakdown."""
    print(f"\n{row['atoms']} atoms, {row['steps']} steps, loads {row['load_1min_rounds']}")
    for key in [k for k in row if k.endswith("_steps_per_s")]:
        print(f"  {key[:-len('_steps_per_s')]:14s} {row[key]:8.2f} steps/s")
    for key in [k for k in row if k.startswith("ratio_")]:
        print(f"  {key:36s} {row[key]:.3f}")
    for key, d in row["agreement"].items():
        if isinstance(d, dict) and "rms_force_diff_over_unit" in d:
            print(f"  {key:20s} rms dF {d['rms_force_diff_over_unit']:.2e} (tolerance units), "
                  f"{d['rms_force_diff_over_rms_force']:.2e} of rms F; dPE/PE "
                  f"{d['pe0_rel_diff']:.2e}")
    print(f"  PE0 (kJ/mol): {row['agreement']['pe0_kj_mol']}")
    if "simlib_split_ms" in row:
        split = row["simlib_split_ms"].items()
        print("  simlib ms: " + ", ".join(f"{k} {v:.2f}" for k, v in split))
    for key in [k for k in row if k.startswith("lammps_") and isinstance(row[k], dict)]:
        r = row[key]
        ms = {s: f"{1e3 * v['avg_s'] / r['steps']:.2f} ms ({v['percent']:.0f}%)"
              for s, v in r["breakdown_best"].items()}
        fft = r["breakdown_best"].get("Kspace", {}).get("fft_percent_of_kspace")
        print(f"  {key}: {r['name']} pppm {r['pppm']}\n    per step: {ms}; FFT "
              f"{fft}% of Kspace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--molecules", type=int, nargs="+", default=[1000, 8000])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--r-cut", type=float, default=0.9)
    ap.add_argument("--tolerance", type=float, default=5e-4)
    ap.add_argument("--pme", choices=["openmm", "simlib"], default="openmm",
                    help="PME alpha and grid: OpenMM's own choice for ewaldErrorTolerance "
                         "--openmm-tolerance, used by every contender (like for like), or "
                         "simlib's from --tolerance")
    ap.add_argument("--openmm-tolerance", type=float, default=5e-4,
                    help="OpenMM's ewaldErrorTolerance (its default 5e-4) for --pme openmm")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--lammps", nargs="*", default=["same", "auto"], choices=["same", "auto"],
                    help="LAMMPS variants: pppm with the shared alpha and grid, or LAMMPS's own "
                         "for the same accuracy (none: skip LAMMPS)")
    ap.add_argument("--lammps-ranks", type=int, default=2)
    ap.add_argument("--split", action="store_true",
                    help="also time simlib's force call apart: Lennard-Jones, PME, both")
    ap.add_argument("--lammps-suffix", default="opt",
                    help="lmp -sf (opt: lj/cut/coul/long/opt); 'none' for the plain styles")
    ap.add_argument("--json", default="benchmarks/results/water_speed.json")
    a = ap.parse_args()
    dt, temperature = 0.002, 300.0
    start_load = load_average()
    rows = []
    suffix = None if a.lammps_suffix == "none" else a.lammps_suffix
    for w in a.molecules:
        water = sp.spce_water(w)
        n = water.positions.shape[0]
        given = (openmm_pme_parameters(water, a.r_cut, a.openmm_tolerance)
                 if a.pme == "openmm" else None)
        run_simlib, first, settings, init = simlib_runner(water, a.r_cut, a.tolerance,
                                                          a.steps, dt, temperature, given)
        calls, initial = {"simlib": run_simlib}, {"simlib": init}
        try:
            calls["openmm"], initial["openmm"] = openmm_runner(
                water, a.r_cut, settings, a.steps, dt, init["velocities"], a.threads)
        except ImportError:
            print("openmm not installed: pip install openmm (benchmarks/install_peers.sh)")
        records = {}
        for variant in a.lammps:
            key = f"lammps_{variant}"
            records[key] = []
            calls[key] = lammps_runner(water, a.r_cut, settings, a.tolerance, a.steps, dt,
                                       init["velocities"], a.lammps_ranks, variant, suffix,
                                       records[key])
        loads = []
        calls["load"] = lambda: loads.append(load_average()[0])   # noqa: B023
        best = round_robin(calls, a.repeats, warmup=False)
        best.pop("load")
        row = dict(molecules=w, atoms=n, steps=a.steps, pme=dict(alpha=settings[0],
                   grid=settings[1], order=settings[2]), simlib_compile_s=first - best[
                   "simlib"].best, load_1min_rounds=loads)
        for name, t in best.items():
            if name.startswith("lammps"):
                if not records[name]:
                    continue
                row[name] = lammps_summary(records[name])
                row[f"{name}_steps_per_s"] = row[name]["rate"]
                initial[name] = dict(pe0=records[name][0]["pe0"],
                                     forces0=records[name][0]["forces0"])
            else:
                row[f"{name}_times_s"] = t.times
                row[f"{name}_steps_per_s"] = a.steps / t.best
        if a.split:
            row["simlib_split_ms"] = init["split"]()
            row["simlib_split_ms"]["step"] = 1e3 * best["simlib"].best / a.steps
        row["agreement"] = compare_initial(water, initial)
        peers_rate = {k[:-len("_steps_per_s")]: v for k, v in row.items()
                      if k.endswith("_steps_per_s") and not k.startswith("simlib")}
        for name, rate in peers_rate.items():
            row[f"ratio_simlib_over_{name}"] = row["simlib_steps_per_s"] / rate
        if peers_rate:
            fastest = max(peers_rate, key=peers_rate.get)
            row["fastest_peer"] = fastest
            row["ratio_simlib_over_fastest_peer"] = (row["simlib_steps_per_s"]
                                                     / peers_rate[fastest])
        rows.append(row)
        print(json.dumps(row, default=float), flush=True)
        print_row(row)
    out = dict(simlib=simlib.__version__, jax=jax.__version__, cpus=os.cpu_count(),
               threads=a.threads, lammps_ranks=a.lammps_ranks, lammps_suffix=suffix,
               command="python " + " ".join(sys.argv), dtype=str(jnp.zeros(()).dtype),
               r_cut=a.r_cut, pme_choice=a.pme, openmm_tolerance=a.openmm_tolerance,
               tolerance=a.tolerance, load_start=fmt_load(start_load),
               load_end=fmt_load(load_average()), rows=rows)
    try:
        import openmm
        out["openmm"] = openmm.__version__
    except ImportError:
        pass
    Path(a.json).write_text(json.dumps(out, indent=1, default=float))
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
