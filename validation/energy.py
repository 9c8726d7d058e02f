"""Part 3: long-time energy error of the symplectic methods against RK4.

The symplectic methods and RK4 run 10^5 fixed steps of the same ``dt`` on the
Kepler problem (e = 0.5) and the harmonic oscillator, saving every step
(``SaveAt(steps=True)``). The relative energy error ``|E(t) - E0| / |E0|`` is
reported at the end and at its maximum, together with a least-squares drift rate
(slope of the signed relative error against t) and a growth factor (largest error
in the last 10% of the run divided by the largest in the first 10%): about 1 for a
bounded, oscillating error, about 10 for a linear drift.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import jax
import matplotlib.pyplot as plt
import numpy as np

import simlib as sl

from .common import (
    METHOD_STYLE,
    SYMPLECTIC,
    Checks,
    Section,
    fmt,
    kepler_case,
    make_solver,
    md_table,
    problem_case,
    save_figure,
)

METHODS = SYMPLECTIC + ("RK4",)
DT = 0.01


def _cases(n_steps: int):
    t1 = n_steps * DT
    oscillator = problem_case("harmonic_oscillator", t1=t1)
    oscillator = replace(oscillator, description=(
        f"Harmonic oscillator, k = m = 1, from q = 1, p = 0, {t1 / (2 * math.pi):.4g} periods."))
    return kepler_case(0.5, t1 / (2 * math.pi)), oscillator


def _trajectory(case, name):
    sol = sl.solve(case.f, case.y0_jax(), case.t0, case.t1, solver=make_solver(name), dt=DT,
                   args=case.args, saveat=sl.SaveAt(t0=True, steps=True), max_steps=10**7)
    energy = jax.vmap(lambda q, p: case.energy((q, p), case.args))(*sol.ys)
    ang = None
    if case.name.startswith("kepler"):
        ang = jax.vmap(lambda q, p: q[0] * p[1] - q[1] * p[0])(*sol.ys)
    n = int(sol.stats["num_steps"])
    return np.asarray(sol.ts), np.asarray(energy), ang, n, int(sol.stats["num_fevals"])


def _stats(ts, rel):
    absrel = np.abs(rel)
    tenth = max(1, len(rel) // 10)
    slope = float(np.polyfit(ts, rel, 1)[0])
    early = float(np.max(absrel[1:tenth + 1]))
    return dict(final=float(absrel[-1]), max=float(np.max(absrel)), slope=slope,
                growth=float(np.max(absrel[-tenth:]) / early) if early > 0 else float("inf"))


def _envelope(ts, y, bins: int = 1000):
    """Max of ``y`` per bin (for plotting 10^5 points without aliasing the oscillation)."""
    n = len(y) // bins * bins
    return ts[:n].reshape(bins, -1)[:, -1], y[:n].reshape(bins, -1).max(axis=1)


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    n_steps = 10**4 if quick else 10**5
    cases = _cases(n_steps)
    results = []
    fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 4.2), squeeze=False)
    for ax, case in zip(axes[0], cases, strict=True):
        for name in METHODS:
            ts, energy, ang, n, nfev = _trajectory(case, name)
            e0 = float(energy[0])
            rel = (energy - e0) / abs(e0)
            rec = dict(case=case.name, method=name, steps=n, fevals_per_step=round(nfev / n, 2),
                       **_stats(ts, rel))
            if ang is not None:
                ang = np.asarray(ang)
                rec["ang"] = float(np.max(np.abs(ang - ang[0])) / abs(ang[0]))
            results.append(rec)
            color, marker = METHOD_STYLE[name]
            x, y = _envelope(ts[1:], np.abs(rel[1:]))
            ax.semilogy(x, np.where(y > 0, y, np.nan), color=color, lw=1.2, label=name)
        ax.set_title(f"{case.name}: {n_steps} steps of dt = {DT:g}", fontsize=10)
        ax.set_xlabel("t")
        ax.set_ylabel("|E(t) - E0| / |E0|  (max per bin)")
        ax.legend(fontsize=8)
    fig.suptitle("Relative energy error over time (envelope: maximum over bins of "
                 f"{n_steps // 1000} steps)", fontsize=10)
    fig.tight_layout()
    fig_path = save_figure(fig, "energy")

    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    parts += [f"- `{c.name}` (t1 = {c.t1:.6g}): {c.description}" for c in cases]
    parts.append("")
    rows = []
    for r in results:
        rows.append([r["case"], r["method"], r["steps"], fmt(r["fevals_per_step"]), r["final"],
                     r["max"], r["slope"], r["growth"], r.get("ang")])
    parts.append(md_table(["problem", "method", "steps", "fevals/step", "final |dE|/|E0|",
                           "max |dE|/|E0|", "drift rate (1/time)", "growth",
                           "max |dL|/|L0|"], rows))
    parts.append("\n`fevals/step` is simlib's `num_fevals` per step; it counts every call of "
                 "the vector field, including the drift sub-steps that only use dq/dt = p.\n")
    parts.append(f"![energy error]({fig_path})\n")

    findings = []
    checks = Checks("energy")
    for case in cases:
        rk4 = next(r for r in results if r["case"] == case.name and r["method"] == "RK4")
        for r in results:
            if r["case"] != case.name or r["method"] == "RK4":
                continue
            line = (f"Energy: {r['method']} on {case.name} grows by a factor "
                    f"{fmt(r['growth'])} over the run (not bounded).")
            if not checks.add(f"{r['method']} on {case.name}: energy error growth",
                              r["growth"], 3, "factor", not r["growth"] > 3,
                              f"energy: {line.removeprefix('Energy: ')}"):
                findings.append(line)
        sym = [r for r in results if r["case"] == case.name and r["method"] != "RK4"]
        findings.append(
            f"Energy ({case.name}, dt = {DT:g}, {n_steps} steps): RK4 drifts at "
            f"{fmt(rk4['slope'])}/time (final {fmt(rk4['final'])}, growth "
            f"{fmt(rk4['growth'])}); symplectic growth factors "
            + ", ".join(f"{r['method']} {fmt(r['growth'])}" for r in sym)
            + "; max errors " + ", ".join(f"{r['method']} {fmt(r['max'])}" for r in sym) + "."
        )
    for r in results:
        checks.add(f"{r['method']} on {r['case']}: max |dE|/|E0| finite", r["max"], "finite",
                   "rel", np.isfinite(r["max"]),
                   f"energy: {r['method']} on {r['case']}: non-finite energy error", op="")
    return Section(title="3. Energy error of symplectic methods vs RK4", body="\n".join(parts),
                   findings=findings, data=dict(records=results), failures=checks.failures,
                   checks=checks.checks, seconds=time.perf_counter() - start)

