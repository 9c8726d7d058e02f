"""Where reverse and forward mode spend their time on batched states (issue 12).

Two problems, float64, RK4 with a fixed step, Lotka-Volterra with 4 shared parameters:

* ``A``: one batched state of shape ``(members, 2)``, ``n`` steps on ``[0, 10]``,
  ``SaveAt(ts=201 grid times)``, loss ``sum((ys - data)^2)``;
* ``B``: ``jax.vmap`` of a ``(2,)`` solve over the members, saved at ``t1`` only, loss the
  member mean of the sum of the final state (as ``gradients.py``'s ensemble case).

Every row is a function ``p (4,) -> loss`` or ``-> gradient``, compiled once; the table
gives its run time (best of ``--repeats`` calls, round-robin, after a warm-up), the
ratio to the forward of its problem, the compile time, the largest relative difference
to ``Direct()``'s gradient, and the kernels per iteration of its loops in the optimized
HLO (``trip count x kernels``, as ``gradients.py`` counts them). The rows isolate the
suspected causes:

* the strategies: ``Direct``, ``Checkpointed``, ``ForwardMode``;
* save-time insertion (A): save at ``t1`` only, save times off the grid;
* the parameter container (A): a ``dict``, one array, against the tuple;
* checkpoint segment length (A and B): ``steps_per_segment`` values;
* the scan body's bookkeeping: a hand-written RK4 loop with the same checkpointing
  (``floor ckpt``), no checks, counts or time selects;
* floors: the hand-derived adjoint (no autodiff; B is ``gradients.py``'s, A the same
  with the save-time cotangents injected at segment ends), and on B a custom VJP per
  segment applying ``jax.vjp`` of one hand-written RK4 step (``segment vjp``).

Usage::

    flock -x /tmp/simlib_cpu.lock python benchmarks/grad_diagnose.py [--only A] [--rows REGEX]
"""

import jax

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402

import gradients as g  # noqa: E402  (benchmarks/gradients.py, next to this file)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import compile_jit, round_robin  # noqa: E402  (benchmarks/_timing.py)
from jax import lax  # noqa: E402

import simlib as sl  # noqa: E402

T0, T1 = 0.0, 10.0
P0 = jnp.asarray(g.LV_ARGS, jnp.float64)
DATA_P = jnp.asarray(g.DATA_ARGS, jnp.float64)
N_SAVE = 201


def lv_tuple(t, y, a):
    al, be, ga, de = a
    x, z = y[..., 0], y[..., 1]
    return jnp.stack([al * x - be * x * z, -ga * z + de * x * z], axis=-1)


def lv_dict(t, y, a):
    return lv_tuple(t, y, (a["alpha"], a["beta"], a["gamma"], a["delta"]))


def lv_array(t, y, a):
    return lv_tuple(t, y, (a[0], a[1], a[2], a[3]))


def pack(p, kind):
    if kind == "dict":
        return dict(alpha=p[0], beta=p[1], gamma=p[2], delta=p[3])
    if kind == "array":
        return p
    return tuple(p[i] for i in range(4))


FIELDS = {"tuple": lv_tuple, "dict": lv_dict, "array": lv_array}


# ---- problem A: one batched (members, 2) state, SaveAt(ts)

def a_ts(n, off_grid=False):
    ts = np.linspace(T0, T1, N_SAVE)
    if off_grid:  # a third of a step after each grid time (the first stays at t0)
        ts = np.concatenate([ts[:1], ts[1:] - (T1 - T0) / n / 3])
    return ts


def a_solve(n, members, adjoint, params="tuple", save="ts", off_grid=False):
    dt = (T1 - T0) / n
    y0 = g.ensemble_y0(members)
    saveat = sl.SaveAt(ts=a_ts(n, off_grid)) if save == "ts" else sl.SaveAt(t1=True)
    f = FIELDS[params]

    def run(p):
        return sl.solve(f, y0, T0, T1, solver=sl.RK4(), dt=dt, args=pack(p, params),
                        saveat=saveat, adjoint=adjoint).ys
    return run


def a_loss(n, members, adjoint, params="tuple", save="ts", off_grid=False):
    run = a_solve(n, members, adjoint, params, save, off_grid)
    data = a_solve(n, members, sl.Direct(), params, save, off_grid)(DATA_P)
    return lambda p: jnp.sum(jnp.square(run(p) - data))


