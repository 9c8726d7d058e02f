"""Ensemble SDE benchmark: simlib's Euler-Maruyama against diffrax, a plain scan and numpy.

Two scalar Ito SDEs on ``t in [0, 1]``, ``x0 = 1``, parameters passed through ``args``:

* ``ou``:  Ornstein-Uhlenbeck ``dx = -theta (x - mu) dt + sigma dW`` (theta 1, mu 0.5,
  sigma 0.5: additive noise);
* ``gbm``: geometric Brownian motion ``dx = mu x dt + sigma x dW`` (mu 0.05, sigma 0.2:
  multiplicative noise),

an ensemble of ``--members`` independent paths (default 10,000), 1,000 Euler-Maruyama steps
of ``dt = 1e-3``, saving only ``t1``, in float32 and float64. Contenders:

* ``simlib vmap``       ``jit(vmap(lambda key: simlib.solve(..., key=key).ys[-1]))`` over
                        one key per member (``jax.random.split``): every member's path is a
                        function of its own key only;
* ``simlib batched``    one ``simlib.solve`` on the ``(N,)`` state with diagonal noise and a
                        single key;
* ``simlib steps vmap``, ``simlib steps batched``: the same with ``brownian="steps"`` (one
                        hashed normal per step and channel, no tree: reproducible for a
                        given key and step sequence, but the path changes with ``dt``, like
                        diffrax's unsafe path; the fair peer of ``diffrax unsafe`` and of
                        the numpy loop);
* ``diffrax VBT``       ``jit(vmap(diffeqsolve))`` with ``Euler()``, a
                        ``VirtualBrownianTree(tol=dt/2)`` per member (reproducible paths,
                        like simlib's), ``ConstantStepSize``, ``ForwardMode`` (diffrax's
                        cheapest loop for a solve that is not differentiated);
* ``diffrax unsafe``    the same with ``UnsafeBrownianPath`` (one normal draw per step,
                        paths not reproducible across step sequences);
* ``plain scan``        all increments drawn up front with ``jax.random.normal`` (JAX's
                        default threefry generator), then a ``lax.scan`` of the update on the
                        ``(N,)`` state: the floor a hand-written JAX loop reaches, drawing
                        included;
* ``numpy loop``        a Python loop of 1,000 vectorised updates of the ``(N,)`` array,
                        ``numpy.random.default_rng(0).standard_normal`` (PCG64, ziggurat)
                        drawn step by step, in the target dtype.

Timing: every JAX contender is jitted; compile time is the wall time of
``jax.jit(fn).lower(...).compile()`` after ``jax.clear_caches()`` (best of
``--compile-repeats``); run time is the best of ``--repeats`` calls after one untimed
warm-up call, with ``block_until_ready``; the contenders of one case are timed in turn,
repeat by repeat, so machine load hits them alike. The slow ``diffrax VBT`` gets
``--vbt-repeats`` calls (default 2) and, with ``--vbt-members`` below ``--members``, is run on
fewer members and scaled linearly (marked ``*``; vmap over independent members is linear).
Every contender's ensemble at ``t1`` is checked against the closed-form mean and variance
(a z-score each; the Euler-Maruyama bias at ``dt = 1e-3`` is far below the sampling error).

Usage::

    python benchmarks/sde.py                   # 10,000 members, both problems and dtypes
    python benchmarks/sde.py --quick           # 1,000 members, 2 repeats (~30 s)
    python benchmarks/sde.py --cases ou:float64 --repeats 3

With ``--cases`` a subset, the other cases already in the JSON file are kept (so the full
table can be produced in several shorter runs); the report covers every case in the file.
"""

import jax

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _format import finish, fmt_r, fmt_s, optional_import, simlib_commit  # noqa: E402  (benchmarks/_format.py)
from _timing import Timer, compile_jit, round_robin, warm_up  # noqa: E402  (benchmarks/_timing.py)
from jax import lax  # noqa: E402

import simlib as sl  # noqa: E402
from simlib import systems  # noqa: E402

