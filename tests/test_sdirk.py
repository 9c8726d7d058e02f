"""Diagonally implicit Runge-Kutta methods: Kvaerno3, Kvaerno5 (Kvaerno, BIT 44, 2004),
BackwardEuler and ImplicitMidpoint.

References outside simlib: scipy ``Radau`` at ``rtol = 1e-12`` (problems and runs from
tests/test_stiff.py), closed forms of ``y' = -lam (y - cos t)``, of the backward Euler
recursion for ``y' = a y^2`` and of the implicit midpoint map of a harmonic oscillator
(its Cayley transform), the pendulum's energy, and central finite differences. Errors are
in units of the tolerance, ``max_i |y_i - ref_i| / (atol + rtol |ref_i|)``. The Newton
tolerance follows the run's by default (``min(0.03, sqrt(rtol)) (atol + rtol |y|)``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp
from test_stiff import (
    PROBLEMS,
    ROBERTSON_K,
    relaxation,
    robertson,
    robertson_jac,
    robertson_np,
    scipy_run,
)

import simlib as sl


def kvaerno(cls, rtol, atol):
    """The solver with its default Newton tolerance, tied to the run's ``rtol``/``atol``."""
    return cls()


@functools.cache
def run(name, cls_name, rtol):
    f, _, _, args, y0, t1, atol_per_rtol = PROBLEMS[name]
    atol = rtol * atol_per_rtol
    sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=kvaerno(getattr(sl, cls_name), rtol, atol),
                   rtol=rtol, atol=atol, args=args, max_steps=50_000)
    ref, _ = scipy_run(name, 1e-12)
    y = np.asarray(sol.ys[-1])
    err = float(np.max(np.abs(y - ref) / (atol + rtol * np.abs(ref))))
    steps = int(sol.stats["num_steps"])
    _, radau_steps = scipy_run(name, rtol)
    print(f"\n{cls_name} {name} rtol={rtol:g}: error {err:.2f} tolerances, {steps} steps "
          f"({int(sol.stats['num_rejected'])} rejected) against Radau's {radau_steps}")
    return err, steps, radau_steps


# ------------------------------------------------------------------ accuracy vs Radau

# Measured (default Newton tolerance, tied to the run's): Kvaerno5 within 2.6 tolerances
# everywhere on both problems; Kvaerno3 on Van der Pol 4.5, 5.7, 5.4, 6.8, 4.8 at rtol
# 1e-4..1e-8 (12-13 at 1e-6..1e-8 before, with a fixed or a 3e-4 x tied Newton tolerance).
ERROR_MISSES: dict = {}
# Steps vs Radau (target: at most twice): Kvaerno5 Robertson 71/90/122/175/273 against
# 78/127/217/372/648, Van der Pol 398/481/616/819/1213 against 323/533/919/1572/2769;
# Kvaerno3 needs 3 to 7 times Radau's steps (order 3 against Radau's 5).
STEP_MISSES = {("Kvaerno3", n, r) for n in PROBLEMS for r in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8)}
SLOW_RTOLS = (1e-5, 1e-7)


def _params():
    for cls_name in ("Kvaerno3", "Kvaerno5"):
        for name in PROBLEMS:
            for rtol in (1e-4, 1e-5, 1e-6, 1e-7, 1e-8):
                slow = rtol in SLOW_RTOLS or (cls_name == "Kvaerno3" and rtol < 1e-4)
                marks = [pytest.mark.slow] if slow else []
                yield pytest.param(cls_name, name, rtol, marks=marks,
                                   id=f"{cls_name}-{name}-{rtol:g}")


@pytest.mark.parametrize("cls_name,name,rtol", list(_params()))
def test_within_ten_tolerances_of_radau(cls_name, name, rtol, request):
    if (cls_name, name, rtol) in ERROR_MISSES:
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="measured " + ERROR_MISSES[(cls_name, name, rtol)]))
    err, _, _ = run(name, cls_name, rtol)
    assert err <= 10.0


@pytest.mark.parametrize("cls_name,name,rtol", list(_params()))
def test_steps_at_most_twice_radau(cls_name, name, rtol, request):
    if (cls_name, name, rtol) in STEP_MISSES:
        request.applymarker(pytest.mark.xfail(
            strict=True, reason="order 3: 3-7x Radau's steps (see STEP_MISSES)"))
    _, steps, radau_steps = run(name, cls_name, rtol)
    assert steps <= 2 * radau_steps