def a_floor(n, members, segment, hand):
    """Hand-written RK4 on the batched state, saving at the end of every segment of
    ``segment`` steps (``n / segment`` must divide into the 200 save intervals): plain
    autodiff through ``jax.checkpoint`` segments, or (``hand``) the discrete adjoint
    written out, parameter cotangents kept per member and summed once."""
    dt = (T1 - T0) / n
    n_seg = n // segment
    assert n % segment == 0 and n_seg == N_SAVE - 1
    y0 = g.ensemble_y0(members)

    def f(x, z, a):
        al, be, ga, de = a
        return al * x - be * x * z, -ga * z + de * x * z

    def f_vjp(x, z, gx, gz, a):
        al, be, ga, de = a
        return (gx * (al - be * z) + gz * de * z, -gx * be * x + gz * (de * x - ga),
                (gx * x, -gx * x * z, -gz * z, gz * x * z))

    def stages(x, z, a):
        k1 = f(x, z, a)
        y2 = (x + 0.5 * dt * k1[0], z + 0.5 * dt * k1[1])
        k2 = f(*y2, a)
        y3 = (x + 0.5 * dt * k2[0], z + 0.5 * dt * k2[1])
        k3 = f(*y3, a)
        y4 = (x + dt * k3[0], z + dt * k3[1])
        return (k1, k2, k3, f(*y4, a)), (y2, y3, y4)

    def step(y, a):
        (k1, k2, k3, k4), _ = stages(*y, a)
        return tuple(y[i] + dt / 6 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) for i in (0, 1))

    def seg_states(y, a):
        return lax.scan(lambda y, _: (step(y, a), y), y, None, length=segment)

    def forward(p):
        a = tuple(p[i] for i in range(4))
        y, (starts, ends) = lax.scan(
            lambda y, _: (lambda y1: (y1, (y, y1)))(seg_states(y, a)[0]),
            (y0[:, 0], y0[:, 1]), None, length=n_seg)
        ys = jnp.stack([jnp.concatenate([y0[None, :, 0], ends[0]]),
                        jnp.concatenate([y0[None, :, 1], ends[1]])], axis=-1)
        return ys, starts

    if not hand:
        def ckpt(p):
            a = tuple(p[i] for i in range(4))
            inner = jax.checkpoint(lambda y: seg_states(y, a)[0])
            _, ends = lax.scan(lambda y, _: (lambda y1: (y1, y1))(inner(y)),
                               (y0[:, 0], y0[:, 1]), None, length=n_seg)
            return jnp.stack([jnp.concatenate([y0[None, :, 0], ends[0]]),
                              jnp.concatenate([y0[None, :, 1], ends[1]])], axis=-1)
        run = ckpt
    else:
        @jax.custom_vjp
        def run(p):
            return forward(p)[0]

        def run_fwd(p):
            ys, starts = forward(p)
            return ys, (p, starts)

        def run_bwd(res, d_ys):
            p, starts = res
            a = tuple(p[i] for i in range(4))

            def back_step(c, y):
                gx, gz, acc = c
                x, z = y
                _, (y2, y3, y4) = stages(x, z, a)
                r4 = f_vjp(*y4, dt / 6 * gx, dt / 6 * gz, a)
                r3 = f_vjp(*y3, dt / 3 * gx + dt * r4[0], dt / 3 * gz + dt * r4[1], a)
                r2 = f_vjp(*y2, dt / 3 * gx + 0.5 * dt * r3[0], dt / 3 * gz + 0.5 * dt * r3[1],
                           a)
                r1 = f_vjp(x, z, dt / 6 * gx + 0.5 * dt * r2[0],
                           dt / 6 * gz + 0.5 * dt * r2[1], a)
                rs = (r1, r2, r3, r4)
                gx = gx + sum(r[0] for r in rs)
                gz = gz + sum(r[1] for r in rs)
                acc = tuple(acc[j] + sum(r[2][j] for r in rs) for j in range(4))
                return (gx, gz, acc), None

            def back_segment(c, xs):
                start, d_end = xs
                gx, gz, acc = c
                c = (gx + d_end[:, 0], gz + d_end[:, 1], acc)
                _, ys = seg_states(start, a)
                c, _ = lax.scan(back_step, c, ys, reverse=True)
                return c, None

            zero = jnp.zeros(members)
            (gx, gz, acc), _ = lax.scan(back_segment, (zero, zero, (zero,) * 4),
                                        (starts, d_ys[1:]), reverse=True)
            return (jnp.stack([jnp.sum(x) for x in acc]),)

        run.defvjp(run_fwd, run_bwd)

    data = forward(DATA_P)[0]
    return lambda p: jnp.sum(jnp.square(run(p) - data))


