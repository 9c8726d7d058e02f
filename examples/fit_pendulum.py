"""Recover a damped pendulum's length and damping rate from noisy angle measurements.

theta'' = -(g / L) sin(theta) - gamma theta' (simlib.systems.damped_driven_pendulum with no
drive, g = 9.81 known). Only the angle is observed (mask=[True, False]); the angular
velocity is never measured. fit() with its default optimiser, optax.adam(1e-2), works on
log L and log gamma (Positive transforms) and reports Gauss-Newton standard errors.

    python examples/fit_pendulum.py --plot out/fit_pendulum.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib.fit import Positive, fit, mse_loss, trajectory_residuals
from simlib.systems import damped_driven_pendulum

G = 9.81


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--length", type=cli.positive_float, default=1.0, help="true length L [m]")
    p.add_argument("--gamma", type=cli.positive_float, default=0.3,
                   help="true damping rate [1/s]")
    p.add_argument("--theta0", type=cli.finite_float, default=1.0, help="release angle [rad]")
    p.add_argument("--t1", type=cli.positive_float, default=10.0,
                   help="observation window [s]")
    p.add_argument("--points", type=cli.positive_int, default=101,
                   help="number of angle readings (>= 3)")
    p.add_argument("--noise", type=cli.positive_float, default=0.01, help="angle noise [rad]")
    p.add_argument("--seed", type=cli.seed, default=2, help="PRNG seed of the noise")
    p.add_argument("--guess", type=cli.positive_float, nargs=2, default=[1.2, 0.4],
                   metavar=("L0", "GAMMA0"), help="initial guess")
    p.add_argument("--steps", type=cli.positive_int, default=3000, help="maximum adam steps")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if args.points < 3:
        p.error(f"argument --points: must be at least 3, got {args.points}")
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    ts = jnp.linspace(0.0, args.t1, args.points)
    y0 = jnp.array([args.theta0, 0.0])

    def trajectory(p, **kw):
        kw = kw or dict(solver=sl.Tsit5(), dt=0.01)
        return sl.solve(damped_driven_pendulum, y0, 0.0, args.t1,
                        args=(G, p["L"], p["gamma"], 0.0, 0.0), saveat=sl.SaveAt(ts=ts),
                        **kw).ys

    true = {"L": args.length, "gamma": args.gamma}
    clean = trajectory(true, solver=sl.Dopri8(), rtol=1e-12, atol=1e-12)
    obs = clean + args.noise * jax.random.normal(jax.random.key(args.seed), clean.shape)
    mask = np.array([True, False])  # the angle is read, the angular velocity is not

    def loss(p):
        return mse_loss(trajectory(p), obs, sigma=args.noise, mask=mask)

    def residuals(p):
        return trajectory_residuals(trajectory(p), obs, sigma=args.noise, mask=mask)

    p0 = {"L": args.guess[0], "gamma": args.guess[1]}
    res = fit(loss, p0, steps=args.steps, tol=1e-10, transforms=Positive(),
              residuals=residuals, stderr=True, progress=not args.quiet)
    say = cli.printer(args.quiet)
    say(f"fit (adam 1e-2 on log-parameters): {res.message}; compile "
          f"{res.compile_time:.2f} s, run {res.run_time:.2f} s")
    say(f"  loss {res.history[0]:.4g} -> {res.loss:.5g} (weighted MSE; ~1 at the noise level)")
    for k, unit in (("L", "m"), ("gamma", "1/s")):
        est, se = float(res.params[k]), float(res.stderr[k])
        say(f"  {k:5s} true {true[k]:.4f}  start {p0[k]:.4f}  estimate {est:.5f} +- {se:.5f} "
              f"{unit}  (error {(est - true[k]) / true[k]:+.3%}, {abs(est - true[k]) / se:.2f} se)")
    say(f"  correlation(L, gamma) = {res.correlation[0, 1]:+.3f}")

    if args.out:
        cli.save_result(args.out, dict(system="damped_pendulum", g=G, noise=args.noise,
                                       seed=args.seed),
                        L=float(res.params["L"]), gamma=float(res.params["gamma"]),
                        L_stderr=float(res.stderr["L"]),
                        gamma_stderr=float(res.stderr["gamma"]), ts=np.asarray(ts),
                        observed=np.asarray(obs), history=np.asarray(res.history), quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fine = jnp.linspace(0.0, args.t1, 800)
        fitted = sl.solve(damped_driven_pendulum, y0, 0.0, args.t1, solver=sl.Tsit5(), rtol=1e-10,
                          atol=1e-10, args=(G, res.params["L"], res.params["gamma"], 0.0, 0.0),
                          saveat=sl.SaveAt(ts=fine)).ys
        start = sl.solve(damped_driven_pendulum, y0, 0.0, args.t1, solver=sl.Tsit5(), rtol=1e-10,
                         atol=1e-10, args=(G, p0["L"], p0["gamma"], 0.0, 0.0),
                         saveat=sl.SaveAt(ts=fine)).ys
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
        ax0.plot(ts, obs[:, 0], "o", ms=3, label="observed angle")
        ax0.plot(fine, start[:, 0], "--", lw=1, color="0.5", label="initial guess")
        ax0.plot(fine, fitted[:, 0], "-", lw=1.2, color="C3", label="fit")
        ax0.set(xlabel="t [s]", ylabel="theta [rad]",
                title=f"L = {float(res.params['L']):.4f} m, "
                f"gamma = {float(res.params['gamma']):.4f}/s")
        ax0.legend(fontsize=8)
        ax1.semilogy(res.history)
        ax1.set(xlabel="adam step", ylabel="weighted MSE", title="loss")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"fit_pendulum: {args.points} angle readings, adam", compile_s=res.compile_time,
                run_s=res.run_time,
                result=f"L {float(res.params['L']):.4f}±{float(res.stderr['L']):.1e} m "
                f"(true {args.length:g}), gamma {float(res.params['gamma']):.4f}"
                f"±{float(res.stderr['gamma']):.1e}/s (true {args.gamma:g}); "
                f"loss {float(res.loss):.3g}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
