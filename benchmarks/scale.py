"""Sharding overhead: a Lorenz ensemble and direct-sum gravity on 1, 2, 4 and 8 devices.

On a CPU machine the devices are forced host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=D``) that share the same cores, so
the figures are the cost of sharding (partitioning, per-device loops, collectives), not
a hardware speed-up: time at 1 device divided by time at D. (Ratios above 1 occur: one
CPU device runs much of its program on one thread, D devices on D threads.) Each device count runs
in its own child process (the count is fixed when JAX starts); the two-process row runs
the ensemble on two processes of one device each, joined by ``sl.init_distributed`` over
localhost (gloo), against one process with two devices.

    python benchmarks/scale.py --quick        # 10,000 members, 8,192 bodies (~1-2 min)
    python benchmarks/scale.py                # 100,000 members, 32,768 bodies
    python benchmarks/scale.py --devices 1 8 --json benchmarks/results/scale.json

Contenders per device count D:
* ensemble ``sl.ensemble``: ``vmap`` inside ``shard_map``, one adaptive loop per device;
* ensemble ``jit(vmap)``: the inputs sharded with ``NamedSharding`` and XLA partitioning
  one global loop (a collective per step for its exit test);
* gravity ``sharded``: ``particles.sharded`` (targets split, sources replicated, pure JAX),
  against the one-device pure-JAX sum and the one-device native kernel.
Lorenz: float64, Tsit5, rtol 1e-6, atol 1e-9, t in [0, 1] (as benchmarks/ode.py).

``--uneven`` runs another part, in this process on one device: members that need very
different step counts (1 in 100 integrated to t = 10, the others to t = 1), plain
``jit(vmap(solve))`` against ``sl.solve_ensemble`` (chunks of ``chunk_steps`` attempts,
finished members dropped, the live ones packed into power-of-two buckets), and the same
on an even ensemble (all to t = 1: nothing to drop, the cost of chunking alone). Results
in benchmarks/results/scale_uneven.json:

    python benchmarks/scale.py --uneven --members 100000
Gravity: float32, one jitted force evaluation, softening 0.01.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _timing import Timer, best_of, compile_by_first_call, round_robin  # noqa: E402


def _best(fn, repeats: int):
    """(first call incl. compile, best of ``repeats`` later calls), seconds."""
    t = best_of(fn, repeats, slow_s=math.inf)
    return t.warmup, t.best


def child(args) -> dict:
    """Runs in a process with ``args.devices`` forced host devices."""
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import simlib as sl
    from simlib import particles as sp

    info = None
    if args.process is not None:
        info = sl.init_distributed(args.coordinator, 2, args.process, timeout=120)
    out = {"devices": jax.device_count(), "processes": jax.process_count()}

    def lorenz(t, y, a):
        s, r, b = a
        return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])

    def member(y0):
        return sl.solve(lorenz, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-9,
                        args=(10.0, 28.0, 8.0 / 3.0)).ys[-1]

    rng = np.random.default_rng(0)
    y0s = 1.0 + 0.1 * rng.standard_normal((args.members, 3))
    ens = sl.ensemble(member)
    first, best = _best(lambda: ens(y0s), args.repeats)
    out["ensemble"] = dict(first_s=first, best_s=best)
    if info is None:  # plain jit(vmap) on sharded inputs (one process only)
        sh = NamedSharding(sl.ensemble_mesh(), P("members"))
        y0_sharded = jax.device_put(jnp.asarray(y0s), sh)
        plain = jax.jit(jax.vmap(member))
        first, best = _best(lambda: plain(y0_sharded), args.repeats)
        out["jit_vmap"] = dict(first_s=first, best_s=best)
        res = np.asarray(ens(y0s))
        ref = np.asarray(plain(y0_sharded))
        out["ensemble_vs_jit_vmap_max_abs"] = float(np.max(np.abs(res - ref)))

    if args.skewed and info is None:
        # 1 member in 100 integrates to t = 10 instead of 1 (~10x the steps): under vmap
        # every member's loop runs as long as the slowest one's
        spans = np.where(np.arange(args.members) % 100 == 7, 10.0, 1.0)

        def member_span(y0, t1):
            sol = sl.solve(lorenz, y0, 0.0, t1, solver=sl.Tsit5(), rtol=1e-6, atol=1e-9,
                           args=(10.0, 28.0, 8.0 / 3.0), max_steps=16384)
            return sol.ys[-1], sol.stats["num_steps"]

        sk = sl.ensemble(member_span)
        first, best = _best(lambda: sk(y0s, spans), args.repeats)
        steps = np.asarray(sk(y0s, spans)[1])
        out["skewed"] = dict(first_s=first, best_s=best, mean_steps=float(steps.mean()),
                             max_steps=int(steps.max()))

    if args.bodies and info is None:
        x = jax.random.normal(jax.random.key(0), (args.bodies, 3), jnp.float32)
        m = jnp.full((args.bodies,), 1.0 / args.bodies, jnp.float32)
        params = dict(G=jnp.float32(1.0), softening=jnp.float32(0.01), masses=m)
        grav = sp.pair_energy(sp.gravity, sp.free(), tile=args.tile)
        fs = jax.jit(sp.sharded(grav).energy_and_forces)
        first, best = _best(lambda: fs(x, params), args.repeats)
        out["gravity_sharded"] = dict(first_s=first, best_s=best)
        forces = np.asarray(fs(x, params)[1])
        # LJ (float32, rho 0.8442, r_cut 2.5) on a neighbour list: one force evaluation
        pos, box = sp.lattice(args.lj_cells, 0.8442)
        pos = jnp.asarray(pos, jnp.float32) + 0.02 * jax.random.normal(
            jax.random.key(3), pos.shape, jnp.float32)
        space = sp.periodic(jnp.float32(box))
        lj = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
        nbrs = sp.neighbor_list(space, pos, r_cut=2.5, skin=0.3)
        ljp = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
        one_lj = jax.jit(lj.energy_and_forces)
        split_lj = jax.jit(sp.sharded(lj).energy_and_forces)
        first, best = _best(lambda: split_lj(pos, ljp, nbrs), args.repeats)
        out["lj_sharded"] = dict(first_s=first, best_s=best, atoms=int(pos.shape[0]))
        first, best = _best(lambda: one_lj(pos, ljp, nbrs), args.repeats)
        out["lj_unsharded"] = dict(first_s=first, best_s=best)
        f1, fs = np.asarray(one_lj(pos, ljp, nbrs)[1]), np.asarray(split_lj(pos, ljp, nbrs)[1])
        out["lj_sharded_vs_unsharded_rel"] = float(np.max(np.abs(fs - f1)) / np.max(np.abs(f1)))
        if jax.device_count() == 1:
            pure = jax.jit(grav._energy_and_forces)           # the pure-JAX all-pairs sum
            first, best = _best(lambda: pure(x, params), args.repeats)
            out["gravity_pure_1dev"] = dict(first_s=first, best_s=best)
            native = jax.jit(grav.energy_and_forces)          # the native kernel if built
            first, best = _best(lambda: native(x, params), args.repeats)
            out["gravity_default_1dev"] = dict(first_s=first, best_s=best)
            ref = np.asarray(pure(x, params)[1])
            out["gravity_sharded_vs_pure_rel"] = float(np.max(np.abs(forces - ref))
                                                       / np.max(np.abs(ref)))
    return out


def uneven(args) -> dict:
    """Plain vmap against solve_ensemble on even and uneven ensembles (one device)."""
    import jax

    jax.config.update("jax_enable_x64", not args.float32)
    import jax.numpy as jnp
    import numpy as np

    import simlib as sl

    def lorenz(t, y, a):
        s, r, b = a
        return jnp.stack([s * (y[1] - y[0]), y[0] * (r - y[2]) - y[1], y[0] * y[1] - b * y[2]])

    p = (10.0, 28.0, 8.0 / 3.0)
    tol = dict(rtol=1e-5, atol=1e-7) if args.float32 else dict(rtol=1e-6, atol=1e-9)
    n = args.members
    y0s = 1.0 + 0.1 * np.random.default_rng(0).standard_normal((n, 3))
    y0s = y0s.astype(np.float32 if args.float32 else np.float64)
    spans = {"even": np.ones(n),
             "uneven": np.where(np.arange(n) % 100 == 7, args.long_span, 1.0)}
    saves = {"t1": sl.SaveAt(t1=True), "ts": sl.SaveAt(ts=np.linspace(0.0, 1.0, 11))}

    def interleaved(fns: dict) -> dict:
        """Best time of each contender over ``repeats`` rounds, the contenders taking turns
        in each round (so that load from elsewhere on the machine hits them alike), after a
        warm-up each (a compile again after the caches were cleared)."""
        return {name: t.best for name, t in
                round_robin(fns, args.repeats, slow_s=math.inf).items()}

    out = dict(members=n, long_span=args.long_span, device=str(jax.devices()[0]),
               dtype=str(y0s.dtype), tolerances=tol, min_bucket=args.min_bucket, cases={})
    for case, save in (("even", "t1"), ("uneven", "t1"), ("even", "ts"), ("uneven", "ts")):
        t1s, saveat = spans[case], saves[save]
        vm = jax.jit(jax.vmap(lambda y0, t1, saveat=saveat: sl.solve(
            lorenz, y0, 0.0, t1, solver=sl.Tsit5(), args=p, saveat=saveat, max_steps=16384,
            **tol)))
        fns = {"vmap": lambda vm=vm, t1s=t1s: vm(y0s, t1s)}
        for chunk in args.chunks if save == "t1" else [args.chunks[len(args.chunks) // 2]]:
            def run(chunk=chunk, t1s=t1s, saveat=saveat):
                return sl.solve_ensemble(lorenz, y0s, 0.0, t1s, solver=sl.Tsit5(), args=p,
                                         saveat=saveat, max_steps=16384, chunk_steps=chunk,
                                         min_bucket=args.min_bucket, **tol)
            fns[f"compact_{chunk}"] = run
        row = {name: dict(compile_s=compile_by_first_call(fn)) for name, fn in fns.items()}
        for name, best in interleaved(fns).items():
            row[name]["best_s"] = best
        ref = fns["vmap"]()
        steps = np.asarray(ref.stats["num_steps"])
        for name in fns:
            if name == "vmap":
                continue
            r, sol = row[name], fns[name]()
            r["max_abs_diff_vs_vmap"] = float(np.max(np.abs(np.asarray(sol.ys)
                                                           - np.asarray(ref.ys))))
            r["steps_equal_vmap"] = bool(np.array_equal(np.asarray(sol.stats["num_steps"]),
                                                        steps))
            r["speedup_vs_vmap"] = row["vmap"]["best_s"] / r["best_s"]
        row["steps_mean"], row["steps_max"] = float(steps.mean()), int(steps.max())
        out["cases"][f"{case}_{save}"] = row
        print(case, save, {k: (v["best_s"] if isinstance(v, dict) else v)
                           for k, v in row.items()}, flush=True)
    return out


def _uneven_report(res: dict) -> str:
    from _format import fmt_r, fmt_s

    lines = [f"{res['members']:,} Lorenz members (Tsit5, rtol {res['tolerances']['rtol']:g}, "
             f"atol {res['tolerances']['atol']:g}, {res['dtype']}, min_bucket "
             f"{res['min_bucket']}) on "
             f"{res['device']}; uneven: 1 in 100 members to t = {res['long_span']:g}, the "
             "others to t = 1; even: all to t = 1. Best of repeats, the contenders taking "
             "turns; compile = first call after jax.clear_caches() - second call. "
             "speed-up = vmap time / solve_ensemble time.", "",
             "| case | steps mean / max | contender | time | speed-up vs vmap | compile "
             "| max abs diff vs vmap | steps equal |", "|---|---|---|---|---|---|---|---|"]
    for case, row in res["cases"].items():
        for name, r in row.items():
            if not isinstance(r, dict):
                continue
            label = "jit(vmap(solve))" if name == "vmap" else \
                f"solve_ensemble, chunk_steps={name.split('_')[1]}"
            lines.append(
                f"| {case} | {row['steps_mean']:.0f} / {row['steps_max']} | {label} "
                f"| {fmt_s(r['best_s'])} | {fmt_r(r.get('speedup_vs_vmap', 1.0))} "
                f"| {fmt_s(r['compile_s'])} | {r.get('max_abs_diff_vs_vmap', 0.0):.1e} "
                f"| {r.get('steps_equal_vmap', '-')} |")
    return "\n".join(lines)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(argv, devices: int, timeout: float = 900):
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return subprocess.Popen([sys.executable, __file__, "--_child", *argv], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _collect(proc, timeout: float = 900) -> dict:
    out, err = proc.communicate(timeout=timeout)
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child failed (exit {proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10,000 members, 8,192 bodies")
    ap.add_argument("--members", type=int, help="ensemble members (default 100,000)")
    ap.add_argument("--bodies", type=int, help="gravity bodies (default 32,768; 0 skips)")
    ap.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--lj-cells", type=int, help="LJ fcc cells per side (default 20: "
                    "32,000 atoms; --quick 10)")
    ap.add_argument("--no-two-process", action="store_true")
    ap.add_argument("--skewed", action="store_true",
                    help="also time an ensemble whose members need ~10x different steps")
    ap.add_argument("--uneven", action="store_true",
                    help="only the uneven-ensemble part: vmap against solve_ensemble")
    ap.add_argument("--long-span", type=float, default=10.0,
                    help="--uneven: t1 of the long members (1 in 100)")
    ap.add_argument("--chunks", type=int, nargs="+", default=[16, 32, 64, 128],
                    help="--uneven: chunk_steps values of solve_ensemble")
    ap.add_argument("--min-bucket", type=int, default=64, help="--uneven: min_bucket")
    ap.add_argument("--float32", action="store_true",
                    help="--uneven: float32 state, rtol 1e-5, atol 1e-7 (accelerators)")
    ap.add_argument("--json", help="results file (default benchmarks/results/scale.json, "
                    "with --uneven scale_uneven.json)")
    ap.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--process", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--coordinator", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.members is None:
        args.members = 10_000 if args.quick else 100_000
    if args.bodies is None:
        args.bodies = 8_192 if args.quick else 32_768
    if args.lj_cells is None:
        args.lj_cells = 10 if args.quick else 20
    if args._child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    if args.json is None:
        args.json = str(ROOT / "benchmarks" / "results"
                        / ("scale_uneven.json" if args.uneven else "scale.json"))
    if args.uneven:
        import jax
        from _format import finish, simlib_commit

        wall = Timer().start()
        res = uneven(args)
        results = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), jax=jax.__version__,
                       simlib=simlib_commit(ROOT), cpus=os.cpu_count(), repeats=args.repeats,
                       **res, wall_s=wall.stop())
        return finish(results, _uneven_report(res), args.json)

    import jax
    from _format import finish, fmt_r, fmt_s, simlib_commit

    wall = Timer().start()
    base = ["--members", str(args.members), "--bodies", str(args.bodies),
            "--repeats", str(args.repeats), "--tile", str(args.tile),
            "--lj-cells", str(args.lj_cells)]
    if args.skewed:
        base.append("--skewed")
    runs = {}
    for d in args.devices:
        print(f"-- {d} device(s)", flush=True)
        runs[d] = _collect(_spawn(base, d))
    two = None
    if not args.no_two_process:
        print("-- two processes x 1 device", flush=True)
        address = f"127.0.0.1:{_free_port()}"
        argv = ["--members", str(args.members), "--bodies", "0", "--repeats", str(args.repeats),
                "--coordinator", address]
        procs = [_spawn([*argv, "--process", str(i)], 1) for i in range(2)]
        two = [_collect(p) for p in procs]

    d0 = runs[min(runs)]
    rows = ["| devices | ensemble (sl.ensemble) | vs 1 device | jit(vmap), sharded input "
            "| vs 1 device | gravity sharded | vs 1 device |", "|---|---|---|---|---|---|---|"]
    for d, r in runs.items():
        g = r.get("gravity_sharded")
        rows.append(
            f"| {d} | {fmt_s(r['ensemble']['best_s'])} "
            f"| {fmt_r(d0['ensemble']['best_s'] / r['ensemble']['best_s'])} "
            f"| {fmt_s(r['jit_vmap']['best_s'])} "
            f"| {fmt_r(d0['jit_vmap']['best_s'] / r['jit_vmap']['best_s'])} "
            f"| {fmt_s(g and g['best_s'])} "
            f"| {fmt_r(g and d0['gravity_sharded']['best_s'] / g['best_s'])} |")
    lines = [f"Lorenz ensemble: {args.members:,} members (members/s = members / time); "
             f"gravity: {args.bodies:,} bodies, one force evaluation (float32). "
             f"'vs 1 device' = time at 1 device / time at D (1.00x = no overhead). The "
             f"forced devices share {os.cpu_count()} cores: a ratio above 1 comes from "
             f"one thread per device using idle cores (one CPU device runs much of its "
             f"program on one thread) and, for sl.ensemble, from each device's loop "
             f"stopping at its own slowest member; it is no hardware speed-up.",
             "", *rows]
    if "gravity_pure_1dev" in d0:
        pairs = args.bodies**2
        lines += ["", "gravity on one device: pure-JAX all-pairs "
                  f"{fmt_s(d0['gravity_pure_1dev']['best_s'])} "
                  f"({pairs / d0['gravity_pure_1dev']['best_s'] / 1e9:.2f} G pairs/s), "
                  f"default path (native kernel where built) "
                  f"{fmt_s(d0['gravity_default_1dev']['best_s'])} "
                  f"({pairs / d0['gravity_default_1dev']['best_s'] / 1e9:.2f} G pairs/s); "
                  f"sharded vs pure max relative force difference "
                  f"{d0['gravity_sharded_vs_pure_rel']:.1e}"]
    if "lj_sharded" in d0:
        lines += ["", f"LJ, {d0['lj_sharded']['atoms']:,} atoms, one force evaluation on a "
                  f"neighbour list (float32): sharded (rows split, positions replicated) "
                  f"against the unsharded energy in the same process:"]
        for d, r in runs.items():
            lines.append(f"  {d} dev: sharded {fmt_s(r['lj_sharded']['best_s'])}, unsharded "
                         f"{fmt_s(r['lj_unsharded']['best_s'])}: "
                         f"{fmt_r(r['lj_unsharded']['best_s'] / r['lj_sharded']['best_s'])} "
                         f"(max rel force diff {r['lj_sharded_vs_unsharded_rel']:.1e})")
    if two is not None:
        t2 = max(p["ensemble"]["best_s"] for p in two)
        ref = runs.get(2, d0)["ensemble"]["best_s"]
        lines += ["", f"two processes x 1 device (gloo over localhost): ensemble "
                  f"{fmt_s(t2)}, against one process x {runs.get(2, d0)['devices']} devices "
                  f"{fmt_s(ref)}: {fmt_r(ref / t2)}"]
    if args.skewed:
        lines += ["", "skewed ensemble (1 member in 100 runs to t = 10, the rest to t = 1): "
                  "time against the uniform ensemble, and mean/max steps per member:"]
        for d, r in runs.items():
            k = r["skewed"]
            lines.append(f"  {d} dev: {fmt_s(k['best_s'])} = "
                         f"{fmt_r(k['best_s'] / r['ensemble']['best_s'])} the uniform run; "
                         f"steps mean {k['mean_steps']:.0f}, max {k['max_steps']} (work if "
                         f"each member stopped at its own end: "
                         f"{k['mean_steps'] / k['max_steps']:.2f} of a lock-step run)")
    compile_s = {d: r["ensemble"]["first_s"] - r["ensemble"]["best_s"] for d, r in runs.items()}
    lines += ["", "compile + first-call overhead of sl.ensemble: "
              + ", ".join(f"{d} dev {fmt_s(c)}" for d, c in compile_s.items())]
    results = dict(date=time.strftime("%Y-%m-%d %H:%M:%S"), jax=jax.__version__,
                   simlib=simlib_commit(ROOT), cpus=os.cpu_count(), members=args.members,
                   bodies=args.bodies, repeats=args.repeats, runs=runs, two_process=two,
                   wall_s=wall.stop())
    return finish(results, "\n".join(lines), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
