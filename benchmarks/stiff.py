"""Stiff ODE benchmark: simlib's stiff solvers against diffrax Kvaerno5 and scipy.

Problems (float64, error at t1 against a tight reference printed next to every time):

* ``robertson``: Robertson's kinetics to t = 1e11, ``atol = 1e-6 rtol``; reference: the
  Bari test set's published value (``validation/stiff_reference.py``).
* ``van_der_pol``: Van der Pol, mu = 1000, to t = 2000, ``atol = rtol``; reference: the
  Bari test set's ``vdpol`` value, converted to the unscaled form (same module).
* ``brusselator``: the 1-D Brusselator with diffusion (Hairer and Wanner, *Solving ODEs
  II*, IV.1 and I, II.10 (10.14)), ``alpha = 1/50``, ``N`` interior points (``2N``
  states, ``u`` and ``v`` interleaved so the Jacobian is banded), ``t`` in ``[0, 10]``,
  ``atol = rtol``; reference: scipy ``Radau`` at rtol = atol = 1e-11 with the exact
  sparse Jacobian. scipy ``Radau``/``BDF`` get ``jac_sparsity``, ``LSODA``
  ``lband = uband = 2``, as a scipy user would pass them.

each at rtol 1e-6 and 1e-9. Contenders: every stiff solver simlib has (of
``Rosenbrock23, Rodas5P, Rodas5, Kvaerno3, Kvaerno5, BDF``), diffrax ``Kvaerno5`` with
``PIDController(rtol, atol, pcoeff=0.3, icoeff=0.3)`` (the coefficients diffrax's docs
suggest for mildly stiff problems), and scipy ``Radau``, ``BDF``, ``LSODA`` (NumPy
right-hand sides; the exact Jacobian on the two small problems). simlib and diffrax run
through ``jax.jit`` with the tolerances as traced arguments; compile time is the wall
time of ``jit(fn).lower(...).compile()``, reported separately; run time is the best of
``--repeats`` calls after a warm-up call (one call when the warm-up took over 2 s),
contenders timed round-robin.

Ensemble: 1,000 Robertson problems to t = 1e11 at rtol 1e-6 with every rate constant
multiplied by ``exp(0.1 * normal)`` (PRNG key 0): simlib ``jit(vmap(solve))``, diffrax
``jit(vmap(diffeqsolve))``, and scipy ``solve_ivp`` (``LSODA``, ``Radau``) in a Python
loop over the first ``--scipy-members`` members, its time scaled linearly to 1,000
(marked as extrapolated). Errors of three members against scipy Radau at rtol 1e-10.

ratio = peer time / simlib time (> 1: simlib faster).

Usage::

    python benchmarks/stiff.py            # rtol 1e-6 and 1e-9, N = 250 (500 states)
    python benchmarks/stiff.py --quick    # rtol 1e-6, N = 100, 2 repeats, 5 scipy members
    python benchmarks/stiff.py --single-thread   # XLA, OpenBLAS and OpenMP on one thread

On a loaded machine the multi-threaded LU factorisations of XLA and OpenBLAS oversubscribe
the cores and a 500 x 500 LU can take 100x longer than on one thread (measured here at a
load average of 7 on 2 cores: 2.3 ms single-threaded, 210 ms multi-threaded). The load
average is printed at the start and the end of a run; ``--single-thread`` gives every
contender one thread.
"""

import os
import sys

from _timing import single_thread_if_asked  # benchmarks/_timing.py; imports no numpy

single_thread_if_asked(sys.argv)  # before jax/numpy load their thread pools

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse  # noqa: E402
from _format import finish, fmt_s, optional_import, simlib_commit  # noqa: E402  (benchmarks/_format.py, next to this file)
from _timing import Timer, compile_jit, load_average, round_robin, timed  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import simlib as sl  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # for validation.stiff_reference (the published values)
from validation import stiff_reference as ref  # noqa: E402

diffrax, DIFFRAX_ERROR = optional_import("diffrax")

STIFF = [n for n in ("Rosenbrock23", "Rodas5P", "Rodas5", "Kvaerno3", "Kvaerno5", "BDF")
         if hasattr(sl, n)]
