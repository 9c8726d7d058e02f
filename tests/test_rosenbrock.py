"""The order-5 Rosenbrock methods ``Rodas5P`` (Steinebach, BIT 63, 2023) and ``Rodas5``
(Di Marzo 1993; Hairer and Wanner, Solving ODEs II, IV.7), and the ``jac=`` setting.

References outside simlib: scipy's ``Radau`` at ``rtol = 1e-12`` (exact Jacobian), the
published reference solution of Robertson's problem at ``t = 1e11`` (the Bari test set for
IVP solvers, problem ROBER) and of E5 (problem E5, with its exact linear invariant
``y2 - y3 - y4 = 0``), closed forms of ``y' = -lam (y - cos t)`` and ``y' = p y^2``,
and central finite differences of scipy solutions. Errors are in units of the tolerance,
``max_i |y_i - ref_i| / (atol + rtol |ref_i|)``; ``pytest -s`` prints them with the step
counts next to scipy ``Radau``'s at the same tolerance.
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

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
    van_der_pol,
    van_der_pol_jac,
)

import simlib as sl

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from validation.stiff_reference import (  # noqa: E402
    E5,
    e5_invariant,
    e5_sum_error,
    e5_sum_error_of_drift,
)

SOLVERS = {"Rodas5P": sl.Rodas5P(), "Rodas5": sl.Rodas5()}

# Robertson to t = 1e11: the Bari test set's reference (W. M. Lioen and J. J. B. de Swart,
# Test set for IVP solvers, CWI report MAS-R9832, 1998, problem ROBER); scipy Radau at
# rtol 1e-12, atol 1e-22 agrees with it to 1e-12 relative.
ROBERTSON_1E11 = np.array([0.2083340149701255e-07, 0.8333360770334713e-13,
                           0.9999999791665050e+00])

ALL = {**{name: PROBLEMS[name] for name in PROBLEMS},
       "robertson_1e11": (robertson, None, None, ROBERTSON_K, [1.0, 0.0, 0.0], 1e11, 1e-10)}


@functools.cache
def reference(name):
    if name == "robertson_1e11":
        return ROBERTSON_1E11
    return scipy_run(name, 1e-12)[0]


@functools.cache
def radau_steps(name, rtol):
    if name != "robertson_1e11":
        return scipy_run(name, rtol)[1]
    sol = solve_ivp(robertson_np, (0.0, 1e11), [1.0, 0.0, 0.0], method="Radau", rtol=rtol,
                    atol=rtol * 1e-10, args=(ROBERTSON_K,), jac=robertson_jac)
    assert sol.success
    return sol.t.size - 1


@functools.cache
def rodas_run(solver, name, rtol):
    """(error in tolerances, steps, rejected, Radau's steps) of one run."""
    f, _, _, args, y0, t1, atol_per_rtol = ALL[name]
    atol = rtol * atol_per_rtol
    sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=SOLVERS[solver], rtol=rtol, atol=atol,
                   args=args, max_steps=20_000)
    assert int(sol.result) == 0
    ref = reference(name)
    err = float(np.max(np.abs(np.asarray(sol.ys[-1]) - ref) / (atol + rtol * np.abs(ref))))
    steps, rejected = int(sol.stats["num_steps"]), int(sol.stats["num_rejected"])
    radau = radau_steps(name, rtol)
    print(f"\n{solver} {name} rtol={rtol:g}: error {err:.2f} tolerances, {steps} steps "
          f"({rejected} rejected) against Radau's {radau} ({steps / radau:.2f}x)")
    return err, steps, rejected, radau


# --------------------------------------------------------- accuracy and steps vs Radau

RTOLS = [1e-4, 1e-6, 1e-8, 1e-10]
SLOW_RTOLS = [1e-5, 1e-7, 1e-9]

