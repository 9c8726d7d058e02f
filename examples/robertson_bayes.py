"""Bayesian inference of Robertson's stiff reaction rates with NUTS, a stiff solver inside.

Data: examples/data/robertson_kinetics.csv, the three concentrations of Robertson's
kinetics (A -> B, k1; B + B -> C + B, k2; B + C -> A + C, k3) at 16 log-spaced times from
1e-3 to 1e3, made by scipy (Radau) from (k1, k2, k3) = (0.04, 3e7, 1e4) with 5 %
lognormal noise (examples/data/make_robertson_kinetics_csv.py, seed 2026). The rates span
nine decades, so the ODE is stiff (Kvaerno5 takes 88 steps to t = 1000 at the true
rates; an explicit method's step is held down by stability): a stiff solver runs inside
the log density, through simlib.log_density, so that a proposal whose solve fails (step
budget, non-finite state, Newton failure) is rejected, not fatal.

Model: log(obs_ij) ~ Normal(log y_j(t_i; k), sigma) for the three species; priors
log10 k1 ~ N(-1, 1), log10 k2 ~ N(7, 1), log10 k3 ~ N(4, 1), sigma ~ HalfNormal(0.1).
NUTS in numpyro (vectorised chains) or blackjax (vmapped kernels); ArviZ diagnostics;
Levenberg-Marquardt on the log residuals (sl.least_squares) with Gauss-Newton standard
errors beside the posterior.

    python examples/robertson_bayes.py --plot out/robertson.png
    python examples/robertson_bayes.py --sampler blackjax --solver Rodas5

The samplers and ArviZ are the optional extra: pip install 'simlib[bayes]'.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import cli

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "robertson_kinetics.csv"
TRUE = {"log10_k1": np.log10(0.04), "log10_k2": np.log10(3e7), "log10_k3": np.log10(1e4),
        "sigma": 0.05}
PRIOR_MEAN = np.array([-1.0, 7.0, 4.0])
NAMES = tuple(TRUE)
SOLVERS = {"Rodas5": sl.Rodas5, "Kvaerno5": sl.Kvaerno5, "BDF": sl.BDF}


def _sampling_helpers():
    """The samplers' drivers and ArviZ summary shared with sir_boarding_school.py."""
    spec = importlib.util.spec_from_file_location("_sir_boarding_school",
                                                  HERE / "sir_boarding_school.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_data(path: Path = DATA) -> tuple[np.ndarray, np.ndarray]:
    data = np.loadtxt(path, delimiter=",", skiprows=1)
    return data[:, 0], data[:, 1:]


def robertson(t, y, log10_k):
    k1, k2, k3 = 10.0 ** log10_k[0], 10.0 ** log10_k[1], 10.0 ** log10_k[2]
    y1, y2, y3 = y[0], y[1], y[2]
    return jnp.stack([-k1 * y1 + k3 * y2 * y3, k1 * y1 - k2 * y2**2 - k3 * y2 * y3,
                      k2 * y2**2])


def solve_robertson(log10_k, ts, solver, max_steps, **kw):
    return sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, float(ts[-1]),
                    solver=solver, rtol=1e-6, atol=1e-12, args=log10_k,
                    saveat=sl.SaveAt(ts=ts), max_steps=max_steps, **kw)


def make_log_likelihood(ts, obs, solver, max_steps):
    log_obs = np.log(obs)

    def log_lik(log10_k, sigma):
        sol = solve_robertson(log10_k, ts, solver, max_steps)
        r = (log_obs - jnp.log(sol.ys)) / sigma
        return -0.5 * jnp.sum(r**2) - log_obs.size * jnp.log(sigma), sol

    return sl.log_density(log_lik)


def numpyro_model(log_lik):
    import numpyro
    import numpyro.distributions as dist

    def model():
        k = [numpyro.sample(f"log10_k{i + 1}", dist.Normal(PRIOR_MEAN[i], 1.0))
             for i in range(3)]
        sigma = numpyro.sample("sigma", dist.HalfNormal(0.1))
        numpyro.factor("obs", log_lik(jnp.stack(k), sigma))

    return model


def blackjax_logdensity(log_lik):
    """The log posterior of z = (log10 k1, log10 k2, log10 k3, log sigma)."""

    def logdensity(z):
        sigma = jnp.exp(z[3])
        log_prior = -0.5 * jnp.sum((z[:3] - PRIOR_MEAN) ** 2) - 0.5 * (sigma / 0.1) ** 2
        return log_lik(z[:3], sigma) + log_prior + z[3]  # + log-Jacobian of sigma = e^z

    return logdensity


def point_estimate(ts, obs, solver):
    """Levenberg-Marquardt on the log residuals: log10 k and Gauss-Newton standard errors."""
    def residuals(log10_k):
        return jnp.log(obs) - jnp.log(solve_robertson(log10_k, ts, solver, 4096).ys)

    res = sl.least_squares(residuals, jnp.asarray(PRIOR_MEAN), steps=100, tol=1e-12,
                           jacobian="rev", stderr=True)
    return np.asarray(res.params), np.asarray(res.stderr), float(np.sqrt(res.gauss_newton.s2))