@functools.cache
def run_default(name, rtol):
    """Kvaerno5 with its default Newton tolerances."""
    f, _, _, args, y0, t1, atol_per_rtol = PROBLEMS[name]
    atol = rtol * atol_per_rtol
    sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=sl.Kvaerno5(), rtol=rtol, atol=atol,
                   args=args, max_steps=50_000)
    ref, _ = scipy_run(name, 1e-12)
    err = float(np.max(np.abs(np.asarray(sol.ys[-1]) - ref) / (atol + rtol * np.abs(ref))))
    print(f"\nKvaerno5() {name} rtol={rtol:g}: error {err:.2f} tolerances, "
          f"{int(sol.stats['num_steps'])} steps against Radau's {scipy_run(name, rtol)[1]}")
    return err, int(sol.stats["num_steps"])


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_default_newton_tolerances_at_rtol_1e8(name):
    # measured: Robertson 0.89 tolerances in 273 steps, Van der Pol 0.47 in 1213
    err, _ = run_default(name, 1e-8)
    assert err <= 10.0


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_kvaerno5_at_rtol_1e10(name, request):
    # default Newton tolerance (tied to the run's): Robertson 1.52 tolerances in 1075 steps
    # (Radau: 2010), Van der Pol 7.1 in 3112 (8655); with the earlier fixed 1e-10 Newton
    # tolerance Van der Pol ended 40 tolerances off.
    err, steps = run_default(name, 1e-10)
    assert err <= 10.0 and steps <= 2 * scipy_run(name, 1e-10)[1]


# ------------------------------------------------------------------ order, L-stability


@pytest.mark.parametrize("cls_name,order,ns", [
    pytest.param("BackwardEuler", 1, (20, 40, 80, 160), marks=pytest.mark.slow),
    ("ImplicitMidpoint", 2, (20, 40, 80)),
    pytest.param("Kvaerno3", 3, (10, 20, 40, 80), marks=pytest.mark.slow),
    ("Kvaerno5", 5, (5, 10, 20, 40))])
def test_convergence_order(cls_name, order, ns):
    # y' = -(y - cos t) to t = 2 at fixed steps (lam = 1: the stiff regime lam h >> 1
    # shows the order reduction of stage order 2, e.g. 4.56 for Kvaerno5 at lam = 10)
    f, exact = relaxation(1.0)
    solver = getattr(sl, cls_name)(newton_rtol=1e-14, newton_atol=1e-14)
    ns = np.array(ns)
    errs = [abs(float(sl.solve(f, jnp.array([0.0]), 0.0, 2.0, solver=solver,
                               dt=2.0 / n).ys[-1, 0]) - exact(2.0, 0.0)) for n in ns]
    measured = np.polyfit(np.log(1.0 / ns), np.log(errs), 1)[0]
    print(f"\n{cls_name}: order {measured:.2f}")
    assert abs(measured - order) < 0.3, (measured, errs)


@pytest.mark.parametrize("cls_name", ["BackwardEuler", "Kvaerno3", "Kvaerno5",
                                      "ImplicitMidpoint"])
def test_l_stability_no_oscillation(cls_name):
    # y' = -1e6 (y - cos t) from y(0) = 2 at h = 0.1 (lam h = 1e5): an L-stable method
    # damps the unit offset in one step and follows cos t without flipping sign; the
    # implicit midpoint rule (A- but not L-stable, R(-inf) = -1) flips it at every step.
    f, exact = relaxation(1e6)
    sol = sl.solve(f, jnp.array([2.0]), 0.0, 10.0, solver=getattr(sl, cls_name)(), dt=0.1,
                   saveat=sl.SaveAt(steps=True))
    e = np.asarray(sol.ys[:, 0]) - exact(np.asarray(sol.ts), 2.0)
    flips = int(np.sum(e[1:] * e[:-1] < 0))
    if cls_name == "ImplicitMidpoint":
        assert flips == e.size - 1 and np.min(np.abs(e)) > 0.9
    else:
        assert flips <= 4 and np.max(np.abs(e)) < 0.1, (flips, np.max(np.abs(e)))


# ------------------------------------------------------------------ implicit midpoint


def oscillator(t, y, w):
    return jnp.stack([y[1], -(w**2) * y[0]])


