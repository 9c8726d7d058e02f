"""The chemical Akzo Nobel problem: a differential-algebraic equation ``M y' = f(y)``.

Five species react while CO2 is fed in from the gas phase; the sixth, an ion pair, is in
fast equilibrium, ``0 = Ks y1 y4 - y6``: an algebraic equation, so ``M = diag(1, 1, 1, 1,
1, 0)`` (index 1). The Bari test set's CHEMAKZO (Mazzia and Magherini, *Test Set for IVP
Solvers*, release 2.4; ``simlib.systems.akzo_nobel``), solved with
``sl.solve(..., mass_matrix=M)`` from ``y6 = 0``, which ``initialize="consistent"``
corrects to ``Ks y1 y4`` before the first step. Prints the state at t1 = 180 against the
published solution (significant correct digits, as the test set counts them);
``--plot PATH`` draws the six concentrations.

    python examples/akzo_nobel.py
    python examples/akzo_nobel.py --solver BDF --rtol 1e-8 --plot out/akzo.png
"""

from __future__ import annotations

import sys

import jax

from simlib import cli

SOLVERS = ("Rodas5P", "Rodas5", "Rosenbrock23", "BDF", "Kvaerno5")


def parse(argv):
    import simlib as sl

    available = [n for n in SOLVERS if hasattr(sl, n)]
    p = cli.ExampleParser(__doc__)
    p.add_argument("--solver", type=cli.one_of(available, "a DAE solver of this simlib"),
                   default="Rodas5P", help=f"DAE solver, one of {', '.join(available)}")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-6,
                   help="relative tolerance in (0, 1), atol = 1e-2 rtol")
    p.add_argument("--t1", type=cli.positive_float, default=180.0,
                   help="end time > 0 (the published solution is at 180)")
    p.add_argument("--max-steps", type=cli.positive_int, default=100_000,
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
    from simlib import systems

    solver = getattr(sl, args.solver)()
    atol = 1e-2 * args.rtol
    m = jnp.asarray(systems.akzo_nobel_mass_matrix())
    ts = np.linspace(0.0, args.t1, 181)
    y0 = jnp.asarray(systems.AKZO_NOBEL.y0).at[5].set(0.0)  # inconsistent: corrected below

    def run(y0):
        sol = sl.solve(systems.akzo_nobel, y0, 0.0, args.t1, solver=solver, rtol=args.rtol,
                       atol=atol, mass_matrix=m, initialize="consistent",
                       saveat=sl.SaveAt(ts=ts), max_steps=args.max_steps, throw=False)
        return sol.ys, sol.result, sol.stats["num_accepted"], sol.stats["num_rejected"]

    (ys, result, accepted, rejected), compile_s, seconds = cli.timed(run, y0)
    ys = np.asarray(ys)
    say = cli.printer(args.quiet)
    say(f"{args.solver}, rtol {args.rtol:g}, atol {atol:g}, t1 = {args.t1:g} "
        f"({seconds:.2f} s run, {compile_s:.2f} s compile)")
    say(f"result: {sl.Result(int(result)).name}; accepted steps {int(accepted)}, "
        f"rejected {int(rejected)}")
    say(f"consistent start: y6(0) = {ys[0, 5]:.10f} (Ks y1 y4 = "
        f"{115.83 * 0.444 * 0.007:.10f})")
    digits = None
    if args.t1 == systems.AKZO_NOBEL_T1:
        ref = systems.AKZO_NOBEL_REFERENCE
        digits = systems.scd(ys[-1], ref)
        for i in range(6):
            say(f"  y{i + 1} = {ys[-1, i]: .15e}   published {ref[i]: .15e}   "
                f"{digits[i]:.1f} digits")
    if args.out:
        cli.save_result(args.out, dict(system="akzo_nobel", solver=args.solver,
                                       rtol=args.rtol, atol=atol, result=int(result)),
                        ts=ts, ys=ys, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(2, 3, figsize=(10, 5.5), sharex=True)
        for i, ax in enumerate(axes.flat):
            ax.plot(ts, ys[:, i])
            ax.set(title=f"y{i + 1}" + (" (algebraic)" if i == 5 else ""))
            if i >= 3:
                ax.set(xlabel="t [min]")
        fig.suptitle(f"Chemical Akzo Nobel problem ({args.solver}, rtol {args.rtol:g})")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    if int(result) != 0:
        return cli.solve_failed(result, "raise --max-steps or loosen --rtol")
    cli.summary(f"akzo_nobel: {args.solver}, rtol {args.rtol:g}, t1 = {args.t1:g}, "
                f"{int(accepted)} steps", compile_s=compile_s, run_s=seconds,
                result=("" if digits is None else
                        f"{digits.min():.1f} significant digits vs the published solution"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
