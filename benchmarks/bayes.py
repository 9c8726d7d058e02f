"""Bayesian inference benchmark: NUTS (numpyro) on the boarding-school SIR model, simlib
inside the log density against diffrax inside the same log density.

The problem (issue 26) is ``examples/sir_boarding_school.py``: the 1978 influenza outbreak
(14 daily counts of pupils in bed, N = 763), an SIR model from (762, 1, 0), a negative
binomial likelihood and the priors of Grinsztajn et al. (2021). Both contenders use
the same numpyro model (``TruncatedNormal`` priors, ``numpyro.factor`` of the
log-likelihood), the same NUTS settings (numpyro's defaults: target acceptance 0.8, tree
depth 10, diagonal mass matrix), 4 chains of 1,000 warm-up and 1,000 draws
(``chain_method="vectorized"``), the same seed, and the same solve: Tsit5 with
rtol = atol = 1e-6 (Stan's rk45 defaults), saved at days 1..14, a step budget of 256.

* ``simlib``: ``sl.solve`` under ``sl.log_density`` (a failed solve gives -inf with a
  zero gradient), default gradient strategy (forward mode: two differentiated rates).
* ``diffrax``: ``diffeqsolve(ODETerm, Tsit5(), PIDController(rtol, atol), SaveAt(ts=...),
  max_steps=256, throw=False)`` with its default adjoint (``RecursiveCheckpointAdjoint``),
  the log-likelihood ``jnp.where``-d to -inf where ``result`` is not successful: what a
  diffrax user writes.

Measured, in one run: three ``mcmc.run`` of one ``MCMC`` object with the same key
(numpyro keeps its compiled sampler): run time, the faster of the second and third;
compile time, the first less that; the draws are the same in all three,
effective samples per second of the slowest parameter (ArviZ bulk ESS of beta, gamma,
phi_inv over run time), R-hat, divergences, the posterior means of both, the gradient cost
per leapfrog step (run time over the total number of leapfrog steps of the 4 chains, and
one ``value_and_grad`` of the potential alone, the 4 chains vmapped), and for simlib:
the gradient cost of each strategy (default, ``ForwardMode``, ``Direct``,
``Checkpointed``) and of the step budget (``max_steps`` 64 to 4,096: compile time,
a gradient at the posterior mean, a gradient at a proposal that exhausts the budget).

    flock -x /tmp/simlib_cpu.lock python benchmarks/bayes.py            # ~5 min on 2 cores
    python benchmarks/bayes.py --quick                                  # 1 chain, 200 + 200
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
RESULTS_PATH = ROOT / "benchmarks" / "results" / "bayes.json"

import simlib as sl  # noqa: E402

if "--no-fast-cpu-loops" not in sys.argv:
    sl.fast_cpu_loops()  # process-wide, before JAX starts: diffrax gets it too

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _format import finish, fmt_r, fmt_s, simlib_commit  # noqa: E402
from _timing import Timer, best_of, compile_jit, load_average, timed, warm_up  # noqa: E402

jax.config.update("jax_enable_x64", True)

_spec = importlib.util.spec_from_file_location(
    "sir_boarding_school", ROOT / "examples" / "sir_boarding_school.py")
sir_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sir_example)

PARAMS = ("beta", "gamma", "phi_inv")


def simlib_log_lik(cases, max_steps=256, adjoint=None):
    days = np.arange(1.0, len(cases) + 1.0)

    def log_lik(beta, gamma, phi_inv):
        sol = sir_example.solve_sir(beta, gamma, days, max_steps=max_steps, adjoint=adjoint)
        return jnp.sum(sir_example.negbin_logpmf(cases, sol.ys[:, 1], 1.0 / phi_inv)), sol

    return sl.log_density(log_lik)


def diffrax_log_lik(cases, max_steps=256):
    import diffrax

    days = np.arange(1.0, len(cases) + 1.0)
    t1 = float(days[-1])
    term = diffrax.ODETerm(sir_example.sir)

    def log_lik(beta, gamma, phi_inv):
        sol = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), 0.0, t1, None, jnp.asarray(sir_example.Y0),
            args=(beta, gamma), saveat=diffrax.SaveAt(ts=jnp.asarray(days)),
            stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-6),
            max_steps=max_steps, throw=False)
        value = jnp.sum(sir_example.negbin_logpmf(cases, sol.ys[:, 1], 1.0 / phi_inv))
        return jnp.where(sol.result == diffrax.RESULTS.successful, value, -jnp.inf)

    return log_lik


model_for = sir_example.numpyro_model  # the example's model: same priors, same factor


def run_nuts(log_lik, opts, seed):
    """(draws, diverging, leapfrog counts, compile s, run s). Three runs of one ``MCMC``
    object with the same key (numpyro keeps the compiled sampler between runs): the run
    time is the faster of the second and third (the least disturbed by other work on the
    machine), the compile time the first run's time less it."""
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(NUTS(model_for(log_lik)), num_warmup=opts.warmup, num_samples=opts.samples,
                num_chains=opts.chains, chain_method="vectorized", progress_bar=False)
    def run():
        mcmc.run(jax.random.key(seed), extra_fields=("diverging", "num_steps"))
        return mcmc.get_samples()

    times = [timed(run)[1] for _ in range(3)]
    run_s = min(times[1:])
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    extra = mcmc.get_extra_fields(group_by_chain=True)
    return (draws, np.asarray(extra["diverging"]), np.asarray(extra["num_steps"]),
            times[0] - run_s, run_s, times)