SCIPY = ("Radau", "BDF", "LSODA")
MAX_STEPS = 200_000
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "stiff.json"
SLOW_S = 2.0  # a run slower than this is timed once after its warm-up
ALPHA = 0.02  # Brusselator diffusion coefficient (Hairer and Wanner)


# --------------------------------------------------------------------------------------
# problems


@dataclass
class Problem:
    name: str
    f: object  # JAX field f(t, y, args) on a flat state
    f_np: object  # NumPy field f(t, y, args)
    y0: np.ndarray
    t1: float
    args: object
    atol_per_rtol: float
    scipy_opts: dict  # Jacobian information for scipy, per method
    reference: np.ndarray | None = None
    reference_note: str = ""


def brusselator(t, y, args):
    """``u' = 1 + u^2 v - 4u + c lap u``, ``v' = 3u - u^2 v + c lap v``, ``c = alpha (N+1)^2``,
    boundary values ``u = 1``, ``v = 3``; ``y = [u_1, v_1, u_2, v_2, ...]``."""
    (c,) = args
    uv = y.reshape(-1, 2)
    u, v = uv[:, 0], uv[:, 1]
    one = jnp.ones((1,), y.dtype)
    ue = jnp.concatenate([one, u, one])
    ve = jnp.concatenate([3 * one, v, 3 * one])
    du = 1 + u * u * v - 4 * u + c * (ue[:-2] - 2 * u + ue[2:])
    dv = 3 * u - u * u * v + c * (ve[:-2] - 2 * v + ve[2:])
    return jnp.stack([du, dv], axis=1).reshape(-1)


def brusselator_np(t, y, args):
    (c,) = args
    u, v = y[0::2], y[1::2]
    ue = np.concatenate([[1.0], u, [1.0]])
    ve = np.concatenate([[3.0], v, [3.0]])
    out = np.empty_like(y)
    out[0::2] = 1 + u * u * v - 4 * u + c * (ue[:-2] - 2 * u + ue[2:])
    out[1::2] = 3 * u - u * u * v + c * (ve[:-2] - 2 * v + ve[2:])
    return out


def brusselator_jac_np(t, y, args):
    """The exact Jacobian, sparse (CSC)."""
    (c,) = args
    n = y.size // 2
    u, v = y[0::2], y[1::2]
    rows, cols, vals = [], [], []
    iu, iv = 2 * np.arange(n), 2 * np.arange(n) + 1
    for r, cc, val in ((iu, iu, 2 * u * v - 4 - 2 * c), (iu, iv, u * u),
                       (iv, iu, 3 - 2 * u * v), (iv, iv, -u * u - 2 * c)):
        rows.append(r), cols.append(cc), vals.append(val)
    for off in (-2, 2):  # neighbours: u_i - u_(i+-1), v_i - v_(i+-1)
        idx = np.arange(2 * n)
        ok = (idx + off >= 0) & (idx + off < 2 * n)
        rows.append(idx[ok]), cols.append(idx[ok] + off), vals.append(np.full(ok.sum(), c))
    return scipy.sparse.csc_matrix((np.concatenate(vals), (np.concatenate(rows),
                                                           np.concatenate(cols))),
                                   shape=(2 * n, 2 * n))


def brusselator_problem(n: int) -> Problem:
    x = np.arange(1, n + 1) / (n + 1)
    y0 = np.empty(2 * n)
    y0[0::2], y0[1::2] = 1 + np.sin(2 * np.pi * x), 3.0
    args = (ALPHA * (n + 1) ** 2,)
    sparsity = brusselator_jac_np(0.0, y0, args) != 0
    return Problem(
        f"brusselator (N={n}, {2 * n} states)", brusselator, brusselator_np, y0, 10.0, args,
        1.0, {"Radau": dict(jac_sparsity=sparsity), "BDF": dict(jac_sparsity=sparsity),
              "LSODA": dict(lband=2, uband=2)},
        reference_note="scipy Radau, rtol = atol = 1e-11, exact sparse Jacobian")


def small_problem(name: str) -> Problem:
    p = ref.PROBLEMS[name]
    jac = dict(jac=p.jac_np)
    return Problem(name, p.f, p.f_np, np.array(p.y0, float), p.t1, p.args, p.atol_per_rtol,
                   {m: jac for m in SCIPY}, ref.published(name), p.source)


