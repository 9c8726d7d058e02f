"""Fit Lotka-Volterra rates to noisy populations, with standard errors, and check with scipy.

The model: x' = alpha x - beta x y, y' = -gamma y + delta x y (prey x, predators y).
Data: a CSV file given with ``--data`` (columns ``t,x,y`` and a header line; times
increasing, populations positive; examples/data/lotka_volterra.csv is one, made by
examples/data/make_lotka_volterra_csv.py), or, without ``--data``, synthetic data: the
model with (alpha, beta, gamma, delta) = (1.5, 1, 3, 1) from (10, 5), observed at --points
times over [0, 10] with --noise multiplicative noise (PRNG key --seed). The observation
errors are taken to be --noise times the observed values (weighted least squares).
simlib recovers the four rates (and, with ``--data``, the initial populations too) from a
guess --perturb times (1.5, 1, 3, 1), by Levenberg-Marquardt on the residuals
(sl.least_squares, the default) or fit() with an optax optimiser, on log-parameters, with
Jacobians and gradients through simlib.solve, and reports Gauss-Newton standard errors.
The same weighted problem is then solved with scipy.optimize.least_squares over
scipy.integrate.solve_ivp (finite-difference Jacobian), and the optima and wall times are
compared (simlib's compile time is reported separately).

    python examples/fit_lotka_volterra.py --plot out/fit_lotka_volterra.png
    simlib run fit_lotka_volterra --data examples/data/lotka_volterra.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli
from simlib.fit import Positive, fit, least_squares, mse_loss, trajectory_residuals
from simlib.systems import lotka_volterra

TRUE = np.array([1.5, 1.0, 3.0, 1.0])
NAMES = ("alpha", "beta", "gamma", "delta")
Y0 = np.array([10.0, 5.0])
T1 = 10.0


def read_csv(text: str) -> tuple[str, np.ndarray, np.ndarray]:
    """``(path, t, obs)`` from a CSV with a header ``t,x,y``; any problem is one line naming it."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    try:
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            rows = [(reader.line_num, row) for row in reader
                    if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise argparse.ArgumentTypeError(f"{text}: cannot read it as CSV ({err})") from None
    if not rows:
        raise argparse.ArgumentTypeError(f"{text}: the file is empty")
    first, head = rows[0]
    if [cell.strip().lower() for cell in head] != ["t", "x", "y"]:
        raise argparse.ArgumentTypeError(
            f"{text}: line {first} must be the header t,x,y, got {','.join(head)!r}")
    values, lines = [], []
    for line, row in rows[1:]:
        try:
            numbers = [float(cell) for cell in row]
        except ValueError:
            numbers = []
        if len(numbers) != 3 or not all(math.isfinite(v) for v in numbers):
            raise argparse.ArgumentTypeError(
                f"{text}: line {line}: expected three finite numbers t,x,y, got "
                f"{','.join(row)!r}")
        if numbers[1] <= 0 or numbers[2] <= 0:
            raise argparse.ArgumentTypeError(
                f"{text}: line {line}: populations must be positive, got {','.join(row)!r}")
        values.append(numbers)
        lines.append(line)
    if len(values) < 3:
        raise argparse.ArgumentTypeError(f"{text}: need at least 3 observations, got "
                                         f"{len(values)}")
    data = np.array(values)
    if np.any(np.diff(data[:, 0]) <= 0):
        bad = lines[int(np.argmax(np.diff(data[:, 0]) <= 0)) + 1]
        raise argparse.ArgumentTypeError(f"{text}: line {bad}: times must increase")
    return text, data[:, 0], data[:, 1:]


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--data", type=read_csv, default=None, metavar="FILE.csv",
                   help="observations to fit (columns t,x,y with a header); synthetic data "
                   "when not given")
    p.add_argument("--points", type=cli.positive_int, default=50,
                   help="observation times of the synthetic data (>= 3)")
    p.add_argument("--noise", type=cli.positive_float, default=0.01,
                   help="relative noise level: of the synthetic data, and the observation "
                   "error assumed by the weighted fit")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed of the synthetic noise")
    p.add_argument("--perturb", type=cli.positive_float, nargs=4, default=[1.2, 0.85, 0.8, 1.15],
                   metavar="F", help="initial guess as multiples of (1.5, 1, 3, 1)")
    p.add_argument("--optimizer", choices=["lm", "lbfgs", "adam"], default="lm",
                   help="Levenberg-Marquardt on the residuals (sl.least_squares), or fit() "
                   "with optax.lbfgs() or optax.adam(1e-2)")
    p.add_argument("--steps", type=cli.positive_int, default=500,
                   help="maximum optimiser steps")
    p.add_argument("--adaptive", action="store_true",
                   help="adaptive Tsit5 (rtol=atol=1e-10) instead of fixed dt=0.01")
    p.add_argument("--no-scipy", action="store_true", help="skip the scipy comparison")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if args.data is None and args.points < 3:
        p.error(f"argument --points: must be at least 3, got {args.points}")
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    import optax

    jax.config.update("jax_enable_x64", True)
    solve_kw = (dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-10) if args.adaptive
                else dict(solver=sl.Tsit5(), dt=0.01))
    if args.data is not None:
        name, ts_np, obs = args.data
        source = f"{len(ts_np)} observations from {Path(name).name}"
        fit_y0 = True
    else:
        ts_np = np.linspace(0.0, T1, args.points)
        clean = sl.solve(lotka_volterra, jnp.asarray(Y0), 0.0, T1, solver=sl.Dopri8(),
                         rtol=1e-12, atol=1e-12, args=tuple(TRUE),
                         saveat=sl.SaveAt(ts=ts_np)).ys
        noise = jax.random.normal(jax.random.key(args.seed), clean.shape)
        obs = np.asarray(clean * (1.0 + args.noise * noise))
        source = f"{args.points} synthetic observations"
        fit_y0 = False
    t0, t1 = float(ts_np[0]), float(ts_np[-1])
    ts = ts_np  # concrete: solve keeps its static save grid
    sigma = args.noise * np.abs(obs)
    names = NAMES + (("x0", "y0") if fit_y0 else ())
    p0 = TRUE * np.array(args.perturb)
    if fit_y0:
        p0 = np.concatenate([p0, obs[0]])

    def split(p):
        return (p[:4], p[4:]) if fit_y0 else (p, jnp.asarray(Y0))

    def predict(p):
        rates, y0 = split(p)
        return sl.solve(lotka_volterra, y0, t0, t1, args=tuple(rates[i] for i in range(4)),
                        saveat=sl.SaveAt(ts=ts), **solve_kw).ys

    def loss(p):
        return mse_loss(predict(p), obs, sigma=sigma)

    def residuals(p):
        return trajectory_residuals(predict(p), obs, sigma=sigma)

    start = time.perf_counter()
    if args.optimizer == "lm":
        res = least_squares(residuals, jnp.asarray(p0), steps=args.steps, tol=1e-12,
                            transforms=Positive(), stderr=True)
    else:
        optimizer = optax.lbfgs() if args.optimizer == "lbfgs" else optax.adam(1e-2)
        chunk = 10 if args.optimizer == "lbfgs" else 50
        res = fit(loss, jnp.asarray(p0), optimizer=optimizer, steps=args.steps, chunk=chunk,
                  tol=1e-10, transforms=Positive(), residuals=residuals, stderr=True,
                  progress=not args.quiet)
    total = time.perf_counter() - start
    est, se = np.asarray(res.params), np.asarray(res.stderr)
    say = (lambda *a: None) if args.quiet else print
    say(f"simlib fit ({args.optimizer}, {'adaptive' if args.adaptive else 'fixed-step'} "
        f"Tsit5) to {source}: {res.message}")
    say(f"  loss {res.history[0]:.4g} -> {res.loss:.6g} (weighted MSE; ~1 at the noise level)")
    say(f"  compile {res.compile_time:.2f} s, run {res.run_time:.3f} s, total with standard "
        f"errors {total:.2f} s")
    say(f"  {'':6s} {'start':>7s} {'estimate':>10s} {'stderr':>9s}"
        + ("" if fit_y0 else f" {'true':>7s} {'error':>8s} {'|err|/se':>8s}"))
    for i, name in enumerate(names):
        line = f"  {name:6s} {p0[i]:7.3f} {est[i]:10.5f} {se[i]:9.5f}"
        if not fit_y0:
            t = TRUE[i]
            line += f" {t:7.3f} {(est[i] - t) / t:8.2%} {abs(est[i] - t) / se[i]:8.2f}"
        say(line)
    say("  correlation:\n" + "\n".join("    " + " ".join(f"{c:6.2f}" for c in row)
                                       for row in np.asarray(res.correlation)))

    scipy_note = ""
    if not args.no_scipy:
        from scipy.integrate import solve_ivp
        from scipy.optimize import least_squares as scipy_least_squares

        def rhs(t, y, a, b, c, d):
            return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]

        def scipy_residuals(p):
            rates, y0 = (p[:4], p[4:]) if fit_y0 else (p, Y0)
            sol = solve_ivp(rhs, (t0, t1), y0, method="DOP853", t_eval=ts_np, args=tuple(rates),
                            rtol=1e-10, atol=1e-10)
            return ((sol.y.T - obs) / sigma).ravel()

        start = time.perf_counter()
        ref = scipy_least_squares(scipy_residuals, p0, jac="2-point", bounds=(0.0, np.inf),
                                  xtol=1e-12, ftol=1e-12, gtol=1e-12)
        t_scipy = time.perf_counter() - start
        rel = np.max(np.abs(est / ref.x - 1.0))
        say(f"scipy least_squares (trf, 2-point Jacobian, solve_ivp DOP853 rtol 1e-10, "
            f"positivity bounds): {ref.nfev} residual evaluations + {ref.njev} Jacobians, "
            f"{t_scipy:.2f} s")
        say(f"  optimum {np.array2string(ref.x, precision=6)}; max relative difference "
            f"from simlib {rel:.1e}")
        say(f"  wall time scipy / simlib (warm, compile excluded): "
            f"{t_scipy / res.run_time:.1f}x; including simlib's compile: "
            f"{t_scipy / (res.run_time + res.compile_time):.2f}x")
        scipy_note = f"; scipy's optimum within {rel:.0e}"

    if args.out:
        cli.save_result(args.out, dict(model="lotka_volterra", optimizer=args.optimizer,
                                       noise=args.noise, names=",".join(names)),
                        params=est, stderr=se, correlation=np.asarray(res.correlation),
                        history=np.asarray(res.history), ts=ts_np, observed=obs,
                        fitted=np.asarray(predict(jnp.asarray(est))), quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fine = np.linspace(t0, t1, 400)
        rates, y0 = split(jnp.asarray(est))
        fitted = sl.solve(lotka_volterra, y0, t0, t1, solver=sl.Tsit5(), rtol=1e-10,
                          atol=1e-10, args=tuple(rates), saveat=sl.SaveAt(ts=fine)).ys
        fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 4.5))
        for i, (label, color) in enumerate([("prey x", "C0"), ("predators y", "C3")]):
            ax0.plot(ts_np, obs[:, i], "o", ms=3, color=color, label=f"{label} (observed)")
            ax0.plot(fine, fitted[:, i], "-", color=color, lw=1, label=f"{label} (fit)")
        ax0.set(xlabel="t", ylabel="population", title=f"Lotka-Volterra fit ({source})")
        ax0.legend(fontsize=8)
        ax1.semilogy(np.asarray(res.history))
        ax1.set(xlabel="optimiser step", ylabel="weighted MSE",
                title=f"loss ({args.optimizer}); final {res.loss:.4g}")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    fitted_txt = ", ".join(f"{n} {e:.4g}±{s:.2g}" for n, e, s in zip(names, est, se,
                                                                         strict=True))
    cli.summary(f"fit_lotka_volterra: {args.optimizer}, {source}", compile_s=res.compile_time,
                run_s=res.run_time, result=f"{fitted_txt}; loss {res.loss:.3g}{scipy_note}")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