def summarize(draws, diverging):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz as az
    idata = az.from_dict(posterior=draws, sample_stats={"diverging": diverging})
    table = az.summary(idata, var_names=list(PARAMS), round_to="none")
    return {p: {k: float(table.loc[p, k]) for k in ("mean", "sd", "r_hat", "ess_bulk",
                                                    "ess_tail")} for p in PARAMS}


def potential_gradient_time(log_lik, draws, chains, reps):
    """Seconds per ``value_and_grad`` of numpyro's potential (unconstrained space) at the
    chains' last draws, the chains vmapped as in ``chain_method="vectorized"``."""
    from numpyro.infer.util import initialize_model, unconstrain_fn

    info = initialize_model(jax.random.key(0), model_for(log_lik))

    points = [unconstrain_fn(model_for(log_lik), (), {}, {p: draws[p][c, -1] for p in PARAMS})
              for c in range(chains)]
    batch = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *points)
    grad = jax.jit(jax.vmap(jax.value_and_grad(info.potential_fn)))
    compile_s = timed(lambda: grad(batch))[1]
    return per_call(lambda: grad(batch), reps), compile_s


def gradient_time(fn, x, reps):
    """(seconds per call, compile seconds) of jit(fn)(*x), best of 3 blocks of ``reps``."""
    compiled, compile_s = compile_jit(fn, *x)
    warm_up(lambda: compiled(*x))
    return per_call(lambda: compiled(*x), reps), compile_s


