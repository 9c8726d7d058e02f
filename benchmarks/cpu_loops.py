"""XLA:CPU's small-loop limit: every benchmark at a few thresholds, as ratios to the default.

XLA:CPU compiles a ``while`` loop whose body touches fewer than
``xla_cpu_small_while_loop_byte_threshold`` bytes per iteration (default 1,024) into one
function, and runs every other loop kernel by kernel (benchmarks/README.md, gradients.py
(g)). ``simlib.fast_cpu_loops()`` raises that limit. This script measures what raising it
does to every benchmark script in this directory: each script runs in a fresh subprocess
per threshold (the flag is read once per process, when JAX starts its CPU backend), with

    XLA_FLAGS=--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=N

and the timings of its JSON output are divided by the same row's timing at the default
limit. A ratio below 1 is a speed-up; above 1.10 is flagged as a regression. Rows of peers
that do not use XLA (scipy, numpy) measure the machine's noise. The particle peers
(LAMMPS, jax-md, REBOUND) are not run: their own benchmark compares them with simlib.

    python benchmarks/cpu_loops.py                       # ~20 minutes on 2 cores
    python benchmarks/cpu_loops.py --scripts gradients --thresholds 0 16384

Each run of a script is wrapped in ``flock -x /tmp/simlib_cpu.lock`` when ``flock``
exists (the machine is shared), and the scripts are run round-robin over the thresholds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _format import simlib_commit  # noqa: E402
from _timing import Timer, load_average  # noqa: E402

FLAG = "xla_cpu_small_while_loop_byte_threshold"
DEFAULT_THRESHOLDS = [0, 16 * 1024, 1024 * 1024, 100_000_000]  # 0: XLA's default (1,024)
REGRESSION = 1.10

# Sizes chosen so that one script at one threshold takes 1-3 minutes here. The large
# states are all in: the 32,000-atom LJ fluid, 4,096-body gravity, the 10,000-member
# Lorenz ensemble; so are the small ones: one gradient trajectory, 100- and 1,000-member
# ensembles, the stiff problems.
SCRIPTS = {
    "ode": ["ode.py", "--members", "100", "1000", "10000", "--repeats", "3",
            "--compile-repeats", "1", "--scipy-members", "5", "--max-unrolled", "100"],
    "particles": ["particles.py", "--parts", "lj", "gravity", "--lj-cells", "10", "20",
                  "--lj-steps", "100", "50", "--melt-steps", "100", "--repeats", "3",
                  "--grav-repeats", "10", "--grav-sim-steps", "20", "--peers"],
    "gradients": ["gradients.py", "--quick", "--memory-steps"],
    "stiff": ["stiff.py", "--quick"],
}


def xla_flags(threshold: int, base: str) -> str:
    if threshold <= 0:
        return base
    return (base + f" --xla_backend_extra_options={FLAG}={threshold}").strip()


def label(threshold: int) -> str:
    if threshold <= 0:
        return "default"
    if threshold % (1024 * 1024) == 0:
        return f"{threshold // (1024 * 1024)} MiB"
    if threshold % 1024 == 0:
        return f"{threshold // 1024} KiB"
    if threshold % 1_000_000 == 0:
        return f"{threshold // 1_000_000} MB"
    return f"{threshold} B"


# ---------------------------------------------------------------- extracting timings
# Each extractor maps a script's JSON to {row: (run seconds, compile seconds or None)}.

def rows_ode(d: dict) -> dict:
    return {f"{t['case']} N={t['members']} {t['method']}": (t["time_s"], t.get("compile_s"))
            for t in d["timings"] if t.get("time_s") is not None}


def rows_gradients(d: dict) -> dict:
    out = {}
    for r in d["rows"]:
        if r.get("forward_s") is not None:
            out[f"{r['case']} {r['family']} forward"] = (r["forward_s"],
                                                         r.get("forward_compile_s"))
        if r.get("grad_s") is not None:
            out[f"{r['case']} {r['name']}"] = (r["grad_s"], r.get("compile_s"))
    return out


def rows_stiff(d: dict) -> dict:
    out = {}
    for r in d["rows"]:
        if r.get("time") is not None:
            out[f"{r['problem']} {r['lib']} {r['solver']} rtol={r['rtol']:g}"] = (
                r["time"], r.get("compile"))
    ens = d.get("ensemble") or {}
    for r in ens.get("rows", []):
        if r.get("time") is not None:
            out[f"ensemble {ens.get('members')} {r['lib']} {r['solver']}"] = (
                r["time"], r.get("compile"))
    return out


def rows_particles(d: dict) -> dict:
    out = {}
    parts = d["parts"]
    for r in (parts.get("lj") or {}).get("rows", []):
        for peer in ("simlib", "lammps", "jax-md"):
            x = r.get(peer)
            if isinstance(x, dict) and x.get("seconds") is not None:
                out[f"LJ {r['n']} atoms {r['dtype']} {peer} {x.get('steps')} steps"] = (
                    x["seconds"], x.get("compile_s"))
    g = parts.get("gravity") or {}
    for dtype, x in (g.get("simlib") or {}).items():
        if not isinstance(x, dict):
            continue
        if x.get("seconds") is not None:
            out[f"gravity {g.get('n')} bodies {dtype} simlib force"] = (x["seconds"],
                                                                         x.get("compile_s"))
        if x.get("sim_seconds") is not None:
            out[f"gravity {g.get('n')} bodies {dtype} simlib {x.get('sim_steps')} steps"] = (
                x["sim_seconds"], x.get("sim_compile_s"))
    for peer in ("numpy", "rebound"):
        for dtype, x in (g.get(peer) or {}).items():
            if isinstance(x, dict) and x.get("seconds") is not None:
                out[f"gravity {g.get('n')} bodies {dtype} {peer}"] = (x["seconds"], None)
        if isinstance(g.get(peer), dict) and g[peer].get("seconds") is not None:
            out[f"gravity {g.get('n')} bodies {peer}"] = (g[peer]["seconds"], None)
    return out


EXTRACT = dict(ode=rows_ode, gradients=rows_gradients, stiff=rows_stiff,
               particles=rows_particles)


# ---------------------------------------------------------------- paired check
# The same functions, compiled in a fresh process per threshold, all in one lock hold,
# alternating thresholds: for each, the best of 5 calls, how many loops XLA compiled whole
# (`xla_cpu_small_call` in the optimized HLO) and the process's CPU time over wall time.

PAIRED_CHILD = r"""
import json, sys
import jax
jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp
sys.path.insert(0, sys.argv[1])
import simlib as sl
import ode
from _timing import Timer, compile_jit, warm_up

