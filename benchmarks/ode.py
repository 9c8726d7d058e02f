"""Ensemble ODE benchmark: simlib against diffrax, scipy and a hand-written floor.

Lorenz system (sigma=10, rho=28, beta=8/3, passed through ``args``), float64,
an ensemble of initial conditions ``[1, 1, 1] + 0.1 * normal`` (fixed PRNG key),
integrated over ``t in [0, 1]`` with Tsit5, saving only ``t1``:

* ``fixed``: 1,000 fixed steps, ``dt = 1e-3``;
* ``adaptive``: ``rtol=1e-6, atol=1e-9``, PI controller.

Each case runs for every ensemble size in ``--members`` as

* ``simlib vmap``      ``jit(vmap(lambda y0: simlib.solve(...).ys[-1]))``
* ``simlib batched``   one ``simlib.solve`` on the ``(N, 3)`` state
* ``diffrax vmap``     ``jit(vmap(lambda y0: diffrax.diffeqsolve(...).ys[-1]))``
* ``diffrax batched``  one ``diffeqsolve`` on the ``(N, 3)`` state
* ``floor vmap``       a minimal hand-written Tsit5 with simlib's own coefficients: a
                       ``lax.scan`` of fixed steps, or a ``lax.while_loop`` of attempts
                       under simlib's PI controller (adaptive), vmapped over members, with
                       no checks, statistics or save logic: what XLA achieves on this
                       machine, a lower bound for ``simlib vmap``
* ``floor batched``    the same on the ``(N, 3)`` state (bound for ``simlib batched``)
* ``scipy``            ``solve_ivp(RK45)`` in a Python loop over a few members, scaled
                       linearly to the ensemble: at ``rtol=1e-6, atol=1e-9`` for the
                       adaptive case; for the fixed case, with ``first_step = max_step =
                       dt`` and tolerances so loose that every step is accepted, i.e. the
                       same 1,000 steps of a 5th-order, 7-stage FSAL pair as Tsit5.

For batched adaptive runs the whole ensemble shares one step size (the RMS error
norm runs over all ``3 N`` components): a different computation from the vmapped
one, reported for completeness.

Timing: every function is jitted; compile time is the wall time of
``jax.jit(fn).lower(...).compile()`` (tracing + lowering + XLA compilation) after
``jax.clear_caches()``, best of ``--compile-repeats``; the run time is the best of
``--repeats`` calls of the compiled executable after one warm-up call, with
``block_until_ready``; the contenders of one (case, N) are timed in turn, repeat by
repeat, so that load from other processes hits them alike. ``simlib vmap`` (default
``throw=True``) is also run with ``throw=False``, to show the cost of its in-graph
failure check. A contender whose host callbacks are unrolled once per member under
``vmap`` (as simlib's were before commit 99bea23) is not measured above
``--max-unrolled`` members; its time there is projected linearly from a smaller N
(marked ``*``).

Usage::

    python benchmarks/ode.py                    # members 1000 10000, 5 repeats (~2.5 min)
    python benchmarks/ode.py --quick            # members 1000, 2 repeats (~20-40 s)
    python benchmarks/ode.py --members 1000 --repeats 3 --json out.json
"""

import jax

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402
import datetime  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _format import finish, fmt_r, fmt_s, optional_import, simlib_commit  # noqa: E402  (benchmarks/_format.py, next to this file)
from _timing import Timer, compile_jit, round_robin, warm_up  # noqa: E402  (benchmarks/_timing.py)
from jax import lax  # noqa: E402

import simlib as sl  # noqa: E402

diffrax, DIFFRAX_ERROR = optional_import("diffrax")

_integrate, SCIPY_ERROR = optional_import("scipy.integrate")
solve_ivp = None if _integrate is None else _integrate.solve_ivp

T0, T1 = 0.0, 1.0
DT = 1e-3
RTOL, ATOL = 1e-6, 1e-9
MAX_STEPS = 4096
ARGS = (10.0, 28.0, 8.0 / 3.0)  # sigma, rho, beta
SEED = 0
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "ode.json"

