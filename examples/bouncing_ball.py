"""A bouncing ball: a state-changing event, its bounce times against the closed form.

A ball dropped from height h0 (velocity v0) falls under gravity g; when its height crosses
zero going down, an event reverses its velocity with restitution e (v -> -e v), and the
run continues. The impact times have a closed form: the first impact at
t_1 = (v0 + sqrt(v0^2 + 2 g h0)) / g with speed u = g t_1 - v0; after the k-th bounce
the ball leaves with e^k u and flies 2 e^k u / g, so t_{k+1} = t_k + 2 e^k u / g. The
bounces accumulate at t_1 + 2 u e / (g (1 - e)) (Zeno): the run stops before that.

    python examples/bouncing_ball.py --restitution 0.8 --bounces 8 --plot out/ball.png
"""

from __future__ import annotations

import argparse
import math

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl


def ball(t, y, g):
    """Height and vertical velocity: ``y = [z, v]``, ``args = g``."""
    return jnp.stack([y[1], -g + 0.0 * y[0]])


def closed_form(h0: float, v0: float, g: float, e: float, n: int) -> np.ndarray:
    t = [(v0 + math.sqrt(v0**2 + 2 * g * h0)) / g]
    u = g * t[0] - v0
    for k in range(1, n):
        t.append(t[-1] + 2 * e**k * u / g)
    return np.array(t)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--height", type=float, default=1.0, help="initial height h0 [m]")
    parser.add_argument("--velocity", type=float, default=0.0,
                        help="initial vertical velocity v0 [m/s]")
    parser.add_argument("--gravity", type=float, default=9.81, help="g [m/s^2]")
    parser.add_argument("--restitution", type=float, default=0.8,
                        help="restitution coefficient e, in (0, 1)")
    parser.add_argument("--bounces", type=int, default=8, help="bounces to simulate")
    parser.add_argument("--solver", choices=["Tsit5", "Dopri5", "Dopri8"], default="Tsit5",
                        help="adaptive solver")
    parser.add_argument("--rtol", type=float, default=1e-10, help="relative tolerance")
    parser.add_argument("--plot", default=None,
                        help="write a figure of the height to this path (PNG); none if unset")
    args = parser.parse_args(argv)
    if args.height < 0 or args.gravity <= 0 or not 0 < args.restitution < 1:
        parser.error("need --height >= 0, --gravity > 0 and 0 < --restitution < 1")
    if args.bounces < 1 or not 0 < args.rtol < 1:
        parser.error("need --bounces >= 1 and 0 < --rtol < 1")
    if args.height == 0 and args.velocity <= 0:
        parser.error("the ball starts on the floor: give --velocity > 0")

    jax.config.update("jax_enable_x64", True)
    g, e, n = args.gravity, args.restitution, args.bounces
    ref = closed_form(args.height, args.velocity, g, e, n + 1)
    t_end = 0.5 * (ref[n - 1] + ref[n])  # between the n-th and the (n+1)-th bounce

    floor = sl.Event(lambda t, y, g: y[0], terminal=False, direction=-1,
                     apply=lambda t, y, g: jnp.stack([y[0], -e * y[1]]), capacity=n)
    ts = jnp.linspace(0.0, t_end, 1000)
    sol = sl.solve(ball, jnp.array([args.height, args.velocity]), 0.0, t_end,
                   solver=getattr(sl, args.solver)(), rtol=args.rtol, atol=args.rtol * 1e-2,
                   args=g, events=floor, saveat=sl.SaveAt(ts=ts))
    rec = sol.events[0]
    got = np.asarray(rec.ts)
    print(f"{int(rec.count)} bounces, {int(sol.stats['num_steps'])} steps "
          f"({args.solver}, rtol {args.rtol:g})")
    print(f"{'k':>3} {'simlib t_k':>20} {'closed form':>20} {'error':>10}")
    for k in range(n):
        print(f"{k + 1:>3} {got[k]:>20.15f} {ref[k]:>20.15f} {got[k] - ref[k]:>10.2e}")
    print(f"max |error| = {np.max(np.abs(got - ref[:n])):.2e} s")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(np.asarray(ts), np.asarray(sol.ys[:, 0]), lw=1.2, label="simlib")
        ax.plot(ref[:n], np.zeros(n), "o", ms=4, label="closed-form impacts")
        ax.set_xlabel("t [s]")
        ax.set_ylabel("height [m]")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
