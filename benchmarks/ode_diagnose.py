"""Where simlib's ensemble time goes: the measurements behind benchmarks/README.md.

1. Host callbacks under ``vmap``: the number of callback equations in the jaxpr of
   ``jit(vmap(solve))`` for N members. With ``throw=True`` (the default) simlib's
   in-graph error check ``jax.debug.callback`` is unrolled once per member by
   ``vmap``: compile time and run time grow linearly with N.
2. Compile time split into tracing, lowering and XLA compilation.
3. The fixed-step per-step overhead, built up from the hand-written floor: a vmapped
   ``lax.scan`` of Tsit5 steps, then plus a per-step finiteness check with selects of
   the state and the FSAL stage, then plus per-member time, grid index and step count
   (what simlib's fixed-step body did before commit 99bea23); next to the current
   ``simlib.solve``.
4. The adaptive step under vmap: the hand-written floor (simlib's controller, three
   ``pow`` per attempt) against the same loop with the PI factor taken in log space
   (``exp`` of a combination of ``log r`` and ``log r_prev``) and with no
   transcendental at all (a constant factor: a bound, not a controller).

Usage::

    python benchmarks/ode_diagnose.py [--repeats 9]
"""

import jax

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import ode  # noqa: E402  (benchmarks/ode.py, next to this file)
from _timing import compile_stages, warm_up  # noqa: E402  (benchmarks/_timing.py)
from jax import lax  # noqa: E402


def callback_counts():
    print("1. host-callback equations in the jaxpr of jit(vmap(solve)) [fixed step]")
    for throw in (True, False):
        fn = ode.simlib_fn("fixed", batched=False, throw=throw)
        counts = []
        for n in (2, 4, 100):
            text = str(jax.make_jaxpr(fn)(ode.initial_conditions(n), ode.jargs()))
            counts.append(f"N={n}: {text.count('callback[')}")
        print(f"   simlib throw={throw!s:5s}  " + ", ".join(counts))
    if ode.diffrax is not None:
        fn = ode.diffrax_fn("fixed", batched=False)
        counts = []
        for n in (2, 4, 100):
            text = str(jax.make_jaxpr(fn)(ode.initial_conditions(n), ode.jargs()))
            counts.append(f"N={n}: {text.count('callback[')}")
        print("   diffrax (throw=True) " + ", ".join(counts))


def compile_split(n: int = 1000):
    print(f"2. compile time split, N={n} (best of 3, after jax.clear_caches())")
    y0s, args = ode.initial_conditions(n), ode.jargs()
    for case in ("fixed", "adaptive"):
        fns = {"simlib vmap throw=False": ode.simlib_fn(case, False, throw=False),
               "simlib batched": ode.simlib_fn(case, True),
               "floor vmap": ode.FLOORS[case, "floor vmap"]}
        if ode.diffrax is not None:
            fns["diffrax vmap"] = ode.diffrax_fn(case, False)
            fns["diffrax batched"] = ode.diffrax_fn(case, True)
        for name, fn in fns.items():
            traced, best = compile_stages(fn, y0s, args, cold=True, repeats=3)
            eqns = len(str(traced.jaxpr).splitlines())
            print(f"   {case:8s} {name:24s} trace {best[0] * 1e3:5.0f} ms, lower "
                  f"{best[1] * 1e3:4.0f} ms, XLA {best[2] * 1e3:5.0f} ms "
                  f"(jaxpr {eqns} lines)")


def overhead_variant(check: bool, per_member_t: bool):
    """The vmapped floor, optionally with simlib's per-step bookkeeping added."""
    n_steps = round((ode.T1 - ode.T0) / ode.DT)

    def one(y0, args):
        def body(c, kk):
            t, y, k1, k, count, result = c
            if per_member_t:  # t carried per member, the grid point from an index
                g = jnp.where(k + 1 >= n_steps, ode.T1, ode.T0 + (k + 1) * ode.DT)
                h = g - t
            else:
                t, g, h = ode.T0 + kk * ode.DT, ode.T0 + (kk + 1) * ode.DT, ode.DT
            y1, k7, _ = ode._tsit5_step(t, y, h, k1, args)
            if check:  # keep the last finite state, as simlib's fixed-step body does
                ok = (result == 0) & jnp.all(jnp.isfinite(y1))
                result = jnp.where((result == 0) & ~ok, 1, result)
                y1, k7 = jnp.where(ok, y1, y), jnp.where(ok, k7, k1)
                if per_member_t:
                    g = jnp.where(ok, g, t)
                    k, count = k + ok.astype(jnp.int32), count + ok.astype(jnp.int32)
            elif per_member_t:
                k = k + 1
            return (g if per_member_t else t, y1, k7, k, count, result), None

        zero = jnp.array(0, jnp.int32)
        carry0 = (jnp.asarray(ode.T0), y0, ode.lorenz(ode.T0, y0, args), zero, zero, zero)
        carry, _ = lax.scan(body, carry0, jnp.arange(n_steps, dtype=jnp.float64))
        return carry[1]

    return jax.vmap(one, in_axes=(0, None))