def reference_of(prob: Problem) -> np.ndarray:
    if prob.reference is None:
        sol = solve_ivp(prob.f_np, (0.0, prob.t1), prob.y0, method="Radau", rtol=1e-11,
                        atol=1e-11, jac=brusselator_jac_np, args=(prob.args,))
        assert sol.success, sol.message
        prob.reference = sol.y[:, -1]
    return prob.reference


def error(y, prob: Problem, rtol: float) -> float:
    """Relative error at t1 with the floor ``atol/rtol``: ``max |e| / (|ref| + atol/rtol)``
    (tolerance units times rtol, so comparable across tolerances)."""
    y = np.asarray(y)
    if not np.all(np.isfinite(y)):
        return float("nan")
    r = reference_of(prob)
    return float(np.max(np.abs(y - r) / (np.abs(r) + prob.atol_per_rtol)))


# --------------------------------------------------------------------------------------
# contenders: (rtol, atol) -> (y1, steps, ok)


def simlib_fn(name: str, prob: Problem):
    solver = getattr(sl, name)()
    y0 = jnp.asarray(prob.y0)

    def run(rtol, atol):
        sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=solver, rtol=rtol, atol=atol,
                       args=prob.args, max_steps=MAX_STEPS, throw=False)
        return sol.ys[-1], sol.stats["num_accepted"], sol.result == 0

    return run


def diffrax_fn(prob: Problem):
    y0 = jnp.asarray(prob.y0)

    def run(rtol, atol):
        sol = diffrax.diffeqsolve(
            diffrax.ODETerm(prob.f), diffrax.Kvaerno5(), 0.0, prob.t1, None, y0,
            args=prob.args, saveat=diffrax.SaveAt(t1=True),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3,
                                                      icoeff=0.3),
            max_steps=MAX_STEPS, throw=False)
        return (sol.ys[-1], sol.stats["num_accepted_steps"],
                sol.result == diffrax.RESULTS.successful)

    return run


def scipy_call(prob: Problem, method: str, rtol: float):
    def call():
        sol = solve_ivp(prob.f_np, (0.0, prob.t1), prob.y0, method=method, rtol=rtol,
                        atol=rtol * prob.atol_per_rtol, args=(prob.args,),
                        **prob.scipy_opts[method])
        return (sol.y[:, -1] if sol.success else np.full(prob.y0.shape, np.nan),
                sol.t.size - 1, sol.success)

    return call


def time_round_robin(calls: dict, repeats: int) -> dict:
    """``{key: (best seconds, output)}`` of :func:`_timing.round_robin` (a call whose warm-up
    took more than ``SLOW_S`` seconds is timed once only)."""
    return {k: (t.best, t.out) for k, t in round_robin(calls, repeats, SLOW_S).items()}


def run_problem(prob: Problem, rtols, repeats: int, scipy_repeats: int) -> list[dict]:
    rows = []
    jitted = {}
    for name in STIFF:
        jitted[("simlib", name)] = simlib_fn(name, prob)
    if diffrax is not None:
        jitted[("diffrax", "Kvaerno5")] = diffrax_fn(prob)
    compiled = {}
    for key, fn in jitted.items():
        try:
            compiled[key] = compile_jit(fn, jnp.float64(1e-6), jnp.float64(1e-6))
        except Exception as err:  # noqa: BLE001 - reported, not hidden
            rows.append(dict(problem=prob.name, lib=key[0], solver=key[1], rtol=None,
                             error_msg=f"{type(err).__name__}: {err}"))
    for rtol in rtols:
        atol = rtol * prob.atol_per_rtol
        calls = {k: (lambda ex=ex, r=rtol, a=atol: ex(jnp.float64(r), jnp.float64(a)))
                 for k, (ex, _) in compiled.items()}
        timed = time_round_robin(calls, repeats)
        for method in SCIPY:
            call = scipy_call(prob, method, rtol)
            timed[("scipy", method)] = time_round_robin({0: call}, scipy_repeats)[0]
        for (lib, name), (secs, out) in timed.items():
            y, steps, ok = out
            ok = bool(ok)
            rows.append(dict(problem=prob.name, lib=lib, solver=name, rtol=rtol, atol=atol,
                             time=secs, steps=int(steps), ok=ok,
                             compile=compiled[(lib, name)][1] if lib != "scipy" else None,
                             error=error(y, prob, rtol) if ok else float("nan")))
            print(f"  {prob.name} rtol {rtol:g}: {lib} {name}: {fmt_s(secs)}, {int(steps)} "
                  f"steps, error {rows[-1]['error']:.1e}", flush=True)
    return rows


