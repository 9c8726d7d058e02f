"""Direct-sum gravity: a Plummer sphere or the figure-eight three-body orbit, velocity Verlet.

Every pair interacts (``pair_energy(gravity, free())``, no cutoff, visited in tiles), with
Plummer softening. Prints the relative energy error and the change in total momentum and
angular momentum, which velocity Verlet conserves to round-off, and plots the orbits
(x-y projection) and the energy error against time.

    python examples/gravity.py --system figure8 --out gravity.png
    python examples/gravity.py --system plummer --n 256 --steps 5000 --out plummer.png
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from simlib import particles as sp  # noqa: E402

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", choices=sorted(DEFAULTS), default="figure8",
                        help="figure8: the periodic three-body orbit; plummer: a star "
                             "cluster (default figure8)")
    parser.add_argument("--n", type=int, help="bodies in the Plummer sphere (default 256)")
    parser.add_argument("--steps", type=int,
                        help="number of steps (default 20000 for figure8, 5000 for plummer)")
    parser.add_argument("--dt", type=float,
                        help="time step (default 1e-3 for figure8, 2e-3 for plummer)")
    parser.add_argument("--softening", type=float,
                        help="Plummer softening length (default 0 for figure8, 0.01 for plummer)")
    parser.add_argument("--save-every", type=int, default=20,
                        help="steps between saved frames (default 20)")
    parser.add_argument("--float32", action="store_true",
                        help="run in float32 (default float64)")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed for the Plummer sphere")
    parser.add_argument("--out", default="gravity.png", help="output figure (PNG)")
    args = parser.parse_args(argv)
    for name, value in DEFAULTS[args.system].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.system == "figure8" and args.n != 3:
        parser.error("--n is for --system plummer (the figure eight has 3 bodies)")
    if args.n < 2 or args.steps < 1 or args.dt <= 0 or args.softening < 0:
        parser.error("need --n >= 2, --steps >= 1, --dt > 0 and --softening >= 0")
    if args.save_every < 1 or args.steps % args.save_every:
        parser.error(f"--steps ({args.steps}) must be a multiple of --save-every "
                     f"({args.save_every})")

    if not args.float32:
        jax.config.update("jax_enable_x64", True)
    x, v, m = initial_state(args.system, args.n, args.seed)
    n, d = x.shape
    space = sp.free()
    energy = sp.pair_energy(sp.gravity, space)                # all pairs, tiled; no cutoff
    params = dict(G=1.0, softening=args.softening, masses=m)
    state = sp.State(x, v, m)

    start = time.perf_counter()
    traj = sp.simulate(energy, state, params, space=space, dt=args.dt, n_steps=args.steps,
                       save_every=args.save_every, progress=True)
    jax.block_until_ready(traj.positions)
    seconds = time.perf_counter() - start

    e = np.asarray(traj.total_energy, np.float64)
    rel = np.abs(e - e[0]) / abs(e[0])
    p = np.asarray(sp.total_momentum(traj.velocities, m), np.float64)
    ang = np.asarray(sp.angular_momentum(traj.positions, traj.velocities, m), np.float64)
    ang = ang.reshape(len(ang), -1)
    k0, u0 = float(traj.kinetic_energy[0]), float(traj.potential_energy[0])
    k1, u1 = float(traj.kinetic_energy[-1]), float(traj.potential_energy[-1])
    t_end = args.steps * args.dt
    print(f"{args.system}: {n} bodies in {d}D, softening {args.softening}, {x.dtype}; "
          f"{args.steps} velocity-Verlet steps of dt={args.dt} (t = {t_end:g})")
    print(f"  energy E0 = {e[0]:.10f}; relative error max {rel.max():.2e}, final {rel[-1]:.2e}")
    print(f"  total momentum: max change {np.abs(p - p[0]).max():.2e} (|P0| = "
          f"{np.linalg.norm(p[0]):.1e}); angular momentum: max change "
          f"{np.abs(ang - ang[0]).max():.2e} (|L0| = {np.linalg.norm(ang[0]):.3e})")
    print(f"  virial ratio 2K/|U|: {2 * k0 / abs(u0):.3f} at t=0, {2 * k1 / abs(u1):.3f} "
          f"at the end")
    print(f"  {seconds:.2f} s including compilation: "
          f"{n * (n - 1) * args.steps / seconds:,.0f} pair interactions/s, "
          f"{args.steps / seconds:,.0f} steps/s")
    if args.system == "figure8":
        # One period later the bodies are back where they started (orbit closes).
        steps = round(FIGURE8_PERIOD / args.dt)
        final = sp.simulate(energy, state, params, space=space, dt=FIGURE8_PERIOD / steps,
                            n_steps=steps).final
        gap = float(jnp.max(jnp.linalg.norm(final.positions - x, axis=-1)))
        print(f"  after one period T = {FIGURE8_PERIOD}: max |x(T) - x(0)| = {gap:.2e}")

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
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
