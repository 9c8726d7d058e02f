"""Timing helpers shared by the benchmark scripts: warm-up, best of k, compile time apart,
the machine's load, and a process's peak memory. Every script in ``benchmarks/`` times
through this module; none keeps its own copy of these loops.

Rules every script states in its report:

* a jitted contender is compiled first (:func:`compile_jit`: the wall time of
  ``jax.jit(fn).lower(*args).compile()``, reported apart from the run time; ``cold=True``
  clears JAX's caches first, ``repeats`` takes the best of several compilations;
  :func:`compile_stages` splits it into trace, lower and XLA compile;
  :func:`compile_by_first_call` is the first call's time less the next call's, for code
  that cannot be lowered ahead; :class:`CompileWatch` adds up the compilations JAX reports
  while a block runs);
* a run time is the best of ``repeats`` calls after one untimed warm-up call
  (:func:`best_of`); a call whose warm-up took longer than ``slow_s`` seconds is timed
  ``slow_repeats`` times (once by default) only, so that one slow contender does not take
  the whole budget, and one whose warm-up took longer than ``once_s`` (given for code with
  nothing to compile or cache) is not run again: its warm-up is its time
  (``Timing.warmup_only``);
* contenders compared in one table are timed round-robin, repeat by repeat
  (:func:`round_robin`), so a change in the machine's load hits them alike;
* one call, or a block of code, is timed by :func:`timed` or :class:`Timer` (wall and
  process CPU seconds, the load at its start);
* the load average is recorded at the start and the end of a run (:func:`load_average`,
  :func:`load1`), and peak memory is read per process (:func:`peak_rss_mb`; run each
  contender in its own process to get its own peak).

Calls are blocked with ``jax.block_until_ready`` when JAX is loaded (a no-op on NumPy and
other host results), so that a time is the computation's and not its dispatch's.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Hashable, Mapping
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

    @property
    def median(self) -> float:
        """The median of the timed calls (seconds)."""
        return float(statistics.median(self.times))


def _block(x: Any) -> Any:
    """``jax.block_until_ready`` when JAX is loaded (a no-op on NumPy results)."""
    jax = sys.modules.get("jax")
    return jax.block_until_ready(x) if jax is not None else x


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    """``(output, seconds)`` of one call of ``call()``, blocked until its output is ready."""
    start = time.perf_counter()
    out = _block(call())
    return out, time.perf_counter() - start


def best_of(call: Callable[[], Any], repeats: int = 3, slow_s: float = 2.0,
            once_s: float | None = None, *, slow_repeats: int = 1,
            warmup: bool = True) -> Timing:
    """Best wall time of ``call()`` over ``repeats`` calls after an untimed warm-up call
    (``slow_repeats`` timed calls, one by default, when the warm-up took more than ``slow_s``
    seconds; none, the warm-up being the time, when it took more than ``once_s``).
    ``warmup=False``: no warm-up call (the caller made one)."""
    return round_robin({0: call}, repeats, slow_s, once_s, slow_repeats=slow_repeats,
                       warmup=warmup)[0]


def round_robin(calls: Mapping[Hashable, Callable[[], Any]],
                repeats: int | Mapping[Hashable, int] = 3, slow_s: float = 2.0,
                once_s: float | None = None, *, slow_repeats: int = 1,
                warmed: Mapping[Hashable, Timing] | None = None,
                warmup: bool = True) -> dict[Hashable, Timing]:
    """:func:`best_of` for several zero-argument calls, timed in turn repeat by repeat;
    ``{key: Timing}``.

    ``repeats`` is one count for all or a count per key. ``warmed`` holds the warm-ups
    (:func:`warm_up`) the caller already made, keyed as ``calls``; the other calls are
    warmed up here, in order, unless ``warmup=False``."""
    counts = repeats if isinstance(repeats, Mapping) else dict.fromkeys(calls, repeats)
    if any(n < 1 for n in counts.values()):
        raise ValueError(f"round_robin: repeats must be >= 1, got {repeats}")
    out = dict(warmed or {})
    for key, call in calls.items():
        if key not in out:
            out[key] = warm_up(call, once_s) if warmup else Timing(best=float("inf"))
    reps = {key: (0 if out[key].warmup_only
                  else slow_repeats if out[key].warmup > slow_s else counts[key])
            for key in calls}
    for i in range(max(reps.values(), default=0)):
        for key, call in calls.items():
            if i < reps[key]:
                out[key].times.append(timed(call)[1])
    for key in calls:
        out[key].best = min(out[key].times)
    return {key: out[key] for key in calls}


def warm_up(call: Callable[[], Any], once_s: float | None = None) -> Timing:
    """The warm-up call of :func:`round_robin`: its time and output, and (when it took
    more than ``once_s`` seconds) the warm-up as the only timed call."""
    result, secs = timed(call)
    timing = Timing(best=float("inf"), warmup=secs, out=result)
    if once_s is not None and secs > once_s:
        timing.times, timing.warmup_only = [secs], True
    return timing


def compile_jit(fn: Callable, *args: Any, cold: bool = False,
                repeats: int = 1) -> tuple[Callable, float]:
    """``(executable, seconds)`` of ``jax.jit(fn).lower(*args).compile()`` (``fn.lower``
    where ``fn`` is jitted already); ``cold``: JAX's caches cleared before each
    compilation; the best of ``repeats`` compilations."""
    import jax

    jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
    best, compiled = float("inf"), None
    for _ in range(repeats):
        if cold:
            jax.clear_caches()
        start = time.perf_counter()
        compiled = jitted.lower(*args).compile()
        best = min(best, time.perf_counter() - start)
    return compiled, best


def compile_stages(fn: Callable, *args: Any, cold: bool = True,
                   repeats: int = 1) -> tuple[Any, tuple[float, float, float]]:
    """``(traced, (trace_s, lower_s, compile_s))``: ``jax.jit(fn).trace(*args)``, its
    ``lower()`` and the XLA ``compile()`` timed apart, each the best of ``repeats``."""
    import jax

    best = [float("inf")] * 3
    traced = None
    for _ in range(repeats):
        if cold:
            jax.clear_caches()
        t0 = time.perf_counter()
        traced = jax.jit(fn).trace(*args)
        t1 = time.perf_counter()
        lowered = traced.lower()
        t2 = time.perf_counter()
        lowered.compile()
        t3 = time.perf_counter()
        best = [min(b, x) for b, x in zip(best, (t1 - t0, t2 - t1, t3 - t2), strict=True)]
    return traced, (best[0], best[1], best[2])


def compile_by_first_call(call: Callable[[], Any], cold: bool = True) -> float:
    """The compile time of code that is not lowered ahead: the first call's time (after
    clearing JAX's caches when ``cold``) less the next call's, at least 0."""
    if cold:
        import jax

        jax.clear_caches()
    first = timed(call)[1]
    return max(0.0, first - timed(call)[1])


class CompileWatch:
    """Counts XLA compilations and adds up trace / lowering / compile seconds (from
    ``jax.monitoring``) while the ``with`` block runs."""

    EVENTS = {
        "/jax/core/compile/jaxpr_trace_duration": "trace",
        "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower",
        "/jax/core/compile/backend_compile_duration": "backend",
    }
    _active: list = []
    _installed = False

    def __init__(self) -> None:
        self.seconds = dict(trace=0.0, lower=0.0, backend=0.0)
        self.compiles = 0
        self.names: list[str] = []

    @classmethod
    def _listener(cls, event: str, duration: float, **kw: Any) -> None:
        kind = cls.EVENTS.get(event)
        if kind is None:
            return
        for w in cls._active:
            w.seconds[kind] += duration
            if kind == "backend":
                w.compiles += 1
                w.names.append(f"{kw.get('fun_name', '?')} {duration:.3f}s")

    def __enter__(self) -> CompileWatch:
        import jax

        if not CompileWatch._installed:
            jax.monitoring.register_event_duration_secs_listener(CompileWatch._listener)
            CompileWatch._installed = True
        CompileWatch._active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        CompileWatch._active.remove(self)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


class Timer:
    """Wall and process CPU time (all threads) of a block, and the 1-minute load average at
    its start; cpu/wall ~ threads busy. A ``with`` block, or :meth:`start` and
    :meth:`stop` where the span is not one block."""

    def start(self) -> Timer:
        self.load = load1()
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    @property
    def elapsed(self) -> float:
        """Wall seconds since :meth:`start`."""
        return time.perf_counter() - self.wall0

    def stop(self) -> float:
        """Ends the span; its wall seconds."""
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        return self.wall

    def __enter__(self) -> Timer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def single_thread_if_asked(argv: list[str], pin: bool = True) -> bool:
    """With ``--single-thread`` in ``argv``: XLA, OpenBLAS, OpenMP and MKL on one thread
    each, and (``pin``) the process on one core (:func:`pin_to_one_core`). Call it before
    numpy or jax is imported (they read these at load). Returns whether it did."""
    if "--single-thread" not in argv:
        return False
    # (a bare "intra_op_parallelism_threads=1" stood here: not an XLA flag, and XLA ignored
    # every flag after it, such as a device count appended later)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_cpu_multi_thread_eigen=false").strip()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    if pin:
        pin_to_one_core()
    return True


def pin_to_one_core() -> int | None:
    """Pin this process to one core: ``$SIMLIB_BENCH_CPU`` if set, else the first it may
    use; nothing when ``$SIMLIB_BENCH_PIN`` is ``0`` or the platform has no affinity.
    Returns the core. XLA's CPU client sizes its thread pool by the cores it may use: with
    two, a loop of small kernels is handed between two pool threads, and the one waiting
    spins (measured on the 10,000-state Brusselator: 185 ms of CPU in 159 ms of wall time;
    pinned, 159 and 159), which a CPU-time comparison would count against the JAX
    contenders. Call it before jax is imported."""
    if os.environ.get("SIMLIB_BENCH_PIN") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    core = int(os.environ.get("SIMLIB_BENCH_CPU", allowed[0]))
    os.sched_setaffinity(0, {core})
    return core


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages."""
    return os.getloadavg()


def load1() -> float:
    """The 1-minute load average, rounded to 2 decimals."""
    return round(load_average()[0], 2)


def fmt_load(avg: tuple[float, ...]) -> str:
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
