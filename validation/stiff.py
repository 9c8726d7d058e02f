"""Part 7: stiff problems against the published reference values.

Robertson's kinetics to t = 1e11, Van der Pol with mu = 1000 and the Oregonator
(:mod:`validation.stiff_reference`), solved by every stiff solver simlib has (those of
``STIFF_CANDIDATES`` present in ``simlib``), at rtol from 1e-4 to 1e-10 with
``atol = rtol * (atol/rtol of the problem)``. The error at t1 is measured in tolerance
units, ``max_i |y_i - ref_i| / (atol + rtol |ref_i|)``, against the values published with
the Bari test set (Mazzia and Magherini, release 2.4, 2008), themselves cross-checked here
against scipy ``Radau`` at rtol 1e-12. The targets of issue 9: within 10 tolerance units,
and at most twice the steps of scipy ``Radau`` (exact Jacobian) at the same tolerances
(accepted steps on both sides; simlib's rejected steps are listed apart).
A miss fails the suite unless ``KNOWN_MISSES`` names the solver with its reason; known
misses are listed in the report. Work-precision (full run only): error against warm wall
time for simlib, scipy ``Radau``/``BDF``/``LSODA`` (NumPy right-hand side and Jacobian)
and diffrax ``Kvaerno5`` (``PIDController(pcoeff=0.3, icoeff=0.3)``), jitted with traced
tolerances so one compilation serves every tolerance.

E5 (Enright, Hull and Lindberg's pyrolysis problem to t = 1e13, Bari ``e5``) is scored
apart: on ``y2 + y3`` against the published value and on the drift of its linear invariant
``y2 - y3 - y4 = 0`` (its subsection says why), for every stiff solver at rtol 1e-5 to
1e-8 with ``atol = rtol * 1e-24`` (``--quick``: Rodas5P and Rodas5 at 1e-6), next to
scipy ``Radau`` and ``BDF`` at rtol 1e-8 and 1e-10 (full run).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import simlib as sl

from .common import (
    Checks,
    Section,
    best_time,
    block,
    fmt,
    guarded,
    md_table,
    save_figure,
    try_import_diffrax,
)
from .stiff_reference import (
    ALL_PROBLEMS,
    E5,
    PROBLEMS,
    e5_invariant,
    e5_sum_error,
    e5_sum_error_of_drift,
    published,
    scipy_reference,
    scipy_run,
    tol_units,
)

STIFF_CANDIDATES = ("Rosenbrock23", "Rodas5P", "Rodas5", "Kvaerno3", "Kvaerno5", "BDF")
RTOLS = (1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)
QUICK_RTOLS = (1e-6,)
QUICK_PROBLEMS = ("robertson", "van_der_pol")  # --quick: compile time dominates, < 30 s
WP_RTOLS = (1e-4, 1e-6, 1e-8, 1e-10)  # work-precision points (scipy is slow at 1e-10)
MAX_STEPS = 200_000
TARGET_UNITS = 10.0  # issue 9: within 10x the requested tolerance
TARGET_STEPS = 2.0  # issue 9: at most twice scipy Radau's steps

# Solvers whose misses of the two targets are expected, with the reason. Their misses are
# reported (not failed); they must still succeed at rtol >= 1e-8 and, in the full run,
# their error must fall with rtol at a rate of at least rtol^0.5.
KNOWN_MISSES = {
    "Rosenbrock23": "order 2 (Shampine and Reichelt's ode23s pair): under error-per-step "
    "control its global error scales like rtol^(2/3), i.e. grows like rtol^(-1/3) in "
    "tolerance units, and its step count grows like rtol^(-1/3) against Radau's "
    "rtol^(-1/6) or less; it is the method for loose tolerances (tests/test_stiff.py, "
    "MISSES_TARGET)",
    "Kvaerno3": "order 3 (Kvaerno's ESDIRK 3(2)): within 10 tolerances, but its step count "
    "grows like rtol^(-1/3) against Radau's order-5 rtol^(-1/6), so it takes 3x Radau's "
    "steps at rtol 1e-4 and 10x at 1e-10; it is the ESDIRK for loose tolerances",
    "BDF": "a variable-order (1-5) multistep method whose global error, as scipy's BDF's, "
    "accumulates over many steps at low order: checked instead against scipy's BDF at the "
    "same rtol (PEER_CHECKS): error at most 3x scipy BDF's (or within 10 tolerances) and at "
    "most 1.5x its accepted steps",
}

# Known solvers held to a peer instead: (scipy method, error factor, steps factor).
PEER_CHECKS = {"BDF": ("BDF", 3.0, 1.5)}


def stiff_solvers() -> list[str]:
    """The stiff solvers this simlib has, in the order of ``STIFF_CANDIDATES``."""
    return [n for n in STIFF_CANDIDATES if hasattr(sl, n)]


@functools.cache
def _simlib_fn(solver: str, problem: str):
    p = ALL_PROBLEMS[problem]
    y0 = jnp.asarray(p.y0, jnp.float64)
    method = getattr(sl, solver)()

    @jax.jit
    def run(rtol, atol):
        sol = sl.solve(p.f, y0, 0.0, p.t1, solver=method, rtol=rtol, atol=atol, args=p.args,
                       max_steps=MAX_STEPS, throw=False)
        return sol.ys[-1], sol.result, sol.stats["num_accepted"], sol.stats["num_rejected"]

    return run


@functools.cache
def _diffrax_fn(problem: str):
    dfx, _ = try_import_diffrax()
    p = PROBLEMS[problem]
    y0 = jnp.asarray(p.y0, jnp.float64)

    @jax.jit
    def run(rtol, atol):
        sol = dfx.diffeqsolve(
            dfx.ODETerm(p.f), dfx.Kvaerno5(), 0.0, p.t1, None, y0, args=p.args,
            saveat=dfx.SaveAt(t1=True),
            stepsize_controller=dfx.PIDController(rtol=rtol, atol=atol, pcoeff=0.3,
                                                  icoeff=0.3),
            max_steps=MAX_STEPS, throw=False)
        return (sol.ys[-1], sol.result == dfx.RESULTS.successful,
                sol.stats["num_accepted_steps"])

    return run


def _accuracy(solvers, rtols, problems):
    """``(records, errors)``: one record per (solver, problem, rtol) with the error, steps,
    Radau's steps and the compile time; one line per (solver, problem) that raised."""
    recs, errors = [], []
    for name in solvers:
        for prob in problems:
            p = PROBLEMS[prob]
            t = time.perf_counter()
            _, why = guarded(lambda name=name, prob=prob, p=p: block(
                _simlib_fn(name, prob)(rtols[0], rtols[0] * p.atol_per_rtol)))
            compile_s = time.perf_counter() - t
            if why is not None:  # reported as a failed check; the other solvers still run
                errors.append(f"stiff: {name} on {prob} raised {why}")
                continue
            fn = _simlib_fn(name, prob)
            for rtol in rtols:
                atol = rtol * p.atol_per_rtol
                t = time.perf_counter()
                y, res, steps, rej = block(fn(rtol, atol))
                secs = time.perf_counter() - t
                y_radau, radau_steps, _ = _scipy(prob, "Radau", rtol)
                recs.append(dict(
                    solver=name, problem=prob, rtol=rtol, atol=atol, result=int(res),
                    steps=int(steps), rejected=int(rej), seconds=secs, compile=compile_s,
                    err=tol_units(np.asarray(y), published(prob), rtol, atol),
                    radau_steps=radau_steps,
                    radau_err=tol_units(y_radau, published(prob), rtol, atol)))
                if name in PEER_CHECKS:
                    y_peer, peer_steps, _ = _scipy(prob, PEER_CHECKS[name][0], rtol)
                    recs[-1].update(peer_steps=peer_steps, peer_err=tol_units(
                        y_peer, published(prob), rtol, atol))
    return recs, errors


