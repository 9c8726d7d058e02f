"""Time to first result: a one-off solve, gradient or fit, end to end in a new process.

What a researcher's script pays when it runs once and exits: starting Python, importing
the library, tracing, lowering and compiling, and the first run; then what a second
process pays when JAX's persistent compilation cache holds the programs. Each contender
runs in processes of its own (``--child``), so every figure is a cold process's:

* ``cold``: a new process and an empty cache folder;
* ``cache``: a second new process over the folder the cold one filled (simlib and diffrax;
  scipy compiles nothing, so its second process is its first). Both turn on JAX's
  persistent compilation cache there; simlib also calls ``sl.keep_compiled_programs``,
  which stores the programs of its eager calls whole (no trace, no compile).

The children read compiled modules (``.pyc``), as an installed package's are: the parent
compiles simlib's, and ``PYTHONDONTWRITEBYTECODE`` is dropped from their environment.

Per process: ``import_s`` (the imports), ``trace_s``, ``lower_s`` and ``compile_s`` (XLA)
of the first call (from ``jax.monitoring``; the compile figure of a cache hit is the
load from disk), ``first_s`` (the whole first call), ``to_result_s`` (from the moment
the parent started the process to the first result: interpreter start-up, imports and
the first call), ``warm_s`` (the best of 3 more calls in the same process) and the
number of XLA compilations. The ratio printed is scipy's (or diffrax's) ``to_result_s``
over simlib's: > 1 means simlib's first result came sooner.

Cases (float64):

* ``robertson``: Robertson's stiff kinetics on [0, 1e5], rtol 1e-6, atol 1e-10, 20 save
  times: ``sl.solve(..., solver=sl.Rodas5P())``; ``diffrax.Kvaerno5``; scipy ``Radau``.
* ``robertson_grad``: ``jax.jit(jax.grad(loss))`` of the sum of y2 at the 20 save times
  with respect to the three rates, with the default ``throw=True``; diffrax the same with
  its default adjoint. scipy has no gradient.
* ``fisher_kpp``: u_t = D u_xx + u (1 - u) on 2,000 cells (zero-flux ends, D = 1e-4,
  t in [0, 5]), BDF at rtol 1e-6, atol 1e-9 with the tridiagonal ``jac_sparsity``:
  ``sl.BDF()`` against scipy ``BDF``. (diffrax has no sparse Jacobian.)
* ``lv_fit``: four Lotka-Volterra rates fitted to 50 noisy observations:
  ``sl.least_squares`` through an adaptive Tsit5 solve (rtol = atol = 1e-8) against
  ``scipy.optimize.least_squares`` (trf, 2-point) through ``solve_ivp`` (DOP853, same
  tolerances). The data come from scipy at rtol 1e-12, with 1 % noise (seed 0).

Usage::

    python benchmarks/compile.py                 # every case, ~5 minutes on 2 cores
    python benchmarks/compile.py --cases robertson_grad --no-diffrax

Writes ``benchmarks/results/compile.json`` (``--out``), with the versions and the load.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CASES = ("robertson", "robertson_grad", "fisher_kpp", "lv_fit")
TOOLS = {"robertson": ("simlib", "diffrax", "scipy"),
         "robertson_grad": ("simlib", "diffrax"),
         "fisher_kpp": ("simlib", "scipy"),
         "lv_fit": ("simlib", "scipy")}


# --------------------------------------------------------------------------- the problems

def robertson_numpy(t, y, k):
    import numpy as np
    return np.array([-k[0] * y[0] + k[2] * y[1] * y[2],
                     k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                     k[1] * y[1] ** 2])


def robertson_jax(t, y, k):
    import jax.numpy as jnp
    return jnp.stack([-k[0] * y[0] + k[2] * y[1] * y[2],
                      k[0] * y[0] - k[1] * y[1] ** 2 - k[2] * y[1] * y[2],
                      k[1] * y[1] ** 2])


K = (0.04, 3e7, 1e4)
N_KPP, D_KPP, T_KPP = 2000, 1e-4, 5.0
LV_TRUE, LV_P0 = (1.5, 1.0, 3.0, 1.0), (1.65, 0.9, 2.7, 1.1)


def kpp_y0(np):
    x = np.linspace(0.0, 1.0, N_KPP)
    return np.where(x < 0.1, 1.0, 0.0) * 1.0


def kpp_rhs(xp, u, args):
    """Fisher-KPP with zero-flux ends, written once for numpy and jax.numpy."""
    d, h2 = args[0], (1.0 / (N_KPP - 1)) ** 2
    left = xp.concatenate([u[1:2], u[:-1]])
    right = xp.concatenate([u[1:], u[-2:-1]])
    return d * (left - 2 * u + right) / h2 + u * (1 - u)


def kpp_sparsity(np):
    i = np.arange(N_KPP)
    s = np.zeros((N_KPP, N_KPP), bool)
    s[i, i] = True
    s[i[1:], i[:-1]] = True
    s[i[:-1], i[1:]] = True
    return s


def lv_data():
    import numpy as np
    from scipy.integrate import solve_ivp

    def rhs(t, y, a, b, c, d):
        return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]

    ts = np.linspace(0.2, 10.0, 50)
    clean = solve_ivp(rhs, (0.0, 10.0), [10.0, 5.0], t_eval=ts, args=LV_TRUE,
                      method="DOP853", rtol=1e-12, atol=1e-12).y.T
    rng = np.random.default_rng(0)
    obs = clean * (1 + 0.01 * rng.standard_normal(clean.shape))
    return ts, obs, 0.01 * np.abs(obs), rhs


# ------------------------------------------------------------------- one contender's call

def make_call(case: str, tool: str):
    """The contender's first-result call (imports included in what it does first)."""
    if tool == "scipy":
        import numpy as np
        from scipy.integrate import solve_ivp
        if case == "robertson":
            ts = np.logspace(-4, 5, 20)
            return lambda: solve_ivp(robertson_numpy, (0.0, 1e5), [1.0, 0.0, 0.0],
                                     method="Radau", t_eval=ts, args=(K,), rtol=1e-6,
                                     atol=1e-10).y
        if case == "fisher_kpp":
            y0, sparsity = kpp_y0(np), kpp_sparsity(np)
            return lambda: solve_ivp(lambda t, u: kpp_rhs(np, u, (D_KPP,)), (0.0, T_KPP), y0,
                                     method="BDF", jac_sparsity=sparsity, rtol=1e-6,
                                     atol=1e-9).y[:, -1]
        if case == "lv_fit":
            from scipy.optimize import least_squares
            ts, obs, sigma, rhs = lv_data()

            def residuals(p):
                sol = solve_ivp(rhs, (0.0, 10.0), [10.0, 5.0], t_eval=ts, args=tuple(p),
                                method="DOP853", rtol=1e-8, atol=1e-8)
                return ((sol.y.T - obs) / sigma).ravel()

            return lambda: least_squares(residuals, LV_P0, jac="2-point",
                                         bounds=(0.0, np.inf)).x
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    if tool == "simlib":
        import simlib as sl
        if case in ("robertson", "robertson_grad"):
            ts = jnp.logspace(-4, 5, 20)

            def solve(k):
                return sl.solve(robertson_jax, jnp.array([1.0, 0.0, 0.0]), 0.0, 1e5,
                                solver=sl.Rodas5P(), rtol=1e-6, atol=1e-10, args=k,
                                saveat=sl.SaveAt(ts=ts)).ys
            k = jnp.asarray(K)
            if case == "robertson":
                return lambda: solve(k)
            grad = jax.jit(jax.grad(lambda k: jnp.sum(solve(k)[:, 1])))
            return lambda: grad(k)
        if case == "fisher_kpp":
            import numpy as np
            y0, sparsity = jnp.asarray(kpp_y0(np)), kpp_sparsity(np)

            def kpp(t, u, a):  # one function: a new one at every call would compile again
                return kpp_rhs(jnp, u, a)

            return lambda: sl.solve(kpp, y0, 0.0, T_KPP,
                                    solver=sl.BDF(), rtol=1e-6, atol=1e-9, args=(D_KPP,),
                                    jac_sparsity=sparsity, saveat=sl.SaveAt(t1=True)).ys[-1]
        if case == "lv_fit":
            ts, obs, sigma, _ = lv_data()
            ts, obs, sigma = jnp.asarray(ts), jnp.asarray(obs), jnp.asarray(sigma)

            def lv(t, y, p):
                return jnp.stack([p[0] * y[0] - p[1] * y[0] * y[1],
                                  -p[2] * y[1] + p[3] * y[0] * y[1]])

            def residuals(p):
                ys = sl.solve(lv, jnp.array([10.0, 5.0]), 0.0, 10.0, solver=sl.Tsit5(),
                              rtol=1e-8, atol=1e-8, args=p, saveat=sl.SaveAt(ts=ts)).ys
                return ((ys - obs) / sigma).ravel()

            return lambda: sl.least_squares(residuals, jnp.asarray(LV_P0),
                                            transforms=sl.Positive()).params
    if tool == "diffrax":
        import diffrax
        ts = jnp.logspace(-4, 5, 20)

        def solve(k):
            return diffrax.diffeqsolve(
                diffrax.ODETerm(robertson_jax), diffrax.Kvaerno5(), 0.0, 1e5, 1e-6,
                jnp.array([1.0, 0.0, 0.0]), args=k, saveat=diffrax.SaveAt(ts=ts),
                stepsize_controller=diffrax.PIDController(rtol=1e-6, atol=1e-10),
                max_steps=100_000).ys
        k = jnp.asarray(K)
        if case == "robertson":
            solve_jit = jax.jit(solve)
            return lambda: solve_jit(k)
        grad = jax.jit(jax.grad(lambda k: jnp.sum(solve(k)[:, 1])))
        return lambda: grad(k)
    raise SystemExit(f"no contender {tool!r} for case {case!r}")