# --------------------------------------------------------------------------------------
# ensemble


def ensemble(members: int, scipy_members: int, repeats: int, rtol: float = 1e-6) -> dict:
    p = ref.PROBLEMS["robertson"]
    atol = rtol * p.atol_per_rtol
    key = jax.random.PRNGKey(0)
    ks = np.asarray(ref.ROBERTSON_K) * np.exp(0.1 * np.asarray(
        jax.random.normal(key, (members, 3), dtype=jnp.float64)))
    y0 = jnp.asarray(p.y0, jnp.float64)
    out = dict(members=members, rtol=rtol, atol=atol, scipy_members=scipy_members, rows=[])

    def simlib_ens(name):
        solver = getattr(sl, name)()

        def run(k):
            def one(k):
                sol = sl.solve(p.f, y0, 0.0, p.t1, solver=solver, rtol=rtol, atol=atol,
                               args=(k[0], k[1], k[2]), max_steps=MAX_STEPS, throw=False)
                return sol.ys[-1], sol.result
            return jax.vmap(one)(k)
        return run

    def diffrax_ens(k):
        def one(k):
            sol = diffrax.diffeqsolve(
                diffrax.ODETerm(p.f), diffrax.Kvaerno5(), 0.0, p.t1, None, y0,
                args=(k[0], k[1], k[2]), saveat=diffrax.SaveAt(t1=True),
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3,
                                                          icoeff=0.3),
                max_steps=MAX_STEPS, throw=False)
            return sol.ys[-1], (sol.result != diffrax.RESULTS.successful).astype(jnp.int32)
        return jax.vmap(one)(k)

    contenders = {("simlib", n): simlib_ens(n) for n in STIFF}
    if diffrax is not None:
        contenders[("diffrax", "Kvaerno5")] = diffrax_ens
    kj = jnp.asarray(ks)
    # the members whose errors are checked: those scipy solved too (its rows index them)
    check = range(min(3, scipy_members, members))
    refs = [solve_ivp(p.f_np, (0.0, p.t1), np.array(p.y0), method="Radau", rtol=1e-10,
                      atol=1e-16, jac=p.jac_np, args=(tuple(ks[i]),)).y[:, -1] for i in check]
    for (lib, name), fn in contenders.items():
        ex, comp = compile_jit(fn, kj)
        secs, (ys, res) = time_round_robin({0: lambda ex=ex: ex(kj)}, repeats)[0]
        ys, res = np.asarray(ys), np.asarray(res)
        err = max(ref.tol_units(ys[i], refs[i], rtol, atol) for i in check)
        out["rows"].append(dict(lib=lib, solver=name, time=secs, compile=comp,
                                failed=int(np.sum(res != 0)), error_tol_units=err,
                                extrapolated=False))
        print(f"  ensemble {lib} {name}: {fmt_s(secs)} (compile {fmt_s(comp)}), "
              f"{int(np.sum(res != 0))} failed, error {err:.2f} tol", flush=True)
    for method in ("LSODA", "Radau"):
        ys, secs = timed(lambda method=method: [
            solve_ivp(p.f_np, (0.0, p.t1), np.array(p.y0), method=method, rtol=rtol,
                      atol=atol, jac=p.jac_np, args=(tuple(ks[i]),)).y[:, -1]
            for i in range(scipy_members)])
        secs = secs * members / scipy_members
        err = max(ref.tol_units(ys[i], refs[i], rtol, atol) for i in check)
        out["rows"].append(dict(lib="scipy", solver=method, time=secs, compile=None, failed=0,
                                error_tol_units=err, extrapolated=True))
        print(f"  ensemble scipy {method}: {fmt_s(secs)} (extrapolated from "
              f"{scipy_members} members), error {err:.2f} tol", flush=True)
    return out


# --------------------------------------------------------------------------------------
# report


def fmt_r(x) -> str:
    """A ratio with three significant digits (small ratios stay readable)."""
    return "-" if x is None or not np.isfinite(x) else f"{x:.3g}x"


