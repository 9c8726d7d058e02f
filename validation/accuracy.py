"""Part 1: accuracy of every solver against scipy DOP853 (rtol = atol = 1e-13) and closed forms.

Adaptive solvers run at ``rtol = atol = tol``; their error is measured in units of
the requested tolerance, ``max_i |y_i - y_ref_i| / (tol + tol |y_ref_i|)``, at ``t1``
(``SaveAt(t1=True)``) and over 50 dense-output save times (``SaveAt(ts=...)``). scipy's
own RK23, RK45 and DOP853 at the same tolerances are measured the same way as a baseline.
Fixed-step solvers (and the symplectic ones on separable problems) report the
absolute max-norm error at ``t1`` for a few step counts.
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np

from .common import (
    ADAPTIVE,
    FIXED_ONLY,
    METHOD_STYLE,
    REF_TOL,
    SYMPLECTIC,
    Case,
    Checks,
    Section,
    accuracy_cases,
    dense_times,
    fmt,
    guarded,
    make_solver,
    max_abs,
    md_table,
    reference,
    save_figure,
    scipy_solve,
    simlib_fixed_fn,
    simlib_solve,
    tol_units,
)

SCIPY_BASELINES = ("RK23", "RK45", "DOP853")
# the scipy method each simlib solver is compared with: the same tableau where scipy has it
COUNTERPART = {"Bosh3": "RK23", "Heun": "RK23", "Tsit5": "RK45", "Dopri5": "RK45",
               "Dopri8": "DOP853"}
PROBLEM_NOTES = {  # why the global error of a problem outgrows the local tolerance
    "kepler": "Kepler: the global error is mostly a phase error that grows with every orbit "
              "and is multiplied by the speed (2 at t1, the perihelion), while the component "
              "q_y = 0 there is measured against atol alone.",
    "arenstorf": "Arenstorf: errors made during the close lunar approaches are amplified by "
                 "orders of magnitude along the rest of the orbit.",
    "lorenz": "Lorenz is chaotic: errors grow like exp(lambda t).",
    "double_pendulum": "The double pendulum is chaotic as well.",
    "lotka_volterra": "Lotka-Volterra: the populations swing over two orders of magnitude "
                      "with steep rises, where a small phase error is a large state error.",
}
SCIPY_STYLE = {"scipy RK23": ("0.75", "+"), "scipy RK45": ("0.45", "x"),
               "scipy DOP853": ("0.1", "1")}
MAX_STEPS = 5_000_000  # Heun at 1e-10 needs about 2e6 steps on the longer problems
FLAG = 10.0  # errors above this many tolerance units are findings
FAIL_RATIO = 30.0  # fail: above FLAG and this many times the scipy counterpart's error
QUICK_CASES = ("harmonic_oscillator", "kepler")


def _adaptive_rows(case: Case, tols, ts, ref_dense, ref_t1, ex_dense, ex_t1):
    """Errors of the simlib adaptive solvers and the scipy baselines on one case."""
    out = []
    for name in ADAPTIVE + tuple(f"scipy {m}" for m in SCIPY_BASELINES):
        for tol in tols:
            rec = dict(case=case.name, solver=name, tol=tol)
            if name.startswith("scipy"):
                ys, nfev, ok = scipy_solve(case, name.split()[1], tol, tol,
                                           t_eval=np.append(ts, case.t1))
                if not ok:  # scipy stopped early: ys does not cover every save time
                    ys = np.full((len(ts) + 1, case.dim), np.nan)
                y_dense, y_t1 = ys[:-1], ys[-1]
                rec.update(fevals=nfev, ok=ok, result=0 if ok else -1)
            else:
                solver = make_solver(name)
                nan = np.full((len(ts), case.dim), np.nan)
                out1, err1 = guarded(lambda s=solver, t=tol: simlib_solve(
                    case, s, rtol=t, atol=t, max_steps=MAX_STEPS))
                outd, errd = guarded(lambda s=solver, t=tol: simlib_solve(
                    case, s, rtol=t, atol=t, ts=ts, max_steps=MAX_STEPS))
                y_t1 = nan[0] if out1 is None else out1[0][-1]
                y_dense = nan if outd is None else outd[0]
                codes = [int(o[1].result) for o in (out1, outd) if o is not None]
                result = max(codes + [0]) if err1 is None and errd is None else -2
                stats = {} if out1 is None else out1[1].stats
                rec.update(fevals=int(stats.get("num_fevals", -1)),
                           steps=int(stats.get("num_steps", -1)),
                           rejected=int(stats.get("num_rejected", -1)), ok=result == 0,
                           result=result, error="; ".join(
                               f"{m}: {e}" for m, e in (("t1", err1), ("ts", errd)) if e))
            rec["t1"] = tol_units(y_t1, ref_t1, tol, tol)
            rec["dense"] = tol_units(y_dense, ref_dense, tol, tol)
            if ex_t1 is not None:
                rec["t1_exact"] = tol_units(y_t1, ex_t1, tol, tol)
                rec["dense_exact"] = tol_units(y_dense, ex_dense, tol, tol)
            out.append(rec)
    return out


def _fixed_rows(case: Case, steps, ref_t1, ex_t1):
    names = FIXED_ONLY + (SYMPLECTIC if case.separable else ())
    out = []
    for name in names:
        run = simlib_fixed_fn(case, make_solver(name), max_steps=max(steps))
        for n in steps:
            dt = (case.t1 - case.t0) / n
            y, result, nfev = run(dt)
            rec = dict(case=case.name, solver=name, n=n, dt=dt, result=result, fevals=nfev,
                       err=max_abs(y, ref_t1) if result == 0 else float("nan"))
            if ex_t1 is not None:
                rec["err_exact"] = max_abs(y, ex_t1) if result == 0 else float("nan")
            out.append(rec)
    return out


def _cell(rec, a="t1", b="dense") -> str:
    text = f"{fmt(rec[a])} / {fmt(rec[b])}"
    if max(rec[a], rec[b]) > FLAG or not np.isfinite(max(rec[a], rec[b])):
        text = f"**{text}**"
    return text


def _figure(cases, records, tols) -> str:
    n = len(cases)
    cols = 3
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax, case in zip(axes.ravel(), cases, strict=False):
        for name in ADAPTIVE + tuple(f"scipy {m}" for m in SCIPY_BASELINES):
            recs = [r for r in records if r["case"] == case.name and r["solver"] == name]
            color, marker = SCIPY_STYLE.get(name) or METHOD_STYLE[name]
            x = [r["tol"] for r in recs]
            ax.loglog(x, [r["t1"] for r in recs], color=color, marker=marker, label=name)
            ax.loglog(x, [r["dense"] for r in recs], color=color, marker=marker, ls=":",
                      alpha=0.8)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(FLAG, color="r", lw=0.8, ls="--")
        ax.set_title(case.name, fontsize=10)
        ax.set_xlabel("rtol = atol")
        ax.set_ylabel("error / tolerance")
        ax.invert_xaxis()
    for ax in axes.ravel()[n:]:
        ax.axis("off")
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.suptitle("Error in units of the requested tolerance (solid: at t1, dotted: 50 dense "
                 "save times); black line = 1, red dashed = 10", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, "accuracy_tolerance_units")


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    tols = (1e-4, 1e-8) if quick else (1e-4, 1e-6, 1e-8, 1e-10)
    steps = (100, 1000) if quick else (100, 1000, 10000)
    cases = accuracy_cases()
    if quick:
        cases = tuple(c for c in cases if c.name in QUICK_CASES)
    records, fixed, refq = [], [], []
    for case in cases:
        ts = dense_times(case)
        ref_all = reference(case, np.append(ts, case.t1))
        ref_dense, ref_t1 = ref_all[:-1], ref_all[-1]
        ex_dense = ex_t1 = None
        q = dict(case=case.name, exact=None, note="")
        if case.exact is not None:
            ex_all = case.exact(np.append(ts, case.t1))
            ex_dense, ex_t1 = ex_all[:-1], ex_all[-1]
            q["exact"] = max_abs(ref_all, ex_all)
        if case.name == "arenstorf":
            q["note"] = ("periodic orbit: |y_ref(T) - y0| = "
                         f"{fmt(max_abs(ref_t1, case.y0))}")
        refq.append(q)
        records += _adaptive_rows(case, tols, ts, ref_dense, ref_t1, ex_dense, ex_t1)
        fixed += _fixed_rows(case, steps, ref_t1, ex_t1)

    fig_path = _figure(cases, records, tols)
    solvers = ADAPTIVE + tuple(f"scipy {m}" for m in SCIPY_BASELINES)

    def rec(case, solver, tol):
        return next(r for r in records
                    if r["case"] == case and r["solver"] == solver and r["tol"] == tol)

    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    parts.append("Problems:\n")
    parts += [f"- `{c.name}` (t1 = {c.t1:.6g}): {c.description}" for c in cases]
    parts.append("")
    parts.append(f"### Reference quality\n\nscipy DOP853 at rtol = atol = {REF_TOL:g}, "
                 "integrated piecewise between save times, against the closed forms "
                 "(max-norm over the 50 save times and t1):\n")
    parts.append(md_table(["problem", "|reference - closed form|", "note"],
                          [[q["case"], q["exact"], q["note"]] for q in refq
                           if q["exact"] is not None or q["note"]]))
    parts.append("")
    # summary: worst over tolerances
    parts.append("### Summary: worst error over all tolerances, in tolerance units "
                 "(max of t1 and dense)\n")
    rows = []
    for s in solvers:
        row = [s]
        for c in cases:
            vals = [max(rec(c.name, s, t)["t1"], rec(c.name, s, t)["dense"]) for t in tols]
            worst = float("nan") if np.any(np.isnan(vals)) else max(vals)
            row.append(f"**{fmt(worst)}**" if not worst <= FLAG else fmt(worst))
        rows.append(row)
    parts.append(md_table(["solver"] + [c.name for c in cases], rows))
    parts.append(f"\nBold: above {FLAG:g} tolerance units (or a failed run).\n")
    parts.append(f"![error in tolerance units]({fig_path})\n")
    parts.append("### Per problem: error at t1 / over the dense save times (tolerance units), "
                 "and function evaluations of the t1 run\n")
    for c in cases:
        parts.append(f"**{c.name}**\n")
        rows = []
        for s in solvers:
            rows.append([s] + [f"{_cell(rec(c.name, s, t))} ({rec(c.name, s, t)['fevals']})"
                               for t in tols])
        parts.append(md_table(["solver"] + [f"tol {t:g}" for t in tols], rows))
        if c.exact is not None:
            parts.append("\nAgainst the closed form instead of the reference:\n")
            rows = [[s] + [_cell(rec(c.name, s, t), "t1_exact", "dense_exact") for t in tols]
                    for s in solvers]
            parts.append(md_table(["solver"] + [f"tol {t:g}" for t in tols], rows))
        parts.append("")

    parts.append("### Fixed step: absolute max-norm error at t1 against the reference\n")
    parts.append("dt = (t1 - t0) / N. Symplectic solvers on the separable problems only. "
                 "`fail` = the state became non-finite.\n")
    fixed_names = sorted({(r["case"], r["solver"]) for r in fixed},
                         key=lambda k: ([c.name for c in cases].index(k[0]),
                                        (FIXED_ONLY + SYMPLECTIC).index(k[1])))
    rows = []
    for cname, s in fixed_names:
        rs = [r for r in fixed if r["case"] == cname and r["solver"] == s]
        rows.append([cname, s] + [r["err"] for r in rs])
    parts.append(md_table(["problem", "method"] + [f"N = {n}" for n in steps], rows))
    exact_rows = [[cname, s] + [r["err_exact"] for r in fixed
                                if r["case"] == cname and r["solver"] == s]
                  for cname, s in fixed_names if "err_exact" in next(
                      r for r in fixed if r["case"] == cname)]
    if exact_rows:
        parts.append("\nThe same runs against the closed forms:\n")
        parts.append(md_table(["problem", "method"] + [f"N = {n}" for n in steps], exact_rows))

    findings = _findings(cases, records, fixed, refq, tols)
    checks = _checks(records)
    return Section(
        title="1. Accuracy against scipy DOP853 and closed forms",
        body="\n".join(parts), findings=findings, failures=checks.failures,
        checks=checks.checks,
        data=dict(adaptive=records, fixed=fixed, reference=refq),
        seconds=time.perf_counter() - start,
    )


def _checks(records) -> Checks:
    """Checks: every simlib adaptive run must finish, and its error (at t1 and over the
    dense save times) must not be more than ``FLAG`` tolerance units off and ``FAIL_RATIO``
    times worse than its scipy counterpart at the same tolerance (a wrong coefficient, not
    the usual global-error growth, which scipy shares)."""
    out = Checks("accuracy")
    for r in records:
        if r["solver"] not in ADAPTIVE:
            continue
        tag = f"{r['solver']} on {r['case']} at tol {r['tol']:g}"
        if not r["ok"]:
            out.add(f"{tag}: finishes", r.get("error") or f"result {r.get('result')}",
                    "finished", "run", False,
                    f"accuracy: {r['solver']} on {r['case']} at tol {r['tol']:g} "
                    f"{'raised ' + r['error'] if r.get('error') else 'did not finish'}",
                    op="")
            continue
        twin = next(x for x in records if x["case"] == r["case"] and x["tol"] == r["tol"]
                    and x["solver"] == f"scipy {COUNTERPART[r['solver']]}")
        for key in ("t1", "dense"):
            mine, theirs = r[key], twin[key]
            # fails when above both FLAG and FAIL_RATIO x scipy's (never past a nan scipy)
            bound = max(FLAG, FAIL_RATIO * theirs) if np.isfinite(theirs) else np.inf
            failed = not np.isfinite(mine) or (mine > FLAG and mine > FAIL_RATIO * theirs)
            out.add(f"{tag}: {key} error", mine, bound, "tol units",
                    not failed,
                    f"accuracy: {r['solver']} {key} error on {r['case']} at tol "
                    f"{r['tol']:g} is {fmt(mine)} tolerance units, scipy "
                    f"{COUNTERPART[r['solver']]} {fmt(theirs)}")
    return out


def _geomean(x) -> float:
    x = np.asarray([v for v in x if np.isfinite(v) and v > 0])
    return float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")


def _findings(cases, records, fixed, refq, tols) -> list[str]:
    out = []
    raised = {}
    for r in records:
        if r["ok"]:
            continue
        if r.get("error"):
            raised.setdefault(r["error"], []).append(f"{r['solver']}/{r['case']}@{r['tol']:g}")
        else:
            out.append(f"Accuracy: {r['solver']} on {r['case']} at tol {r['tol']:g} did not "
                       f"finish (result code {r['result']}).")
    for msg, where in raised.items():
        out.append(f"Accuracy: **simlib raised** `{msg}` in {len(where)} runs "
                   f"({', '.join(where[:6])}{', ...' if len(where) > 6 else ''}); those "
                   "cells read `fail`.")

    def worst(r):
        return max(r["t1"], r["dense"])

    mine = [r for r in records if r["solver"] in ADAPTIVE and np.isfinite(worst(r))]
    theirs = [r for r in records if r["solver"].startswith("scipy") and np.isfinite(worst(r))]

    def count(rs, key):
        return sum(1 for r in rs if key(r) > FLAG)

    per_case = []
    for c in cases:
        m = [worst(r) for r in mine if r["case"] == c.name]
        t = [worst(r) for r in theirs if r["case"] == c.name]
        if m and t and max(max(m), max(t)) > FLAG:
            per_case.append(f"{c.name} {fmt(max(m))} ({fmt(max(t))})")
    notes = [PROBLEM_NOTES[c.name] for c in cases if PROBLEM_NOTES.get(c.name)
             and any(worst(r) > FLAG for r in mine if r["case"] == c.name)]
    n_t1, n_dense = count(mine, lambda r: r["t1"]), count(mine, lambda r: r["dense"])
    s_t1, s_dense = count(theirs, lambda r: r["t1"]), count(theirs, lambda r: r["dense"])
    out.append(
        "Accuracy: rtol/atol bound the local error of each step, not the global error. Runs "
        f"more than {FLAG:g} tolerance units off: simlib {count(mine, worst)} of {len(mine)} "
        f"({n_t1} at t1, {n_dense} over the dense save times), scipy {count(theirs, worst)} "
        f"of {len(theirs)} ({s_t1} at t1, {s_dense} dense). Worst simlib (scipy) value per "
        "problem where either exceeds it: " + ", ".join(per_case) + ". "
        + " ".join(notes))

    def twin(r):
        name = f"scipy {COUNTERPART[r['solver']]}"
        return next(x for x in records if x["case"] == r["case"] and x["tol"] == r["tol"]
                    and x["solver"] == name)

    ratios, outliers = [], []
    for name in ADAPTIVE:
        rs = [r for r in mine if r["solver"] == name]
        rt = [r["t1"] / max(twin(r)["t1"], 1e-300) for r in rs]
        rd = [r["dense"] / max(twin(r)["dense"], 1e-300) for r in rs]
        ratios.append(f"{name}/{COUNTERPART[name]} {fmt(_geomean(rt))} at t1, "
                      f"{fmt(_geomean(rd))} dense")
        for r in rs:
            for key in ("t1", "dense"):
                if r[key] > FLAG and r[key] > 3 * twin(r)[key]:
                    typical = np.median([twin(x)[key] for x in rs if x["case"] == r["case"]])
                    outliers.append(f"{name} {key} on {r['case']} @ {r['tol']:g}: "
                                    f"{fmt(r[key])} vs {COUNTERPART[name]} {fmt(twin(r)[key])} "
                                    f"({COUNTERPART[name]}'s median over the tolerances on "
                                    f"this problem: {fmt(typical)})")
    out.append("Accuracy: simlib error / error of the scipy counterpart at the same tolerance "
               "(geometric mean over problems and tolerances; same tableau for Bosh3/RK23, "
               "Dopri5/RK45, Dopri8/DOP853, closest scipy method for Tsit5 and Heun): "
               + "; ".join(ratios) + ".")
    if outliers:
        out.append(f"Accuracy: runs above {FLAG:g} tolerance units and more than 3x worse than "
                   f"the scipy counterpart ({len(outliers)}): " + "; ".join(outliers) + ".")
    else:
        out.append(f"Accuracy: no simlib run is both above {FLAG:g} tolerance units and more "
                   "than 3x worse than its scipy counterpart.")
    for a, b in (("Dopri5", "scipy RK45"), ("Dopri8", "scipy DOP853"), ("Bosh3", "scipy RK23")):
        ra = [r for r in records if r["solver"] == a]
        rb = [r for r in records if r["solver"] == b]
        fev_ratio = _geomean([x["fevals"] / y["fevals"] for x, y in zip(ra, rb, strict=True)])
        out.append(f"Accuracy: simlib {a} uses {fmt(fev_ratio)}x the function evaluations of "
                   f"{b} (geometric mean over the t1 runs).")
    for q in refq:
        if q["exact"] is not None and q["exact"] > 1e-10:
            out.append(f"Accuracy: the scipy reference for {q['case']} is off the closed form "
                       f"by {fmt(q['exact'])}, which limits the tight-tolerance rows.")
    nonfinite = [r for r in fixed if r["result"] != 0]
    if nonfinite:
        out.append("Accuracy (fixed step): non-finite or failed runs: " + ", ".join(
            f"{r['solver']} on {r['case']} N={r['n']}" for r in nonfinite) + ".")
    return out
