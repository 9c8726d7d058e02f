"""``solve_ensemble``: adaptive ensembles in chunks, finished members dropped.

Checked against ``jax.vmap(solve)`` member by member (the same step attempts, so the same
statistics and status codes, values to round-off), against scipy's DOP853 at tight
tolerance (error in units of ``atol + rtol |y|``, at most 10, the criterion of
tests/test_adaptive.py over at most ~1.5 cycles of Lotka-Volterra) and against closed
forms (decay, harmonic oscillator, the blow-up of ``y' = y^2``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl
from simlib import _compact

TOL = 1e-8
LV_P = (1.5, 1.0, 3.0, 1.0)


def lotka_volterra(t, y, p, xp=jnp):
    a, b, c, d = p
    return xp.stack([a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]])


N = 24
Y0S = np.stack([1.0 + 0.05 * np.arange(N), 1.0 + 0.02 * np.arange(N)[::-1]], axis=1)
# every 8th member runs ten times as long as the others
T1S = np.where(np.arange(N) % 8 == 7, 5.0, 0.5)
TS = np.linspace(0.0, 0.5, 6)


def _vmapped(saveat, t1s=T1S, max_steps=4096, y0s=Y0S):
    def one(y0, t1):
        return sl.solve(lotka_volterra, y0, 0.0, t1, solver=sl.Tsit5(), rtol=TOL, atol=TOL,
                        args=LV_P, saveat=saveat, max_steps=max_steps, throw=False)
    return jax.jit(jax.vmap(one))(jnp.asarray(y0s), jnp.asarray(t1s))


def _compacted(saveat, t1s=T1S, **kw):
    kw = dict(dict(throw=False, chunk_steps=8, min_bucket=4), **kw)
    return sl.solve_ensemble(lotka_volterra, Y0S, 0.0, t1s, solver=sl.Tsit5(), rtol=TOL,
                             atol=TOL, args=LV_P, saveat=saveat, **kw)


def _assert_same_solution(a, b):
    np.testing.assert_allclose(np.asarray(a.ts), np.asarray(b.ts), rtol=1e-13, atol=0)
    np.testing.assert_allclose(np.asarray(a.ys), np.asarray(b.ys), rtol=1e-12, atol=1e-14)
    for k in ("num_steps", "num_accepted", "num_rejected", "num_fevals"):
        np.testing.assert_array_equal(np.asarray(a.stats[k]), np.asarray(b.stats[k]), err_msg=k)
    # t_final of a member that ran out of steps: the step sizes carry the relative round-off
    # of the error estimate (a difference of two solutions equal to ~TOL), ~1e-16 / TOL;
    # solve() on one member and vmap(solve) differ from each other as much
    np.testing.assert_allclose(np.asarray(a.stats["t_final"]), np.asarray(b.stats["t_final"]),
                               rtol=1e-7)
    np.testing.assert_array_equal(np.asarray(a.result), np.asarray(b.result))


def _scipy(y0, t1, t_eval=None):
    ref = solve_ivp(lambda t, y: lotka_volterra(t, y, LV_P, xp=np), (0.0, t1), y0,
                    method="DOP853", rtol=1e-13, atol=1e-13, t_eval=t_eval)
    assert ref.success
    return ref.y.T


def _error_units(y, ref):
    return float(np.max(np.abs(y - ref) / (TOL + TOL * np.abs(ref))))


@pytest.mark.parametrize("saveat", [sl.SaveAt(t1=True), sl.SaveAt(ts=TS, t0=True)],
                         ids=["t1", "ts+t0"])
def test_equals_vmap_of_solve_member_by_member(saveat):
    sol = _compacted(saveat)
    ref = _vmapped(saveat)
    assert sol.ys.shape == ref.ys.shape and sol.ts.shape == ref.ts.shape
    _assert_same_solution(sol, ref)
    # the long members took far more steps than the short ones: the case that compacts
    steps = np.asarray(sol.stats["num_steps"])
    assert steps[T1S == 5.0].min() > 5 * steps[T1S == 0.5].max()
    assert np.all(np.asarray(sol.result) == sl.Result.SUCCESSFUL)


def test_matches_scipy_at_t1_and_at_the_save_times():
    end = _compacted(sl.SaveAt(t1=True))
    dense = _compacted(sl.SaveAt(ts=TS))
    for i in (0, 7, 13, 15):   # short and long members
        err = _error_units(np.asarray(end.ys[i, -1]), _scipy(Y0S[i], T1S[i])[-1])
        assert err <= 10, (i, err)
        err = _error_units(np.asarray(dense.ys[i]), _scipy(Y0S[i], T1S[i], TS))
        assert err <= 10, (i, err)


@pytest.mark.slow
def test_chunk_size_and_buckets_do_not_change_the_result():
    ref = _vmapped(sl.SaveAt(ts=TS))
    for kw in (dict(chunk_steps=1, min_bucket=1), dict(chunk_steps=5, min_bucket=2),
               dict(chunk_steps=10_000, min_bucket=64)):
        _assert_same_solution(_compacted(sl.SaveAt(ts=TS), **kw), ref)


def test_compiles_one_chunk_per_bucket_and_nothing_on_a_second_call():
    _compact._chunk.clear_cache()
    _compacted(sl.SaveAt(t1=True), chunk_steps=3, min_bucket=1)
    # buckets: n = 24, then powers of two below it; 3 long members: 24, 4, 2, 1 at most
    assert 2 <= _compact._chunk._cache_size() <= 4
    before = _compact._chunk._cache_size()
    t1s = T1S.copy()                   # new arrays, the same shapes and the same buckets
    sol = _compacted(sl.SaveAt(t1=True), t1s=t1s, chunk_steps=3, min_bucket=1)
    assert _compact._chunk._cache_size() == before
    assert _compact._bucket(3, 24, 1) == 4 and _compact._bucket(17, 24, 1) == 24
    assert _compact._bucket(1, 4, 1) == 1 and _compact._bucket(1, 24, 8) == 8
    _assert_same_solution(sol, _vmapped(sl.SaveAt(t1=True), t1s=t1s))


def test_a_member_out_of_steps_fails_alone():
    saveat = sl.SaveAt(ts=TS)
    sol = _compacted(saveat, max_steps=40)
    ref = _vmapped(saveat, max_steps=40)
    _assert_same_solution(sol, ref)
    long = T1S == 5.0
    codes = np.asarray(sol.result)
    assert np.all(codes[long] == sl.Result.MAX_STEPS_REACHED)
    assert np.all(codes[~long] == sl.Result.SUCCESSFUL)
    assert np.all(np.asarray(sol.stats["num_steps"])[long] == 40)
    assert np.all(np.asarray(sol.stats["t_final"])[long] < 5.0)
    for i in (0, 8):   # the others are as good as ever
        assert _error_units(np.asarray(sol.ys[i]), _scipy(Y0S[i], T1S[i], TS)) <= 10
    # throw=True: the first failing member is named, the whole solution kept
    with pytest.raises(sl.SolverError, match=r"member 7 \(of 3 failing of 24\).*max_steps=40") \
            as info:
        _compacted(saveat, max_steps=40, throw=True)
    assert info.value.result == sl.Result.MAX_STEPS_REACHED
    _assert_same_solution(info.value.solution, ref)


def square(t, y, args):
    return y**2


def test_a_blowing_up_member_is_reported_and_the_others_are_exact():
    # y' = y^2, y(0) = y0: y = y0 / (1 - y0 t), infinite at t = 1 / y0
    y0s = np.array([[0.5], [2.0], [0.25], [-1.0]])
    sol = sl.solve_ensemble(square, y0s, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-10,
                            atol=1e-10, throw=False, min_bucket=1)
    ref = jax.vmap(lambda y0: sl.solve(square, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-10,
                                       atol=1e-10, throw=False))(jnp.asarray(y0s))
    codes = np.asarray(sol.result)
    assert codes[1] != 0 and codes[1] == int(ref.result[1])
    assert float(sol.stats["t_final"][1]) < 0.5 + 1e-6   # it stopped at the singularity
    ok = [0, 2, 3]
    assert np.all(codes[ok] == 0)
    exact = y0s[ok, 0] / (1 - y0s[ok, 0])
    np.testing.assert_allclose(np.asarray(sol.ys)[ok, -1, 0], exact, rtol=1e-8)
    np.testing.assert_array_equal(np.asarray(sol.stats["num_steps"]),
                                  np.asarray(ref.stats["num_steps"]))


def oscillator(t, y, args):
    omega, damping = args
    return {"q": y["p"], "p": -omega**2 * y["q"] - damping * y["p"]}


def test_pytree_state_with_per_member_parameters():
    omegas = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    y0s = {"q": np.ones(5), "p": np.zeros(5)}
    ts = np.linspace(0.0, 2.0, 9)
    sol = sl.solve_ensemble(oscillator, y0s, 0.0, 2.0, solver=sl.Dopri5(), rtol=1e-10,
                            atol=1e-10, args=(omegas, 0.0), args_axes=(0, None),
                            saveat=sl.SaveAt(ts=ts), chunk_steps=16, min_bucket=8)
    assert set(sol.ys) == {"q", "p"} and sol.ys["q"].shape == (5, 9)
    wt = omegas[:, None] * ts[None, :]
    np.testing.assert_allclose(np.asarray(sol.ys["q"]), np.cos(wt), atol=1e-7)
    np.testing.assert_allclose(np.asarray(sol.ys["p"]) / omegas[:, None], -np.sin(wt),
                               atol=1e-7)
    steps = np.asarray(sol.stats["num_steps"])
    assert np.all(np.diff(steps) > 0)   # faster oscillators take more steps


def decay(t, y, k):
    return -k * y


def test_float32_stays_float32_and_matches_the_closed_form():
    ks = np.array([0.5, 1.0, 2.0, 30.0], np.float32)
    y0s = np.ones((4, 1), np.float32)
    ts = np.linspace(0.0, 1.0, 5).astype(np.float32)
    sol = sl.solve_ensemble(decay, y0s, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-5, atol=1e-7,
                            args=ks, args_axes=0, saveat=sl.SaveAt(ts=ts), min_bucket=2)
    # the state stays float32; time is carried in the default float (float64 under x64)
    assert sol.ys.dtype == jnp.float32 and sol.ts.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(sol.ys)[..., 0], np.exp(-np.outer(ks, ts)),
                               rtol=2e-4, atol=1e-6)
    ref = jax.vmap(lambda y0, k: sl.solve(decay, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-5,
                                          atol=1e-7, args=k, saveat=sl.SaveAt(ts=ts)))(
        jnp.asarray(y0s), jnp.asarray(ks))
    np.testing.assert_array_equal(np.asarray(sol.stats["num_steps"]),
                                  np.asarray(ref.stats["num_steps"]))
    np.testing.assert_allclose(np.asarray(sol.ys), np.asarray(ref.ys), rtol=1e-6)


def test_per_member_spans_in_both_directions():
    t0s = np.array([0.0, 1.0, 0.0, 2.0, 0.5])
    t1s = np.array([1.0, -1.0, 3.0, 2.5, 0.5])     # the last one: an empty span
    sol = sl.solve_ensemble(decay, np.ones((5, 2)), t0s, t1s, solver=sl.Tsit5(), rtol=1e-10,
                            atol=1e-12, args=0.7, saveat=sl.SaveAt(t1=True, t0=True))
    np.testing.assert_allclose(np.asarray(sol.ts), np.stack([t0s, t1s], axis=1), rtol=1e-14)
    exact = np.exp(-0.7 * (t1s - t0s))
    np.testing.assert_allclose(np.asarray(sol.ys)[:, 1, 0], exact, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(sol.ys)[:, 0, :], 1.0)
    assert int(sol.stats["num_steps"][4]) == 0 and np.all(np.asarray(sol.result) == 0)


def _bad(**kw):
    base = dict(f=decay, y0s=np.ones((3, 1)), t0=0.0, t1=1.0, solver=sl.Tsit5(), rtol=1e-6,
                args=1.0)
    base.update(kw)
    return sl.solve_ensemble(base.pop("f"), base.pop("y0s"), base.pop("t0"), base.pop("t1"),
                             **base)


@pytest.mark.parametrize("kw, err, match", [
    (dict(rtoll=1e-3), TypeError, "did you mean 'rtol'"),
    (dict(solver=sl.Tsit5), TypeError, "solver must be an instance"),
    (dict(solver=sl.RK4()), ValueError, "adaptive solver"),
    (dict(solver="tsit5"), TypeError, "solver must be"),
    (dict(rtol=None), ValueError, "rtol and/or atol"),
    (dict(rtol=-1.0), ValueError, "rtol must be positive"),
    (dict(saveat=sl.SaveAt(steps=True)), ValueError, "steps"),
    (dict(saveat=(0.0, 1.0)), TypeError, "saveat must be"),
    (dict(saveat=sl.SaveAt(ts=[0.0, 2.0])), ValueError, "saveat.ts must lie within"),
    (dict(saveat=sl.SaveAt(ts=[0.5, 0.1])), ValueError, "saveat.ts must be ordered"),
    (dict(chunk_steps=0), ValueError, "chunk_steps must be a positive integer"),
    (dict(min_bucket=2.5), ValueError, "min_bucket must be a positive integer"),
    (dict(max_steps=-3), ValueError, "max_steps must be a positive integer"),
    (dict(t1=np.ones(4)), ValueError, r"t1 must be a scalar or have shape \(3,\)"),
    (dict(t0=np.nan), ValueError, "t0 must be finite"),
    (dict(dt=0.0), ValueError, "dt must be nonzero"),
    (dict(y0s=np.ones((0, 2))), ValueError, "y0s has no members"),
    (dict(y0s=np.array([1.0, np.nan])[:, None]), ValueError, "y0s must be finite"),
    (dict(y0s={"a": np.ones((3, 1)), "b": np.ones((2, 1))}), ValueError, "y0s's leaves"),
    (dict(y0s=1.0), ValueError, "y0s needs a leading member axis"),
    (dict(args=np.ones(2), args_axes=0), ValueError, r"args_axes marks .* not \(3, \.\.\.\)"),
    (dict(args_axes=1), ValueError, "args_axes entries must be 0"),
    (dict(args=(1.0, 2.0), args_axes=(0, None, None)), ValueError, "args_axes must be"),
    (dict(f=lambda t, y, k: y[:1] * jnp.ones(2)), ValueError, "f must return"),
    (dict(f=lambda t, y, k: undefined_name), TypeError, "calling f"),  # noqa: F821
    (dict(f="decay"), TypeError, "f must be callable"),
])
def test_bad_arguments_are_named(kw, err, match):
    with pytest.raises(err, match=match):
        _bad(**kw)


def test_refuses_to_be_traced():
    with pytest.raises(TypeError, match="eagerly"):
        jax.jit(lambda y0s: _bad(y0s=y0s).ys)(jnp.ones((3, 1)))


CHILD = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    import simlib as sl
    out = {}
    sol = sl.solve_ensemble(lambda t, y, a: y**3, np.array([[0.1], [10.0], [1e150]]), 0.0, 5.0,
                            solver=sl.Tsit5(), rtol=1e-6, throw=False, min_bucket=1)
    out["codes"] = [int(c) for c in np.asarray(sol.result)]
    try:
        sl.solve_ensemble(lambda t, y, a: y, np.ones((0, 3)), 0.0, 1.0, solver=sl.Tsit5(),
                          rtol=1e-6)
    except ValueError as e:
        out["empty"] = str(e)
    print(json.dumps(out))
""")


@pytest.mark.slow
def test_extreme_members_do_not_crash_the_process():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["codes"][0] == 0 and out["codes"][1] != 0 and out["codes"][2] != 0
    assert "y0s has no members" in out["empty"]
