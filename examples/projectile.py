"""Aim a projectile with quadratic air drag at a target, by gradient descent through the flight.

Equations of motion (2-D, drag coefficient k per metre, g = 9.81 m/s^2):

    dx/dt = v,    dv/dt = -g e_y - k |v| v.

Find the launch speed and elevation angle such that the projectile is at the target
(D, 0) exactly at time T: minimise |x(T) - (D, 0)|^2 / D^2 over (speed, angle) with
simlib.fit.fit, the gradient taken through a fixed-step RK4 solve over the fixed horizon
[0, T]. The speed is kept positive (Positive()) and the angle in (0, pi/2) (Bounded). The
found launch is then flown again by scipy's solve_ivp (DOP853, rtol 1e-12) as an
independent check of the hit.

    python examples/projectile.py --distance 30 --time 2 --drag 0.02 --plot out/projectile.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib.fit import Bounded, Positive, fit

G = 9.81


def projectile(t, y, k):
    """Point mass with quadratic drag: ``y = [x, z, vx, vz]``, ``args = k`` [1/m]."""
    del t
    v = y[2:]
    speed = jnp.sqrt(jnp.sum(v**2))
    return jnp.concatenate([v, -k * speed * v - jnp.array([0.0, G])])


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--distance", type=cli.positive_float, default=30.0,
                   help="target distance D [m]")
    p.add_argument("--time", type=cli.positive_float, default=2.0, help="time of flight T [s]")
    p.add_argument("--drag", type=cli.nonnegative_float, default=0.02,
                   help="drag coefficient k [1/m]")
    p.add_argument("--dt", type=cli.positive_float, default=0.01, help="RK4 step [s]")
    p.add_argument("--steps", type=cli.positive_int, default=300, help="maximum L-BFGS steps")
    cli.add_output_options(p)
    return p.parse_args(argv)


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import optax
    from scipy.integrate import solve_ivp

    jax.config.update("jax_enable_x64", True)
    target = jnp.array([args.distance, 0.0])

    def launch_state(p):
        v0 = p["speed"] * jnp.array([jnp.cos(p["angle"]), jnp.sin(p["angle"])])
        return jnp.concatenate([jnp.zeros(2), v0])

    def position_at_T(p):
        return sl.solve(projectile, launch_state(p), 0.0, args.time, solver=sl.RK4(),
                        dt=args.dt, args=args.drag).ys[-1, :2]

    def loss(p):
        return jnp.sum((position_at_T(p) - target) ** 2) / args.distance**2

    # start from the drag-free launch speed, thrown at 45 degrees
    vx, vz = args.distance / args.time, G * args.time / 2
    p0 = {"speed": float(np.hypot(vx, vz)), "angle": np.pi / 4}
    res = fit(loss, p0, optimizer=optax.lbfgs(), steps=args.steps, chunk=10, tol=1e-14,
              transforms={"speed": Positive(), "angle": Bounded(0.0, np.pi / 2)},
              progress=not args.quiet)
    say = cli.printer(args.quiet)
    speed, angle = float(res.params["speed"]), float(res.params["angle"])
    miss = np.asarray(position_at_T(res.params) - target)
    say(f"fit (L-BFGS through RK4, dt={args.dt}): {res.message}")
    say(f"  launch speed {speed:.6f} m/s at {np.degrees(angle):.5f} deg "
          f"(vx = {speed * np.cos(angle):.5f}, vz = {speed * np.sin(angle):.5f} m/s)")
    say(f"  drag-free launch for comparison: {np.hypot(vx, vz):.4f} m/s at "
          f"{np.degrees(np.arctan2(vz, vx)):.4f} deg")
    say(f"  simlib miss at T: ({miss[0]:.2e}, {miss[1]:.2e}) m")

    def rhs(t, y):
        v = y[2:]
        return np.concatenate([v, -args.drag * np.hypot(*v) * v - [0.0, G]])

    y0 = [0.0, 0.0, speed * np.cos(angle), speed * np.sin(angle)]
    ref = solve_ivp(rhs, (0.0, args.time), y0, method="DOP853", rtol=1e-12, atol=1e-12,
                    dense_output=True)
    hit = ref.y[:2, -1]
    say(f"  scipy solve_ivp (DOP853) of the same launch lands at ({hit[0]:.8f}, "
          f"{hit[1]:.2e}) m: miss {np.hypot(hit[0] - args.distance, hit[1]):.2e} m")

    scipy_miss = float(np.hypot(hit[0] - args.distance, hit[1]))
    if args.out:
        cli.save_result(args.out, dict(drag=args.drag, dt=args.dt, g=G),
                        speed=speed, angle=angle, target=np.asarray(target),
                        simlib_miss=miss, scipy_hit=hit, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fine = np.linspace(0.0, args.time, 300)
        path = ref.sol(fine)
        free = np.stack([vx * fine, vz * fine - 0.5 * G * fine**2])
        free_drag = solve_ivp(rhs, (0.0, args.time), [0.0, 0.0, vx, vz], method="DOP853",
                              rtol=1e-10, atol=1e-10, dense_output=True).sol(fine)
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.plot(path[0], path[1], "-", color="C3", label="found launch, with drag (scipy)")
        ax.plot(free_drag[0], free_drag[1], "--", color="0.5",
                label="drag-free aim, flown with drag")
        ax.plot(free[0], free[1], ":", color="C0", label="drag-free aim, no drag")
        ax.plot([args.distance], [0.0], "kx", ms=10, label=f"target at T = {args.time} s")
        ax.axhline(0.0, color="0.8", lw=0.8)
        ax.set(xlabel="x [m]", ylabel="height [m]",
               title=f"speed {speed:.3f} m/s, angle {np.degrees(angle):.3f} deg, k = {args.drag}/m")
        ax.legend(fontsize=8)
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"projectile: aim at {args.distance:g} m in {args.time:g} s, k = {args.drag:g}/m, "
                "L-BFGS through RK4", compile_s=res.compile_time, run_s=res.run_time,
                result=f"{speed:.4f} m/s at {np.degrees(angle):.4f} deg; miss flown by scipy "
                f"DOP853 {scipy_miss:.1e} m")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