# ---- problem B: vmap of a (2,) solve, t1 only

def b_floor_segment_vjp(n, segment):
    """The ``final`` loss of one member (a ``(2,)`` state) as a ``custom_vjp`` over
    checkpointed segments whose backward sweep stores the states of a segment and applies
    ``jax.vjp`` of one RK4 step: residuals are states, not stages, and under the member
    ``vmap`` the parameter cotangents stay per member until the end (the brief's
    "custom VJP per segment", modelled on the hand-written RK4)."""
    dt = (T1 - T0) / n
    n_seg = n // segment

    def step(y, p):
        a = tuple(p[i] for i in range(4))
        k1 = g.LV(0.0, y, a)
        k2 = g.LV(0.0, y + 0.5 * dt * k1, a)
        k3 = g.LV(0.0, y + 0.5 * dt * k2, a)
        k4 = g.LV(0.0, y + dt * k3, a)
        return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

    def seg(y, p):
        return lax.scan(lambda y, _: (step(y, p), y), y, None, length=segment)

    def forward(p, y0):
        return lax.scan(lambda y, _: (seg(y, p)[0], y), y0, None, length=n_seg)

    @jax.custom_vjp
    def one(p, y0):
        return jnp.sum(forward(p, y0)[0])

    def one_fwd(p, y0):
        y, starts = forward(p, y0)
        return jnp.sum(y), (p, starts)

    def one_bwd(res, ct):
        p, starts = res

        def back(c, y):
            gy, gp = c
            _, vjp = jax.vjp(step, y, p)
            dy, dp = vjp(gy)
            return (dy, gp + dp), None

        def back_segment(c, start):
            _, ys = seg(start, p)
            return lax.scan(back, c, ys, reverse=True)[0], None

        (gy, gp), _ = lax.scan(back_segment, (jnp.full(2, ct), jnp.zeros_like(p)), starts,
                               reverse=True)
        return gp, gy

    one.defvjp(one_fwd, one_bwd)
    return one


def b_loss(n, members, adjoint):
    return g.make_loss(g.simlib_one(sl.RK4(), "final", n, adjoint, None), members)