# Measured (float64, this commit): the targets that classical Rodas5 misses. On Van
# der Pol (mu = 1000) its error is 16, 13, 13, 12 tolerances at rtol 1e-6 .. 1e-9 (Rodas5P:
# at most 0.8); on Robertson to t = 1e5 at rtol 1e-10 it takes 7101 steps, 3.5x Radau's 2010
# (Rodas5P: 2195, 1.09x), its error estimate failing to grow the step once y2 is small.
MISSES_ACCURACY = {("Rodas5", "van_der_pol_mu1000", 1e-6): 16.1,
                   ("Rodas5", "van_der_pol_mu1000", 1e-7): 12.6,
                   ("Rodas5", "van_der_pol_mu1000", 1e-8): 12.6,
                   ("Rodas5", "van_der_pol_mu1000", 1e-9): 11.7}
MISSES_STEPS = {("Rodas5", "robertson", 1e-10): 3.5}


def _rtol_params():
    return ([pytest.param(r, id=f"{r:g}") for r in RTOLS]
            + [pytest.param(r, id=f"{r:g}", marks=pytest.mark.slow) for r in SLOW_RTOLS])


@pytest.mark.parametrize("rtol", _rtol_params())
@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_within_ten_tolerances_of_the_reference(solver, name, rtol, request):
    miss = MISSES_ACCURACY.get((solver, name, rtol))
    if miss is not None:
        request.applymarker(pytest.mark.xfail(
            strict=True, reason=f"measured {miss} tolerances (issue 9 target: 10)"))
    err, *_ = rodas_run(solver, name, rtol)
    assert err <= 10.0


@pytest.mark.parametrize("rtol", _rtol_params())
@pytest.mark.parametrize("name", list(ALL))
@pytest.mark.parametrize("solver", list(SOLVERS))
def test_at_most_twice_radaus_steps(solver, name, rtol, request):
    miss = MISSES_STEPS.get((solver, name, rtol))
    if miss is not None:
        request.applymarker(pytest.mark.xfail(
            strict=True, reason=f"measured {miss}x Radau's steps (issue 9 target: 2x)"))
    _, steps, _, radau = rodas_run(solver, name, rtol)
    assert steps <= 2 * radau


def test_rodas5p_error_is_within_one_tolerance():
    # what Rodas5P achieves on every problem: the error stays below one tolerance
    for name in ALL:
        for rtol in RTOLS:
            assert rodas_run("Rodas5P", name, rtol)[0] <= 1.0, (name, rtol)


# ------------------------------------------------------- E5 and its linear invariant

# E5, Enright, Hull and Lindberg's pyrolysis problem (stiff DETEST), as the Bari test
# set's e5.f writes it (f3 = f2 - f4), with e5.f's reference at t1 = 1e13: defined, with
# the measures below, in validation/stiff_reference.py. y2 - y3 - y4 = 0 holds for all t,
# exactly in the equations and for every Runge-Kutta and exact-Jacobian Rosenbrock step;
# a drift d of it stays as y2 - y3 = d once y1 and y4 are gone (t ~ 1e5) and by t1, where
# y2 ~ y3 ~ 9e-23, costs y2 + y3 the relative error (C M d t1)^2 / 12.


@functools.cache
def _e5_states():
    """E5 on its slow manifold at t = 1e3, 3e3 and 1e4 (scipy Radau, rtol 1e-10)."""
    ts = (1e3, 3e3, 1e4)
    sol = solve_ivp(E5.f_np, (0.0, ts[-1]), E5.y0, method="Radau", rtol=1e-10, atol=1e-30,
                    jac=E5.jac_np, args=(E5.args,), t_eval=ts)
    assert sol.success
    return [(t, sol.y[:, i]) for i, t in enumerate(ts)]


@pytest.mark.parametrize("solver", [sl.Rosenbrock23(), sl.Rodas5(), sl.Rodas5P()],
                         ids=["Rosenbrock23", "Rodas5", "Rodas5P"])
