"""Index-1 DAEs ``M y' = f``: simlib against SUNDIALS IDA on the Bari test set's problems.

Problems (:mod:`simlib.systems`, as the test set's Fortran writes them; Mazzia and
Magherini, *Test Set for IVP Solvers*, release 2.4): the chemical Akzo Nobel problem
(6 states, ``M = diag(1, 1, 1, 1, 1, 0)``, ``t`` in ``[0, 180]``) and the transistor
amplifier (8 states, ``M`` of rank 5, ``t`` in ``[0, 0.2]``). ``atol = rtol * 1e-2``
(Akzo Nobel) and ``rtol * 1e-3`` (amplifier), as in ``validation/dae.py``.

The three targets of issue 24, each in one run (ratios within it):

1. ``single``: one solve of each problem at rtol 1e-6: simlib ``Rodas5P`` and ``BDF``
   (jitted; compile time apart) against IDA (scikit-sundae: variable-order BDF, numpy
   residual ``M y' - f`` from ``validation/dae_reference.py``, dense direct linear solver
   with IDA's finite-difference Jacobian), with the accuracy of each: the test set's
   significant correct digits ``min_i -log10(|y_i - ref_i| / |ref_i|)`` against the
   published solution. IDA is also timed at a tighter rtol where that reaches simlib's
   accuracy cheaply (Akzo Nobel). Target: simlib no slower than IDA at equal or better
   accuracy.
2. ``ensemble``: 1,000 parameter sets of Akzo Nobel (``k1..k4`` and ``klA`` times
   ``exp(0.2 N(0, 1))``, numpy ``default_rng(0)``), simlib ``Rodas5P`` under
   ``jax.jit(jax.vmap(...))`` against IDA in a Python loop over the first
   ``--ida-members`` of them, its time scaled linearly to 1,000 (marked as such), the two
   timed round-robin (best of ``--repeats`` each); the two agree member by member
   (reported). Target: simlib at least 20x faster.
   ``--ensemble-driver solve_ensemble`` runs the members through ``solve_ensemble``
   instead (``M`` shared, the parameters per member, finished members dropped).
3. ``gradient``: ``jax.grad`` of ``L = mean_i U8(t_i)^2`` (the amplifier's output node at
   100 times in ``(0, 0.2]``) with respect to the ten resistances and five capacitances
   (the capacitances enter through ``M``), simlib ``Rodas5P`` with its default adjoint,
   against the forward solve of the same loss. Target: gradient at most 10x the forward.

Times are the best of ``--repeats`` after a warm-up (``benchmarks/_timing.py``); a run
slower than 2 s is timed once after its warm-up. Results go to
``benchmarks/results/dae.json``.

Usage::

    python benchmarks/dae.py                  # all three (about 2 minutes)
    python benchmarks/dae.py --parts single,gradient --repeats 5
    bash benchmarks/install_peers.sh          # scikit-sundae (IDA), if missing
"""

import os
import sys

from _timing import single_thread_if_asked  # benchmarks/_timing.py; imports no numpy

single_thread_if_asked(sys.argv)  # before numpy/jax load their thread pools

import argparse  # noqa: E402
import datetime  # noqa: E402
import logging  # noqa: E402
import platform  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's simlib (and validation.dae_reference)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _format import finish, fmt_r, fmt_s, simlib_commit  # noqa: E402
from _timing import (  # noqa: E402
    Timer,
    best_of,
    compile_jit,
    fmt_load,
    load_average,
    round_robin,
    timed,
)

import simlib as sl  # noqa: E402

if "--fast-cpu-loops" in sys.argv:  # before JAX starts its CPU backend (docs/gradients.md)
    sl.fast_cpu_loops()