@functools.cache
def _scipy(problem: str, method: str, rtol: float):
    return scipy_run(problem, method, rtol)


def _checks(recs, full: bool, checks: Checks) -> list[str]:
    """Record the checks of the runs in ``checks``; returns the lines of the known misses.

    Targets (issue 9): error <= TARGET_UNITS tolerance units and steps <= TARGET_STEPS x
    scipy Radau's. A miss fails, except for the ``KNOWN_MISSES`` solvers (reported; they
    must still succeed at rtol >= 1e-8, and those in ``PEER_CHECKS`` are held to scipy's
    same method instead).
    """
    known = []
    for r in recs:
        tag = f"{r['solver']} on {r['problem']} at rtol {r['rtol']:g}"
        misses = []
        if r["result"] != 0:
            misses.append(f"result code {r['result']} after {r['steps']} accepted steps")
        elif not r["err"] <= TARGET_UNITS:
            misses.append(f"error {fmt(r['err'])} tolerance units (target {TARGET_UNITS:g})")
        if r["result"] == 0 and r["steps"] > TARGET_STEPS * r["radau_steps"]:
            misses.append(f"{r['steps']} steps = {r['steps'] / r['radau_steps']:.1f}x Radau's "
                          f"{r['radau_steps']} (target {TARGET_STEPS:g}x)")
        is_known = r["solver"] in KNOWN_MISSES
        general = f"stiff: {tag}: " + "; ".join(misses)  # the failure line of other solvers
        note = "known miss, reported" if is_known else ""
        if r["result"] != 0:
            must = not is_known or r["rtol"] >= 1e-8
            checks.add(f"{tag}: result code", r["result"], 0, "code", not must,
                       general if not is_known else
                       f"stiff: {tag} failed (result {r['result']}), known solvers "
                       "must still succeed at rtol >= 1e-8", op="==", note=note)
            if is_known:
                known.append(f"{tag}: " + "; ".join(misses))
            continue
        ratio = r["steps"] / r["radau_steps"]
        if r["solver"] in PEER_CHECKS:
            method, err_factor, steps_factor = PEER_CHECKS[r["solver"]]
            ok_err = not misses or r["err"] <= max(TARGET_UNITS, err_factor * r["peer_err"])
            ok_steps = not misses or r["steps"] <= steps_factor * r["peer_steps"]
            within = "" if misses else "targets met"
            checks.add(f"{tag}: error (<= {err_factor:g}x scipy {method}'s or target)",
                       r["err"], max(TARGET_UNITS, err_factor * r["peer_err"]), "tol units",
                       ok_err, f"stiff: {tag}: error {fmt(r['err'])} tolerance units, more "
                       f"than {err_factor:g}x scipy {method}'s {fmt(r['peer_err'])}",
                       note=within)
            checks.add(f"{tag}: steps (<= {steps_factor:g}x scipy {method}'s)", r["steps"],
                       steps_factor * r["peer_steps"], "steps", ok_steps,
                       f"stiff: {tag}: {r['steps']} steps, more than {steps_factor:g}x scipy "
                       f"{method}'s {r['peer_steps']}", note=within)
            misses.append(f"scipy {method}: error {fmt(r['peer_err'])}, "
                          f"{r['peer_steps']} steps")
        else:
            missed_err = not r["err"] <= TARGET_UNITS
            missed_steps = r["steps"] > TARGET_STEPS * r["radau_steps"]
            checks.add(f"{tag}: error", r["err"], TARGET_UNITS, "tol units",
                       is_known or not missed_err, general,
                       note=note if missed_err else "")
            checks.add(f"{tag}: steps / Radau's", ratio, TARGET_STEPS, "x Radau",
                       is_known or not missed_steps, general,
                       note=note if missed_steps else "")
        if misses and is_known:
            known.append(f"{tag}: " + "; ".join(misses))
    if full:  # known solvers: the error must still fall with rtol
        for name in {r["solver"] for r in recs} & set(KNOWN_MISSES):
            for prob in dict.fromkeys(r["problem"] for r in recs):
                rs = [r for r in recs if (r["solver"], r["problem"]) == (name, prob)
                      and r["result"] == 0 and np.isfinite(r["err"])]
                if not checks.add(f"{name} on {prob}: successful runs", len(rs), 3, "runs",
                                  len(rs) >= 3, f"stiff: {name} on {prob}: fewer than 3 "
                                  "successful runs", op=">="):
                    continue
                slope = np.polyfit(np.log([r["rtol"] for r in rs]),
                                   np.log([r["err"] * r["rtol"] for r in rs]), 1)[0]
                checks.add(f"{name} on {prob}: error ~ rtol^p", float(slope), 0.5, "p",
                           not slope < 0.5, f"stiff: {name} on {prob}: error falls like "
                           f"rtol^{slope:.2f} (at least rtol^0.5 expected)", op=">=")
    return known


