"""Bayesian SIR model of the 1978 influenza outbreak at an English boarding school, with NUTS.

Data: examples/data/influenza_england_1978_school.csv, the daily number of pupils confined
to bed (``in_bed``) among the 763 boys of a boarding school in the north of England,
22 January to 4 February 1978 ("Influenza in a boarding school", BMJ 1978;1:587), as
distributed in the R package ``outbreaks`` (``influenza_england_1978_school``).

The model is the one of Grinsztajn, Semenova, Margossian and Riou, "Bayesian workflow for
disease transmission modeling in Stan", Statistics in Medicine 40 (2021) 6209: an SIR
model from one infected pupil, S' = -beta S I / N, I' = beta S I / N - gamma I,
R' = gamma I, (S, I, R)(0) = (762, 1, 0), and cases(t) ~ NegBinomial(mean I(t),
dispersion phi) on days 1 to 14; priors beta ~ N(2, 1), gamma ~ N(0.4, 0.5) (both
truncated at 0), 1/phi ~ Exponential(5). The solve (Tsit5, rtol = atol = 1e-6, as Stan's
rk45 defaults) runs inside the log density through simlib.log_density, so a proposal that
exhausts the step budget is rejected, not fatal. NUTS runs in numpyro (vectorised chains)
or blackjax (vmapped kernels); ArviZ gives R-hat, effective sample sizes and divergences,
and the posterior means are compared with the paper's Stan output. Levenberg-Marquardt
(sl.least_squares, log residuals) gives the point estimate and its Gauss-Newton
standard errors beside the posterior.

    python examples/sir_boarding_school.py --plot out/sir.png          # numpyro
    python examples/sir_boarding_school.py --sampler blackjax

The samplers and ArviZ are the optional extra: pip install 'simlib[bayes]'.
"""

from __future__ import annotations

import csv
import importlib
import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

import simlib as sl
from simlib import cli

DATA = Path(__file__).resolve().parent / "data" / "influenza_england_1978_school.csv"
N_PUPILS = 763.0
Y0 = np.array([N_PUPILS - 1.0, 1.0, 0.0])
NAMES = ("beta", "gamma", "phi_inv")
# Grinsztajn et al. (2021), the posterior of the Stan program sir_negbin.stan (4 chains of
# 1,000 warm-up and 1,000 draws, rk45): mean and sd. The paper prints the summary of a run
# of that program; the figures here are two public reruns of it (rstan 2.21), which agree
# to 0.01 (beta 1.73/1.74, R0 3.21/3.22, recovery time 1.85/1.86): their means.
PUBLISHED = {"beta": (1.735, 0.05), "gamma": (0.54, 0.05), "R0": (3.215, 0.275),
             "recovery_time": (1.855, 0.155)}


def read_cases(path: Path = DATA) -> np.ndarray:
    with path.open(newline="", encoding="utf-8") as f:
        return np.array([int(row["in_bed"]) for row in csv.DictReader(f)], np.int64)


def sir(t, y, args):
    beta, gamma = args
    s, i, _ = y[0], y[1], y[2]
    infection = beta * s * i / N_PUPILS
    return jnp.stack([-infection, infection - gamma * i, gamma * i])


def solve_sir(beta, gamma, days, **kw):
    return sl.solve(sir, jnp.asarray(Y0), 0.0, float(days[-1]), solver=sl.Tsit5(),
                    rtol=1e-6, atol=1e-6, args=(beta, gamma), saveat=sl.SaveAt(ts=days),
                    **kw)


def negbin_logpmf(k, mean, phi):
    """log NegBinomial(k | mean, phi), variance mean + mean^2 / phi (Stan's neg_binomial_2)."""
    return (gammaln(k + phi) - gammaln(phi) - gammaln(k + 1.0)
            + phi * jnp.log(phi / (phi + mean)) + k * jnp.log(mean / (phi + mean)))


def make_log_likelihood(cases: np.ndarray, max_steps: int):
    days = np.arange(1.0, len(cases) + 1.0)

    def log_lik(beta, gamma, phi_inv):
        sol = solve_sir(beta, gamma, days, max_steps=max_steps)
        return jnp.sum(negbin_logpmf(cases, sol.ys[:, 1], 1.0 / phi_inv)), sol

    return sl.log_density(log_lik)