from simlib.systems import AKZO_NOBEL, TRANSISTOR_AMPLIFIER, scd  # noqa: E402
from validation import dae_reference as ida  # noqa: E402
from validation.dae import ATOL_PER_RTOL  # noqa: E402

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "dae.json"
PARTS = ("single", "ensemble", "gradient", "profile")
RTOL = 1e-6
SOLVERS = ("Rodas5P", "BDF")
IDA_TIGHTER = {"akzo_nobel": 1e-8}  # IDA again at this rtol (matching simlib's digits)
N_ENSEMBLE = 1000
GRAD_TIMES = 100
MAX_STEPS = 200_000


def _solve_fn(problem, solver: str, rtol: float):
    """``run(args) -> y(t1), result`` for ``problem`` (jit-ready; ``M`` from ``args``)."""
    y0 = jnp.asarray(problem.y0)
    method = getattr(sl, solver)()
    atol = rtol * ATOL_PER_RTOL[problem.name]

    def run(args):
        sol = sl.solve(problem.vector_field, y0, problem.t0, problem.t1, solver=method,
                       rtol=rtol, atol=atol, args=args, max_steps=MAX_STEPS, throw=False,
                       mass_matrix=problem.mass_matrix(args))
        return sol.ys[-1], sol.result, sol.stats["num_accepted"], sol.stats["num_steps"]

    return run


def bench_single(repeats: int) -> list[dict]:
    rows = []
    for prob in (AKZO_NOBEL, TRANSISTOR_AMPLIFIER):
        args = tuple(jnp.asarray(a) for a in prob.args)
        for solver in SOLVERS:
            fn, compile_s = compile_jit(_solve_fn(prob, solver, RTOL), args)
            t = best_of(lambda fn=fn, args=args: fn(args), repeats)
            y, result, steps, _ = t.out
            rows.append(dict(problem=prob.name, contender=f"simlib {solver}", rtol=RTOL,
                             seconds=t.best, compile_s=compile_s, steps=int(steps),
                             result=int(result),
                             scd=float(np.min(scd(np.asarray(y), prob.reference)))))
            print(f"[dae] {prob.name} simlib {solver}: {fmt_s(t.best)} "
                  f"(compile {compile_s:.1f} s), scd {rows[-1]['scd']:.2f}", flush=True)
        for rtol in (RTOL, IDA_TIGHTER.get(prob.name)):
            if rtol is None or not ida.available():
                continue
            atol = rtol * ATOL_PER_RTOL[prob.name]
            t = best_of(lambda p=prob, r=rtol, a=atol: ida.ida_solve(p, r, a), repeats)
            rows.append(dict(problem=prob.name, contender="IDA (dense)", rtol=rtol,
                             seconds=t.best, compile_s=None, steps=t.out.steps, result=0,
                             scd=float(np.min(scd(t.out.y1, prob.reference)))))
            print(f"[dae] {prob.name} IDA rtol {rtol:g}: {fmt_s(t.best)}, "
                  f"scd {rows[-1]['scd']:.2f}", flush=True)
    return rows


def akzo_parameter_sets(n: int) -> np.ndarray:
    """``(n, 9)`` Akzo Nobel parameters: ``k1..k4, klA`` times ``exp(0.2 N(0, 1))``."""
    rng = np.random.default_rng(0)
    p = np.tile(np.asarray(AKZO_NOBEL.args), (n, 1))
    for i in (0, 1, 2, 3, 5):
        p[:, i] *= np.exp(0.2 * rng.standard_normal(n))
    return p


def _ensemble_fn(problem, solver: str, rtol: float):
    """``run(params) -> y(t1), result, steps`` per member through ``solve_ensemble`` (eager:
    its first call compiles; ``M`` shared, ``args`` per member)."""
    y0 = jnp.asarray(problem.y0)
    method = getattr(sl, solver)()
    atol = rtol * ATOL_PER_RTOL[problem.name]
    mass = problem.mass_matrix()

    def run(params):
        args = tuple(params[:, i] for i in range(params.shape[1]))
        y0s = jnp.broadcast_to(y0, (params.shape[0], y0.size))
        sol = sl.solve_ensemble(problem.vector_field, y0s, problem.t0, problem.t1,
                                solver=method, rtol=rtol, atol=atol, args=args, args_axes=0,
                                max_steps=MAX_STEPS, throw=False, mass_matrix=mass)
        return jax.block_until_ready((sol.ys[:, -1], sol.result, sol.stats["num_accepted"],
                                      sol.stats["num_steps"]))

    return run