def cayley_map(w, h, n, y0):
    """The implicit midpoint map of ``q' = p, p' = -w^2 q``: ``(I - hA/2)^-1 (I + hA/2)``."""
    a = np.array([[0.0, 1.0], [-(w**2), 0.0]])
    m = np.linalg.solve(np.eye(2) - h / 2 * a, np.eye(2) + h / 2 * a)
    return np.linalg.matrix_power(m, n) @ np.asarray(y0)


def test_implicit_midpoint_harmonic_oscillator_energy_and_map():
    # 10,000 steps of h = 0.1: the quadratic energy is conserved up to the Newton
    # tolerance, and the states are the Cayley transform's powers
    sol = sl.solve(oscillator, jnp.array([1.0, 0.0]), 0.0, 1000.0,
                   solver=sl.ImplicitMidpoint(), dt=0.1, args=1.0,
                   saveat=sl.SaveAt(steps=True))
    ys = np.asarray(sol.ys)
    energy = 0.5 * (ys[:, 0] ** 2 + ys[:, 1] ** 2)
    assert np.max(np.abs(energy - 0.5)) < 1e-8
    np.testing.assert_allclose(ys[-1], cayley_map(1.0, 0.1, 10_000, [1.0, 0.0]), atol=1e-8)


def pendulum(t, y, args):
    return {"q": y["p"], "p": -jnp.sin(y["q"])}


def test_implicit_midpoint_pendulum_energy_bounded_and_time_symmetric():
    # pendulum (a pytree state) at amplitude 1.5 rad, 5,000 steps of h = 0.1 (about 60
    # periods): the energy error stays O(h^2) with no drift
    y0 = {"q": jnp.array(1.5), "p": jnp.array(0.0)}
    solver = sl.ImplicitMidpoint()
    sol = sl.solve(pendulum, y0, 0.0, 500.0, solver=solver, dt=0.1,
                   saveat=sl.SaveAt(steps=True))
    q, p = np.asarray(sol.ys["q"]), np.asarray(sol.ys["p"])
    e0 = -np.cos(1.5)
    de = np.abs(0.5 * p**2 - np.cos(q) - e0)
    assert np.max(de) < 5e-3, np.max(de)
    first, last = np.max(de[:500]), np.max(de[-500:])
    assert last < 1.2 * first, (first, last)
    # Phi_{-h} o Phi_h = id: back from t = 50 to 0 recovers y0 to the Newton tolerance
    # (1.1e-8 after 500 steps and back at the default 1e-10; 1e-13 here)
    tight = sl.ImplicitMidpoint(newton_rtol=1e-13, newton_atol=1e-13)
    yf = sl.solve(pendulum, y0, 0.0, 50.0, solver=tight, dt=0.1).ys
    y_back = sl.solve(pendulum, jax.tree_util.tree_map(lambda x: x[-1], yf), 50.0, 0.0,
                      solver=tight, dt=0.1).ys
    assert abs(float(y_back["q"][-1]) - 1.5) < 1e-10
    assert abs(float(y_back["p"][-1])) < 1e-10


def test_implicit_midpoint_reversible_gradient():
    # d q(T) / d w through 2,000 steps: Reversible (backward pass by stepping backwards)
    # against central differences of the Cayley-transform map and against Direct
    h, n = 0.05, 2000

    def q_end(w, adjoint):
        return sl.solve(oscillator, jnp.array([1.0, 0.0]), 0.0, h * n,
                        solver=sl.ImplicitMidpoint(), dt=h, args=w, adjoint=adjoint).ys[-1, 0]

    eps = 1e-6
    fd = (cayley_map(1.3 + eps, h, n, [1.0, 0.0])[0]
          - cayley_map(1.3 - eps, h, n, [1.0, 0.0])[0]) / (2 * eps)
    g_rev = float(jax.grad(q_end)(1.3, sl.Reversible()))
    g_dir = float(jax.grad(q_end)(1.3, sl.Direct()))
    assert g_rev == pytest.approx(fd, rel=1e-6, abs=1e-6)
    assert g_rev == pytest.approx(g_dir, rel=1e-8, abs=1e-8)