E5_RTOLS = (1e-5, 1e-6, 1e-7, 1e-8)
# y2 + y3 within TARGET_UNITS needs |d| <= 9.7e-25 (rtol / 1e-6)^(1/2), and the rounding of
# every solver measured (scipy's included) leaves |d| between 1e-26 and 1e-24: below
# rtol 1e-6 the target asks float64 for what no method gives, so those rows are reported
E5_CHECKED_RTOL = 1e-6
QUICK_E5 = (("Rodas5P", "Rodas5"), (1e-6,))  # --quick: the setting, the two Rodas
E5_PEERS = (("Radau", 1e-8), ("BDF", 1e-8), ("Radau", 1e-10), ("BDF", 1e-10))

# Solvers whose E5 misses of the y2 + y3 target are expected, with the reason.
E5_KNOWN_MISSES = {
    "Rodas5P": "its stage arguments sit far off E5's slow manifold (the fast components of "
    "its stage right-hand sides reach 1e3-1e4 times the on-manifold flux), and their "
    "float64 rounding moves the invariant y2 - y3 - y4 by ~1e-25 per step at t ~ 1e4: "
    "a drift of 5e-24 to 9e-24 at rtol 1e-6 (4e-21 before the stage solves were refined; "
    "the figure varies with how XLA compiles the step), which costs y2 + y3 its "
    "(C M d t1)^2 / 12 = 2e-4 to 9e-4. The same steps with exact "
    "(mpmath) linear solves drift by 2.1e-24 (45 tolerances): a floor of the method in "
    "float64, which falls with rtol (3e-25 at 1e-8)",
    "Rosenbrock23": KNOWN_MISSES["Rosenbrock23"],
}


