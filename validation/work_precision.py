"""Part 4: work-precision, simlib against scipy and diffrax.

simlib (Tsit5, Dopri5, Dopri8), scipy ``solve_ivp`` (RK45, DOP853) and diffrax
(Tsit5, Dopri5, Dopri8 with a ``PIDController``) solve the same problem at
rtol = atol = tol over a range of tolerances. The error is the max-norm error at t1
(against the closed form for Kepler, scipy DOP853 at 1e-13 for Lotka-Volterra). Wall
times are warm (compilation excluded) and the best of several runs; simlib and
diffrax are called through one ``jax.jit`` whose tolerances are traced arguments
(so one compilation serves all tolerances), scipy gets a plain numpy right-hand
side (a jitted JAX one would mostly time JAX's dispatch).
"""

from __future__ import annotations

import time

import jax
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import NullFormatter

import simlib as sl

from .common import (
    Case,
    Checks,
    Section,
    best_time,
    block,
    flat_state,
    fmt,
    get_case,
    max_abs,
    md_table,
    reference,
    save_figure,
    scipy_rhs,
    scipy_solve,
    try_import_diffrax,
)

SIMLIB = ("Tsit5", "Dopri5", "Dopri8")
SCIPY = ("RK45", "DOP853")
DIFFRAX_STAGES = {"Tsit5": 6, "Dopri5": 6, "Dopri8": 13}  # new evaluations per step (FSAL)
MAX_STEPS = 100_000
STYLE = {"simlib": "-", "scipy": "--", "diffrax": ":"}
COLOR = {"Tsit5": "C0", "Dopri5": "C1", "Dopri8": "C2", "RK45": "C1", "DOP853": "C2"}


def _numpy_rhs(case: Case):
    """A plain numpy right-hand side on the flat state, for scipy's timings."""
    if case.name == "lotka_volterra":
        a, b, c, d = case.args

        def f(t, y):
            x, z = y
            return np.array([a * x - b * x * z, -c * z + d * x * z])
    elif case.name == "kepler":
        (mu,) = case.args

        def f(t, y):
            r3 = (y[0] ** 2 + y[1] ** 2) ** 1.5
            return np.array([y[2], y[3], -mu * y[0] / r3, -mu * y[1] / r3])
    else:
        raise KeyError(case.name)
    y0 = np.asarray(flat_state(case.y0))  # the numpy field must be the same ODE
    for t, y in ((0.0, y0), (0.3, 1.1 * y0 + 0.05)):
        np.testing.assert_allclose(f(t, y), scipy_rhs(case)(t, y), rtol=1e-12, atol=1e-12)
    return f


def _simlib_fn(case: Case, name: str):
    solver = getattr(sl, name)()
    y0 = case.y0_jax()

    @jax.jit
    def run(rtol, atol):
        sol = sl.solve(case.f, y0, case.t0, case.t1, solver=solver, rtol=rtol, atol=atol,
                       args=case.args, max_steps=MAX_STEPS, throw=False)
        return (flat_state(sol.ys, batched=True)[-1], sol.stats["num_fevals"],
                sol.stats["num_steps"], sol.result)

    return run


def _diffrax_fn(dfx, case: Case, name: str):
    solver = getattr(dfx, name)()
    y0 = case.y0_jax()

    @jax.jit
    def run(rtol, atol):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(case.f), solver, case.t0, case.t1, None, y0, args=case.args,
            saveat=dfx.SaveAt(t1=True),
            stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol),
            max_steps=MAX_STEPS, throw=False,
        )
        steps = sol.stats["num_steps"]
        return (flat_state(sol.ys, batched=True)[-1], DIFFRAX_STAGES[name] * steps + 2, steps,
                sol.result == dfx.RESULTS.successful)

    return run