def test_reversible_rejects_backward_euler():
    with pytest.raises(ValueError, match="time-symmetric"):
        sl.solve(oscillator, jnp.array([1.0, 0.0]), 0.0, 1.0, solver=sl.BackwardEuler(),
                 dt=0.1, args=1.0, adjoint=sl.Reversible())


# ------------------------------------------------------------------ Newton failure


def square(t, y, a):
    return a * y**2


def backward_euler_square(a, h, n, y0=1.0):
    """The backward Euler recursion of ``y' = a y^2`` (a < 0): the root of
    ``h a y1^2 - y1 + y = 0`` that tends to ``y`` as ``h -> 0``."""
    ys, y = [], y0
    for _ in range(n):
        y = (1 - np.sqrt(1 - 4 * h * a * y)) / (2 * h * a)
        ys.append(y)
    return np.array(ys)


def test_newton_failure_fixed_step():
    # y' = y^2 from y(0) = 1 with h = 1: y1 = 1 + y1^2 has no real root
    sol = sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.BackwardEuler(), dt=1.0,
                   args=1.0, throw=False)
    assert sol.result == sl.Result.NEWTON_FAILED
    with pytest.raises(sl.SolverError, match="NEWTON_FAILED|Newton"):
        sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.BackwardEuler(), dt=1.0,
                 args=1.0)


def test_newton_failure_adaptive_wrong_jac():
    # a user jac returning nan: every Newton iteration fails, the adaptive driver rejects
    # and shrinks the step until it underflows, then reports NEWTON_FAILED
    f, _ = relaxation(10.0)
    bad = sl.Kvaerno5(jac=lambda t, y, a: jnp.full((1, 1), jnp.nan))
    sol = sl.solve(f, jnp.array([0.0]), 0.0, 1.0, solver=bad, rtol=1e-6, atol=1e-6,
                   throw=False)
    assert sol.result == sl.Result.NEWTON_FAILED
    assert int(sol.stats["num_accepted"]) == 0


def test_vmap_ensemble_with_one_bad_member():
    # y' = a y^2 with h = 0.5: a = 1 has no backward Euler step (1 + y1^2/2 = y1), the
    # others follow the recursion's closed form
    a = jnp.array([-1.0, -2.0, 1.0])

    @jax.jit
    @jax.vmap
    def ens(a):
        sol = sl.solve(square, jnp.array([1.0]), 0.0, 2.0, solver=sl.BackwardEuler(),
                       dt=0.5, args=a, throw=False, saveat=sl.SaveAt(steps=True))
        return sol.ys[:, 0], sol.result

    ys, result = ens(a)
    assert [int(r) for r in result] == [0, 0, int(sl.Result.NEWTON_FAILED)]
    for i in range(2):
        np.testing.assert_allclose(np.asarray(ys[i]), backward_euler_square(float(a[i]), 0.5, 4),
                                   rtol=1e-9)


def test_newton_tolerance_follows_the_run():
    # Van der Pol (mu = 1000) at rtol 1e-4: the default Newton tolerance, tied to the run's
    # (kappa = 0.1 min(0.03, sqrt(rtol))), against an explicit fixed one (the override,
    # honoured): the fixed 1e-10 rejects far more steps (Newton failures). Both stay
    # within 10 tolerances of Radau; num_fevals counts the Newton iterations beyond one per
    # stage, so it exceeds one evaluation per implicit stage and attempt.
    f, _, _, args, y0, t1, atol_per_rtol = PROBLEMS["van_der_pol_mu1000"]
    rtol = 1e-4
    atol = rtol * atol_per_rtol
    ref, _ = scipy_run("van_der_pol_mu1000", 1e-12)
    stats = {}
    for key, solver in (("tied", sl.Kvaerno5()), ("fixed", sl.Kvaerno5(newton_rtol=1e-10))):
        sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=solver, rtol=rtol, atol=atol,
                       args=args, max_steps=50_000)
        err = np.max(np.abs(np.asarray(sol.ys[-1]) - ref) / (atol + rtol * np.abs(ref)))
        assert err <= 10.0, (key, err)
        stats[key] = sol.stats
    tied, fixed = stats["tied"], stats["fixed"]
    # measured: 68 rejected of 398 attempts (tied) against 389 of 1052 (fixed)
    assert 2 * int(tied["num_rejected"]) < int(fixed["num_rejected"])
    assert int(tied["num_fevals"]) > 6 * int(tied["num_steps"]) + 2