def _e5_runs(solvers, rtols):
    """One record per (solver, rtol) on E5: the state at ``t1``, the drift of the
    invariant, the error of ``y2 + y3`` (relative and in tolerance units), that of ``y1`` and
    ``y4`` (against ``atol``) and the steps next to scipy ``Radau``'s."""
    recs, errors = [], []
    for name in solvers:
        fn = _simlib_fn(name, "e5")
        for rtol in rtols:
            atol = rtol * E5.atol_per_rtol
            out, why = guarded(lambda fn=fn, rtol=rtol, atol=atol: block(fn(rtol, atol)))
            if why is not None:
                errors.append(f"stiff: {name} on e5 raised {why}")
                break
            y, res, steps, rej = out
            y = np.asarray(y)
            ref = published("e5")
            total = ref[1] + ref[2]
            err = e5_sum_error(y)
            drift = e5_invariant(y)
            recs.append(dict(
                solver=name, rtol=rtol, atol=atol, result=int(res), steps=int(steps),
                rejected=int(rej), y=y, drift=drift, sum_err=err,
                sum_units=err * total / (atol + rtol * total),
                explained_units=e5_sum_error_of_drift(drift) * total / (atol + rtol * total),
                y14_units=tol_units(y[[0, 3]], ref[[0, 3]], rtol, atol),
                digits=[float(-np.log10(max(abs(y[i] - ref[i]) / ref[i], 1e-17)))
                        for i in (1, 2)],
                radau_steps=_scipy("e5", "Radau", rtol)[1]))
    return recs, errors


