"""Timing helpers shared by the benchmark scripts: warm-up, best of k, compile time apart,
the machine's load, and a process's peak memory.

Rules every script states in its report:

* a jitted contender is compiled first (:func:`compile_jit`: the wall time of
  ``jax.jit(fn).lower(*args).compile()``, reported apart from the run time);
* a run time is the best of ``repeats`` calls after one untimed warm-up call
  (:func:`best_of`); a call whose warm-up took longer than ``slow_s`` seconds is timed once
  more only, so that one slow contender does not take the whole budget, and one whose
  warm-up took longer than ``once_s`` (given for code with nothing to compile or cache)
  is not run again: its warm-up is its time (``Timing.warmup_only``);
* contenders compared in one table are timed round-robin, repeat by repeat
  (:func:`round_robin`), so a change in the machine's load hits them alike;
* the load average is recorded at the start and the end of a run (:func:`load_average`),
  and peak memory is read per process (:func:`peak_rss_mb`; run each contender in its own
  process to get its own peak).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Timing:
    """The timed calls of one contender: ``best`` (seconds), every timed call, the warm-up
    call's time and its output."""

    best: float
    times: list[float] = field(default_factory=list)
    warmup: float = 0.0
    out: Any = None
    warmup_only: bool = False


def _block(x: Any) -> Any:
    """``jax.block_until_ready`` when JAX is loaded (a no-op on NumPy results)."""
    import sys

    jax = sys.modules.get("jax")
    return jax.block_until_ready(x) if jax is not None else x


def best_of(call: Callable[[], Any], repeats: int = 3, slow_s: float = 2.0,
            once_s: float | None = None) -> Timing:
    """Best wall time of ``call()`` over ``repeats`` calls after an untimed warm-up call (one
    timed call only when the warm-up took more than ``slow_s`` seconds; none, the warm-up
    being the time, when it took more than ``once_s``)."""
    return round_robin({0: call}, repeats, slow_s, once_s)[0]


def round_robin(calls: dict, repeats: int = 3, slow_s: float = 2.0,
                once_s: float | None = None) -> dict:
    """:func:`best_of` for several zero-argument calls, timed in turn repeat by repeat;
    ``{key: Timing}``."""
    if repeats < 1:
        raise ValueError(f"round_robin: repeats must be >= 1, got {repeats}")
    out = {}
    for key, call in calls.items():
        start = time.perf_counter()
        result = _block(call())
        secs = time.perf_counter() - start
        out[key] = Timing(best=float("inf"), warmup=secs, out=result)
        if once_s is not None and secs > once_s:
            out[key].times, out[key].warmup_only = [secs], True
    for i in range(repeats):
        for key, call in calls.items():
            if out[key].warmup_only or (i > 0 and out[key].warmup > slow_s):
                continue
            start = time.perf_counter()
            _block(call())
            out[key].times.append(time.perf_counter() - start)
    for timing in out.values():
        timing.best = min(timing.times)
    return out


def compile_jit(fn: Callable, *args: Any) -> tuple[Callable, float]:
    """``(executable, seconds)`` of ``jax.jit(fn).lower(*args).compile()``."""
    import jax

    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - start


def single_thread_if_asked(argv: list[str]) -> bool:
    """With ``--single-thread`` in ``argv``: XLA, OpenBLAS, OpenMP and MKL on one thread
    each. Call it before numpy or jax is imported (they read these at load). Returns
    whether it did."""
    if "--single-thread" not in argv:
        return False
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen"
                               "=false intra_op_parallelism_threads=1").strip()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    return True


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def fmt_load(avg) -> str:
    return "/".join(f"{x:.1f}" for x in avg)


def peak_rss_mb() -> float:
    """This process's peak resident set size so far, in MB (``ru_maxrss``, kB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def rss_mb() -> float:
    """This process's current resident set size in MB (``/proc/self/statm``; the peak where
    that is not readable)."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()
