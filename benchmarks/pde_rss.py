"""Peak resident memory of one simlib ``BDF`` solve with the sparse LU on a large 2-D
Brusselator (issue 23's target: below 1 GB at 131,072 states, ``bruss2d_256``).

The solve runs in a child process that reports its ``ru_maxrss`` (``resource.getrusage``)
every ``--every`` seconds from a thread, so that a run stopped by ``--timeout`` still
gives the peak it had reached (with how far it got: compiled or not, steps unknown).

Usage: ``python benchmarks/pde_rss.py --n 256 --t1 0.01 --timeout 900``
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(n: int, t1: float, every: float) -> None:
    import resource
    import threading

    start = time.time()

    def peak_mb() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def report(stage: str) -> None:
        print(json.dumps(dict(stage=stage, seconds=round(time.time() - start, 1),
                              peak_mb=round(peak_mb(), 1))), flush=True)

    def ticker() -> None:
        while True:
            time.sleep(every)
            report("running")

    threading.Thread(target=ticker, daemon=True).start()
    sys.path.insert(0, str(ROOT))
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import simlib as sl
    from validation import pde_reference as ref

    prob = ref.problem("bruss2d", n).with_t1(t1)
    report("imported")
    ls = sl.SparseLU(prob.sparsity)
    ls.symbolic()
    report("symbolic")

    def run(p):
        sol = sl.solve(prob.f, jnp.asarray(prob.y0), 0.0, prob.t1, solver=sl.BDF(),
                       rtol=1e-6, atol=1e-6, args=(p[0], p[1], p[2]), linear_solver=ls,
                       throw=False)
        return sol.ys[-1], sol.stats["num_accepted"], sol.result

    p = jnp.asarray(prob.args)
    compiled = jax.jit(run).lower(p).compile()
    report("compiled")
    _, steps, result = jax.block_until_ready(compiled(p))
    print(json.dumps(dict(stage="done", seconds=round(time.time() - start, 1),
                          peak_mb=round(peak_mb(), 1), steps=int(steps),
                          result=int(result))), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--t1", type=float, default=0.01)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        child(opts.n, opts.t1, opts.every)
        return 0
    cmd = [sys.executable, __file__, "--child", "--n", str(opts.n), "--t1", str(opts.t1),
           "--every", str(opts.every)]
    last = None
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    deadline = time.time() + opts.timeout
    try:
        for line in proc.stdout:
            last = json.loads(line)
            print(line.strip(), flush=True)
            if time.time() > deadline:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"bruss2d_{opts.n} ({2 * opts.n ** 2} states), t1 {opts.t1}: last report {last}"
          + (" (stopped by the timeout)" if last and last["stage"] != "done" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