def _e5_checks(recs, checks: Checks) -> list[str]:
    """The E5 checks: success, ``y2 + y3`` within ``TARGET_UNITS`` of the published sum at
    ``rtol >= E5_CHECKED_RTOL`` (``E5_KNOWN_MISSES`` reported), ``y1`` and ``y4`` within
    ``TARGET_UNITS`` of ``atol``. Returns the lines of the known misses."""
    known = []
    for r in recs:
        tag = f"{r['solver']} on e5 at rtol {r['rtol']:g}"
        if not checks.add(f"{tag}: result code", r["result"], 0, "code", r["result"] == 0,
                          f"stiff: {tag} failed (result {r['result']})", op="=="):
            continue
        checks.add(f"{tag}: y1, y4 error", r["y14_units"], TARGET_UNITS, "tol units",
                   r["y14_units"] <= TARGET_UNITS,
                   f"stiff: {tag}: y1 or y4 {fmt(r['y14_units'])} tolerance units off")
        if r["rtol"] < E5_CHECKED_RTOL:
            continue
        is_known = r["solver"] in E5_KNOWN_MISSES
        missed = not r["sum_units"] <= TARGET_UNITS
        checks.add(f"{tag}: y2 + y3 error", r["sum_units"], TARGET_UNITS, "tol units",
                   is_known or not missed, f"stiff: {tag}: y2 + y3 {fmt(r['sum_units'])} "
                   f"tolerance units from the published value (drift of y2 - y3 - y4 "
                   f"{r['drift']:.1e})", note="known miss, reported" if missed and is_known
                   else "")
        if missed and is_known:
            known.append(f"{tag}: y2 + y3 {fmt(r['sum_units'])} tolerance units, drift "
                         f"{r['drift']:.1e}")
    return known


def _e5_peers():
    """scipy at tight tolerances on E5: ``(method, rtol, y(t1), steps)``."""
    return [(m, r, *scipy_run("e5", m, r)[:2]) for m, r in E5_PEERS]