# Controller of simlib (simlib/_control.py): factor = 0.9 r^(-0.7/k) r_prev^(0.4/k),
# clipped to [0.2, 10], k = 5 for Tsit5. diffrax's PID with pcoeff=0.4, icoeff=0.3
# gives factor = 0.9 (1/r)^(0.7/k) (1/r_prev)^(-0.4/k) with k = error_order = 5.
CONTROLLER_NOTES = [
    "same: safety 0.9, exponents 0.7/5 and 0.4/5 (diffrax pcoeff=0.4, icoeff=0.3), "
    "factor clipped to [0.2, 10], RMS norm of err/(atol + rtol max(|y0|,|y1|)), "
    "Hairer's automatic first step",
    "differs: diffrax never shrinks the step after an accepted one (factormin=1), "
    "simlib may (down to 0.2)",
    "differs: after a rejection diffrax uses the PI factor capped at 0.9, simlib "
    "0.9 r^(-1/5) capped at 1",
    "differs: accept when r < 1 (diffrax) vs r <= 1 (simlib); simlib floors r_prev at 1e-4",
    "differs: first-step exponent 1/5 (diffrax, 1/error_order) vs 1/6 (simlib, 1/(order+1))",
]


# --------------------------------------------------------------------------------------
# the problem


def lorenz(t, y, args):
    """Lorenz vector field for a state ``(..., 3)``: one member or a batch of them."""
    sigma, rho, beta = args
    x, yy, z = y[..., 0], y[..., 1], y[..., 2]
    return jnp.stack([sigma * (yy - x), x * (rho - z) - yy, x * yy - beta * z], axis=-1)


def lorenz_np(t, y, sigma, rho, beta):
    """The same field in NumPy, for scipy (calling jnp from scipy would time JAX dispatch)."""
    x, yy, z = y
    return np.array([sigma * (yy - x), x * (rho - z) - yy, x * yy - beta * z])


def initial_conditions(n: int) -> jax.Array:
    key = jax.random.PRNGKey(SEED)
    return jnp.ones((n, 3)) + 0.1 * jax.random.normal(key, (n, 3), dtype=jnp.float64)


def jargs():
    return tuple(jnp.asarray(a, jnp.float64) for a in ARGS)


# --------------------------------------------------------------------------------------
# the contenders: functions (y0s, args) -> final states (N, 3)


def simlib_fn(case: str, batched: bool, throw: bool = True):
    solver = sl.Tsit5()
    if case == "fixed":
        kw = dict(dt=DT)
    else:
        kw = dict(rtol=RTOL, atol=ATOL, max_steps=MAX_STEPS)

    def one(y0, args):
        return sl.solve(lorenz, y0, T0, T1, solver=solver, args=args, throw=throw,
                        **kw).ys[-1]

    return one if batched else jax.vmap(one, in_axes=(0, None))


def diffrax_fn(case: str, batched: bool):
    term = diffrax.ODETerm(lorenz)
    solver = diffrax.Tsit5()
    saveat = diffrax.SaveAt(t1=True)
    if case == "fixed":
        kw = dict(dt0=DT, stepsize_controller=diffrax.ConstantStepSize())
    else:
        kw = dict(dt0=None, stepsize_controller=diffrax.PIDController(
            rtol=RTOL, atol=ATOL, pcoeff=0.4, icoeff=0.3, dcoeff=0.0,
            safety=0.9, factormin=0.2, factormax=10.0))

    def one(y0, args):
        return diffrax.diffeqsolve(term, solver, T0, T1, y0=y0, args=args, saveat=saveat,
                                   max_steps=MAX_STEPS, **kw).ys[-1]

    return one if batched else jax.vmap(one, in_axes=(0, None))


# The hand-written floor uses simlib's own Tsit5 coefficients, so that it performs the
# same arithmetic; it has no checks, no statistics, no save logic, no error handling.
_TAB = sl.Tsit5.tableau


def _tsit5_step(t, y, h, k1, args):
    ks = [k1]
    yi = y
    for i in range(1, _TAB.stages):
        acc = sum(a * k for a, k in zip(_TAB.a[i], ks, strict=True) if a != 0.0)
        yi = y + h * acc
        ks.append(lorenz(t + _TAB.c[i] * h, yi, args))
    err = sum(e * k for e, k in zip(_TAB.b_error, ks, strict=True) if e != 0.0)
    return yi, ks[-1], err  # FSAL: the last stage is at y1


def floor_fixed(y0s, args):
    """Fixed-step Tsit5 in ``lax.scan``: for one member ``(3,)`` or the batch ``(N, 3)``."""
    n = round((T1 - T0) / DT)

    def body(carry, k):
        y, k1 = carry
        t = T0 + k * DT
        y1, k7, _ = _tsit5_step(t, y, DT, k1, args)
        return (y1, k7), None

    (y, _), _ = lax.scan(body, (y0s, lorenz(T0, y0s, args)), jnp.arange(n, dtype=jnp.float64))
    return y


