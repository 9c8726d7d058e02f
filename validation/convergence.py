"""Part 2: convergence orders of all 12 methods at fixed step.

Every method runs at ``dt = (t1 - t0) / N`` for ``N = 2^k`` and its max-norm error at
``t1`` is measured: on the Kepler problem (e = 0.6, two periods) against the closed
form, and on two problems without one against scipy DOP853 at rtol = atol = 1e-13:
the nonlinear pendulum (separable, so the symplectic methods apply) and
Lotka-Volterra (Runge-Kutta methods only). The measured order is the least-squares
slope of log(error) against log(dt) over the (up to) four smallest step sizes whose
error lies above a floor set by round-off and the reference accuracy.
"""

from __future__ import annotations

import time

import matplotlib.pyplot as plt
import numpy as np

from .common import (
    METHOD_STYLE,
    REF_TOL,
    RK_METHODS,
    SYMPLECTIC,
    THEORETICAL_ORDER,
    Case,
    Checks,
    Section,
    fit_order,
    fit_slope,
    fmt,
    get_case,
    kepler_case,
    make_solver,
    max_abs,
    md_table,
    reference,
    save_figure,
    scipy_solve,
    simlib_fixed_fn,
)

TOLERANCE = 0.3  # |measured - theoretical| above this is a finding
CEILING = 0.1  # errors above CEILING * max(1, |y(t1)|) are outside the asymptotic range


def _cases():
    """``(case, methods, reference kind, floor)`` of the study."""
    kepler = get_case("kepler")
    return (
        (kepler, RK_METHODS + SYMPLECTIC, "closed form", 1e-11),
        (get_case("pendulum"), RK_METHODS + SYMPLECTIC, "scipy DOP853 1e-13", 1e-12),
        (get_case("lotka_volterra"), RK_METHODS, "scipy DOP853 1e-13", 1e-12),
    )


def step_counts(name: str, quick: bool) -> list[int]:
    """``N = 2^k`` from 4 up to a bound that lets low orders reach their asymptotic range."""
    kmax = {1: 20, 2: 18, 3: 17, 4: 16}.get(THEORETICAL_ORDER[name], 14)
    return [2**k for k in range(2, kmax + 1)]


def _reference_at_t1(case: Case, ref_kind: str) -> np.ndarray:
    if ref_kind == "closed form":
        return case.exact(np.array([case.t1]))[0]
    return reference(case, [case.t1])[0]


def _errors(case: Case, name: str, ns, y_ref):
    run = simlib_fixed_fn(case, make_solver(name), max_steps=max(ns))
    dts = np.array([(case.t1 - case.t0) / n for n in ns])
    errs = []
    for dt in dts:
        y, result, _ = run(dt)
        errs.append(max_abs(y, y_ref) if result == 0 else float("nan"))
    return dts, np.array(errs)


def _reference_check(case: Case, ref_kind: str, y_ref) -> float:
    """An independent estimate of the reference error: scipy Radau at 1e-13 vs the reference."""
    if ref_kind == "closed form":
        return 0.0
    ys, _, _ = scipy_solve(case, "Radau", REF_TOL, REF_TOL)
    return max_abs(ys[-1], y_ref)


def _study(case: Case, methods, ref_kind: str, floor_rel: float, quick: bool):
    y_ref = _reference_at_t1(case, ref_kind)
    scale = max(1.0, float(np.max(np.abs(y_ref))))
    check = _reference_check(case, ref_kind, y_ref)
    floor, ceiling = max(floor_rel * scale, 10 * check), CEILING * scale
    out = {"_reference": dict(check=check, floor=floor, ceiling=ceiling)}
    for name in methods:
        dts, errs = _errors(case, name, step_counts(name, quick), y_ref)
        slope, used = fit_order(dts, errs, floor, ceiling)
        out[name] = dict(dts=dts, errs=errs, slope=slope, used=used, floor=floor,
                         ceiling=ceiling)
    return out