def _e5_section(solvers, quick: bool, checks: Checks) -> tuple[list[str], list[dict]]:
    """The markdown of the E5 subsection and its records (checks recorded in ``checks``)."""
    names, rtols = QUICK_E5 if quick else (solvers, E5_RTOLS)
    names = [n for n in names if n in solvers]
    recs, raised = _e5_runs(names, rtols)
    for line in raised:
        checks.add(line.removeprefix("stiff: ").split(" raised ")[0] + ": runs",
                   line.split(" raised ", 1)[1], "no exception", "run", False, line, op="")
    ref = published("e5")
    parts = ["### E5: a linear invariant at the rounding level\n",
             "Enright, Hull and Lindberg's pyrolysis problem (Bari `e5`, written as `e5.f` "
             "writes it, `f3 = f2 - f4`) to `t1 = 1e13` with `atol = rtol * 1e-24` (1e-30 at "
             "rtol 1e-6). `y2 - y3 - y4 = 0` holds exactly for the equations and every step "
             "of every method here; after `t ~ 1e5` `y2` and `y3` decay together like "
             "`1 / (C M t)` and any drift `d` stays as `y2 - y3 = d`, so by `t1`, where "
             "`y2 ~ y3 ~ 9e-23`, a drift of 1e-24 costs each of them 1%, and `y2 + y3` "
             "`(C M d t1)^2 / 12` relative. The published values carry their own "
             f"`y2 - y3 = {ref[1] - ref[2]:.3e}` (the invariant and `y4(t1) ~ 0` make "
             "`y2(t1) = y3(t1)`): their `y2` and `y3` alone are good to about 7e-4 "
             "(3.1 digits), and `y2 + y3` (which that drift moves by 2e-7) is checked, at "
             f"rtol >= {E5_CHECKED_RTOL:g}: within {TARGET_UNITS:g} tolerances needs "
             "`|d| <= 9.7e-25 (rtol / 1e-6)^(1/2)`, and float64 rounding leaves every method "
             "measured (scipy's too) between 1e-26 and 1e-24, so tighter rows are reported "
             "only. Digits of `y2`, `y3` are `-log10` of the relative error against the "
             "published values; 'explained' is `(C M d t1)^2 / 12` in tolerance units.\n"]
    parts += [f"**{line}**\n" for line in raised]
    peers = _e5_peers() if not quick else []
    if peers:
        rows = []
        total = ref[1] + ref[2]
        for method, rtol, y, steps in peers:
            err = e5_sum_error(y)
            rows.append([f"scipy {method}", f"{rtol:g}", steps, f"{err:.1e}",
                         f"{e5_invariant(y):.1e}"])
            checks.add(f"scipy {method} at rtol {rtol:g}: e5 y2 + y3 against the published",
                       err, 1e-6, "rel", err <= 1e-6, f"stiff: scipy {method} at rtol {rtol:g} "
                       f"gives y2 + y3 {err:.1e} from the published {total:.6e}")
        parts.append("Outside references (exact Jacobian):\n")
        parts.append(md_table(["method", "rtol", "steps", "y2 + y3 rel. error",
                               "y2 - y3 - y4"], rows) + "\n")
    parts.append(md_table(
        ["solver", "rtol", "result", "accepted (Radau)", "rejected", "y2 + y3 [tol]",
         "y2 - y3 - y4", "explained [tol]", "digits y2, y3", "y1, y4 [tol]"],
        [[r["solver"], f"{r['rtol']:g}", r["result"], f"{r['steps']} ({r['radau_steps']})",
          r["rejected"], r["sum_units"], f"{r['drift']:.1e}", r["explained_units"],
          ", ".join(f"{d:.1f}" for d in r["digits"]), r["y14_units"]] for r in recs]) + "\n")
    parts += _known_lines("Known misses on E5 (reported, not failed):", _e5_checks(recs, checks),
                          E5_KNOWN_MISSES)
    return parts, recs


def _known_lines(heading: str, known: list[str], reasons: dict[str, str]) -> list[str]:
    """Markdown for the known misses ``known``: the heading, each solver's reason, a line
    per miss (nothing when there is none)."""
    if not known:
        return []
    names = sorted({k.split(" on ")[0] for k in known})
    return ([f"{heading}\n"] + [f"{name}: {reasons[name]}.\n" for name in names]
            + [f"- {k}" for k in known] + [""])


def _reference_table():
    rows = []
    for prob, p in PROBLEMS.items():
        pub = published(prob)
        y, steps = scipy_reference(prob)
        rel = np.abs(y - pub) / np.abs(pub)
        rows.append([prob, f"{p.t1:g}", ", ".join(f"{v:.16e}" for v in pub), p.source,
                     f"{np.max(rel):.1e}", tol_units(y, pub, 1e-10, 1e-10 * p.atol_per_rtol),
                     steps])
    return md_table(["problem", "t1", "published y(t1)", "source", "max rel. diff. Radau "
                     "1e-12", "diff. in tol. units at rtol 1e-10", "Radau steps"], rows)


