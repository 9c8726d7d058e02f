"""Errors: eager argument checks with clear messages, and runtime failures.

Runtime failures are exercised on y' = y^2, y(0) = y0, whose solution
y = y0 / (1 - y0 t) blows up at t = 1/y0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl


def decay(t, y, args):
    return -y


def square(t, y, args):
    return y**2


def oscillator(t, y, args):
    q, p = y
    return p, -q


Y0 = jnp.array([1.0, 2.0])


# --------------------------------------------------------------------------------------
# eager argument checks


def test_f_returning_another_structure():
    with pytest.raises(ValueError, match=r"f must return the same pytree structure as y0"):
        sl.solve(lambda t, y, a: (y, y), Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.1)


def test_f_returning_another_shape():
    with pytest.raises(ValueError, match=r"f must return arrays shaped like y0.*y0 is"):
        sl.solve(lambda t, y, a: y[:1], Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.1)


def test_f_that_fails_to_trace():
    def bad(t, y, args):
        return y @ jnp.ones((3, 3))

    with pytest.raises(TypeError, match=r"calling f\(t0, y0, args\) failed"):
        sl.solve(bad, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6)


def test_dt_zero():
    with pytest.raises(ValueError, match=r"dt must be nonzero"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.0)


def test_dt_negative_for_forward_span():
    with pytest.raises(ValueError, match=r"dt=-0\.1 is negative.*forward.*positive dt"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.RK4(), dt=-0.1)
    with pytest.raises(ValueError, match=r"dt=.*negative"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, dt=-0.1)


def test_dt_non_finite():
    with pytest.raises(ValueError, match=r"dt must be finite"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.RK4(), dt=float("nan"))


@pytest.mark.parametrize("solver", [sl.RK4(), sl.Euler(), sl.VelocityVerlet()])
def test_dt_missing_for_fixed_step_solver(solver):
    y0 = (jnp.ones(1), jnp.ones(1)) if solver.symplectic else Y0
    f = oscillator if solver.symplectic else decay
    with pytest.raises(ValueError, match=rf"{type(solver).__name__} needs a step size: give dt"):
        sl.solve(f, y0, 0.0, 1.0, solver=solver)


def test_dt_missing_for_adaptive_solver_mentions_tolerances():
    with pytest.raises(ValueError, match=r"give dt .*or rtol/atol"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5())


@pytest.mark.parametrize("kw", [{"rtol": 1e-3}, {"atol": 1e-3}])
def test_tolerances_without_error_estimate(kw):
    with pytest.raises(ValueError, match=r"rtol/atol were given, but RK4 has no embedded error"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.RK4(), **kw)
    with pytest.raises(ValueError, match=r"VelocityVerlet has no embedded error estimate"):
        sl.solve(oscillator, (jnp.ones(1), jnp.ones(1)), 0.0, 1.0, solver=sl.VelocityVerlet(),
                 **kw)


@pytest.mark.parametrize("tol", [0.0, -1e-6, float("nan"), float("inf")])
def test_tolerances_must_be_positive_and_finite(tol):
    with pytest.raises(ValueError, match=r"rtol must be positive and finite"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=tol, atol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_y0(bad):
    with pytest.raises(ValueError, match=r"y0 must be finite"):
        sl.solve(decay, jnp.array([1.0, bad]), 0.0, 1.0, solver=sl.RK4(), dt=0.1)
    with pytest.raises(ValueError, match=r"y0 must be finite"):
        sl.solve(decay, {"a": jnp.ones(2), "b": jnp.array(bad)}, 0.0, 1.0, solver=sl.Tsit5(),
                 rtol=1e-6)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_span(bad):
    with pytest.raises(ValueError, match=r"t0 must be finite"):
        sl.solve(decay, Y0, bad, 1.0, solver=sl.RK4(), dt=0.1)
    with pytest.raises(ValueError, match=r"t1 must be finite"):
        sl.solve(decay, Y0, 0.0, bad, solver=sl.Tsit5(), rtol=1e-6)


def test_symplectic_solver_needs_tuple_state():
    with pytest.raises(TypeError, match=r"VelocityVerlet is a symplectic solver.*tuple \(q, p\)"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.VelocityVerlet(), dt=0.1)
    with pytest.raises(TypeError, match=r"y0 must be a tuple \(q, p\), got list"):
        sl.solve(lambda t, y, a: [y[1], -y[0]], [jnp.ones(1), jnp.ones(1)], 0.0, 1.0,
                 solver=sl.Yoshida4(), dt=0.1)


def test_unknown_keyword_suggests_the_right_one():
    with pytest.raises(TypeError, match=r"unknown keyword argument 'rtl'; did you mean 'rtol'"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtl=1e-3)
    with pytest.raises(TypeError, match=r"'max_step'; did you mean 'max_steps'"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-3, max_step=10)


@pytest.mark.parametrize(
    "kw", [{"solver": sl.Tsit5(), "rtol": 1e-6}, {"solver": sl.RK4(), "dt": 0.1}]
)
def test_save_times_outside_the_span(kw):
    with pytest.raises(ValueError, match=r"saveat.ts must lie within \[t0, t1\]"):
        sl.solve(decay, Y0, 0.0, 1.0, saveat=sl.SaveAt(ts=[0.5, 1.5]), **kw)
    with pytest.raises(ValueError, match=r"saveat.ts must lie within"):
        sl.solve(decay, Y0, 0.0, 1.0, saveat=sl.SaveAt(ts=[-0.1, 0.5]), **kw)


def test_save_times_unordered():
    with pytest.raises(ValueError, match=r"saveat.ts must be ordered .*\(increasing\)"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6,
                 saveat=sl.SaveAt(ts=[0.5, 0.2]))
    with pytest.raises(ValueError, match=r"saveat.ts must be ordered .*\(decreasing\)"):
        sl.solve(decay, Y0, 1.0, 0.0, solver=sl.Tsit5(), rtol=1e-6,
                 saveat=sl.SaveAt(ts=[0.2, 0.5]))


def test_saveat_must_choose_one_output():
    with pytest.raises(ValueError, match=r"saveat: choose exactly one"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, saveat=sl.SaveAt())
    with pytest.raises(ValueError, match=r"saveat: choose exactly one"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6,
                 saveat=sl.SaveAt(t1=True, steps=True))


def test_solver_class_instead_of_instance():
    with pytest.raises(TypeError, match=r"solver must be an instance, e.g. Tsit5\(\)"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5, rtol=1e-3)
    with pytest.raises(TypeError, match=r"solver must be a simlib solver instance"):
        sl.solve(decay, Y0, 0.0, 1.0, solver="tsit5", rtol=1e-3)


@pytest.mark.parametrize("bad", [0, -3, 2.5])
def test_max_steps_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=r"max_steps must be a positive integer"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-3, max_steps=bad)


# --------------------------------------------------------------------------------------
# runtime failures, eager


def test_step_budget_exhausted():
    with pytest.raises(sl.SolverError, match=r"max_steps=5") as info:
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-6, max_steps=5)
    err = info.value
    message = str(err)
    assert "max_steps" in message and "t=" in message and "step" in message
    assert err.result == sl.Result.MAX_STEPS_REACHED
    partial = err.solution
    assert isinstance(partial, sl.Solution)
    assert int(partial.result) == sl.Result.MAX_STEPS_REACHED
    assert int(partial.stats["num_steps"]) == 5
    t_stop = float(partial.stats["t_final"])
    assert 0.0 < t_stop < 1.0
    assert f"t={t_stop:.17g}" in message
    # The partial state is the solution at t_stop (exp(-t) y0), to the tolerance.
    np.testing.assert_allclose(np.asarray(partial.ys[0]), np.exp(-t_stop) * np.asarray(Y0),
                               rtol=1e-5)


def test_blow_up_with_fixed_step():
    with pytest.raises(sl.SolverError, match=r"non-finite") as info:
        sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.RK4(), dt=0.1)
    err = info.value
    assert err.result == sl.Result.NONFINITE_STATE
    partial = err.solution
    assert int(partial.result) == sl.Result.NONFINITE_STATE
    # t_final is where the failing step started; the exact solution has its pole at t = 1.
    t_stop = float(partial.stats["t_final"])
    step = int(partial.stats["num_steps"])
    assert 0.9 <= t_stop < 2.0
    assert step == round(t_stop / 0.1) + 1  # the failing step is counted
    assert f"t={t_stop:.17g}" in str(err) and f"(step {step})" in str(err)


def test_values_saved_before_a_failure_are_kept():
    ts = jnp.array([0.5, 0.8, 1.5])
    sol = sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.RK4(), dt=0.1,
                   saveat=sl.SaveAt(ts=ts), throw=False)
    assert int(sol.result) == sl.Result.NONFINITE_STATE
    ys = np.asarray(sol.ys)[:, 0]
    # y = 1 / (1 - t); RK4's error at dt = 0.1 grows towards the pole (1e-5, 1e-3 relative).
    np.testing.assert_allclose(ys[:2], 1.0 / (1.0 - np.array([0.5, 0.8])), rtol=1e-3)
    assert float(sol.stats["t_final"]) > 0.8


def test_blow_up_with_adaptive_step():
    with pytest.raises(sl.SolverError, match=r"step size fell below|non-finite") as info:
        sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-6)
    err = info.value
    assert err.result in (sl.Result.STEP_SIZE_TOO_SMALL, sl.Result.NONFINITE_STATE)
    # The controller cannot step past the pole at t = 1.
    assert abs(float(err.solution.stats["t_final"]) - 1.0) < 1e-3


# --------------------------------------------------------------------------------------
# runtime failures under an outer jit


def test_blow_up_under_jit_raises():
    @jax.jit
    def run(y0):
        return sl.solve(square, y0, 0.0, 2.0, solver=sl.RK4(), dt=0.1).ys

    with pytest.raises(Exception, match=r"non-finite"):
        jax.block_until_ready(run(jnp.array([1.0])))


def test_budget_under_jit_raises():
    @jax.jit
    def run(y0):
        return sl.solve(decay, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, max_steps=5).ys

    with pytest.raises(Exception, match=r"max_steps=5 was exhausted"):
        jax.block_until_ready(run(Y0))


def test_adaptive_blow_up_under_jit_raises():
    @jax.jit
    def run(y0):
        return sl.solve(square, y0, 0.0, 2.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-6).ys

    with pytest.raises(Exception, match=r"step size fell below|non-finite"):
        jax.block_until_ready(run(jnp.array([1.0])))


@pytest.mark.parametrize("output", ["t_final", "num_steps"])
def test_failure_under_jit_raises_when_only_stats_are_used(output):
    @jax.jit
    def run(y0):
        return sl.solve(square, y0, 0.0, 2.0, solver=sl.RK4(), dt=0.1).stats[output]

    with pytest.raises(Exception, match=r"non-finite"):
        jax.block_until_ready(run(jnp.array([1.0])))


def test_success_under_jit_does_not_raise():
    @jax.jit
    def run(y0):
        return sl.solve(square, y0, 0.0, 0.5, solver=sl.RK4(), dt=0.1).ys

    out = run(jnp.array([1.0]))
    np.testing.assert_allclose(np.asarray(out)[0, 0], 2.0, rtol=1e-3)


# --------------------------------------------------------------------------------------
# throw=False


def test_throw_false_reports_codes():
    budget = sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, max_steps=5,
                      throw=False)
    assert int(budget.result) == sl.Result.MAX_STEPS_REACHED
    assert budget.message == "MAX_STEPS_REACHED"
    fixed = sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.RK4(), dt=0.1, throw=False)
    assert int(fixed.result) == sl.Result.NONFINITE_STATE
    adaptive = sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.Tsit5(), rtol=1e-6,
                        atol=1e-6, throw=False)
    assert int(adaptive.result) in (sl.Result.STEP_SIZE_TOO_SMALL, sl.Result.NONFINITE_STATE)
    ok = sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, throw=False)
    assert int(ok.result) == sl.Result.SUCCESSFUL == 0
    assert ok.message == "the integration reached t1"


def test_throw_false_under_jit():
    @jax.jit
    def run(y0):
        return sl.solve(square, y0, 0.0, 2.0, solver=sl.RK4(), dt=0.1, throw=False)

    assert int(run(jnp.array([1.0])).result) == sl.Result.NONFINITE_STATE


Y0_BATCH = np.array([[0.5], [2.0], [-1.0]])  # the middle member blows up at t = 0.5
T_BATCH = 0.8


@pytest.mark.parametrize(
    "kw, rtol",
    [
        ({"solver": sl.Tsit5(), "rtol": 1e-9, "atol": 1e-9}, 1e-7),
        # RK4's global error at dt = 0.01 is below 1e-8 for the good members.
        ({"solver": sl.RK4(), "dt": 0.01}, 1e-7),
    ],
    ids=["Tsit5", "RK4"],
)
def test_vmap_with_one_bad_member(kw, rtol):
    def one(y0):
        return sl.solve(square, y0, 0.0, T_BATCH, throw=False, **kw)

    sols = jax.vmap(one)(jnp.asarray(Y0_BATCH))
    result = np.asarray(sols.result)
    assert result[0] == 0 and result[2] == 0
    assert result[1] != 0
    for i in (0, 2):
        ref = solve_ivp(lambda t, y: y**2, (0.0, T_BATCH), Y0_BATCH[i], method="DOP853",
                        rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(np.asarray(sols.ys)[i, -1], ref.y[:, -1], rtol=rtol)
        assert float(sols.stats["t_final"][i]) == T_BATCH
    assert float(sols.stats["t_final"][1]) < T_BATCH


def test_vmap_with_one_bad_member_raises_when_throwing():
    def one(y0):
        return sl.solve(square, y0, 0.0, T_BATCH, solver=sl.RK4(), dt=0.01)

    with pytest.raises(Exception, match=r"non-finite"):
        jax.block_until_ready(jax.vmap(one)(jnp.asarray(Y0_BATCH)).ys)