diffrax, DIFFRAX_ERROR = optional_import("diffrax")

T0, T1 = 0.0, 1.0
STEPS = 1000
DT = (T1 - T0) / STEPS
X0 = 1.0
SEED = 0
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "sde.json"
ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------------------
# the problems: drift and diffusion written once for any state shape (one member or (N,))


def ou_moments(args, t):
    """Exact mean and variance of the OU process at ``t`` from ``x0``."""
    m, v = systems.ornstein_uhlenbeck_moments(X0, t, args)
    return float(m), float(v)


def gbm_moments(args, t):
    """Exact GBM mean and variance at ``t``: ``x0 e^{mu t}``, ``mean^2 (e^{sigma^2 t} - 1)``."""
    m, v = systems.geometric_brownian_motion_moments(X0, t, args)
    return float(m), float(v)


PROBLEMS = {
    "ou": dict(drift=systems.ornstein_uhlenbeck_drift,
               diffusion=systems.ornstein_uhlenbeck_diffusion, args=(1.0, 0.5, 0.5),
               moments=ou_moments, label="Ornstein-Uhlenbeck (additive noise)"),
    "gbm": dict(drift=systems.geometric_brownian_motion_drift,
                diffusion=systems.geometric_brownian_motion_diffusion, args=(0.05, 0.2),
                moments=gbm_moments, label="geometric Brownian motion (multiplicative noise)"),
}
DTYPES = {"float32": jnp.float32, "float64": jnp.float64}


def _args(problem, dtype):
    return tuple(jnp.asarray(a, dtype) for a in PROBLEMS[problem]["args"])


# --------------------------------------------------------------------------------------
# contenders: each returns (jitted function, its arguments) or raises/returns a skip reason


def make_simlib(problem, dtype, n, batched=False, brownian="tree"):
    p = PROBLEMS[problem]
    if not hasattr(sl, "EulerMaruyama"):
        return "simlib has no EulerMaruyama on this checkout"
    extra = {} if brownian == "tree" else {"brownian": brownian}

    def one(key, args):
        x0 = jnp.full((n,) if batched else (), X0, dtype)
        sol = sl.solve(p["drift"], x0, T0, T1, solver=sl.EulerMaruyama(), dt=DT,
                       diffusion=p["diffusion"], key=key, args=args,
                       saveat=sl.SaveAt(t1=True), **extra)
        return sol.ys[-1]

    if batched:
        return jax.jit(one), (jax.random.key(SEED), _args(problem, dtype))
    keys = jax.random.split(jax.random.key(SEED), n)
    return jax.jit(jax.vmap(one, in_axes=(0, None))), (keys, _args(problem, dtype))


def make_diffrax(problem, dtype, n, unsafe):
    if diffrax is None:
        return f"diffrax not importable ({DIFFRAX_ERROR})"
    p = PROBLEMS[problem]

    def one(key, args):
        shape = jax.ShapeDtypeStruct((), dtype)
        if unsafe:
            bm = diffrax.UnsafeBrownianPath(shape=shape, key=key)
        else:
            bm = diffrax.VirtualBrownianTree(T0, T1, tol=DT / 2, shape=shape, key=key)
        terms = diffrax.MultiTerm(diffrax.ODETerm(p["drift"]),
                                  diffrax.ControlTerm(p["diffusion"], bm))
        sol = diffrax.diffeqsolve(terms, diffrax.Euler(), T0, T1, dt0=DT,
                                  y0=jnp.asarray(X0, dtype), args=args,
                                  saveat=diffrax.SaveAt(t1=True), max_steps=STEPS + 8,
                                  adjoint=diffrax.ForwardMode())
        return sol.ys[-1]

    keys = jax.random.split(jax.random.key(SEED), n)
    return jax.jit(jax.vmap(one, in_axes=(0, None))), (keys, _args(problem, dtype))


