"""Large stiff systems from PDEs (method of lines): the peers, and simlib's place among them.

Problems (float64; ``validation/pde_reference.py`` holds the NumPy right-hand sides, the
sparsity patterns from ``simlib.pde`` and the cached references):

* ``bruss1d_N``: the 1-D Brusselator of Hairer and Wanner (II, IV.1), ``N`` interior points,
  ``2N`` states, ``t`` in ``[0, 10]``; banded, bandwidth ``(2, 2)``. Sizes 500 and 5,000
  (1,000 and 10,000 states).
* ``bruss2d_N``: the 2-D Brusselator of SciMLBenchmarks.jl (``Bruss.jmd``), periodic
  ``N x N`` grid, ``2 N^2`` states, ``t`` in ``[0, 11.5]``, forcing from ``t = 1.1``.
  Sizes 32, 128, 256 (2,048, 32,768 and 131,072 states). Periodic in both directions,
  so its pattern is not banded.

Every contender runs at ``rtol`` in ``--rtols`` with ``atol = rtol`` (the states are O(1)),
integrating straight across the forcing's switch as a user would. Reported per run: time
(best of ``--repeats`` after a warm-up; a run slower than 2 s is timed once after its
warm-up, and a run slower than 30 s once, without warm-up), compile time apart (JAX
contenders, compiled ahead of time), accepted steps, evaluations of ``f`` and of the
Jacobian (as each library counts them: CVODE's exclude the difference-quotient
Jacobian's), the error at ``t1`` against the cached reference (``max_i |y_i - ref_i| /
(|ref_i| + atol/rtol)``: tolerance units times rtol), and the process's memory: each
contender runs in its own Python process, which reports its resident memory after
set-up (``base``) and its peak (``peak``, ``ru_maxrss``).

Contenders (ratio = contender time / scipy BDF time in the same run, at the same rtol):

* ``scipy BDF``, ``scipy Radau``: ``solve_ivp`` with ``jac_sparsity`` (the Jacobian by
  grouped finite differences, ``splu`` for the linear systems) and the vectorised NumPy
  right-hand side.
* ``CVODE band``, ``CVODE sparse``, ``CVODE GMRES``: SUNDIALS CVODE (BDF) through
  scikit-sundae with its banded direct solver (finite-difference band Jacobian;
  ``lband``/``uband`` from ``simlib.pde.bandwidth``, 1-D only), its sparse direct solver
  (SuperLU_MT, one thread; the Jacobian by scikit-sundae's grouped finite differences over
  the pattern) and unpreconditioned GMRES (SUNDIALS' defaults: 5 Krylov vectors,
  difference-quotient Jacobian-vector products). ``CVODE GMRES+ILU``: GMRES with scipy's
  ``spilu`` of ``I - gamma J`` (exact sparse Jacobian) as the preconditioner, rebuilt when
  CVODE asks (2-D only; the SciMLBenchmarks' "iLU GMRES"). ``CVODE GMRES+FFT``: GMRES
  preconditioned by the exact FFT inverse of the diffusion part, ``I - gamma alpha lap``:
  a problem-specific preconditioner (periodic, constant coefficients), the best case for
  a Krylov method here, not a general-purpose linear solver.
* ``diffrax Kvaerno5``: ``PIDController(rtol, atol, pcoeff=0.3, icoeff=0.3)``, dense
  Jacobian and LU: only up to 4,096 states (a dense Jacobian of 10,000 states is 800 MB
  and its LU 3e11 flops per factorisation).
* ``simlib BDF (dense)``: today's simlib ``BDF`` with its dense Jacobian and LU, up to
  4,096 states: the "before" figure of issue 23.
* ``simlib BDF (banded)``, ``simlib BDF (sparse)``, ``simlib BDF (Krylov)``: simlib's
  ``BDF`` with ``jac_bandwidth=`` (1-D only: the band Jacobian from 5 JVPs, the native
  banded LU), ``jac_sparsity=`` (one JVP per colour, the native sparse LU on a
  fill-reducing ordering) and ``linear_solver="krylov"`` with ``jac_sparsity`` (GMRES on
  JVPs, ILU(0) of ``I - c J`` as the preconditioner). ``simlib BDF (Krylov+FFT)``:
  ``sl.NewtonKrylov(pde.diffusion_preconditioner(...), rtol=1e-4, restart=5)``, the same
  preconditioner as ``CVODE GMRES+FFT`` from simlib's own module (2-D only).
  ``simlib BDF (sparse + carried rate)``, ``simlib BDF (Krylov+FFT + carried rate)``: the
  same with ``BDF(carry_rate=True, newton_coef=0.03)``, Newton's rate carried across steps
  and CVODE's looser convergence test (one iteration per step where it contracts).

Ensemble baseline (``--ensemble``): 64 parameter sets ``(A, B, alpha) x exp(0.1 normal)``
(numpy ``default_rng(0)``) of ``bruss2d_32`` at rtol 1e-6 with scipy ``BDF`` in a Python
loop over the first ``--scipy-members`` of them, scaled linearly to 64 (marked as such).

Usage::

    python benchmarks/pde.py --quick            # bruss1d_500, bruss2d_32 at rtol 1e-6
    python benchmarks/pde.py                    # the default sizes and rtols below
    python benchmarks/pde.py --sizes bruss2d_128 --rtols 1e-6 --contenders "CVODE GMRES+FFT"
    python -m validation.pde_reference         # (re)compute the cached references first

On a shared machine use ``--single-thread`` (XLA, OpenBLAS and OpenMP on one thread each,
each contender's process pinned to one core: ``benchmarks/_timing.py``, ``pin_to_one_core``)
and compare ratios within one run only.
"""

import os
import sys

from _timing import (  # benchmarks/_timing.py, next to this file; imports no numpy
    Timer,
    best_of,
    compile_jit,
    fmt_load,
    load_average,
    peak_rss_mb,
    rss_mb,
    single_thread_if_asked,
    timed,
)

# before numpy/jax load their thread pools; a contender's process (--worker) on one core
single_thread_if_asked(sys.argv, pin="--worker" in sys.argv)

import argparse  # noqa: E402
import concurrent.futures  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import queue  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simlib (and validation.pde_reference)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy  # noqa: E402
import scipy.sparse  # noqa: E402
import scipy.sparse.linalg  # noqa: E402
from _format import finish, fmt_s, simlib_commit  # noqa: E402  (benchmarks/, next to this file)