def targets(results: dict) -> list[str]:
    """Verdicts on the targets of issue 9, per simlib solver (equal tolerance, and the
    simlib error no larger than the peer's, else the ratio cannot count)."""
    lines = ["targets (issue 9), at equal tolerance; a case counts only if simlib's error "
             "is no larger than the peer's:"]
    rows = [r for r in results["rows"] if r.get("rtol") is not None]

    def cases(name, peer, need):
        out = []
        for s in [r for r in rows if r["lib"] == "simlib" and r["solver"] == name]:
            p = next((r for r in rows if (r["problem"], r["rtol"]) == (s["problem"], s["rtol"])
                      and (r["lib"], r["solver"]) == peer), None)
            if p is None or not s["ok"]:
                continue
            ratio = p["time"] / s["time"]
            out.append((ratio >= need and s["error"] <= p["error"], ratio, s, p))
        return out

    for name in STIFF:
        for peer, need, label in ((("diffrax", "Kvaerno5"), 2.0, "2x faster than diffrax "
                                   "Kvaerno5"), (("scipy", "LSODA"), 1.0,
                                                 "no slower than LSODA (one problem)")):
            cs = cases(name, peer, need)
            met = [c for c in cs if c[0]]
            show = met or cs
            lines.append(f"  {name}: {label}: {'MET' if met else 'NOT MET'} ("
                         + "; ".join(f"{c[2]['problem'].split(' ')[0]} {c[2]['rtol']:g}: "
                                     f"{fmt_r(c[1])}, error x{c[3]['error'] / c[2]['error']:.2g}"
                                     for c in show) + ")")
        ens = results.get("ensemble")
        if ens:
            s = next((r for r in ens["rows"] if (r["lib"], r["solver"]) == ("simlib", name)),
                     None)
            if s is not None:
                sc = {r["solver"]: r["time"] / s["time"] for r in ens["rows"]
                      if r["lib"] == "scipy"}
                best = min(sc, key=sc.get)
                lines.append(f"  {name}: ensemble 20x faster than scipy in a loop: "
                             f"{'MET' if sc[best] >= 20 else 'NOT MET'} against the fastest "
                             f"scipy method ({best} {fmt_r(sc[best])}; "
                             + ", ".join(f"{k} {fmt_r(v)}" for k, v in sc.items()) + ")")
    return lines