def test_e5_step_keeps_the_linear_invariant(solver):
    # One step of h = t / 10 from E5's slow manifold, where h gamma |J| reaches 1e5-1e6.
    # The step keeps y2 - y3 - y4 exactly in exact arithmetic; in float64 it may move it by
    # some roundings of the state. Before each stage's solve was refined through a jvp of
    # f, the LU's backward error moved it by 600-70,000 of them (Rodas5P at t = 1e4:
    # 7e4; Rosenbrock23 at t = 1e4: 614); after, by at most 16 (Kvaerno5 and
    # BackwardEuler, whose Newton residual comes from f, measured at most 12 here). The
    # roundings depend on the CPU's kernels: on an AVX-512 machine (AMD EPYC, 2026-12-07)
    # Rosenbrock23 at t = 1e4 moved it by 66.5 and Rodas5P by 23.3, so the bound is 100,
    # still 6x below the smallest figure before the refinement.
    k, f = jnp.asarray(E5.args), E5.f
    step = jax.jit(lambda t, y, h: solver.step(f, t, y, h, k, solver.init(f, t, y, k))[0])
    eps = np.finfo(np.float64).eps
    moved = []
    for t, y in _e5_states():
        y1 = np.asarray(step(t, jnp.asarray(y), 0.1 * t))
        units = eps * np.max(np.abs(y[1:]))
        moved.append(abs(float(e5_invariant(y1) - e5_invariant(y))) / units)
    print(f"\n{type(solver).__name__}: invariant moved by {np.round(moved, 1)} roundings")
    assert max(moved) <= 100.0


@functools.cache
def e5_run(solver, rtol):
    """``(|y2 - y3 - y4|, relative error of y2 + y3)`` of E5 at ``t1`` at ``rtol`` and
    ``atol = 1e-30`` (the test set's setting)."""
    sol = sl.solve(E5.f, jnp.asarray(E5.y0), 0.0, E5.t1, solver=SOLVERS[solver], rtol=rtol,
                   atol=1e-30, args=jnp.asarray(E5.args), max_steps=20_000)
    assert int(sol.result) == 0
    y = np.asarray(sol.ys[-1])
    drift, err = e5_invariant(y), e5_sum_error(y)
    print(f"\n{solver} E5 rtol={rtol:g}: y2 - y3 - y4 = {drift:.2e}, y2 + y3 relative error "
          f"{err:.1e}, {int(sol.stats['num_steps'])} steps")
    return abs(drift), err


def test_e5_rodas5p_invariant_and_y2_plus_y3_at_rtol_1e_6():
    # The setting. Before each stage's solve was refined through a jvp of f:
    # drift 4.2e-21 and y2 + y3 23 times the reference. After: 5e-24 to 9e-24 (as XLA
    # compiles the step), under this bound: 10 times what Rodas5P's own float64 arithmetic
    # leaves on the same steps with exact (mpmath) linear solves, 2.1e-24 (docs/stiff.md);
    # y2 + y3 is then off by what that drift explains and no more.
    drift, err = e5_run("Rodas5P", 1e-6)
    assert drift <= 2e-23
    assert err <= 2 * e5_sum_error_of_drift(drift) + 10 * 1e-6


# |d| <= 9.7e-25 keeps y2 + y3 within 10 tolerances of rtol 1e-6; the published y2 + y3
# is itself uncertain by ~2e-7 relative (by its own d of 1.28e-25)
E5_DRIFT = 9.7e-25


@pytest.mark.slow
@pytest.mark.parametrize("solver,rtol", [("Rodas5", 1e-6), ("Rodas5P", 1e-8)])
def test_e5_invariant_and_y2_plus_y3_at_t1(solver, rtol):
    # Before the refined stage solves: drift 1.4e-21 (Rodas5, rtol 1e-6) and 1.3e-21
    # (Rodas5P, 1e-8), y2 + y3 off by factors 7.9 and 7.3. After: 2e-26 to 3e-25, y2 + y3
    # within 6e-7. scipy Radau/BDF/LSODA keep |d| within 2e-25 at rtol 1e-6 to 1e-12.
    drift, err = e5_run(solver, rtol)
    assert drift <= E5_DRIFT
    assert err <= 10 * 1e-6