def bench_ensemble(repeats: int, ida_members: int, driver: str = "vmap") -> dict:
    params = akzo_parameter_sets(N_ENSEMBLE)
    pj = jnp.asarray(params)
    if driver == "vmap":
        one = _solve_fn(AKZO_NOBEL, "Rodas5P", RTOL)
        batched = jax.vmap(lambda p: one(tuple(p[i] for i in range(9))))
        fn, compile_s = compile_jit(batched, pj)
    else:  # solve_ensemble: its compile is the first call's time less a later call's
        fn = _ensemble_fn(AKZO_NOBEL, "Rodas5P", RTOL)
        compile_s = timed(lambda: fn(pj))[1]
    atol = RTOL * ATOL_PER_RTOL["akzo_nobel"]
    calls = {"simlib": lambda: fn(pj)}
    if ida.available():  # timed round-robin with simlib: a change of load hits both
        calls["IDA"] = lambda: [ida.ida_solve(AKZO_NOBEL, RTOL, atol, args=tuple(params[i])).y1
                                for i in range(ida_members)]
    times = round_robin(calls, repeats)
    t = times["simlib"]
    if driver != "vmap":
        compile_s = max(compile_s - t.best, 0.0)
    ys, results, steps = (np.asarray(x) for x in t.out[:3])
    attempts = np.asarray(t.out[3])
    out = dict(members=N_ENSEMBLE, rtol=RTOL, driver=driver, simlib_seconds=t.best,
               compile_s=compile_s, simlib_failed=int(np.sum(results != 0)),
               max_steps=int(steps.max()), mean_steps=float(steps.mean()),
               max_attempts=int(attempts.max()), mean_attempts=float(attempts.mean()))
    print(f"[dae] ensemble simlib ({driver}): {fmt_s(t.best)} for {N_ENSEMBLE} "
          f"(compile {compile_s:.1f} s)", flush=True)
    if "IDA" in times:
        secs = times["IDA"].best
        ida_ys = times["IDA"].out
        diff = np.abs(np.array(ida_ys) - ys[:ida_members]) / np.abs(ys[:ida_members])
        out.update(ida_members=ida_members, ida_seconds_measured=secs,
                   ida_seconds_scaled=secs * N_ENSEMBLE / ida_members,
                   speedup=secs * N_ENSEMBLE / ida_members / t.best,
                   max_rel_disagreement=float(diff.max()))
        print(f"[dae] ensemble IDA: {fmt_s(secs)} for {ida_members} (scaled "
              f"{fmt_s(out['ida_seconds_scaled'])}); speedup {out['speedup']:.1f}x", flush=True)
    return out


def _akzo_batch(n: int):
    """``(f, params, states, args_of)``: Akzo Nobel's field, ``n`` parameter sets, ``n``
    states near ``y0`` (as the ensemble meets them) and the tuple of one member's args."""
    params = jnp.asarray(akzo_parameter_sets(n))
    y0 = jnp.asarray(AKZO_NOBEL.y0)
    states = y0 * (1 + 0.01 * jnp.arange(n)[:, None] / n) + 1e-4

    def args_of(p):
        return tuple(p[i] for i in range(p.shape[0]))

    return AKZO_NOBEL.vector_field, params, states, args_of


