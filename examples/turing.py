"""Turing patterns of the 2-D Brusselator, with the pattern's wavenumber against linear theory.

    u_t = A - (B + 1) u + u^2 v + Du lap(u)
    v_t = B u - u^2 v + Dv lap(v)            on a periodic L x L square

The steady state ``(A, B / A)`` is stable without diffusion (``B < 1 + A^2``), but with
``Dv >> Du`` perturbations of wavenumber ``k`` grow at the largest real part of the
eigenvalues of ``J - k^2 diag(Du, Dv)``, ``J = [[B - 1, A^2], [-B, -A^2]]`` (Turing's
instability: ``B > (1 + A sqrt(Du / Dv))^2``; J. D. Murray, *Mathematical Biology II*,
3rd ed., 2003, chapter 2). From small random noise the fastest-growing wavenumber
takes over and spots form. The run prints the dominant wavenumber of the final ``u``
(largest Fourier mode) against the fastest-growing one of linear theory, and ``--plot
PATH`` draws ``u`` at four times and the growth rate against the power spectrum.

``simlib.pde.laplacian`` on an ``n x n`` grid, the pattern from ``simlib.pde.pattern``
and BDF with the sparse LU (``--linear-solver krylov``: GMRES with ILU(0); ``fft``: GMRES
preconditioned by ``simlib.pde.diffusion_preconditioner``, the exact inverse of the
diffusion part by FFT, which leaves GMRES only the reaction to resolve).

    python examples/turing.py
    python examples/turing.py --n 48 --length 48 --t1 60 --plot out/turing.png
    python examples/turing.py --n 128 --length 128 --linear-solver fft
"""

from __future__ import annotations

import jax

from simlib import cli

LINEAR_SOLVERS = ("auto", "sparse", "krylov", "fft")


def growth_rate(k, a, b, du, dv):
    """Largest real part of the eigenvalues of ``J - k^2 diag(du, dv)`` for each ``k``."""
    import numpy as np

    k = np.asarray(k, float)
    tr = (b - 1 - a**2) - k**2 * (du + dv)
    det = (b - 1 - du * k**2) * (-(a**2) - dv * k**2) + b * a**2
    disc = tr**2 - 4 * det
    return np.where(disc >= 0, (tr + np.sqrt(np.abs(disc))) / 2, tr / 2)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--n", type=cli.positive_int, default=32, help="grid points per side")
    p.add_argument("--length", type=cli.positive_float, default=32.0,
                   help="side L of the periodic square")
    p.add_argument("--t1", type=cli.positive_float, default=40.0, help="end time > 0")
    p.add_argument("--a", type=cli.positive_float, default=4.5, help="feed A")
    p.add_argument("--b", type=cli.positive_float, default=7.5, help="rate constant B")
    p.add_argument("--du", type=cli.positive_float, default=2.0, help="diffusion of u")
    p.add_argument("--dv", type=cli.positive_float, default=16.0, help="diffusion of v")
    p.add_argument("--rtol", type=cli.tolerance, default=1e-5,
                   help="relative tolerance in (0, 1), atol = rtol")
    p.add_argument("--seed", type=cli.seed, default=0, help="seed of the initial noise")
    p.add_argument("--linear-solver", type=cli.one_of(LINEAR_SOLVERS), default="auto",
                   help=f"one of {', '.join(LINEAR_SOLVERS)}")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    if args.n < 4:
        p.error(f"argument --n: at least 4 points per side, got {args.n}")
    if args.b >= 1 + args.a**2:
        p.error(f"argument --b: B = {args.b:g} >= 1 + A^2 = {1 + args.a**2:g} makes the "
                "steady state oscillate (Hopf), not form a Turing pattern")
    return args