def _measure(case: Case, tols, dfx):
    y_ref = (case.exact(np.array([case.t1]))[0] if case.exact is not None
             else reference(case, [case.t1])[0])
    rhs = _numpy_rhs(case)
    recs = []
    runners = [("simlib", n, _simlib_fn(case, n)) for n in SIMLIB]
    if dfx is not None:
        runners += [("diffrax", n, _diffrax_fn(dfx, case, n)) for n in SIMLIB]
    for lib, name, fn in runners:
        t = time.perf_counter()
        block(fn(1e-6, 1e-6))
        compile_s = time.perf_counter() - t
        for tol in tols:
            secs, out = best_time(lambda fn=fn, tol=tol: block(fn(tol, tol)))
            y, nfev, steps, res = out
            ok = bool(res == 0) if lib == "simlib" else bool(res)
            recs.append(dict(lib=lib, solver=name, tol=tol, time=secs, fevals=int(nfev),
                             steps=int(steps), ok=ok, compile=compile_s,
                             err=max_abs(np.asarray(y), y_ref) if ok else float("nan")))
    for name in SCIPY:
        for tol in tols:
            secs, out = best_time(lambda name=name, tol=tol: scipy_solve(case, name, tol, tol,
                                                                          fun=rhs),
                                  min_repeats=2, budget=0.3)
            ys, nfev, ok = out
            recs.append(dict(lib="scipy", solver=name, tol=tol, time=secs, fevals=nfev,
                             steps=None, ok=ok, compile=0.0,
                             err=max_abs(ys[-1], y_ref) if ok else float("nan")))
    return recs


def _figure(case: Case, recs) -> str:
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for lib, name in sorted({(r["lib"], r["solver"]) for r in recs}):
        rs = [r for r in recs if r["lib"] == lib and r["solver"] == name]
        err = np.array([r["err"] for r in rs])
        kw = dict(ls=STYLE[lib], color=COLOR[name], marker="o", ms=3, label=f"{lib} {name}")
        axes[0].loglog([r["time"] * 1e3 for r in rs], err, **kw)
        axes[1].loglog([r["fevals"] for r in rs], err, **kw)
    axes[0].set_xlabel("wall time per solve [ms] (warm, best of several)")
    axes[1].set_xlabel("function evaluations (diffrax: stages x steps + 2, estimated)")
    for ax in axes:
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("max-norm error at t1")
        ax.grid(True, which="major", alpha=0.3)
    axes[0].legend(fontsize=8)
    tols = sorted({r["tol"] for r in recs})
    fig.suptitle(f"Work-precision on {case.name} (t1 = {case.t1:.4g}), rtol = atol from "
                 f"{max(tols):g} to {min(tols):g}", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, f"work_precision_{case.name}")