def bench_profile(repeats: int) -> dict:
    """Where the 1,000-member Akzo Nobel ensemble's time goes under ``vmap``: each piece of
    a Rodas5P step batched over the members (one evaluation of ``f``, the Jacobian, LAPACK's
    LU, one stage solve by LAPACK's ``trsm`` and by written-out substitution, a whole
    step), the whole ``jax.jit(jax.vmap(solve))`` with each triangular solve and each stiff
    solver, per loop iteration (the batched loop runs the slowest member's attempts)."""
    from jax.lax.linalg import lu_pivots_to_permutation
    from jax.scipy.linalg import lu_factor

    from simlib._linalg import _dense  # the triangular-solve switch (UNROLL_MAX)

    f, params, states, args_of = _akzo_batch(N_ENSEMBLE)
    mass = AKZO_NOBEL.mass_matrix()
    n = states.shape[1]

    def jac(y, p):
        return jax.jacfwd(lambda v: f(0.0, v, args_of(p)))(y)

    def factor(a):
        lu, piv = lu_factor(a)
        return lu, lu_pivots_to_permutation(piv, n)

    jacs = jax.jit(jax.vmap(jac))(states, params)
    mats = jnp.diag(mass)[None] - 1e-3 * jacs
    lus, perms = jax.jit(jax.vmap(factor))(mats)
    unroll = _dense.UNROLL_MAX

    def stage_solve(lu, perm, b):
        return _dense.exact_lu_solve(lu, perm, b)

    def step_fn(solver):
        method = getattr(sl, solver)()

        def step(y, p):
            sol = sl.solve(f, y, 0.0, 1e-3, solver=method, dt=1e-3, args=args_of(p),
                           mass_matrix=mass, initialize="none")
            return sol.ys[-1]
        return step

    pieces = {"f": (jax.vmap(lambda y, p: f(0.0, y, args_of(p))), (states, params)),
              "Jacobian (jacfwd)": (jax.vmap(jac), (states, params)),
              "LU factor (LAPACK getrf)": (jax.vmap(factor), (mats,))}
    compiled = {}
    for key, (fn, args) in pieces.items():
        compiled[key] = (compile_jit(fn, *args)[0], args)
    ensembles = {}
    for tri, limit in (("substitution", unroll), ("LAPACK trsm", 0)):
        _dense.UNROLL_MAX = limit
        jax.clear_caches()
        compiled[f"stage solve ({tri})"] = (compile_jit(jax.vmap(stage_solve), lus, perms,
                                                        states)[0], (lus, perms, states))
        compiled[f"Rodas5P fixed step ({tri})"] = (
            compile_jit(jax.vmap(step_fn("Rodas5P")), states, params)[0], (states, params))
        solvers = ("Rodas5P", "Rodas5", "BDF", "Kvaerno5") if limit else ("Rodas5P",)
        for solver in solvers:
            one = _solve_fn(AKZO_NOBEL, solver, RTOL)
            batched = jax.vmap(lambda p, one=one: one(args_of(p)))
            fn, compile_s = compile_jit(batched, params)
            ensembles[f"{solver} ({tri})"] = (fn, compile_s)
    _dense.UNROLL_MAX = unroll
    jax.clear_caches()
    calls = {k: (lambda c=c, a=a: c(*a)) for k, (c, a) in compiled.items()}
    calls.update({k: (lambda fn=fn: fn(params)) for k, (fn, _) in ensembles.items()})
    times = round_robin(calls, repeats)
    rows = []
    for key, t in times.items():
        row = dict(piece=key, seconds=t.best)
        if key in ensembles:
            _, result, steps, attempts = (np.asarray(x) for x in t.out)
            row.update(compile_s=ensembles[key][1], max_steps=int(steps.max()),
                       mean_steps=float(steps.mean()), max_attempts=int(attempts.max()),
                       mean_attempts=float(attempts.mean()),
                       per_iteration_s=t.best / int(attempts.max()),
                       failed=int(np.sum(result != 0)))
        rows.append(row)
        print(f"[dae] profile {key}: {fmt_s(t.best)}", flush=True)
    return dict(members=N_ENSEMBLE, rows=rows)