def make_scan(problem, dtype, n):
    p = PROBLEMS[problem]
    drift, diffusion = p["drift"], p["diffusion"]

    def run(key, args):
        dt = jnp.asarray(DT, dtype)
        dw = jax.random.normal(key, (STEPS, n), dtype) * jnp.sqrt(dt)

        def body(carry, dw_k):
            t, x = carry
            x = x + drift(t, x, args) * dt + diffusion(t, x, args) * dw_k
            return (t + dt, x), None

        (_, x), _ = lax.scan(body, (jnp.asarray(T0, dtype), jnp.full((n,), X0, dtype)), dw)
        return x

    return jax.jit(run), (jax.random.key(SEED), _args(problem, dtype))


def numpy_loop(problem, dtype, n):
    """The vectorised numpy Euler-Maruyama loop (drift and diffusion inlined)."""
    np_dtype = np.dtype(dtype)
    rng = np.random.default_rng(SEED)
    dt = np_dtype.type(DT)
    sqdt = np_dtype.type(math.sqrt(DT))
    x = np.full(n, X0, np_dtype)
    if problem == "ou":
        theta, mu, sigma = (np_dtype.type(a) for a in PROBLEMS["ou"]["args"])
        for _ in range(STEPS):
            x += (-theta * dt) * (x - mu) + (sigma * sqdt) * rng.standard_normal(n, np_dtype)
    else:
        mu, sigma = (np_dtype.type(a) for a in PROBLEMS["gbm"]["args"])
        for _ in range(STEPS):
            x *= (1 + mu * dt) + (sigma * sqdt) * rng.standard_normal(n, np_dtype)
    return x


# --------------------------------------------------------------------------------------
# timing


def moment_check(x, problem):
    """z-scores of the sample mean and variance at t1 against the closed forms."""
    x = np.asarray(x, np.float64)
    m, v = PROBLEMS[problem]["moments"](PROBLEMS[problem]["args"], T1)
    n = x.size
    z_mean = (x.mean() - m) / math.sqrt(v / n)
    # var of the sample variance: (mu4 - v^2 (n-3)/(n-1)) / n, with the sample 4th moment
    mu4 = np.mean((x - x.mean()) ** 4)
    z_var = (x.var(ddof=1) - v) / math.sqrt(max(mu4 - v * v * (n - 3) / (n - 1), 1e-300) / n)
    return dict(mean=float(x.mean()), var=float(x.var(ddof=1)), exact_mean=m, exact_var=v,
                z_mean=float(z_mean), z_var=float(z_var), finite=bool(np.isfinite(x).all()))


