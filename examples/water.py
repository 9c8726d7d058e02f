"""SPC/E water at 300 K: rigid molecules (SETTLE), smooth PME, a thermostat.

Builds a box of SPC/E molecules on a lattice at 0.997 g/cm^3 (sp.spce_water), draws
Maxwell-Boltzmann velocities and removes their motion along the constraints, melts and
thermalises the lattice with a strongly coupled thermostat, then runs production with a
weakly coupled one (Bussi stochastic velocity rescaling, or a Nose-Hoover chain). Prints
the temperature, the energy, the O-O radial distribution's first peak and the
self-diffusion coefficient with their statistical errors, next to the published SPC/E
values. Units: nm, ps, amu, kJ/mol, K.

The default run is short (0.5 + 1.5 ps): its diffusion coefficient is a rough estimate
(few time origins, a small box whose finite-size correction is printed), its g(r) peak a
good one. Give --steps 20000 or more for numbers to quote.

    python examples/water.py --plot out/water.png --out out/water.npz
    simlib run water --n-molecules 343 --steps 20000 --plot out/water.png
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from simlib import cli
from simlib import particles as sp

KB = 0.00831446261815324          # kJ/mol/K
# Published SPC/E values at 300 K (and 0.997 g/cm^3 or 1 bar)
PEAK_REFERENCE = 0.275            # nm, O-O g(r) first peak (Mark & Nilsson 2001; ~2.75 A)
D_REFERENCE = 2.5e-5              # cm^2/s (Mark & Nilsson, J. Phys. Chem. A 105, 9954 (2001))
VISCOSITY = 0.729e-3              # Pa s, SPC/E at 300 K (Gonzalez & Abascal 2010), for the
#                                   finite-size correction of D (Yeh & Hummer 2004)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n-molecules", type=cli.positive_int, default=216,
                   help="water molecules (on an m^3 lattice; 216 = 6^3)")
    cli.add_md_options(p, temperature=300.0, equil_steps=250,
                       equil_help="equilibration steps (Bussi, tau = 0.05 ps); 0 for none",
                       steps=750, r_cut=0.75,
                       r_cut_help="cutoff of Lennard-Jones and of PME's real-space sum, nm")
    cli.add_output_options(p, x64=False)
    args = p.parse_args(argv)
    cli.check_md_frames(p, args)
    box = sp.spce_water(args.n_molecules).box
    if args.r_cut + args.skin > box / 2:
        p.error(f"argument --r-cut: --r-cut + --skin = {args.r_cut + args.skin:g} exceeds half "
                f"the box ({box / 2:.3f} nm); use more --n-molecules")
    return p, args


@cli.script
def main(argv: list[str] | None = None) -> None:
    parser, args = parse(argv)
    say = cli.printer(args.quiet)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    water = sp.spce_water(args.n_molecules)
    n, w = water.positions.shape[0], args.n_molecules
    space = sp.periodic(water.box)
    energy = sp.spce_energy(water, args.r_cut, tolerance=args.tolerance)
    pme = energy.terms[1]
    kT = KB * args.temperature
    nf = 3 * (n - 1) - 3 * w                       # 6w - 3 degrees of freedom
    key_v, key_eq, key_run = jax.random.split(jax.random.key(args.seed), 3)
    masses = water.masses
    hot = sp.Settle(water.molecules, water.d_oh, water.d_hh, thermostat=sp.Bussi(kT, 0.05))
    v = sp.maxwell_boltzmann(masses, kT, key=key_v)
    v = hot.constrain_velocities(water.positions, v, masses, space)
    nbrs = sp.neighbor_list(space, water.positions, r_cut=args.r_cut, skin=args.skin)
    state = sp.State(water.positions, v, masses)
    say(f"{w} SPC/E molecules ({n} atoms) in a box of {water.box:.4f} nm "
        f"({water.density:.3f} g/cm^3), {water.positions.dtype}; r_cut {args.r_cut} nm, "
        f"PME alpha {float(pme.alpha):.3f}/nm, grid {pme.grid}, order {pme.order}")
    chunk = math.gcd(args.equil_steps, args.steps) if args.equil_steps else args.steps
    chunk = max(args.save_every, min(chunk, 1000) // args.save_every * args.save_every)
    common = dict(space=space, dt=args.dt, save_every=args.save_every, chunk_steps=chunk)

    start = time.perf_counter()
    if args.equil_steps:
        eq = sp.simulate(energy, state, water.params, n_steps=args.equil_steps,
                         neighbors=nbrs, integrator=hot, key=key_eq,
                         progress=not args.quiet, **common)
        state, nbrs = eq.final, eq.neighbors
        t_eq = 2 * np.asarray(eq.kinetic_energy) / (nf * KB)
        say(f"equilibration: {args.equil_steps} steps ({args.equil_steps * args.dt:g} ps) in "
            f"{time.perf_counter() - start:.1f} s with compilation; T at the end "
            f"{t_eq[-1]:.1f} K, U at the end {float(eq.potential_energy[-1]) / w:.2f} "
            f"kJ/mol per molecule")
    thermostat = (sp.Bussi(kT, args.tau) if args.thermostat == "bussi"
                  else sp.NoseHooverChain(kT, args.tau))
    settle = sp.Settle(water.molecules, water.d_oh, water.d_hh, thermostat=thermostat)
    start = time.perf_counter()
    traj = sp.simulate(energy, state, water.params, n_steps=args.steps, neighbors=nbrs,
                       integrator=settle, key=key_run, progress=not args.quiet, **common)
    jax.block_until_ready(traj.positions)
    seconds = time.perf_counter() - start

    times = np.asarray(traj.times, float)
    x = np.asarray(traj.positions, float)
    temps = 2 * np.asarray(traj.kinetic_energy, float) / (nf * KB)
    u = np.asarray(traj.potential_energy, float) / w
    conserved = np.asarray(traj.conserved, float) / w
    mol = water.molecules
    rigid = [np.abs(np.linalg.norm(
        (d := x[:, mol[:, a]] - x[:, mol[:, b]]) - water.box * np.round(d / water.box),
        axis=-1) - length).max() for a, b, length in
        ((0, 1, water.d_oh), (0, 2, water.d_oh), (1, 2, water.d_hh))]
    n_blocks = 4
    frames = np.array_split(np.arange(len(times)), n_blocks)
    say(f"production: {args.steps} steps ({args.steps * args.dt:g} ps, {args.thermostat}, "
        f"tau {args.tau} ps) in {seconds:.1f} s ({args.steps / seconds:.0f} steps/s)")
    say(f"  T = {temps.mean():.1f} +- {sp.block_average(temps, n_blocks)[1]:.1f} K "
        f"(target {args.temperature:g}; {nf} degrees of freedom), U = {u.mean():.2f} +- "
        f"{sp.block_average(u, n_blocks)[1]:.2f} kJ/mol per molecule "
        f"(SPC/E: -46.7 before its 5.2 kJ/mol polarisation correction; Berendsen et al. 1987)")
    say(f"  conserved quantity drift {conserved[-1] - conserved[0]:+.2e} kJ/mol per molecule; "
        f"largest constraint error {max(rigid):.1e} nm")

    oxygens = x[:, mol[:, 0]]
    r_max = min(0.8, water.box / 2)
    peaks, gs = [], []
    for f in frames:
        r, g = sp.radial_distribution(jnp.asarray(oxygens[f]), space, r_max=r_max, n_bins=160)
        r, g = np.asarray(r), np.asarray(g)
        peaks.append(sp.peak_position(r, g))
        gs.append(g)
    g = np.mean(gs, axis=0)
    peak, peak_err = sp.peak_position(r, g), sp.block_average(peaks)[1]
    say(f"  O-O g(r): first peak at {peak * 10:.3f} +- {peak_err * 10:.3f} A, height "
        f"{g.max():.2f} (SPC/E: {PEAK_REFERENCE * 10:.2f} A)")

    # every frame a time origin; the periodic frames are unwrapped inside
    msd = np.asarray(sp.mean_square_displacement(oxygens, space, origins=1), float)
    groups = np.array_split(np.arange(w), n_blocks)
    window = (0.2, 0.6)
    d_groups = [sp.diffusion_coefficient(
        times - times[0], sp.mean_square_displacement(oxygens[:, gr], space, origins=1),
        dim=3, window=window) for gr in groups]
    d_err = sp.block_average(d_groups)[1]
    d = float(sp.diffusion_coefficient(times - times[0], msd, dim=3, window=window))
    to_cgs = 1e-2             # nm^2/ps = 1e-14 m^2 / 1e-12 s = 1e-2 cm^2/s
    correction = 2.837297 * KB * 1e3 / 6.02214076e23 * args.temperature / (
        6 * math.pi * VISCOSITY * water.box * 1e-9) * 1e4            # m^2/s -> cm^2/s
    say(f"  D (oxygen MSD, fit over {window[0]:g}-{window[1]:g} of "
        f"{times[-1] - times[0]:.2f} ps) = {d * to_cgs:.2e} +- {d_err * to_cgs:.1e} "
        f"cm^2/s (+- over {n_blocks} groups of molecules); + {correction:.1e} finite-size "
        f"correction (Yeh & Hummer 2004) = {d * to_cgs + correction:.2e} "
        f"(SPC/E: {D_REFERENCE:.1e}, Mark & Nilsson 2001)")

    if times[-1] - times[0] < 5.0:
        say(f"  (D from {times[-1] - times[0]:g} ps is not converged: the lattice is still "
            "relaxing and the MSD not yet linear; give --steps 4000 or more for a D to compare)")

    if args.out:
        cli.save_result(args.out, dict(model="SPC/E", n_molecules=w, temperature=
                                       args.temperature, thermostat=args.thermostat,
                                       tau=args.tau, dt=args.dt, r_cut=args.r_cut,
                                       tolerance=args.tolerance, seed=args.seed,
                                       x64=args.x64, box=float(water.box)),
                        trajectory=traj, box=space, times=times, positions=x,
                        temperature=temps, potential_energy=u * w, r=r, g=g, msd=msd,
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(2, 3, figsize=(16, 9))
        ax = axes.ravel()
        density = np.full_like(times, water.density)
        ax[0].plot(times, density)
        ax[0].set(xlabel="t [ps]", ylabel="density [g/cm³]",
                  title="Density (constant volume: NVT)")
        ax[1].plot(times, temps)
        ax[1].axhline(args.temperature, color="k", lw=0.5)
        ax[1].set(xlabel="t [ps]", ylabel="T [K]", title=f"Temperature ({nf} dof)")
        ax[2].plot(times, u, label="potential U")
        ax[2].plot(times, conserved, label="conserved quantity")
        ax[2].set(xlabel="t [ps]", ylabel="kJ/mol per molecule", title="Energy")
        ax[2].legend()
        ax[3].plot(r * 10, g)
        ax[3].axvline(PEAK_REFERENCE * 10, color="k", lw=0.5, ls="--")
        ax[3].axhline(1.0, color="k", lw=0.5)
        ax[3].set(xlabel="r [Å]", ylabel="g(r)",
                  title=f"O-O g(r): peak {peak * 10:.3f} ± {peak_err * 10:.3f} Å")
        tt = times - times[0]
        ax[4].plot(tt, msd, label="oxygen MSD")
        ax[4].plot(tt, 6 * D_REFERENCE / to_cgs * tt, "k--", lw=0.8,
                   label="6 D t, D = 2.5e-5 cm²/s")
        ax[4].set(xlabel="t [ps]", ylabel="MSD [nm²]", title="Mean-square displacement")
        ax[4].legend()
        ax[5].axis("off")
        ax[5].text(0, 0.5, f"{w} SPC/E molecules, {args.temperature:g} K\n"
                   f"{args.steps * args.dt:g} ps production ({args.thermostat})\n"
                   f"D = {d * to_cgs:.2e} ± {d_err * to_cgs:.1e} cm²/s\n"
                   f"finite-size corrected {d * to_cgs + correction:.2e}", fontsize=12)
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"water: {w} SPC/E molecules, {args.equil_steps} + {args.steps} steps, "
                f"{traj.positions.dtype}", run_s=seconds,
                result=f"T {temps.mean():.1f} K, g(r) peak {peak * 10:.3f} A, "
                f"D {d * to_cgs:.2e} cm^2/s")


if __name__ == "__main__":
    main()
