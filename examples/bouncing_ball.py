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

import math

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli


def ball(t, y, g):
    """Height and vertical velocity: ``y = [z, v]``, ``args = g``."""
    return jnp.stack([y[1], -g + 0.0 * y[0]])


def closed_form(h0: float, v0: float, g: float, e: float, n: int) -> np.ndarray:
    t = [(v0 + math.sqrt(v0**2 + 2 * g * h0)) / g]
    u = g * t[0] - v0
    for k in range(1, n):
        t.append(t[-1] + 2 * e**k * u / g)
    return np.array(t)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--height", type=cli.nonnegative_float, default=1.0,
                   help="initial height h0 [m]")
    p.add_argument("--velocity", type=cli.finite_float, default=0.0,
                   help="initial vertical velocity v0 [m/s]")
    p.add_argument("--gravity", type=cli.positive_float, default=9.81, help="g [m/s^2]")
    p.add_argument("--restitution", type=cli.positive_float, default=0.8,
                   help="restitution coefficient e, in (0, 1)")
    p.add_argument("--bounces", type=cli.positive_int, default=8, help="bounces to simulate")
    p.add_argument("--solver", choices=["Tsit5", "Dopri5", "Dopri8"], default="Tsit5",
                   help="adaptive solver")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-10,
                   help="relative tolerance, in (0, 1); atol = rtol / 100")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if not args.restitution < 1:
        p.error(f"argument --restitution: must be below 1, got {args.restitution:g}")
    if args.height == 0 and args.velocity <= 0:
        p.error("argument --velocity: the ball starts on the floor: give --velocity > 0")
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    g, e, n = args.gravity, args.restitution, args.bounces
    ref = closed_form(args.height, args.velocity, g, e, n + 1)
    t_end = 0.5 * (ref[n - 1] + ref[n])  # between the n-th and the (n+1)-th bounce

    floor = sl.Event(lambda t, y, g: y[0], terminal=False, direction=-1,
                     apply=lambda t, y, g: jnp.stack([y[0], -e * y[1]]), capacity=n)
    ts = np.linspace(0.0, t_end, 1000)

    def run(y0, g):
        sol = sl.solve(ball, y0, 0.0, t_end, solver=getattr(sl, args.solver)(), rtol=args.rtol,
                       atol=args.rtol * 1e-2, args=g, events=floor, saveat=sl.SaveAt(ts=ts))
        return sol.ys, sol.events[0].ts, sol.events[0].count, sol.stats["num_steps"]

    (ys, got, count, num_steps), compile_s, run_s = cli.timed(
        run, jnp.array([args.height, args.velocity]), g)
    got, ys = np.asarray(got), np.asarray(ys)
    err = np.max(np.abs(got - ref[:n]))
    say = cli.printer(args.quiet)
    say(f"{int(count)} bounces, {int(num_steps)} steps "
          f"({args.solver}, rtol {args.rtol:g})")
    say(f"{'k':>3} {'simlib t_k':>20} {'closed form':>20} {'error':>10}")
    for k in range(n):
        say(f"{k + 1:>3} {got[k]:>20.15f} {ref[k]:>20.15f} {got[k] - ref[k]:>10.2e}")
    say(f"max |error| = {err:.2e} s")

    if args.out:
        cli.save_result(args.out, dict(g=g, restitution=e, solver=args.solver,
                                       rtol=args.rtol), ts=ts, ys=ys, impact_times=got,
                        closed_form=ref[:n], quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.plot(ts, ys[:, 0], lw=1.2, label="simlib")
        ax.plot(ref[:n], np.zeros(n), "o", ms=4, label="closed-form impacts")
        ax.set_xlabel("t [s]")
        ax.set_ylabel("height [m]")
        ax.legend()
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"bouncing_ball: {n} bounces, {args.solver} rtol {args.rtol:g}, events",
                compile_s=compile_s, run_s=run_s,
                result=f"impact times vs closed form: max |error| {err:.1e} s")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
