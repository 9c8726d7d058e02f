"""Damped driven pendulum: a phase portrait, and a bifurcation diagram as one vmap ensemble.

    theta'' = -sin(theta) - gamma theta' + A cos(Omega t)

in units where g/L = 1 (time in units of 1/omega_0, omega_0 = sqrt(g/L)), with Baker and
Gollub's gamma = 0.5, Omega = 2/3 (Chaotic Dynamics, 2nd ed., Cambridge 1996, ch. 3).
Every drive amplitude A of the bifurcation diagram is one member of a single ``jax.vmap``
over fixed-step RK4 solves (dt = drive period / --steps-per-period); after --transient
drive periods the angular velocity is sampled once per period (a Poincaré section) for
--periods periods: one point per period for a period-1 orbit, two for period 2, a smear
when the motion is chaotic. The phase portrait shows one amplitude (--amplitude). As a
check outside simlib, the stroboscopic samples of the amplitude --check-amplitude (a
periodic orbit) are compared with scipy's DOP853 at rtol 1e-11.

    python examples/pendulum.py --plot out/pendulum.png
    simlib run pendulum --n 600 --plot out/pendulum.png
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib.systems import damped_driven_pendulum

GAMMA, OMEGA = 0.5, 2.0 / 3.0
PERIOD = 2 * np.pi / OMEGA


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n", type=cli.positive_int, default=300,
                   help="drive amplitudes in the bifurcation diagram (ensemble size)")
    p.add_argument("--a-min", type=cli.finite_float, default=0.9, help="smallest amplitude A")
    p.add_argument("--a-max", type=cli.finite_float, default=1.5, help="largest amplitude A")
    p.add_argument("--amplitude", type=cli.finite_float, default=1.15,
                   help="amplitude A of the phase portrait (1.15: chaotic)")
    p.add_argument("--check-amplitude", type=cli.finite_float, default=1.35,
                   help="amplitude compared with scipy (1.35: a period-1 orbit)")
    p.add_argument("--steps-per-period", type=cli.positive_int, default=100,
                   help="RK4 steps per drive period (dt = 2 pi / Omega / this)")
    p.add_argument("--transient", type=cli.nonnegative_int, default=200,
                   help="drive periods discarded before sampling")
    p.add_argument("--periods", type=cli.positive_int, default=100,
                   help="drive periods sampled (Poincaré points per amplitude)")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if not args.a_min < args.a_max:
        p.error(f"argument --a-max: must be above --a-min ({args.a_min:g}), got {args.a_max:g}")
    if args.steps_per_period < 8:
        p.error(f"argument --steps-per-period: must be at least 8, got {args.steps_per_period}")
    return args


def wrap(theta):
    return (theta + np.pi) % (2 * np.pi) - np.pi


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    dt = PERIOD / args.steps_per_period
    total = args.transient + args.periods
    t1 = total * PERIOD
    strobe = np.arange(args.transient + 1, total + 1) * PERIOD  # the Poincaré section
    fine = np.linspace(args.transient * PERIOD, t1, args.periods * 40 + 1)
    y0 = jnp.array([0.2, 0.0])
    amplitudes = np.concatenate([np.linspace(args.a_min, args.a_max, args.n),
                                 [args.amplitude, args.check_amplitude]])

    def ensemble(amplitudes, y0):
        def one(a):
            sol = sl.solve(damped_driven_pendulum, y0, 0.0, t1, solver=sl.RK4(), dt=dt,
                           args=(1.0, 1.0, GAMMA, a, OMEGA), saveat=sl.SaveAt(ts=strobe),
                           max_steps=total * args.steps_per_period + 8)
            return sol.ys

        return jax.vmap(one)(amplitudes)

    ys, compile_s, run_s = cli.timed(ensemble, jnp.asarray(amplitudes), y0)
    ys = np.asarray(ys)
    portrait = np.asarray(sl.solve(
        damped_driven_pendulum, y0, 0.0, t1, solver=sl.RK4(), dt=dt,
        args=(1.0, 1.0, GAMMA, args.amplitude, OMEGA), saveat=sl.SaveAt(ts=fine),
        max_steps=total * args.steps_per_period + 8).ys)

    # the check: scipy DOP853 on the same problem, at the same stroboscopic times
    from scipy.integrate import solve_ivp

    def rhs(t, y):
        return [y[1], -np.sin(y[0]) - GAMMA * y[1] + args.check_amplitude * np.cos(OMEGA * t)]

    ref = solve_ivp(rhs, (0.0, t1), np.asarray(y0), method="DOP853", t_eval=strobe,
                    rtol=1e-11, atol=1e-11).y.T
    check = ys[-1]
    gap = float(np.max(np.abs(check[:, 1] - ref[:, 1])))
    gap_theta = float(np.max(np.abs(wrap(check[:, 0] - ref[:, 0]))))

    # distinct Poincaré points per amplitude (rounded): 1 = period 1, 2 = period 2, many = chaos
    omegas = ys[: args.n, :, 1]
    distinct = np.array([len(np.unique(np.round(w, 3))) for w in omegas])
    n_chaotic = int(np.sum(distinct > 16))
    say = cli.printer(args.quiet)
    for label, lo, hi in (("period 1", 1, 1), ("period 2", 2, 2), ("period 3-16", 3, 16)):
        say(f"{label:12s} {int(np.sum((distinct >= lo) & (distinct <= hi))):5d} amplitudes")
    say(f"{'chaotic':12s} {n_chaotic:5d} amplitudes (more than 16 distinct points)")
    if args.out:
        cli.save_result(args.out, dict(system="damped_driven_pendulum", gamma=GAMMA,
                                       Omega=OMEGA, dt=dt, solver="RK4"),
                        amplitudes=amplitudes[: args.n], strobe_times=strobe,
                        poincare=ys[: args.n], portrait_t=fine, portrait=portrait, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(13, 5))
        th = wrap(portrait[:, 0])
        jump = np.abs(np.diff(th)) > np.pi  # do not draw a line across the wrap
        th_line = np.where(np.concatenate([[False], jump]), np.nan, th)
        ax0.plot(th_line, portrait[:, 1], lw=0.3, color="0.4", label="trajectory")
        pts = ys[args.n]
        ax0.plot(wrap(pts[:, 0]), pts[:, 1], ".", ms=4, color="C3",
                 label="once per drive period (Poincaré)")
        ax0.set(xlabel=r"angle $\theta$ [rad]", ylabel=r"angular velocity $\dot\theta$ "
                r"[$\omega_0$]", xlim=(-np.pi, np.pi),
                title=f"Phase portrait, A = {args.amplitude:g} (periods "
                f"{args.transient}-{total})")
        ax0.legend(loc="upper right", fontsize=8)
        a = np.repeat(amplitudes[: args.n], args.periods)
        ax1.plot(a, omegas.ravel(), ",", color="k", alpha=0.5)
        ax1.axvline(args.amplitude, color="C3", lw=0.8, ls="--", label="phase portrait A")
        ax1.set(xlabel="drive amplitude A [$\\omega_0^2$]",
                ylabel=r"$\dot\theta$ once per drive period [$\omega_0$]",
                title=f"Bifurcation diagram ({args.n} amplitudes, one vmap)")
        ax1.legend(loc="upper left", fontsize=8)
        fig.suptitle(r"$\ddot\theta = -\sin\theta - \gamma\dot\theta + A\cos\Omega t$, "
                     rf"$\gamma$ = {GAMMA}, $\Omega$ = 2/3, RK4 dt = T/{args.steps_per_period}")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"pendulum: {args.n} amplitudes in [{args.a_min:g}, {args.a_max:g}], RK4 "
                f"{total * args.steps_per_period} steps each", compile_s=compile_s,
                run_s=run_s, result=f"{n_chaotic} chaotic; A = {args.check_amplitude:g} vs "
                f"scipy DOP853: max |d theta'| {gap:.1e}, |d theta| {gap_theta:.1e}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
