"""Readable results: how Solution, Trajectory and FitResult print, status codes by name and
compared with ``sl.Result``, and failures raised under the user's own ``jit``.

The failing runs are real and their codes are checked against closed forms: y' = y^2 from
y0 blows up at t = 1/y0, so Euler to t1 = 3 overflows for y0 >= 1 and stays finite for
y0 = 0.1; y' = -y needs more than 3 adaptive steps to reach t1 = 1 at rtol 1e-6.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import _errors as sl_errors
from simlib import particles as sp
from simlib.fit import FitResult

PAGE = Path(__file__).resolve().parent.parent / "docs" / "results.md"


def blowup(t, y, args):
    return y * y


def decay(t, y, args):
    return -y


def euler_blowup(y0):
    return sl.solve(blowup, y0, 0.0, 3.0, solver=sl.Euler(), dt=0.01, throw=False)


def short_budget(y0, throw=False):
    return sl.solve(decay, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-6,
                    max_steps=3, throw=throw)


@pytest.fixture(scope="module")
def budget():
    return short_budget(jnp.array([1.0, 2.0]))


@pytest.fixture(scope="module")
def ensemble():
    return jax.vmap(euler_blowup)(jnp.array([0.1, 1.0, 2.0]))


def test_solution_prints_status_by_name_and_stats_as_numbers(budget):
    text = repr(budget)
    assert "Array(" not in text and "dtype=" not in text
    assert "result=MAX_STEPS_REACHED" in text
    assert "ys=float64[1,2]" in text
    t_final = float(budget.stats["t_final"])
    assert 0 < t_final < 1
    assert "num_steps=3, num_accepted=3, num_rejected=0" in text
    assert f"t_final={t_final:.6g}" in text
    assert str(budget) == text


def test_result_compares_with_members_and_reads_by_name(budget):
    assert budget.result == sl.Result.MAX_STEPS_REACHED
    assert budget.result != sl.Result.SUCCESSFUL
    assert budget.status is sl.Result.MAX_STEPS_REACHED
    assert sl.Result(budget.result) is sl.Result.MAX_STEPS_REACHED
    assert str(budget.status) == "MAX_STEPS_REACHED" == f"{budget.status}"
    assert f"{budget.status:d}" == "1" and int(budget.status) == 1
    assert f"{budget.status:>19}" == "  MAX_STEPS_REACHED"
    assert budget.status_counts == {sl.Result.MAX_STEPS_REACHED: 1}
    # The leaf stays an int32 array, so the solution is an ordinary pytree.
    assert budget.result.dtype == jnp.int32
    leaves = jax.tree_util.tree_leaves(budget)
    assert any(leaf is budget.result for leaf in leaves)


def test_nonfinite_state_is_named():
    sol = euler_blowup(jnp.array([1.0]))  # exact blow-up at t = 1 < t1 = 3
    assert sol.result == sl.Result.NONFINITE_STATE
    assert sol.status is sl.Result.NONFINITE_STATE
    assert "result=NONFINITE_STATE" in repr(sol)


def test_events_and_unused_rows_are_summarised():
    """A ball dropped from 1 m hits the floor at t = sqrt(2 / 9.81): one crossing."""
    ball = sl.solve(lambda t, y, a: jnp.array([y[1], -9.81]), jnp.array([1.0, 0.0]), 0.0, 3.0,
                    solver=sl.Tsit5(), rtol=1e-10, atol=1e-10,
                    events=sl.Event(lambda t, y, a: y[0]), saveat=sl.SaveAt(steps=True),
                    max_steps=64)
    np.testing.assert_allclose(float(ball.stats["t_final"]), np.sqrt(2 / 9.81), rtol=1e-9)
    text = repr(ball)
    n = int(ball.stats["num_accepted"])
    assert "ts=float64[64] in [" in text and f"({n} finite)" in text
    assert "events=crossings [1]" in text


def test_batched_solution_counts_each_status(ensemble):
    # y0 = 0.1 blows up at t = 10 (beyond t1 = 3); y0 = 1 and 2 at t = 1 and 0.5.
    np.testing.assert_array_equal(ensemble.result == sl.Result.NONFINITE_STATE,
                                  [False, True, True])
    assert ensemble.status_counts == {sl.Result.SUCCESSFUL: 1, sl.Result.NONFINITE_STATE: 2}
    text = repr(ensemble)
    assert "batch=(3,)" in text
    assert "result={SUCCESSFUL: 1, NONFINITE_STATE: 2}" in text
    assert "ys=float64[3,1]" in text
    steps = np.asarray(ensemble.stats["num_steps"])
    assert f"num_steps={steps.min()}..{steps.max()}" in text
    with pytest.raises(ValueError, match="batched.*status_counts"):
        ensemble.status  # noqa: B018


def test_result_works_under_jit_vmap_grad_and_prints_traced():
    seen = []

    @jax.jit
    def failed(y0):
        sol = euler_blowup(y0)
        seen.append(repr(sol))
        return sol.result == sl.Result.NONFINITE_STATE

    assert bool(failed(jnp.array([2.0])))
    assert not bool(failed(jnp.array([0.1])))
    assert "result=traced" in seen[0] and "(traced)" in seen[0]
    # A solution returned from jit is the same pytree, the status an int32 array.
    out = jax.jit(euler_blowup)(jnp.array([2.0]))
    assert out.result.dtype == jnp.int32 and out.status is sl.Result.NONFINITE_STATE
    # grad flows through a run whose status is inspected: d/dy0 of exp(-1) y0 is exp(-1).
    g = jax.grad(lambda y0: jnp.where(short_budget(y0).result == sl.Result.SUCCESSFUL, 0.0,
                                      1.0) + sl.solve(decay, y0, 0.0, 1.0, solver=sl.Tsit5(),
                                                      rtol=1e-10, atol=1e-10).ys[-1])(1.0)
    np.testing.assert_allclose(float(g), np.exp(-1.0), rtol=1e-8)
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda y0: euler_blowup(y0).status)(jnp.array([1.0]))
    # Shapes only (eval_shape): the summary says so.
    abstract = repr(jax.eval_shape(euler_blowup, jnp.array([1.0])))
    assert "result=abstract" in abstract and "ys=float64[1,1]" in abstract


@pytest.mark.parametrize("native", [True, False], ids=["native", "callback"])
def test_raise_solver_errors_unwraps_the_jit_error(caplog, monkeypatch, native):
    # The check is the native custom call where it builds (the default on the CPU), else a
    # host callback; the fallback is forced here by saying the native one is unavailable.
    if native and not sl_errors.uses_native_check():
        pytest.skip("the native failure check did not build here")
    monkeypatch.setattr(sl_errors, "uses_native_check", lambda: native)
    jax.clear_caches()  # the choice is made when a solve is traced
    run = jax.jit(lambda y0: short_budget(y0, throw=True).ys)
    # Without the helper: JAX's runtime error, whose text holds the SolverError line (and,
    # from the callback, a logged traceback).
    marker = "SolverError(MAX_STEPS_REACHED)" if native else "SolverError"
    with caplog.at_level(logging.ERROR), pytest.raises(
            jax.errors.JaxRuntimeError, match=re.escape(f"{marker}: solve: the step budget")):
        run(jnp.array([1.0])).block_until_ready()
    logged = [r for r in caplog.records if "callback failed" in r.getMessage()]
    assert bool(logged) is not native
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(sl.SolverError) as info:
        with sl.raise_solver_errors():
            run(jnp.array([1.0])).block_until_ready()
    err = info.value
    assert err.result is sl.Result.MAX_STEPS_REACHED
    assert str(err).startswith("solve: the step budget max_steps=3 was exhausted at t=")
    # the JAX error is kept, not chained: the traceback ends with the message
    assert err.__cause__ is None and isinstance(err.jax_error, jax.errors.JaxRuntimeError)
    assert not [r for r in caplog.records if "callback failed" in r.getMessage()]
    # Other errors pass through unchanged; an error without a SolverError is not one.
    with pytest.raises(KeyError), sl.raise_solver_errors():
        raise KeyError("x")
    assert sl.SolverError.from_exception(RuntimeError("INTERNAL: something else")) is None


def test_from_exception_reads_every_code():
    for code in sl.Result:
        if code is sl.Result.SUCCESSFUL:
            continue
        from simlib._errors import result_message

        msg = "solve: " + result_message(code, t=0.5, step=3, t1=1.0, max_steps=9)
        wrapped = RuntimeError(f"INTERNAL: CpuCallback error\nTraceback...\nSolverError: {msg}")
        err = sl.SolverError.from_exception(wrapped)
        assert err.result is code and str(err) == msg


@pytest.fixture(scope="module")
def spring_runs():
    """Two atoms on a spring in free space: a calm run and one that flies apart."""
    energy = sp.pair_energy(sp.harmonic, sp.free())
    x0 = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    params = dict(k=1.0, r0=1.0)
    calm = sp.simulate(energy, sp.State(x0, jnp.zeros_like(x0), 1.0), params, space=sp.free(),
                       dt=0.01, n_steps=100, save_every=10, progress=False)
    v = jnp.array([[0.0, 0.0, 0.0], [jnp.inf, 0.0, 0.0]])
    bad = sp.simulate(energy, sp.State(x0, v, 1.0), params, space=sp.free(), dt=0.01,
                      n_steps=100, save_every=10, progress=False, throw=False)
    return calm, bad


def test_trajectory_prints_status_energy_and_shapes(spring_runs):
    calm, bad = spring_runs
    text = repr(calm)
    assert "Array(" not in text
    assert "result=SUCCESSFUL" in text and calm.status is sl.Result.SUCCESSFUL
    assert "frames=11 of 2 atoms in 3D, t in [0, 1]" in text
    assert "positions=float64[11,2,3]" in text
    # The energy line against the energy computed here from the saved frames: the spring's
    # E = k/2 (r - r0)^2 + kinetic, with E(0) = 0.02 exactly (at rest, stretched by 0.2).
    x, v = np.asarray(calm.positions), np.asarray(calm.velocities)
    r = np.linalg.norm(x[:, 1] - x[:, 0], axis=-1)
    e = 0.5 * (r - 1.0) ** 2 + 0.5 * np.sum(v * v, axis=(1, 2))
    drift = np.max(np.abs(e / e[0] - 1))
    assert f"E(0)=0.02, max |E/E(0) - 1|={drift:.6g}" in text
    assert "stats={n_steps=100," in text
    assert bad.result == sl.Result.NONFINITE_STATE
    assert "result=NONFINITE_STATE" in repr(bad) and "failed_atom=1" in repr(bad)


def test_fit_result_prints_a_summary():
    res = FitResult(params={"a": jnp.asarray(1.5), "w": jnp.zeros((5, 5))}, loss=0.5,
                    history=np.array([2.0, 1.0, 0.5]), grad_norm=1e-9, n_steps=2,
                    converged=True, message="gradient below tol",
                    stderr={"a": jnp.asarray(0.125), "w": jnp.ones((5, 5))},
                    compile_time=1.25, run_time=0.5)
    text = repr(res)
    for fragment in ("converged=True", "n_steps=2", "message='gradient below tol'",
                     "loss=0.5 (from 2)", "grad_norm=1e-09", "['a']: 1.5 ± 0.12",
                     "['w']: float64[5,5]",
                     "compile_time=1.25 s, run_time=0.5 s, steps_per_second=4"):
        assert fragment in text, (fragment, text)
    assert "history=" not in text


def test_results_page_runs():
    """The python blocks of docs/results.md run in order, and say what they claim."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert blocks
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in blocks:
            exec(compile(block, str(PAGE), "exec"), ns)  # noqa: S102 - our own docs
    printed = out.getvalue()
    assert "result=MAX_STEPS_REACHED" in printed
    assert ns["caught"].result is sl.Result.MAX_STEPS_REACHED