def _work_precision(solvers, acc, dfx):
    """Warm timings (best of several) of every contender at ``WP_RTOLS``."""
    recs = []
    for prob, p in PROBLEMS.items():
        pub = published(prob)
        ran = {(r["solver"], r["problem"]) for r in acc}
        contenders = [("simlib", n, _simlib_fn(n, prob)) for n in solvers if (n, prob) in ran]
        if dfx is not None:
            contenders.append(("diffrax", "Kvaerno5", _diffrax_fn(prob)))
        for lib, name, fn in contenders:
            t = time.perf_counter()
            block(fn(1e-6, 1e-6 * p.atol_per_rtol))
            compile_s = time.perf_counter() - t
            if lib == "simlib":  # compiled in the accuracy runs: their first call counts
                compile_s = next(r["compile"] for r in acc
                                 if (r["solver"], r["problem"]) == (name, prob))
            for rtol in WP_RTOLS:
                atol = rtol * p.atol_per_rtol
                secs, out = best_time(lambda fn=fn, rtol=rtol, atol=atol: block(fn(rtol, atol)),
                                      min_repeats=2, budget=0.3)
                ok = bool(out[1] == 0) if lib == "simlib" else bool(out[1])
                recs.append(dict(lib=lib, solver=name, problem=prob, rtol=rtol, time=secs,
                                 steps=int(out[2]), compile=compile_s,
                                 err=(tol_units(np.asarray(out[0]), pub, rtol, atol) * rtol
                                      if ok else float("nan"))))
        for method in ("Radau", "BDF", "LSODA"):
            for rtol in WP_RTOLS:
                secs, out = best_time(lambda m=method, r=rtol, q=prob: scipy_run(q, m, r),
                                      min_repeats=1, max_repeats=3, budget=0.2)
                y, steps, _ = out
                recs.append(dict(lib="scipy", solver=method, problem=prob, rtol=rtol,
                                 time=secs, steps=steps, compile=0.0,
                                 err=tol_units(y, pub, rtol, rtol * p.atol_per_rtol) * rtol))
    return recs


