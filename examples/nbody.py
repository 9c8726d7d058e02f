"""N-body: a Plummer star cluster, direct-sum gravity and velocity Verlet, energy error reported.

A Plummer sphere (G = M = 1, scale radius a = 1, in virial equilibrium; Aarseth, Hénon and
Wielen, A&A 37, 183 (1974)) drawn by ``simlib.particles.plummer``, integrated with every
pair interacting (Plummer-softened gravity, no cutoff) by velocity Verlet. In virial
equilibrium the cluster keeps its shape: the Lagrangian radii (containing 10, 50 and 90 %
of the mass) stay nearly constant, and 2K/|U| stays near 1. The run reports the relative
energy error, which velocity Verlet keeps bounded, and the change of total momentum and
angular momentum, which it conserves to round-off. The crossing time of this model is
about 2.8 (in units of sqrt(a^3 / G M)).

    python examples/nbody.py --plot out/nbody.png
    simlib run nbody --n 1024 --steps 4000 --out out/nbody.npz
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib import particles as sp


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n", type=cli.positive_int, default=512, help="bodies (>= 2)")
    p.add_argument("--steps", type=cli.positive_int, default=2000, help="velocity-Verlet steps")
    p.add_argument("--dt", type=cli.positive_float, default=2e-3, help="time step")
    p.add_argument("--softening", type=cli.nonnegative_float, default=0.01,
                   help="Plummer softening length")
    p.add_argument("--save-every", type=cli.positive_int, default=20,
                   help="steps between saved frames (must divide --steps)")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed of the Plummer sphere")
    cli.add_output_options(p, x64=True)
    args = p.parse_args(argv)
    if args.n < 2:
        p.error(f"argument --n: must be at least 2, got {args.n}")
    if args.steps % args.save_every:
        p.error(f"argument --save-every: must divide --steps ({args.steps}), got "
                f"{args.save_every}")
    return args


def lagrangian_radii(x: np.ndarray, m: np.ndarray, fractions=(0.1, 0.5, 0.9)) -> np.ndarray:
    """Radii around the centre of mass enclosing the given mass fractions, per frame."""
    com = np.einsum("fnd,n->fd", x, m) / m.sum()
    r = np.linalg.norm(x - com[:, None, :], axis=-1)
    order = np.argsort(r, axis=1)
    cum = np.cumsum(m[order], axis=1) / m.sum()
    rs = np.take_along_axis(r, order, axis=1)
    return np.stack([rs[np.arange(len(rs)), np.argmax(cum >= f, axis=1)] for f in fractions],
                    axis=1)


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    x, v, m = sp.plummer(args.n, key=jax.random.key(args.seed))
    space = sp.free()
    energy = sp.pair_energy(sp.gravity, space)  # all pairs, tiled; no cutoff
    params = dict(G=1.0, softening=jnp.asarray(args.softening, x.dtype), masses=m)

    def run(state, params):
        return sp.simulate(energy, state, params, space=space, dt=args.dt,
                           n_steps=args.steps, save_every=args.save_every)

    traj, compile_s, run_s = cli.timed(run, sp.State(x, v, m), params)
    e = np.asarray(traj.total_energy, np.float64)
    rel = np.abs(e - e[0]) / abs(e[0])
    mm = np.asarray(m, np.float64)
    xs = np.asarray(traj.positions, np.float64)
    p_tot = np.asarray(sp.total_momentum(traj.velocities, m), np.float64)
    ang = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, m), np.float64)
    kin, pot = np.asarray(traj.kinetic_energy), np.asarray(traj.potential_energy)
    virial = 2 * kin / np.abs(pot)
    radii = lagrangian_radii(xs, mm)
    t = np.asarray(traj.times)
    say = cli.printer(args.quiet)
    say(f"Plummer sphere: {args.n} bodies, softening {args.softening:g}, {x.dtype}; "
        f"{args.steps} steps of dt = {args.dt:g} (t = {args.steps * args.dt:g})")
    say(f"  energy E0 = {e[0]:.8f}; relative error max {rel.max():.2e}, final {rel[-1]:.2e}")
    say(f"  momentum change {np.abs(p_tot - p_tot[0]).max():.1e}, angular momentum "
        f"change {np.abs(ang - ang[0]).max():.1e}")
    say(f"  2K/|U| {virial[0]:.3f} -> {virial[-1]:.3f}; half-mass radius "
        f"{radii[0, 1]:.3f} -> {radii[-1, 1]:.3f}")
    if args.out:
        cli.save_result(args.out, dict(system="plummer", n=args.n, G=1.0, dt=args.dt,
                                       softening=args.softening, seed=args.seed,
                                       integrator="VelocityVerlet", x64=args.x64),
                        trajectory=traj,
                        times=t, positions=xs, velocities=np.asarray(traj.velocities),
                        masses=mm, kinetic_energy=kin, potential_energy=pot, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(1, 3, figsize=(16, 5))
        ax = axes[0]
        ax.scatter(xs[0, :, 0], xs[0, :, 1], s=2, c="0.6", label="t = 0")
        ax.scatter(xs[-1, :, 0], xs[-1, :, 1], s=2, c="C0", label=f"t = {t[-1]:g}")
        ax.set(aspect="equal", xlim=(-4, 4), ylim=(-4, 4), xlabel="x [a]", ylabel="y [a]",
               title=f"Plummer sphere, {args.n} bodies (x-y projection)")
        ax.legend(loc="upper right", markerscale=4)
        for i, f in enumerate((0.1, 0.5, 0.9)):
            axes[1].plot(t, radii[:, i], color=f"C{i}", label=f"{f:.0%} of the mass")
            # the Plummer model's own: M(r)/M = r^3 / (r^2 + a^2)^(3/2) solved for r
            axes[1].axhline(1 / np.sqrt(f ** (-2 / 3) - 1), color=f"C{i}", ls="--", lw=0.8)
        axes[1].plot([], [], "k--", lw=0.8, label="Plummer model (N → ∞)")
        axes[1].set(xlabel="t [(a³/GM)^½]", ylabel="Lagrangian radius [a]",
                    title="Lagrangian radii (constant in equilibrium)")
        axes[1].legend()
        axes[2].semilogy(t[1:], rel[1:])
        axes[2].set(xlabel="t [(a³/GM)^½]", ylabel="|E(t) - E(0)| / |E(0)|",
                    title=f"Energy error, velocity Verlet, dt = {args.dt:g}")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"nbody: Plummer, {args.n} bodies, {args.steps} velocity-Verlet steps, "
                f"{x.dtype}", compile_s=compile_s, run_s=run_s,
                result=f"max |dE/E| {rel.max():.1e}, 2K/|U| {virial[-1]:.3f}, "
                f"{args.n * (args.n - 1) * args.steps / run_s:.2e} pair interactions/s")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
