"""Lorenz attractor: an ensemble of nearby trajectories, integrated with adaptive Tsit5.

Shows adaptive stepping, dense output at save times, and an ensemble run with ``jax.vmap``.
``--plot`` draws the attractor and how fast nearby members separate; ``--out`` saves the
ensemble's trajectories (times, states) to a .npz/.h5 file.

    python examples/lorenz.py --members 64 --t1 30 --plot out/lorenz.png
    simlib run lorenz --plot out/lorenz.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib.systems import lorenz

PARAMS = (10.0, 28.0, 8.0 / 3.0)  # sigma, rho, beta


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--members", "--n", type=cli.positive_int, default=64,
                   help="ensemble size")
    p.add_argument("--t1", type=cli.positive_float, default=30.0, help="end time")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-8,
                   help="relative tolerance (atol = rtol / 100)")
    p.add_argument("--spread", type=cli.nonnegative_float, default=1e-6,
                   help="initial perturbation size")
    p.add_argument("--saves", type=cli.positive_int, default=3001, help="saved times")
    p.add_argument("--max-steps", type=cli.positive_int, default=100_000,
                   help="step budget per member")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed for the perturbations")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    key = jax.random.key(args.seed)
    y0s = jnp.array([1.0, 1.0, 1.0]) + args.spread * jax.random.normal(key, (args.members, 3))
    ts = np.linspace(0.0, args.t1, args.saves)

    def ensemble(y0s, params):
        def one(y0):
            sol = sl.solve(lorenz, y0, 0.0, args.t1, solver=sl.Tsit5(), rtol=args.rtol,
                           atol=args.rtol * 1e-2, args=params, saveat=sl.SaveAt(ts=ts),
                           max_steps=args.max_steps)
            return sol.ys, sol.stats["num_steps"]

        return jax.vmap(one)(y0s)

    (ys, steps), compile_s, run_s = cli.timed(ensemble, y0s, PARAMS)
    ys = np.asarray(ys)
    spread = np.max(np.linalg.norm(ys - ys[:1], axis=-1), axis=0)
    if args.out:
        cli.save_result(args.out, dict(system="lorenz", solver="Tsit5", rtol=args.rtol,
                                       seed=args.seed, params=PARAMS),
                        ts=ts, ys=ys, y0=np.asarray(y0s), num_steps=np.asarray(steps),
                        quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 5))
        for member in ys[: min(8, args.members)]:
            ax0.plot(member[:, 0], member[:, 2], lw=0.4)
        ax0.set(xlabel="x", ylabel="z", title="Lorenz attractor (Tsit5, adaptive)")
        ax1.semilogy(ts, spread + 1e-300)
        ax1.set(xlabel="t", ylabel="max distance from member 0",
                title="Separation of nearby trajectories (chaos)")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"lorenz: {args.members} members, Tsit5 rtol {args.rtol:g}, t1 = {args.t1:g}",
                compile_s=compile_s, run_s=run_s,
                result=f"{int(steps.min())}-{int(steps.max())} steps per member; members "
                f"{spread[-1]:.3g} apart at t1 (from {args.spread:g})")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
