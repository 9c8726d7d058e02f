"""Direct-sum gravity: a Plummer sphere or the figure-eight three-body orbit, velocity Verlet.

Every pair interacts (``pair_energy(gravity, free())``, no cutoff, visited in tiles), with
Plummer softening. Prints the relative energy error and the change in total momentum and
angular momentum, which velocity Verlet conserves to round-off, and plots the orbits
(x-y projection) and the energy error against time.

    python examples/gravity.py --system figure8 --plot out/gravity.png
    python examples/gravity.py --system plummer --n 256 --steps 5000 --plot out/plummer.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from simlib import cli
from simlib import particles as sp

# Chenciner & Montgomery, Ann. Math. 152, 881 (2000): three equal masses chasing each other
# on one figure-eight curve (G = m = 1); the digits are Simo's, as quoted there.
FIGURE8_X = [[0.97000436, -0.24308753], [-0.97000436, 0.24308753], [0.0, 0.0]]
FIGURE8_V3 = [-0.93240737, -0.86473146]
FIGURE8_PERIOD = 6.32591398

DEFAULTS = {  # per system: n, steps, dt, softening
    "figure8": dict(n=3, steps=20_000, dt=1e-3, softening=0.0),
    "plummer": dict(n=256, steps=5_000, dt=2e-3, softening=0.01),
}


def initial_state(system: str, n: int, seed: int):
    """``(positions, velocities, masses)`` of the chosen system (G = 1)."""
    if system == "figure8":
        x = jnp.asarray(FIGURE8_X)
        v3 = jnp.asarray(FIGURE8_V3)
        v = jnp.stack([-0.5 * v3, -0.5 * v3, v3])
        return x, v, jnp.ones(3)
    # Plummer sphere, total mass 1, scale radius 1, in virial equilibrium.
    return sp.plummer(n, key=jax.random.key(seed))


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--system", choices=sorted(DEFAULTS), default="figure8",
                   help="figure8: the periodic three-body orbit; plummer: a star cluster")
    p.add_argument("--n", type=cli.positive_int,
                   help="bodies in the Plummer sphere (>= 2; default 256)")
    p.add_argument("--steps", type=cli.positive_int,
                   help="number of steps (default 20000 for figure8, 5000 for plummer)")
    p.add_argument("--dt", type=cli.positive_float,
                   help="time step (default 1e-3 for figure8, 2e-3 for plummer)")
    p.add_argument("--softening", type=cli.nonnegative_float,
                   help="Plummer softening length (default 0 for figure8, 0.01 for plummer)")
    p.add_argument("--save-every", type=cli.positive_int, default=20,
                   help="steps between saved frames (must divide --steps)")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed for the Plummer sphere")
    cli.add_output_options(p, x64=True)
    args = p.parse_args(argv)
    for name, value in DEFAULTS[args.system].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.system == "figure8" and args.n != 3:
        p.error("argument --n: is for --system plummer (the figure eight has 3 bodies)")
    if args.n < 2:
        p.error(f"argument --n: must be at least 2, got {args.n}")
    if args.steps % args.save_every:
        p.error(f"argument --save-every: must divide --steps ({args.steps}), got "
                f"{args.save_every}")
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    x, v, m = initial_state(args.system, args.n, args.seed)
    n, d = x.shape
    space = sp.free()
    energy = sp.pair_energy(sp.gravity, space)                # all pairs, tiled; no cutoff
    params = dict(G=1.0, softening=args.softening, masses=m)
    state = sp.State(x, v, m)

    def run(state, params):
        return sp.simulate(energy, state, params, space=space, dt=args.dt, n_steps=args.steps,
                           save_every=args.save_every)

    traj, compile_s, seconds = cli.timed(run, state, params)

    e = np.asarray(traj.total_energy, np.float64)
    rel = np.abs(e - e[0]) / abs(e[0])
    p = np.asarray(sp.total_momentum(traj.velocities, m), np.float64)
    ang = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, m), np.float64)
    ang = ang.reshape(len(ang), -1)
    k0, u0 = float(traj.kinetic_energy[0]), float(traj.potential_energy[0])
    k1, u1 = float(traj.kinetic_energy[-1]), float(traj.potential_energy[-1])
    t_end = args.steps * args.dt
    say = cli.printer(args.quiet)
    say(f"{args.system}: {n} bodies in {d}D, softening {args.softening}, {x.dtype}; "
          f"{args.steps} velocity-Verlet steps of dt={args.dt} (t = {t_end:g})")
    say(f"  energy E0 = {e[0]:.10f}; relative error max {rel.max():.2e}, final {rel[-1]:.2e}")
    say(f"  total momentum: max change {np.abs(p - p[0]).max():.2e} (|P0| = "
          f"{np.linalg.norm(p[0]):.1e}); angular momentum: max change "
          f"{np.abs(ang - ang[0]).max():.2e} (|L0| = {np.linalg.norm(ang[0]):.3e})")
    say(f"  virial ratio 2K/|U|: {2 * k0 / abs(u0):.3f} at t=0, {2 * k1 / abs(u1):.3f} "
          f"at the end")
    say(f"  {seconds:.2f} s run + {compile_s:.2f} s compile: "
          f"{n * (n - 1) * args.steps / seconds:,.0f} pair interactions/s, "
          f"{args.steps / seconds:,.0f} steps/s")
    closure = ""
    if args.system == "figure8":
        # One period later the bodies are back where they started (orbit closes).
        steps = round(FIGURE8_PERIOD / args.dt)
        final = sp.simulate(energy, state, params, space=space, dt=FIGURE8_PERIOD / steps,
                            n_steps=steps).final
        gap = float(jnp.max(jnp.linalg.norm(final.positions - x, axis=-1)))
        closure = f", orbit closes to {gap:.1e} after one period"
        say(f"  after one period T = {FIGURE8_PERIOD}: max |x(T) - x(0)| = {gap:.2e}")

    if args.out:
        cli.save_result(args.out, dict(system=args.system, G=1.0, dt=args.dt,
                                       softening=args.softening, seed=args.seed,
                                       integrator="VelocityVerlet", x64=args.x64),
                        trajectory=traj,
                        times=np.asarray(traj.times), positions=np.asarray(traj.positions),
                        velocities=np.asarray(traj.velocities), masses=np.asarray(m),
                        total_energy=e, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 5))
        xs = np.asarray(traj.positions, np.float64)
        shown = np.arange(n) if n <= 20 else np.linspace(0, n - 1, 20).astype(int)
        for i in shown:
            ax0.plot(xs[:, i, 0], xs[:, i, 1], lw=0.8)
        ax0.scatter(xs[-1, :, 0], xs[-1, :, 1], s=12 if n <= 20 else 2, c="k", zorder=3,
                    label="final positions")
        if args.system == "plummer":
            lim = 4.0
            ax0.set(xlim=(-lim, lim), ylim=(-lim, lim))
            ax0.set_title(f"Plummer sphere, {n} bodies: {len(shown)} orbits, x-y projection")
        else:
            ax0.set_title("Figure-eight three-body orbit (Chenciner & Montgomery 2000)")
        ax0.set(aspect="equal", xlabel="x", ylabel="y")
        ax0.legend(loc="best")
        ax1.semilogy(np.asarray(traj.times), rel + 1e-17)
        ax1.set(xlabel="t", ylabel="|E(t) - E(0)| / |E(0)|",
                title=f"Energy error, velocity Verlet, dt = {args.dt}, {x.dtype}")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"gravity: {args.system}, {n} bodies, {args.steps} velocity-Verlet steps, "
                f"{x.dtype}", compile_s=compile_s, run_s=seconds,
                result=f"max |dE/E| {rel.max():.1e}, momentum change "
                f"{np.abs(p - p[0]).max():.1e}" + closure)


if __name__ == "__main__":
    main()