@pytest.mark.xfail(strict=True, reason="measured: at rtol 1e-6 Rodas5P's y2 + y3 on E5 is 2e-4 "
                   "to 9e-4 off (200-900 tolerances), set by its drift of 5e-24 to 9e-24: the "
                   "rounding of its off-manifold stage right-hand sides, 45 tolerances even with "
                   "exact linear solves (docs/stiff.md); Rodas5, Kvaerno5 and BDF meet it")
def test_e5_rodas5p_y2_plus_y3_within_ten_tolerances_at_rtol_1e_6():
    _, err = e5_run("Rodas5P", 1e-6)
    assert err <= 10 * 1e-6


# ------------------------------------------------------------ orders, L-stability


@functools.partial(jax.jit, static_argnums=(0, 1))
def _fixed_steps(solver, f, y0, t1, n):
    """``n`` steps of ``solver.step`` from ``(0, y0)`` to ``t1`` (one compilation per
    solver and field, whatever ``n``)."""
    h = t1 / n

    def body(i, y):
        t = i * h
        return solver.step(f, t, y, h, None, solver.init(f, t, y, None))[0]

    return jax.lax.fori_loop(0, n, body, y0)


def _fixed_step_errors(solver, f, exact, ns, t1=1.0, y0=0.0):
    return np.array([abs(float(_fixed_steps(solver, f, jnp.array([y0]), t1, n)[0])
                         - exact(t1, y0)) for n in ns])


def _slope(ns, errs):
    return np.polyfit(np.log(1.0 / np.asarray(ns)), np.log(errs), 1)[0]


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_convergence_order_five_on_a_smooth_problem(solver):
    # lam = 1: non-stiff, non-autonomous (df/dt in every stage); y(0) = 0, closed form
    f, exact = relaxation(1.0)
    ns = [5, 10, 20, 40]
    order = _slope(ns, _fixed_step_errors(SOLVERS[solver], f, exact, ns))
    assert abs(order - 5.0) < 0.3, order


@pytest.mark.parametrize("solver", [
    "Rodas5P",
    pytest.param("Rodas5", marks=pytest.mark.xfail(
        strict=True, reason="measured order 4.5: Rodas5's order reduction on this "
                            "Prothero-Robinson problem (Rodas5P was built to avoid it)")),
])
def test_convergence_order_five_when_stiff(solver):
    # lam = 50, h from 1/20 to 1/160 (lam h = 2.5 .. 0.3): the stiff regime where the
    # Prothero-Robinson conditions matter (Steinebach 2023)
    f, exact = relaxation(50.0)
    ns = [20, 40, 80, 160]
    errs = _fixed_step_errors(SOLVERS[solver], f, exact, ns)
    order = _slope(ns, errs)
    print(f"\n{solver} order on y' = -50 (y - cos t): {order:.2f}, errors {errs}")
    assert abs(order - 5.0) < 0.3, (order, errs)


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_embedded_estimate_and_dense_output_orders(solver):
    # One step from t = 0.3 of y' = -(y - cos t) (closed form): the error estimate u_8 is
    # the local error of the order-4 embedded solution, O(h^5); the dense output at
    # theta = 0.4 is of order 4, local error O(h^5) too.
    f, exact = relaxation(1.0)
    s = SOLVERS[solver]
    t0 = 0.3
    y0 = jnp.array([float(exact(t0, 0.0))])
    hs = np.array([0.2, 0.1, 0.05, 0.025])
    est, dense = [], []
    for h in hs:
        y1, err, d, _ = s.step(f, t0, y0, h, None, s.init(f, t0, y0, None))
        est.append(abs(float(err[0])))
        mid = s.interpolate(f, None, t0, y0, h, y1, d, 0.4)
        dense.append(abs(float(mid[0]) - exact(t0 + 0.4 * h, 0.0)))
    assert abs(np.polyfit(np.log(hs), np.log(est), 1)[0] - 5.0) < 0.3, est
    assert abs(np.polyfit(np.log(hs), np.log(dense), 1)[0] - 5.0) < 0.3, dense