def child(case: str, tool: str, cache: str | None) -> None:
    """One process: import, first call (timed by stage), warm calls; prints one JSON line."""
    from _timing import CompileWatch, best_of, timed

    spawned = float(os.environ.get("SIMLIB_BENCH_SPAWNED", time.time()))
    t0 = time.perf_counter()
    if tool != "scipy" and cache:
        import jax
        jax.config.update("jax_compilation_cache_dir", cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        if tool == "simlib":  # the one call docs/compile-time.md gives
            import simlib as sl
            sl.keep_compiled_programs(cache)
    call = make_call(case, tool)
    t_import = time.perf_counter() - t0
    watch = CompileWatch()
    if tool == "scipy":
        out, first = timed(call)
    else:
        with watch:
            out, first = timed(call)
    to_result = time.time() - spawned
    warm = best_of(call, repeats=3, warmup=False).best  # the first call was the warm-up
    import numpy as np
    print(json.dumps(dict(case=case, tool=tool, import_s=t_import, first_s=first,
                          to_result_s=to_result, warm_s=warm,
                          trace_s=watch.seconds["trace"], lower_s=watch.seconds["lower"],
                          compile_s=watch.seconds["backend"], compilations=watch.compiles,
                          result=np.asarray(out, np.float64).ravel()[:4].tolist())))


def run_child(case: str, tool: str, cache: str | None) -> dict:
    cmd = [sys.executable, __file__, "--child", case, tool] + (["--cache", cache] if cache
                                                              else [])
    env = dict(os.environ, SIMLIB_BENCH_SPAWNED=repr(time.time()))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # a user's Python reads compiled modules
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if run.returncode != 0:
        return dict(case=case, tool=tool, error=run.stderr[-2000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


CLI_CALLS = (["list"], ["info"], ["--version"], ["run", "nosuch"],
             ["run", "lorenz", "--rtol", "-1"], ["run", "robertson", "--max-steps", "0"])


def cli_times(repeats: int = 3) -> dict:
    """Wall seconds of the ``simlib`` command for listing, info and argument errors (the
    best of ``repeats`` processes each)."""
    out = {}
    for call in CLI_CALLS:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "simlib.cli", *call], capture_output=True,
                           timeout=300)
            best = min(best, time.perf_counter() - t0)
        out[" ".join(call)] = best
        print(f"simlib {' '.join(call):35s} {best:6.2f} s", flush=True)
    return out


def targets_of(rows: list, cli: dict) -> list:
    """The targets of docs/compile-time.md's section in docs/benchmarks.md."""
    got = {(r["case"], r["tool"], r["state"]): r for r in rows if "error" not in r}
    out = []

    def add(target, need, value, unit, ok):
        out.append(dict(target=target, need=need, value=value, unit=unit,
                        status="met" if ok else "missed"))

    for case in CASES:
        mine, scipy = got.get((case, "simlib", "cold")), got.get((case, "scipy", "cold"))
        if mine and scipy:
            r = scipy["to_result_s"] / mine["to_result_s"]
            add(f"{case}: cold process, scipy's time / simlib's", ">= 1", r, "x", r >= 1)
        diffrax = got.get((case, "diffrax", "cold"))
        if mine and diffrax:
            r = diffrax["to_result_s"] / mine["to_result_s"]
            add(f"{case}: cold process, diffrax's time / simlib's", ">= 1", r, "x", r >= 1)
        warm = got.get((case, "simlib", "cache"))
        if mine and warm:
            add(f"{case}: second process to first result", "< 0.5", warm["to_result_s"], "s",
                warm["to_result_s"] < 0.5)
            r = warm["to_result_s"] / mine["to_result_s"]
            add(f"{case}: second process / cold", "<= 0.25", r, "", r <= 0.25)
    grad = got.get(("robertson_grad", "simlib", "cold"))
    if grad:
        add("first jax.grad of the Robertson solve, cold process", "< 3", grad["to_result_s"],
            "s", grad["to_result_s"] < 3)
    for call, seconds in cli.items():
        add(f"simlib {call}", "< 1", seconds, "s", seconds < 1)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--no-diffrax", action="store_true")
    p.add_argument("--no-cli", action="store_true", help="skip the simlib command's timings")
    p.add_argument("--out", default=str(HERE / "results" / "compile.json"))
    p.add_argument("--child", nargs=2, metavar=("CASE", "TOOL"), help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    opts = p.parse_args(argv)
    if opts.child:
        child(*opts.child, opts.cache)
        return
    sys.path.insert(0, str(HERE))
    from _timing import fmt_load, load_average

    report = _Tee()
    with contextlib.redirect_stdout(report):
        _measure(opts, fmt_load, load_average, report)


class _Tee(io.StringIO):
    """Prints what it is written, and keeps it (the results file's ``report``)."""

    def write(self, text: str) -> int:
        sys.__stdout__.write(text)
        sys.__stdout__.flush()
        return super().write(text)


def _measure(opts, fmt_load, load_average, report) -> None:

    import compileall  # the children read compiled modules, as an installed package's are
    compileall.compile_dir(str(HERE.parent / "simlib"), quiet=1)
    rows, load_start = [], load_average()
    for case in opts.cases:
        for tool in TOOLS[case]:
            if tool == "diffrax" and opts.no_diffrax:
                continue
            with tempfile.TemporaryDirectory() as cache:
                states = ("cold",) if tool == "scipy" else ("cold", "cache")
                for state in states:
                    row = run_child(case, tool, None if tool == "scipy" else cache)
                    row["state"] = state
                    rows.append(row)
                    if "error" in row:
                        print(f"{case:15s} {tool:8s} {state:6s} FAILED\n{row['error']}")
                        continue
                    print(f"{case:15s} {tool:8s} {state:6s} to result {row['to_result_s']:6.2f}"
                          f" s  (import {row['import_s']:.2f}, trace {row['trace_s']:.2f}, "
                          f"lower {row['lower_s']:.2f}, compile {row['compile_s']:.2f}, "
                          f"first call {row['first_s']:.2f}; {row['compilations']} "
                          f"compilations)  warm {row['warm_s'] * 1e3:.1f} ms", flush=True)
    ratios = {}
    for case in opts.cases:
        got = {(r["tool"], r["state"]): r for r in rows if r["case"] == case and "error" not in r}
        for state in ("cold", "cache"):
            mine = got.get(("simlib", state))
            for peer in ("scipy", "diffrax"):
                theirs = got.get((peer, "cold" if peer == "scipy" else state))
                if mine and theirs:
                    ratios[f"{case} {state} vs {peer}"] = (theirs["to_result_s"]
                                                          / mine["to_result_s"])
    for name, ratio in ratios.items():
        print(f"{name:35s} {ratio:6.2f}x")
    cli = {} if opts.no_cli else cli_times()
    targets = targets_of(rows, cli)
    for t in targets:
        print(f"target {t['target']}: need {t['need']}, measured {t['value']:.3g} "
              f"{t['unit']}: {t['status']}")
    import jax
    import scipy

    import simlib
    versions = dict(python=sys.version.split()[0], jax=jax.__version__,
                    scipy=scipy.__version__, simlib=simlib.__version__)
    try:
        import diffrax
        versions["diffrax"] = diffrax.__version__
    except ImportError:
        pass
    commit = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    out = dict(rows=rows, ratios=ratios, cli=cli, targets=targets, versions=versions,
               commit=commit, report=report.getvalue(),
               date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count(),
               load_start=load_start, load_end=load_average())
    Path(opts.out).parent.mkdir(parents=True, exist_ok=True)
    Path(opts.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"load {fmt_load(load_start)} -> {fmt_load(out['load_end'])}; wrote {opts.out}")


if __name__ == "__main__":
    main()