import simlib as sl  # noqa: E402
from validation import pde_reference as ref  # noqa: E402

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "pde.json"
DEFAULT_SIZES = ("bruss1d_500", "bruss1d_5000", "bruss2d_32", "bruss2d_128", "bruss2d_256")
QUICK_SIZES = ("bruss1d_500", "bruss2d_32")
DEFAULT_RTOLS = (1e-4, 1e-6, 1e-8)
DENSE_MAX_STATES = 4096
MAX_STEPS = 100_000
WORKER_TIMEOUT_S = 1800
GRADIENT_TAG = "[pde gradient] "  # the gradient worker's progress lines (JSON) on stderr
ONCE_S = 30.0  # a run longer than this is timed once (its first call after compilation)

SCIPY = ("scipy BDF", "scipy Radau")
CVODE = ("CVODE band", "CVODE sparse", "CVODE GMRES", "CVODE GMRES+ILU", "CVODE GMRES+FFT")
DENSE = ("diffrax Kvaerno5", "simlib BDF (dense)")
# simlib's BDF with the banded, sparse and Newton-Krylov linear solvers (issue 23, phase 2):
# jac_bandwidth=prob.bandwidth (1-D only), jac_sparsity=prob.sparsity, and
# linear_solver="krylov" with jac_sparsity (GMRES with an ILU(0) preconditioner)
# and "Krylov+FFT": GMRES(5) at rtol 1e-4 preconditioned by pde.diffusion_preconditioner,
# the exact FFT inverse of the diffusion part, as CVODE GMRES+FFT (2-D only). "+ carried
# rate": the same with BDF(carry_rate=True, newton_coef=0.03), the cheaper Newton iteration
SIMLIB: tuple[str, ...] = ("simlib BDF (banded)", "simlib BDF (sparse)", "simlib BDF (Krylov)",
                           "simlib BDF (Krylov 1e-4)", "simlib BDF (Krylov+FFT)",
                           "simlib BDF (sparse + carried rate)",
                           "simlib BDF (Krylov+FFT + carried rate)")
CARRIED = dict(carry_rate=True, newton_coef=0.03)
KRYLOV_LOOSE_RTOL = 1e-4  # GMRES's relative residual in "simlib BDF (Krylov 1e-4)"
# --gradient-linear-solver fft: reverse mode's transposed solves take GMRES's tolerance too
GRADIENT_FFT_GMRES_RTOL = 1e-8
CONTENDERS = SCIPY + CVODE + DENSE + SIMLIB


def skip_reason(prob: ref.PDEProblem, name: str,
                dense_max: int = DENSE_MAX_STATES) -> str | None:
    """Why ``name`` does not run on ``prob`` (None: it runs)."""
    if name in DENSE and prob.states > dense_max:
        gb = prob.states**2 * 8 / 1e9
        return (f"over --dense-max-states {dense_max:,}: dense Jacobian {prob.states:,}^2 x "
                f"8 B = {gb:.2g} GB, an O(n^3) LU per factorisation")
    if name in ("CVODE band", "simlib BDF (banded)") and (
            prob.bandwidth[0] + prob.bandwidth[1] + 1 > 64):
        return (f"bandwidth {prob.bandwidth} (periodic 2-D grid): the band is the whole "
                "matrix")
    if (name in ("CVODE GMRES+ILU", "CVODE GMRES+FFT", "simlib BDF (Krylov+FFT)",
                 "simlib BDF (Krylov+FFT + carried rate)") and prob.name != "bruss2d"):
        return "2-D problem only (the 1-D one is banded)"
    return None


# --------------------------------------------------------------------------------------
# contenders (each runs in its own process): (rtol) -> dict(y, steps, nfev, njev, nlu, ...)


def fft_preconditioner(prob):
    """simlib's preconditioner of "simlib BDF (Krylov+FFT)": ``(I - c alpha lap)^-1`` by FFT
    (:func:`simlib.pde.diffusion_preconditioner`), the same as CVODE GMRES+FFT's."""
    from simlib import pde

    n, alpha = prob.n, prob.args[2]
    grid = pde.Grid((n, n), spacing=1.0 / (n - 1), bc="periodic")
    return pde.diffusion_preconditioner(grid, alpha, species=2)


def scipy_runner(prob, method):
    def run(rtol):
        y, info = ref.scipy_solve(prob, method, rtol, rtol)
        return dict(y=y, **info)
    return run


def cvode_runner(prob, name):
    import sksundae

    args = prob.args

    def rhs(t, y, yp):
        yp[:] = prob.f_np(t, y, args)

    options = dict(max_num_steps=MAX_STEPS)
    if name == "CVODE band":
        options.update(linsolver="band", lband=prob.bandwidth[0], uband=prob.bandwidth[1])
    elif name == "CVODE sparse":
        options.update(linsolver="sparse", sparsity=prob.sparsity)
    elif name == "CVODE GMRES":
        options.update(linsolver="gmres")
    elif name == "CVODE GMRES+ILU":
        eye = scipy.sparse.eye_array(prob.states, format="csc")
        cache = {}

        def psetup(t, y, yp, jok, jnew, gamma):
            if not jok or "jac" not in cache:
                cache["jac"] = ref.bruss2d_jac_np(t, y, args)
                jnew[0] = 1
            else:
                jnew[0] = 0
            cache["ilu"] = scipy.sparse.linalg.spilu((eye - gamma * cache["jac"]).tocsc())

        def psolve(t, y, yp, r, z, gamma, delta, lr):
            z[:] = cache["ilu"].solve(r)

        options.update(linsolver="gmres",
                       precond=sksundae.cvode.CVODEPrecond(psetup, psolve, side="left"))
    elif name == "CVODE GMRES+FFT":
        options.update(linsolver="gmres", precond=sksundae.cvode.CVODEPrecond(
            None, ref.fft_preconditioner(prob), side="left"))
    else:
        raise ValueError(name)

    def run(rtol):
        solver = sksundae.cvode.CVODE(rhs, rtol=rtol, atol=rtol, **options)
        solver.init_step(0.0, prob.y0)
        steps, t, res = 0, 0.0, None
        while t < prob.t1:  # one internal step at a time: CVODE's accepted steps
            res = solver.step(prob.t1, method="onestep", tstop=prob.t1)
            if not res.success:
                return dict(y=None, steps=steps, nfev=int(res.nfev), njev=int(res.njev),
                            ok=False, message=str(res.message))
            t = float(np.atleast_1d(res.t)[-1])
            steps += 1
        return dict(y=np.array(np.atleast_2d(res.y)[-1]), steps=steps, nfev=int(res.nfev),
                    njev=int(res.njev))
    return run