def plot(path, draws, ts, obs, solver, sampler, quiet):
    plt = cli.pyplot()

    fig = plt.figure(figsize=(14, 7))
    grid = fig.add_gridspec(2, 4)
    for j, name in enumerate(NAMES):
        ax = fig.add_subplot(grid[0, j])
        for c in range(draws[name].shape[0]):
            ax.plot(draws[name][c], lw=0.4, alpha=0.8)
        ax.axhline(TRUE[name], color="k", ls="--", lw=1)
        ax.set(title=f"trace: {name} (dashed: true)", xlabel="draw")
    for j, (a, b) in enumerate([("log10_k2", "log10_k3"), ("log10_k1", "log10_k3")]):
        ax = fig.add_subplot(grid[1, j])
        for c in range(draws[a].shape[0]):
            ax.plot(draws[a][c], draws[b][c], ".", ms=1.5, alpha=0.5)
        ax.plot(TRUE[a], TRUE[b], "k+", ms=12, mew=2)
        ax.set(xlabel=a, ylabel=b, title=f"pairs: {a}, {b}")
    ax = fig.add_subplot(grid[1, 2:])
    flat = np.stack([draws[n].reshape(-1) for n in NAMES[:3]], axis=1)
    # at most 200 draws (a short run, such as the CLI test's, may have fewer)
    pick = np.random.default_rng(0).choice(flat.shape[0], min(200, flat.shape[0]),
                                           replace=False)
    fine = np.logspace(np.log10(ts[0]), np.log10(ts[-1]), 100)
    ys = np.asarray(jax.jit(jax.vmap(lambda k: solve_robertson(k, fine, solver, 4096,
                                                                   throw=False).ys))(
        jnp.asarray(flat[pick])))
    scale = np.array([1.0, 1e4, 1.0])
    for j, label in enumerate(["y1", "y2 x 1e4", "y3"]):
        lo, mid, hi = np.quantile(ys[:, :, j] * scale[j], [0.05, 0.5, 0.95], axis=0)
        ax.fill_between(fine, lo, hi, color=f"C{j}", alpha=0.3)
        ax.plot(fine, mid, f"C{j}-", lw=1, label=f"{label}: 90 % band of the posterior")
        ax.plot(ts, obs[:, j] * scale[j], f"C{j}o", ms=3)
    ax.set(xscale="log", xlabel="t", ylabel="concentration",
           title="posterior bands over the data (points)")
    ax.legend(fontsize=8)
    fig.suptitle(f"Robertson kinetics: NUTS ({sampler}) with {type(solver).__name__} "
                 "inside the log density")
    fig.tight_layout()
    cli.save_figure(fig, path, quiet=quiet)


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--sampler", choices=["numpyro", "blackjax"], default="numpyro",
                   help="the NUTS implementation")
    p.add_argument("--solver", choices=sorted(SOLVERS), default="Kvaerno5",
                   help="the stiff solver inside the log density")
    p.add_argument("--chains", type=cli.positive_int, default=4, help="Markov chains")
    p.add_argument("--warmup", type=cli.positive_int, default=500,
                   help="warm-up (adaptation) iterations per chain")
    p.add_argument("--samples", type=cli.positive_int, default=500,
                   help="draws per chain after warm-up")
    p.add_argument("--max-steps", type=cli.positive_int, default=512,
                   help="step budget of each solve (a proposal that needs more is rejected)")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed of the sampler")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    _sampling_helpers().require_bayes_extra(p, args.sampler)
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    say = cli.printer(args.quiet)
    helpers = _sampling_helpers()
    ts, obs = read_data()
    solver = SOLVERS[args.solver]()
    log_lik = make_log_likelihood(ts, obs, solver, args.max_steps)
    key = jax.random.key(args.seed)
    start = time.perf_counter()
    if args.sampler == "numpyro":
        draws, diverging, leapfrogs, wall = helpers.run_numpyro(numpyro_model(log_lik),
                                                                args, key)
    else:
        zs, diverging, leapfrogs, wall = helpers.run_blackjax(blackjax_logdensity(log_lik),
                                                              4, args, key)
        draws = {name: zs[..., i] for i, name in enumerate(NAMES)}
        draws["sigma"] = np.exp(draws["sigma"])
    table, n_div = helpers.diagnostics(draws, diverging)
    est, se, s = point_estimate(ts, obs, solver)

    say(f"NUTS ({args.sampler}) with {args.solver}, {args.chains} chains x ({args.warmup} "
        f"warm-up + {args.samples} draws), {time.perf_counter() - start:.1f} s with "
        f"compilation; {leapfrogs.mean():.1f} leapfrog steps per draw, {n_div} divergences")
    say(f"  {'':9s} {'true':>7s} {'mean':>7s} {'sd':>6s} {'R-hat':>6s} {'ESS bulk':>8s} "
        f"{'|err|/sd':>8s}  {'LM':>7s} {'GN se':>6s}")
    worst = 0.0
    for i, name in enumerate(NAMES):
        row = table.loc[name]
        line = (f"  {name:9s} {TRUE[name]:7.3f} {row['mean']:7.3f} {row['sd']:6.3f} "
                f"{row['r_hat']:6.3f} {row['ess_bulk']:8.0f} "
                f"{abs(row['mean'] - TRUE[name]) / row['sd']:8.2f}")
        worst = max(worst, float(row["r_hat"]))
        line += f"  {est[i]:7.3f} {se[i]:6.3f}" if i < 3 else f"  {s:7.3f}"
        say(line)
    if args.plot:
        plot(args.plot, draws, ts, obs, solver, args.sampler, args.quiet)
    if args.out:
        cli.save_result(args.out, dict(model="robertson_bayes", sampler=args.sampler,
                                       solver=args.solver), quiet=args.quiet,
                        diverging=diverging, **draws)
    cli.summary(f"robertson_bayes: NUTS ({args.sampler}) with {args.solver}, "
                f"{args.chains} chains", run_s=wall,
                result=f"log10 k2 {table.loc['log10_k2', 'mean']:.2f} ± "
                f"{table.loc['log10_k2', 'sd']:.2f} (true {TRUE['log10_k2']:.2f}); "
                f"max R-hat {worst:.3f}; {n_div} divergences")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
