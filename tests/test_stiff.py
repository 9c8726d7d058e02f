"""Stiff problems with ``Rosenbrock23`` (Shampine and Reichelt, SIAM J. Sci. Comput. 18, 1997).

References outside simlib: scipy's ``Radau`` at ``rtol = 1e-12`` (with the exact Jacobian)
for Robertson's kinetics and Van der Pol at ``mu = 1000``, and closed forms of
``y' = -lam (y - cos t)`` for the convergence order and L-stability. Errors are measured
in units of the tolerance, ``max_i |y_i - ref_i| / (atol + rtol |ref_i|)`` at ``t1``; step
counts are printed next to scipy ``Radau``'s at the same tolerance (``pytest -s``).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.integrate import solve_ivp

import simlib as sl

# ---------------------------------------------------------------------------- problems


def robertson(t, y, k):
    k1, k2, k3 = k
    y1, y2, y3 = y[0], y[1], y[2]
    return jnp.stack([-k1 * y1 + k3 * y2 * y3, k1 * y1 - k3 * y2 * y3 - k2 * y2**2,
                      k2 * y2**2])


def robertson_np(t, y, k):
    k1, k2, k3 = k
    y1, y2, y3 = y
    return [-k1 * y1 + k3 * y2 * y3, k1 * y1 - k3 * y2 * y3 - k2 * y2**2, k2 * y2**2]


def robertson_jac(t, y, k):
    k1, k2, k3 = k
    y1, y2, y3 = y
    return [[-k1, k3 * y3, k3 * y2], [k1, -k3 * y3 - 2 * k2 * y2, -k3 * y2],
            [0.0, 2 * k2 * y2, 0.0]]


ROBERTSON_K = (0.04, 3e7, 1e4)  # Hairer and Wanner, Solving ODEs II, IV.1 (1.4)


def van_der_pol(t, y, mu):
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def van_der_pol_np(t, y, mu):
    return [y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]]


def van_der_pol_jac(t, y, mu):
    return [[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]]


# name: (f, f_np, jac_np, args, y0, t1, atol / rtol)
PROBLEMS = {
    # to t = 1e5: y2 falls from its 3.6e-5 peak to 7e-8, so atol is far below rtol
    "robertson": (robertson, robertson_np, robertson_jac, ROBERTSON_K, [1.0, 0.0, 0.0],
                  1e5, 1e-6),
    # two relaxation cycles and more (period about 1614 at mu = 1000)
    "van_der_pol_mu1000": (van_der_pol, van_der_pol_np, van_der_pol_jac, 1000.0, [2.0, 0.0],
                           3000.0, 1.0),
}


@functools.cache
def scipy_run(name, rtol, method="Radau"):
    _, f_np, jac_np, args, y0, t1, atol_per_rtol = PROBLEMS[name]
    sol = solve_ivp(f_np, (0.0, t1), y0, method=method, rtol=rtol, atol=rtol * atol_per_rtol,
                    args=(args,), jac=jac_np)
    assert sol.success
    return sol.y[:, -1], sol.t.size - 1


def simlib_run(name, rtol):
    f, _, _, args, y0, t1, atol_per_rtol = PROBLEMS[name]
    sol = sl.solve(f, jnp.asarray(y0), 0.0, t1, solver=sl.Rosenbrock23(), rtol=rtol,
                   atol=rtol * atol_per_rtol, args=args, max_steps=20_000)
    return np.asarray(sol.ys[-1]), {k: int(v) for k, v in sol.stats.items() if k != "t_final"}


def error_in_tolerances(name, rtol):
    ref, _ = scipy_run(name, 1e-12)
    y, stats = simlib_run(name, rtol)
    atol = rtol * PROBLEMS[name][-1]
    err = float(np.max(np.abs(y - ref) / (atol + rtol * np.abs(ref))))
    _, radau_steps = scipy_run(name, rtol)
    print(f"\n{name} rtol={rtol:g}: error {err:.2f} tolerances, {stats['num_steps']} steps "
          f"({stats['num_rejected']} rejected) against Radau's {radau_steps}")
    return err, stats


# ------------------------------------------------------------------ accuracy vs Radau

# Rosenbrock23 is second order under error-per-step control, so its global error grows
# like rtol^(2/3), i.e. relative to the tolerance like rtol^(-1/3): on Van der Pol (whose
# relaxation jumps amplify the time-shift errors) it stays within 10 tolerances only at
# rtol 1e-4, and on Robertson down to rtol 1e-5. The rest is the target of issue 9 that
# this method does not meet (strict xfail: they fail the suite if they start passing).
# Neither the norm nor the controller is the cause (measured, rtol 1e-4 / 1e-5 / 1e-6): a
# max norm instead of the RMS norm gives Robertson 2.1 / 4.7 / 8.3 and Van der Pol 16 / 37
# / 60 tolerances for 25-30% more steps (a tighter tolerance in effect); ode23s's own
# controller (0.8 r^(-1/3) clipped to [0.1, 5], no PI) gives 5.5 / 10 / 18 and 26 / 71 /
# 99. Every variant's error grows like rtol^(-1/3) in tolerance units: the order, not the
# control.
MISSES_TARGET = {("robertson", 1e-6), ("van_der_pol_mu1000", 1e-4),
                 ("van_der_pol_mu1000", 1e-5), ("van_der_pol_mu1000", 1e-6)}


@pytest.mark.parametrize("rtol", [1e-4, 1e-5, 1e-6])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_within_ten_tolerances_of_radau(name, rtol, request):
    if (name, rtol) in MISSES_TARGET:
        request.applymarker(pytest.mark.xfail(strict=True, reason="order 2: error grows "
                                              "like rtol^(2/3); see MISSES_TARGET"))
    err, stats = error_in_tolerances(name, rtol)
    assert stats["num_steps"] < 20_000
    assert err <= 10.0


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_error_is_bounded_and_shrinks_with_rtol(name):
    # What the method does achieve everywhere: within 100 tolerances, and the error
    # itself falls with rtol at about the rate rtol^(2/3) of an order-2 method.
    errs = []
    for rtol in (1e-4, 1e-5, 1e-6):
        err, _ = error_in_tolerances(name, rtol)
        assert err <= 100.0
        errs.append(err * rtol)
    rates = np.log10(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(rates > 0.5), rates


# ------------------------------------------------------------------ order, L-stability


def relaxation(lam):
    """``y' = -lam (y - cos t)``, and its closed form from ``y(0) = y0``."""

    def f(t, y, args):
        return -lam * (y - jnp.cos(t))

    def exact(t, y0):
        slow = lam * (lam * np.cos(t) + np.sin(t)) / (lam**2 + 1)
        return slow + (y0 - lam**2 / (lam**2 + 1)) * np.exp(-lam * t)

    return f, exact