@pytest.mark.parametrize("solver", list(SOLVERS))
def test_l_stable_no_oscillation_at_large_steps(solver):
    s = SOLVERS[solver]
    # R(-inf) = 0 (stiffly accurate): one step of y' = -lam y with h = 1 from y = 1 leaves
    # R(-lam) = O(1 / lam), where an A- but not L-stable method keeps |R| near 1
    def decay(t, y, lam):
        return -lam * y

    r = [abs(float(s.step(decay, 0.0, jnp.array([1.0]), 1.0, lam, None)[0][0]))
         for lam in (1e6, 1e8)]
    assert r[0] < 100 / 1e6, r
    assert r[1] / r[0] == pytest.approx(1e-2, rel=0.05), r
    # y' = -1e6 (y - cos t) from y(0) = 2, one unit off the slow solution: the unit falls
    # by R(-1e6 h) = O(1 / (1e6 h)) at each step, and from the third step the error
    # (measured: 1e-11 for Rodas5P, 4e-9 for Rodas5 at h = 0.5) follows a smooth curve
    # instead of flipping at every step
    f, exact = relaxation(1e6)
    for dt in (0.1, 0.5):
        sol = sl.solve(f, jnp.array([2.0]), 0.0, 10.0, solver=s, dt=dt,
                       saveat=sl.SaveAt(steps=True))
        e = np.asarray(sol.ys[:, 0]) - exact(np.asarray(sol.ts), 2.0)
        assert abs(e[0]) < 100 / (1e6 * dt) and abs(e[1]) < 1e-6, (dt, e[:2])
        assert np.max(np.abs(e[2:])) < 1e-7, (dt, np.max(np.abs(e[2:])))
        assert np.sum(e[3:] * e[2:-1] < 0) <= 4, dt


# --------------------------------------------------------- dense output, jit, vmap


def test_dense_output_against_radau_under_jit_and_vmap():
    # Robertson to t = 40 (Hairer and Wanner's check point) for three k1, saved at
    # intermediate times through the order-4 continuous extension
    k1s = jnp.array([0.03, 0.04, 0.05])
    ts = jnp.array([0.01, 0.5, 4.0, 17.0, 40.0])
    rtol, atol = 1e-8, 1e-14

    @jax.jit
    @jax.vmap
    def run(k1):
        sol = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0,
                       solver=sl.Rodas5P(), rtol=rtol, atol=atol, args=(k1, 3e7, 1e4),
                       saveat=sl.SaveAt(ts=ts))
        return sol.ys, sol.result

    ys, result = run(k1s)
    assert np.all(np.asarray(result) == 0)
    for i, k1 in enumerate(np.asarray(k1s)):
        ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                        rtol=1e-12, atol=1e-20, args=((float(k1), 3e7, 1e4),),
                        jac=robertson_jac, t_eval=np.asarray(ts)).y.T
        err = np.max(np.abs(np.asarray(ys[i]) - ref) / (atol + rtol * np.abs(ref)))
        assert err <= 10.0, (float(k1), err)


def test_ensemble_member_failing_does_not_stop_the_others():
    # y' = p y^2, y(0) = 1: y = 1 / (1 - p t); the member p = 1 blows up at t = 1 < t1
    ps = jnp.array([-1.0, 1.0, -0.5])

    @jax.jit
    @jax.vmap
    def run(p):
        sol = sl.solve(lambda t, y, p: p * y**2, jnp.array([1.0]), 0.0, 2.0,
                       solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10, args=p, throw=False,
                       max_steps=2000)
        return sol.ys[-1, 0], sol.result

    y, result = run(ps)
    result = np.asarray(result)
    assert result[1] != 0 and result[0] == 0 and result[2] == 0
    for i in (0, 2):
        p = float(ps[i])
        assert float(y[i]) == pytest.approx(1.0 / (1.0 - 2.0 * p), rel=1e-7)