def _rms(x):
    return jnp.sqrt(jnp.mean(jnp.square(x)))


def floor_adaptive(y0, args):
    """while_loop of Tsit5 attempts under simlib's PI controller, for one member ``(3,)``
    or, with one shared step size, the batch ``(N, 3)``."""
    k = 5.0
    f0 = lorenz(T0, y0, args)
    scale0 = ATOL + RTOL * jnp.abs(y0)
    d0, d1 = _rms(y0 / scale0), _rms(f0 / scale0)
    h0 = jnp.where((d0 < 1e-5) | (d1 < 1e-5), 1e-6, 0.01 * d0 / d1)
    d2 = _rms((lorenz(T0 + h0, y0 + h0 * f0, args) - f0) / scale0) / h0
    h1 = (0.01 / jnp.maximum(d1, d2)) ** (1.0 / 6.0)
    h = jnp.minimum(100 * h0, h1)

    def cond(c):
        t, _, _, _, _, n = c
        return (t < T1) & (n < MAX_STEPS)

    def body(c):
        t, y, k1, h, r_prev, n = c
        h = jnp.minimum(h, T1 - t)
        y1, k7, err = _tsit5_step(t, y, h, k1, args)
        scale = ATOL + RTOL * jnp.maximum(jnp.abs(y), jnp.abs(y1))
        r = jnp.abs(h) * _rms(err / scale)
        accept = r <= 1.0
        rr = jnp.maximum(r, 1e-10)
        fac = jnp.where(accept, 0.9 * rr ** (-0.7 / k) * r_prev ** (0.4 / k),
                        jnp.minimum(0.9 * rr ** (-1.0 / k), 1.0))
        fac = jnp.clip(fac, 0.2, 10.0)
        return (jnp.where(accept, t + h, t), jnp.where(accept, y1, y),
                jnp.where(accept, k7, k1), h * fac,
                jnp.where(accept, jnp.maximum(r, 1e-4), r_prev), n + 1)

    c = lax.while_loop(cond, body, (jnp.asarray(T0), y0, f0, h, jnp.asarray(1.0), 0))
    return c[1]


FLOORS = {
    ("fixed", "floor vmap"): jax.vmap(floor_fixed, in_axes=(0, None)),
    ("fixed", "floor batched"): floor_fixed,
    ("adaptive", "floor vmap"): jax.vmap(floor_adaptive, in_axes=(0, None)),
    ("adaptive", "floor batched"): floor_adaptive,
}


# --------------------------------------------------------------------------------------
# timing


def compile_fn(fn, inputs, repeats: int = 1) -> tuple:
    """``jit(fn)`` lowered and compiled on cold caches, best of ``repeats`` times;
    returns (executable, seconds)."""
    return compile_jit(fn, *inputs, cold=True, repeats=repeats)


def time_interleaved(calls: dict, repeats: int) -> dict:
    """(best, median) wall time over ``repeats`` calls of each zero-argument call, taken
    round-robin (:func:`_timing.round_robin`; no warm-up here: the caller warms up)."""
    timed = round_robin(calls, repeats, slow_s=math.inf, warmup=False)
    return {name: (t.best, t.median) for name, t in timed.items()}


def scipy_loop(y0s: np.ndarray, case: str = "adaptive") -> tuple[np.ndarray, int]:
    """solve_ivp RK45 on each member in turn; final states and mean f-evals.

    ``case="fixed"``: steps of exactly ``DT`` (``first_step = max_step = DT``, every step
    accepted under tolerances of 1e10), the same number of steps as the fixed runs.
    """
    outs, nfev = [], 0
    options = (dict(rtol=RTOL, atol=ATOL) if case == "adaptive"
               else dict(rtol=1e10, atol=1e10, first_step=DT, max_step=DT))
    for y0 in y0s:
        sol = solve_ivp(lorenz_np, (T0, T1), y0, method="RK45", args=ARGS, **options)
        outs.append(sol.y[:, -1])
        nfev += sol.nfev
    return np.array(outs), nfev // len(y0s)


def reference(y0s: np.ndarray) -> np.ndarray:
    """Accurate final states (DOP853 at rtol=atol=1e-13) for a few members."""
    return np.array([
        solve_ivp(lorenz_np, (T0, T1), y0, method="DOP853", rtol=1e-13, atol=1e-13,
                  args=ARGS).y[:, -1] for y0 in y0s
    ])