def _wp_figure(recs) -> str:
    fig, axes = plt.subplots(1, len(PROBLEMS), figsize=(5 * len(PROBLEMS), 4.3))
    names = sorted({(r["lib"], r["solver"]) for r in recs})
    for ax, prob in zip(axes, PROBLEMS, strict=True):
        for i, (lib, name) in enumerate(names):
            rs = [r for r in recs if (r["lib"], r["solver"], r["problem"]) == (lib, name, prob)]
            ls = {"simlib": "-", "scipy": "--", "diffrax": ":"}[lib]
            ax.loglog([r["time"] * 1e3 for r in rs], [r["err"] for r in rs], ls=ls,
                      marker="os^vD<>p"[i % 8], ms=4, color=f"C{i}", label=f"{lib} {name}")
        ax.set_title(f"{prob} (t1 = {PROBLEMS[prob].t1:g})", fontsize=10)
        ax.set_xlabel("warm wall time per solve [ms]")
        ax.set_ylabel("error at t1: max |e| / (|ref| + atol/rtol)")
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"Stiff work-precision, rtol {max(WP_RTOLS):g} to {min(WP_RTOLS):g}, "
                 "against the Bari test set's reference values", fontsize=10)
    fig.tight_layout()
    return save_figure(fig, "stiff_work_precision")


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    solvers = stiff_solvers()
    rtols = QUICK_RTOLS if quick else RTOLS
    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    if quick:
        parts.append(f"Quick mode: {', '.join(QUICK_PROBLEMS)} only.\n")
    parts.append(f"Stiff solvers found: {', '.join(solvers) or 'none'} (of "
                 f"{', '.join(STIFF_CANDIDATES)}). rtol: {', '.join(f'{r:g}' for r in rtols)}"
                 f"; atol/rtol: " + ", ".join(f"{k} {p.atol_per_rtol:g}"
                                              for k, p in PROBLEMS.items()) + ".\n")
    findings = []
    checks = Checks("stiff")
    if not quick:
        parts.append("### Reference values\n")
        parts.append(_reference_table() + "\n")
    acc, raised = _accuracy(solvers, rtols, QUICK_PROBLEMS if quick else tuple(PROBLEMS))
    for line in raised:
        checks.add(line.removeprefix("stiff: ").split(" raised ")[0] + ": runs",
                   line.split(" raised ", 1)[1], "no exception", "run", False, line, op="")
    parts += [f"**{line}**\n" for line in raised]
    parts.append("### Error at t1 in tolerance units and steps (scipy Radau at the same "
                 "tolerances in brackets)\n")
    rows = []
    for r in acc:
        rows.append([r["solver"], r["problem"], f"{r['rtol']:g}",
                     r["err"] if r["result"] == 0 else f"fail ({r['result']})",
                     f"{r['steps']} ({r['radau_steps']})",
                     f"{r['steps'] / r['radau_steps']:.2f}", r["rejected"],
                     r["radau_err"], r["seconds"] * 1e3, r["compile"]])
    parts.append(md_table(["solver", "problem", "rtol", "error [tol]", "accepted (Radau)",
                           "steps / Radau", "rejected", "Radau error [tol]", "run [ms]",
                           "first call [s]"], rows) + "\n")
    known = _checks(acc, not quick, checks)
    parts += _known_lines("### Known misses (reported, not failed)", known, KNOWN_MISSES)
    e5_parts, e5_recs = _e5_section(solvers, quick, checks)
    parts += e5_parts
    if not quick:
        dfx, why = try_import_diffrax()
        if dfx is None:
            parts.append(f"**diffrax skipped:** {why}.\n")
        wp = _work_precision(solvers, acc, dfx)
        path = _wp_figure(wp)
        parts.append("### Work-precision\n")
        parts.append(f"![stiff work-precision]({path})\n")
        parts.append(md_table(
            ["contender", "problem", "rtol", "error (rel., floor atol/rtol)", "time [ms]",
             "accepted steps", "first call [s]"],
            [[f"{r['lib']} {r['solver']}", r["problem"], f"{r['rtol']:g}", r["err"],
              r["time"] * 1e3, r["steps"], r["compile"] if r["lib"] != "scipy" else "-"]
             for r in wp]) + "\n")
    for name in solvers:
        rs = [r for r in acc if r["solver"] == name and r["result"] == 0]
        failed = [r for r in acc if r["solver"] == name and r["result"] != 0]
        if not rs:
            continue
        worst = max(rs, key=lambda r: r["err"] if np.isfinite(r["err"]) else np.inf)
        ratio = max(r["steps"] / r["radau_steps"] for r in rs)
        findings.append(
            f"Stiff ({name}): worst error of the successful runs {fmt(worst['err'])} "
            f"tolerance units ({worst['problem']}, rtol {worst['rtol']:g}); steps up to "
            f"{ratio:.1f}x scipy Radau's; " + (
                f"{len(failed)} runs failed (" + ", ".join(
                    f"{r['problem']} at {r['rtol']:g}: result {r['result']}" for r in failed)
                + "); " if failed else "")
            + f"{sum(k.startswith(name + ' ') for k in known)} known misses.")
    for name in dict.fromkeys(r["solver"] for r in e5_recs):
        rs = [r for r in e5_recs if r["solver"] == name and r["result"] == 0]
        if rs:
            findings.append(
                f"Stiff ({name}) on E5: y2 + y3 within {fmt(max(r['sum_units'] for r in rs))} "
                f"tolerance units, |y2 - y3 - y4| up to {max(abs(r['drift']) for r in rs):.1e}"
                " (rtol " + ", ".join(f"{r['rtol']:g}" for r in rs) + ").")
    return Section(title="7. Stiff problems: Robertson, Van der Pol (mu = 1000), Oregonator, "
                   "E5",
                   body="\n".join(parts), findings=findings,
                   data={"accuracy": acc, "e5": [{k: v for k, v in r.items() if k != "y"}
                                                 for r in e5_recs]},
                   seconds=time.perf_counter() - start, failures=checks.failures,
                   checks=checks.checks)
