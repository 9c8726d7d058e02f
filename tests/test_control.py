"""The step-size controller (simlib/_control.py, ``sl.PIDController``): the default is the
PI controller of Hairer and Wanner IV.2 bit for bit, ``dtmax`` caps the steps, ``dtmin``
stops a run with a status code, and the coefficients and the norm reach the run."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl


def decay(t, y, k):
    return -k * y


def stiff(t, y, lam):  # the step is bounded by stability: y' = -lam (y - cos t)
    return -lam * (y - jnp.cos(t))


def blow_up(t, y, args):  # y = 1 / (1 - t): infinite at t = 1
    return y**2


def _run(f, t1, controller=None, args=1.0, solver=None, tol=1e-6, **kw):
    sol = sl.solve(f, jnp.array([1.0]), 0.0, t1, solver=solver or sl.Tsit5(), rtol=tol,
                   atol=tol, args=args, saveat=sl.SaveAt(steps=True), max_steps=1024,
                   controller=controller, **kw)
    n = int(sol.stats["num_accepted"])
    return sol, np.asarray(sol.ts[:n]), np.asarray(sol.ys[:n])


def test_default_controller_takes_the_steps_of_the_explicit_pi_constants():
    """``PIDController()`` is the controller of a run given none, and equals one built
    from the PI constants (0.7/k, 0.4/k, safety 0.9, factors in [0.2, 10], at most 1 after
    a rejection); bounds that never act (a huge ``dtmax``, a tiny ``dtmin``) compile other
    code but take the very same steps, to the bit."""
    explicit = sl.PIDController(beta1=0.7, beta2=0.4, beta3=0.0, safety=0.9, factor_min=0.2,
                                factor_max=10.0, factor_reject=1.0, dtmin=None, dtmax=None,
                                norm=None)
    assert explicit == sl.PIDController()
    base, ts0, ys0 = _run(decay, 10.0, dt=8.0)  # a first step far too long: rejections
    assert int(base.stats["num_steps"]) > int(base.stats["num_accepted"])
    for controller in (explicit, sl.PIDController(dtmax=1e6, dtmin=1e-12)):
        sol, ts, ys = _run(decay, 10.0, controller, dt=8.0)
        np.testing.assert_array_equal(ts, ts0)
        np.testing.assert_array_equal(ys, ys0)
        assert {k: int(v) for k, v in sol.stats.items() if k != "t_final"} == \
            {k: int(v) for k, v in base.stats.items() if k != "t_final"}


def test_factor_is_the_pid_formula():
    """``factor`` against ``safety r^(-b1/k) r1^(b2/k) r2^(-b3/k)`` clipped, and
    ``min(safety r^(-1/k), factor_reject)`` after a rejection."""
    c = sl.PIDController(beta1=0.6, beta2=0.3, beta3=0.1, factor_reject=0.8)
    k = 5
    cases = [(0.5, 0.7, 0.9), (1e-3, 1.0, 0.2), (0.99, 1e-4, 1.0), (3.0, 0.5, 0.5),
             (200.0, 0.5, 0.5), (1e-12, 1.0, 1.0), (math.inf, 1.0, 1.0)]
    r, r1, r2 = (jnp.array(x) for x in zip(*cases, strict=True))
    factors = jax.jit(jax.vmap(lambda r, r1, r2: c.factor(
        jnp.log(jnp.maximum(r, 1e-10)), (jnp.log(r1), jnp.log(r2)), k)))(r, r1, r2)
    assert float(factors[-1]) == pytest.approx(0.2)  # a non-finite error: factor_min
    for (r, r1, r2), got in zip(cases[:-1], np.asarray(factors[:-1]), strict=True):
        if r <= 1:
            want = 0.9 * max(r, 1e-10) ** (-0.6 / k) * r1 ** (0.3 / k) * r2 ** (-0.1 / k)
        else:
            want = min(0.9 * r ** (-1 / k), 0.8)
        assert got == pytest.approx(min(10.0, max(0.2, want)), rel=1e-13), (r, r1, r2)


def test_dtmax_caps_every_step():
    """Every step, the given first one (``dt``) included, is at most ``dtmax``."""
    span, dtmax = 10.0, 0.25
    free, ts_free, _ = _run(decay, span, dt=8.0)
    sol, ts, ys = _run(decay, span, sl.PIDController(dtmax=dtmax), dt=8.0)
    steps = np.diff(np.concatenate([[0.0], ts]))
    assert int(sol.result) == 0 and ts[-1] == span
    assert steps.max() <= dtmax * (1 + 1e-12)
    assert len(ts) >= math.ceil(span / dtmax) > len(ts_free)
    np.testing.assert_allclose(ys[-1], [math.exp(-span)], rtol=1e-5)


def test_dtmin_stops_the_run_with_a_status_code():
    """Near the singularity of y' = y^2 at t = 1 the controller wants ever shorter steps:
    with ``dtmin`` the run stops there with ``STEP_SIZE_TOO_SMALL`` (not a silent pass),
    well before the resolution of ``t`` would stop it; ``throw=True`` raises it."""
    dtmin = 1e-4
    sol, ts, _ = _run(blow_up, 2.0, sl.PIDController(dtmin=dtmin), throw=False)
    assert sl.Result(int(sol.result)) == sl.Result.STEP_SIZE_TOO_SMALL
    t_stop = float(sol.stats["t_final"])
    assert 0.99 < t_stop < 1.0
    assert np.diff(ts).min() >= dtmin  # no accepted step below dtmin
    free, _, _ = _run(blow_up, 2.0, throw=False)
    assert sl.Result(int(free.result)) == sl.Result.STEP_SIZE_TOO_SMALL
    assert float(free.stats["t_final"]) > t_stop
    with pytest.raises(sl.SolverError, match="dtmin") as info:
        _run(blow_up, 2.0, sl.PIDController(dtmin=dtmin))
    assert info.value.result == sl.Result.STEP_SIZE_TOO_SMALL


@pytest.mark.slow
def test_coefficients_and_norm_reach_the_run():
    """An elementary controller (``beta1 = 1``, ``beta2 = 0``) rejects far more steps
    where stability bounds the step (Hairer and Wanner 1996, IV.2), and a max norm over
    twice the error is stricter than the RMS norm."""
    pi, _, _ = _run(stiff, 3.0, args=500.0, tol=1e-3)
    i_ctrl, _, _ = _run(stiff, 3.0, sl.PIDController(beta1=1.0, beta2=0.0), args=500.0,
                        tol=1e-3)
    rejected = [int(s.stats["num_steps"]) - int(s.stats["num_accepted"]) for s in (pi, i_ctrl)]
    assert rejected[1] >= 5 * max(rejected[0], 1), rejected

    def max_norm(e):
        return 2 * max(jnp.max(jnp.abs(x)) for x in jax.tree_util.tree_leaves(e))

    rms, _, _ = _run(decay, 5.0)
    strict, _, ys = _run(decay, 5.0, sl.PIDController(norm=max_norm))
    assert int(strict.stats["num_accepted"]) > int(rms.stats["num_accepted"])
    np.testing.assert_allclose(ys[-1], [math.exp(-5.0)], rtol=1e-5)


def test_controller_arguments_are_checked():
    with pytest.raises(TypeError, match="PIDController"):
        sl.solve(decay, jnp.ones(1), 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, args=1.0,
                 controller={"dtmax": 0.1})
    with pytest.raises(ValueError, match="adaptive"):
        sl.solve(decay, jnp.ones(1), 0.0, 1.0, solver=sl.RK4(), dt=0.1, args=1.0,
                 controller=sl.PIDController())
    for bad in (dict(safety=1.5), dict(factor_min=2.0), dict(dtmax=-1.0),
                dict(dtmin=1.0, dtmax=0.5), dict(beta1=math.nan), dict(norm="rms")):
        with pytest.raises((ValueError, TypeError)):
            sl.PIDController(**bad)


@pytest.mark.slow
def test_ensemble_and_bdf_take_the_controller():
    """``solve_ensemble`` runs each member under the controller, as ``solve`` does; BDF's
    own step rule is still bounded by ``dtmax``."""
    dtmax = 0.5
    ctrl = sl.PIDController(dtmax=dtmax)
    ens = sl.solve_ensemble(decay, jnp.ones((2, 1)), 0.0, jnp.array([2.0, 6.0]),
                            solver=sl.Tsit5(), rtol=1e-6, atol=1e-6, args=1.0,
                            controller=ctrl, min_bucket=2)
    for i, t1 in enumerate((2.0, 6.0)):
        one = sl.solve(decay, jnp.ones(1), 0.0, t1, solver=sl.Tsit5(), rtol=1e-6, atol=1e-6,
                       args=1.0, controller=ctrl)
        assert int(ens.stats["num_steps"][i]) == int(one.stats["num_steps"])
        assert int(one.stats["num_accepted"]) >= t1 / dtmax
    sol, ts, _ = _run(decay, 4.0, ctrl, solver=sl.BDF(), tol=1e-4)
    assert int(sol.result) == 0
    assert np.diff(np.concatenate([[0.0], ts])).max() <= dtmax * (1 + 1e-12)


@pytest.mark.slow
def test_replay_and_sde_take_the_controller():
    """The reverse-mode replay (a bounded scan) takes the forward loop's attempts to the
    bit under a controller with every field changed (a derivative term, ``dtmax``, a max
    norm); an adaptive SDE run honours ``dtmax`` too."""
    from simlib import _adaptive

    ctrl = sl.PIDController(beta1=0.5, beta2=0.3, beta3=0.1, safety=0.8, factor_max=5.0,
                            dtmax=0.3, norm=lambda e: jnp.max(jnp.abs(e)))

    def vdp(t, y, a):
        return jnp.stack([y[1], a[0] * (1 - y[0] ** 2) * y[1] - y[0]])

    inputs = dict(y0=jnp.array([2.0, 0.0]), t0=jnp.asarray(0.0), t1=jnp.asarray(10.0),
                  dt0=None, rtol=jnp.asarray(1e-6), atol=jnp.asarray(1e-6), ts=None,
                  args=(5.0,))

    @jax.jit
    def both(inputs):
        return (_adaptive._adaptive_forward(vdp, sl.Tsit5(), "steps", 0, 2000, **inputs,
                                            controller=ctrl),
                _adaptive._adaptive_replay(vdp, sl.Tsit5(), "steps", 0, 2000, sl.Direct(),
                                           **inputs, controller=ctrl))

    fwd, rep = both(inputs)
    assert int(fwd[0].result) == 0 and int(fwd[0].n_steps) > 100
    for a, b in zip(jax.tree_util.tree_leaves(fwd), jax.tree_util.tree_leaves(rep),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    sol = sl.solve(lambda t, y, a: -y, jnp.ones(2), 0.0, 1.0, solver=sl.StochasticHeun(),
                   diffusion=lambda t, y, a: 0.1 * y, key=jax.random.PRNGKey(0), rtol=1e-2,
                   atol=1e-2, saveat=sl.SaveAt(steps=True), max_steps=512,
                   controller=sl.PIDController(dtmax=0.05))
    n = int(sol.stats["num_accepted"])
    assert int(sol.result) == 0 and n >= 20
    assert np.diff(np.asarray(sol.ts[:n])).max() <= 0.05 * (1 + 1e-12)