def step_counts(n: int) -> dict:
    """Mean attempts / accepted steps per member of simlib and diffrax (adaptive, vmap)."""
    y0s, args = initial_conditions(n), jargs()

    def s_stats(y0, a):
        s = sl.solve(lorenz, y0, T0, T1, solver=sl.Tsit5(), rtol=RTOL, atol=ATOL, args=a,
                     max_steps=MAX_STEPS).stats
        return s["num_steps"], s["num_accepted"]

    out = {}
    ns, na = jax.jit(jax.vmap(s_stats, in_axes=(0, None)))(y0s, args)
    out["simlib"] = dict(attempts=float(jnp.mean(ns)), accepted=float(jnp.mean(na)),
                         max_attempts=int(jnp.max(ns)))
    if diffrax is not None:
        def d_stats(y0, a):
            s = diffrax.diffeqsolve(
                diffrax.ODETerm(lorenz), diffrax.Tsit5(), T0, T1, None, y0, args=a,
                saveat=diffrax.SaveAt(t1=True), max_steps=MAX_STEPS,
                stepsize_controller=diffrax.PIDController(
                    rtol=RTOL, atol=ATOL, pcoeff=0.4, icoeff=0.3)).stats
            return s["num_steps"], s["num_accepted_steps"]

        ns, na = jax.jit(jax.vmap(d_stats, in_axes=(0, None)))(y0s, args)
        out["diffrax"] = dict(attempts=float(jnp.mean(ns)), accepted=float(jnp.mean(na)),
                              max_attempts=int(jnp.max(ns)))
    return out


def callbacks_per_member(fn) -> tuple[int, int]:
    """Host-callback equations in the jaxpr of ``fn`` at N=2 and N=4 members.

    If the count grows with N, a callback is unrolled once per member under ``vmap``
    (``jax.debug.callback`` batches that way), and so do compile and run time.
    """
    counts = []
    for n in (2, 4):
        text = str(jax.make_jaxpr(fn)(initial_conditions(n), jargs()))
        counts.append(text.count("callback["))
    return counts[0], counts[1]


# --------------------------------------------------------------------------------------
# the run

SIMLIB_VMAP = "simlib vmap"
SIMLIB_NOTHROW = "simlib vmap throw=False"
SIMLIB_BATCHED = "simlib batched"


def _jaxlib_version():
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # noqa: BLE001
        return None