def _load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def report(results: dict) -> str:
    lines = [f"simlib {sl.__version__} ({results['commit']}) | jax {jax.__version__} | "
             f"diffrax {results['diffrax'] or 'skipped: ' + DIFFRAX_ERROR} | "
             f"{jax.default_backend()} | {results['cpus']} cpus | {results['date']}",
             f"load average (1, 5, 15 min) at start {_load(results['load_start'])}, at end "
             f"{_load(results['load_end'])}; "
             + ("single-threaded (--single-thread)" if results["single_thread"]
                else "default threading"),
             f"stiff solvers found in simlib: {', '.join(STIFF) or 'none'}",
             "steps = accepted steps; "
             "error = max_i |y_i - ref_i| / (|ref_i| + atol/rtol) at t1; time = best of "
             f"{results['repeats']} warm runs (scipy: best of {results['scipy_repeats']}); "
             "compile = jit(fn).lower().compile()", ""]
    rows = results["rows"]
    for prob in dict.fromkeys(r["problem"] for r in rows):
        for rtol in dict.fromkeys(r["rtol"] for r in rows if r["problem"] == prob):
            if rtol is None:
                continue
            rs = [r for r in rows if r["problem"] == prob and r["rtol"] == rtol]
            lines.append(f"{prob}, rtol {rtol:g}, atol {rs[0]['atol']:g}")
            lines.append(f"  {'contender':22s} {'compile':>9s} {'run':>9s} {'steps':>7s} "
                         f"{'error':>9s}")
            for r in rs:
                lines.append(f"  {r['lib'] + ' ' + r['solver']:22s} {fmt_s(r['compile']):>9s} "
                             f"{fmt_s(r['time']):>9s} {r['steps']:>7d} {r['error']:>9.1e}"
                             + ("" if r["ok"] else "  FAILED"))
            for s in [r for r in rs if r["lib"] == "simlib"]:
                peers = [r for r in rs if r["lib"] != "simlib"]
                lines.append(f"  ratios vs simlib {s['solver']}: " + ", ".join(
                    f"{p['solver'] if p['lib'] == 'scipy' else 'diffrax ' + p['solver']} "
                    f"{fmt_r(p['time'] / s['time'])} (error x{p['error'] / s['error']:.2g})"
                    for p in peers))
            lines.append("")
    for r in rows:
        if r.get("error_msg"):
            lines.append(f"{r['problem']}: {r['lib']} {r['solver']} failed to compile: "
                         f"{r['error_msg']}")
    ens = results.get("ensemble")
    if ens:
        lines.append(f"ensemble: {ens['members']} Robertson problems to t = 1e11, rate "
                     f"constants x exp(0.1 N(0,1)), rtol {ens['rtol']:g}, atol {ens['atol']:g};"
                     f" error = max over 3 members vs Radau 1e-10, in tolerance units")
        for r in ens["rows"]:
            lines.append(f"  {r['lib'] + ' ' + r['solver']:22s} {fmt_s(r['compile']):>9s} "
                         f"{fmt_s(r['time']):>9s}{'*' if r['extrapolated'] else ' '} "
                         f"failed {r['failed']:>4d}  error {r['error_tol_units']:.2f}")
        lines.append(f"  * scipy time extrapolated linearly from {ens['scipy_members']} "
                     "members")
        for s in [r for r in ens["rows"] if r["lib"] == "simlib"]:
            lines.append(f"  ratios vs simlib {s['solver']}: " + ", ".join(
                f"{p['lib']} {p['solver']} {fmt_r(p['time'] / s['time'])}"
                for p in ens["rows"] if p["lib"] != "simlib"))
        lines.append("")
    lines += targets(results)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="short run: rtol 1e-6 only, N = 100, 2 repeats, 5 scipy members")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed runs of simlib/diffrax, best taken (default 5; quick 2)")
    parser.add_argument("--scipy-repeats", type=int, default=None,
                        help="timed runs of scipy, best taken (default 3; quick 1)")
    parser.add_argument("--n", type=int, default=None,
                        help="Brusselator interior points (2N states; default 250; quick 100)")
    parser.add_argument("--members", type=int, default=1000, help="ensemble size (1000)")
    parser.add_argument("--scipy-members", type=int, default=None,
                        help="ensemble members solved by scipy, scaled to --members "
                        "(default 20; quick 5)")
    parser.add_argument("--single-thread", action="store_true",
                        help="one thread for XLA, OpenBLAS and OpenMP (read before jax loads)")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH,
                        help=f"where to write the results (default {RESULTS_PATH})")
    opts = parser.parse_args(argv)
    for name in ("repeats", "scipy_repeats", "n", "scipy_members"):
        v = getattr(opts, name)
        if v is not None and v < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    repeats = opts.repeats or (2 if opts.quick else 5)
    scipy_repeats = opts.scipy_repeats or (1 if opts.quick else 3)
    n = opts.n or (100 if opts.quick else 250)
    scipy_members = opts.scipy_members or (5 if opts.quick else 20)
    if scipy_members > opts.members:
        parser.error(f"--scipy-members ({scipy_members}) exceeds --members ({opts.members})")
    rtols = (1e-6,) if opts.quick else (1e-6, 1e-9)

    with Timer() as wall:
        results = dict(
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            commit=simlib_commit(ROOT), jax=jax.__version__,
            diffrax=diffrax.__version__ if diffrax is not None else None,
            cpus=len(os.sched_getaffinity(0)), platform=platform.platform(), stiff=STIFF,
            repeats=repeats, scipy_repeats=scipy_repeats, quick=opts.quick,
            single_thread=opts.single_thread, load_start=load_average(), rows=[])
        problems = [small_problem("robertson"), small_problem("van_der_pol"),
                    brusselator_problem(n)]
        for prob in problems:
            print(f"[stiff] {prob.name} ...", flush=True)
            reference_of(prob)
            results["rows"] += run_problem(prob, rtols, repeats, scipy_repeats)
        print("[stiff] ensemble ...", flush=True)
        results["ensemble"] = ensemble(opts.members, scipy_members, repeats)
    results["wall_s"] = wall.wall
    results["load_end"] = load_average()
    text = report(results)
    return finish(results, text, opts.json)


if __name__ == "__main__":
    sys.exit(main())