def jax_runner(prob, name):
    """``(run, compile_s)``: a jitted solve with the tolerances traced."""
    y0 = jnp.asarray(prob.y0)
    args = tuple(jnp.float64(a) for a in prob.args)
    if name == "diffrax Kvaerno5":
        import diffrax

        def solve(rtol, atol):
            sol = diffrax.diffeqsolve(
                diffrax.ODETerm(prob.f), diffrax.Kvaerno5(), 0.0, prob.t1, None, y0,
                args=args, saveat=diffrax.SaveAt(t1=True),
                stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol, pcoeff=0.3,
                                                          icoeff=0.3),
                max_steps=MAX_STEPS, throw=False)
            return (sol.ys[-1], sol.stats["num_accepted_steps"], sol.stats["num_steps"],
                    sol.result == diffrax.RESULTS.successful)
    elif name == "simlib BDF (dense)":
        def solve(rtol, atol):
            sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=sl.BDF(), rtol=rtol, atol=atol,
                           args=args, max_steps=MAX_STEPS, throw=False)
            return (sol.ys[-1], sol.stats["num_accepted"], sol.stats["num_fevals"],
                    sol.result == 0)
    elif name in SIMLIB:
        bdf = sl.BDF(**CARRIED) if name.endswith("carried rate)") else sl.BDF()
        name = name.replace(" + carried rate", "")
        if name == "simlib BDF (Krylov+FFT)":  # 2-D only: its grid is built only here
            options = dict(linear_solver=sl.NewtonKrylov(
                fft_preconditioner(prob), rtol=KRYLOV_LOOSE_RTOL, restart=5))
        else:
            options = {"simlib BDF (banded)": dict(jac_bandwidth=tuple(prob.bandwidth)),
                       "simlib BDF (sparse)": dict(jac_sparsity=prob.sparsity,
                                                   linear_solver="sparse"),
                       "simlib BDF (Krylov)": dict(jac_sparsity=prob.sparsity,
                                                   linear_solver="krylov"),
                       "simlib BDF (Krylov 1e-4)": dict(linear_solver=sl.NewtonKrylov(
                           "ilu0", prob.sparsity, rtol=KRYLOV_LOOSE_RTOL))}[name]

        def solve(rtol, atol):
            sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=bdf, rtol=rtol, atol=atol,
                           args=args, max_steps=MAX_STEPS, throw=False, **options)
            return (sol.ys[-1], sol.stats["num_accepted"], sol.stats["num_fevals"],
                    sol.result == 0)
    else:
        raise ValueError(name)
    compiled, compile_s = compile_jit(solve, jnp.float64(1e-6), jnp.float64(1e-6))

    def run(rtol):
        y, steps, count, ok = compiled(jnp.float64(rtol), jnp.float64(rtol))
        extra = (dict(nfev=int(count)) if name.startswith("simlib")
                 else dict(attempts=int(count)))
        return dict(y=np.asarray(y) if bool(ok) else None, steps=int(steps), ok=bool(ok),
                    **extra)
    return run, compile_s


def worker(spec: dict) -> dict:
    """Run one contender on one problem at one rtol (in this process) and report."""
    prob = ref.problem(spec["problem"], spec["n"]).with_t1(spec.get("t1"))
    name, rtol, repeats = spec["contender"], spec["rtol"], spec["repeats"]
    reference = ref.reference(prob, compute=False)
    compile_s = None
    if name in SCIPY:
        run = scipy_runner(prob, name.split()[1])
    elif name in CVODE:
        run = cvode_runner(prob, name)
    else:
        run, compile_s = jax_runner(prob, name)
    base = rss_mb()
    cpus = []

    def timed():  # the process's CPU seconds per call too (all threads: --single-thread)
        start = cpu_s()
        out = run(rtol)
        cpus.append(cpu_s() - start)
        return out

    # compilation is done (JAX: ahead of time, timed apart): a run over ONCE_S seconds is
    # timed once, its first call
    timing = best_of(timed, repeats=repeats, once_s=ONCE_S)
    out = dict(timing.out)
    y = out.pop("y")
    ok = out.pop("ok", True) and y is not None
    error = None
    if ok and reference is not None:
        error = float(np.max(np.abs(y - reference) / (np.abs(reference) + 1.0)))
    return dict(time=timing.best, times=timing.times, warmup=timing.warmup, compile=compile_s,
                cpu=min(cpus[1:] or cpus), cpus=cpus,
                warmup_only=timing.warmup_only, ok=ok, error=error, rss_base_mb=base,
                rss_peak_mb=peak_rss_mb(), **out)


def cpu_s() -> float:
    """This process's CPU seconds (user + system, all threads)."""
    import resource

    use = resource.getrusage(resource.RUSAGE_SELF)
    return use.ru_utime + use.ru_stime


# the cores a --single-thread contender process is pinned to, one per process at a time
# (--parallel runs several): the cores this process may use
FREE_CORES: queue.Queue = queue.Queue()
for _core in sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]:
    FREE_CORES.put(_core)


def run_in_process(spec: dict, single_thread: bool, timeout: float) -> dict:
    if single_thread and spec.get("contender") not in ENSEMBLE_TWO_DEVICES:
        core = FREE_CORES.get()
        try:
            return _run_in_process(spec, single_thread, timeout,
                                   dict(os.environ, SIMLIB_BENCH_CPU=str(core)))
        finally:
            FREE_CORES.put(core)
    # two devices need two cores: not pinned
    return _run_in_process(spec, single_thread, timeout,
                           dict(os.environ, SIMLIB_BENCH_PIN="0"))


def _run_in_process(spec: dict, single_thread: bool, timeout: float, env: dict) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    if single_thread:
        cmd.append("--single-thread")
    if spec.get("contender") in ENSEMBLE_TWO_DEVICES:
        # first: XLA stops reading its flags at --single-thread's bare
        # "intra_op_parallelism_threads=1" (the device count after it was ignored)
        env["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=2 "
                            + env.get("XLA_FLAGS", "")).strip()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as err:
        out = dict(ok=False, message=f"timed out after {timeout:.0f} s")
        stderr = err.stderr.decode() if isinstance(err.stderr, bytes) else err.stderr or ""
        for line in stderr.splitlines():  # the gradient worker's finished parts
            if line.startswith(GRADIENT_TAG):
                out.update(json.loads(line[len(GRADIENT_TAG):]))
        return out
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return dict(ok=False, message=f"exit {proc.returncode}: {tail[0]}")
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------
# context: one sparse LU, the ensemble baseline