def run(members: list[int], repeats: int, scipy_members: int, max_unrolled: int,
        compile_repeats: int) -> dict:
    results: dict = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        jax_version=jax.__version__,
        jaxlib_version=_jaxlib_version(),
        diffrax_version=None if diffrax is None else diffrax.__version__,
        simlib_version=sl.__version__,
        simlib_commit=simlib_commit(Path(sl.__file__).resolve().parent.parent),
        python=platform.python_version(),
        platform=platform.platform(),
        backend=jax.default_backend(),
        cpu_count=os.cpu_count(),
        members=members, repeats=repeats, compile_repeats=compile_repeats,
        scipy_members=scipy_members,
        problem=dict(system="lorenz", args=ARGS, t=[T0, T1], dt=DT, rtol=RTOL, atol=ATOL,
                     max_steps=MAX_STEPS, y0="[1,1,1] + 0.1*normal(PRNGKey(0))"),
        controller_notes=CONTROLLER_NOTES,
        skipped={}, timings=[], agreement=[], accuracy=[], step_counts=None, targets=[],
        unrolled_callbacks={}, probes=[],
    )
    if diffrax is None:
        results["skipped"]["diffrax"] = DIFFRAX_ERROR
        print(f"diffrax: skipped ({DIFFRAX_ERROR})")
    if solve_ivp is None:
        results["skipped"]["scipy"] = SCIPY_ERROR
        print(f"scipy: skipped ({SCIPY_ERROR})")

    args = jargs()
    contenders = {
        SIMLIB_VMAP: lambda c: simlib_fn(c, batched=False),
        SIMLIB_NOTHROW: lambda c: simlib_fn(c, batched=False, throw=False),
        SIMLIB_BATCHED: lambda c: simlib_fn(c, batched=True),
        "floor vmap": lambda c: FLOORS[c, "floor vmap"],
        "floor batched": lambda c: FLOORS[c, "floor batched"],
    }
    if diffrax is not None:
        contenders["diffrax vmap"] = lambda c: diffrax_fn(c, batched=False)
        contenders["diffrax batched"] = lambda c: diffrax_fn(c, batched=True)

    # scipy: an adaptive RK45 loop over a few members, timed with the others and
    # scaled linearly to the ensemble (it is the same loop for both cases)
    y0_small = np.asarray(initial_conditions(max(members)))[:scipy_members]
    ref = reference(y0_small) if solve_ivp is not None else None
    if solve_ivp is not None:
        scipy_out, scipy_nfev = scipy_loop(y0_small)
        results["scipy"] = dict(members_timed=scipy_members, mean_nfev=scipy_nfev)
        results["accuracy"].append(dict(
            case="adaptive", method="scipy RK45",
            max_err_vs_ref=float(np.max(np.abs(scipy_out - ref)))))

    table: dict = {}  # (case, n, name) -> measurement, or {"skipped": reason}
    probes: dict = {}  # (case, name) -> a measurement at a small N, for projections
    for case in ("fixed", "adaptive"):
        unrolled = {}
        for name in (SIMLIB_VMAP, SIMLIB_NOTHROW, "diffrax vmap"):
            if name in contenders:
                c2, c4 = callbacks_per_member(contenders[name](case))
                unrolled[name] = (c4 - c2) / 2
                results["unrolled_callbacks"][f"{case}/{name}"] = dict(at_2=c2, at_4=c4)
                print(f"  {case:8s} {name:24s} host callbacks in the jaxpr: {c2} at N=2, "
                      f"{c4} at N=4", flush=True)
        for n in members:
            y0s = initial_conditions(n)
            calls = {}
            for name, make in contenders.items():
                per = unrolled.get(name, 0)
                if per > 0 and n > max_unrolled:
                    reason = (f"{per:g} host callback(s) per member unrolled under vmap: "
                              f"compile and run time grow with N; not measured above "
                              f"--max-unrolled {max_unrolled}")
                    table[case, n, name] = dict(skipped=reason)
                    results["timings"].append(dict(case=case, members=n, method=name,
                                                   skipped=reason))
                    print(f"  {case:8s} N={n:<6d} {name:24s} skipped: {reason}", flush=True)
                    if not any("time_s" in table.get((case, m, name), {}) for m in members
                               if m < n) and (case, name) not in probes:
                        probes[case, name] = probe(make(case), max_unrolled, repeats)
                        pr = probes[case, name]
                        results["probes"].append(dict(case=case, method=name, **pr))
                        print(f"  {case:8s} N={pr['members']:<6d} {name:24s} (probe for the "
                              f"projection) run {fmt_s(pr['time_s'])}, compile "
                              f"{fmt_s(pr['compile_s'])}", flush=True)
                    continue
                compiled, compile_s = compile_fn(make(case), (y0s, args),
                                                 compile_repeats)
                calls[name] = lambda c=compiled, y=y0s: c(y, args)
                out = np.asarray(warm_up(calls[name]).out)
                table[case, n, name] = dict(compile_s=compile_s, out=out, members=n)
                print(f"  {case:8s} N={n:<6d} {name:24s} compile {fmt_s(compile_s):>9s}",
                      flush=True)
            if solve_ivp is not None:
                calls["scipy"] = lambda c=case: scipy_loop(y0_small, c)
            best = time_interleaved(calls, repeats)
            for name, (t_best, t_median) in best.items():
                if name == "scipy":
                    scale = n / scipy_members
                    table[case, n, name] = dict(time_s=t_best * scale,
                                                median_s=t_median * scale, compile_s=None,
                                                per_member_s=t_best / scipy_members)
                    results["timings"].append(dict(
                        case=case, members=n, method="scipy RK45 loop (scaled)",
                        time_s=t_best * scale, median_s=t_median * scale,
                        per_member_s=t_best / scipy_members, members_timed=scipy_members))
                    print(f"  {case:8s} N={n:<6d} {'scipy RK45 loop':24s} run "
                          f"{fmt_s(t_best / scipy_members):>9s} per member", flush=True)
                    continue
                m = table[case, n, name]
                m.update(time_s=t_best, median_s=t_median)
                results["timings"].append(dict(case=case, members=n, method=name,
                                               time_s=t_best, median_s=t_median,
                                               compile_s=m["compile_s"]))
                print(f"  {case:8s} N={n:<6d} {name:24s} run {fmt_s(t_best):>9s}", flush=True)
            # agreement of the answers: the comparison must be of the same work
            pairs = [(SIMLIB_VMAP, "diffrax vmap"), (SIMLIB_NOTHROW, "diffrax vmap"),
                     (SIMLIB_BATCHED, "diffrax batched"), (SIMLIB_NOTHROW, SIMLIB_BATCHED),
                     (SIMLIB_NOTHROW, "floor vmap"), (SIMLIB_BATCHED, "floor batched")]
            for a, b in pairs:
                ma, mb = table.get((case, n, a), {}), table.get((case, n, b), {})
                if "out" in ma and "out" in mb:
                    d = float(np.max(np.abs(ma["out"] - mb["out"])))
                    results["agreement"].append(dict(case=case, members=n, a=a, b=b,
                                                     max_abs_diff=d))
            if ref is not None:
                for name in contenders:
                    m = table[case, n, name]
                    if "out" in m:
                        results["accuracy"].append(dict(
                            case=case, members=n, method=name,
                            max_err_vs_ref=float(np.max(np.abs(m["out"][:scipy_members] - ref)))))
    results["step_counts"] = step_counts(min(members))

    rows = []
    for case in ("fixed", "adaptive"):
        for n in members:
            for s_name, peer in ((SIMLIB_VMAP, "diffrax vmap"),
                                 (SIMLIB_NOTHROW, "diffrax vmap"),
                                 (SIMLIB_BATCHED, "diffrax batched"),
                                 (SIMLIB_VMAP, "diffrax batched"),
                                 (SIMLIB_NOTHROW, "diffrax batched"),
                                 (SIMLIB_VMAP, "floor vmap"),
                                 (SIMLIB_NOTHROW, "floor vmap"),
                                 (SIMLIB_BATCHED, "floor batched"),
                                 (SIMLIB_VMAP, "scipy"),
                                 (SIMLIB_NOTHROW, "scipy")):
                row = dict(case=case, members=n, simlib=s_name, peer=peer)
                rows.append(row)
                s = table[case, n, s_name]
                if "skipped" in s:
                    s = _projected(table, probes, case, n, s_name, members)
                    row["projected"] = s is not None
                if peer == "scipy":
                    row["peer"] = "scipy RK45 loop" + (" (dt fixed)" if case == "fixed" else "")
                p = table.get((case, n, peer))
                if s is None or p is None or "skipped" in p:
                    row["skipped"] = True
                    continue
                row.update(simlib_s=s["time_s"], peer_s=p["time_s"],
                           ratio=p["time_s"] / s["time_s"], simlib_compile_s=s["compile_s"],
                           peer_compile_s=p["compile_s"],
                           compile_ratio=None if p["compile_s"] is None
                           else p["compile_s"] / s["compile_s"])
    results["rows"] = rows
    results["targets"] = targets(rows, members)
    return results