def log_prior(beta, gamma, phi_inv):
    """Up to a constant (the truncation normalisers are constants)."""
    return (-0.5 * (beta - 2.0) ** 2 - 0.5 * ((gamma - 0.4) / 0.5) ** 2 - 5.0 * phi_inv)


def numpyro_model(log_lik):
    import numpyro
    import numpyro.distributions as dist

    def model():
        beta = numpyro.sample("beta", dist.TruncatedNormal(2.0, 1.0, low=0.0))
        gamma = numpyro.sample("gamma", dist.TruncatedNormal(0.4, 0.5, low=0.0))
        phi_inv = numpyro.sample("phi_inv", dist.Exponential(5.0))
        numpyro.factor("cases", log_lik(beta, gamma, phi_inv))

    return model


def blackjax_logdensity(log_lik):
    """The log posterior of z = log(beta, gamma, phi_inv) (log-Jacobian sum(z) included)."""

    def logdensity(z):
        beta, gamma, phi_inv = jnp.exp(z[0]), jnp.exp(z[1]), jnp.exp(z[2])
        return log_lik(beta, gamma, phi_inv) + log_prior(beta, gamma, phi_inv) + jnp.sum(z)

    return logdensity


def run_numpyro(model, args, key):
    """NUTS with numpyro's defaults, the chains vectorised (one vmapped sampler):
    ``(draws by chain, diverging, leapfrog steps, wall seconds)``."""
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(NUTS(model), num_warmup=args.warmup, num_samples=args.samples,
                num_chains=args.chains, chain_method="vectorized",
                progress_bar=not args.quiet)
    start = time.perf_counter()
    mcmc.run(key, extra_fields=("diverging", "num_steps"))
    wall = time.perf_counter() - start
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return draws, np.asarray(extra["diverging"]), np.asarray(extra["num_steps"]), wall


def run_blackjax(logdensity, dim, args, key):
    """blackjax's NUTS after its window adaptation (Stan's), one chain per member of a
    ``vmap``, started uniformly in (-2, 2) (numpyro's init_to_uniform):
    ``(z by chain, diverging, leapfrog steps, wall seconds)``."""
    import blackjax

    def one_chain(key, z0):
        warm_key, sample_key = jax.random.split(key)
        warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
        (state, params), _ = warmup.run(warm_key, z0, num_steps=args.warmup)
        kernel = blackjax.nuts(logdensity, **params).step

        def step(state, key):
            state, info = kernel(key, state)
            return state, (state.position, info.is_divergent, info.num_integration_steps)

        _, out = jax.lax.scan(step, state, jax.random.split(sample_key, args.samples))
        return out

    init_key, run_key = jax.random.split(key)
    z0 = jax.random.uniform(init_key, (args.chains, dim), minval=-2.0, maxval=2.0)
    start = time.perf_counter()
    zs, div, n = jax.block_until_ready(
        jax.jit(jax.vmap(one_chain))(jax.random.split(run_key, args.chains), z0))
    return np.asarray(zs), np.asarray(div), np.asarray(n), time.perf_counter() - start