def _ratio(recs, a, b, key) -> float:
    """Median over tolerances of ``a[key] / b[key]`` for two (lib, solver) pairs."""
    ra = {r["tol"]: r[key] for r in recs if (r["lib"], r["solver"]) == a}
    rb = {r["tol"]: r[key] for r in recs if (r["lib"], r["solver"]) == b}
    vals = [ra[t] / rb[t] for t in ra if t in rb and rb[t] and np.isfinite(ra[t] / rb[t])]
    return float(np.median(vals)) if vals else float("nan")


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    tols = (1e-4, 1e-7, 1e-10) if quick else tuple(10.0**-k for k in range(3, 12))
    dfx, why = try_import_diffrax()
    cases = (get_case("lotka_volterra"), get_case("kepler"))
    if quick:
        cases = cases[:1]
    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    if dfx is None:
        parts.append(f"**diffrax skipped:** {why}.\n")
    else:
        parts.append(f"diffrax {dfx.__version__}: `diffeqsolve(ODETerm(f), solver, t0, t1, "
                     "None, y0, saveat=SaveAt(t1=True), stepsize_controller=PIDController("
                     "rtol, atol))`, jitted. diffrax reports steps, not evaluations; its "
                     "evaluation counts are estimated as (new stages per step) x num_steps + "
                     "2. diffrax's `Dopri8` is the Prince-Dormand 8(7) pair with 14 stages, "
                     "simlib's and scipy's are DOP853 (8(5,3), 12 stages + FSAL): same "
                     "name, different method. diffrax's PIDController defaults to an "
                     "integral controller, simlib uses a PI controller (0.7/k, 0.4/k); all "
                     "three use the RMS norm of the error scaled by atol + rtol max(|y0|, "
                     "|y1|).\n")
    findings = []
    checks = Checks("work_precision")
    data = {}
    for case in cases:
        recs = _measure(case, tols, dfx)
        data[case.name] = recs
        fig_path = _figure(case, recs)
        parts.append(f"### {case.name}\n\n{case.description}\n")
        parts.append(f"![work-precision {case.name}]({fig_path})\n")
        pairs = sorted({(r["lib"], r["solver"]) for r in recs},
                       key=lambda p: (["simlib", "scipy", "diffrax"].index(p[0]), p[1]))
        key_tols = [t for t in tols if t in (1e-4, 1e-7, 1e-10)] or list(tols)

        def get(p, t, recs=recs):
            return next(r for r in recs if (r["lib"], r["solver"]) == p and r["tol"] == t)

        rows = []
        for p in pairs:
            row = [f"{p[0]} {p[1]}"]
            for t in key_tols:
                r = get(p, t)
                row.append(f"{fmt(r['err'])} / {fmt(r['time'] * 1e3)} ms / {r['fevals']}")
            rows.append(row)
        parts.append("Error at t1 / warm wall time / function evaluations, at equal "
                     "tolerance:\n")
        parts.append(md_table(["solver"] + [f"tol {t:g}" for t in key_tols], rows))
        comp = [f"{p[0]} {p[1]} {fmt(get(p, tols[0])['compile'])} s" for p in pairs
                if p[0] != "scipy"]
        parts.append(f"\nFirst-call (compile) time at tol 1e-6: {', '.join(comp)}.\n")
        parts.append("<details><summary>All tolerances</summary>\n")
        parts.append(md_table(
            ["solver", "tol", "error at t1", "time [ms]", "fevals", "steps", "ok"],
            [[f"{r['lib']} {r['solver']}", f"{r['tol']:g}", r["err"], r["time"] * 1e3,
              r["fevals"], r["steps"], r["ok"]] for r in recs]))
        parts.append("\n</details>\n")

        comparisons = [(("simlib", "Dopri5"), ("scipy", "RK45")),
                       (("simlib", "Dopri8"), ("scipy", "DOP853"))]
        if dfx is not None:
            comparisons += [(("simlib", n), ("diffrax", n)) for n in SIMLIB]
        items = []
        for a, b in comparisons:
            items.append(
                f"{a[0]} {a[1]} / {b[0]} {b[1]}: time x{fmt(_ratio(recs, a, b, 'time'))}, "
                f"error x{fmt(_ratio(recs, a, b, 'err'))}, "
                f"fevals x{fmt(_ratio(recs, a, b, 'fevals'))}")
        findings.append(f"Work-precision ({case.name}, medians over tolerances, equal "
                        "tolerance): " + "; ".join(items) + ".")
        failed = [r for r in recs if not r["ok"]]
        if failed:
            findings.append(f"Work-precision ({case.name}): failed runs: " + ", ".join(
                f"{r['lib']} {r['solver']} @ {r['tol']:g}" for r in failed) + ".")
        for r in recs:
            if r["lib"] == "simlib":
                checks.add(f"simlib {r['solver']} on {case.name} at tol {r['tol']:g}: "
                           "succeeds", "yes" if r["ok"] else "no", "yes", "run", r["ok"],
                           f"work_precision: simlib {r['solver']} on {case.name} at tol "
                           f"{r['tol']:g} failed", op="==")
    return Section(title="4. Work-precision: simlib vs scipy vs diffrax", body="\n".join(parts),
                   findings=findings, data=data, seconds=time.perf_counter() - start,
                   failures=checks.failures, checks=checks.checks)