def _projected(table, probes, case, n, name, members):
    """Time and compile time of a contender not measured at ``n``, scaled linearly in N
    from the largest smaller size where it was measured (its cost is per member), or
    from its probe; None if neither exists."""
    done = [m for m in members if m < n and "time_s" in table.get((case, m, name), {})]
    if done:
        m = table[case, done[-1], name]
    elif (case, name) in probes:
        m = probes[case, name]
    else:
        return None
    scale = n / m["members"]
    return dict(time_s=m["time_s"] * scale, compile_s=m["compile_s"] * scale)


def probe(fn, n: int, repeats: int) -> dict:
    """Compile and time ``fn`` on ``n`` members (for a projection to larger N)."""
    y0s, args = initial_conditions(n), jargs()
    compiled, compile_s = compile_fn(fn, (y0s, args))
    warm_up(lambda: compiled(y0s, args))
    (best, median), = time_interleaved({"probe": lambda: compiled(y0s, args)},
                                       repeats).values()
    return dict(members=n, time_s=best, median_s=median, compile_s=compile_s)


def _value(rows, case, n, simlib, peer, key="ratio"):
    for r in rows:
        if (r["case"], r["members"], r["simlib"], r["peer"].split(" (")[0]) == (
                case, n, simlib, peer):
            return None if r.get("skipped") else (r[key], r.get("projected", False))
    return None


