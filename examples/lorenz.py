"""Lorenz attractor: an ensemble of nearby trajectories, integrated with adaptive Tsit5.

Shows fixed-vs-adaptive stepping, dense output at save times, and an ensemble run with
``jax.vmap``. Writes a plot of the attractor and of how fast nearby members separate.

    python examples/lorenz.py --members 64 --t1 30 --out lorenz.png
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import simlib as sl  # noqa: E402
from simlib.systems import lorenz  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=64, help="ensemble size (default 64)")
    parser.add_argument("--t1", type=float, default=30.0, help="end time (default 30)")
    parser.add_argument("--rtol", type=float, default=1e-8, help="relative tolerance")
    parser.add_argument("--spread", type=float, default=1e-6, help="initial perturbation size")
    parser.add_argument("--seed", type=int, default=0, help="PRNG seed for the perturbations")
    parser.add_argument("--out", default="lorenz.png", help="output figure (PNG)")
    args = parser.parse_args(argv)
    if args.members < 1:
        parser.error(f"--members must be at least 1, got {args.members}")
    if args.t1 <= 0:
        parser.error(f"--t1 must be positive, got {args.t1}")

    jax.config.update("jax_enable_x64", True)
    params = (10.0, 28.0, 8.0 / 3.0)
    key = jax.random.key(args.seed)
    y0s = jnp.array([1.0, 1.0, 1.0]) + args.spread * jax.random.normal(key, (args.members, 3))
    ts = jnp.linspace(0.0, args.t1, 3001)

    @jax.jit
    def ensemble(y0s, params):
        def one(y0):
            sol = sl.solve(lorenz, y0, 0.0, args.t1, solver=sl.Tsit5(), rtol=args.rtol,
                           atol=args.rtol * 1e-2, args=params, saveat=sl.SaveAt(ts=ts),
                           max_steps=100_000)
            return sol.ys, sol.stats["num_steps"]

        return jax.vmap(one)(y0s)

    start = time.perf_counter()
    ys, steps = jax.block_until_ready(ensemble(y0s, params))
    first = time.perf_counter() - start
    start = time.perf_counter()
    ys, steps = jax.block_until_ready(ensemble(y0s, params))
    warm = time.perf_counter() - start
    print(f"{args.members} members to t={args.t1}: {warm * 1e3:.1f} ms warm "
          f"(first call with compilation {first:.2f} s), "
          f"{int(steps.min())}-{int(steps.max())} step attempts per member")

    spread = jnp.max(jnp.linalg.norm(ys - ys[:1], axis=-1), axis=0)
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 5))
    for member in ys[: min(8, args.members)]:
        ax0.plot(member[:, 0], member[:, 2], lw=0.4)
    ax0.set(xlabel="x", ylabel="z", title="Lorenz attractor (Tsit5, adaptive)")
    ax1.semilogy(ts, spread + 1e-300)
    ax1.set(xlabel="t", ylabel="max distance from member 0",
            title="Separation of nearby trajectories (chaos)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
