"""Part 9: PDEs by the method of lines, against closed forms and scipy references.

* **Spatial convergence** (``simlib.pde``): the heat equation ``u_t = D u_xx`` on
  ``[0, 1]`` (``D = 0.1``, to ``t = 1``) from a sine mode with Dirichlet boundaries (points
  at the vertices) and a cosine mode with Neumann boundaries (points at the cell centres),
  whose exact solutions decay like ``exp(-(k pi)^2 D t)``. The semi-discrete system is
  solved by simlib (``Kvaerno5`` at rtol 1e-11, so that the time error is far below the
  space error) on ``n`` = 16 to 128 points; the error against the PDE's solution must fall
  at order 2 (within 0.1). The ODE solution is also checked against its own closed form
  (the discrete eigenvalue ``-(4/h^2) sin^2(k pi h / 2)``), which isolates the time error.
* **Temporal convergence**: the same semi-discrete system (``n = 32``, modes ``k = 1`` and
  ``3``) with fixed steps ``dt = 1/10 .. 1/40`` of implicit solvers, against its closed
  form: measured orders within 0.2 of each method's order.
* **1-D Brusselator** (Hairer and Wanner, II, IV.1; ``validation/pde_reference.py``):
  200 states, simlib's stiff solvers at rtol 1e-6 (atol = rtol) against scipy ``Radau`` with
  ``jac_sparsity`` at rtol 1e-10, within 10 tolerance units (``|y - ref| / (atol + rtol
  |ref|)``). The full run adds the cached references of the benchmark problems and their
  cross-check on the 32 x 32 grid of the 2-D Brusselator (scipy Radau at 1e-10 against
  CVODE with the FFT preconditioner at 1e-10 and 1e-12).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import simlib as sl

from .common import Checks, Section, fit_slope, fmt, md_table
from .pde_reference import (
    bruss1d_problem,
    heat_problem,
    reference,
    reference_note,
    scipy_solve,
)

DIFFUSION = 0.1
T1 = 1.0
SPATIAL_NS = (16, 32, 64, 128)
QUICK_SPATIAL_NS = (16, 32, 64)
TEMPORAL = {"BackwardEuler": 1, "ImplicitMidpoint": 2, "Kvaerno3": 3, "Kvaerno5": 5,
            "Rodas5P": 5}
QUICK_TEMPORAL = ("ImplicitMidpoint", "Kvaerno5")
TEMPORAL_STEPS = (10, 20, 40)
ORDER_TOL_SPACE = 0.1
ORDER_TOL_TIME = 0.2
BRUSS_SOLVERS = ("BDF", "Rodas5P", "Kvaerno5")
QUICK_BRUSS_SOLVERS = ("BDF",)
BRUSS_N = 100  # 200 states: dense solvers stay cheap
QUICK_BRUSS_N = 50
TOL_UNITS = 10.0
# agreement of the 2-D reference with an independent method (scipy Radau at 1e-10) and with
# itself at 1e-11 (its convergence with rtol), relative to |ref| + 1
REF_AGREEMENT = {"scipy": 3e-8, "CVODE-FFT": 2e-7}


def _spatial(ns, checks: Checks) -> tuple[list, list[str]]:
    rows, parts = [], []
    for bc in ("dirichlet", "neumann"):
        hs, errs, ode_errs = [], [], []
        for n in ns:
            hp = heat_problem(bc, n, k=2, diffusion=DIFFUSION)
            sol = sl.solve(hp.f, jnp.asarray(hp.mode()), 0.0, T1, solver=sl.Kvaerno5(),
                           rtol=1e-11, atol=1e-13, args=(DIFFUSION,))
            y = np.asarray(sol.ys[-1])
            hs.append(hp.grid.spacing[0])
            errs.append(float(np.abs(y - hp.exact(T1)).max()))
            ode_errs.append(float(np.abs(y - hp.semi_discrete(T1)).max()))
        slope = fit_slope(hs, errs)
        rows += [[bc, n, h, e, o] for n, h, e, o in zip(ns, hs, errs, ode_errs, strict=True)]
        checks.add(f"heat, {bc}: spatial order", slope, f"2 +- {ORDER_TOL_SPACE}", "order",
                   abs(slope - 2) <= ORDER_TOL_SPACE, op="=")
        worst_ode = max(ode_errs)
        checks.add(f"heat, {bc}: ODE solution against its closed form", worst_ode,
                   1e-3 * min(errs), "abs", worst_ode <= 1e-3 * min(errs),
                   note="time error far below the space error")
        parts.append(f"{bc}: measured spatial order {slope:.3f}")
    table = md_table(["boundary", "n", "h", "error vs PDE", "error vs ODE closed form"], rows)
    return [table], parts


def _temporal(solvers, checks: Checks) -> tuple[list, list[str]]:
    hp = heat_problem("dirichlet", 32, k=1, diffusion=DIFFUSION)
    x = hp.x
    h = hp.grid.spacing[0]
    modes = [(k, np.sin(k * np.pi * x)) for k in (1, 3)]
    y0 = sum(m for _, m in modes)

    def exact(t):
        return sum(np.exp(-4 / h**2 * np.sin(k * np.pi * h / 2) ** 2 * DIFFUSION * t) * m
                   for k, m in modes)

    rows, parts = [], []
    for name in solvers:
        errs = []
        for steps in TEMPORAL_STEPS:
            sol = sl.solve(hp.f, jnp.asarray(y0), 0.0, T1, solver=getattr(sl, name)(),
                           dt=T1 / steps, args=(DIFFUSION,))
            errs.append(float(np.abs(np.asarray(sol.ys[-1]) - exact(T1)).max()))
        slope = fit_slope([T1 / s for s in TEMPORAL_STEPS], errs)
        want = TEMPORAL[name]
        rows.append([name, want, slope] + errs)
        checks.add(f"heat, fixed steps: {name} temporal order", slope,
                   f"{want} +- {ORDER_TOL_TIME}", "order", abs(slope - want) <= ORDER_TOL_TIME,
                   op="=")
        parts.append(f"{name} {slope:.2f}")
    table = md_table(["solver", "order", "measured"] + [f"error, {s} steps"
                                                        for s in TEMPORAL_STEPS], rows)
    return [table], parts


def _brusselator(solvers, n: int, checks: Checks) -> list[str]:
    prob = bruss1d_problem(n)
    ref, info = scipy_solve(prob, "Radau", 1e-10, 1e-10)
    rows = []
    rtol = atol = 1e-6
    args = tuple(jnp.float64(a) for a in prob.args)
    for name in solvers:
        start = time.perf_counter()
        sol = sl.solve(prob.f, jnp.asarray(prob.y0), 0.0, prob.t1, solver=getattr(sl, name)(),
                       rtol=rtol, atol=atol, args=args, max_steps=100_000, throw=False)
        y = np.asarray(sol.ys[-1])
        units = float(np.max(np.abs(y - ref) / (atol + rtol * np.abs(ref))))
        rows.append([name, int(sol.result), units, int(sol.stats["num_accepted"]),
                     time.perf_counter() - start])
        checks.add(f"1-D Brusselator, {prob.states} states, {name} at rtol 1e-6", units,
                   TOL_UNITS, "tol units", int(sol.result) == 0 and units <= TOL_UNITS)
    return [f"1-D Brusselator, {prob.states} states, t in [0, {prob.t1:g}], rtol = atol = 1e-6, "
            f"against scipy Radau at 1e-10 with jac_sparsity ({info['steps']} steps):\n",
            md_table(["solver", "result", "error [tol]", "accepted steps", "first call [s]"],
                     rows)]


def _references(checks: Checks) -> list[str]:
    """The benchmark's cached references and the cross-check of the two kinds."""
    from .pde_reference import DEFAULT_SIZES, cross_check, problem

    rows = []
    for name, ns in DEFAULT_SIZES.items():
        for n in ns:
            prob = problem(name, n)
            y = reference(prob, compute=False)
            rows.append([prob.key, prob.states, "cached" if y is not None else "missing",
                         reference_note(prob)])
    out = [md_table(["problem", "states", "reference", "how"], rows)]
    try:
        diffs = cross_check(32)
    except ImportError as err:
        out.append(f"\nCross-check skipped: {err} (scikit-sundae is a benchmark peer).")
        return out
    for k, d in diffs.items():  # measured: Radau 8.5e-9 (unsplit run), CVODE 1e-11 6.0e-8
        bound = REF_AGREEMENT[k.split()[0]]
        checks.add(f"2-D Brusselator 32x32: cached reference (CVODE-FFT 1e-12) against {k}",
                   d, bound, "rel", d <= bound)
    out.append("\nCross-check on the 32 x 32 grid, max |a - b| / (|b| + 1) of the cached "
               "reference (CVODE-FFT at 1e-12) against: "
               + ", ".join(f"{k} {fmt(v)}" for k, v in diffs.items()))
    return out