def _symplectic_euler_off_period(quick: bool) -> float:
    """Order of SemiImplicitEuler on Kepler e = 0.6 stopped at 1.5 periods (not a full one)."""
    case = kepler_case(0.6, 1.5)
    ns = [2**k for k in range(12, 19, 2)]
    dts, errs = _errors(case, "SemiImplicitEuler", ns, case.exact(np.array([case.t1]))[0])
    return fit_slope(dts, errs)


def _error_list(ns, errs) -> str:
    items = []
    for i, (n, e) in enumerate(zip(ns, errs, strict=True)):
        local = ""
        if i and np.isfinite(e) and np.isfinite(errs[i - 1]) and e > 0 and errs[i - 1] > 0:
            local = f" ({np.log2(errs[i - 1] / e):.2f})"
        items.append(f"{n}: {fmt(e)}{local}")
    return ", ".join(items)


def _figure(results, cases) -> str:
    fig, axes = plt.subplots(len(cases), 2, figsize=(11, 3.8 * len(cases)), squeeze=False)
    for row, (case, methods, ref_kind, _) in enumerate(cases):
        res = results[case.name]
        for col, group in enumerate((RK_METHODS, SYMPLECTIC)):
            ax = axes[row, col]
            names = [m for m in group if m in methods]
            if not names:
                ax.axis("off")
                continue
            for name in names:
                r = res[name]
                color, marker = METHOD_STYLE[name]
                ok = np.isfinite(r["errs"])
                ax.loglog(r["dts"][ok], r["errs"][ok], marker=marker, color=color, ms=4,
                          label=f"{name} ({fmt(r['slope'])})")
                if r["used"].any():  # reference slope through the fitted points
                    x = r["dts"][r["used"]]
                    anchor = np.exp(np.mean(np.log(r["errs"][r["used"]])))
                    xm = np.exp(np.mean(np.log(x)))
                    p = THEORETICAL_ORDER[name]
                    xs = np.array([x.min() / 2, x.max() * 2])
                    ax.loglog(xs, anchor * (xs / xm) ** p, color=color, ls=":", lw=1.2)
            ax.axhline(res[names[0]]["floor"], color="0.5", lw=0.7, ls="--")
            ax.set_xlabel("dt")
            ax.set_ylabel("max-norm error at t1")
            kind = "Runge-Kutta" if group is RK_METHODS else "symplectic"
            ax.set_title(f"{case.name} ({kind}; vs {ref_kind})", fontsize=10)
            ax.legend(fontsize=7, title="method (measured order)", title_fontsize=7)
            ax.set_ylim(bottom=min(1e-16, ax.get_ylim()[0]), top=min(1e3, ax.get_ylim()[1]))
    fig.suptitle("Convergence at fixed step; dotted: theoretical slope through the fitted "
                 "points; dashed grey: fit floor", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, "convergence")


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    cases = _cases()
    if quick:  # the closed-form problem only
        cases = cases[:1]
    results = {case.name: _study(case, methods, kind, floor, quick)
               for case, methods, kind, floor in cases}
    fig_path = _figure(results, cases)

    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    parts += [f"- `{c.name}` (t1 = {c.t1:.6g}, error vs {kind}, fit window {floor:g} to "
              f"{CEILING:g} x max(1, |y(t1)|)): {c.description}" for c, _, kind, floor in cases]
    parts.append("\nN = 4, 8, 16, ... (up to 2^20 for first-order, 2^18 for second-order, "
                 "2^17 for third-order, 2^16 for fourth-order and 2^14 for higher-order "
                 "methods); the runs use "
                 "simlib's traced-dt fixed-step path (one compilation per method).\n")
    rows = []
    findings = []
    higher = []
    checks = Checks("convergence")
    for name in RK_METHODS + SYMPLECTIC:
        theory = THEORETICAL_ORDER[name]
        row = [name, theory, make_solver(name).order]
        line = (f"Convergence: {name}.order = {make_solver(name).order}, but the "
                f"literature order is {theory}.")
        if not checks.add(f"{name}.order", make_solver(name).order, theory, "order",
                          make_solver(name).order == theory, _failure(line), op="=="):
            findings.append(line)
        verdicts = []
        for case, methods, _, _ in cases:
            if name not in methods:
                row.append("-")
                continue
            r = results[case.name][name]
            used = r["dts"][r["used"]]
            span = (f" (dt {fmt(used.min())}..{fmt(used.max())})" if used.size else "")
            row.append(f"{fmt(r['slope'])}{span}")
            diff = r["slope"] - theory
            detail = (f"errors {', '.join(fmt(e) for e in r['errs'][r['used']])} at dt "
                      f"{', '.join(fmt(d) for d in used)}")
            line = (f"Convergence: {name} on {case.name} measures order "
                    f"{fmt(r['slope'])}, below the theoretical {theory} ({detail}).")
            checks.add(f"{name} on {case.name}: measured order", r["slope"], theory - TOLERANCE,
                       "order", abs(diff) <= TOLERANCE or diff > TOLERANCE, _failure(line),
                       op=">=")
            if abs(diff) <= TOLERANCE:
                continue
            if diff > TOLERANCE:
                verdicts.append("higher")
                text = f"{name} on {case.name}: {fmt(r['slope'])} ({detail})"
                if name == "SemiImplicitEuler" and case.name == "kepler":
                    text += (
                        ". Explained: symplectic Euler is conjugate to Stormer-Verlet "
                        "(effective order 2; Hairer, Lubich and Wanner, GNI, VI.8) and t1 is "
                        "exactly two periods, where the orbit is back at y0 and the O(dt) "
                        "conjugacy terms cancel; stopped at 1.5 periods instead it measures "
                        f"order {fmt(_symplectic_euler_off_period(quick))}")
                higher.append(text)
            else:
                verdicts.append("**LOW**" if np.isfinite(r["slope"]) else "**no fit**")
                findings.append(line)
        verdict = ", ".join(sorted(set(verdicts), key=verdicts.index)) or "ok"
        rows.append(row + [verdict])
    parts.append(md_table(["method", "theory", "solver.order"]
                          + [f"measured: {c.name}" for c, *_ in cases] + ["verdict"], rows))
    parts.append(f"\nVerdict `ok`: every measured order within {TOLERANCE} of the theory; "
                 "`higher`: a measured order above the theory (the fit range is still "
                 "pre-asymptotic, or errors cancel at t1; not a defect of the method); "
                 "`LOW`: below the theory, which would point at a wrong coefficient.\n")
    refs = [(c.name, results[c.name]["_reference"]) for c, *_ in cases]
    parts.append("Fit windows and reference checks (scipy Radau at 1e-13 against the DOP853 "
                 "reference, as an independent estimate of its error):\n")
    parts.append(md_table(["problem", "|Radau - reference| at t1", "floor", "ceiling"],
                          [[n, r["check"] if r["check"] else "exact", r["floor"],
                            r["ceiling"]] for n, r in refs]))
    parts.append("")
    parts.append(f"![convergence]({fig_path})\n")
    for case, methods, kind, _ in cases:
        parts.append(f"<details><summary>Errors on {case.name} (vs {kind})</summary>\n")
        rows = [[m, _error_list(step_counts(m, quick), results[case.name][m]["errs"])]
                for m in methods]
        parts.append(md_table(["method", "N: error (local order from the previous N)"], rows))
        parts.append("\n</details>\n")
    if higher:
        findings.append("Convergence: measured orders above the theory (pre-asymptotic "
                        "range or cancellation at t1, not defects): " + "; ".join(higher) + ".")
    if not any("below the theoretical" in f for f in findings):
        findings.append("Convergence: no method measures an order below its theoretical one "
                        f"(by more than {TOLERANCE}) on any problem.")
    data = {c.name: {m: {k: np.asarray(v).tolist() if isinstance(v, np.ndarray) else v
                         for k, v in r.items()} for m, r in results[c.name].items()}
            for c, *_ in cases}
    return Section(title="2. Convergence orders", body="\n".join(parts), findings=findings,
                   data=data, seconds=time.perf_counter() - start, failures=checks.failures,
                   checks=checks.checks)


def _failure(finding: str) -> str:
    """The failure line of a finding: ``convergence: ...`` instead of ``Convergence: ...``."""
    return "convergence: " + finding.removeprefix("Convergence: ")
