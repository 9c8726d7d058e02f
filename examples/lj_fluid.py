"""Lennard-Jones fluid: Langevin equilibration, then NVE production with a neighbour list.

Starts from an fcc lattice at the given density with Maxwell-Boltzmann velocities, melts
and thermalises it with BAOAB Langevin dynamics at kT, lets it settle without the
thermostat, then runs velocity-Verlet NVE with a cell-list neighbour list. Prints the
energy drift, mean temperature and pressure, neighbour-list statistics and the speed, and
plots the energies and g(r). Reduced Lennard-Jones units: lengths in sigma, energies in
epsilon (k_B = 1, so kT too), time in tau = sigma sqrt(m / epsilon).

With ``--checkpoint PATH`` the production run is checkpointed, with the options that
shape it; ``--resume`` continues it (the file must exist and match the options: both are
checked before the equilibration, which a resumed run repeats to rebuild its start state),
``--resume-if-exists`` too, starting the run when there is no file yet (docs/cli.md).

    python examples/lj_fluid.py --n-cells 6 --steps 4000 --plot out/lj_fluid.png
    simlib run lj_fluid --x64 --out out/lj_fluid.npz
    simlib run lj_fluid --steps 100000 --checkpoint out/lj.ckpt.npz            # Ctrl-C, then
    simlib run lj_fluid --steps 100000 --checkpoint out/lj.ckpt.npz --resume   # goes on
    simlib run lj_fluid --n-cells 40 --pairs auto   # 256,000 atoms: on a TPU, cells and the
                                                    # state in the Pallas kernel's layout
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from simlib import cli
from simlib import particles as sp


def tail_pressure(density: float, r_cut: float) -> float:
    """Long-range correction to the pressure of LJ truncated at ``r_cut`` (sigma = eps = 1),
    assuming g(r) = 1 beyond it (Allen & Tildesley, Computer Simulation of Liquids, 2017)."""
    return 16.0 / 3.0 * math.pi * density**2 * (2.0 / 3.0 * r_cut**-9 - r_cut**-3)


def tail_energy(density: float, r_cut: float) -> float:
    """Long-range correction to the energy per particle of unshifted LJ truncated at r_cut."""
    return 8.0 / 3.0 * math.pi * density * (r_cut**-9 / 3.0 - r_cut**-3)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n-cells", type=cli.positive_int, default=6,
                   help="fcc unit cells per side, 4 atoms each (6: 864 atoms, the smallest "
                   "box with a 3x3x3 cell list)")
    p.add_argument("--n", type=cli.positive_int, default=None,
                   help="atoms (rounded up to 4 n-cells^3); overrides --n-cells")
    p.add_argument("--density", type=cli.positive_float, default=0.8442,
                   help="number density in sigma^-3")
    p.add_argument("--kT", type=cli.positive_float, default=0.722,
                   help="temperature of the initial velocities and the thermostat")
    p.add_argument("--gamma", type=cli.positive_float, default=1.0,
                   help="Langevin friction during equilibration")
    p.add_argument("--equil-steps", type=cli.nonnegative_int, default=3000,
                   help="Langevin equilibration steps; 0 for none")
    p.add_argument("--steps", type=cli.positive_int, default=4000, help="NVE production steps")
    p.add_argument("--dt", type=cli.positive_float, default=0.005, help="time step")
    p.add_argument("--r-cut", type=cli.positive_float, default=2.5, help="LJ cutoff")
    p.add_argument("--shift", action=argparse.BooleanOptionalAction, default=True,
                   help="shift the potential to zero at the cutoff")
    p.add_argument("--skin", type=cli.nonnegative_float, default=0.3, help="neighbour-list skin")
    p.add_argument("--pairs", choices=("list", "auto", "cells"), default="list",
                   help="pair search: a neighbour list, what suits the backend "
                   "(sp.pair_search: the list on the CPU, cells on an accelerator, where on a "
                   "TPU the NVE run keeps its state in the Pallas kernel's cell layout), or "
                   "cells (box of at least 3 (r-cut + skin) a side)")
    p.add_argument("--tail-correction", action="store_true",
                   help="add the analytic long-range correction to the pressure "
                   "(and, unshifted, to the energy)")
    p.add_argument("--save-every", type=cli.positive_int, default=20,
                   help="steps between saved frames")
    p.add_argument("--debug", action="store_true",
                   help="check the neighbour list against all pairs at every step (slow)")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed")
    p.add_argument("--checkpoint", type=cli.checkpoint_path, metavar="PATH",
                   help="write the production run's state to PATH (.npz) every "
                   "--checkpoint-every chunks, and on Ctrl-C or SIGTERM")
    p.add_argument("--checkpoint-every", type=cli.positive_int, default=1,
                   help="chunks (of up to 1,000 steps) between checkpoints")
    resume = p.add_mutually_exclusive_group()
    resume.add_argument("--resume", action="store_true",
                        help="continue the production run from --checkpoint, which must exist "
                        "and have been written with the same options (the result is "
                        "bit-identical to an uninterrupted run)")
    resume.add_argument("--resume-if-exists", action="store_true",
                        help="--resume if the checkpoint exists, else start the run (saying "
                        "so on stderr): for a job script that passes the same options to "
                        "its first and every later submission")
    cli.add_output_options(p, x64=False)
    args = p.parse_args(argv)
    option = "--resume" if args.resume else "--resume-if-exists"
    if (args.resume or args.resume_if_exists) and not args.checkpoint:
        p.error(f"argument {option}: needs --checkpoint PATH")
    if args.n is not None:
        args.n_cells = math.ceil((args.n / 4) ** (1 / 3) - 1e-9)
    if args.equil_steps % args.save_every or args.steps % args.save_every:
        p.error(f"argument --save-every: must divide --equil-steps and --steps, got "
                f"{args.save_every}")
    box = args.n_cells * (4.0 / args.density) ** (1.0 / 3.0)  # the fcc lattice's box
    if args.r_cut + args.skin > box / 2:
        p.error(f"argument --r-cut: --r-cut + --skin = {args.r_cut + args.skin:g} exceeds half "
                f"the box ({box / 2:.3f}); use more --n-cells")
    # The checkpoint is checked now, before the equilibration that leads up to it.
    args.resumed_at = None  # the steps the resumed run had done
    if args.resume or args.resume_if_exists:
        try:
            info = sp.checkpoint_info(args.checkpoint)
        except FileNotFoundError:
            if args.resume:  # a mistyped path must not restart a long run
                p.error(f"argument --resume: no checkpoint at {args.checkpoint} (leave out "
                        "--resume to start the run; a job script that passes the same options "
                        "to every submission can use --resume-if-exists)")
            print(f"{p.prog}: no checkpoint at {args.checkpoint}: starting the run from step 0 "
                  "(--resume-if-exists)", file=sys.stderr, flush=True)
        except sp.CheckpointError as err:
            p.error(f"argument {option}: {err}")
        else:
            differs = settings_mismatch(info["metadata"], settings(args))
            if differs:
                p.error(f"argument {option}: the checkpoint {args.checkpoint} {differs}; "
                        "resume with the options of the run that wrote it")
            args.resumed_at = info["steps_done"]
    return p, args


RUN_OPTIONS = ("n_cells", "density", "kT", "gamma", "equil_steps", "steps", "dt", "r_cut",
               "shift", "skin", "save_every", "debug", "seed", "x64")  # a resume must match
# (--pairs changes how the pairs are found, not the run: a resume may change it)


def settings(args) -> dict:
    """The options that shape the production run and the state it starts from, by name:
    stored in the checkpoint, and checked before a resumed run repeats the equilibration."""
    return {"example": "lj_fluid", **{"--" + k.replace("_", "-"): getattr(args, k)
                                      for k in RUN_OPTIONS}}


def settings_mismatch(saved: dict | None, now: dict) -> str | None:
    """How the checkpoint's settings differ from this run's, in words, or ``None``."""
    if not saved or saved.get("example") != now["example"]:
        return "was not written by this example (it holds no lj_fluid settings)"
    for key, value in now.items():
        if saved.get(key) != value:
            return f"was written with {key} {saved.get(key)}, this run has {key} {value}"
    return None


@cli.script
def main(argv: list[str] | None = None) -> None:
    parser, args = parse(argv)
    say = cli.printer(args.quiet)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    positions, box = sp.lattice(args.n_cells, args.density)
    n = positions.shape[0]
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=args.r_cut, shift=args.shift)
    params = dict(sigma=1.0, epsilon=1.0)
    masses = 1.0
    key_v, key_langevin = jax.random.split(jax.random.key(args.seed))
    velocities = sp.maxwell_boltzmann(masses, args.kT, key=key_v, n=n, dtype=positions.dtype)
    if args.pairs == "list":
        nbrs = sp.neighbor_list(space, positions, r_cut=args.r_cut, skin=args.skin,
                                debug=args.debug)
    else:
        try:
            nbrs = sp.pair_search(space, positions, args.r_cut, args.skin, method=args.pairs)
        except ValueError as err:       # cells in a box under 3 cells a side
            parser.error(f"argument --pairs: {err}")
    cells = isinstance(nbrs, sp.CellList)
    state = sp.State(positions, velocities, masses)
    if cells:
        pairs = f"cells: grid {nbrs.grid}, capacity {nbrs.capacity}, skin {args.skin}"
    else:
        pairs = (f"neighbour list capacity {nbrs.capacity}, skin {args.skin}, "
                 + (f"cell grid {nbrs.grid}" if nbrs.grid else "all-pairs build (box < 3 cells)"))
    say(f"{n} atoms in a periodic box of side {box:.4f} (density {args.density}), "
          f"{positions.dtype}; LJ r_cut={args.r_cut}, shift={args.shift}; {pairs}")
    common = dict(space=space, dt=args.dt, save_every=args.save_every)

    if args.equil_steps:
        start = time.perf_counter()
        traj = sp.simulate(energy, state, params, n_steps=args.equil_steps, neighbors=nbrs,
                           integrator=sp.Langevin(kT=args.kT, gamma=args.gamma),
                           key=key_langevin, progress=not args.quiet, **common)
        # The thermostat's noise moves the centre of mass; NVE conserves momentum, so start it at 0.
        v = traj.final.velocities
        state = sp.State(traj.final.positions, v - jnp.mean(v, axis=0), masses)
        nbrs = traj.neighbors
        temps = sp.temperature(traj.velocities[len(traj.times) // 2:], masses)
        say(f"Langevin equilibration, {args.equil_steps} steps at kT={args.kT}, "
              f"gamma={args.gamma}: {time.perf_counter() - start:.1f} s (with compilation); "
              f"mean kT over the second half {float(jnp.mean(temps)):.4f}, "
              f"U/N at the end {float(traj.potential_energy[-1]) / n:.4f}")

    # A short NVE run without the thermostat; it also compiles the chunk that production
    # reuses, so the production timing below is compilation-free.
    chunk = min(1000, args.steps) // args.save_every * args.save_every
    start = time.perf_counter()
    traj = sp.simulate(energy, state, params, n_steps=chunk, neighbors=nbrs,
                       chunk_steps=chunk, **common)
    state, nbrs = traj.final, traj.neighbors
    settle_s = time.perf_counter() - start
    say(f"NVE settling, {chunk} steps: {settle_s:.1f} s "
          f"(with compilation)")

    builds0 = int(nbrs.n_builds)
    resumed = args.resumed_at is not None
    steps_run = args.steps - (args.resumed_at or 0)  # a resumed run does only the rest
    if resumed:
        say(f"resuming the production run from {args.checkpoint} at step {args.resumed_at} "
            f"of {args.steps}")
    start = time.perf_counter()
    try:
        traj = sp.simulate(energy, state, params, n_steps=args.steps, neighbors=nbrs,
                           chunk_steps=chunk, progress=not args.quiet,
                           checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every,
                           resume=resumed, checkpoint_metadata=settings(args)
                           if args.checkpoint else None, **common)
    except sp.CheckpointError as err:
        option = "--resume" if args.resume else "--resume-if-exists"
        if "start_state" not in str(err):
            parser.error(f"argument {option}: {err}")
        # The options matched (checked in parse), but the start state the equilibration made
        # does not: another simlib or JAX version, or another machine's arithmetic.
        parser.error(f"argument {option}: the checkpoint {args.checkpoint} started from "
                     "another state than the equilibration made now with the same options "
                     "(another simlib or JAX version, or another machine?); run without "
                     f"{option} to start afresh")
    jax.block_until_ready(traj.positions)
    seconds = time.perf_counter() - start

    e_total = np.asarray(traj.total_energy, np.float64)
    times = np.asarray(traj.times, np.float64)
    drift_max = np.max(np.abs(e_total - e_total[0])) / n
    slope = np.polyfit(times, e_total / n, 1)[0]
    temps = np.asarray(sp.temperature(traj.velocities, masses))
    momentum = np.asarray(sp.total_momentum(traj.velocities, masses))

    # The pressure of every saved frame, with the neighbour list carried along the frames.
    @jax.jit
    def pressures(xs, vs, nbrs):
        def one(nbrs, xv):
            nbrs = nbrs.update(xv[0])
            return nbrs, sp.pressure(energy, xv[0], xv[1], masses, params, neighbors=nbrs)
        nbrs, p = jax.lax.scan(one, nbrs, (xs, vs))
        return p, nbrs.overflow

    p_frames, overflow = pressures(traj.positions, traj.velocities, traj.neighbors)
    if bool(overflow):       # never silently: redo with a list sized for every frame
        p_frames = jax.jit(lambda xs, vs: jax.lax.map(
            lambda xv: sp.pressure(energy, xv[0], xv[1], masses, params), (xs, vs)))(
            traj.positions, traj.velocities)
    p_frames = np.asarray(p_frames, np.float64)
    p_tail = tail_pressure(args.density, args.r_cut) if args.tail_correction else 0.0
    u_per_atom = np.asarray(traj.potential_energy, np.float64) / n
    u_tail = tail_energy(args.density, args.r_cut) \
        if args.tail_correction and not args.shift else 0.0

    # Standard error of a mean of correlated samples, by blocking into 10 blocks.
    def sem(x):
        blocks = np.array_split(x, min(10, len(x)))
        means = np.array([b.mean() for b in blocks])
        return means.std(ddof=1) / np.sqrt(len(means)) if len(means) > 1 else float("nan")

    n_builds = int(traj.neighbors.n_builds) - builds0
    say(f"NVE production, {args.steps} steps of dt={args.dt} "
          f"(t = {args.steps * args.dt:g}), {traj.positions.dtype}:")
    say(f"  energy drift: max |E(t) - E(0)| / N = {drift_max:.2e}, "
          f"linear trend {slope:+.2e} per atom per unit time, "
          f"E/N = {e_total[0] / n:.5f} -> {e_total[-1] / n:.5f}")
    say(f"  mean kT = {temps.mean():.4f} +- {sem(temps):.4f}, "
          f"mean U/N = {u_per_atom.mean() + u_tail:.4f} +- {sem(u_per_atom):.4f}"
          + (f" (tail {u_tail:+.4f} included)" if u_tail else ""))
    say(f"  mean pressure = {p_frames.mean() + p_tail:.4f} +- {sem(p_frames):.4f} "
          + (f"(tail correction {p_tail:+.4f} included)" if args.tail_correction
             else "(no tail correction; --tail-correction adds "
                  f"{tail_pressure(args.density, args.r_cut):+.4f})"))
    say(f"  total momentum: max change {np.abs(momentum - momentum[0]).max():.1e} "
          f"(start {np.abs(momentum[0]).max():.1e})")
    most = (f"most atoms in a cell {int(traj.neighbors.max_cell_occupancy)}" if cells
            else f"most neighbours seen {int(traj.neighbors.max_neighbors)}")
    say(f"  {'cells' if cells else 'neighbour list'}: {n_builds} rebuilds "
          f"({args.steps / max(n_builds, 1):.1f} steps per rebuild), "
          f"{int(traj.stats['n_reallocations'])} reallocations, capacity "
          f"{traj.neighbors.capacity}, {most}"
          + (f", missed pairs {int(traj.neighbors.missed_pairs)}" if args.debug else ""))
    if steps_run:
        say(f"  {steps_run} steps in {seconds:.2f} s: {n * steps_run / seconds:,.0f} "
            f"atom-steps/s ({steps_run / seconds:,.0f} steps/s)"
            + (f"; steps 0-{args.resumed_at} came from the checkpoint" if resumed else ""))
    else:
        say(f"  no steps run: the checkpoint held the finished run ({seconds:.2f} s to load)")

    # g(r) from at most 50 frames of the production run.
    stride = max(1, len(traj.times) // 50)
    r, g = sp.radial_distribution(traj.positions[::stride], space, r_max=box / 2, n_bins=150)
    r, g = np.asarray(r), np.asarray(g)
    say(f"  g(r): first peak {g.max():.2f} at r = {r[np.argmax(g)]:.3f}")

    if args.out:
        cli.save_result(args.out, dict(potential="lennard_jones", r_cut=args.r_cut,
                                       shift=args.shift, density=args.density, kT=args.kT,
                                       dt=args.dt, seed=args.seed, x64=args.x64,
                                       integrator="VelocityVerlet", box=float(box)),
                        trajectory=traj, box=space, times=times,
                        positions=np.asarray(traj.positions),
                        velocities=np.asarray(traj.velocities), total_energy=e_total,
                        potential_energy=u_per_atom * n, pressure=p_frames, r=r, g=g,
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(17, 5))
        ke = np.asarray(traj.kinetic_energy, np.float64) / n
        for values, label, lw in ((e_total / n, "total E", 1.5), (u_per_atom, "potential U", 0.8),
                                  (ke, "kinetic K", 0.8)):
            ax0.plot(times, values - values.mean(), label=f"{label} (mean {values.mean():.3f})",
                     lw=lw)
        ax0.set(xlabel="t [τ]", ylabel="energy per atom minus its mean [ε]",
                title=f"NVE, {n} atoms, dt={args.dt}, {traj.positions.dtype}")
        ax0.legend()
        ax1.plot(times, (e_total - e_total[0]) / n)
        ax1.axhline(0.0, color="k", lw=0.5)
        ax1.set(xlabel="t [τ]", ylabel="(E(t) - E(0)) / N [ε]",
                title=f"Energy conservation (shift={args.shift}, skin={args.skin})")
        ax2.plot(r, g)
        ax2.axhline(1.0, color="k", lw=0.5)
        ax2.set(xlabel="r [σ]", ylabel="g(r)",
                title=f"Radial distribution, density {args.density}, kT ~ {temps.mean():.3f}")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    # the settling call compiled the chunk that production reuses: its time less the
    # production rate for its steps estimates the compile time
    compile_s = max(0.0, settle_s - chunk * seconds / steps_run) if steps_run else None
    cli.summary(f"lj_fluid: {n} atoms, {args.equil_steps} Langevin + {args.steps} NVE steps"
                + (f" ({steps_run} run now, resumed at step {args.resumed_at})"
                   if resumed else "") + f", {traj.positions.dtype}",
                compile_s=compile_s, run_s=seconds,
                result=f"NVE energy drift max |dE|/N {drift_max:.1e}, kT {temps.mean():.3f}, "
                f"P {p_frames.mean() + p_tail:.3f}")


if __name__ == "__main__":
    main()
