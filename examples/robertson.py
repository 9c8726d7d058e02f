"""Robertson's chemical kinetics, the classic stiff problem, with a simlib stiff solver.

    y0' = -0.04 y0 + 1e4 y1 y2
    y1' =  0.04 y0 - 1e4 y1 y2 - 3e7 y1^2
    y2' =  3e7 y1^2,             y(0) = (1, 0, 0)

(Hairer and Wanner, Solving ODEs II, IV.1 (1.4)). The rate constants span nine orders of
magnitude, so an explicit solver needs steps of about 1e-3 for 1e11 time units. Prints
the state at t1 against a reference (at t1 = 1e11 the value published with the Bari test
set, Mazzia and Magherini, release 2.4, 2008; otherwise scipy Radau at rtol 1e-10) and the
number of steps; ``--plot PATH`` writes the three species on a logarithmic time axis.

    python examples/robertson.py
    python examples/robertson.py --solver Rosenbrock23 --rtol 1e-6 --t1 1e5 --plot out/rober.png
"""

from __future__ import annotations

import sys

import jax

from simlib import cli

SOLVERS = ("Rodas5P", "Rosenbrock23", "Rodas5", "Kvaerno3", "Kvaerno5", "BDF")
K = (0.04, 3e7, 1e4)  # k1, k2, k3
# Bari test set, problem ROBER, solution at t = 1e11 (rober.f, subroutine solut)
PUBLISHED_1E11 = (0.2083340149701255e-7, 0.8333360770334713e-13, 0.9999999791665050)


def robertson(t, y, k):
    import jax.numpy as jnp

    k1, k2, k3 = k
    return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                      k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                      k2 * y[1] ** 2])


def reference(t1: float):
    """``(y(t1), description)``: the published value at 1e11, else scipy Radau."""
    import numpy as np

    if t1 == 1e11:
        return np.array(PUBLISHED_1E11), "Bari test set (published)"
    from scipy.integrate import solve_ivp

    k1, k2, k3 = K

    def f(t, y):
        return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                k2 * y[1] ** 2]

    def jac(t, y):
        return [[-k1, k3 * y[2], k3 * y[1]], [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
                [0.0, 2 * k2 * y[1], 0.0]]

    sol = solve_ivp(f, (0.0, t1), [1.0, 0.0, 0.0], method="Radau", rtol=1e-10, atol=1e-16,
                    jac=jac)
    return sol.y[:, -1], "scipy Radau, rtol 1e-10, atol 1e-16"


def parse(argv):
    import simlib as sl

    available = [n for n in SOLVERS if hasattr(sl, n)]
    p = cli.ExampleParser(__doc__)
    p.add_argument("--solver", type=cli.one_of(available, "a stiff solver of this simlib"),
                   default="Rodas5P", help=f"stiff solver, one of {', '.join(available)}")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-6,
                   help="relative tolerance in (0, 1), atol = 1e-6 rtol")
    p.add_argument("--t1", type=cli.positive_float, default=1e11, help="end time > 0")
    p.add_argument("--max-steps", type=cli.positive_int, default=200_000,
                   help="bound on step attempts")
    cli.add_output_options(p)
    return p.parse_args(argv)


@cli.script
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)  # the example's own choice; simlib never sets it
    import jax.numpy as jnp
    import numpy as np

    import simlib as sl

    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    solver = getattr(sl, args.solver)()
    atol = 1e-6 * args.rtol
    dense = bool(args.plot or args.out)
    saveat = (sl.SaveAt(ts=np.logspace(-6, np.log10(args.t1), 200))
              if dense else sl.SaveAt(t1=True))

    def run(y0, k):
        sol = sl.solve(robertson, y0, 0.0, args.t1, solver=solver, rtol=args.rtol, atol=atol,
                       args=k, saveat=saveat, max_steps=args.max_steps, throw=False)
        return (sol.ts, sol.ys, sol.result, sol.stats["num_accepted"],
                sol.stats["num_rejected"])

    (ts, ys, result, accepted, rejected), compile_s, seconds = cli.timed(
        run, jnp.array([1.0, 0.0, 0.0]), K)
    ts, ys = np.asarray(ts), np.asarray(ys)
    y1 = ys[-1]
    ref, what = reference(args.t1)
    units = np.abs(y1 - ref) / (atol + args.rtol * np.abs(ref))
    say = cli.printer(args.quiet)
    say(f"{args.solver}, rtol {args.rtol:g}, atol {atol:g}, t1 = {args.t1:g} "
        f"({seconds:.2f} s run, {compile_s:.2f} s compile)")
    say(f"result: {sl.Result(int(result)).name}; accepted steps "
        f"{int(accepted)}, rejected {int(rejected)}")
    for i in range(3):
        say(f"  y{i} = {y1[i]: .15e}   reference {ref[i]: .15e}   "
              f"error {units[i]:.2f} tolerances")
    say(f"reference: {what}; max error {units.max():.2f} tolerances "
        "(|y - ref| / (atol + rtol |ref|))")
    if args.out:
        cli.save_result(args.out, dict(system="robertson", solver=args.solver, rtol=args.rtol,
                                       atol=atol, result=int(result)), ts=ts, ys=ys,
                                       quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, ax = plt.subplots(figsize=(7, 4))
        for i, (scale, label) in enumerate(((1, "y0"), (1e4, "1e4 y1"), (1, "y2"))):
            ax.semilogx(ts, scale * ys[:, i], label=label)
        ax.set(xlabel="t", ylabel="concentration",
               title=f"Robertson's kinetics ({args.solver}, rtol {args.rtol:g})")
        ax.legend()
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    if int(result) != 0:
        return cli.solve_failed(result, "raise --max-steps or loosen --rtol")
    cli.summary(f"robertson: {args.solver}, rtol {args.rtol:g}, t1 = {args.t1:g}, "
                f"{int(accepted)} steps", compile_s=compile_s, run_s=seconds,
                result=f"max error {units.max():.2f} tolerances vs {what.split(',')[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