def test_settings_validated():
    for kwargs in ({"jac": "bad"}, {"newton_rtol": -1.0}, {"newton_atol": float("nan")},
                   {"max_newton_iters": 0}, {"max_newton_iters": 2.5}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            sl.Kvaerno5(**kwargs)
    assert sl.Kvaerno5(max_newton_iters=5) != sl.Kvaerno5()
    assert hash(sl.Kvaerno5(jac="rev")) == hash(sl.Kvaerno5(jac="rev"))


# ------------------------------------------------------------------ dense output, pytree


# cubic Hermite dense output (order 3): measured at ts on Robertson to t = 4000, max error
# over ts (0.5, 4, 40, 400, 4000): Kvaerno3 rtol 1e-5: 0.24 tolerances; Kvaerno5 rtol 1e-5:
# 2.2, 1e-6: 10.1, 1e-8: 165 (the order-5 steps are too long for an order-3 interpolant;
# the step points themselves are within 0.3 tolerances). An order-4 continuous extension
# from the stages (stage order 2) was tried and was worse on the stiff component (no stiff
# decay at theta < 1).
DENSE_TS = np.array([0.5, 4.0, 40.0, 400.0, 4000.0])


@pytest.mark.parametrize("cls_name,rtol", [
    ("Kvaerno3", 1e-5),
    pytest.param("Kvaerno5", 1e-5, marks=pytest.mark.slow),
    pytest.param("Kvaerno5", 1e-8, marks=[pytest.mark.slow, pytest.mark.xfail(
        strict=True, reason="cubic Hermite dense output: 165 tolerances at t = 400")]),
])
def test_dense_output_against_radau(cls_name, rtol):
    atol = rtol * 1e-6
    sol = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 4000.0,
                   solver=kvaerno(getattr(sl, cls_name), rtol, atol), rtol=rtol, atol=atol,
                   args=(0.04, 3e7, 1e4), saveat=sl.SaveAt(ts=jnp.asarray(DENSE_TS)),
                   max_steps=20_000)
    ref = solve_ivp(robertson_np, (0.0, 4000.0), [1.0, 0.0, 0.0], method="Radau",
                    rtol=1e-12, atol=1e-20, args=((0.04, 3e7, 1e4),), jac=robertson_jac,
                    t_eval=DENSE_TS).y.T
    err = np.max(np.abs(np.asarray(sol.ys) - ref) / (atol + rtol * np.abs(ref)))
    assert err <= 10.0, err


def test_pytree_state():
    f1, exact = relaxation(50.0)

    def f(t, y, args):
        return {"a": f1(t, y["a"], args), "b": f1(t, y["b"], args)}

    y0 = {"a": jnp.array([0.0]), "b": jnp.array([[1.0, 2.0]])}
    sol = sl.solve(f, y0, 0.0, 1.0, solver=kvaerno(sl.Kvaerno5, 1e-8, 1e-10), rtol=1e-8,
                   atol=1e-10)
    np.testing.assert_allclose(float(sol.ys["a"][-1, 0]), exact(1.0, 0.0), atol=1e-7)
    for j, y0_j in enumerate((1.0, 2.0)):
        np.testing.assert_allclose(float(sol.ys["b"][-1, 0, j]), exact(1.0, y0_j), atol=1e-7)


def test_float32_robertson():
    # float32 (eps 1.2e-7): Robertson to t = 40 at rtol 1e-4 with the default Newton
    # tolerance (100 eps); y2 (~1e-5) keeps about four digits
    sol = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0], jnp.float32), 0.0, 40.0,
                   solver=sl.Kvaerno5(), rtol=1e-4, atol=1e-9, args=(0.04, 3e7, 1e4))
    assert sol.ys.dtype == jnp.float32 and sol.result == 0
    ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                    rtol=1e-12, atol=1e-20, args=((0.04, 3e7, 1e4),), jac=robertson_jac).y[:, -1]
    err = np.max(np.abs(np.asarray(sol.ys[-1], np.float64) - ref) / (1e-9 + 1e-4 * np.abs(ref)))
    assert err <= 10.0, err


# ------------------------------------------------------------------ gradients


@pytest.mark.parametrize("adjoint", [
    sl.Direct(), pytest.param(sl.Checkpointed(), marks=pytest.mark.slow),
    pytest.param(sl.ForwardMode(), marks=pytest.mark.slow)],
    ids=["direct", "checkpointed", "forward"])