def targets(rows, members) -> list[dict]:
    """The issue's targets, each MET, MISSED or SKIPPED, for simlib's default
    (``throw=True``) and, alongside, for ``throw=False``."""
    out = []

    def status(found, need):
        if found is None:
            return None, "SKIPPED"
        value, projected = found
        verdict = "MET" if value >= need else "MISSED"
        return value, verdict + ("*" if projected else "")

    def add(name, need, case, n, simlib, peer, key="ratio", note=""):
        value, verdict = status(_value(rows, case, n, simlib, peer, key), need)
        entry = dict(target=name, need=need, value=value, status=verdict, note=note)
        if simlib == SIMLIB_VMAP:
            alt, alt_verdict = status(_value(rows, case, n, SIMLIB_NOTHROW, peer, key), need)
            entry.update(value_throw_false=alt, status_throw_false=alt_verdict)
        out.append(entry)

    for n in members:
        need = 10.0 if n >= 10_000 else 6.0
        add(f"fixed N={n}: {need:g}x faster than diffrax vmap", need, "fixed", n,
            SIMLIB_VMAP, "diffrax vmap")
    for n in members:
        add(f"fixed N={n}: 2x faster than diffrax batched (simlib batched)", 2.0, "fixed",
            n, SIMLIB_BATCHED, "diffrax batched")
        add(f"fixed N={n}: 2x faster than diffrax batched (simlib vmap)", 2.0, "fixed", n,
            SIMLIB_VMAP, "diffrax batched")
    for n in members:
        add(f"adaptive N={n}: 2x faster than diffrax vmap", 2.0, "adaptive", n,
            SIMLIB_VMAP, "diffrax vmap")
    for case in ("fixed", "adaptive"):
        for n in members:
            add(f"{case} N={n}: compile <= 1/2 of diffrax vmap", 2.0, case, n, SIMLIB_VMAP,
                "diffrax vmap", key="compile_ratio")
            add(f"{case} N={n}: compile <= 1/2 of diffrax batched (simlib batched)", 2.0,
                case, n, SIMLIB_BATCHED, "diffrax batched", key="compile_ratio")
    for case in ("fixed", "adaptive"):
        for n in members:
            add(f"{case} N={n}: 500x faster than the scipy loop", 500.0, case, n,
                SIMLIB_VMAP, "scipy RK45 loop",
                note="scipy RK45 with every step of dt=1e-3 accepted: the same 1,000 steps"
                if case == "fixed" else "same tolerances; RK45 = Dopri5 stepper")
    return out