def test_pytree_state():
    # two uncoupled copies of y' = -50 (y - cos t) in a dict of differently shaped leaves
    f1, exact = relaxation(50.0)

    def f(t, y, args):
        return {"a": f1(t, y["a"], args), "b": f1(t, y["b"], args)}

    y0 = {"a": jnp.array([0.0]), "b": jnp.array([[1.0, 2.0]])}
    sol = sl.solve(f, y0, 0.0, 1.0, solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10,
                   saveat=sl.SaveAt(ts=jnp.array([0.25, 1.0])))
    ts = np.array([0.25, 1.0])
    np.testing.assert_allclose(np.asarray(sol.ys["a"][:, 0]), exact(ts, 0.0), atol=1e-7)
    for j, y0_j in enumerate((1.0, 2.0)):
        np.testing.assert_allclose(np.asarray(sol.ys["b"][:, 0, j]), exact(ts, y0_j),
                                   atol=1e-7)


# ------------------------------------------------------------------- gradients


@functools.cache
def _fd_robertson_k1():
    def ref(k1):
        return solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                         rtol=1e-12, atol=1e-20, args=((k1, 3e7, 1e4),),
                         jac=robertson_jac).y[0, -1]

    eps = 1e-5
    return (ref(0.04 + eps) - ref(0.04 - eps)) / (2 * eps)


@pytest.mark.parametrize("adjoint", [
    sl.Direct(),
    pytest.param(sl.Checkpointed(), marks=pytest.mark.slow),
    pytest.param(sl.ForwardMode(), marks=pytest.mark.slow),
], ids=["direct", "checkpointed", "forward"])
def test_gradient_against_finite_differences(adjoint):
    # d y1(40) / d k1 through the LU solves, the Jacobian and df/dt, with every adjoint
    def y1_at_40(k1):
        return sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0,
                        solver=sl.Rodas5P(), rtol=1e-8, atol=1e-14, args=(k1, 3e7, 1e4),
                        max_steps=1024, adjoint=adjoint).ys[-1, 0]

    g = float(jax.grad(y1_at_40)(0.04))
    assert g == pytest.approx(_fd_robertson_k1(), rel=1e-4)


# ------------------------------------------------------------------- float32


def test_float32_robertson():
    # In float32 (eps 6e-8) the state carries 7 digits: Robertson to t = 40 at rtol 1e-4
    # still ends within 10 tolerances of Radau's float64 solution (measured: about 0.1),
    # while rtol below ~1e-6 asks for more than float32 holds. The state and the run stay
    # float32 throughout.
    y0 = jnp.array([1.0, 0.0, 0.0], jnp.float32)
    rtol, atol = 1e-4, 1e-9
    sol = sl.solve(robertson, y0, 0.0, 40.0, solver=sl.Rodas5P(), rtol=rtol, atol=atol,
                   args=tuple(jnp.float32(k) for k in ROBERTSON_K))
    assert sol.ys.dtype == jnp.float32
    assert int(sol.result) == 0
    ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau", rtol=1e-12,
                    atol=1e-20, args=(ROBERTSON_K,), jac=robertson_jac).y[:, -1]
    err = np.max(np.abs(np.asarray(sol.ys[-1], np.float64) - ref) / (atol + rtol * np.abs(ref)))
    print(f"\nfloat32 Robertson to t = 40 at rtol 1e-4: {err:.3f} tolerances, "
          f"{int(sol.stats['num_steps'])} steps")
    assert err <= 10.0


def test_float32_van_der_pol_mu1000():
    # With time in float32 this ended with STEP_SIZE_TOO_SMALL at t = 807, the first
    # relaxation jump (the driver's step floor 10 eps |t| was 1e-3 there); time is now
    # carried in float64 (x64) whatever the state's dtype, and the run reaches t1.
    sol = sl.solve(van_der_pol, jnp.array([2.0, 0.0], jnp.float32), 0.0, 3000.0,
                   solver=sl.Rodas5P(), rtol=1e-4, atol=1e-4, args=jnp.float32(1000.0),
                   throw=False, max_steps=5000)
    assert int(sol.result) == 0