def lu_probe(prob: ref.PDEProblem) -> dict:
    """One ``splu`` of ``I - 1e-3 S`` (S the pattern as ones) with scipy's default ordering:
    the cost of one factorisation in scipy's BDF/Radau and the fill-in's memory."""
    a = (scipy.sparse.eye_array(prob.states) - 1e-3 * prob.sparsity.astype(float)).tocsc()
    lu, secs = timed(lambda: scipy.sparse.linalg.splu(a))
    nnz = int(lu.L.nnz + lu.U.nnz)
    return dict(seconds=secs, nnz_lu=nnz, lu_mb=nnz * 12 / 2**20,
                nnz_jac=int(prob.sparsity.nnz), dense_jac_mb=prob.states**2 * 8 / 2**20)


# "Krylov+FFT + carried rate": as the single solve's contender, with the FFT preconditioner
# of the nominal alpha for every member (each member's own alpha differs by exp(0.1 normal):
# GMRES still solves to its rtol, and the preconditioner is one compiled constant)
FFT_ENSEMBLE = "simlib BDF (Krylov+FFT + carried rate)"
ENSEMBLE_CONTENDERS = ("scipy BDF loop", "simlib BDF (sparse) vmap",
                       "simlib BDF (sparse) sequential", "simlib BDF (sparse) sequential x2",
                       "simlib BDF (Krylov 1e-4) vmap", "simlib BDF (Krylov) vmap",
                       f"{FFT_ENSEMBLE} vmap", f"{FFT_ENSEMBLE} sequential",
                       f"{FFT_ENSEMBLE} sequential x2")
# contenders run on two CPU devices (XLA's host platform split in two: one thread each)
ENSEMBLE_TWO_DEVICES = ("simlib BDF (sparse) sequential x2", f"{FFT_ENSEMBLE} sequential x2")
ENSEMBLE_KEPT = 8  # members whose final states come back, for the errors


def ensemble_params(prob: ref.PDEProblem, members: int) -> np.ndarray:
    """``(A, B, alpha) x exp(0.1 normal)``, numpy ``default_rng(0)``."""
    rng = np.random.default_rng(0)
    return np.asarray(prob.args) * np.exp(0.1 * rng.standard_normal((members, 3)))


def ensemble_worker(spec: dict) -> dict:
    """One ensemble contender: scipy ``BDF`` in a loop over the first ``scipy_members``
    (scaled to all), or simlib ``BDF`` under ``jax.vmap`` over all members (compiled ahead,
    timed once after a warm-up call). Returns the final states of the first
    :data:`ENSEMBLE_KEPT` members for the errors."""
    prob = ref.problem("bruss2d", spec["n"])
    params = ensemble_params(prob, spec["members"])
    name, rtol = spec.get("contender", "scipy BDF loop"), spec["rtol"]
    out = dict(contender=name, members=spec["members"], rtol=rtol)
    if name == "scipy BDF loop":
        steps, finals = [], []

        def loop():
            for p in params[: spec["scipy_members"]]:
                member = ref.PDEProblem(**{**prob.__dict__, "args": tuple(p)})
                y, info = ref.scipy_solve(member, "BDF", rtol, rtol)
                steps.append(info["steps"])
                finals.append(y)

        with Timer() as clock:
            secs = timed(loop)[1]
        scale = spec["members"] / spec["scipy_members"]
        out.update(scipy_members=spec["scipy_members"], params=params.tolist(), steps=steps,
                   seconds_measured=secs, seconds_64=secs * scale,
                   cpu_measured=clock.cpu, cpu_64=clock.cpu * scale,
                   extrapolated=spec["scipy_members"] < spec["members"])
    else:
        fft = sl.NewtonKrylov(fft_preconditioner(prob), rtol=KRYLOV_LOOSE_RTOL, restart=5)
        linear_solver = {
            f"{FFT_ENSEMBLE} vmap": fft, f"{FFT_ENSEMBLE} sequential": fft,
            f"{FFT_ENSEMBLE} sequential x2": fft,
            "simlib BDF (sparse) vmap": sl.SparseLU(prob.sparsity),
            "simlib BDF (sparse) sequential": sl.SparseLU(prob.sparsity),
            "simlib BDF (sparse) sequential x2": sl.SparseLU(prob.sparsity),
            "simlib BDF (Krylov) vmap": sl.NewtonKrylov("ilu0", prob.sparsity),
            "simlib BDF (Krylov 1e-4) vmap": sl.NewtonKrylov("ilu0", prob.sparsity,
                                                             rtol=KRYLOV_LOOSE_RTOL),
        }[name]
        y0 = jnp.asarray(prob.y0)
        bdf = sl.BDF(**CARRIED) if name.startswith(FFT_ENSEMBLE) else sl.BDF()

        def member(p):
            sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=bdf, rtol=rtol, atol=rtol,
                           args=(p[0], p[1], p[2]), max_steps=MAX_STEPS, throw=False,
                           linear_solver=linear_solver)
            return sol.ys[-1], sol.stats["num_accepted"], sol.result

        batched = (sl.ensemble(member, sequential=True, gather=True) if "sequential" in name
                   else jax.vmap(member))
        compiled, compile_s = compile_jit(batched, jnp.asarray(params))
        jax.block_until_ready(compiled(jnp.asarray(params)))  # warm-up
        with Timer() as clock:
            value, secs = timed(lambda: compiled(jnp.asarray(params)))
        y, steps, result = (np.asarray(x) for x in value)
        finals = list(y[:ENSEMBLE_KEPT])
        out.update(seconds_64=secs, cpu_64=clock.cpu, compile=compile_s,
                   devices=len(jax.devices()),
                   steps=steps.tolist(),
                   ok=bool(np.all(result == 0)), failed=int(np.sum(result != 0)))
    out.update(finals=[np.asarray(f).tolist() for f in finals[:ENSEMBLE_KEPT]],
               rss_peak_mb=peak_rss_mb())
    return out


def ensemble_errors(results: dict, n: int, rtol_ref: float = 1e-10) -> dict:
    """Each contender's max error over the first kept members against CVODE-FFT at
    ``rtol_ref`` (computed here, per member); the final states are dropped from the
    results."""
    prob = ref.problem("bruss2d", n)
    runs = [r for r in results.values() if r.get("finals")]
    kept = min(len(r["finals"]) for r in runs) if runs else 0
    params = ensemble_params(prob, 64)[:kept]
    refs = []
    for p in params:
        y, _ = ref.cvode_fft_solve(ref.PDEProblem(**{**prob.__dict__, "args": tuple(p)}),
                                   rtol_ref, rtol_ref)
        refs.append(y)
    for r in results.values():
        finals = r.pop("finals", None)
        if finals:
            r["error"] = float(max(np.max(np.abs(np.asarray(y) - z) / (np.abs(z) + 1.0))
                                   for y, z in zip(finals, refs, strict=False)))
            r["error_members"] = kept
    return dict(reference=f"CVODE BDF + GMRES-FFT at rtol = atol = {rtol_ref:g} per member "
                          "(split at the switch)", members_checked=kept)


