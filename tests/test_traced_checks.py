"""Every argument check of ``solve``, its SDE path and ``solve_ensemble`` holds however the
value arrives: eagerly, under ``jax.jit`` and under ``jax.vmap`` (tests/_traced.py), as a
refusal naming the cause, or a failure code with ``throw=False``, never a value.

Also: time carried in float64 for a float32 state (issue 22, item 1), and a failure under
``vmap`` naming its member with the message first.

One function per entry point takes every checked quantity as an argument, so each mode
compiles it once for all the cases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _traced import MODES, failure_code, refuse

import simlib as sl

KEY = jax.random.key(0)
TS = (0.25, 0.5)


def decay(t, y, args):
    # a cap of inf ("no limit") in args is allowed: every run below passes one
    return -args["k"] * jnp.minimum(y, args["cap"])


def _params(k):
    return {"k": k, "cap": jnp.inf}


def noise(t, y, args):
    return 0.1 * jnp.ones_like(y)


def fixed(y0, t0, t1, dt, ts, k):
    return sl.solve(decay, y0, t0, t1, solver=sl.Euler(), dt=dt, args=_params(k),
                    saveat=sl.SaveAt(ts=ts), max_steps=16).ys


def adaptive(y0, t0, t1, rtol, atol, ts, k):
    return sl.solve(decay, y0, t0, t1, solver=sl.Heun(), rtol=rtol, atol=atol, args=_params(k),
                    saveat=sl.SaveAt(ts=ts), max_steps=16).ys


def sde(y0, t0, t1, dt, ts, k):
    # brownian="steps": the checks do not depend on the path, and the tree's compile with a
    # traced span costs three times as much
    return sl.solve(decay, y0, t0, t1, solver=sl.EulerMaruyama(), dt=dt, diffusion=noise,
                    brownian="steps", key=KEY, args=_params(k), saveat=sl.SaveAt(ts=ts),
                    max_steps=16).ys


def sde_adaptive(y0, t0, t1, rtol, atol, ts, k):
    return sl.solve(decay, y0, t0, t1, solver=sl.StochasticHeun(), rtol=rtol, atol=atol,
                    diffusion=noise, key=KEY, args=_params(k), saveat=sl.SaveAt(ts=ts),
                    max_steps=16).ys


def fixed_sol(y0, t0, t1, dt, ts, k):
    return sl.solve(decay, y0, t0, t1, solver=sl.Euler(), dt=dt, args=_params(k),
                    saveat=sl.SaveAt(ts=ts), max_steps=16, throw=False)


def fixed_code(y0, t0, t1, dt, ts, k):
    return fixed_sol(y0, t0, t1, dt, ts, k).result


def _args(fn, **bad):
    """The arguments of ``fn`` (all good), with ``bad`` replacing some."""
    good = dict(y0=jnp.ones(2), t0=0.0, t1=1.0, ts=jnp.array(TS), k=1.0)
    good.update(dict(rtol=1e-6, atol=1e-6) if "tol" in fn.__code__.co_varnames[3]
                else dict(dt=0.25))
    good.update(bad)
    return tuple(good[name] for name in fn.__code__.co_varnames[:fn.__code__.co_argcount])


NAN, INF = float("nan"), float("inf")
BIG = 1e12  # float64's spacing there is 1.2e-4: a step of 1e-5 is not resolved

ODE_CASES = {
    # name: (function, bad arguments, the cause the message must name)
    "ts unsorted": (fixed, dict(ts=jnp.array([0.5, 0.25])), r"saveat.ts must be ordered"),
    "ts outside": (fixed, dict(ts=jnp.array([0.5, 1.5])), r"saveat.ts must lie within.*\[1\]"),
    "ts nan": (fixed, dict(ts=jnp.array([0.5, NAN])), r"saveat.ts must lie within"),
    "dt zero": (fixed, dict(dt=0.0), r"dt must be nonzero"),
    "dt backwards": (fixed, dict(dt=-0.25), r"dt=-0.25 is negative"),
    "dt nan": (fixed, dict(dt=NAN), r"dt must be finite"),
    "t0 nan": (fixed, dict(t0=NAN), r"t0 must be finite"),
    "t1 inf": (fixed, dict(t1=INF), r"t1 must be finite"),
    "y0 nan": (fixed, dict(y0=jnp.array([1.0, NAN])), r"y0 must be finite.*index 1"),
    "args nan": (fixed, dict(k=NAN), r"args\['k'\] holds nan"),
    "time not resolved": (fixed, dict(t0=BIG, t1=BIG + 1.0, dt=1e-5,
                                      ts=BIG + jnp.array(TS)), r"16 units in the last place"),
    "rtol zero": (adaptive, dict(rtol=0.0), r"rtol must be positive and finite"),
    "atol negative": (adaptive, dict(atol=-1e-6), r"atol must be positive and finite"),
    "rtol nan": (adaptive, dict(rtol=NAN), r"rtol must be positive and finite"),
    "adaptive ts unsorted": (adaptive, dict(ts=jnp.array([0.5, 0.25])),
                             r"saveat.ts must be ordered"),
    "adaptive args nan": (adaptive, dict(k=NAN), r"args\['k'\] holds nan"),
}

SDE_CASES = {
    "t1 before t0": (sde, dict(t0=1.0, t1=0.0), r"t1 must be greater than t0"),
    "dt negative": (sde, dict(dt=-0.25), r"dt must be positive"),
    "dt zero": (sde, dict(dt=0.0), r"dt must be positive"),
    "ts unsorted": (sde, dict(ts=jnp.array([0.5, 0.25])), r"saveat.ts must be ordered"),
    "ts outside": (sde, dict(ts=jnp.array([-0.5, 0.25])), r"saveat.ts must lie within"),
    "y0 nan": (sde, dict(y0=jnp.array([NAN, 1.0])), r"y0 must be finite"),
    "args nan": (sde, dict(k=NAN), r"args\['k'\] holds nan"),
    "t0 inf": (sde, dict(t0=-INF), r"t0 must be finite"),
    "rtol zero": (sde_adaptive, dict(rtol=0.0), r"rtol must be positive and finite"),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", list(ODE_CASES))
def test_solve_refuses(case, mode):
    fn, bad, match = ODE_CASES[case]
    err = refuse(mode, fn, _args(fn, **bad), match=match)
    if mode != "eager":  # found in the graph: a SolverError with its own code
        assert err.result in sl._validate.CODES


def _sde_params():
    # the adaptive SDE's compiles (6-9 s each at load 15) run in the slow set; its check is
    # the shared tolerance check, traced in the default set through the adaptive ODE path
    for case in SDE_CASES:
        for mode in MODES:
            slow = SDE_CASES[case][0] is sde_adaptive and mode != "eager"
            yield pytest.param(case, mode, marks=[pytest.mark.slow] if slow else [],
                               id=f"{case}-{mode}")


@pytest.mark.parametrize("case,mode", list(_sde_params()))
def test_sde_refuses(case, mode):
    fn, bad, match = SDE_CASES[case]
    refuse(mode, fn, _args(fn, **bad), match=match)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case,code", [
    ("ts unsorted", sl.Result.INVALID_SAVE_TIMES), ("dt zero", sl.Result.INVALID_TIME_ARGUMENT),
    ("y0 nan", sl.Result.NONFINITE_Y0), ("args nan", sl.Result.NONFINITE_ARGS),
    ("time not resolved", sl.Result.TIME_NOT_RESOLVED)])
def test_throw_false_reports_the_code(case, code, mode):
    _, bad, _ = ODE_CASES[case]
    got = failure_code(mode, fixed_code, _args(fixed_code, **bad))
    assert np.all(got == (-1 if mode == "eager" else int(code)))


def _members(fn, *bad_members):
    """``fn``'s arguments for a vmap over members: good ones, then one per ``bad_members``
    (dicts of bad arguments), every argument batched as in tests/_traced.py."""
    rows = [_args(fn)] + [_args(fn, **bad) for bad in bad_members]
    return tuple(jnp.stack([jnp.asarray(r[i]) for r in rows]) for i in range(len(rows[0])))


def test_throw_false_leaves_good_members_alone():
    # member 1 has unsorted save times: its code, and nan values; member 0 is exact Euler,
    # y(t) = (1 - dt)^(t/dt)
    sol = jax.vmap(fixed_sol)(*_members(fixed_sol, dict(ts=jnp.array([0.5, 0.25]))))
    assert list(np.asarray(sol.result)) == [0, int(sl.Result.INVALID_SAVE_TIMES)]
    np.testing.assert_allclose(np.asarray(sol.ys[0, :, 0]), [0.75, 0.75**2], rtol=1e-15)
    assert np.all(np.isnan(np.asarray(sol.ys[1])))


ENSEMBLE_CASES = {
    "rtol zero": (dict(rtol=0.0), r"rtol must be positive and finite"),
    "y0 nan": (dict(y0s=jnp.array([[1.0], [NAN]])), r"y0s must be finite.*index 1"),
    "args nan": (dict(args=_params(jnp.array([1.0, NAN])), args_axes={"k": 0, "cap": None}),
                 r"args\['k'\] holds nan"),
    "ts unsorted": (dict(saveat=sl.SaveAt(ts=jnp.array([0.5, 0.25]))), r"ordered"),
    "ts outside": (dict(saveat=sl.SaveAt(ts=jnp.array([0.5, 2.0]))), r"within"),
    "dt zero": (dict(dt=0.0), r"dt must be nonzero"),
    "dt backwards": (dict(dt=-0.1), r"is negative"),
    "t1 nan": (dict(t1=jnp.array([1.0, NAN])), r"t1 must be finite"),
    "time not resolved": (dict(t0=BIG, t1=BIG + 1.0, dt=1e-5), r"16 units in the last place"),
}


@pytest.mark.parametrize("case", list(ENSEMBLE_CASES))
def test_solve_ensemble_refuses(case):
    bad, match = ENSEMBLE_CASES[case]
    kw = dict(y0s=jnp.ones((2, 1)), t0=0.0, t1=1.0, solver=sl.Heun(), rtol=1e-6,
              args=_params(1.0))
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        sl.solve_ensemble(decay, **kw)


@pytest.mark.parametrize("mode", ("jit", "vmap"))
def test_solve_ensemble_cannot_be_traced(mode):
    # its checks are eager only because it is: a traced value never reaches it
    def run(rtol):
        return sl.solve_ensemble(decay, jnp.ones((2, 1)), 0.0, 1.0, solver=sl.Heun(),
                                 rtol=rtol, args=_params(1.0)).ys
    refuse(mode, run, (0.0,), match="cannot be traced")


def test_inf_in_args_is_allowed():
    # args = {"k": 1, "cap": inf}: y' = -min(y, inf) = -y, exact Euler (1 - dt)^n
    ys = fixed(*_args(fixed))
    np.testing.assert_allclose(np.asarray(ys[:, 0]), [0.75, 0.75**2], rtol=1e-15)


# ------------------------------------------------------------- time's precision (item 1)

T0, SPAN = 1e5, 0.1


def _unit_decay(t, y, args):
    return -y


@pytest.mark.parametrize("mode", ("eager", "jit"))
def test_float32_state_at_large_t_takes_the_requested_steps(mode):
    # float32's spacing at 1e5 is 2**-7 = 0.0078: time in float32 took 13 steps of it and
    # ended at 100000.1015625; in float64 the grid is t0 + k dt, 100 steps, ending on t1
    def run(t0, t1, dt):
        return sl.solve(_unit_decay, jnp.ones(1, jnp.float32), t0, t1, solver=sl.RK4(), dt=dt,
                        saveat=sl.SaveAt(steps=True), max_steps=128)

    args = (T0, T0 + SPAN, 1e-3)
    sol = run(*args) if mode == "eager" else jax.jit(run)(*args)
    n = int(sol.stats["num_steps"])
    assert n == 100
    assert float(sol.stats["t_final"]) == T0 + SPAN
    assert sol.ys.dtype == jnp.float32 and sol.ts.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(sol.ts[:n]), T0 + 1e-3 * np.arange(1, 101),
                               rtol=0, atol=1e-9)
    # y = exp(-(t - t0)); RK4's error at dt = 1e-3 is far below float32's rounding
    np.testing.assert_allclose(float(sol.ys[n - 1, 0]), np.exp(-SPAN), rtol=1e-6)


def test_float32_state_at_large_t_adaptive_ends_on_t1():
    sol = sl.solve(_unit_decay, jnp.ones(1, jnp.float32), T0, T0 + SPAN, solver=sl.Tsit5(),
                   rtol=1e-6, atol=1e-6)
    assert float(sol.stats["t_final"]) == T0 + SPAN and float(sol.ts[-1]) == T0 + SPAN
    np.testing.assert_allclose(float(sol.ys[-1, 0]), np.exp(-SPAN), rtol=2e-6)


def test_float32_time_refuses_steps_it_cannot_represent():
    # without float64, time is float32: the request is refused, eagerly and in the graph
    y0 = np.ones(1, np.float32)
    with jax.enable_x64(False):
        with pytest.raises(ValueError, match=r"16 units in the last place.*float32.*"
                                             r"jax_enable_x64"):
            sl.solve(_unit_decay, y0, T0, T0 + SPAN, solver=sl.RK4(), dt=1e-3)

        def code(t0):
            return sl.solve(_unit_decay, y0, t0, t0 + SPAN, solver=sl.RK4(), dt=1e-3,
                            max_steps=16, throw=False).result

        assert int(jax.jit(code)(T0)) == int(sl.Result.TIME_NOT_RESOLVED)
        # far from it, the same steps are fine in float32
        sol = sl.solve(_unit_decay, y0, 1.0, 1.0 + SPAN, solver=sl.RK4(), dt=1e-3)
        assert int(sol.stats["num_steps"]) == 100


# ------------------------------------------------------- failures under vmap name the member

BLOW_UP = dict(k=-1e308)  # y' = 1e308 y: inf after two Euler steps


def test_vmap_failure_names_the_member_with_the_message_first():
    with pytest.raises(sl.SolverError) as info:  # no raise_solver_errors needed
        jax.vmap(fixed)(*_members(fixed, BLOW_UP))
    err = info.value
    assert str(err).startswith("solve: member 1 of 2: the state became non-finite")
    assert err.member == 1 and err.result == sl.Result.NONFINITE_STATE
    assert err.__cause__ is None


def test_jit_of_nested_vmap_names_the_flat_member():
    args = _members(fixed, {}, {}, BLOW_UP, {}, {})  # member 3 of 6: row-major [1, 0]
    args = tuple(a.reshape((2, 3) + a.shape[1:]) for a in args)
    with pytest.raises(sl.SolverError) as info, sl.raise_solver_errors():
        jax.block_until_ready(jax.jit(jax.vmap(jax.vmap(fixed)))(*args))
    assert str(info.value).startswith("solve: member 3 of 6: the state became non-finite")
    assert info.value.member == 3 and info.value.__cause__ is None
    assert isinstance(info.value.jax_error, jax.errors.JaxRuntimeError)