def best_compiled(fns: dict, y0s, args, repeats: int) -> dict:
    """Each of ``fns`` compiled on cold caches and warmed up, then timed round-robin:
    ``{name: (best, median)}``."""
    calls = {}
    for name, fn in fns.items():
        compiled, _ = ode.compile_fn(fn, (y0s, args))
        calls[name] = lambda c=compiled, y=y0s, a=args: c(y, a)
        warm_up(calls[name])
    return ode.time_interleaved(calls, repeats)


def step_overhead(repeats: int):
    print("3. fixed step: ns per member-step (best of repeats, timed round-robin)")
    for n in (1000, 10000):
        y0s, args = ode.initial_conditions(n), ode.jargs()
        fns = {"floor vmap": ode.FLOORS["fixed", "floor vmap"],
               "+ finite check, selects": overhead_variant(True, False),
               "+ per-member t, k, count": overhead_variant(True, True),
               "simlib vmap throw=False": ode.simlib_fn("fixed", False, throw=False),
               "floor batched": ode.FLOORS["fixed", "floor batched"],
               "simlib batched": ode.simlib_fn("fixed", True)}
        best = best_compiled(fns, y0s, args, repeats)
        n_steps = round((ode.T1 - ode.T0) / ode.DT)
        print(f"   N={n}: " + ", ".join(
            f"{name} {b / (n * n_steps) * 1e9:.1f}" for name, (b, _) in best.items()))


def floor_adaptive_variant(mode: str):
    """ode.floor_adaptive with the step-size factor computed as ``pow`` (like simlib),
    in log space, or as a constant (``none``); vmapped over members."""
    k = 5.0

    def one(y0, args):
        f0 = ode.lorenz(ode.T0, y0, args)

        def cond(c):
            return (c[0] < ode.T1) & (c[5] < ode.MAX_STEPS)

        def body(c):
            t, y, k1, h, r_prev, n = c
            h = jnp.minimum(h, ode.T1 - t)
            y1, k7, err = ode._tsit5_step(t, y, h, k1, args)
            scale = ode.ATOL + ode.RTOL * jnp.maximum(jnp.abs(y), jnp.abs(y1))
            r = jnp.abs(h) * ode._rms(err / scale)
            accept = r <= 1.0
            rr = jnp.maximum(r, 1e-10)
            if mode == "pow":
                fac = jnp.where(accept, 0.9 * rr ** (-0.7 / k) * r_prev ** (0.4 / k),
                                jnp.minimum(0.9 * rr ** (-1.0 / k), 1.0))
            elif mode == "log space":
                lr = jnp.log(rr)
                e = jnp.where(accept, (-0.7 * lr + 0.4 * jnp.log(r_prev)) / k, -lr / k)
                fac = 0.9 * jnp.exp(e)
                fac = jnp.where(accept, fac, jnp.minimum(fac, 1.0))
            else:
                fac = jnp.where(accept, 1.1, 0.5)
            fac = jnp.clip(fac, 0.2, 10.0)
            return (jnp.where(accept, t + h, t), jnp.where(accept, y1, y),
                    jnp.where(accept, k7, k1), h * fac,
                    jnp.where(accept, jnp.maximum(r, 1e-4), r_prev), n + 1)

        carry0 = (jnp.asarray(ode.T0), y0, f0, jnp.asarray(0.01), jnp.asarray(1.0), 0)
        return lax.while_loop(cond, body, carry0)[1]

    return jax.vmap(one, in_axes=(0, None))


def adaptive_controller(repeats: int):
    print("4. adaptive, vmap: ms per solve (best of repeats, timed round-robin)")
    for n in (1000, 10000):
        y0s, args = ode.initial_conditions(n), ode.jargs()
        fns = {f"floor, factor by {m}": floor_adaptive_variant(m)
               for m in ("pow", "log space", "none")}
        fns["simlib vmap"] = ode.simlib_fn("adaptive", False)
        if ode.diffrax is not None:
            fns["diffrax vmap"] = ode.diffrax_fn("adaptive", False)
        best = best_compiled(fns, y0s, args, repeats)
        print(f"   N={n}: " + ", ".join(f"{name} {b * 1e3:.2f}" for name, (b, _) in best.items()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    opts = parser.parse_args()
    print(f"jax {jax.__version__}, {jax.default_backend()}")
    callback_counts()
    compile_split()
    step_overhead(opts.repeats)
    adaptive_controller(opts.repeats)


if __name__ == "__main__":
    main()
