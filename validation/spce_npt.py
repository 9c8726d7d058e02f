"""SPC/E water at 300 K and 1 bar under stochastic cell rescaling with SETTLE: the density.

    python validation/spce_npt.py [--molecules 216] [--equil-ps 20] [--ps 100] [--x64]

216 rigid SPC/E molecules (SETTLE), PME (tolerance 1e-5) and Lennard-Jones cut at 0.75 nm
with the dispersion tail correction (as the published values), Bussi's thermostat (0.1 ps)
and the isotropic stochastic cell rescaling barostat (tau_p 1 ps, compressibility
4.5e-5 /bar), dt 2 fs. It prints the mean density over the production with the standard
error of block averages (10 blocks), next to the published SPC/E density: 0.994 g/cm^3 at
298 K (Vega & Abascal, Phys. Chem. Chem. Phys. 13, 19663 (2011), Ewald, long-range
dispersion correction) and 0.998 (Berendsen, Grigera & Straatsma, J. Phys. Chem. 91, 6269
(1987)); the temperature, the molecular pressure (1 bar expected), and the drift of the
effective energy.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

KB = 0.00831446261815324          # kJ/mol/K
BAR = 0.0602214076                # kJ/mol/nm^3 per bar
AVOGADRO = 6.02214076e23


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--molecules", type=int, default=216)
    p.add_argument("--temperature", type=float, default=300.0)
    p.add_argument("--pressure", type=float, default=1.0, help="bar")
    p.add_argument("--equil-ps", type=float, default=20.0)
    p.add_argument("--ps", type=float, default=100.0, help="production, ps")
    p.add_argument("--dt", type=float, default=0.002)
    p.add_argument("--r-cut", type=float, default=0.75)
    p.add_argument("--tolerance", type=float, default=1e-5)
    p.add_argument("--tau-p", type=float, default=1.0)
    p.add_argument("--skin", type=float, default=0.1)
    p.add_argument("--save-every", type=int, default=50)
    p.add_argument("--x64", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    from simlib import particles as sp

    water = sp.spce_water(args.molecules)
    space = sp.periodic(water.box)
    energy = sp.spce_energy(water, args.r_cut, tolerance=args.tolerance, tail_correction=True)
    kT = KB * args.temperature
    masses = water.masses
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh)
    barostat = sp.StochasticCellRescaling(kT, args.pressure * BAR, 0.1, args.tau_p,
                                          4.5e-5 / BAR, constraints=settle)
    k_v, k_eq, k_run = jax.random.split(jax.random.key(args.seed), 3)
    v = settle.constrain_velocities(water.positions,
                                    sp.maxwell_boltzmann(masses, kT, key=k_v), masses, space)
    nbrs = sp.neighbor_list(space, water.positions, r_cut=args.r_cut, skin=args.skin)
    state = sp.State(water.positions, v, masses)
    grams = float(np.sum(np.asarray(masses))) / AVOGADRO
    common = dict(space=space, dt=args.dt, save_every=args.save_every,
                  chunk_steps=20 * args.save_every, integrator=barostat)
    start = time.perf_counter()
    n_eq = int(round(args.equil_ps / args.dt)) // args.save_every * args.save_every
    eq = sp.simulate(energy, state, water.params, n_steps=n_eq, neighbors=nbrs, key=k_eq,
                     **common)
    print(f"equilibration {args.equil_ps} ps: {time.perf_counter() - start:.1f} s, result "
          f"{int(eq.result)}, density at the end "
          f"{grams / np.prod(np.asarray(eq.box[-1], float) * 1e-7):.4f} g/cm^3", flush=True)
    # the production starts from the equilibrated box: a space (and energy) in that box
    box = float(np.asarray(eq.box[-1])[0])
    water2 = water._replace(positions=eq.final.positions, box=box)
    space2 = sp.periodic(box)
    energy2 = sp.spce_energy(water2, args.r_cut, tolerance=args.tolerance,
                             tail_correction=True)
    nbrs2 = sp.neighbor_list(space2, eq.final.positions, r_cut=args.r_cut, skin=args.skin)
    common["space"] = space2
    n_run = int(round(args.ps / args.dt)) // args.save_every * args.save_every
    start = time.perf_counter()
    traj = sp.simulate(energy2, eq.final, water.params, n_steps=n_run, neighbors=nbrs2,
                       key=k_run, **common)
    jax.block_until_ready(traj.positions)
    seconds = time.perf_counter() - start
    boxes = np.asarray(traj.box, float)[1:]
    rho = grams / np.prod(boxes * 1e-7, axis=1)
    blocks = np.array([b.mean() for b in np.array_split(rho, 10)])
    err = blocks.std(ddof=1) / np.sqrt(len(blocks))
    n, w = water.positions.shape[0], args.molecules
    nf = 3 * (n - 1) - 3 * w
    temps = 2 * np.asarray(traj.kinetic_energy, float)[1:] / (nf * KB)
    h = np.asarray(traj.conserved, float)
    out = dict(density=float(rho.mean()), error=float(err), temperature=float(temps.mean()),
               drift_per_molecule_per_ps=float((h[-1] - h[0]) / w / (n_run * args.dt)),
               seconds=seconds, steps=n_run, result=int(traj.result))
    print(f"production {args.ps} ps ({n_run} steps) in {seconds:.1f} s: result "
          f"{out['result']}\n  density {out['density']:.4f} +- {err:.4f} g/cm^3 "
          f"(published SPC/E: 0.994 at 298 K, Vega & Abascal 2011; 0.998, Berendsen 1987)\n"
          f"  T {out['temperature']:.1f} K; effective-energy drift "
          f"{out['drift_per_molecule_per_ps']:.2e} kJ/mol per molecule per ps", flush=True)
    return out


if __name__ == "__main__":
    main()
