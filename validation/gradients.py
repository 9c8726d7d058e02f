"""Part 5: gradients through the solvers.

Loss: mean squared difference between the Lotka-Volterra trajectory at 20 save
times in [0.5, 10] and data generated (scipy DOP853, 1e-13) at other parameters
theta* = (1.6, 1.05, 2.9, 0.95); differentiated with respect to the four parameters
``args = (alpha, beta, gamma, delta)`` at the defaults (1.5, 1, 3, 1).

* simlib: ``jax.grad`` through adaptive Tsit5 (``SaveAt(ts=...)``, dense output) and
  through fixed-step RK4.
* finite differences: central differences of the same simlib program
  (relative step 1e-5), so they measure whether ``jax.grad`` differentiates what
  the forward pass computes.
* exact: the continuous gradient from the forward sensitivity equations
  ``S' = f_y S + f_theta`` integrated by scipy DOP853 at 1e-13.
* diffrax: ``jax.grad`` through ``diffeqsolve`` with Tsit5, ``PIDController`` at the
  same tolerance and its default adjoint (``RecursiveCheckpointAdjoint``).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl
from simlib import systems

from .common import (
    Case,
    Checks,
    Section,
    best_time,
    block,
    fmt,
    md_table,
    reference,
    try_import_diffrax,
)

THETA0 = np.array(systems.LOTKA_VOLTERRA_DEFAULT_ARGS)
THETA_DATA = np.array([1.6, 1.05, 2.9, 0.95])
Y0 = np.array([10.0, 5.0])
T1 = 10.0
TS = np.linspace(0.5, T1, 20)
FD_REL_STEP = 1e-5
NAMES = ("alpha", "beta", "gamma", "delta")


def _lv_case(theta, f=systems.lotka_volterra, y0=Y0, name="lotka_volterra") -> Case:
    return Case(name=name, f=f, y0=y0, t0=0.0, t1=T1, args=np.asarray(theta),
                description="Lotka-Volterra for the gradient study")


def _sensitivity_rhs(t, z, theta):
    y, s = z[:2], z[2:].reshape(2, 4)
    fy = jax.jacfwd(systems.lotka_volterra, argnums=1)(t, y, theta)
    fth = jax.jacfwd(lambda th: systems.lotka_volterra(t, y, th))(theta)
    return jnp.concatenate([systems.lotka_volterra(t, y, theta), (fy @ s + fth).ravel()])


def _exact(data):
    case = _lv_case(THETA0, f=_sensitivity_rhs, y0=np.concatenate([Y0, np.zeros(8)]),
                    name="lv_sensitivities")
    z = reference(case, TS)
    y, s = z[:, :2], z[:, 2:].reshape(len(TS), 2, 4)
    loss = float(np.mean((y - data) ** 2))
    grad = 2.0 / y.size * np.einsum("ij,ijk->k", y - data, s)
    return loss, grad


def _loss_fns(data, dfx, quick: bool):
    """``[(label, family, fn, param)]`` with ``fn(theta, param) -> (loss, result code)``.

    Runs of one family share ``fn``; the tolerance is a traced argument, so one
    compilation serves all tolerances of a family.
    """
    data = jnp.asarray(data)
    y0 = jnp.asarray(Y0)
    ts = jnp.asarray(TS)
    tols = (1e-8,) if quick else (1e-6, 1e-8, 1e-10)
    dts = (0.01,) if quick else (0.01, 0.001)

    def simlib_tsit5(theta, tol):
        sol = sl.solve(systems.lotka_volterra, y0, 0.0, T1, solver=sl.Tsit5(), rtol=tol,
                       atol=tol, args=theta, saveat=sl.SaveAt(ts=ts), throw=False)
        return jnp.mean((sol.ys - data) ** 2), sol.result

    def simlib_rk4(dt):
        def loss(theta, _):
            sol = sl.solve(systems.lotka_volterra, y0, 0.0, T1, solver=sl.RK4(), dt=dt,
                           args=theta, saveat=sl.SaveAt(ts=ts), max_steps=20_000,
                           throw=False)
            return jnp.mean((sol.ys - data) ** 2), sol.result
        return loss

    def diffrax_tsit5(theta, tol):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(systems.lotka_volterra), dfx.Tsit5(), 0.0, T1, None, y0,
            args=theta, saveat=dfx.SaveAt(ts=ts),
            stepsize_controller=dfx.PIDController(rtol=tol, atol=tol), throw=False)
        ok = sol.result == dfx.RESULTS.successful
        return jnp.mean((sol.ys - data) ** 2), jnp.where(ok, 0, 1)

    out = [(f"simlib Tsit5 tol {t:g}", "simlib Tsit5", simlib_tsit5, t) for t in tols]
    out += [(f"simlib RK4 dt {dt:g}", f"simlib RK4 {dt}", simlib_rk4(dt), 0.0) for dt in dts]
    if dfx is not None:
        out += [(f"diffrax Tsit5 tol {t:g}", "diffrax Tsit5", diffrax_tsit5, t) for t in tols]
    return out


def _central_differences(value, theta0, param, scale: float) -> np.ndarray:
    """Central differences of ``value(theta, param)`` with steps ``scale * 1e-5 |theta_k|``."""
    out = np.zeros(theta0.shape[0])
    for k in range(out.size):
        h = scale * FD_REL_STEP * abs(float(theta0[k]))
        e = np.zeros(out.size)
        e[k] = h
        out[k] = (float(value(theta0 + e, param)) - float(value(theta0 - e, param))) / (2 * h)
    return out


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - np.asarray(b)) / np.linalg.norm(b))


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    dfx, why = try_import_diffrax()
    data = reference(_lv_case(THETA_DATA), TS)
    loss_exact, grad_exact = _exact(data)
    theta0 = jnp.asarray(THETA0)
    recs, compiled = {}, {}
    for name, family, fn, param in _loss_fns(data, dfx, quick):
        if family not in compiled:
            compiled[family] = (jax.jit(lambda th, p, fn=fn: fn(th, p)[0]),
                                jax.jit(jax.value_and_grad(fn, has_aux=True)))
        value, vg = compiled[family]
        secs, ((loss, result), grad) = best_time(lambda vg=vg, p=param: block(vg(theta0, p)),
                                                 budget=0.3)
        fd, fd2 = _central_differences(value, theta0, param, 1.0), \
            _central_differences(value, theta0, param, 2.0)
        recs[name] = dict(loss=float(loss), grad=np.asarray(grad), fd=fd, time=secs,
                          ok=int(result) == 0, fd_err=_rel(fd2, fd) / 3)
    for name, r in recs.items():
        r["vs_exact"] = _rel(r["grad"], grad_exact)
        r["vs_fd"] = _rel(r["grad"], r["fd"])
        twin = name.replace("simlib", "diffrax")
        r["vs_diffrax"] = (_rel(r["grad"], recs[twin]["grad"])
                           if name.startswith("simlib") and twin in recs else None)

    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    if dfx is None:
        parts.append(f"**diffrax skipped:** {why}.\n")
    parts.append(f"Exact (sensitivity equations): loss = {loss_exact:.10g}, gradient = "
                 + ", ".join(f"{n} {g:.10g}" for n, g in zip(NAMES, grad_exact, strict=True))
                 + ".\n")
    rows = [[name, r["loss"], r["vs_exact"], r["vs_fd"], r["fd_err"], r["vs_diffrax"],
             r["time"] * 1e3, r["ok"]] for name, r in recs.items()]
    parts.append(md_table(["method", "loss", "rel. err vs exact", "rel. err vs FD of itself",
                           "FD error estimate", "rel. diff vs diffrax (same tol)",
                           "value+grad time [ms]", "ok"], rows))
    parts.append("\n`FD error estimate`: |FD(2h) - FD(h)| / 3 relative to |FD(h)|, the "
                 "truncation error of the central differences themselves; agreement with "
                 "FD cannot be better than this.\n")
    parts.append("\nRelative errors are 2-norms over the four components. Gradient "
                 "components:\n")
    rows = [[n, grad_exact[i]] + [recs[k]["grad"][i] for k in recs] for i, n in enumerate(NAMES)]
    parts.append(md_table(["param", "exact"] + list(recs), [
        [r[0]] + [f"{x:.8g}" for x in r[1:]] for r in rows]))

    findings = []
    for name, r in recs.items():
        if r["vs_fd"] > max(1e-6, 100 * r["fd_err"]):
            why = (" Expected for diffrax: its PIDController wraps the step-size factor in "
                   "lax.stop_gradient, so its gradient holds the step sizes fixed instead of "
                   "differentiating the controller as simlib does."
                   if name.startswith("diffrax") else "")
            findings.append(f"Gradients: {name} differs from central differences of its own "
                            f"forward pass by {fmt(r['vs_fd'])} (relative).{why}")
        if not r["ok"]:
            findings.append(f"Gradients: the {name} forward solve did not succeed.")
    summary = "; ".join(f"{k}: vs exact {fmt(r['vs_exact'])}, vs FD {fmt(r['vs_fd'])}"
                        + (f", vs diffrax {fmt(r['vs_diffrax'])}" if r["vs_diffrax"] else "")
                        for k, r in recs.items() if k.startswith("simlib"))
    findings.append(f"Gradients (relative 2-norm errors): {summary}.")
    data_out = {k: {kk: (vv.tolist() if isinstance(vv, np.ndarray) else vv)
                    for kk, vv in r.items()} for k, r in recs.items()}
    checks = Checks("gradients")
    for name, r in recs.items():
        if not name.startswith("simlib"):
            continue
        if not checks.add(f"{name}: forward solve succeeds", "yes" if r["ok"] else "no",
                          "yes", "run", r["ok"],
                          f"gradients: the {name} forward solve did not succeed", op="=="):
            continue
        bound = max(1e-6, 100 * r["fd_err"])
        checks.add(f"{name}: vs central differences", r["vs_fd"], bound, "rel",
                   r["vs_fd"] <= bound, f"gradients: {name} differs from central "
                   f"differences by {fmt(r['vs_fd'])} (relative)")
    return Section(title="5. Gradients", body="\n".join(parts), findings=findings,
                   failures=checks.failures, checks=checks.checks,
                   data=dict(records=data_out, exact=grad_exact.tolist()),
                   seconds=time.perf_counter() - start)