def gradient_worker(spec: dict) -> dict:
    """The forward solve and the gradient of ``mean(y(t1)^2)`` w.r.t. ``(A, B, alpha)``
    (adjoint default, and ``ForwardMode()``), compiled ahead, each timed once after a
    warm-up call, with the given linear solver."""
    prob = ref.problem("bruss2d", spec["n"]).with_t1(spec.get("t1"))
    rtol = spec["rtol"]
    linear_solver = {
        "sparse": lambda: sl.SparseLU(prob.sparsity),
        "krylov": lambda: sl.NewtonKrylov("ilu0", prob.sparsity, rtol=spec["gmres_rtol"]),
        "fft": lambda: sl.NewtonKrylov(fft_preconditioner(prob), rtol=spec["gmres_rtol"],
                                       restart=5),
    }[spec["linear_solver"]]()
    y0 = jnp.asarray(prob.y0)

    def loss(p, adjoint=None):
        sol = sl.solve(prob.f, y0, 0.0, prob.t1, solver=sl.BDF(), rtol=rtol, atol=rtol,
                       args=(p[0], p[1], p[2]), max_steps=MAX_STEPS, linear_solver=linear_solver,
                       adjoint=adjoint)
        return jnp.mean(sol.ys[-1] ** 2), sol.stats["num_accepted"]

    p0 = jnp.asarray(prob.args, jnp.float64)
    out = dict(n=prob.n, states=prob.states, t1=prob.t1, rtol=rtol,
               linear_solver=spec["linear_solver"], gmres_rtol=spec.get("gmres_rtol"),
               loss="mean(y(t1)^2)", wrt="(A, B, alpha)")
    print(f"{GRADIENT_TAG}{json.dumps(out, default=float)}", file=sys.stderr, flush=True)
    calls = {"forward": lambda p: loss(p),
             "grad (default adjoint)": jax.grad(lambda p: loss(p)[0]),
             "grad (ForwardMode)": jax.grad(lambda p: loss(p, sl.ForwardMode())[0])}
    for label in spec.get("which", list(calls)):
        try:
            compiled, compile_s = compile_jit(calls[label], p0)
            timing = best_of(lambda c=compiled: c(p0), repeats=1, once_s=ONCE_S)
            value = timing.out
            entry = dict(time=timing.best, compile=compile_s, warmup_only=timing.warmup_only)
            if label == "forward":
                entry.update(loss=float(value[0]), steps=int(value[1]))
            else:
                entry.update(grad=np.asarray(value).tolist())
        except Exception as err:  # noqa: BLE001 - recorded: the figure's cause
            entry = dict(failed=f"{type(err).__name__}: {str(err)[:300]}")
        entry["rss_peak_mb"] = peak_rss_mb()
        out[label] = entry
        # one JSON line per label, so that a run stopped by the timeout keeps what it did
        print(f"{GRADIENT_TAG}{json.dumps({label: entry}, default=float)}", file=sys.stderr,
              flush=True)
    return out


# --------------------------------------------------------------------------------------
# report


def _fmt_err(e) -> str:
    return "-" if e is None else f"{e:.1e}"


def cpu_ratio(row: dict, base: dict | None) -> str:
    """CPU seconds / scipy BDF's (the ratio to read when contenders ran in parallel)."""
    if not base or not row.get("cpu") or not base.get("cpu"):
        return "-"
    return f"{row['cpu'] / base['cpu']:.3g}x"