# ------------------------------------------------------------------- jac=


def _user_jac_robertson(t, y, k):
    return jnp.asarray(robertson_jac(t, y, k))


def _user_jac_vdp(t, y, mu):
    return jnp.asarray(van_der_pol_jac(t, y, mu))


@pytest.mark.parametrize("cls,name,user_jac", [
    (sl.Rodas5P, "robertson", _user_jac_robertson),
    (sl.Rosenbrock23, "van_der_pol_mu1000", _user_jac_vdp),
    pytest.param(sl.Rodas5P, "van_der_pol_mu1000", _user_jac_vdp, marks=pytest.mark.slow),
    pytest.param(sl.Rosenbrock23, "robertson", _user_jac_robertson, marks=pytest.mark.slow),
], ids=["Rodas5P-robertson", "Rosenbrock23-vdp", "Rodas5P-vdp", "Rosenbrock23-robertson"])
def test_jac_rev_and_user_jac_agree_with_fwd(cls, name, user_jac):
    f, _, _, args, y0, t1, atol_per_rtol = PROBLEMS[name]
    t1 = min(t1, 500.0)  # the first relaxation jump of Van der Pol is enough
    ys = {}
    for jac in ("fwd", "rev", user_jac):
        sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=cls(jac=jac), rtol=1e-6,
                       atol=1e-6 * atol_per_rtol, args=args, max_steps=20_000)
        ys[jac if isinstance(jac, str) else "user"] = (np.asarray(sol.ys[-1]),
                                                       int(sol.stats["num_steps"]))
    ref, ref_steps = ys["fwd"]
    for key in ("rev", "user"):
        y, steps = ys[key]
        # the same Jacobian up to rounding: the same steps, the same answer to rounding
        assert steps == ref_steps, key
        np.testing.assert_allclose(y, ref, rtol=1e-9, atol=1e-15, err_msg=key)


@pytest.mark.parametrize("cls", [sl.Rodas5P, sl.Rodas5, sl.Rosenbrock23])
def test_jac_setting_is_validated_and_compared(cls):
    for bad in ("bwd", None, 3):
        with pytest.raises(ValueError, match="jac"):
            cls(jac=bad)
    assert cls() == cls(jac="fwd") and hash(cls()) == hash(cls(jac="fwd"))
    assert cls(jac="rev") != cls() and repr(cls(jac="rev")) == f"{cls.__name__}(jac='rev')"
    assert cls(jac=_user_jac_vdp) == cls(jac=_user_jac_vdp)
    assert hash(cls(jac=_user_jac_vdp)) == hash(cls(jac=_user_jac_vdp))
    assert cls(jac=_user_jac_vdp) != cls(jac=_user_jac_robertson)


def test_user_jac_of_the_wrong_shape_raises():
    with pytest.raises(ValueError, match="jac"):
        sl.solve(van_der_pol, jnp.array([2.0, 0.0]), 0.0, 1.0,
                 solver=sl.Rodas5P(jac=lambda t, y, mu: jnp.eye(3)), args=1000.0,
                 rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------- docs


def test_docs_solvers_rodas_example_runs():
    # the python block of docs/solvers.md's Rodas section runs as written, and its
    # Robertson run ends close to the Bari reference at t = 1e11
    page = (Path(__file__).resolve().parent.parent / "docs" / "solvers.md").read_text()
    section = page[page.index("### Rodas5P"):]
    block = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    ns: dict = {}
    exec(compile(block, "docs/solvers.md", "exec"), ns)  # noqa: S102 - our own docs
    y = np.asarray(ns["sol"].ys[-1])
    np.testing.assert_allclose(y, ROBERTSON_1E11, rtol=1e-5)