def lv(p, y0, n, adjoint):
    return sl.solve(sl.systems.lotka_volterra, y0, 0.0, 10.0, solver=sl.RK4(), dt=10.0 / n,
                    args=p, max_steps=n, adjoint=adjoint).ys[-1]

def ens(adjoint):
    return lambda p: jnp.mean(jax.vmap(lambda y: lv(p, y, 2000, adjoint).sum())(y0s))

def lorenz(case, batched, n):
    return (lambda y: ode.simlib_fn(case, batched)(y, ode.jargs()), ode.initial_conditions(n))

p = jnp.array([1.5, 1.0, 3.0, 1.0])
y0s = jnp.array([10.0, 5.0]) * jnp.exp(0.1 * jax.random.normal(jax.random.PRNGKey(0), (1000, 2)))
cases = {
    "LV one trajectory, RK4 1e4 steps, Checkpointed grad":
        (jax.grad(lambda p: lv(p, jnp.array([10.0, 5.0]), 10000, sl.Checkpointed()).sum()), p),
    "LV one trajectory, RK4 1e4 steps, ForwardMode grad":
        (jax.grad(lambda p: lv(p, jnp.array([10.0, 5.0]), 10000, sl.ForwardMode()).sum()), p),
    "LV vmap 1000 members, RK4 2e3 steps, forward": (ens(None), p),
    "LV vmap 1000 members, RK4 2e3 steps, Checkpointed grad": (jax.grad(ens(sl.Checkpointed())), p),
    "LV vmap 1000 members, RK4 2e3 steps, ForwardMode grad": (jax.grad(ens(sl.ForwardMode())), p),
    "Lorenz Tsit5 adaptive batched N=100": lorenz("adaptive", True, 100),
    "Lorenz Tsit5 fixed batched N=1000": lorenz("fixed", True, 1000),
    "Lorenz Tsit5 fixed vmap N=1000": lorenz("fixed", False, 1000),
    "Lorenz Tsit5 adaptive vmap N=1000": lorenz("adaptive", False, 1000),
    "Lorenz Tsit5 fixed vmap N=10000": lorenz("fixed", False, 10000),
    "Lorenz Tsit5 fixed batched N=10000": lorenz("fixed", True, 10000),
    "Lorenz Tsit5 adaptive vmap N=10000": lorenz("adaptive", False, 10000),
}
out = {}
for name, (f, x) in cases.items():
    c, _ = compile_jit(f, x)
    whole = c.as_text().count('xla_cpu_small_call="true"')
    warm_up(lambda: c(x))
    best, cpu = float("inf"), None
    for _ in range(5):  # best of 5 with the CPU time of that call: Timer, not best_of
        with Timer() as t:
            jax.block_until_ready(c(x))
        if t.wall < best:
            best, cpu = t.wall, t.cpu / t.wall
    out[name] = dict(s=best, compiled_whole=whole, cpu_per_wall=cpu)