def report(results: dict) -> str:
    v = results["versions"]
    lines = [f"simlib {sl.__version__} ({results['commit']}) | jax {v['jax']} | scipy "
             f"{v['scipy']} | scikit-sundae {v['sksundae']} (SUNDIALS {v['sundials']}) | "
             f"diffrax {v['diffrax']} | {results['cpus']} cpus | {results['date']}",
             f"load average (1, 5, 15 min) at start {fmt_load(results['load_start'])}, at "
             f"end {fmt_load(results['load_end'])}; "
             + ("single-threaded (--single-thread)" if results["single_thread"]
                else "default threading"),
             "time = best of the timed runs after a warm-up (one timed run when the warm-up "
             "took over 2 s; * = the first call only, over 30 s); compile apart; "
             "steps = accepted steps; error = max_i |y_i - "
             "ref_i| / (|ref_i| + 1) at t1 (atol = rtol); mem = resident MB after set-up / "
             "peak, per process; ratio = time / scipy BDF's time at the same rtol; CPU = the "
             "process's CPU seconds in the timed call (the figure to compare when the "
             "machine is loaded or contenders ran in parallel)", ""]
    for run in results.get("runs", [])[:-1] if len(results.get("runs", [])) > 1 else []:
        lines.insert(-1, f"merged (--append) with the run of {run['date']} ({run['commit']}), "
                     f"load {fmt_load(run['load_start'] or (0, 0, 0))} at its start")
    rows = results["rows"]
    for key in dict.fromkeys(r["key"] for r in rows):
        rs = [r for r in rows if r["key"] == key]
        info = results["problems"][key]
        lines.append(f"{info['label']}: reference {info['reference']}")
        probe = info.get("lu_probe")
        if probe:
            lines.append(f"  Jacobian: {probe['nnz_jac']:,} nonzeros (dense: "
                         f"{probe['dense_jac_mb']:,.0f} MB); one scipy splu of I - gamma J: "
                         f"{fmt_s(probe['seconds'])}, {probe['nnz_lu']:,} nonzeros in L + U "
                         f"({probe['lu_mb']:,.0f} MB); bandwidth {tuple(info['bandwidth'])}")
        for rtol in dict.fromkeys(r["rtol"] for r in rs):
            lines.append(f"  rtol {rtol:g}")
            lines.append(f"    {'contender':20s} {'time':>9s} {'ratio':>7s} {'CPU':>9s} "
                         f"{'CPU ratio':>9s} {'compile':>9s} "
                         f"{'steps':>6s} {'nfev':>7s} {'njev':>5s} {'error':>8s} "
                         f"{'mem MB':>13s}")
            base = next((r for r in rs if r["rtol"] == rtol and r["contender"] == "scipy BDF"
                         and r.get("ok")), None)
            for r in (r for r in rs if r["rtol"] == rtol):
                if r.get("skipped"):
                    lines.append(f"    {r['contender']:20s} skipped: {r['skipped']}")
                    continue
                if not r.get("ok"):
                    lines.append(f"    {r['contender']:20s} FAILED: {r.get('message', '')}")
                    continue
                ratio = f"{r['time'] / base['time']:.3g}x" if base else "-"
                mem = f"{r['rss_base_mb']:.0f}/{r['rss_peak_mb']:.0f}"
                star = "*" if r.get("warmup_only") else ""
                lines.append(
                    f"    {r['contender']:20s} {fmt_s(r['time']) + star:>9s} {ratio:>7s} "
                    f"{fmt_s(r.get('cpu')):>9s} {cpu_ratio(r, base):>9s} "
                    f"{fmt_s(r.get('compile')):>9s} {r.get('steps', 0):>6d} "
                    f"{r.get('nfev', '-')!s:>7s} {r.get('njev', '-')!s:>5s} "
                    f"{_fmt_err(r.get('error')):>8s} {mem:>13s}")
        lines.append("")
    ens = results.get("ensemble")
    if ens and "contenders" in ens:
        lines.append(f"ensemble: {ens['members']} parameter sets (A, B, alpha) x exp(0.1 "
                     f"normal) of bruss2d_{ens['n']} at rtol {ens['rtol']:g}; error = max over "
                     f"the first {ens['members_checked']} members against {ens['reference']}")
        runs = ens["contenders"]
        base = runs.get("scipy BDF loop", {}).get("seconds_64")
        base_cpu = runs.get("scipy BDF loop", {}).get("cpu_64")
        for cname, r in runs.items():
            if "seconds_64" not in r:
                lines.append(f"  {cname:32s} FAILED: {r.get('message', '')}")
                continue
            speed = f"{base / r['seconds_64']:.3g}x" if base else "-"
            if base_cpu and r.get("cpu_64"):  # under load: the work, not the wait
                speed += (f" (CPU {fmt_s(r['cpu_64'])}, "
                          f"{base_cpu / r['cpu_64']:.3g}x)")
            how = (f"extrapolated from {r['scipy_members']} members "
                   f"({fmt_s(r['seconds_measured'])})" if r.get("extrapolated") else
                   f"compile {fmt_s(r.get('compile'))}" if r.get("compile") else "")
            steps = r.get("steps") or [0]
            lines.append(f"  {cname:32s} {fmt_s(r['seconds_64']):>9s}  speed-up {speed:>7s}  "
                         f"error {_fmt_err(r.get('error'))}  steps {min(steps)}-{max(steps)}  "
                         f"peak {r.get('rss_peak_mb', 0):.0f} MB  {how}"
                         + (f"  on {r['devices']} CPU devices" if r.get("devices", 1) > 1
                            else "")
                         + (f"  FAILED members {r['failed']}" if r.get("failed") else ""))
    elif ens:
        lines.append(f"ensemble baseline: {ens['members']} parameter sets of bruss2d_32 at "
                     f"rtol {ens['rtol']:g}, scipy BDF in a Python loop: "
                     f"{fmt_s(ens['seconds_64'])}"
                     + (f" (extrapolated from {ens['scipy_members']} members, "
                        f"{fmt_s(ens['seconds_measured'])})" if ens["extrapolated"] else "")
                     + f"; steps per member {ens['steps']}")
    for gkey in sorted(k for k in results if k.startswith("gradient")):
        lines += gradient_lines(results[gkey])
    return "\n".join(lines)


def gradient_lines(grad: dict) -> list[str]:
    """The report's lines for one ``--gradient`` run."""
    lines = []
    if grad and "forward" in grad:
        lines.append("")
        lines.append(f"gradient of {grad['loss']} w.r.t. {grad['wrt']}: bruss2d_{grad['n']} "
                     f"({grad['states']:,} states), t in [0, {grad['t1']:g}], rtol "
                     f"{grad['rtol']:g}, BDF with the {grad['linear_solver']} linear solver")
        fwd = grad["forward"].get("time")
        for label in ("forward", "grad (default adjoint)", "grad (ForwardMode)"):
            e = grad.get(label)
            if not e:
                continue
            if "failed" in e:
                lines.append(f"  {label:24s} FAILED: {e['failed']}")
                continue
            ratio = f"{e['time'] / fwd:.3g}x forward" if fwd else ""
            lines.append(f"  {label:24s} {fmt_s(e['time']):>9s}  {ratio:>16s}  compile "
                         f"{fmt_s(e['compile'])}  peak {e['rss_peak_mb']:.0f} MB"
                         + (f"  steps {e['steps']}" if "steps" in e else "")
                         + (f"  grad {[f'{g:.4g}' for g in e['grad']]}" if "grad" in e else ""))
        if grad.get("message"):  # stopped by the timeout after these parts
            lines.append(f"  then: {grad['message']}")
    elif grad:
        lines.append(f"gradient: FAILED: {grad.get('message')}"
                     + (f" ({grad['note']})" if grad.get("note") else ""))
    return lines