def report(results: dict) -> str:
    lines = []
    p = lines.append
    p(f"simlib {results['simlib_version']} ({results['simlib_commit']}) | "
      f"jax {results['jax_version']} | diffrax "
      f"{results['diffrax_version'] or 'skipped'} | {results['backend']} | "
      f"{results['cpu_count']} cpus | {results['date']}")
    p(f"Lorenz, float64, t in [0, 1], Tsit5, save t1 only; best of {results['repeats']}")
    p("")
    head = (f"{'case':8s} {'N':>6s}  {'simlib':23s} {'peer':26s} {'simlib':>9s} {'peer':>9s} "
            f"{'ratio':>8s}  {'compile: simlib':>15s} {'peer':>8s} {'ratio':>7s}")
    p(head)
    p("-" * len(head))
    for r in results["rows"]:
        if r.get("skipped"):
            p(f"{r['case']:8s} {r['members']:>6d}  {r['simlib']:23s} {r['peer']:26s} "
              f"{'skipped':>9s}")
            continue
        star = "*" if r.get("projected") else ""
        p(f"{r['case']:8s} {r['members']:>6d}  {r['simlib']:23s} {r['peer']:26s} "
          f"{fmt_s(r['simlib_s']) + star:>9s} {fmt_s(r['peer_s']):>9s} "
          f"{fmt_r(r['ratio']) + star:>8s}  {fmt_s(r['simlib_compile_s']) + star:>15s} "
          f"{fmt_s(r['peer_compile_s']):>8s} {fmt_r(r['compile_ratio']) + star:>7s}")
    p("ratio = peer / simlib (> 1: simlib faster). floor = hand-written Tsit5, lax.scan "
      "(fixed) or lax.while_loop with")
    p("simlib's controller (adaptive), vmapped or on the (N,3) state, no checks: the ratio "
      "to it (< 1) is simlib's overhead.")
    p(f"compile = jit(fn).lower(...).compile() after jax.clear_caches() (trace + lower + XLA), "
      f"best of {results['compile_repeats']}.")
    p("* = not measured (see below): scaled linearly in N from the largest N measured or "
      "from a probe:")
    for pr in results["probes"]:
        p(f"  probe: {pr['case']} N={pr['members']} {pr['method']}: run {fmt_s(pr['time_s'])}, "
          f"compile {fmt_s(pr['compile_s'])}")
    for t in results["timings"]:
        if "skipped" in t:
            p(f"  {t['case']} N={t['members']} {t['method']}: {t['skipped']}")
    n_steps = round((T1 - T0) / DT)
    for n in results["members"]:
        per_step = [t for t in results["timings"] if t["case"] == "fixed" and "time_s" in t
                    and t["members"] == n and "scipy" not in t["method"]]
        if per_step:
            p(f"fixed step, N={n}, ns per member-step: " + ", ".join(
                f"{t['method']} {t['time_s'] / (n_steps * n) * 1e9:.1f}" for t in per_step))
    sc = [t for t in results["timings"] if "per_member_s" in t]
    if sc:
        p("scipy RK45 loop, per member: " + ", ".join(
            f"{t['case']} N={t['members']} {fmt_s(t['per_member_s'])}" for t in sc))
    p("")
    p("Host callbacks in the jaxpr (N=2 -> N=4 members; growth = unrolled per member):")
    for k, v in results["unrolled_callbacks"].items():
        p(f"  {k:34s} {v['at_2']} -> {v['at_4']}")
    p("Agreement of the final states (max |a - b| over the ensemble):")
    for a in results["agreement"]:
        p(f"  {a['case']:8s} N={a['members']:<6d} {a['a']:>23s} vs {a['b']:16s} "
          f"{a['max_abs_diff']:.1e}")
    p(f"Max error against DOP853 at rtol=atol=1e-13, first {results['scipy_members']} "
      "members:")
    for a in results["accuracy"]:
        n = f"N={a['members']}" if "members" in a else ""
        p(f"  {a['case']:8s} {n:8s} {a['method']:24s} {a['max_err_vs_ref']:.1e}")
    sc = results["step_counts"]
    if sc:
        p(f"Adaptive step attempts per member (vmap, N={min(results['members'])}): "
          + "; ".join(
            f"{k} {v['attempts']:.1f} ({v['accepted']:.1f} accepted, max {v['max_attempts']})"
            for k, v in sc.items())
          + (f"; scipy RK45 {results['scipy']['mean_nfev']} f-evals" if "scipy" in results
             else ""))
    p("Adaptive controller, simlib vs diffrax:")
    for note in results["controller_notes"]:
        p(f"  - {note}")
    p("")
    p("Targets (simlib default throw=True; in brackets: with throw=False; * = projected):")
    for t in results["targets"]:
        v = "-" if t["value"] is None else f"{t['value']:.2f}x"
        alt = ""
        if "value_throw_false" in t:
            av = t["value_throw_false"]
            alt = f" [{'-' if av is None else f'{av:.2f}x'} {t['status_throw_false']}]"
        note = f"  ({t['note']})" if t["note"] else ""
        p(f"  {t['status']:7s} {t['target']:58s} need {t['need']:g}x, got {v}{alt}{note}")
    for k, v in results["skipped"].items():
        p(f"  {k} skipped: {v}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, nargs="+", default=None,
                        help="ensemble sizes (default 1000 10000; --quick: 1000)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per measurement, best taken (default 5; --quick: 2)")
    parser.add_argument("--scipy-members", type=int, default=None,
                        help="members solved by the scipy loop (default 20; --quick: 5)")
    parser.add_argument("--max-unrolled", type=int, default=None,
                        help="largest N measured for a contender whose host callbacks are "
                             "unrolled per member under vmap (default 1000; --quick: 100)")
    parser.add_argument("--compile-repeats", type=int, default=None,
                        help="compilations per contender, best taken (default 3; --quick: 1)")
    parser.add_argument("--quick", action="store_true",
                        help="fast check: N=1000 only, 2 repeats, 5 scipy members")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH,
                        help=f"where to write the results (default {RESULTS_PATH})")
    opts = parser.parse_args(argv)
    members = sorted(opts.members or ([1000] if opts.quick else [1000, 10000]))
    repeats = opts.repeats or (2 if opts.quick else 5)
    scipy_members = opts.scipy_members or (5 if opts.quick else 20)
    max_unrolled = opts.max_unrolled or (100 if opts.quick else 1000)
    compile_repeats = opts.compile_repeats or (1 if opts.quick else 3)

    with Timer() as wall:
        results = run(members, repeats, scipy_members, max_unrolled, compile_repeats)
    results["wall_s"] = wall.wall
    text = report(results)
    return finish(results, text, opts.json)


if __name__ == "__main__":
    sys.exit(main())