def run_case(problem, dtype_name, n, repeats, vbt_repeats, vbt_members, compile_repeats,
             names):
    dtype = DTYPES[dtype_name]
    builders = {
        "simlib vmap": lambda m: make_simlib(problem, dtype, m),
        "simlib batched": lambda m: make_simlib(problem, dtype, m, batched=True),
        "simlib steps vmap": lambda m: make_simlib(problem, dtype, m, brownian="steps"),
        "simlib steps batched": lambda m: make_simlib(problem, dtype, m, batched=True,
                                                      brownian="steps"),
        "diffrax VBT": lambda m: make_diffrax(problem, dtype, m, unsafe=False),
        "diffrax unsafe": lambda m: make_diffrax(problem, dtype, m, unsafe=True),
        "plain scan": lambda m: make_scan(problem, dtype, m),
        "numpy loop": None,
    }
    out = {}
    timed = {}
    for name in names:
        members = vbt_members if name == "diffrax VBT" else n
        entry = dict(members=members, scaled=members != n)
        out[name] = entry
        if name == "numpy loop":
            timed[name] = (lambda: numpy_loop(problem, dtype, n)), 1
            continue
        try:
            made = builders[name](members)
        except Exception as err:  # noqa: BLE001 - a contender that cannot be built is skipped
            made = f"{type(err).__name__}: {err}"
        if isinstance(made, str):
            entry["skipped"] = made
            print(f"  {name}: skipped ({made})", flush=True)
            continue
        fn, args = made
        try:
            entry["compile_s"] = compile_jit(fn, *args, cold=True, repeats=compile_repeats)[1]
        except Exception as err:  # noqa: BLE001
            entry["skipped"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            print(f"  {name}: failed ({entry['skipped']})", flush=True)
            continue
        timed[name] = (lambda fn=fn, args=args: fn(*args)), (n / members)
        print(f"  {name}: compile {fmt_s(entry['compile_s'])}", flush=True)
    # warm-ups after every compile-time measurement: a cold compile clears JAX's caches, so
    # a contender warmed up before the next one's measurement would compile again when timed
    warmed = {}
    for name, (call, _) in timed.items():
        if name != "numpy loop":
            warmed[name] = warm_up(call)
            out[name]["first_call_s"] = warmed[name].warmup
    timings = round_robin(  # the numpy loop's warm-up is made here
        {name: call for name, (call, _) in timed.items()},
        {name: vbt_repeats if name == "diffrax VBT" else repeats for name in timed},
        slow_s=math.inf, warmed=warmed)
    times = {name: t.times for name, t in timings.items()}
    outputs = {name: t.out for name, t in timings.items()}
    for name, (_, scale) in timed.items():
        entry = out[name]
        entry["times_s"] = times[name]
        entry["run_s"] = min(times[name]) * scale
        entry["check"] = moment_check(outputs[name], problem)
        print(f"  {name}: run {fmt_s(entry['run_s'])}{' *' if entry['scaled'] else ''} "
              f"(z mean {entry['check']['z_mean']:+.2f}, z var {entry['check']['z_var']:+.2f})",
              flush=True)
    return out


# --------------------------------------------------------------------------------------
# report

TARGETS = (  # (peer, the simlib contender of the same kind, minimal ratio, the target)
    ("diffrax VBT", "simlib vmap", 5.0, ">= 5x diffrax with reproducible paths (tree)"),
    ("diffrax unsafe", "simlib steps vmap", 2.0,
     ">= 2x diffrax's unsafe path (brownian='steps', both vmap)"),
    ("numpy loop", "simlib steps batched", 1.0,
     "faster than the numpy loop (brownian='steps', both on the (N,) state)"),
)


def report(results) -> str:
    lines = [f"simlib {results['simlib_version']} ({results['simlib_commit']}) | jax "
             f"{results['jax']} | diffrax {results['diffrax']} | numpy {results['numpy']} | "
             f"{results['backend']} | {results['cpus']} cpus | {results['date']}",
             f"Euler-Maruyama, {STEPS} steps of dt = {DT:g} on [0, 1], x0 = 1, save t1 only; "
             "run: best of repeats after a warm-up; ratio = contender / simlib vmap "
             "(> 1: simlib faster); * = measured on fewer members, scaled linearly", ""]
    for case, res in sorted(results["cases"].items()):
        problem, dtype_name = case.split(":")
        n = res["members"]
        lines.append(f"{case}: {PROBLEMS[problem]['label']}, {n} members, {dtype_name} "
                     f"(repeats {res['repeats']})")
        lines.append(f"  {'contender':<21}{'compile':>10}{'run':>12}{'ratio':>10}"
                     f"{'z mean':>9}{'z var':>8}")
        ref = res["contenders"].get("simlib vmap", {}).get("run_s")
        for name, e in res["contenders"].items():
            if "skipped" in e:
                lines.append(f"  {name:<21}skipped: {e['skipped']}")
                continue
            ratio = e["run_s"] / ref if ref else None
            star = " *" if e.get("scaled") else "  "
            lines.append(f"  {name:<21}{fmt_s(e.get('compile_s')):>10}{fmt_s(e['run_s']):>10}"
                         f"{star}{fmt_r(ratio):>10}{e['check']['z_mean']:>+9.2f}"
                         f"{e['check']['z_var']:>+8.2f}")
        verdicts = []
        for peer, mine, need, what in TARGETS:
            e = res["contenders"].get(peer, {})
            m = res["contenders"].get(mine, {})
            if "run_s" in e and "run_s" in m:
                r = e["run_s"] / m["run_s"]
                verdicts.append(f"{what}: {r:.2f}x {'met' if r >= need else 'NOT met'}")
        if verdicts:
            lines.append("  targets:")
            lines.extend(f"    {v}" for v in verdicts)
        lines.append("")
    return "\n".join(lines).rstrip()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", type=int, default=None,
                        help="paths per ensemble (default 10000; --quick: 1000)")
    parser.add_argument("--cases", nargs="+", default=None,
                        help="problem:dtype pairs (default ou:float32 ou:float64 gbm:float32 "
                        "gbm:float64)")
    parser.add_argument("--contenders", nargs="+", default=None,
                        help="subset of: simlib-vmap simlib-batched simlib-steps-vmap "
                        "simlib-steps-batched diffrax-VBT diffrax-unsafe plain-scan numpy-loop "
                        "(default all)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per contender, best taken (default 5; --quick: 2)")
    parser.add_argument("--vbt-repeats", type=int, default=None,
                        help="timed calls of diffrax VBT (default 2; --quick: 1)")
    parser.add_argument("--vbt-members", type=int, default=None,
                        help="members of the diffrax VBT run, scaled linearly to --members "
                        "(default: --members)")
    parser.add_argument("--compile-repeats", type=int, default=None,
                        help="compilations per contender, best taken (default 2; --quick: 1)")
    parser.add_argument("--quick", action="store_true",
                        help="1,000 members, 2 repeats, 1 compile")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH,
                        help=f"results file (default {RESULTS_PATH})")
    opts = parser.parse_args(argv)
    n = opts.members or (1000 if opts.quick else 10000)
    repeats = opts.repeats or (2 if opts.quick else 5)
    vbt_repeats = opts.vbt_repeats or (1 if opts.quick else 2)
    vbt_members = min(opts.vbt_members or n, n)
    compile_repeats = opts.compile_repeats or (1 if opts.quick else 2)
    cases = opts.cases or ["ou:float32", "ou:float64", "gbm:float32", "gbm:float64"]
    all_names = ["simlib vmap", "simlib batched", "simlib steps vmap", "simlib steps batched",
                 "diffrax VBT", "diffrax unsafe",
                 "plain scan", "numpy loop"]
    names = all_names
    if opts.contenders:
        wanted = {c.replace("-", " ") for c in opts.contenders}
        bad = wanted - set(all_names)
        if bad:
            parser.error(f"unknown contenders {sorted(bad)}")
        names = [c for c in all_names if c in wanted]
    for case in cases:
        problem, _, dtype_name = case.partition(":")
        if problem not in PROBLEMS or dtype_name not in DTYPES:
            parser.error(f"bad case {case!r}: use problem:dtype with problem in "
                         f"{list(PROBLEMS)} and dtype in {list(DTYPES)}")

    with Timer() as wall:
        previous = {}
        if opts.cases and opts.json.exists():
            try:
                previous = json.loads(opts.json.read_text()).get("cases", {})
            except (OSError, ValueError):
                previous = {}
        results = dict(
            date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            simlib_version=sl.__version__, simlib_commit=simlib_commit(ROOT),
            jax=jax.__version__, diffrax=getattr(diffrax, "__version__", "n/a"),
            numpy=np.__version__, backend=jax.default_backend(), cpus=os.cpu_count(),
            machine=platform.processor() or platform.machine(), cases=dict(previous),
        )
        for case in cases:
            problem, _, dtype_name = case.partition(":")
            print(f"{case}, {n} members", flush=True)
            res = run_case(problem, dtype_name, n, repeats, vbt_repeats, vbt_members,
                           compile_repeats, names)
            results["cases"][case] = dict(members=n, repeats=repeats, vbt_repeats=vbt_repeats,
                                          contenders=res, date=results["date"],
                                          simlib_commit=results["simlib_commit"])
    results["wall_s"] = wall.wall
    return finish(results, report(results), opts.json)


if __name__ == "__main__":
    sys.exit(main())