def test_convergence_order_two():
    # mildly stiff and non-autonomous, so df/dt enters every stage
    f, exact = relaxation(50.0)
    ns = np.array([20, 40, 80, 160])
    errs = [abs(float(sl.solve(f, jnp.array([0.0]), 0.0, 1.0, solver=sl.Rosenbrock23(),
                               dt=1.0 / n).ys[-1, 0]) - exact(1.0, 0.0)) for n in ns]
    order = np.polyfit(np.log(1.0 / ns), np.log(errs), 1)[0]  # slope of log err vs log h
    assert abs(order - 2.0) < 0.3, (order, errs)
    # df/dt matters: without it (a W-method on this non-autonomous problem) the order
    # stays 2 but the error is about 50 times larger (9e-5 at h = 1/160, here 1.8e-6)
    assert errs[-1] < 1e-5, errs


def test_no_oscillation_at_large_steps():
    # y' = -1e6 (y - cos t) from y(0) = 2, one unit off the slow solution: an L-stable
    # method damps that unit in one step (|R(z)| -> 0 as z -> -inf) and then follows
    # cos t; the trapezoidal rule (A- but not L-stable) would flip it at every step.
    f, exact = relaxation(1e6)
    sol = sl.solve(f, jnp.array([2.0]), 0.0, 10.0, solver=sl.Rosenbrock23(), dt=0.1,
                   saveat=sl.SaveAt(steps=True))
    t, y = np.asarray(sol.ts), np.asarray(sol.ys[:, 0])
    e = y - exact(t, 2.0)
    assert t.size == 100
    assert np.max(np.abs(e)) < 2e-3, np.max(np.abs(e))
    # the error follows a smooth O(h^2) curve like the derivatives of cos t (three zero
    # crossings in [0, 10]) instead of flipping at every step
    assert np.sum(e[1:] * e[:-1] < 0) <= 4
    # and at h = 0.5 (lam h = 5e5) still no growth and no flipping: the error stays O(h^2)
    sol = sl.solve(f, jnp.array([2.0]), 0.0, 10.0, solver=sl.Rosenbrock23(), dt=0.5,
                   saveat=sl.SaveAt(steps=True))
    e = np.asarray(sol.ys[:, 0]) - exact(np.asarray(sol.ts), 2.0)
    assert np.max(np.abs(e)) < 0.05, np.max(np.abs(e))
    assert np.sum(e[1:] * e[:-1] < 0) <= 4


# ------------------------------------------------------------------ jit, vmap, ts, grad


def test_jit_vmap_and_dense_output():
    # Robertson to t = 40 (Hairer and Wanner's classic check point), an ensemble of
    # perturbed k1, saved at intermediate times through the method's interpolant
    k1s = jnp.array([0.03, 0.04, 0.05])
    ts = jnp.array([0.5, 4.0, 40.0])
    rtol, atol = 1e-6, 1e-12

    @jax.jit
    @jax.vmap
    def run(k1):
        sol = sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0,
                       solver=sl.Rosenbrock23(), rtol=rtol, atol=atol,
                       args=(k1, 3e7, 1e4), saveat=sl.SaveAt(ts=ts))
        return sol.ys, sol.result

    ys, result = run(k1s)
    assert np.all(np.asarray(result) == 0)
    for i, k1 in enumerate(np.asarray(k1s)):
        k = (float(k1), 3e7, 1e4)
        ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                        rtol=1e-12, atol=1e-20, args=(k,), jac=robertson_jac,
                        t_eval=np.asarray(ts)).y.T
        err = np.max(np.abs(np.asarray(ys[i]) - ref) / (atol + rtol * np.abs(ref)))
        assert err <= 10.0, (float(k1), err)


