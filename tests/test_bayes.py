"""simlib.log_density: a solve inside a log density that a sampler can always evaluate.

The references are outside simlib: central finite differences of the log-likelihood,
the closed form of the exponential decay, and (tests marked slow, or with the optional
``bayes`` extra) the samplers numpyro and blackjax and a simulation-based calibration.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _finite_differences import central_differences

import simlib as sl
from simlib._errors import failures_reported

TS = np.linspace(0.1, 1.0, 10)  # concrete save times: the solve keeps a static grid


def decay(t, y, k):
    return -k * y


def blowup(t, y, k):
    return k * y**2  # y(t) = 1 / (1/y0 - k t): infinite at t = 1/k for y0 = 1


OBS = np.exp(-1.3 * TS)  # the closed form of decay with k = 1.3, y0 = 1


def log_lik_decay(k, sigma=0.05):
    sol = sl.solve(decay, jnp.ones(1), 0.0, 1.0, solver=sl.RK4(), dt=0.01, args=k,
                   saveat=sl.SaveAt(ts=TS), throw=False)
    r = (sol.ys[:, 0] - OBS) / sigma
    return -0.5 * jnp.sum(r**2) - OBS.size * jnp.log(sigma), sol


def log_lik_blowup(k, solver, **kw):
    sol = sl.solve(blowup, jnp.ones(1), 0.0, 1.0, solver=solver, args=k,
                   saveat=sl.SaveAt(ts=TS), throw=False, **kw)
    return -0.5 * jnp.sum((sol.ys[:, 0] - 1.5) ** 2), sol


def blowup_closed_form(k):
    """Value and d/dk of ``log_lik_blowup`` from y = 1 / (1 - k t)."""
    y = 1.0 / (1.0 - k * TS)
    return -0.5 * np.sum((y - 1.5) ** 2), -np.sum((y - 1.5) * TS * y**2)


# (solver, solve options, a failing k, the code it fails with, whether jnp.where alone
# lets a NaN gradient through there)
FAILURES = {
    "max_steps": (sl.Tsit5(), dict(rtol=1e-8, atol=1e-8, max_steps=50), 2.0,
                  sl.Result.MAX_STEPS_REACHED, True),
    "nonfinite": (sl.RK4(), dict(dt=0.1), 2.0, sl.Result.NONFINITE_STATE, True),
    "newton": (sl.BackwardEuler(), dict(dt=0.5), 2.0, sl.Result.NEWTON_FAILED, False),
}


@pytest.fixture(scope="module")
def decay_logp():
    return jax.jit(jax.value_and_grad(sl.log_density(log_lik_decay)))


@pytest.fixture(scope="module")
def budget_logp():
    """The step-budget case, vmapped and compiled once for several tests."""
    solver, kw = FAILURES["max_steps"][:2]
    logp = sl.log_density(lambda k: log_lik_blowup(k, solver, **kw))
    return jax.jit(jax.vmap(jax.value_and_grad(logp)))


def test_a_successful_solve_passes_value_and_gradient_through(decay_logp):
    k = 1.1
    value, grad = decay_logp(k)
    plain = jax.jit(lambda k: log_lik_decay(k)[0])
    assert float(value) == pytest.approx(float(plain(k)), rel=1e-12)
    # the gradient against central differences of the unguarded log-likelihood
    fd = central_differences(plain, np.array(k), eps=1e-6)
    assert float(grad) == pytest.approx(float(fd), rel=1e-6)
    # and the log-likelihood against the closed form y = exp(-k t)
    closed = -0.5 * np.sum(((np.exp(-k * TS) - OBS) / 0.05) ** 2) - TS.size * np.log(0.05)
    assert float(value) == pytest.approx(closed, rel=1e-6)


@pytest.mark.parametrize("case", ["nonfinite", pytest.param("newton", marks=pytest.mark.slow)])
def test_a_failed_solve_gives_minus_inf_and_a_zero_gradient(case):
    solver, kw, k_bad, code, leaks = FAILURES[case]

    def plain(k):
        value, sol = log_lik_blowup(k, solver, **kw)
        return jnp.where(sol.result == 0, value, -jnp.inf)

    logp = jax.jit(jax.value_and_grad(sl.log_density(lambda k: log_lik_blowup(k, solver, **kw))))
    result = log_lik_blowup(k_bad, solver, **kw)[1].result
    assert int(result) == int(code)
    if leaks:  # the mechanism guarded against: jnp.where alone lets the NaN through
        assert np.isnan(float(jax.grad(plain)(k_bad)))
    value, grad = logp(k_bad)
    assert float(value) == -np.inf
    assert float(grad) == 0.0
    # a good point of the same function is untouched
    value, grad = logp(0.2)
    assert np.isfinite(float(value)) and np.isfinite(float(grad)) and float(grad) != 0.0


@pytest.mark.slow
def test_step_budget_failures_are_rejected_member_by_member_under_vmap(budget_logp):
    solver, kw, k_bad, code, _ = FAILURES["max_steps"]
    ks = jnp.array([0.2, k_bad, 0.5, 50.0, 0.9])
    values, grads = budget_logp(ks)
    results = jax.vmap(lambda k: log_lik_blowup(k, solver, **kw)[1].result)(ks)
    bad = np.asarray(results) != 0
    np.testing.assert_array_equal(bad, [False, True, False, True, False])
    assert np.all(np.asarray(results)[bad] == int(code))
    assert np.all(np.isneginf(np.asarray(values)[bad]))
    assert np.all(np.asarray(grads)[bad] == 0.0)
    for i in np.flatnonzero(~bad):  # good members: the closed form y = 1 / (1 - k t)
        value, grad = blowup_closed_form(float(ks[i]))
        assert float(values[i]) == pytest.approx(value, rel=1e-6)
        assert float(grads[i]) == pytest.approx(grad, rel=1e-5)
    # the mechanism guarded against: jnp.where alone gives a NaN gradient there
    plain = jax.grad(lambda k: jnp.where(log_lik_blowup(k, solver, **kw)[1].result == 0,
                                         log_lik_blowup(k, solver, **kw)[0], -jnp.inf))
    assert np.isnan(float(plain(k_bad)))


def test_a_non_finite_value_of_a_successful_solve_is_rejected():
    def log_lik(k):  # the log of a negative prediction when k < 0 ... of y0 = -1
        sol = sl.solve(decay, -jnp.ones(1), 0.0, 1.0, solver=sl.RK4(), dt=0.1, args=k,
                       saveat=sl.SaveAt(ts=TS), throw=False)
        return jnp.sum(jnp.log(sol.ys[:, 0])), sol

    assert int(log_lik(1.0)[1].result) == 0
    value, grad = jax.value_and_grad(sl.log_density(log_lik))(1.0)
    assert float(value) == -np.inf and float(grad) == 0.0


def test_closed_over_parameters_are_differentiated_and_zeroed_on_failure():
    solver, kw, k_bad, _, _ = FAILURES["nonfinite"]

    def model(k, scale):
        def log_lik(k):
            value, sol = log_lik_blowup(k, solver, **kw)
            return scale * value, sol  # scale comes from the closure
        return sl.log_density(log_lik)(k)

    g_good = jax.grad(model, argnums=(0, 1))(0.3, 2.0)
    fd_scale = central_differences(lambda s: model(0.3, s), np.array(2.0))
    assert float(g_good[1]) == pytest.approx(float(fd_scale), rel=1e-6)
    assert float(g_good[1]) != 0.0
    g_bad = jax.grad(model, argnums=(0, 1))(k_bad, 2.0)
    assert [float(g) for g in g_bad] == [0.0, 0.0]


def test_solves_inside_do_not_raise_without_throw_false():
    def log_lik(k):  # no throw=False: the helper's failure policy applies
        sol = sl.solve(blowup, jnp.ones(1), 0.0, 1.0, solver=sl.RK4(), dt=0.01, args=k,
                       saveat=sl.SaveAt(ts=TS))
        return -0.5 * jnp.sum((sol.ys[:, 0] - 1.5) ** 2), sol

    # vectorised chains: a member whose state blows up next to a good one
    values, grads = jax.jit(jax.vmap(jax.value_and_grad(sl.log_density(log_lik))))(
        jnp.array([0.3, 2.0]))
    assert float(values[1]) == -np.inf and float(grads[1]) == 0.0
    value, grad = blowup_closed_form(0.3)
    assert float(values[0]) == pytest.approx(value, rel=1e-6)
    assert float(grads[0]) == pytest.approx(grad, rel=1e-5)
    # outside it the same solve raises as before
    with pytest.raises(sl.SolverError, match="non-finite"):
        log_lik(2.0)


def test_failures_reported_turns_throw_off_for_solves_traced_inside():
    def run(k):
        return sl.solve(blowup, jnp.ones(1), 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6,
                        atol=1e-6, args=k, max_steps=50).result

    with failures_reported():
        assert int(jax.jit(run)(2.0)) == sl.Result.MAX_STEPS_REACHED
        assert int(run(2.0)) == sl.Result.MAX_STEPS_REACHED
    with pytest.raises(sl.SolverError):
        run(2.0)


def test_pytrees_of_solutions_and_result_arrays_are_accepted():
    def log_lik(k):
        a = log_lik_decay(k)[1]
        b = jax.vmap(lambda kk: log_lik_decay(kk)[1].result)(jnp.array([k, 2.0 * k]))
        return -jnp.sum((a.ys[:, 0] - OBS) ** 2), {"a": a, "b": b}

    assert np.isfinite(float(sl.log_density(log_lik)(1.0)))
    # a batched result with one failing member rejects the whole density
    def log_lik_one_bad(k):
        value, _ = log_lik_decay(k)
        results = jnp.array([0, int(sl.Result.MAX_STEPS_REACHED)], jnp.int32)
        return value, results

    assert float(sl.log_density(log_lik_one_bad)(1.0)) == -np.inf


def test_bad_functions_fail_loudly():
    with pytest.raises(TypeError, match="fn must be callable"):
        sl.log_density(3.0)
    with pytest.raises(TypeError, match=r"pair \(value, solutions\)"):
        sl.log_density(lambda k: -k**2)(1.0)
    with pytest.raises(TypeError, match="real scalar"):
        sl.log_density(lambda k: (jnp.ones(2) * k, jnp.int32(0)))(1.0)
    with pytest.raises(TypeError, match="got no solution"):
        sl.log_density(lambda k: (-k**2, None))(1.0)
    with pytest.raises(TypeError, match="integer"):
        sl.log_density(lambda k: (-k**2, jnp.float64(0.0)))(1.0)


# --------------------------------------------------------------------------------------
# data that no parameter can fit (nan, inf): refused where they arrive


def decay_log_lik(k, obs, sigma=0.05):
    sol = log_lik_decay(k)[1]
    return -0.5 * jnp.sum(((sol.ys[:, 0] - obs) / sigma) ** 2), sol


def test_non_finite_data_read_from_the_closure_are_refused_by_name():
    # a NaN observation made every parameter -inf, and numpyro said "Cannot find valid
    # initial parameters", which never points at the data
    obs = OBS.copy()
    obs[[3, 7]] = np.nan
    with pytest.raises(ValueError, match=r"obs holds 2 non-finite entries \(nan or inf\) of "
                       r"10, the first obs\[3\] = nan"):
        sl.log_density(lambda k: decay_log_lik(k, obs))
    sigma = np.full((1, TS.size), 0.05)
    sigma[0, 4] = np.inf
    with pytest.raises(ValueError, match=r"sigma holds 1 non-finite entry .* the first "
                       r"sigma\[0, 4\] = inf"):
        sl.log_density(lambda k: decay_log_lik(k, OBS, sigma))
    # a functools.partial's arguments, by their keyword
    with pytest.raises(ValueError, match=r"obs holds 1 non-finite entry .* obs\[2\] = -inf"):
        sl.log_density(functools.partial(decay_log_lik, obs=jnp.asarray(OBS).at[2].set(-jnp.inf)))


def test_non_finite_data_passed_to_logp_are_refused_eagerly_and_nan_in_the_graph():
    obs = jnp.asarray(OBS * (1.0 + 0.05 * np.sin(np.arange(TS.size))))
    bad = obs.at[1].set(jnp.nan)
    logp = sl.log_density(decay_log_lik)  # the data as keyword arguments of logp
    with pytest.raises(ValueError, match=r"obs holds 1 non-finite entry .* obs\[1\] = nan"):
        logp(1.1, obs=np.asarray(bad))
    # traced data (a jit taking them, a vmap over data sets): NaN, not the -inf of a
    # rejected proposal, and a zero gradient; the good data set is untouched
    grad = jax.jit(jax.vmap(jax.value_and_grad(lambda k, obs: logp(k, obs=obs))))
    values, grads = grad(jnp.array([1.1, 1.1]), jnp.stack([obs, bad]))
    assert np.isnan(float(values[1])) and float(grads[1]) == 0.0
    y = np.exp(-1.1 * TS)  # the closed form of decay
    r = (y - np.asarray(obs)) / 0.05
    assert float(values[0]) == pytest.approx(-0.5 * np.sum(r**2), rel=1e-6)
    assert float(grads[0]) == pytest.approx(np.sum(r / 0.05 * TS * y), rel=1e-5)
    assert np.isnan(float(jax.jit(lambda obs: logp(1.1, obs=obs))(bad)))


# --------------------------------------------------------------------------------------
# inside the samplers (the optional ``bayes`` extra: numpyro, blackjax)

T_OBS = np.linspace(0.1, 0.9, 5)
K_TRUE = 0.5  # y' = k y^2 from 1 blows up at t = 1/k: k > 1.11 fails before t = 0.9


def blowup_log_lik(k, obs, sigma=0.05):
    """Fixed-step RK4 (90 steps); its state becomes non-finite for k >= 1.15."""
    sol = sl.solve(blowup, jnp.ones(1), 0.0, 0.9, solver=sl.RK4(), dt=0.01, args=k,
                   saveat=sl.SaveAt(ts=T_OBS))
    return -0.5 * jnp.sum(((sol.ys[:, 0] - obs) / sigma) ** 2), sol


def blowup_data(key, k):
    return 1.0 / (1.0 - k * T_OBS) + 0.05 * jax.random.normal(key, T_OBS.shape)


@pytest.mark.slow  # ~6-16 s: numpyro's NUTS compiles
def test_numpyro_vectorized_chains_survive_a_prior_that_blows_the_model_up():
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    obs = blowup_data(jax.random.key(1), K_TRUE)
    logp = sl.log_density(lambda k: blowup_log_lik(k, obs))

    def model():
        # P(k > 1.11) = 0.33 under the prior: a third of it blows the model up
        k = numpyro.sample("k", dist.Exponential(1.0))
        numpyro.factor("obs", logp(k))

    mcmc = MCMC(NUTS(model), num_warmup=60, num_samples=60, num_chains=2,
                chain_method="vectorized", progress_bar=False)
    mcmc.warmup(jax.random.key(0), collect_warmup=True, extra_fields=("diverging",))
    warm_div = np.asarray(mcmc.get_extra_fields()["diverging"])
    mcmc.run(jax.random.key(1), extra_fields=("potential_energy", "diverging"))
    k = np.asarray(mcmc.get_samples()["k"])
    energy = np.asarray(mcmc.get_extra_fields()["potential_energy"])
    assert k.shape == (120,) and np.all(np.isfinite(k)) and np.all(np.isfinite(energy))
    assert np.all(k < 1.0 / 0.9)  # every draw is a point where the solve succeeded
    assert warm_div.any()  # ... and proposals beyond it were made, and rejected
    assert abs(np.mean(k) - K_TRUE) < 0.05


@pytest.mark.slow  # ~6-16 s: two NUTS kernels compile
def test_blackjax_vmapped_kernels_survive_a_prior_that_blows_the_model_up():
    blackjax = pytest.importorskip("blackjax")
    obs = blowup_data(jax.random.key(1), K_TRUE)
    logp = sl.log_density(lambda k: blowup_log_lik(k, obs))

    def logdensity(z):  # k = exp(z) ~ Exponential(1): log p(k) + log |dk/dz| = -k + z
        k = jnp.exp(z[0])
        return logp(k) - k + z[0]

    assert np.isneginf(float(logdensity(jnp.log(jnp.array([1.2])))))
    # one vmapped step with a step size far too large: the trajectories of the chains
    # started next to the blow-up (k = 1.08, 1.1) cross into it
    z0 = jnp.log(jnp.array([[0.4], [K_TRUE], [1.08], [1.1]]))
    big = blackjax.nuts(logdensity, step_size=1.0, inverse_mass_matrix=jnp.ones(1))
    states, info = jax.jit(jax.vmap(big.step))(jax.random.split(jax.random.key(3), 4),
                                               jax.vmap(big.init)(z0))
    assert np.isfinite(np.asarray(states.position)).all()
    assert np.isfinite(np.asarray(states.logdensity)).all()
    assert np.isfinite(np.asarray(states.logdensity_grad)).all()
    assert np.asarray(info.is_divergent)[2:].any()  # rejected, and the chain stays finite
    # then sampling with a step size for the bulk: the chains started there converge, the
    # ones at the edge of the blow-up (whose gradient is steep) stay finite beside them
    nuts = blackjax.nuts(logdensity, step_size=0.02, inverse_mass_matrix=jnp.ones(1))

    def step(states, key):
        states, info = jax.vmap(nuts.step)(jax.random.split(key, 4), states)
        return states, (states.position[:, 0], states.logdensity)

    _, (z, logd) = jax.jit(lambda s: jax.lax.scan(
        step, s, jax.random.split(jax.random.key(2), 150)))(jax.vmap(nuts.init)(z0))
    z, logd = np.asarray(z), np.asarray(logd)
    assert np.isfinite(z).all() and np.isfinite(logd).all()
    assert abs(np.mean(np.exp(z[-50:, :2])) - K_TRUE) < 0.05


@pytest.mark.slow
def test_simulation_based_calibration_ranks_are_uniform():
    """Talts et al. (2018), "Validating Bayesian inference algorithms with simulation-based
    calibration": draw k from the prior, data from the model, run NUTS through
    sl.log_density, and rank the true k among the posterior draws. With a correct solver,
    gradient and sampler the ranks are uniform; 200 replications, vmapped, in one compile."""
    blackjax = pytest.importorskip("blackjax")
    scipy_stats = pytest.importorskip("scipy.stats")
    n_rep, n_keep, thin = 200, 99, 5  # ranks in 0..99

    def run(key):
        k_key, data_key, chain_key = jax.random.split(key, 3)
        k_true = 0.3 * jnp.exp(0.3 * jax.random.normal(k_key))  # log k ~ N(log 0.3, 0.3)
        obs = blowup_data(data_key, k_true)
        logp = sl.log_density(lambda k: blowup_log_lik(k, obs))

        def logdensity(z):
            return logp(jnp.exp(z)) - 0.5 * ((z - jnp.log(0.3)) / 0.3) ** 2

        warm_key, sample_key = jax.random.split(chain_key)
        warmup = blackjax.window_adaptation(blackjax.nuts, logdensity)
        (state, params), _ = warmup.run(warm_key, jnp.log(0.3), num_steps=200)
        kernel = blackjax.nuts(logdensity, **params).step

        def step(state, key):
            state, _ = kernel(key, state)
            return state, state.position

        _, zs = jax.lax.scan(step, state, jax.random.split(sample_key, n_keep * thin))
        return jnp.sum(zs[::thin] < jnp.log(k_true))

    ranks = np.asarray(jax.jit(jax.vmap(run))(jax.random.split(jax.random.key(26), n_rep)))
    counts = np.bincount(ranks // 10, minlength=10)  # 10 bins of 10 ranks each
    p_chi2 = scipy_stats.chisquare(counts).pvalue
    p_ks = scipy_stats.kstest((ranks + 0.5) / (n_keep + 1), "uniform").pvalue
    assert p_chi2 > 0.01 and p_ks > 0.01, (counts, p_chi2, p_ks)