@cli.script
def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)  # the example's own choice; simlib never sets it
    import jax.numpy as jnp
    import numpy as np

    import simlib as sl
    from simlib import pde

    a, b, du, dv = args.a, args.b, args.du, args.dv
    grid = pde.Grid((args.n, args.n), spacing=args.length / args.n, bc="periodic")

    def brusselator(t, y, p):
        a_, b_, du_, dv_ = p
        u, v = y[..., 0], y[..., 1]
        uuv = u * u * v
        return jnp.stack([a_ - (b_ + 1) * u + uuv + du_ * pde.laplacian(u, grid),
                          b_ * u - uuv + dv_ * pde.laplacian(v, grid)], axis=-1)

    rng = np.random.default_rng(args.seed)
    y0 = np.stack([np.full((args.n, args.n), a), np.full((args.n, args.n), b / a)], -1)
    y0 = y0 * (1 + 0.01 * rng.uniform(-1, 1, y0.shape))
    ts = np.linspace(0.0, args.t1, 4)
    sparsity = pde.pattern(grid, pde.laplacian_pattern(grid), species=2)

    options = dict(jac_sparsity=sparsity, linear_solver=args.linear_solver)
    if args.linear_solver == "fft":  # Du, Dv as constants here: the preconditioner only steers
        options = dict(linear_solver=sl.NewtonKrylov(  # GMRES, never the answer
            pde.diffusion_preconditioner(grid, [du, dv], species=2), rtol=1e-4, restart=5))

    def solve(y0_, p):
        sol = sl.solve(brusselator, y0_, 0.0, args.t1, solver=sl.BDF(), rtol=args.rtol,
                       atol=args.rtol, args=p, saveat=sl.SaveAt(ts=ts), throw=False,
                       **options)
        return sol.ys, sol.result, sol.stats["num_accepted"]

    (ys, result, steps), compile_s, run_s = cli.timed(
        solve, jnp.asarray(y0), tuple(jnp.float64(x) for x in (a, b, du, dv)))
    ys, result = np.asarray(ys), int(result)
    if result != 0:
        return cli.solve_failed(result)

    # dominant wavenumber of the final u against linear theory's fastest-growing one
    u = ys[-1, ..., 0]
    power = np.abs(np.fft.fft2(u - u.mean())) ** 2
    freq = 2 * np.pi * np.fft.fftfreq(args.n, d=args.length / args.n)
    kmag = np.hypot(freq[:, None], freq[None, :])
    k_dominant = float(kmag.flat[np.argmax(power)])
    k = np.linspace(0, kmag.max(), 4001)
    rate = growth_rate(k, a, b, du, dv)
    k_fastest = float(k[np.argmax(rate)])
    dk = 2 * np.pi / args.length  # the spacing of the box's wavenumbers
    agree = abs(k_dominant - k_fastest) <= dk
    say = cli.printer(args.quiet)
    say(f"Brusselator A = {a:g}, B = {b:g}, Du = {du:g}, Dv = {dv:g} on a {args.n} x {args.n} "
        f"periodic grid of side {args.length:g} ({2 * args.n**2} states); BDF, linear solver "
        f"{args.linear_solver}: {int(steps)} steps ({run_s:.2f} s run, {compile_s:.2f} s "
        "compile)")
    say(f"Turing threshold B_c = {(1 + a * np.sqrt(du / dv)) ** 2:.3f}; unstable band "
        f"k in [{k[rate > 0].min():.3f}, {k[rate > 0].max():.3f}]")
    say(f"dominant wavenumber at t1 = {args.t1:g}: {k_dominant:.3f}; fastest-growing of "
        f"linear theory: {k_fastest:.3f} (growth rate {rate.max():.3f}); "
        f"{'within' if agree else 'NOT within'} one box wavenumber {dk:.3f}")
    if args.out:
        cli.save_result(args.out, dict(system="turing", n=args.n, length=args.length,
                                       k_dominant=k_dominant, k_fastest=k_fastest),
                        ts=ts, ys=ys, quiet=args.quiet)
    if args.plot:
        plt = cli.pyplot()

        fig, axes = plt.subplots(1, 5, figsize=(16, 3.4))
        for ax, t, y in zip(axes[:4], ts, ys, strict=True):
            im = ax.imshow(y[..., 0], origin="lower", cmap="viridis",
                           extent=(0, args.length, 0, args.length))
            ax.set(title=f"u at t = {t:.3g}", xticks=[], yticks=[])
            fig.colorbar(im, ax=ax, fraction=0.046)
        ax = axes[4]
        ax.plot(k, rate, label="growth rate (linear theory)")
        ax.axhline(0, color="grey", lw=0.5)
        radial = np.bincount(np.rint(kmag / dk).astype(int).ravel(), power.ravel())
        ax2 = ax.twinx()
        ax2.plot(dk * np.arange(radial.size), radial / radial.max(), "o-", ms=3,
                 color="C1", label="power of u at t1")
        ax.axvline(k_fastest, color="C0", ls="--", lw=0.8)
        ax.set(xlabel="wavenumber k", ylabel="growth rate", title="linear theory vs pattern")
        ax2.set_ylabel("power (normalised)")
        fig.tight_layout()
        cli.save_figure(fig, args.plot, quiet=args.quiet)
    cli.summary(f"turing: {args.n} x {args.n}, BDF ({args.linear_solver}), {int(steps)} steps",
                compile_s=compile_s, run_s=run_s,
                result=f"dominant k {k_dominant:.3f} vs linear theory {k_fastest:.3f} "
                f"({'within' if agree else 'NOT within'} {dk:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