GRAD_ADJOINTS = ("ForwardMode", "ForwardMode/frozen", "default", "default/frozen")
# "<adjoint>/frozen": with controller=PIDController(differentiate_steps=False), the step
# sequence frozen for derivatives (the default since 2026-12-06; docs/dae.md, "Gradients:
# which adjoint"); the others with differentiate_steps=True (the default before)
GRAD_PARAMS = [f"r{i}" for i in range(10)] + [f"c{i}" for i in range(1, 6)]
FD_STEP = 1e-4  # central differences: relative step


class _Choice(logging.Handler):
    """Records the ``simlib`` logger's report of the default adjoint's choice."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def bench_gradient(repeats: int, adjoints: tuple[str, ...] = GRAD_ADJOINTS,
                   solver: str = "Rodas5P") -> dict:
    """``jax.grad`` of the amplifier loss with each adjoint in ``adjoints`` (``default``:
    ``adjoint=None``; ``Checkpointed<k>``: ``steps_per_segment=k``), timed round-robin with
    the forward solve; every gradient against central differences of the same loss (all
    15 parameters, relative step 1e-4)."""
    prob = TRANSISTOR_AMPLIFIER
    ts = jnp.linspace(prob.t1 / GRAD_TIMES, prob.t1, GRAD_TIMES)
    y0 = jnp.asarray(prob.y0)
    fixed = jnp.asarray(prob.args[:4])
    method = getattr(sl, solver)()
    atol = RTOL * ATOL_PER_RTOL[prob.name]

    def make_loss(adjoint, controller=None):
        def loss(rc):  # rc: r0..r9, c1..c5
            args = tuple(fixed) + tuple(rc[i] for i in range(15))
            sol = sl.solve(prob.vector_field, y0, prob.t0, prob.t1, solver=method,
                           rtol=RTOL, atol=atol, args=args,
                           mass_matrix=prob.mass_matrix(args), saveat=sl.SaveAt(ts=ts),
                           max_steps=MAX_STEPS, adjoint=adjoint, initialize="none",
                           controller=controller)
            return jnp.mean(sol.ys[:, 7] ** 2)
        return loss

    def adjoint_of(name):
        name = name.split("/")[0]
        if name == "default":
            return None
        if name.startswith("Checkpointed") and name != "Checkpointed":
            return sl.Checkpointed(int(name[len("Checkpointed"):]))
        return getattr(sl, name)()

    # initialize="none": y0 (consistent at the published parameters, which the single
    # part checks) held fixed, so that the central differences' perturbed parameters,
    # off its algebraic equations by ~1e-8, evaluate the same function as the gradients
    rc = jnp.asarray(prob.args[4:])
    fwd, fwd_compile = compile_jit(make_loss(None), rc)
    grads, compile_s, chose = {}, {}, {}
    log = logging.getLogger("simlib")
    for name in adjoints:
        handler = _Choice()
        log.addHandler(handler)
        level = log.level
        log.setLevel(logging.INFO)
        try:
            controller = sl.PIDController(differentiate_steps=not name.endswith("/frozen"))
            grads[name], compile_s[name] = compile_jit(
                jax.grad(make_loss(adjoint_of(name), controller)), rc)
        finally:
            log.removeHandler(handler)
            log.setLevel(level)
        chose[name] = handler.messages[-1] if handler.messages else None
        print(f"[dae] gradient {name}: compiled in {compile_s[name]:.1f} s"
              + (f" ({chose[name]})" if chose[name] else ""), flush=True)
    calls = {"forward": lambda: fwd(rc)}
    calls.update({name: (lambda g=g: g(rc)) for name, g in grads.items()})
    times = round_robin(calls, repeats)
    fd = np.empty(15)
    for i in range(15):
        h = FD_STEP * float(rc[i])
        fd[i] = float((fwd(rc.at[i].add(h)) - fwd(rc.at[i].add(-h))) / (2 * h))
    # compared where the relative sensitivity p dL/dp is not negligible (all 15 here;
    # the resistances' dL/dp are 1e-9 of the capacitances' in absolute terms)
    sens = np.abs(fd * np.asarray(rc))
    big = sens > 1e-3 * sens.max()
    tf = times["forward"].best
    rows = []
    for name in adjoints:
        g = np.asarray(times[name].out)
        rel = np.abs(g - fd) / np.abs(fd)
        rows.append(dict(adjoint=name, seconds=times[name].best, ratio=times[name].best / tf,
                         compile_s=compile_s[name], default_chose=chose[name],
                         grad=g.tolist(), max_rel_vs_central_difference=float(rel[big].max()),
                         rel_vs_central_difference=rel.tolist(),
                         finite=bool(np.all(np.isfinite(g)))))
        print(f"[dae] gradient {name}: {fmt_s(times[name].best)} = {rows[-1]['ratio']:.1f}x "
              "the forward; vs central differences "
              f"{rows[-1]['max_rel_vs_central_difference']:.1e}", flush=True)
    return dict(params=15, times=GRAD_TIMES, rtol=RTOL, solver=solver, forward_seconds=tf,
                forward_compile_s=fwd_compile, loss=float(times["forward"].out),
                central_difference=fd.tolist(), rows=rows,
                fast_cpu_loops="xla_cpu_small_while_loop_byte_threshold"
                in os.environ.get("XLA_FLAGS", ""))


def report(res: dict) -> str:
    lines = [f"simlib ({res['commit']}) | jax {jax.__version__} | scikit-sundae "
             f"{res['sksundae']} | {res['cpus']} cpus | {res['date']}",
             f"load average at start {fmt_load(res['load_start'])}, at end "
             f"{fmt_load(res['load_end'])}", ""]
    if "single" in res:
        lines.append(f"One solve at rtol {RTOL:g} (scd: significant correct digits, min over "
                     "components; ratio = time / IDA's at the same rtol)")
        lines.append(f"{'problem':22s} {'contender':16s} {'rtol':>6s} {'time':>10s} "
                     f"{'compile':>8s} {'steps':>7s} {'scd':>5s} {'ratio':>7s}")
        for r in res["single"]:
            base = next((x for x in res["single"] if x["problem"] == r["problem"]
                         and x["contender"].startswith("IDA") and x["rtol"] == RTOL), None)
            ratio = r["seconds"] / base["seconds"] if base else None
            comp = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f} s"
            lines.append(f"{r['problem']:22s} {r['contender']:16s} {r['rtol']:6.0e} "
                         f"{fmt_s(r['seconds']):>10s} {comp:>8s} {r['steps']:7d} "
                         f"{r['scd']:5.2f} {fmt_r(ratio):>7s}")
        lines.append("")
    if "ensemble" in res:
        e = res["ensemble"]
        lines.append(f"Ensemble: {e['members']} Akzo Nobel parameter sets at rtol {RTOL:g}: "
                     f"simlib Rodas5P {e.get('driver', 'vmap')} {fmt_s(e['simlib_seconds'])} "
                     f"(compile "
                     f"{e['compile_s']:.1f} s, {e['simlib_failed']} failed, steps mean "
                     f"{e['mean_steps']:.0f} max {e['max_steps']})")
        if "ida_seconds_scaled" in e:
            lines.append(f"  IDA loop: {fmt_s(e['ida_seconds_measured'])} for the first "
                         f"{e['ida_members']} members, scaled to {e['members']}: "
                         f"{fmt_s(e['ida_seconds_scaled'])} -> simlib "
                         f"{e['speedup']:.1f}x faster (target 20x); members agree to "
                         f"{e['max_rel_disagreement']:.1e} relative")
        lines.append("")
    if "gradient" in res:
        g = res["gradient"]
        lines.append(f"Gradient of mean U8(t_i)^2 ({g['times']} times) w.r.t. 10 resistances "
                     f"and 5 capacitances (in M), {g['solver']} rtol {RTOL:g}"
                     f"{', fast_cpu_loops' if g['fast_cpu_loops'] else ''}: forward "
                     f"{fmt_s(g['forward_seconds'])} (compile {g['forward_compile_s']:.1f} s)")
        for r in g["rows"]:
            note = f"; {r['default_chose']}" if r["default_chose"] else ""
            lines.append(f"  {r['adjoint']:16s} {fmt_s(r['seconds']):>10s} = {r['ratio']:5.1f}x"
                         f" (target <= 10x), compile {r['compile_s']:.1f} s, max rel. diff. to "
                         f"central differences {r['max_rel_vs_central_difference']:.1e}{note}")
        lines.append("")
    if "profile" in res:
        lines.append(f"Profile: {res['profile']['members']} Akzo Nobel members under "
                     "jax.jit(jax.vmap(...)), each piece batched over them")
        for r in res["profile"]["rows"]:
            extra = ""
            if "max_attempts" in r:
                extra = (f"  attempts max {r['max_attempts']} mean {r['mean_attempts']:.1f}"
                         f", {fmt_s(r['per_iteration_s'])} per iteration, compile "
                         f"{r['compile_s']:.1f} s, {r['failed']} failed")
            lines.append(f"  {r['piece']:34s} {fmt_s(r['seconds']):>10s}{extra}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help=f"subset of {PARTS}")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ida-members", type=int, default=100,
                        help="ensemble members IDA runs (its time scaled to 1,000)")
    parser.add_argument("--ensemble-driver", choices=("vmap", "solve_ensemble"),
                        default="vmap", help="simlib's ensemble: jax.jit(jax.vmap(solve)) "
                        "or solve_ensemble (finished members dropped)")
    parser.add_argument("--adjoints", default=",".join(GRAD_ADJOINTS),
                        help="gradient part: adjoints to time (default = adjoint=None; "
                        "CheckpointedK: steps_per_segment=K)")
    parser.add_argument("--grad-solver", default="Rodas5P", help="gradient part: solver")
    parser.add_argument("--fast-cpu-loops", action="store_true",
                        help="sl.fast_cpu_loops() before JAX starts (docs/gradients.md)")
    parser.add_argument("--single-thread", action="store_true",
                        help="XLA, OpenBLAS and OpenMP on one thread each")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH)
    opts = parser.parse_args()
    parts = [p.strip() for p in opts.parts.split(",") if p.strip()]
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"unknown parts {unknown}; choose from {PARTS}")
    if not ida.available():
        print("[dae] scikit-sundae is not installed: IDA skipped "
              "(bash benchmarks/install_peers.sh)", flush=True)
    try:
        import sksundae
        sksundae_version = sksundae.__version__
    except ImportError:
        sksundae_version = None
    clock = Timer().start()
    res = dict(date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
               commit=simlib_commit(ROOT), sksundae=sksundae_version,
               cpus=len(os.sched_getaffinity(0)), platform=platform.platform(),
               single_thread=opts.single_thread, repeats=opts.repeats,
               load_start=load_average())
    if "single" in parts:
        res["single"] = bench_single(opts.repeats)
    if "ensemble" in parts:
        res["ensemble"] = bench_ensemble(opts.repeats, opts.ida_members,
                                         opts.ensemble_driver)
    if "gradient" in parts:
        res["gradient"] = bench_gradient(opts.repeats, tuple(opts.adjoints.split(",")),
                                         opts.grad_solver)
    if "profile" in parts:
        res["profile"] = bench_profile(opts.repeats)
    res["wall_s"] = clock.stop()
    res["load_end"] = load_average()
    return finish(res, report(res), opts.json)


if __name__ == "__main__":
    sys.exit(main())