print(json.dumps(out))
"""


def paired(thresholds: list[int], rounds: int) -> dict:
    """Run PAIRED_CHILD ``rounds`` times per threshold, alternating; the best per row."""
    runs = []
    for _ in range(rounds):
        for t in thresholds:
            env = dict(os.environ, XLA_FLAGS=xla_flags(t, os.environ.get("XLA_FLAGS", "")))
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
            proc = subprocess.run([sys.executable, "-c", PAIRED_CHILD, str(HERE)], env=env,
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            runs.append(dict(threshold=t, load=load_average()[0],
                             rows=json.loads(proc.stdout.strip().splitlines()[-1])))
            print(f"  paired {label(t)} done", flush=True)
    best: dict = {}
    for r in runs:
        for row, v in r["rows"].items():
            b = best.setdefault(row, {}).get(r["threshold"])
            if b is None or v["s"] < b["s"]:
                best[row][r["threshold"]] = v
    lines = [f"\npaired check (best of 5 calls x {rounds} processes per threshold; ratio to "
             "the default, loops compiled whole, CPU/wall)"]
    for row, d in best.items():
        base = d[thresholds[0]]["s"]
        lines.append(f"{row:<56} {base * 1e3:8.2f} ms " + " ".join(
            f"| {label(t)}: {d[t]['s'] / base:5.2f} {d[t]['compiled_whole']} "
            f"{d[t]['cpu_per_wall']:.2f}" for t in thresholds))
    return dict(runs=runs, best=best, report="\n".join(lines))


# ---------------------------------------------------------------- running

def run_one(name: str, threshold: int, tmp: Path, timeout: float, lock: bool) -> dict:
    out_json = tmp / f"{name}_{threshold}.json"
    cmd = [sys.executable, str(HERE / SCRIPTS[name][0]), *SCRIPTS[name][1:],
           "--json", str(out_json)]
    if lock and shutil.which("flock"):
        cmd = ["flock", "-x", "/tmp/simlib_cpu.lock", *cmd]
    env = dict(os.environ)
    env["XLA_FLAGS"] = xla_flags(threshold, os.environ.get("XLA_FLAGS", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    clock = Timer().start()
    load_start = load_average()[0]
    res = dict(script=name, threshold=threshold, xla_flags=env["XLA_FLAGS"],
               load_before_lock=load_start)
    try:  # the timeout includes the wait for the lock
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        res.update(wall_s=clock.stop(), returncode=None,
                   error=f"timed out after {timeout:.0f} s (lock wait included)")
        return res
    res.update(wall_s=clock.stop(), returncode=proc.returncode,
               load_end=load_average()[0])
    if proc.returncode != 0 or not out_json.exists():
        res["error"] = (proc.stderr or proc.stdout)[-3000:]
        return res
    data = json.loads(out_json.read_text())
    res["rows"] = {k: dict(s=v[0], compile_s=v[1]) for k, v in EXTRACT[name](data).items()}
    res["script_wall_s"] = data.get("wall_s")
    return res


def best_of(runs: list[dict]) -> dict:
    """(script, threshold) -> {row: {s, compile_s}}, the best of all runs of that pair."""
    by: dict = {}
    for r in runs:
        if "rows" not in r:
            continue
        rows = by.setdefault((r["script"], r["threshold"]), {"rows": {}})["rows"]
        for row, v in r["rows"].items():
            if row not in rows:
                rows[row] = dict(v)
                continue
            rows[row]["s"] = min(rows[row]["s"], v["s"])
            if v["compile_s"] is not None and rows[row]["compile_s"] is not None:
                rows[row]["compile_s"] = min(rows[row]["compile_s"], v["compile_s"])
    return by


def table(runs: list[dict], thresholds: list[int]) -> tuple[list[dict], list[str]]:
    """One entry per (script, row): the best times over all runs, and the ratios to the
    default threshold's."""
    by = best_of(runs)
    out, lines = [], []
    for name in SCRIPTS:
        base = by.get((name, thresholds[0]))
        if base is None:
            continue
        lines.append(f"\n{name}.py  (run / compile time at {label(thresholds[0])} limit; "
                     "then each threshold's ratio to it, run (compile))")
        head = f"{'row':<62} {'base s':>9} {'compile':>8}"
        for t in thresholds[1:]:
            head += f" {label(t):>15}"
        lines.append(head)
        for row, b in base["rows"].items():
            entry = dict(script=name, row=row, base_s=b["s"], base_compile_s=b["compile_s"],
                         ratio={}, compile_ratio={}, regression=[])
            cells = ""
            for t in thresholds[1:]:
                r = by.get((name, t), {}).get("rows", {}).get(row)
                if r is None or not b["s"]:
                    cells += f" {'-':>15}"
                    continue
                q = r["s"] / b["s"]
                c = (r["compile_s"] / b["compile_s"]
                     if r["compile_s"] and b["compile_s"] else None)
                entry["ratio"][label(t)] = q
                entry["compile_ratio"][label(t)] = c
                flag = "!" if q > REGRESSION else " "
                if q > REGRESSION:
                    entry["regression"].append(label(t))
                cc = f"({c:.2f})" if c is not None else "(-)"
                cells += f" {q:>7.2f}{flag}{cc:>7}"
            comp = f"{b['compile_s']:.2f}" if b["compile_s"] is not None else "-"
            lines.append(f"{row[:62]:<62} {b['s']:>9.4f} {comp:>8}{cells}")
            out.append(entry)
    return out, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scripts", nargs="*", choices=list(SCRIPTS), default=list(SCRIPTS),
                    help="scripts to run (none: only tabulate the --merge files)")
    ap.add_argument("--thresholds", nargs="+", type=int, default=DEFAULT_THRESHOLDS,
                    help="bytes; 0 = XLA's default (the denominator, keep it first)")
    ap.add_argument("--timeout-s", type=float, default=3600.0,
                    help="per script run, the wait for the lock included")
    ap.add_argument("--raw-dir", type=Path, default=None,
                    help="keep the scripts' own JSON outputs there (default: a new temporary "
                         "folder, kept)")
    ap.add_argument("--no-lock", action="store_true", help="do not wrap runs in flock -x")
    ap.add_argument("--json", type=Path, default=HERE / "results" / "cpu_loops.json")
    ap.add_argument("--merge", type=Path, nargs="*", default=[],
                    help="earlier results JSON whose runs are pooled with this run's (each "
                         "row's best time is taken): rerun a pair disturbed by other load")
    ap.add_argument("--from-dir", type=Path, nargs="*", default=[],
                    help="also pool the scripts' own outputs found in these folders, named "
                         "{script}_{threshold}.json (as this script writes them)")
    ap.add_argument("--paired", action="store_true",
                    help="run only the paired check (one lock hold) at --thresholds")
    ap.add_argument("--paired-rounds", type=int, default=2)
    args = ap.parse_args()
    if args.paired:
        if not args.no_lock and shutil.which("flock") and not os.environ.get("CPU_LOOPS_LOCKED"):
            os.environ["CPU_LOOPS_LOCKED"] = "1"
            os.execvp("flock", ["flock", "-x", "/tmp/simlib_cpu.lock", sys.executable,
                                *sys.argv])
        ts = sorted({0, *args.thresholds})
        res = paired(ts, args.paired_rounds)
        print(res["report"])
        out = json.loads(args.json.read_text()) if args.json.exists() else {}
        out["paired"] = dict(thresholds=ts, rounds=args.paired_rounds,
                             date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), **res)
        args.json.write_text(json.dumps(out, indent=1, default=float) + "\n")
        print(f"\nadded to {args.json}")
        return

    clock = Timer().start()
    runs = []
    for path in args.merge:
        runs += json.loads(path.read_text())["runs"]
    for path in [p for d in args.from_dir for p in sorted(d.glob("*_*.json"))]:
        name, _, t = path.stem.rpartition("_")  # a child's output, {script}_{threshold}.json
        if name in SCRIPTS and t.isdigit():
            data = json.loads(path.read_text())
            runs.append(dict(script=name, threshold=int(t), from_file=str(path),
                             script_wall_s=data.get("wall_s"), rows={
                                 k: dict(s=v[0], compile_s=v[1])
                                 for k, v in EXTRACT[name](data).items()}))
    # 0 (XLA's default) first: every ratio is to it
    thresholds = sorted({0, *args.thresholds, *(r["threshold"] for r in runs)})
    raw = args.raw_dir or Path(tempfile.mkdtemp(prefix="cpu_loops_"))
    raw.mkdir(parents=True, exist_ok=True)
    print(f"the scripts' own outputs go to {raw}", flush=True)
    for name in args.scripts:
        for t in args.thresholds:
            r = run_one(name, t, raw, args.timeout_s, not args.no_lock)
            status = "ok" if "rows" in r else f"FAILED rc={r['returncode']}"
            print(f"{name:>10} {label(t):>8}: {r['wall_s']:6.1f} s  {status}", flush=True)
            if "error" in r:
                print(r["error"], flush=True)
            runs.append(r)
    entries, lines = table(runs, thresholds)
    regressions = [e for e in entries if e["regression"]]
    lines.append(f"\n{len(regressions)} rows over {REGRESSION:.2f}x at some threshold:")
    for e in regressions:
        lines.append(f"  {e['script']}: {e['row']}: " + ", ".join(
            f"{t} {e['ratio'][t]:.2f}" for t in e["regression"]))
    report = "\n".join(lines)
    print(report)

    results = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S %Z"), simlib_commit=simlib_commit(ROOT),
        python=sys.version.split()[0], platform=platform.platform(), cpu_count=os.cpu_count(),
        cpu_model=_cpu_model(), flag=FLAG, thresholds=thresholds,
        scripts=SCRIPTS, merged=[str(p) for p in args.merge], regression_limit=REGRESSION,
        runs=runs, table=entries, wall_s=clock.stop(), report=report)
    try:
        import jax
        results["jax_version"] = jax.__version__
    except ImportError:
        pass
    if args.json.exists():  # keep an earlier paired check
        old = json.loads(args.json.read_text())
        if "paired" in old:
            results["paired"] = old["paired"]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1, default=float) + "\n")
    print(f"\nwrote {args.json}")


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


if __name__ == "__main__":
    main()
