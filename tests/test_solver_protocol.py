"""The solver protocol (simlib/_solver/_base.py): solvers with settings, and a solver that
the drivers know only through ``init``/``step``/``error_ratio``/``interpolate``/``num_fevals``.

References are outside simlib: one step of a two-stage family worked out by hand, the
closed form ``exp(-t)``, and a count of the calls of ``f`` made by a host callback.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl


class TwoStage(sl.ExplicitRungeKutta):
    """The one-parameter family of explicit two-stage second-order methods
    (Hairer, Norsett and Wanner, Solving ODEs I, 1993, II.1, eq. 1.7): ``c_2 = alpha``."""

    def __init__(self, alpha: float):
        self.alpha = alpha

    @property
    def tableau(self) -> sl.ButcherTableau:  # type: ignore[override]
        a = self.alpha
        return sl.ButcherTableau(name=f"TwoStage({a})", reference="Hairer et al. 1993, II.1",
                                 order=2, a=((), (a,)), b=(1 - 1 / (2 * a), 1 / (2 * a)),
                                 c=(0.0, a))


def test_settings_decide_equality_and_hash():
    assert TwoStage(0.5) == TwoStage(0.5)
    assert hash(TwoStage(0.5)) == hash(TwoStage(0.5))
    assert TwoStage(0.5) != TwoStage(1.0)
    assert hash(TwoStage(0.5)) != hash(TwoStage(1.0))
    assert TwoStage(0.5) != sl.Heun()
    assert repr(TwoStage(0.5)) == "TwoStage(alpha=0.5)"
    # Tableau-only solvers have no settings: equal by class, as before.
    assert sl.Tsit5() == sl.Tsit5() and hash(sl.Tsit5()) == hash(sl.Tsit5())
    assert sl.Tsit5() != sl.Dopri5()


def test_settings_get_their_own_compiled_function():
    # y' = t^2, y(0) = 0, one step h = 1: k1 = 0, k2 = (alpha h)^2, so
    # y1 = h (alpha h)^2 / (2 alpha) = alpha / 2 (the exact value is 1/3).
    f = lambda t, y, args: jnp.full_like(y, t**2)  # noqa: E731
    y0 = jnp.zeros(1)
    for alpha in (0.5, 1.0, 2 / 3, 0.5):
        sol = sl.solve(f, y0, 0.0, 1.0, solver=TwoStage(alpha), dt=1.0)
        assert float(sol.ys[-1, 0]) == pytest.approx(alpha / 2, rel=1e-14), alpha
    # and through a user's jit, the solver a static argument
    run = jax.jit(lambda y0, solver: sl.solve(f, y0, 0.0, 1.0, solver=solver, dt=1.0).ys,
                  static_argnames="solver")
    assert float(run(y0, solver=TwoStage(0.5))[-1, 0]) == pytest.approx(0.25, rel=1e-14)
    assert float(run(y0, solver=TwoStage(1.0))[-1, 0]) == pytest.approx(0.5, rel=1e-14)
    assert run._cache_size() == 2


class OpaqueHeunEuler(sl.AbstractSolver):
    """Heun's method with the embedded Euler estimate, written against the protocol only:
    its error information, dense data and carried state are shapes the drivers never
    look inside (a dict, a tuple, a counter of steps taken)."""

    order = 2
    adaptive = True
    error_order = 1
    reference = "Heun 1900; Hairer et al. 1993, II.4"
    fevals_per_step = 2

    def init(self, f, t, y, args, f0=None):
        return {"steps": jnp.zeros((), jnp.int32)}

    def step(self, f, t, y, h, args, state):
        k1 = f(t, y, args)
        k2 = f(t + h, y + h * k1, args)
        y1 = y + h / 2 * (k1 + k2)
        err = {"local": h / 2 * (k2 - k1)}  # the default error_ratio takes it as is
        return y1, err["local"], (k1, k2), {"steps": state["steps"] + 1}

    def interpolate(self, f, args, t, y, h, y1, dense, theta):
        k1, k2 = dense  # the quadratic interpolant of Heun's stages
        return y + h * theta * (k1 + theta / 2 * (k2 - k1))


def test_a_solver_known_only_through_the_protocol():
    calls = []

    def f(t, y, args):
        jax.debug.callback(lambda: calls.append(1))
        return -y

    ts = jnp.linspace(0.0, 2.0, 9)
    sol = sl.solve(f, jnp.array([1.0, 2.0]), 0.0, 2.0, solver=OpaqueHeunEuler(),
                   rtol=1e-5, atol=1e-7, saveat=sl.SaveAt(ts=ts))
    exact = np.exp(-np.asarray(ts))[:, None] * np.array([1.0, 2.0])
    assert np.max(np.abs(np.asarray(sol.ys) - exact)) < 1e-5
    assert int(sol.result) == 0
    st = {k: int(v) for k, v in sol.stats.items() if k != "t_final"}
    assert st["num_steps"] > 50  # an order-1 estimate at rtol 1e-5 needs many steps
    # fevals per attempt plus f(t0, y0) and the Euler probe of the first step size;
    # the dense output is evaluated after the run finishes and makes no extra calls.
    calls.clear()
    sol = sl.solve(f, jnp.array([1.0, 2.0]), 0.0, 2.0, solver=OpaqueHeunEuler(),
                   rtol=1e-5, atol=1e-7)
    st = {k: int(v) for k, v in sol.stats.items() if k != "t_final"}
    assert st["num_fevals"] == 2 * st["num_steps"] + 2 == len(calls)
    # under grad (the differentiable replay) as well: d y(2) / d y0 = exp(-2)
    g = jax.grad(lambda y0: sl.solve(lambda t, y, a: -y, y0, 0.0, 2.0,
                                     solver=OpaqueHeunEuler(), rtol=1e-5,
                                     atol=1e-7).ys[-1, 0])(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(g), [np.exp(-2.0), 0.0], atol=1e-5)


def test_solvers_declare_their_capabilities():
    """Capabilities are class attributes the drivers read (no probing): defaults for a
    solver written against the protocol, declared or derived for the library's own."""
    from simlib._solver._base import AbstractSolver

    solvers = [getattr(sl, name)() for name in sl.__all__
               if isinstance(getattr(sl, name), type)
               and issubclass(getattr(sl, name), AbstractSolver)
               and not getattr(sl, name).__name__.startswith(("Abstract", "Explicit", "ESDIRK",
                                                               "Symplectic"))]
    assert len(solvers) > 10
    for s in solvers:
        assert s.has_interpolant == (type(s).interpolate is not AbstractSolver.interpolate)
    assert {type(s).__name__ for s in solvers if s.time_symmetric} == {
        "VelocityVerlet", "Yoshida4", "PEFRL", "ImplicitMidpoint"}
    assert {"Rodas5P", "Rodas5", "Rosenbrock23", "BDF", "Kvaerno5", "Kvaerno3",
            "BackwardEuler"} <= {type(s).__name__ for s in solvers if s.accepts_mass}
    assert not sl.ImplicitMidpoint().accepts_mass
    bare = OpaqueHeunEuler()
    assert (bare.time_symmetric, bare.accepts_mass, bare.has_interpolant) == (False, False, True)
    with pytest.raises(ValueError, match="Reversible"):
        sl.solve(lambda t, y, a: -y, jnp.ones(2), 0.0, 1.0, solver=bare, dt=0.1,
                 adjoint=sl.Reversible())