def rows(n, members, seg_lengths):
    """name -> (problem, kind, fn)."""
    seg = g._divisor_near_sqrt(n)
    ck = sl.Checkpointed()
    out = {}
    # A
    out["A forward"] = ("A", "forward", a_loss(n, members, None))
    for label, adj in (("Direct", sl.Direct()), ("Checkpointed", ck),
                       ("ForwardMode", sl.ForwardMode())):
        out[f"A {label}"] = ("A", "grad", jax.grad(a_loss(n, members, adj)))
    out["A jacfwd (Direct)"] = ("A", "grad", jax.jacfwd(a_loss(n, members, sl.Direct())))
    out["A forward, t1 only"] = ("A", "forward", a_loss(n, members, None, save="t1"))
    out["A Checkpointed, t1 only"] = ("A", "grad",
                                      jax.grad(a_loss(n, members, ck, save="t1")))
    out["A ForwardMode, t1 only"] = ("A", "grad",
                                     jax.grad(a_loss(n, members, sl.ForwardMode(), save="t1")))
    out["A forward, ts off grid"] = ("A", "forward", a_loss(n, members, None, off_grid=True))
    out["A Checkpointed, ts off grid"] = ("A", "grad",
                                          jax.grad(a_loss(n, members, ck, off_grid=True)))
    for params in ("dict", "array"):
        out[f"A forward, args {params}"] = ("A", "forward",
                                            a_loss(n, members, None, params=params))
        out[f"A Checkpointed, args {params}"] = (
            "A", "grad", jax.grad(a_loss(n, members, ck, params=params)))
        out[f"A ForwardMode, args {params}"] = (
            "A", "grad", jax.grad(a_loss(n, members, sl.ForwardMode(), params=params)))
    for s in seg_lengths:
        out[f"A Checkpointed({s})"] = ("A", "grad",
                                       jax.grad(a_loss(n, members, sl.Checkpointed(s))))
    if n % (N_SAVE - 1) == 0:
        s = n // (N_SAVE - 1)
        out["A floor forward"] = ("A", "forward", a_floor(n, members, s, hand=False))
        out[f"A floor grad ckpt ({s})"] = ("A", "grad",
                                           jax.grad(a_floor(n, members, s, hand=False)))
        out[f"A floor hand adjoint ({s})"] = ("A", "grad",
                                              jax.grad(a_floor(n, members, s, hand=True)))
    # B
    out["B forward"] = ("B", "forward", b_loss(n, members, None))
    for label, adj in (("Direct", sl.Direct()), ("Checkpointed", ck),
                       ("ForwardMode", sl.ForwardMode())):
        out[f"B {label}"] = ("B", "grad", jax.grad(b_loss(n, members, adj)))
    out["B jacfwd (Direct)"] = ("B", "grad", jax.jacfwd(b_loss(n, members, sl.Direct())))
    for s in seg_lengths:
        out[f"B Checkpointed({s})"] = ("B", "grad",
                                       jax.grad(b_loss(n, members, sl.Checkpointed(s))))
    out["B floor forward"] = ("B", "forward", g.make_loss(g.floor_one(n), members))
    out[f"B floor grad ckpt ({seg})"] = ("B", "grad",
                                         jax.grad(g.make_loss(g.floor_one(n, seg), members)))
    out[f"B floor segment vjp ({seg})"] = (
        "B", "grad", jax.grad(g.make_loss(b_floor_segment_vjp(n, seg), members)))
    out[f"B floor hand adjoint ({seg})"] = (
        "B", "grad", jax.grad(g.make_loss(g.floor_adjoint_one(n, seg), members)))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--members", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", choices=("A", "B"), default=None)
    ap.add_argument("--rows", default=None, help="regex: run only the matching rows "
                    "(the forward of each problem always runs)")
    ap.add_argument("--segments", type=int, nargs="*", default=[50, 500])
    opts = ap.parse_args(argv)

    table = rows(opts.steps, opts.members, opts.segments)
    table = {k: v for k, v in table.items()
             if (opts.only is None or v[0] == opts.only)
             and (opts.rows is None or k in ("A forward", "B forward")
                  or re.search(opts.rows, k))}
    p = P0
    print(f"simlib {sl.__file__} | jax {jax.__version__} | {opts.members} members, "
          f"{opts.steps} steps, RK4, float64")
    compiled, comp_t, kernels = {}, {}, {}
    for name, (_, _, fn) in table.items():
        compiled[name], comp_t[name] = compile_jit(fn, p, cold=True)
        kernels[name] = g.loop_kernels(compiled[name])
    timings = round_robin({name: (lambda c=c: c(p)) for name, c in compiled.items()},
                          opts.repeats, slow_s=math.inf)
    values = {name: np.asarray(t.out) for name, t in timings.items()}
    best = {name: t.best for name, t in timings.items()}
    print(f"{'row':38s} {'time':>9s} {'/fwd':>7s} {'compile':>8s} {'rel diff':>9s}  loops "
          "(trip x kernels)")
    for name, (prob, kind, _) in table.items():
        # a variant of the problem (", t1 only", ", args dict", ...) is divided by its own
        # forward and compared with its own Direct gradient when those ran
        variant = name.split(",", 1)[1] if "," in name else ""
        fwd = best.get(f"{prob} forward,{variant}", best[f"{prob} forward"])
        ref = values.get(f"{prob} Direct,{variant}" if variant else f"{prob} Direct")
        if ref is None and variant:
            ref = values.get(f"{prob} Checkpointed,{variant}")
        diff = ("" if kind != "grad" or ref is None else
                f"{np.max(np.abs(values[name] - ref)) / np.max(np.abs(ref)):.1e}")
        loops = ", ".join(f"{t} x {k}" for t, k in kernels[name])
        print(f"{name:38s} {best[name] * 1e3:7.1f}ms {best[name] / fwd:6.2f}x "
              f"{comp_t[name]:7.2f}s {diff:>9s}  {loops}")


if __name__ == "__main__":
    main()