def run(quick: bool = False) -> Section:
    start = time.perf_counter()
    jax.config.update("jax_enable_x64", True)
    checks = Checks("pde")
    parts = [__doc__.split("\n\n", 1)[1].strip(), ""]
    if quick:
        parts.append(f"Quick mode: n = {', '.join(map(str, QUICK_SPATIAL_NS))}; "
                     f"{', '.join(QUICK_TEMPORAL)}; Brusselator with {2 * QUICK_BRUSS_N} "
                     f"states and {', '.join(QUICK_BRUSS_SOLVERS)}; no cached references.\n")
    parts.append("### Spatial convergence: heat equation, closed form\n")
    table, spatial = _spatial(QUICK_SPATIAL_NS if quick else SPATIAL_NS, checks)
    parts += table + [""]
    parts.append("### Temporal convergence: fixed steps on the semi-discrete heat equation\n")
    table, temporal = _temporal(QUICK_TEMPORAL if quick else tuple(TEMPORAL), checks)
    parts += table + [""]
    parts.append("### 1-D Brusselator against scipy\n")
    parts += _brusselator(QUICK_BRUSS_SOLVERS if quick else BRUSS_SOLVERS,
                          QUICK_BRUSS_N if quick else BRUSS_N, checks) + [""]
    if not quick:
        parts.append("### References of the benchmark problems (benchmarks/pde.py)\n")
        parts += _references(checks) + [""]
    findings = [f"PDE: spatial orders {'; '.join(spatial)}; temporal orders "
                f"{', '.join(temporal)}."]
    return Section(title="9. PDEs by the method of lines: heat equation, Brusselator",
                   body="\n".join(parts), findings=findings,
                   seconds=time.perf_counter() - start, failures=checks.failures,
                   checks=checks.checks)