def diagnostics(posterior: dict, diverging: np.ndarray):
    """ArviZ summary (mean, sd, R-hat, bulk and tail ESS) of ``posterior`` (arrays shaped
    (chains, draws)) and the number of divergent transitions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # ArviZ's notice of its refactor
        import arviz as az

    idata = az.from_dict(posterior=posterior, sample_stats={"diverging": diverging})
    table = az.summary(idata, var_names=list(posterior), round_to="none")
    return table, int(diverging.sum())


def point_estimate(cases: np.ndarray):
    """Levenberg-Marquardt on log residuals log(cases) - log(I) (multiplicative errors, the
    large-count limit of a negative binomial of fixed dispersion): the estimate of
    (beta, gamma) and Gauss-Newton standard errors (scaled by the residual variance)."""
    days = np.arange(1.0, len(cases) + 1.0)

    def residuals(p):
        i = solve_sir(p[0], p[1], days).ys[:, 1]
        return jnp.log(cases) - jnp.log(i)

    res = sl.least_squares(residuals, jnp.array([2.0, 0.4]), steps=100, tol=1e-12,
                           transforms=sl.Positive(), jacobian="rev", stderr=True)
    est, cov = np.asarray(res.params), np.asarray(res.covariance)
    # R0 = beta/gamma and 1/gamma by the delta method
    g_r0 = np.array([1.0 / est[1], -est[0] / est[1] ** 2])
    g_rt = np.array([0.0, -1.0 / est[1] ** 2])
    return {"beta": (est[0], np.sqrt(cov[0, 0])), "gamma": (est[1], np.sqrt(cov[1, 1])),
            "R0": (est[0] / est[1], float(np.sqrt(g_r0 @ cov @ g_r0))),
            "recovery_time": (1.0 / est[1], float(np.sqrt(g_rt @ cov @ g_rt)))}, res


def predictive_bands(draws: dict, cases: np.ndarray, key, n_draws: int = 400):
    """5 %, 50 % and 95 % quantiles of posterior predictive counts on a fine grid of days
    (negative binomial draws around I(t) of posterior draws), and I(t) itself."""
    flat = {k: v.reshape(-1) for k, v in draws.items()}
    # at most n_draws draws (a short run, such as the CLI test's, may have fewer)
    n_draws = min(n_draws, flat["beta"].size)
    pick = np.random.default_rng(0).choice(flat["beta"].size, n_draws, replace=False)
    days = np.arange(1.0, len(cases) + 1.0)
    infected = jax.jit(jax.vmap(lambda b, g: solve_sir(b, g, days).ys[:, 1]))(
        flat["beta"][pick], flat["gamma"][pick])
    phi = 1.0 / flat["phi_inv"][pick][:, None]
    # a negative binomial draw: Poisson with a gamma-distributed mean (shape phi, mean I)
    k1, k2 = jax.random.split(key)
    lam = jax.random.gamma(k1, phi * np.ones_like(infected)) * infected / phi
    counts = jax.random.poisson(k2, lam)
    return days, np.quantile(np.asarray(counts), [0.05, 0.5, 0.95], axis=0), \
        np.quantile(np.asarray(infected), [0.05, 0.5, 0.95], axis=0)


def plot(path, draws, cases, bands, sampler, quiet):
    plt = cli.pyplot()

    fig = plt.figure(figsize=(13, 7))
    grid = fig.add_gridspec(2, 3)
    for j, name in enumerate(NAMES):  # trace plots, one line per chain
        ax = fig.add_subplot(grid[0, j])
        for c in range(draws[name].shape[0]):
            ax.plot(draws[name][c], lw=0.4, alpha=0.8, label=f"chain {c}")
        ax.set(title=f"trace: {name}", xlabel="draw")
    ax = fig.add_subplot(grid[1, 0])  # pairs: beta against gamma, coloured by chain
    for c in range(draws["beta"].shape[0]):
        ax.plot(draws["beta"][c], draws["gamma"][c], ".", ms=1.5, alpha=0.5)
    ax.set(xlabel="beta", ylabel="gamma", title="pairs: beta, gamma")
    ax = fig.add_subplot(grid[1, 1])
    r0 = (draws["beta"] / draws["gamma"]).ravel()
    ax.hist(r0, bins=50, color="C2", alpha=0.7, density=True)
    ax.axvline(PUBLISHED["R0"][0], color="k", ls="--", label="Stan (paper)")
    ax.set(xlabel="R0 = beta / gamma", title="posterior of R0")
    ax.legend(fontsize=8)
    days, counts_q, infected_q = bands
    ax = fig.add_subplot(grid[1, 2])
    ax.fill_between(days, counts_q[0], counts_q[2], color="C1", alpha=0.35,
                    label="90 % predictive band")
    ax.plot(days, infected_q[1], "C1-", lw=1, label="median I(t)")
    ax.plot(days, cases, "ko", ms=3, label="pupils in bed")
    ax.set(xlabel="day", ylabel="pupils", title="posterior predictive check")
    ax.legend(fontsize=8)
    fig.suptitle(f"SIR, boarding school 1978: NUTS ({sampler}) with simlib.solve inside")
    fig.tight_layout()
    cli.save_figure(fig, path, quiet=quiet)


def require_bayes_extra(parser, sampler: str) -> None:
    """Exit with status 1 and one line, before any work, when the sampler or ArviZ (the
    optional ``bayes`` extra) is not installed."""
    for name in (sampler, "arviz"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # ArviZ's notice of its refactor
                importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name != name:  # installed, but broken: its own traceback says more
                raise
            parser.exit(1, f"{parser.prog}: error: needs {name}: "
                        "pip install 'simlib[bayes]'\n")


def parse(argv):
    p = cli.ExampleParser(__doc__)
    p.add_argument("--sampler", choices=["numpyro", "blackjax"], default="numpyro",
                   help="the NUTS implementation")
    p.add_argument("--chains", type=cli.positive_int, default=4, help="Markov chains")
    p.add_argument("--warmup", type=cli.positive_int, default=1000,
                   help="warm-up (adaptation) iterations per chain")
    p.add_argument("--samples", type=cli.positive_int, default=1000,
                   help="draws per chain after warm-up")
    p.add_argument("--max-steps", type=cli.positive_int, default=256,
                   help="step budget of each solve (docs/bayes.md: a proposal that needs "
                   "more is rejected)")
    p.add_argument("--seed", type=cli.seed, default=0, help="PRNG seed of the sampler")
    cli.add_output_options(p)
    args = p.parse_args(argv)
    require_bayes_extra(p, args.sampler)
    return args


@cli.script
def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    jax.config.update("jax_enable_x64", True)
    say = cli.printer(args.quiet)
    cases = read_cases()
    log_lik = make_log_likelihood(cases, args.max_steps)
    key = jax.random.key(args.seed)
    if args.sampler == "numpyro":
        draws, diverging, leapfrogs, wall = run_numpyro(numpyro_model(log_lik), args, key)
    else:
        zs, diverging, leapfrogs, wall = run_blackjax(blackjax_logdensity(log_lik), 3, args,
                                                      key)
        draws = {name: np.exp(zs[..., i]) for i, name in enumerate(NAMES)}
    table, n_div = diagnostics(dict(draws, R0=draws["beta"] / draws["gamma"],
                                    recovery_time=1.0 / draws["gamma"]), diverging)
    estimate, _ = point_estimate(cases)

    say(f"NUTS ({args.sampler}), {args.chains} chains x ({args.warmup} warm-up + "
        f"{args.samples} draws), {wall:.1f} s with compilation; "
        f"{leapfrogs.mean():.1f} leapfrog steps per draw, {n_div} divergences")
    say(f"  {'':14s} {'mean':>7s} {'sd':>6s} {'R-hat':>6s} {'ESS bulk':>8s} {'ESS tail':>8s}"
        f" {'paper':>6s} {'|diff|/sd':>9s}  {'LM':>6s} {'GN se':>6s}")
    worst_rhat, worst_diff = 0.0, 0.0
    for name in ["beta", "gamma", "phi_inv", "R0", "recovery_time"]:
        row = table.loc[name]
        line = (f"  {name:14s} {row['mean']:7.3f} {row['sd']:6.3f} {row['r_hat']:6.3f} "
                f"{row['ess_bulk']:8.0f} {row['ess_tail']:8.0f}")
        worst_rhat = max(worst_rhat, float(row["r_hat"]))
        if name in PUBLISHED:
            diff = abs(row["mean"] - PUBLISHED[name][0]) / row["sd"]
            worst_diff = max(worst_diff, diff)
            line += f" {PUBLISHED[name][0]:6.3f} {diff:9.2f}"
            line += f"  {estimate[name][0]:6.3f} {estimate[name][1]:6.3f}"
        say(line)

    if args.plot:
        bands = predictive_bands(draws, cases, jax.random.key(args.seed + 1))
        plot(args.plot, draws, cases, bands, args.sampler, args.quiet)
    if args.out:
        cli.save_result(args.out, dict(model="sir_boarding_school", sampler=args.sampler),
                        quiet=args.quiet, diverging=diverging,
                        **{name: draws[name] for name in NAMES})
    cli.summary(f"sir_boarding_school: NUTS ({args.sampler}), {args.chains} chains",
                run_s=wall, result=f"R0 {table.loc['R0', 'mean']:.2f} ± "
                f"{table.loc['R0', 'sd']:.2f}; max R-hat {worst_rhat:.3f}; "
                f"max |mean - paper| {worst_diff:.2f} sd; {n_div} divergences")


if __name__ == "__main__":
    sl.fast_cpu_loops()  # before any JAX work: small loops compiled whole (docs/gradients.md)
    main()