def per_call(call, reps):
    """Seconds per call of ``call()``: the best of 3 blocks of ``reps`` calls (the last
    call's output blocked on), already warmed up."""
    def block():
        for _ in range(reps):
            out = call()
        return out

    return best_of(block, 3, slow_s=math.inf, warmup=False).best / reps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 chain of 200 warm-up and 200 draws (a smoke test)")
    parser.add_argument("--chains", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reps", type=int, default=200, help="gradient timing repetitions")
    parser.add_argument("--no-diffrax", action="store_true")
    parser.add_argument("--no-fast-cpu-loops", action="store_true",
                        help="leave XLA:CPU's small-loop limit at its default")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH)
    opts = parser.parse_args(argv)
    sir_example.require_bayes_extra(parser, "numpyro")  # one line and exit 1 without them
    if opts.quick:
        opts.chains, opts.warmup, opts.samples, opts.reps = 1, 200, 200, 20
    wall = Timer().start()
    cases = sir_example.read_cases()
    results = {"benchmark": "bayes", "commit": simlib_commit(ROOT), "chains": opts.chains,
               "warmup": opts.warmup, "samples": opts.samples, "seed": opts.seed,
               "fast_cpu_loops": not opts.no_fast_cpu_loops, "cpu_count": os.cpu_count(),
               "load_average": load_average()[0], "contenders": {}}
    contenders = {"simlib": simlib_log_lik(cases)}
    if not opts.no_diffrax:
        contenders["diffrax"] = diffrax_log_lik(cases)
    lines = [f"NUTS (numpyro), SIR boarding school, {opts.chains} chains x ({opts.warmup} "
             f"warm-up + {opts.samples} draws), vectorized chains, seed {opts.seed}; "
             f"fast_cpu_loops {'on' if not opts.no_fast_cpu_loops else 'off'}; load average "
             f"{results['load_average']:.1f} on {os.cpu_count()} cores at the start",
             f"{'':9s} {'compile':>9s} {'run':>9s} {'min ESS':>8s} {'ESS/s':>8s} "
             f"{'max R-hat':>9s} {'div':>4s} {'leapfrogs':>10s} {'s/leapfrog':>10s} "
             f"{'grad (4 ch)':>11s}  means beta, gamma, phi_inv"]
    for name, log_lik in contenders.items():
        print(f"[{name}] sampling ...", flush=True)
        draws, div, nsteps, compile_s, second, times = run_nuts(log_lik, opts, opts.seed)
        table = summarize(draws, div)
        min_ess = min(table[p]["ess_bulk"] for p in PARAMS)
        grad_s, grad_compile = potential_gradient_time(log_lik, draws, opts.chains, opts.reps)
        row = {"compile_s": compile_s, "run_s": second, "run_times_s": times,
               "min_ess_bulk": min_ess, "ess_per_s": min_ess / second,
               "max_r_hat": max(table[p]["r_hat"] for p in PARAMS),
               "divergences": int(div.sum()), "leapfrog_steps": int(nsteps.sum()),
               "s_per_leapfrog": second / nsteps.sum() * opts.chains,
               "grad_s_vmapped_chains": grad_s, "grad_compile_s": grad_compile,
               "summary": table}
        results["contenders"][name] = row
        means = ", ".join(f"{table[p]['mean']:.3f}" for p in PARAMS)
        lines.append(f"{name:9s} {fmt_s(row['compile_s']):>9s} {fmt_s(second):>9s} "
                     f"{min_ess:8.0f} {row['ess_per_s']:8.1f} {row['max_r_hat']:9.3f} "
                     f"{row['divergences']:4d} {row['leapfrog_steps']:10d} "
                     f"{fmt_s(row['s_per_leapfrog']):>10s} {fmt_s(grad_s):>11s}  {means}")
    if "diffrax" in results["contenders"]:
        s, d = results["contenders"]["simlib"], results["contenders"]["diffrax"]
        ratio = s["ess_per_s"] / d["ess_per_s"]
        results["ess_per_s_ratio"] = ratio
        lines.append(f"ESS/s of the slowest parameter, simlib / diffrax: {fmt_r(ratio)} "
                     f"(target >= 3x); compile time diffrax / simlib "
                     f"{fmt_r(d['compile_s'] / s['compile_s'])}; gradient of the potential "
                     f"diffrax / simlib "
                     f"{fmt_r(d['grad_s_vmapped_chains'] / s['grad_s_vmapped_chains'])}; "
                     f"time per leapfrog step diffrax / simlib "
                     f"{fmt_r(d['s_per_leapfrog'] / s['s_per_leapfrog'])}")

    # the gradient strategies, one chain's log-likelihood gradient at the posterior mean
    post = results["contenders"]["simlib"]["summary"]
    theta = tuple(jnp.asarray(post[p]["mean"]) for p in PARAMS)
    lines.append("simlib gradient of the log-likelihood (beta, gamma, phi_inv) at the "
                 "posterior mean, by strategy: one chain | 4 chains vmapped | compile")
    strategies = {"default": None, "ForwardMode": sl.ForwardMode(), "Direct": sl.Direct(),
                  "Checkpointed": sl.Checkpointed()}
    results["strategies"] = {}
    batch = tuple(jnp.full((4,), t) for t in theta)
    for label, adjoint in strategies.items():
        fn = jax.grad(simlib_log_lik(cases, adjoint=adjoint), argnums=(0, 1, 2))
        one, compile_s = gradient_time(fn, theta, opts.reps)
        four, _ = gradient_time(jax.vmap(fn), batch, opts.reps)
        results["strategies"][label] = {"one_s": one, "four_s": four, "compile_s": compile_s}
    base = results["strategies"]["default"]
    for label, r in results["strategies"].items():
        lines.append(f"  {label:13s} {fmt_s(r['one_s']):>9s} ({fmt_r(r['one_s'] / base['one_s'])})"
                     f" | {fmt_s(r['four_s']):>9s} ({fmt_r(r['four_s'] / base['four_s'])})"
                     f" | {fmt_s(r['compile_s'])}")

    # the step budget: what a rejected proposal costs, and what the budget costs to compile
    days = np.arange(1.0, len(cases) + 1.0)
    need = int(sir_example.solve_sir(*theta[:2], days).stats["num_steps"])
    prior = np.random.default_rng(1)
    draws_b = np.abs(prior.normal(2.0, 1.0, 2000))
    draws_g = np.abs(prior.normal(0.4, 0.5, 2000))
    steps_prior = np.asarray(jax.jit(jax.vmap(lambda b, g: sir_example.solve_sir(
        b, g, days, max_steps=100_000, throw=False).stats["num_steps"]))(draws_b, draws_g))
    results["steps"] = {"posterior_mean": need,
                        "prior_quantiles_50_90_99_max": [float(q) for q in np.quantile(
                            steps_prior, [0.5, 0.9, 0.99, 1.0])]}
    lines.append(f"step budget: Tsit5 needs {need} steps at the posterior mean; over 2,000 "
                 f"prior draws the median/90 %/99 %/max is "
                 + "/".join(f"{q:.0f}" for q in results["steps"]["prior_quantiles_50_90_99_max"])
                 + "; gradient at the posterior mean | at beta = 1e4 (budget exhausted, "
                 "rejected) | compile")
    results["budget"] = {}
    bad = (jnp.asarray(1e4), theta[1], theta[2])
    for max_steps in (64, 256, 1024, 4096):
        fn = jax.value_and_grad(simlib_log_lik(cases, max_steps=max_steps), argnums=(0, 1, 2))
        good_s, compile_s = gradient_time(fn, theta, opts.reps)
        bad_s, _ = gradient_time(fn, bad, max(2, opts.reps // 10))
        value, grads = jax.jit(fn)(*bad)
        assert float(value) == -np.inf and all(float(g) == 0.0 for g in grads)
        results["budget"][max_steps] = {"good_s": good_s, "rejected_s": bad_s,
                                        "compile_s": compile_s,
                                        "prior_rejected": float(np.mean(steps_prior
                                                                        > max_steps))}
        lines.append(f"  max_steps {max_steps:5d}: {fmt_s(good_s):>9s} | {fmt_s(bad_s):>9s} "
                     f"| {fmt_s(compile_s):>8s}; prior draws over the budget "
                     f"{results['budget'][max_steps]['prior_rejected']:.1%}")
    results["wall_s"] = wall.stop()
    return finish(results, "\n".join(lines), opts.json)


if __name__ == "__main__":
    raise SystemExit(main())