def test_gradient_against_finite_differences(adjoint):
    # d y(1) / d lam for y' = -lam (y - cos t), y(0) = 0, through the converged stages
    # (implicit function theorem), against central differences of the closed form
    def y_end(lam):
        f = lambda t, y, a: -a * (y - jnp.cos(t))  # noqa: E731
        return sl.solve(f, jnp.array([0.0]), 0.0, 1.0, solver=kvaerno(sl.Kvaerno5, 1e-9, 1e-9),
                        rtol=1e-9, atol=1e-9, args=lam, adjoint=adjoint).ys[-1, 0]

    def exact(lam):
        return relaxation(lam)[1](1.0, 0.0)

    eps = 1e-6
    fd = (exact(20.0 + eps) - exact(20.0 - eps)) / (2 * eps)
    assert float(jax.grad(y_end)(20.0)) == pytest.approx(fd, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.Checkpointed(), sl.ForwardMode()],
                         ids=["direct", "checkpointed", "forward"])
def test_robertson_gradient_against_finite_differences(adjoint):
    # d y1(40) / d k1 on Robertson (Radau finite differences: -4.2475588)
    def y1_at_40(k1):
        return sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0,
                        solver=sl.Kvaerno5(newton_rtol=1e-12, newton_atol=1e-18), rtol=1e-8,
                        atol=1e-14, args=(k1, 3e7, 1e4), max_steps=20_000,
                        adjoint=adjoint).ys[-1, 0]

    def ref(k1):
        return solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                         rtol=1e-12, atol=1e-20, args=((k1, 3e7, 1e4),),
                         jac=robertson_jac).y[0, -1]

    eps = 1e-5
    fd = (ref(0.04 + eps) - ref(0.04 - eps)) / (2 * eps)
    assert float(jax.grad(y1_at_40)(0.04)) == pytest.approx(fd, rel=1e-6)


def test_backward_euler_gradient():
    # d y(2) / d a for y' = a y^2 at h = 0.5 against differences of the recursion
    def y_end(a):
        return sl.solve(square, jnp.array([1.0]), 0.0, 2.0,
                        solver=sl.BackwardEuler(newton_rtol=1e-13, newton_atol=1e-13),
                        dt=0.5, args=a).ys[-1, 0]

    eps = 1e-6
    fd = (backward_euler_square(-1 + eps, 0.5, 4)[-1]
          - backward_euler_square(-1 - eps, 0.5, 4)[-1]) / (2 * eps)
    assert float(jax.grad(y_end)(-1.0)) == pytest.approx(fd, rel=1e-7)


ENSEMBLE_RTOL, ENSEMBLE_ATOL = 1e-6, 1e-12


def robertson_final(k1, solver):
    return sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0, solver=solver,
                    rtol=ENSEMBLE_RTOL, atol=ENSEMBLE_ATOL, args=(k1, 3e7, 1e4)).ys[-1]


def assert_robertson_40(k1, y):
    ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                    rtol=1e-12, atol=1e-20, args=((k1, 3e7, 1e4),), jac=robertson_jac).y[:, -1]
    err = np.max(np.abs(y - ref) / (ENSEMBLE_ATOL + ENSEMBLE_RTOL * np.abs(ref)))
    assert err <= 10.0, (k1, err)


def test_adaptive_ensemble_under_jit_vmap():
    # Robertson to t = 40 for three k1: each member within 10 tolerances of Radau
    k1s = [0.03, 0.04, 0.05]
    ys = jax.jit(jax.vmap(lambda k1: robertson_final(k1, sl.Kvaerno5())))(jnp.array(k1s))
    for k1, y in zip(k1s, np.asarray(ys), strict=True):
        assert_robertson_40(k1, y)


@pytest.mark.slow
def test_jacobian_choices():
    # jac="rev" and a user jac. (The user jac ignores its args: adaptive runs hand the
    # solver closure-converted args, (args, consts), which a callable jac would receive
    # instead of the user's; reported, not fixed here.)
    def user_jac(t, y, _):
        return jnp.asarray(robertson_jac(t, y, ROBERTSON_K))

    for jac in ("rev", user_jac):
        assert_robertson_40(0.04, np.asarray(robertson_final(0.04, sl.Kvaerno5(jac=jac))))
