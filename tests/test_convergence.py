"""Measured convergence order of every fixed-step method against closed-form solutions.

For each method the global error at ``t1`` is measured for a geometric sequence of
step sizes and the slope of ``log(error)`` against ``log(dt)`` is fitted by least
squares; it must be within 0.2 of the method's theoretical order.

The slope only equals the order in the asymptotic regime, where
``error = C dt^p (1 + O(dt))`` is dominated by its leading term, and only while the
error is well above round-off (~1e-16 per step).  High-order pairs (Tsit5, DOP853)
approach the asymptotic slope from above rather slowly on scalar problems (their
principal error coefficients are deliberately small, so the ``dt^(p+1)`` term
dominates for moderate ``dt``).  Each method therefore gets the problem and the
window of ``N = T / dt`` in which its local slopes have settled and its errors lie
between ~1e-13 and ~1e-3; ``test_window_is_above_roundoff`` keeps that premise
honest.  Exact solutions are closed forms (no simlib value is used as a reference).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import ellipj

import simlib as sl

# --------------------------------------------------------------------------------------
# problems with closed-form solutions

# Non-autonomous logistic growth y' = r(t) y (1 - y) with r(t) = 1 + EPS cos t:
# y(t) = 1 / (1 + (1/y0 - 1) exp(-(t + EPS sin t))).  Nonlinear, and the explicit
# time dependence exercises the nodes c_i of every tableau.
LOG_Y0 = 0.05


def _logistic(eps: float):
    def f(t, y, args, xp=jnp):
        return (1.0 + eps * xp.cos(t)) * y * (1.0 - y)

    def exact(t: float) -> np.ndarray:
        return np.array([1.0 / (1.0 + (1.0 / LOG_Y0 - 1.0) * math.exp(-(t + eps * math.sin(t))))])

    return f, np.array([LOG_Y0]), exact


# Euler's equations of a free rigid body in Jacobi form (Hull et al.'s DETEST B5),
# time-reparametrised by s(t) = t + EPS sin t so that it is non-autonomous:
# y' = (1 + EPS cos t) (y2 y3, -y1 y3, -m y1 y2), y(0) = (0, 1, 1),
# y(t) = (sn, cn, dn)(s(t) | m).
ELL_M = 0.51
ELL_EPS = 0.1


def _elliptic():
    def f(t, y, args, xp=jnp):
        rhs = xp.stack([y[1] * y[2], -y[0] * y[2], -ELL_M * y[0] * y[1]])
        return (1.0 + ELL_EPS * xp.cos(t)) * rhs

    def exact(t: float) -> np.ndarray:
        sn, cn, dn, _ = ellipj(t + ELL_EPS * math.sin(t), ELL_M)
        return np.array([sn, cn, dn])

    return f, np.array([0.0, 1.0, 1.0]), exact


# A rotation at angular speed t: y' = t (-y2, y1), y(0) = (1, 0), y(t) = (cos, sin)(t^2 / 2).
# Linear in y, so DOP853's error reaches its asymptotic slope before round-off, and the
# phase depends on t only through the stage times t + c_i h: it checks Dopri8's nodes c_i.


def _rotation():
    def f(t, y, args, xp=jnp):
        return xp.stack([-t * y[1], t * y[0]])

    def exact(t: float) -> np.ndarray:
        return np.array([math.cos(t * t / 2), math.sin(t * t / 2)])

    return f, np.array([1.0, 0.0]), exact


PROBLEMS = {
    "logistic_nonautonomous": (_logistic(0.3), 8.0),
    "logistic": (_logistic(0.0), 8.0),
    "elliptic_nonautonomous": (_elliptic(), 40.0),
    "rotation_nonautonomous": (_rotation(), 4.0),
}


def _geometric(lo: int, hi: int) -> list[int]:
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


@dataclass(frozen=True)
class Case:
    solver: type
    order: int
    problem: str
    ns: tuple[int, ...]  # numbers of steps N = T / dt

    @property
    def key(self) -> str:
        return f"{self.solver.__name__}-{self.problem}"


RK_CASES = [
    Case(sl.Euler, 1, "logistic_nonautonomous", tuple(_geometric(64, 1024))),
    Case(sl.Midpoint, 2, "logistic_nonautonomous", tuple(_geometric(128, 2048))),
    Case(sl.Heun, 2, "logistic_nonautonomous", tuple(_geometric(64, 1024))),
    Case(sl.RK4, 4, "logistic_nonautonomous", tuple(_geometric(64, 1024))),
    Case(sl.Bosh3, 3, "logistic_nonautonomous", tuple(_geometric(128, 2048))),
    Case(sl.Tsit5, 5, "elliptic_nonautonomous", (384, 512, 768, 1024, 1536, 2048)),
    Case(sl.Dopri5, 5, "logistic_nonautonomous", (48, 64, 96, 128, 192)),
    # DOP853 reaches round-off after a few dozen steps: large dt keeps errors >= 1e-13.
    Case(sl.Dopri8, 8, "logistic", (8, 12, 16, 24)),
    # Errors 1e-7 .. 2e-12; local slopes 8.08, 7.90, 7.96, 7.99.
    Case(sl.Dopri8, 8, "rotation_nonautonomous", (16, 24, 32, 48, 64)),
]


def _fitted_slope(dts, errs) -> float:
    return float(np.polyfit(np.log(dts), np.log(errs), 1)[0])


def _errors_rk(case: Case) -> tuple[np.ndarray, np.ndarray]:
    (f, y0, exact), t1 = PROBLEMS[case.problem]
    n_max = max(case.ns)

    # dt traced under jit: one compilation per method, max_steps bounds the grid.
    @jax.jit
    def run(dt):
        return sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=case.solver(), dt=dt,
                        max_steps=n_max, throw=False)

    dts = np.array([t1 / n for n in case.ns])
    sols = jax.vmap(run)(jnp.asarray(dts))
    assert np.all(np.asarray(sols.result) == 0)
    np.testing.assert_array_equal(np.asarray(sols.stats["num_steps"]), np.array(case.ns))
    np.testing.assert_allclose(np.asarray(sols.stats["t_final"]), t1, rtol=0, atol=0)
    ys = np.asarray(sols.ys)[:, -1, :]
    errs = np.max(np.abs(ys - exact(t1)[None, :]), axis=1)
    return dts, errs


@pytest.fixture(scope="module")
def rk_errors():
    return {case.key: _errors_rk(case) for case in RK_CASES}


@pytest.mark.parametrize("case", RK_CASES, ids=lambda c: c.key)
def test_runge_kutta_order(case, rk_errors):
    dts, errs = rk_errors[case.key]
    slope = _fitted_slope(dts, errs)
    print(f"{case.key}: fitted order {slope:.3f}")
    assert abs(slope - case.order) < 0.2, (case.key, slope, errs)
    assert case.solver().order == case.order


@pytest.mark.parametrize("case", RK_CASES, ids=lambda c: c.key)
def test_window_is_above_roundoff(case, rk_errors):
    """The fit is meaningful only if every error is far above round-off and decreasing."""
    _, errs = rk_errors[case.key]
    assert np.all(errs > 1e-13), errs
    assert np.all(errs < 1e-2), errs
    assert np.all(np.diff(errs) < 0), errs


# --------------------------------------------------------------------------------------
# symplectic methods on the harmonic oscillator H = (|p|^2 + |q|^2) / 2


HO_Q0 = np.array([1.0, 0.3])
HO_P0 = np.array([0.0, -0.5])
HO_T = 10.0


def _ho(t, y, args):
    q, p = y
    return p, -q


def _ho_exact(t: float) -> tuple[np.ndarray, np.ndarray]:
    c, s = math.cos(t), math.sin(t)
    return HO_Q0 * c + HO_P0 * s, -HO_Q0 * s + HO_P0 * c


SYMPLECTIC_CASES = [
    Case(sl.SemiImplicitEuler, 1, "harmonic", tuple(_geometric(256, 2048))),
    Case(sl.VelocityVerlet, 2, "harmonic", tuple(_geometric(64, 1024))),
    Case(sl.Yoshida4, 4, "harmonic", tuple(_geometric(64, 1024))),
    Case(sl.PEFRL, 4, "harmonic", tuple(_geometric(32, 512))),
]


@pytest.fixture(scope="module")
def symplectic_errors():
    out = {}
    q_ex, p_ex = _ho_exact(HO_T)
    for case in SYMPLECTIC_CASES:
        n_max = max(case.ns)

        @jax.jit
        def run(dt, solver_cls=case.solver, n_max=n_max):
            return sl.solve(_ho, (jnp.asarray(HO_Q0), jnp.asarray(HO_P0)), 0.0, HO_T,
                            solver=solver_cls(), dt=dt, max_steps=n_max, throw=False)

        dts = np.array([HO_T / n for n in case.ns])
        sols = jax.vmap(run)(jnp.asarray(dts))
        assert np.all(np.asarray(sols.result) == 0)
        q, p = (np.asarray(x)[:, -1, :] for x in sols.ys)
        errs = np.maximum(np.abs(q - q_ex).max(axis=1), np.abs(p - p_ex).max(axis=1))
        out[case.solver.__name__] = (dts, errs)
    return out


@pytest.mark.parametrize("case", SYMPLECTIC_CASES, ids=lambda c: c.solver.__name__)
def test_symplectic_order(case, symplectic_errors):
    dts, errs = symplectic_errors[case.solver.__name__]
    assert np.all(errs > 1e-13) and np.all(np.diff(errs) < 0), errs
    slope = _fitted_slope(dts, errs)
    print(f"{case.solver.__name__}: fitted order {slope:.3f}")
    assert abs(slope - case.order) < 0.2, (case.solver.__name__, slope, errs)
    assert case.solver().order == case.order


def test_leapfrog_is_velocity_verlet():
    assert sl.Leapfrog is sl.VelocityVerlet


def test_closed_forms_agree_with_scipy():
    """The closed forms used above are themselves checked against scipy's DOP853."""
    from scipy.integrate import solve_ivp

    for name, ((f, y0, exact), t1) in PROBLEMS.items():
        def rhs(t, y, f=f):
            return f(t, y, None, xp=np)

        ref = solve_ivp(rhs, (0.0, t1), y0, method="DOP853", rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ref.y[:, -1], exact(t1), rtol=0, atol=1e-9, err_msg=name)