@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.Checkpointed(), sl.ForwardMode()],
                         ids=["direct", "checkpointed", "forward"])
def test_gradient_against_finite_differences(adjoint):
    # d y1(40) / d k1, through the LU solves and the Jacobian, with every adjoint
    def y1_at_40(k1):
        return sl.solve(robertson, jnp.array([1.0, 0.0, 0.0]), 0.0, 40.0,
                        solver=sl.Rosenbrock23(), rtol=1e-8, atol=1e-14,
                        args=(k1, 3e7, 1e4), max_steps=20_000, adjoint=adjoint).ys[-1, 0]

    def ref(k1):
        return solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau",
                         rtol=1e-12, atol=1e-20, args=((k1, 3e7, 1e4),),
                         jac=robertson_jac).y[0, -1]

    g = float(jax.grad(y1_at_40)(0.04))
    eps = 1e-5
    fd = (ref(0.04 + eps) - ref(0.04 - eps)) / (2 * eps)
    assert g == pytest.approx(fd, rel=1e-3)


def test_pytree_state():
    # two uncoupled copies of y' = -50 (y - cos t) in a dict of differently shaped leaves
    f1, exact = relaxation(50.0)

    def f(t, y, args):
        return {"a": f1(t, y["a"], args), "b": f1(t, y["b"], args)}

    y0 = {"a": jnp.array([0.0]), "b": jnp.array([[1.0, 2.0]])}
    sol = sl.solve(f, y0, 0.0, 1.0, solver=sl.Rosenbrock23(), rtol=1e-6, atol=1e-9,
                   saveat=sl.SaveAt(ts=jnp.array([0.25, 1.0])))
    ts = np.array([0.25, 1.0])
    np.testing.assert_allclose(np.asarray(sol.ys["a"][:, 0]), exact(ts, 0.0), atol=1e-5)
    for j, y0_j in enumerate((1.0, 2.0)):
        np.testing.assert_allclose(np.asarray(sol.ys["b"][:, 0, j]), exact(ts, y0_j),
                                   atol=1e-5)


def test_stiff_guide_runs_as_written():
    # docs/stiff.md's python block, executed as written; its claims checked independently:
    # the explicit solver needs far more steps than the stiff one, and the eigenvalues it
    # prints are those of the hand-written Jacobian at the final state
    import contextlib
    import io
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "stiff.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert blocks
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, "docs/stiff.md", "exec"), ns)  # noqa: S102 - our own docs
    assert int(ns["explicit"].stats["num_steps"]) > 10 * int(ns["stiff"].stats["num_steps"])
    assert int(ns["stiff"].result) == 0
    y = np.asarray(ns["stiff"].ys[-1])
    eig = np.sort(np.linalg.eigvals(np.array(robertson_jac(40.0, y, ROBERTSON_K))).real)
    np.testing.assert_allclose(np.sort(np.linalg.eigvals(np.asarray(ns["J"])).real), eig,
                               rtol=1e-9, atol=1e-12)
    assert -4e3 < eig[0] < -3e3  # the stiff mode the page quotes (about -3.4e3)
    # the jac= block: forward, reverse and the closed-form Jacobian take the same steps and
    # agree with scipy Radau (rtol 1e-12, hand-written Jacobian) at t = 40
    runs = ns["runs"]
    assert len({int(r.stats["num_steps"]) for r in runs}) == 1
    ref = solve_ivp(robertson_np, (0.0, 40.0), [1.0, 0.0, 0.0], method="Radau", rtol=1e-12,
                    atol=1e-16, args=(ROBERTSON_K,), jac=robertson_jac).y[:, -1]
    for r in runs:
        np.testing.assert_allclose(np.asarray(r.ys[-1]), ref, rtol=1e-6, atol=1e-13)
    # the E5 block: the figures of its table against e5.f's published y2 + y3
    total = 0.8867655517642120e-22 + 0.8854814626268838e-22
    drifts, errors = {}, {}
    for name, sol in ns["e5_runs"].items():
        y = np.asarray(sol.ys[-1])
        drifts[name], errors[name] = abs(y[1] - y[2] - y[3]), abs(y[1] + y[2] - total) / total
    assert drifts["Rodas5"] <= 9.7e-25 and errors["Rodas5"] <= 1e-5
    assert drifts["Rodas5P"] <= 2e-23 and errors["Rodas5P"] <= 2e-3