def versions() -> dict:
    out = dict(jax=jax.__version__, scipy=scipy.__version__, numpy=np.__version__)
    try:
        import sksundae
        out.update(sksundae=sksundae.__version__, sundials=sksundae.SUNDIALS_VERSION)
    except Exception as err:  # noqa: BLE001 - recorded, the CVODE rows then fail loudly
        out.update(sksundae=f"missing ({type(err).__name__})", sundials=None)
    try:
        import diffrax
        out["diffrax"] = diffrax.__version__
    except Exception as err:  # noqa: BLE001
        out["diffrax"] = f"missing ({type(err).__name__})"
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"sizes {', '.join(QUICK_SIZES)} at rtol 1e-6, 1 repeat, "
                        "ensemble from 2 scipy members")
    parser.add_argument("--sizes", default=None,
                        help=f"comma-separated problem keys (default {','.join(DEFAULT_SIZES)})")
    parser.add_argument("--rtols", default=None, help="comma-separated (default 1e-4,1e-6,1e-8)")
    parser.add_argument("--contenders", default=None,
                        help=f"comma-separated subset of: {', '.join(CONTENDERS)}")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs (default 3)")
    parser.add_argument("--ensemble", action="store_true", default=None,
                        help="run the ensemble baseline (default: on, except with --sizes)")
    parser.add_argument("--scipy-members", type=int, default=None,
                        help="ensemble members solved by scipy, scaled to 64 (default 8)")
    parser.add_argument("--dense-max-states", type=int, default=DENSE_MAX_STATES,
                        help="largest system the dense contenders run on (default "
                        f"{DENSE_MAX_STATES})")
    parser.add_argument("--timeout", type=float, default=WORKER_TIMEOUT_S,
                        help="seconds per contender process before it is stopped")
    parser.add_argument("--t1", type=float, default=None,
                        help="a shorter span [0, t1] for --sizes (the key gains _t<t1>; its "
                        "reference is computed, CVODE-FFT at 1e-12, when missing)")
    parser.add_argument("--gradient", default=None, metavar="KEY",
                        help="time the gradient of a loss w.r.t. (A, B, alpha) against the "
                        "forward solve on this problem (e.g. bruss2d_128; with --t1)")
    parser.add_argument("--gradient-linear-solver", default="sparse",
                        choices=("sparse", "krylov", "fft"),
                        help="for --gradient (default sparse; krylov: ILU(0) GMRES at rtol "
                        f"{KRYLOV_LOOSE_RTOL:g}; fft: GMRES(5) with the FFT preconditioner at "
                        f"rtol {GRADIENT_FFT_GMRES_RTOL:g}, 2-D only)")
    parser.add_argument("--ensemble-contenders", default=None,
                        help="comma-separated subset of: " + ", ".join(ENSEMBLE_CONTENDERS))
    parser.add_argument("--single-thread", action="store_true",
                        help="one thread for XLA, OpenBLAS and OpenMP (read before jax loads)")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH, help="results file")
    parser.add_argument("--parallel", type=int, default=1,
                        help="contender processes at a time (default 1; more: compare the "
                        "CPU seconds, reported per row, not the wall times)")
    parser.add_argument("--append", action="store_true",
                        help="merge into the results file (rows of the same problem, "
                        "contender and rtol replaced) instead of overwriting it")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        spec = json.loads(opts.worker)
        out = (ensemble_worker(spec) if spec.get("ensemble") else
               gradient_worker(spec) if spec.get("gradient") else worker(spec))
        print(json.dumps(out, default=float))
        return 0

    sizes = ([k for k in opts.sizes.split(",") if k] if opts.sizes is not None else
             QUICK_SIZES if opts.quick else DEFAULT_SIZES)
    rtols = ([float(r) for r in opts.rtols.split(",")] if opts.rtols else
             [1e-6] if opts.quick else list(DEFAULT_RTOLS))
    names = [c.strip() for c in opts.contenders.split(",")] if opts.contenders else CONTENDERS
    unknown = [c for c in names if c not in CONTENDERS]
    if unknown:
        parser.error(f"unknown contenders {unknown}; choose from {list(CONTENDERS)}")
    repeats = opts.repeats or (1 if opts.quick else 3)
    if repeats < 1:
        parser.error(f"--repeats must be >= 1, got {repeats}")
    run_ensemble = opts.ensemble if opts.ensemble is not None else opts.sizes is None
    scipy_members = opts.scipy_members or (2 if opts.quick else 8)

    clock = Timer().start()
    results = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                   commit=simlib_commit(ROOT), versions=versions(),
                   cpus=len(os.sched_getaffinity(0)), platform=platform.platform(),
                   single_thread=opts.single_thread, repeats=repeats, rtols=rtols,
                   dense_max_states=opts.dense_max_states,
                   load_start=load_average(), problems={}, rows=[], targets=[])
    pending = []
    for key in sizes:
        name, n = key.rsplit("_", 1)
        prob = ref.problem(name, int(n)).with_t1(opts.t1)
        key = prob.key
        if ref.reference(prob, compute=False) is None:
            print(f"[pde] {key}: computing the reference ...", flush=True)
            ref.reference(prob)
        results["problems"][key] = dict(label=prob.label, states=prob.states,
                                        reference=ref.reference_note(prob),
                                        bandwidth=list(prob.bandwidth),
                                        lu_probe=lu_probe(prob) if prob.states <= 40_000
                                        else None)
        for rtol in rtols:
            for cname in names:
                row = dict(key=key, problem=name, n=prob.n, states=prob.states, t1=prob.t1,
                           contender=cname, rtol=rtol, atol=rtol)
                why = skip_reason(prob, cname, opts.dense_max_states)
                if why:
                    row.update(skipped=why, ok=False)
                else:
                    row["spec"] = dict(problem=name, n=prob.n, contender=cname, rtol=rtol,
                                       repeats=repeats, t1=prob.t1)
                pending.append(row)
    # contenders in turn, or --parallel at a time (then compare CPU seconds, not wall time)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, opts.parallel)) as pool:
        futures = [pool.submit(run_in_process, row["spec"], opts.single_thread, opts.timeout)
                   if "spec" in row else None for row in pending]
        for row, fut in zip(pending, futures, strict=True):
            if fut is not None:
                row.update(fut.result())
                row.pop("spec")
            results["rows"].append(row)
            shown = (f"skipped ({row['skipped']})" if row.get("skipped") else
                     f"{fmt_s(row['time'])} (CPU {fmt_s(row.get('cpu'))}), "
                     f"{row.get('steps')} steps, error {_fmt_err(row.get('error'))}, peak "
                     f"{row['rss_peak_mb']:.0f} MB"
                     if row.get("ok") else f"FAILED: {row.get('message')}")
            print(f"[pde] {row['key']} rtol {row['rtol']:g} {row['contender']}: {shown}",
                  flush=True)
    if run_ensemble:
        ens_names = ([c.strip() for c in opts.ensemble_contenders.split(",")]
                     if opts.ensemble_contenders else list(ENSEMBLE_CONTENDERS))
        bad = [c for c in ens_names if c not in ENSEMBLE_CONTENDERS]
        if bad:
            parser.error(f"unknown ensemble contenders {bad}; choose from "
                         f"{list(ENSEMBLE_CONTENDERS)}")
        ens = {}
        for cname in ens_names:
            print(f"[pde] ensemble: {cname} ...", flush=True)
            spec = dict(ensemble=True, n=32, members=64, scipy_members=scipy_members,
                        rtol=1e-6, contender=cname)
            ens[cname] = run_in_process(spec, opts.single_thread, opts.timeout)
            print(f"[pde] ensemble: {cname}: {ens[cname].get('seconds_64')} s "
                  f"{ens[cname].get('message', '')}", flush=True)
        info = ensemble_errors(ens, 32)
        results["ensemble"] = dict(members=64, rtol=1e-6, n=32, scipy_members=scipy_members,
                                   contenders=ens, **info)
    if opts.gradient:
        name, n = opts.gradient.rsplit("_", 1)
        spec = dict(gradient=True, n=int(n), t1=opts.t1, rtol=1e-6,
                    linear_solver=opts.gradient_linear_solver,
                    gmres_rtol=(GRADIENT_FFT_GMRES_RTOL if opts.gradient_linear_solver == "fft"
                                else KRYLOV_LOOSE_RTOL))
        print(f"[pde] gradient on {opts.gradient} ...", flush=True)
        results["gradient"] = run_in_process(spec, opts.single_thread, opts.timeout)
    results["wall_s"] = clock.stop()
    results["load_end"] = load_average()
    if opts.append and opts.json.exists():
        results = merge(json.loads(opts.json.read_text()), results)
    results["targets"] = targets(results)
    return finish(results, report(results), opts.json)


