"""One entry path: ``solve``, its SDE form and ``solve_ensemble`` check each argument
alike (simlib/_arguments.py); each test here caught a drift between the three copies."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl


def decay(t, y, args):
    return -y


def noise(t, y, args):
    return 0.1 * jnp.ones_like(y)


Y0 = jnp.array([1.0, 2.0])
KEY = jax.random.key(0)


def _ode(**kw):
    kw = {"solver": sl.Heun(), "dt": 0.25, **kw}
    return sl.solve(decay, Y0, 0.0, 1.0, **kw)


def _sde(**kw):
    kw = {"solver": sl.EulerMaruyama(), "dt": 0.25, "diffusion": noise, "key": KEY, **kw}
    return sl.solve(decay, Y0, 0.0, 1.0, **kw)


def _ensemble(**kw):
    kw = {"solver": sl.Tsit5(), "rtol": 1e-6, **kw}
    return sl.solve_ensemble(decay, jnp.ones((3, 2)), 0.0, 1.0, **kw)


@pytest.mark.parametrize("run", [_ode, _sde, _ensemble], ids=["ode", "sde", "ensemble"])
@pytest.mark.parametrize("bad", [True, False, 0, -1, 2.0])
def test_max_steps_must_be_a_positive_integer_not_a_bool(run, bad):
    with pytest.raises(ValueError, match="max_steps must be a positive integer"):
        run(max_steps=bad)


@pytest.mark.parametrize("run", [_ode, _sde], ids=["ode", "sde"])
def test_a_bad_adjoint_gets_one_message(run):
    with pytest.raises(TypeError, match=r"adjoint must be simlib\.Direct\(\), simlib\."
                                        r"Checkpointed\(\), simlib\.Reversible\(\) or "
                                        r"simlib\.ForwardMode\(\), got 'direct'"):
        run(adjoint="direct")


@pytest.mark.parametrize("kw", [{"jac_bandwidth": (1, 1)}, {"linear_solver": "dense"},
                                {"jac_sparsity": np.eye(2, dtype=bool)}])
@pytest.mark.parametrize("run", [_ode, _sde], ids=["ode", "sde"])
def test_linear_solver_options_refused_for_a_method_without_linear_systems(run, kw):
    with pytest.raises(ValueError, match="options of the implicit solvers"):
        run(**kw)


UNORDERED = (r"saveat\.ts must be ordered in the direction of integration \(increasing\), "
             r"but saveat\.ts\[1\] = 0\.2 comes before the save time preceding it")


@pytest.mark.parametrize("run", [_ode, _sde, _ensemble], ids=["ode", "sde", "ensemble"])
def test_unordered_save_times_get_one_message(run):
    with pytest.raises(ValueError, match=UNORDERED):
        run(saveat=sl.SaveAt(ts=jnp.array([0.5, 0.2, 0.8])))


@pytest.mark.parametrize("run", [_ode, _sde, _ensemble], ids=["ode", "sde", "ensemble"])
def test_a_nan_save_time_is_refused(run):
    with pytest.raises(ValueError, match=r"saveat\.ts\[1\] = nan is outside"):
        run(saveat=sl.SaveAt(ts=jnp.array([0.5, jnp.nan])))


def test_ensemble_save_times_name_the_member_whose_span_misses_them():
    with pytest.raises(ValueError, match=r"saveat\.ts\[1\] = 1\.5 is outside.*member 1"):
        sl.solve_ensemble(decay, jnp.ones((3, 2)), 0.0, jnp.array([2.0, 1.0, 3.0]),
                          solver=sl.Tsit5(), rtol=1e-6, saveat=sl.SaveAt(ts=[0.5, 1.5]))
    with pytest.raises(ValueError, match=r"ordered in the direction of integration "
                                         r"\(decreasing\).*member 1"):
        sl.solve_ensemble(decay, jnp.ones((2, 2)), jnp.array([0.0, 1.0]),
                          jnp.array([1.0, 0.0]), solver=sl.Tsit5(), rtol=1e-6,
                          saveat=sl.SaveAt(ts=[0.25, 0.5]))


@pytest.mark.parametrize("solver, extra", [(sl.Heun(), {}),
                                           (sl.StochasticHeun(), {"diffusion": noise,
                                                                  "key": KEY})],
                         ids=["ode", "sde"])
def test_traced_bad_arguments_report_the_same_first_failure(solver, extra):
    # y0 with a NaN and a negative rtol, both traced: the state is reported first
    def run(y0, rtol):
        return sl.solve(decay, y0, 0.0, 1.0, solver=solver, rtol=rtol, throw=False,
                        **extra).result

    code = jax.jit(run)(jnp.array([1.0, jnp.nan]), -1.0)
    assert int(code) == sl.Result.NONFINITE_Y0.value


NAN_STATE = jnp.array([1.0, jnp.nan])


@pytest.mark.parametrize("run", [
    lambda: sl.solve(decay, NAN_STATE, 0.0, 1.0, solver=sl.Heun(), rtol=-1.0),
    lambda: sl.solve(decay, NAN_STATE, 0.0, 1.0, solver=sl.StochasticHeun(), rtol=-1.0,
                     diffusion=noise, key=KEY),
    lambda: sl.solve_ensemble(decay, jnp.stack([NAN_STATE] * 3), 0.0, 1.0,
                              solver=sl.Tsit5(), rtol=-1.0),
], ids=["ode", "sde", "ensemble"])
def test_eager_bad_arguments_refused_in_the_same_order(run):
    # a NaN state and a negative rtol: the state is named first
    with pytest.raises(ValueError, match="must be finite"):
        run()


@pytest.mark.parametrize("kw", [{"key": KEY}, {"noise": "scalar"}, {"brownian": "tree"}])
def test_an_sde_keyword_without_diffusion_on_an_ode_method_is_named(kw):
    with pytest.raises(ValueError, match=r"is an SDE option.*Tsit5 is an ODE method"):
        sl.solve(decay, Y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, **kw)


@pytest.mark.parametrize("entry, fn", [("solve", sl.solve), ("solve_ensemble", sl.solve_ensemble)])
def test_the_keyword_list_is_each_entry_points_signature(entry, fn):
    import inspect

    from simlib._arguments import keywords

    params = inspect.signature(fn).parameters.values()
    taken = {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(keywords(entry)) == taken
