"""An RC ladder as a differential-algebraic equation, against its matrix-exponential solution.

A DC source ``Vs`` drives a chain of ``n`` nodes joined by resistors ``R``; every node
leaks to ground through ``Rg``, and only every other node has a capacitor ``C`` to ground.
Kirchhoff's current law at node ``i`` reads

    C_i v_i' = (v_{i-1} - v_i) / R + (v_{i+1} - v_i) / R - v_i / Rg      (v_0 = Vs)

with ``C_i = 0`` at the capacitor-free nodes: there the equation is algebraic, ``M y' = f``
with the singular diagonal mass matrix ``M = diag(C_i)`` (index 1). The capacitors start
discharged; ``initialize="consistent"`` computes the algebraic node voltages from them.
Eliminating the algebraic nodes leaves a linear ODE ``x' = A x + b`` whose solution is a
matrix exponential (``scipy.linalg.expm``); the example prints the largest error of every
node voltage, algebraic ones included, and ``--plot PATH`` draws them.

    python examples/circuit.py
    python examples/circuit.py --n 20 --solver BDF --rtol 1e-6 --plot out/circuit.png
"""

from __future__ import annotations

import jax

from simlib import cli

SOLVERS = ("Rodas5P", "Rodas5", "BDF", "Kvaerno5", "Rosenbrock23")


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n", type=cli.positive_int, default=8, help="nodes in the ladder (>= 2)")
    p.add_argument("--resistance", type=cli.positive_float, default=1.0,
                   help="series resistance R between nodes (ohm)")
    p.add_argument("--leak", type=cli.positive_float, default=10.0,
                   help="resistance Rg from every node to ground (ohm)")
    p.add_argument("--capacitance", type=cli.positive_float, default=0.1,
                   help="capacitance C at the even nodes (farad)")
    p.add_argument("--source", type=cli.finite_float, default=5.0, help="source voltage (V)")
    p.add_argument("--t1", type=cli.positive_float, default=3.0, help="end time > 0 (s)")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-8,
                   help="relative tolerance in (0, 1), atol = 1e-3 rtol")
    p.add_argument("--solver", type=cli.one_of(SOLVERS), default="Rodas5P",
                   help=f"one of {', '.join(SOLVERS)}")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if args.n < 2:
        p.error(f"argument --n: at least 2 nodes, got {args.n}")
    return args


def ladder_matrices(n, r, rg, vs):
    """``f(v) = G v + s``: the conductance matrix and the source's current."""
    import numpy as np

    g = np.zeros((n, n))
    s = np.zeros(n)
    for i in range(n):
        g[i, i] -= 1 / r + 1 / rg
        if i > 0:
            g[i, i - 1] += 1 / r
        else:
            s[i] += vs / r
        if i < n - 1:
            g[i, i + 1] += 1 / r
            g[i, i] -= 1 / r
    return g, s


def exact(ts, caps, g, s):
    """Node voltages at ``ts`` from the discharged start: the algebraic nodes eliminated
    (``v_a = -G_aa^-1 (G_ad v_d + s_a)``) and ``C_d v_d' = A v_d + b`` solved by ``expm``
    of the augmented matrix ``[[A, b], [0, 0]]``."""
    import numpy as np
    import scipy.linalg

    d, a = caps > 0, caps == 0
    gdd, gda, gad, gaa = (g[np.ix_(d, d)], g[np.ix_(d, a)], g[np.ix_(a, d)],
                          g[np.ix_(a, a)])
    red = (gdd - gda @ np.linalg.solve(gaa, gad)) / caps[d][:, None]
    b = (s[d] - gda @ np.linalg.solve(gaa, s[a])) / caps[d]
    k = int(d.sum())
    aug = np.zeros((k + 1, k + 1))
    aug[:k, :k], aug[:k, k] = red, b
    out = np.zeros((len(ts), caps.size))
    for i, t in enumerate(ts):
        x = (scipy.linalg.expm(aug * t) @ np.concatenate([np.zeros(k), [1.0]]))[:k]
        out[i, d] = x
        out[i, a] = -np.linalg.solve(gaa, gad @ x + s[a])
    return out


@cli.script
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)  # the example's own choice; simlib never sets it
    import jax.numpy as jnp
    import numpy as np

    import simlib as sl

    n = args.n
    caps = np.where(np.arange(n) % 2 == 0, args.capacitance, 0.0)
    g, s = ladder_matrices(n, args.resistance, args.leak, args.source)
    say = cli.printer(args.quiet)

    def kirchhoff(t, v, p):
        r, rg, vs = p
        left = jnp.concatenate([jnp.stack([vs]), v[:-1]])
        right = jnp.concatenate([v[1:], v[-1:]])  # the last node has no right neighbour
        return (left - v) / r + (right - v) / r - v / rg

    ts = np.linspace(0.0, args.t1, 61)

    def solve(p, mass):
        sol = sl.solve(kirchhoff, jnp.zeros(n), 0.0, args.t1, solver=getattr(sl, args.solver)(),
                       rtol=args.rtol, atol=1e-3 * args.rtol, args=p, mass_matrix=mass,
                       initialize="consistent", saveat=sl.SaveAt(ts=ts), throw=False,
                       max_steps=100_000)
        return sol.ys, sol.result, sol.stats["num_accepted"]

    p = (jnp.float64(args.resistance), jnp.float64(args.leak), jnp.float64(args.source))
    (ys, result, steps), compile_s, run_s = cli.timed(solve, p, jnp.asarray(caps))
    if int(result) != 0:
        return cli.solve_failed(result)
    ys = np.asarray(ys)
    ref = exact(ts, caps, g, s)
    err = np.abs(ys - ref).max(axis=0)
    say(f"{args.solver}, rtol {args.rtol:g}: {int(steps)} steps ({run_s:.3f} s run, "
        f"{compile_s:.2f} s compile)")
    say(f"max |v - exact| over t: capacitor nodes {err[caps > 0].max():.2e} V, "
        f"algebraic nodes {err[caps == 0].max():.2e} V")
    if args.out:
        cli.save_result(args.out, dict(system="rc_ladder", solver=args.solver, n=n,
                                       error=float(err.max())),
                        ts=ts, ys=ys, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, ax = plt.subplots(figsize=(7, 4))
        for i in range(n):
            style = "o" if caps[i] > 0 else "x"
            kind = "C" if caps[i] > 0 else "algebraic"
            line, = ax.plot(ts[::3], ys[::3, i], style, ms=3, label=f"node {i + 1} ({kind})")
            ax.plot(ts, ref[:, i], "-", lw=0.8, color=line.get_color())
        ax.set(xlabel="t (s)", ylabel="node voltage (V)",
               title="RC ladder DAE: simlib (markers) and expm solution (lines)")
        ax.legend(fontsize=7, ncol=2)
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"circuit: {args.solver}, {n} nodes, {int(steps)} steps", compile_s=compile_s,
                run_s=run_s, result=f"max error {err.max():.2e} V vs the matrix exponential")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
