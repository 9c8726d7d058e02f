"""The 1-D heat equation by the method of lines, against its closed-form solution.

    u_t = D u_xx on 0 < x < 1,   u(0, t) = u(1, t) = 0,
    u(x, 0) = sin(pi x) + a sin(3 pi x)
    u(x, t) = exp(-pi^2 D t) sin(pi x) + a exp(-9 pi^2 D t) sin(3 pi x)

``simlib.pde.laplacian`` on ``n`` interior points (second order in space) and a stiff
solver with a banded linear solver (``jac_bandwidth=(1, 1)``; the stiffness grows like
``4 D (n + 1)^2``). Prints the error against the closed form at t1, which the spatial
error ``O(h^2)`` dominates at the default tolerance, and the same with ``2 n`` points
(the error falls by about 4); ``--plot PATH`` draws snapshots against the closed form.

    python examples/heat.py
    python examples/heat.py --n 400 --solver Kvaerno5 --linear-solver sparse --plot out/heat.png
"""

from __future__ import annotations

import jax

from simlib import cli

SOLVERS = ("BDF", "Rodas5P", "Kvaerno5", "Kvaerno3", "Rosenbrock23", "Rodas5")
LINEAR_SOLVERS = ("banded", "sparse", "dense", "krylov")
A3 = 0.5  # weight of the third mode


def exact(x, t, diffusion):
    import numpy as np

    return (np.exp(-np.pi**2 * diffusion * t) * np.sin(np.pi * x)
            + A3 * np.exp(-9 * np.pi**2 * diffusion * t) * np.sin(3 * np.pi * x))


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n", type=cli.positive_int, default=200, help="interior grid points")
    p.add_argument("--diffusion", type=cli.positive_float, default=0.1,
                   help="diffusion coefficient D > 0")
    p.add_argument("--t1", type=cli.positive_float, default=1.0, help="end time > 0")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-8,
                   help="relative tolerance in (0, 1), atol = 1e-3 rtol")
    p.add_argument("--solver", type=cli.one_of(SOLVERS), default="BDF",
                   help=f"stiff solver, one of {', '.join(SOLVERS)}")
    p.add_argument("--linear-solver", type=cli.one_of(LINEAR_SOLVERS), default="banded",
                   help=f"one of {', '.join(LINEAR_SOLVERS)}")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if args.n < 3:
        p.error(f"argument --n: at least 3 points, got {args.n}")
    return args


@cli.script
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)  # the example's own choice; simlib never sets it
    import jax.numpy as jnp
    import numpy as np

    import simlib as sl
    from simlib import pde

    def heat(t, u, args_):
        diffusion, grid = args_  # the grid is static structure (a pytree without leaves)
        return diffusion * pde.laplacian(u, grid)

    ts = np.linspace(0.0, args.t1, 6)
    say = cli.printer(args.quiet)

    def run(n):
        grid = pde.Grid.uniform((n,), lengths=1.0, bc="dirichlet")
        (x,) = grid.coordinates()
        options = dict(linear_solver=args.linear_solver)
        if args.linear_solver == "banded":
            options = dict(jac_bandwidth=(1, 1))
        elif args.linear_solver in ("sparse", "krylov"):
            options["jac_sparsity"] = pde.laplacian_pattern(grid)

        def solve(u0, diffusion):
            sol = sl.solve(heat, u0, 0.0, args.t1, solver=getattr(sl, args.solver)(),
                           rtol=args.rtol, atol=1e-3 * args.rtol, args=(diffusion, grid),
                           saveat=sl.SaveAt(ts=ts), throw=False, **options)
            return sol.ys, sol.result, sol.stats["num_accepted"]

        (ys, result, steps), compile_s, run_s = cli.timed(
            solve, jnp.asarray(exact(x, 0.0, args.diffusion)), jnp.float64(args.diffusion))
        ys = np.asarray(ys)
        error = np.abs(ys[-1] - exact(x, args.t1, args.diffusion)).max()
        return x, ys, int(result), int(steps), error, compile_s, run_s

    x, ys, result, steps, error, compile_s, run_s = run(args.n)
    if result != 0:
        return cli.solve_failed(result)
    *_, error2, _, _ = run(2 * args.n)
    say(f"{args.solver} with the {args.linear_solver} linear solver, rtol {args.rtol:g}: "
        f"{steps} steps ({run_s:.3f} s run, {compile_s:.2f} s compile)")
    say(f"max |u - exact| at t1 = {args.t1:g}: {error:.3e} with n = {args.n}, {error2:.3e} "
        f"with n = {2 * args.n} (ratio {error / error2:.2f}; second order in space: 4)")
    if args.out:
        cli.save_result(args.out, dict(system="heat", solver=args.solver, n=args.n,
                                       diffusion=args.diffusion, error=float(error)),
                        ts=ts, ys=ys, x=x, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, ax = plt.subplots(figsize=(7, 4))
        fine = np.linspace(0, 1, 400)
        for i, t in enumerate(ts):
            line, = ax.plot(x, ys[i], "o", ms=2, label=f"t = {t:.2g}")
            ax.plot(fine, exact(fine, t, args.diffusion), "-", lw=0.8, color=line.get_color())
        ax.set(xlabel="x", ylabel="u", title=f"heat equation, D = {args.diffusion:g}: "
               f"simlib (points) and closed form (lines)")
        ax.legend(fontsize=8)
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"heat: {args.solver} ({args.linear_solver}), n = {args.n}, {steps} steps",
                compile_s=compile_s, run_s=run_s,
                result=f"max error {error:.2e} vs the closed form (n = {2 * args.n}: "
                f"{error2:.2e}, ratio {error / error2:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