def targets(results: dict) -> list[dict]:
    """Issue 23's targets, from the rows (the largest span measured per size; CPU seconds
    where both rows have them, else wall time)."""
    ok = [r for r in results["rows"] if r.get("ok")]

    def best(prefix, key):
        rs = [r for r in ok if r["key"] == key and r["contender"].startswith(prefix)
              and "dense" not in r["contender"]]
        return min(rs, key=lambda r: r.get("cpu") or r["time"]) if rs else None

    def secs(a, b):
        return (a["cpu"], b["cpu"], "CPU s") if a.get("cpu") and b.get("cpu") else (
            a["time"], b["time"], "wall s")

    out = []

    def add(target, need, value, note, higher=True):
        status = ("NOT MEASURED" if value is None else
                  "MET" if (value >= need if higher else value <= need) else "MISSED")
        out.append(dict(target=target, need=need, value=value, status=status, note=note))

    for states, size in ((32_768, "bruss2d_128"), (131_072, "bruss2d_256")):
        keys = sorted({r["key"] for r in ok if r["key"].split("_t")[0] == size}, key=len)
        key = next((k for k in keys if best("scipy BDF", k) and best("simlib", k)), None)
        if key:
            sim, sci = best("simlib", key), best("scipy BDF", key)
            a, b, unit = secs(sci, sim)
            add(f"{states:,} states: scipy BDF / simlib >= 3", 3.0, a / b,
                f"{key}, {sim['contender']}, {unit}")
        else:
            add(f"{states:,} states: scipy BDF / simlib >= 3", 3.0, None,
                "scipy BDF did not finish on any span measured")
    key = next((k for k in sorted({r["key"] for r in ok if r["key"].startswith("bruss2d_128")},
                                  key=len) if best("CVODE", k) and best("simlib", k)), None)
    if key:
        sim, cv = best("simlib", key), best("CVODE", key)
        a, b, unit = secs(cv, sim)
        add("32,768 states: CVODE best / simlib >= 1", 1.0, a / b,
            f"{key}, {cv['contender']} vs {sim['contender']}, {unit}")
        general = best("CVODE sparse", key)
        if general:
            a, b, unit = secs(general, sim)
            add("32,768 states: CVODE sparse (general-purpose) / simlib >= 1", 1.0, a / b,
                f"{key}, {unit} (CVODE GMRES+FFT's preconditioner is specific to this "
                "problem)")
    else:
        add("32,768 states: CVODE best / simlib >= 1", 1.0, None, "not measured")
    big = [r for r in ok if r["key"].startswith("bruss2d_256") and r["contender"].startswith(
        "simlib")]
    if big:
        r = min(big, key=lambda r: r["rss_peak_mb"])
        add("131,072 states: simlib peak RSS <= 1000 MB", 1000.0, r["rss_peak_mb"],
            f"{r['key']}, {r['contender']}", higher=False)
    ens = results.get("ensemble") or {}
    runs = ens.get("contenders") or {}
    # wall seconds on an idle machine (the contenders run one after the other; scipy's loop
    # takes one core, an ensemble on two CPU devices both); CPU seconds under load, where
    # the wall time measures the wait
    idle = (results.get("load_start") or [99])[0] < 1.5
    ens_key = ("seconds_64" if idle or not (runs.get("scipy BDF loop", {}).get("cpu_64") and all(
        r.get("cpu_64") for k, r in runs.items() if r.get("seconds_64"))) else "cpu_64")
    base = runs.get("scipy BDF loop", {}).get(ens_key)
    simruns = {k: r for k, r in runs.items() if k != "scipy BDF loop" and r.get(ens_key)}
    fastest = min(simruns, key=lambda k: simruns[k][ens_key]) if simruns else None
    note = results.get("ensemble_note") or "see the ensemble lines of the report"
    if fastest and base:
        r = simruns[fastest]
        cpu = runs["scipy BDF loop"].get("cpu_64")
        note = (f"{fastest}, {'wall' if ens_key == 'seconds_64' else 'CPU'} s"
                + (f"; by CPU s {cpu / r['cpu_64']:.3g}x" if cpu and r.get("cpu_64") else ""))
    add("ensemble of 64 x 2,048 states: scipy loop / simlib >= 20", 20.0,
        base / simruns[fastest][ens_key] if base and fastest else None, note)
    for gkey in sorted(k for k in results if k.startswith("gradient")):
        grad = results[gkey] or {}
        fwd = (grad.get("forward") or {}).get("time")
        gs = [grad[k]["time"] for k in ("grad (default adjoint)", "grad (ForwardMode)")
              if (grad.get(k) or {}).get("time")]
        states = grad.get("states") or 32_768
        add(f"gradient / forward <= 10 ({states:,} states)", 10.0,
            min(gs) / fwd if fwd and gs else None,
            grad.get("note") or (f"t in [0, {grad.get('t1')}], best of the default adjoint "
                                 "and ForwardMode" if grad else "not measured"),
            higher=False)
    return out


RUN_FIELDS = ("date", "commit", "versions", "cpus", "single_thread", "repeats", "load_start",
              "load_end", "wall_s")


def merge(old: dict, new: dict) -> dict:
    """``new`` added to ``old`` (``--append``): rows of the same problem, contender and rtol
    replaced, the others kept; problems, ensemble and gradient taken from ``new`` where it
    has them; ``runs`` lists every run's date, commit, versions and load."""
    runs = old.get("runs") or [{k: old.get(k) for k in RUN_FIELDS}]
    ident = lambda r: (r["key"], r["contender"], r["rtol"])  # noqa: E731
    replaced = {ident(r) for r in new["rows"]}
    out = dict(old)
    out.update({k: new[k] for k in RUN_FIELDS if k in new})
    out["rows"] = [r for r in old["rows"] if ident(r) not in replaced] + new["rows"]
    out["problems"] = {**old.get("problems", {}), **new.get("problems", {})}
    for k in new:
        if (k == "ensemble" or k.startswith("gradient")) and new[k]:
            out[k] = new[k]
    out["runs"] = runs + [{k: new.get(k) for k in RUN_FIELDS}]
    return out


if __name__ == "__main__":
    sys.exit(main())
