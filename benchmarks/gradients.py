"""Gradient benchmark: simlib's adjoint strategies against diffrax, and their memory.

Three measurements in one run, float64 throughout:

1. **single**: Lotka-Volterra (``simlib.systems.lotka_volterra``, args
   ``(1.5, 1, 3, 1)``, ``y0 = [10, 5]``, ``t in [0, 10]``), 10^5 fixed steps, gradient
   with respect to the 4 parameters of
   * ``final``: the sum of the final state, and
   * ``ts``: a squared error against 50 "observations" at ``t = 0.2, 0.4, ..., 10``
     (``SaveAt(ts=...)``; the observations are the RK4 solution for the parameters
     ``(1.45, 1.05, 2.9, 0.95)``).
2. **ensemble**: the ``final`` loss averaged over 1,000 members (``vmap`` over initial
   states ``[10, 5] * exp(0.1 * normal)``, PRNG key 0; shared parameters), 10^4 and
   10^5 steps.
3. **memory**: peak resident memory of one gradient against the number of steps
   (10^3 ... 10^6), each (strategy, steps) in a fresh subprocess, on a harmonic chain
   of 1,024 masses (``q, p`` of 1,024 float64 each: 16 KiB per state) with
   ``VelocityVerlet``, so that stored states dominate; the exponent of
   ``peak - baseline`` against the steps is fitted on log-log axes for ``Direct``,
   ``Checkpointed`` and ``Reversible``.

4. **issue 12 cases** (``--cases issue12``), RK4, the gradient with the strategy a user
   gets by default (``adjoint`` omitted), ``ForwardMode()`` and ``Checkpointed()``:
   * ``single ts 5e4``: one trajectory, 5*10^4 steps, squared error at 201 save times
     ``t = 0, 0.05, ..., 10`` (the data: RK4 at ``DATA_ARGS``), 4 parameters;
   * ``batched ts 2e4``: the same loss on one batched ``(512, 2)`` state (the 512
     ensemble initial states), 2*10^4 steps, divided by 512;
   * ``vmap512 final 2e4``: ``jax.vmap`` of one-trajectory solves over the same 512
     initial states, the ``final`` loss, 2*10^4 steps;
   * ``mlp 1e3``: a 2 -> 32 -> 32 -> 2 tanh MLP vector field (1,218 weights, key 0),
     ``y0 = [1, 0.5]``, 10^3 steps on ``[0, 10]``, ``sum(ys^2)`` at 101 save times, the
     gradient with respect to every weight; contenders: the default, ``Checkpointed``,
     ``Direct`` and diffrax ``RecursiveCheckpointAdjoint`` (RK4*, constant steps).
   ``--quick`` divides the steps of the first three by 5. The targets of issue 12 are
   checked: ensembles <= 5x (4x stretch) with the default, ``Checkpointed`` <= 10x on
   ensembles, one small trajectory <= 30x (<= 5x with the small-loop limit raised),
   ``mlp`` <= 10x and faster than diffrax.

Contenders of 1 and 2 (every one ``jax.jit``-compiled):

* ``simlib RK4`` / ``simlib Tsit5``: ``forward`` is the loss with the default adjoint;
  ``Direct``, ``Checkpointed`` (the default above 1,024 steps) and, if simlib has it,
  ``ForwardMode`` are ``jax.grad`` of the loss with that ``adjoint=``;
  ``jacfwd (Direct)`` is ``jax.jacfwd`` through the plain scan (RK4 only), a reference
  for forward-mode cost; in the ensemble, ``vmap(jacfwd) (Direct)`` is the same with
  the tangents inside the member ``vmap`` (where ``ForwardMode`` puts them).
* ``diffrax Tsit5``: ``diffeqsolve`` with ``ConstantStepSize`` and the same steps;
  ``RecursiveCheckpoint`` is ``jax.grad`` with diffrax's default
  ``RecursiveCheckpointAdjoint()`` (about ``sqrt(2 n)`` checkpoints at ``max_steps = n``).
* ``diffrax RK4*``: diffrax has no RK4 class; this is the classical RK4 tableau declared
  through diffrax's own ``AbstractERK`` + ``ButcherTableau`` (no error estimate,
  Hermite dense output, never used since the save times fall on steps). It agrees with
  simlib's RK4 to round-off, so the RK4 rows compare the same arithmetic.
* ``floor RK4`` (``final`` loss only): a hand-written RK4 ``lax.scan`` with no checks,
  saving or bookkeeping; ``grad`` is plain reverse mode through the scan, ``grad ckpt``
  recomputes segments of ~sqrt(n) steps (``jax.checkpoint``), ``grad ckpt+remat`` also
  checkpoints each step (the backward sweep stores one state per step instead of the
  stages). What JAX and XLA give for this loop on this machine, whatever simlib does.
  ``hand adjoint`` is the same RK4 with its discrete adjoint written out by hand (no
  autodiff; scalar state; per-member parameter cotangents): a floor for reverse mode.

Timing as in ``ode.py``: compile time is ``jax.jit(fn).lower(...).compile()`` after
``jax.clear_caches()``; run time is the best of ``--repeats`` calls after one warm-up
call (contenders whose warm-up call takes more than ``--slow-s`` get ``--slow-repeats``
calls; more than ``--once-s``, the warm-up call alone), with ``block_until_ready``,
all contenders of a case timed round-robin.
The gradients of all strategies are compared (max |g - g_ref| / max |g_ref|, the
reference being simlib's ``Direct`` gradient with the same solver).

Usage::

    python benchmarks/gradients.py            # full run (~5-7 minutes on 2 cores)
    python benchmarks/gradients.py --quick    # 10^4 steps, ensemble 2*10^3 steps (~1.5 min)
    python benchmarks/gradients.py --cases issue12 --json benchmarks/results/gradients_issue12.json
    python benchmarks/gradients.py --cases issue12 --fast-cpu-loops \
        --json benchmarks/results/gradients_issue12_fast.json

``--fast-cpu-loops`` calls ``simlib.fast_cpu_loops()`` before JAX starts (XLA:CPU's
small-loop limit raised to 1 MiB, README (g) and ``cpu_loops.py``), as a user would.
"""

import os
import sys

if "--fast-cpu-loops" in sys.argv[1:]:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import simlib

    simlib.fast_cpu_loops()  # before any JAX computation

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import ClassVar  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _format import finish, fmt_r, fmt_s, optional_import, simlib_commit  # noqa: E402  (benchmarks/_format.py, next to this file)
from _timing import Timer, compile_jit, load_average, round_robin, timed, warm_up  # noqa: E402  (benchmarks/_timing.py)
from jax import lax  # noqa: E402
from jax.flatten_util import ravel_pytree  # noqa: E402

import simlib as sl  # noqa: E402

diffrax, DIFFRAX_ERROR = optional_import("diffrax")

HAS_FORWARD_MODE = hasattr(sl, "ForwardMode")
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "gradients.json"

LV = sl.systems.lotka_volterra
LV_ARGS = (1.5, 1.0, 3.0, 1.0)  # alpha, beta, gamma, delta
DATA_ARGS = (1.45, 1.05, 2.9, 0.95)  # parameters that produced the "observations"
Y0 = (10.0, 5.0)
T0, T1 = 0.0, 10.0
N_TS = 50
TS = T1 * np.arange(1, N_TS + 1) / N_TS  # on the step grid when the steps divide by 50
SEED = 0
CHECKPOINT_ABOVE = getattr(sl._solve, "_CHECKPOINT_ABOVE", 1024)

# memory: harmonic chain
CHAIN_T1 = 10.0
CHAIN_ARGS = (1.0, 1.0)  # spring constant, mass
MEM_STRATEGIES = ("Direct", "Checkpointed", "Reversible")


# --------------------------------------------------------------------------------------
# the problem and the contenders: functions p (4,) -> loss, or -> gradient (4,)


def ensemble_y0(members: int) -> jax.Array:
    noise = jax.random.normal(jax.random.PRNGKey(SEED), (members, 2), dtype=jnp.float64)
    return jnp.asarray(Y0) * jnp.exp(0.1 * noise)


def p_args(p):
    return tuple(p[i] for i in range(4))


def make_loss(one, members: int | None):
    """``one(p, y0) -> scalar`` as a loss of ``p``: one trajectory, or the ensemble mean."""
    if members is None:
        y0 = jnp.asarray(Y0)
        return lambda p: one(p, y0)
    y0s = ensemble_y0(members)
    return lambda p: jnp.mean(jax.vmap(one, in_axes=(None, 0))(p, y0s))


def reduce_loss(ys, loss: str, data):
    if loss == "final":
        return jnp.sum(ys[-1])
    return jnp.sum(jnp.square(ys - data))


def simlib_one(solver, loss, n, adjoint, data):
    dt = (T1 - T0) / n
    saveat = sl.SaveAt(ts=TS) if loss == "ts" else sl.SaveAt(t1=True)

    # max_steps: before simlib bda1c26, solve() under jit took SaveAt(ts=...) for traced
    # (see ts_probe) and ran max_steps + len(ts) iterations; n keeps that at the n steps
    # (+ 50 no-ops) there, and changes nothing where the save times are seen as concrete.
    kw = dict(max_steps=n) if loss == "ts" else {}

    def one(p, y0):
        sol = sl.solve(LV, y0, T0, T1, solver=solver, dt=dt, args=p_args(p), saveat=saveat,
                       adjoint=adjoint, **kw)
        return reduce_loss(sol.ys, loss, data)

    return one


if diffrax is not None:

    class DiffraxRK4(diffrax.AbstractERK):
        """The classical RK4 tableau through diffrax's own explicit-RK machinery."""

        tableau: ClassVar = diffrax.ButcherTableau(
            c=np.array([0.5, 0.5, 1.0]),
            b_sol=np.array([1 / 6, 1 / 3, 1 / 3, 1 / 6]),
            b_error=np.zeros(4),
            a_lower=(np.array([0.5]), np.array([0.0, 0.5]), np.array([0.0, 0.0, 1.0])),
        )
        interpolation_cls: ClassVar = diffrax.ThirdOrderHermitePolynomialInterpolation.from_k

        def order(self, terms):
            del terms
            return 4


def diffrax_one(solver_name, loss, n, adjoint, data):
    dt = (T1 - T0) / n
    solver = diffrax.Tsit5() if solver_name == "Tsit5" else DiffraxRK4()
    saveat = diffrax.SaveAt(ts=TS) if loss == "ts" else diffrax.SaveAt(t1=True)
    term = diffrax.ODETerm(LV)
    kw = {} if adjoint is None else dict(adjoint=adjoint)

    def one(p, y0):
        sol = diffrax.diffeqsolve(term, solver, T0, T1, dt, y0, args=p_args(p), saveat=saveat,
                                  stepsize_controller=diffrax.ConstantStepSize(),
                                  max_steps=n + 8, **kw)
        return reduce_loss(sol.ys, loss, data)

    return one


def _divisor_near_sqrt(n: int) -> int:
    root = math.isqrt(n)
    divisors = [d for d in range(1, 2 * root + 2) if n % d == 0]
    return min(divisors, key=lambda d: abs(d - math.sqrt(n)))


def floor_one(n, segment=None, remat_step=False):
    """Hand-written RK4 in ``lax.scan`` (the ``final`` loss): no checks, no saving.

    ``segment``: recompute segments of that many steps (``jax.checkpoint``);
    ``remat_step``: also ``jax.checkpoint`` each step, so that a segment's backward sweep
    stores only the state per step and recomputes the stages.
    """
    dt = (T1 - T0) / n

    def one(p, y0):
        a = p_args(p)

        def rk4(y):
            k1 = LV(0.0, y, a)
            k2 = LV(0.0, y + 0.5 * dt * k1, a)
            k3 = LV(0.0, y + 0.5 * dt * k2, a)
            k4 = LV(0.0, y + dt * k3, a)
            return y + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)

        step = jax.checkpoint(rk4) if remat_step else rk4
        body = lambda y, _: (step(y), None)  # noqa: E731
        if segment is None:
            y, _ = lax.scan(body, y0, None, length=n)
        else:
            inner = jax.checkpoint(lambda y: lax.scan(body, y, None, length=segment)[0])
            y, _ = lax.scan(lambda y, _: (inner(y), None), y0, None, length=n // segment)
        return jnp.sum(y)

    return one


def floor_adjoint_one(n, segment):
    """RK4 on Lotka-Volterra with a hand-derived discrete adjoint: no autodiff at all.

    The state is carried as two scalars (under the member ``vmap``, two arrays of the
    members), the stored checkpoints are the segment starts, each segment is recomputed
    storing its states, and the backward step recomputes the stages and applies the
    transposed RK4 step with the Jacobians of the vector field written out. Parameter
    cotangents accumulate per member (a ``custom_vjp``, so under ``vmap`` JAX sums them
    once at the end, not at every step). The best reverse mode XLA:CPU gives here
    without the autodiff machinery: a floor for any reverse-mode strategy.
    """
    dt = (T1 - T0) / n
    n_seg = n // segment

    def f(x, z, a):
        al, be, ga, de = a
        return al * x - be * x * z, -ga * z + de * x * z

    def f_vjp(x, z, gx, gz, a):
        """(df/dy)^T g and (df/da)^T g at (x, z)."""
        al, be, ga, de = a
        return (gx * (al - be * z) + gz * de * z, -gx * be * x + gz * (de * x - ga),
                (gx * x, -gx * x * z, -gz * z, gz * x * z))

    def stage_inputs(x, z, a):
        k1 = f(x, z, a)
        y2 = (x + 0.5 * dt * k1[0], z + 0.5 * dt * k1[1])
        k2 = f(*y2, a)
        y3 = (x + 0.5 * dt * k2[0], z + 0.5 * dt * k2[1])
        k3 = f(*y3, a)
        y4 = (x + dt * k3[0], z + dt * k3[1])
        return (k1, k2, k3, f(*y4, a)), (y2, y3, y4)

    def step(y, a):
        (k1, k2, k3, k4), _ = stage_inputs(*y, a)
        return tuple(y[i] + dt / 6 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) for i in (0, 1))

    def segment_states(y, a):
        return lax.scan(lambda y, _: (step(y, a), y), y, None, length=segment)

    def forward(p, y0):
        a = p_args(p)
        y, starts = lax.scan(lambda y, _: (segment_states(y, a)[0], y), (y0[0], y0[1]),
                             None, length=n_seg)
        return y, starts

    @jax.custom_vjp
    def one(p, y0):
        y, _ = forward(p, y0)
        return y[0] + y[1]

    def one_fwd(p, y0):
        y, starts = forward(p, y0)
        return y[0] + y[1], (p, starts)

    def one_bwd(res, g):
        p, starts = res
        a = p_args(p)

        def back_step(c, y):
            gx, gz, acc = c
            x, z = y
            _, (y2, y3, y4) = stage_inputs(x, z, a)
            # y' = y + dt/6 (k1 + 2 k2 + 2 k3 + k4), k_i = f(Y_i), Y_i = y + dt a_i k_{i-1}
            r4 = f_vjp(*y4, dt / 6 * gx, dt / 6 * gz, a)
            r3 = f_vjp(*y3, dt / 3 * gx + dt * r4[0], dt / 3 * gz + dt * r4[1], a)
            r2 = f_vjp(*y2, dt / 3 * gx + 0.5 * dt * r3[0], dt / 3 * gz + 0.5 * dt * r3[1], a)
            r1 = f_vjp(x, z, dt / 6 * gx + 0.5 * dt * r2[0], dt / 6 * gz + 0.5 * dt * r2[1], a)
            rs = (r1, r2, r3, r4)
            gx = gx + sum(r[0] for r in rs)
            gz = gz + sum(r[1] for r in rs)
            acc = tuple(acc[j] + sum(r[2][j] for r in rs) for j in range(4))
            return (gx, gz, acc), None

        def back_segment(c, start):
            _, ys = segment_states(start, a)
            c, _ = lax.scan(back_step, c, ys, reverse=True)
            return c, None

        zero = jnp.zeros_like(g)
        (gx, gz, acc), _ = lax.scan(back_segment, (g, g, (zero,) * 4), starts, reverse=True)
        return jnp.stack(acc), jnp.stack([gx, gz])

    one.defvjp(one_fwd, one_bwd)
    return one


def contenders(loss: str, n: int, members: int | None, opts, data) -> dict:
    """name -> dict(family, kind, fn, peer) for one case. ``kind``: forward / grad."""
    out = {}
    ens_big = members is not None and n > opts.ensemble_direct_max_steps
    for sname, solver in (("RK4", sl.RK4()), ("Tsit5", sl.Tsit5())):
        if sname == "Tsit5" and (not opts.tsit5 or (
                members is not None and n > opts.ensemble_tsit5_max_steps)):
            continue
        fam = f"simlib {sname}"
        peer = f"diffrax {'RK4*' if sname == 'RK4' else 'Tsit5'}"
        out[f"{fam} forward"] = dict(family=fam, kind="forward", method="forward",
                                     fn=make_loss(simlib_one(solver, loss, n, None, data),
                                                  members))
        strategies = [("Direct", sl.Direct()), ("Checkpointed", sl.Checkpointed())]
        if HAS_FORWARD_MODE:
            strategies.append(("ForwardMode", sl.ForwardMode()))
        for label, adj in strategies:
            if label == "Direct" and ens_big:
                out[f"{fam} {label}"] = dict(
                    family=fam, kind="grad", method=label, skipped=(
                        f"not run above {opts.ensemble_direct_max_steps} ensemble steps: "
                        "Direct stores every step's residuals (~1.3 GB per 10^4 RK4 steps "
                        "of 1,000 members)"))
                continue
            out[f"{fam} {label}"] = dict(
                family=fam, kind="grad", method=label, peer=f"{peer} RecursiveCheckpoint",
                fn=jax.grad(make_loss(simlib_one(solver, loss, n, adj, data), members)))
        if sname == "RK4":
            one_direct = simlib_one(solver, loss, n, sl.Direct(), data)
            out[f"{fam} jacfwd (Direct)"] = dict(
                family=fam, kind="grad", method="jacfwd (Direct)",
                fn=jax.jacfwd(make_loss(one_direct, members)))
            if members is not None and n <= opts.ensemble_direct_max_steps:
                # the tangents inside the member vmap, as ForwardMode has them
                y0s = ensemble_y0(members)
                out[f"{fam} vmap(jacfwd) (Direct)"] = dict(
                    family=fam, kind="grad", method="vmap(jacfwd) (Direct)",
                    fn=lambda p, o=one_direct, y0s=y0s: jnp.mean(jax.vmap(
                        jax.jacfwd(o), in_axes=(None, 0))(p, y0s), axis=0))
    if diffrax is not None and (members is None or n <= opts.ensemble_diffrax_max_steps):
        for sname in ("RK4*", "Tsit5"):
            if sname == "Tsit5" and (not opts.tsit5 or (
                    members is not None and n > opts.ensemble_tsit5_max_steps)):
                continue
            fam = f"diffrax {sname}"
            base = sname.rstrip("*")
            out[f"{fam} forward"] = dict(family=fam, kind="forward", method="forward",
                                         fn=make_loss(diffrax_one(base, loss, n, None, data),
                                                      members))
            out[f"{fam} RecursiveCheckpoint"] = dict(
                family=fam, kind="grad", method="RecursiveCheckpoint",
                fn=jax.grad(make_loss(diffrax_one(
                    base, loss, n, diffrax.RecursiveCheckpointAdjoint(), data), members)))
    if loss == "final":
        seg = _divisor_near_sqrt(n)
        fam = "floor RK4"
        out[f"{fam} forward"] = dict(family=fam, kind="forward", method="forward",
                                     fn=make_loss(floor_one(n), members))
        if ens_big:
            out[f"{fam} grad"] = dict(family=fam, kind="grad", method="grad",
                                      skipped="not run: stores every step, like Direct")
        else:
            out[f"{fam} grad"] = dict(family=fam, kind="grad", method="grad",
                                      fn=jax.grad(make_loss(floor_one(n), members)))
        out[f"{fam} grad ckpt"] = dict(family=fam, kind="grad", method=f"grad ckpt ({seg})",
                                       fn=jax.grad(make_loss(floor_one(n, seg), members)))
        out[f"{fam} grad ckpt+remat"] = dict(
            family=fam, kind="grad", method=f"grad ckpt ({seg}) + per-step remat",
            fn=jax.grad(make_loss(floor_one(n, seg, remat_step=True), members)))
        out[f"{fam} hand adjoint"] = dict(
            family=fam, kind="grad", method=f"hand-derived adjoint ({seg})",
            fn=jax.grad(make_loss(floor_adjoint_one(n, seg), members)))
    return out


# --------------------------------------------------------------------------------------
# issue 12 cases: what a user waits for with the default strategy

ISSUE12_CASES = ("single_ts", "batched", "vmap512", "mlp")
OLD_CASES = ("single", "ensemble", "memory")
I12_MEMBERS = 512
TS201 = T1 * np.arange(0, 201) / 200  # t = 0, 0.05, ..., 10: on the step grid
MLP_SIZES = (2, 32, 32, 2)
MLP_Y0 = (1.0, 0.5)
MLP_TS = T1 * np.arange(0, 101) / 100


def mlp_init(key):
    """A flat vector of the MLP's weights (normal / sqrt(fan_in)) and its unravel."""
    params = []
    for k, (m, n) in zip(jax.random.split(key, len(MLP_SIZES) - 1),
                         zip(MLP_SIZES[:-1], MLP_SIZES[1:], strict=True), strict=True):
        params.append((jax.random.normal(k, (m, n), dtype=jnp.float64) / np.sqrt(m),
                       jnp.zeros(n, dtype=jnp.float64)))
    return ravel_pytree(params)


def mlp_field(t, y, params):
    """dy/dt = MLP(y): tanh hidden layers, linear output."""
    del t
    for w, b in params[:-1]:
        y = jnp.tanh(y @ w + b)
    w, b = params[-1]
    return y @ w + b


def _adjoint_kw(adjoint) -> dict:
    return {} if adjoint is None else dict(adjoint=adjoint)  # None: omitted, the default


def _ts201_loss(solver, y0, dt, data, members):
    """``make(adjoint)``: the loss ``sum((ys - data)^2) / members`` at the 201 save times,
    for a state ``y0`` (one trajectory, or a batched ensemble of ``members``)."""
    def make(adjoint):
        def loss(p):
            sol = sl.solve(LV, y0, T0, T1, solver=solver, dt=dt, args=p_args(p),
                           saveat=sl.SaveAt(ts=TS201), **_adjoint_kw(adjoint))
            return jnp.sum(jnp.square(sol.ys - data)) / members
        return loss
    return make


def issue12_case(name: str, opts) -> dict:
    """One issue-12 case: its label, sizes, parameters ``p0`` and contenders."""
    solver = sl.RK4()
    fam = "simlib RK4"
    strategies = [("default", None)]
    if name != "mlp" and HAS_FORWARD_MODE:
        strategies.append(("ForwardMode", sl.ForwardMode()))
    strategies.append(("Checkpointed", sl.Checkpointed()))
    if name == "mlp":
        strategies.append(("Direct", sl.Direct()))
    quick = 5 if opts.quick else 1
    p0 = jnp.asarray(LV_ARGS)
    members = None
    if name == "single_ts":
        n = 50_000 // quick
        dt = (T1 - T0) / n
        make = _ts201_loss(solver, jnp.asarray(Y0), dt, observations(n, jnp.asarray(Y0), TS201),
                           1)

        label, loss_name = f"single ts {n:.0e}", "ts201"
    elif name == "batched":
        n = 20_000 // quick
        dt = (T1 - T0) / n
        members = I12_MEMBERS
        y0s = ensemble_y0(members)
        make = _ts201_loss(solver, y0s, dt, observations(n, y0s, TS201), members)

        label, loss_name = f"batched ts {n:.0e}", "ts201"
    elif name == "vmap512":
        n = 20_000 // quick
        dt = (T1 - T0) / n
        members = I12_MEMBERS
        y0s = ensemble_y0(members)

        def make(adjoint):
            def one(p, y0):
                sol = sl.solve(LV, y0, T0, T1, solver=solver, dt=dt, args=p_args(p),
                               **_adjoint_kw(adjoint))
                return jnp.sum(sol.ys[-1])

            return lambda p: jnp.mean(jax.vmap(one, in_axes=(None, 0))(p, y0s))

        label, loss_name = f"vmap{members} final {n:.0e}", "final"
    elif name == "mlp":
        n = 1_000
        dt = (T1 - T0) / n
        p0, unravel = mlp_init(jax.random.PRNGKey(SEED))
        y0 = jnp.asarray(MLP_Y0)

        def make(adjoint):
            def loss(p):
                sol = sl.solve(mlp_field, y0, T0, T1, solver=solver, dt=dt, args=unravel(p),
                               saveat=sl.SaveAt(ts=MLP_TS), **_adjoint_kw(adjoint))
                return jnp.sum(jnp.square(sol.ys))
            return loss

        label, loss_name = f"mlp {n:.0e}", "mlp ts101"
    else:
        raise ValueError(f"unknown issue-12 case {name!r}")
    label = label.replace("e+0", "e")
    out = {f"{fam} forward": dict(family=fam, kind="forward", method="forward", fn=make(None))}
    peer = "diffrax RK4* RecursiveCheckpoint" if name == "mlp" and diffrax is not None else None
    for method, adjoint in strategies:
        out[f"{fam} {method}"] = dict(family=fam, kind="grad", method=method, peer=peer,
                                      fn=jax.grad(make(adjoint)))
    if name == "mlp" and diffrax is not None:
        term = diffrax.ODETerm(mlp_field)

        def dloss(adjoint):
            def loss(p):
                kw = {} if adjoint is None else dict(adjoint=adjoint)
                sol = diffrax.diffeqsolve(term, DiffraxRK4(), T0, T1, dt, y0, args=unravel(p),
                                          saveat=diffrax.SaveAt(ts=MLP_TS),
                                          stepsize_controller=diffrax.ConstantStepSize(),
                                          max_steps=n + 8, **kw)
                return jnp.sum(jnp.square(sol.ys))
            return loss

        out["diffrax RK4* forward"] = dict(family="diffrax RK4*", kind="forward",
                                           method="forward", fn=dloss(None))
        out["diffrax RK4* RecursiveCheckpoint"] = dict(
            family="diffrax RK4*", kind="grad", method="RecursiveCheckpoint",
            fn=jax.grad(dloss(diffrax.RecursiveCheckpointAdjoint())))
    return dict(label=label, loss=loss_name, steps=n, members=members, issue12=name,
                p0=p0, contenders=out)


# --------------------------------------------------------------------------------------
# timing


def compile_fn(fn, inputs) -> tuple:
    return compile_jit(fn, *inputs, cold=True)


def loop_kernels(compiled) -> list:
    """(trip count, kernels per iteration) of each while loop in the optimized HLO.

    Kernels are fusions plus unfused compute ops (bookkeeping such as
    get-tuple-element, tuple, constant, parameter and bitcast is not counted). On the
    CPU backend each is a separate pass over its operands with its own dispatch.
    """
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001
        return []
    comps, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if m:
            cur = m.group(1)
            comps[cur] = []
        elif line.startswith("}"):
            cur = None
        elif cur is not None:
            comps[cur].append(line)
    skip = {"get-tuple-element", "tuple", "constant", "parameter", "bitcast", "copy"}
    loops = []
    for lines in comps.values():
        for line in lines:
            m = re.search(r" while\(.*body=%([^,\s]+)", line)
            if not m or m.group(1) not in comps:
                continue
            trip = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
            ops = [re.search(r"= \S+ ([\w-]+)\(", b) for b in comps[m.group(1)]]
            kernels = sum(1 for o in ops if o and o.group(1) not in skip)
            loops.append((int(trip.group(1)) if trip else None, kernels))
    return loops


def measure_case(case: dict, opts) -> dict:
    """Compile, warm up and time every contender of a case, round-robin."""
    p = case.get("p0", jnp.asarray(LV_ARGS))
    table, calls, warmed = {}, {}, {}
    for name, c in case["contenders"].items():
        if "skipped" in c:
            table[name] = dict(family=c["family"], kind=c["kind"], method=c["method"],
                               skipped=c["skipped"])
            print(f"    {name:38s} skipped: {c['skipped']}", flush=True)
            continue
        try:
            compiled, compile_s = compile_fn(c["fn"], (p,))
            call = lambda cc=compiled: cc(p)  # noqa: E731
            warm = warm_up(call, opts.once_s)
        except Exception as err:  # noqa: BLE001 - reported, the rest runs
            msg = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
            table[name] = dict(family=c["family"], kind=c["kind"], method=c["method"],
                               skipped=msg)
            print(f"    {name:38s} FAILED: {msg}", flush=True)
            continue
        table[name] = dict(family=c["family"], kind=c["kind"], method=c["method"],
                           peer=c.get("peer"), compile_s=compile_s, warmup_s=warm.warmup,
                           value=np.asarray(warm.out).tolist(), loops=loop_kernels(compiled),
                           times=[])
        if warm.warmup_only:  # the warm-up call is the measurement
            table[name]["timed_by_warmup"] = True
        calls[name], warmed[name] = call, warm
        print(f"    {name:38s} compile {fmt_s(compile_s):>9s}  warm-up "
              f"{fmt_s(warm.warmup):>9s}", flush=True)
    timings = round_robin(calls, opts.repeats, opts.slow_s, opts.once_s,
                          slow_repeats=opts.slow_repeats, warmed=warmed)
    for name, t in timings.items():
        m = table[name]
        m["times"] = t.times
        m["time_s"] = t.best
        m["median_s"] = t.median
        print(f"    {name:38s} run {fmt_s(m['time_s']):>9s} (best of {len(m['times'])})",
              flush=True)
    return table


def rel_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def summarize(case: dict, table: dict) -> list[dict]:
    """One row per gradient contender: grad/forward, peer speedup, agreement."""
    rows = []
    refs = {}
    for fam in {m["family"] for m in table.values()}:
        for method in ("Direct", "Checkpointed", "grad"):
            m = table.get(f"{fam} {method}", {})
            if "value" in m:
                refs[fam] = (f"{fam} {method}", m["value"])
                break
    # diffrax and the floor compare against simlib's gradient with the same method
    for fam, ref_fam in (("diffrax Tsit5", "simlib Tsit5"), ("diffrax RK4*", "simlib RK4"),
                         ("floor RK4", "simlib RK4")):
        if ref_fam in refs:
            refs[fam] = refs[ref_fam]
    for name, m in table.items():
        if m["kind"] != "grad":
            continue
        row = dict(case=case["label"], name=name, family=m["family"], method=m["method"],
                   members=case["members"], steps=case["steps"], loss=case["loss"])
        rows.append(row)
        if "skipped" in m:
            row["skipped"] = m["skipped"]
            continue
        fwd = table.get(f"{m['family']} forward", {})
        row.update(grad_s=m["time_s"], compile_s=m["compile_s"],
                   timed_by_warmup=m.get("timed_by_warmup", False))
        if "time_s" in fwd:
            row.update(forward_s=fwd["time_s"], ratio=m["time_s"] / fwd["time_s"],
                       forward_compile_s=fwd["compile_s"])
        peer = table.get(m.get("peer") or "", {})
        if "time_s" in peer:
            row.update(peer=m["peer"], peer_grad_s=peer["time_s"],
                       speedup=peer["time_s"] / m["time_s"])
        ref = refs.get(m["family"])
        if ref is not None:
            row.update(reference=ref[0], rel_diff=rel_diff(m["value"], ref[1]))
        work = case["steps"] * (case["members"] or 1)
        row["ns_per_member_step"] = m["time_s"] / work * 1e9
        if "time_s" in fwd:
            row["forward_ns_per_member_step"] = fwd["time_s"] / work * 1e9
    return rows


# --------------------------------------------------------------------------------------
# memory: one (strategy, steps) per subprocess


def chain(t, y, args):
    """Harmonic chain with fixed ends: q'' = (k/m) (q_{i-1} - 2 q_i + q_{i+1})."""
    del t
    k, m = args
    q, p = y
    qp = jnp.pad(q, 1)
    return p / m, -k * (2 * q - qp[:-2] - qp[2:])


def _proc_status(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return -1


def memory_child(strategy: str, n: int, dim: int) -> dict:
    """Runs in a fresh interpreter: the gradient of a chain solve and its peak memory.

    baseline = resident set after imports, a 16-step warm-up gradient, compiling the
    measured gradient and ``malloc_trim``, with the peak counter reset there
    (``/proc/self/clear_refs``); peak = the peak resident set after the run. So
    ``peak - baseline`` is what running the gradient added, compile memory excluded.
    """
    import ctypes

    rss_imports = _proc_status("VmRSS")
    adjoint = getattr(sl, strategy)()
    q0 = jnp.sin(3.0 * jnp.arange(1, dim + 1) / (dim + 1))
    p0 = jnp.zeros(dim)

    def loss(a, steps):
        sol = sl.solve(chain, (q0, p0), 0.0, CHAIN_T1, solver=sl.VelocityVerlet(),
                       dt=CHAIN_T1 / steps, args=(a[0], a[1]), adjoint=adjoint)
        q, p = sol.ys
        return jnp.sum(jnp.square(q[-1])) + jnp.sum(jnp.square(p[-1]))

    a = jnp.asarray(CHAIN_ARGS)
    jax.block_until_ready(jax.jit(jax.grad(lambda a: loss(a, 16)))(a))
    compiled = jax.jit(jax.grad(lambda a: loss(a, n))).lower(a).compile()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        reset = True
    except OSError:
        reset = False
    baseline = _proc_status("VmRSS") if reset else _proc_status("VmHWM")
    g, run_s = timed(lambda: compiled(a))
    g = np.asarray(g)
    peak = _proc_status("VmHWM")
    return dict(strategy=strategy, steps=n, dim=dim, rss_after_imports=rss_imports,
                baseline=baseline, peak=peak, delta=peak - baseline, peak_reset=reset,
                run_s=run_s, grad=g.tolist())


def run_child(strategy: str, n: int, dim: int, timeout: float) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", strategy, str(n),
           str(dim)]
    try:
        proc, wall = timed(lambda: subprocess.run(cmd, capture_output=True, text=True,
                                                  timeout=timeout))
    except subprocess.TimeoutExpired:
        return dict(strategy=strategy, steps=n, dim=dim, skipped=f"timed out after {timeout} s")
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY "):
            out = json.loads(line[len("MEMORY "):])
            out["wall_s"] = wall
            return out
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    return dict(strategy=strategy, steps=n, dim=dim,
                skipped=f"subprocess failed (rc {proc.returncode}): {tail[0][:200]}")


def mem_available() -> int:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62


def memory_scaling(steps: list[int], dim: int, limit_gb: float, timeout: float) -> dict:
    runs = []
    state_bytes = 2 * dim * 8
    for strategy in MEM_STRATEGIES:
        per_step = None
        for n in steps:
            limit = min(limit_gb * 2**30, 0.5 * mem_available())
            if per_step is not None and per_step * n > limit:
                r = dict(strategy=strategy, steps=n, dim=dim,
                         projected_delta=per_step * n,
                         skipped=f"projected {per_step * n / 2**30:.1f} GiB > limit "
                                 f"{limit / 2**30:.1f} GiB")
            else:
                r = run_child(strategy, n, dim, timeout)
            runs.append(r)
            if "delta" in r:
                per_step = max(r["delta"], 0) / n
                print(f"    {strategy:12s} n={n:<8d} peak - baseline {fmt_b(r['delta']):>10s} "
                      f"({r['delta'] / n:8.1f} B/step = {r['delta'] / n / state_bytes:.3f} "
                      f"states/step)  run {fmt_s(r['run_s'])}", flush=True)
            else:
                print(f"    {strategy:12s} n={n:<8d} skipped: {r['skipped']}", flush=True)
    # the same largest Reversible run on a 4x smaller state: does its growth follow the state?
    small = None
    rev = [r for r in runs if r["strategy"] == "Reversible" and "delta" in r]
    if rev:
        small = run_child("Reversible", rev[-1]["steps"], dim // 4, timeout)
        if "delta" in small:
            print(f"    {'Reversible':12s} n={small['steps']:<8d} dim={dim // 4}: peak - baseline "
                  f"{fmt_b(small['delta'])}", flush=True)
    fits = {}
    for strategy in MEM_STRATEGIES:
        pts = [(r["steps"], r["delta"]) for r in runs
               if r["strategy"] == strategy and "delta" in r and r["delta"] > 0]
        if len(pts) >= 2:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            slope, _ = np.polyfit(x, y, 1)
            fits[strategy] = dict(exponent=float(slope), points=len(pts),
                                  steps=[p[0] for p in pts],
                                  bytes_per_step_at_max=pts[-1][1] / pts[-1][0],
                                  states_per_step_at_max=pts[-1][1] / pts[-1][0] / state_bytes,
                                  delta_at_max=pts[-1][1])
    agreement = []
    for n in steps:
        ref = next((r for r in runs if r["strategy"] == "Checkpointed" and r["steps"] == n
                    and "grad" in r), None)
        for r in runs:
            if ref is not None and r is not ref and r["steps"] == n and "grad" in r:
                agreement.append(dict(steps=n, a=r["strategy"], b="Checkpointed",
                                      rel_diff=rel_diff(r["grad"], ref["grad"])))
    return dict(system=f"harmonic chain, {dim} masses, fixed ends, (k, m) = {CHAIN_ARGS}",
                solver="VelocityVerlet", t=[0.0, CHAIN_T1], dim=dim, state_bytes=state_bytes,
                steps=steps, runs=runs, fits=fits, reversible_small_state=small,
                agreement=agreement)


# --------------------------------------------------------------------------------------
# the run


def fmt_b(x) -> str:
    if x is None:
        return "-"
    if abs(x) >= 2**30:
        return f"{x / 2**30:.2f} GiB"
    if abs(x) >= 2**20:
        return f"{x / 2**20:.1f} MiB"
    return f"{x / 2**10:.0f} KiB"


def _jaxlib_version():
    try:
        import jaxlib

        return jaxlib.__version__
    except Exception:  # noqa: BLE001
        return None


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def observations(n: int, y0=None, ts=TS) -> jax.Array:
    """The 'ts' loss's data: simlib RK4 at DATA_ARGS on the same steps."""
    y0 = jnp.asarray(Y0) if y0 is None else y0
    sol = sl.solve(LV, y0, T0, T1, solver=sl.RK4(), dt=(T1 - T0) / n,
                   args=DATA_ARGS, saveat=sl.SaveAt(ts=ts))
    return sol.ys


def ts_probe(n: int = 5000) -> dict:
    """Does ``solve`` under ``jit`` (only ``args`` traced) honour a concrete ``SaveAt(ts)``?

    Up to simlib a4fef97, ``solve`` converted ``saveat.ts`` with ``jnp.asarray`` (a tracer
    under ``jit`` in this jax) and then sized the loop as if the span were traced:
    ``max_steps + len(ts)`` iterations, so a run of more than ``max_steps`` (4096) steps
    failed. Fixed in bda1c26; the probe stays to catch a regression.
    """
    def fn(p):
        sol = sl.solve(LV, jnp.asarray(Y0), T0, T1, solver=sl.RK4(), dt=(T1 - T0) / n,
                       args=p_args(p), saveat=sl.SaveAt(ts=TS), throw=False)
        return sol.result, sol.stats["num_steps"]

    try:
        code, steps = jax.jit(fn)(jnp.asarray(LV_ARGS))
    except Exception as err:  # noqa: BLE001
        return dict(steps=n, error=f"{type(err).__name__}: {str(err).splitlines()[0][:200]}")
    return dict(steps=n, result=int(code), num_steps=int(steps), ok=int(code) == 0)


def targets(rows: list[dict], memory: dict | None) -> list[dict]:
    out = []

    def find(case, name):
        return next((r for r in rows if r["case"] == case and r["name"] == name), None)

    # The issue's two problems: one Lotka-Volterra trajectory and the 1,000-member
    # ensemble, both with the final-state loss.
    for case in sorted({r["case"] for r in rows if " final n=" in r["case"]},
                       key=lambda c: (len(c), c)):
        steps = next(r["steps"] for r in rows if r["case"] == case)
        default = "Checkpointed" if steps > CHECKPOINT_ABOVE else "Direct"
        for sname, peer_name in (("RK4", "RK4*"), ("Tsit5", "Tsit5")):
            r = find(case, f"simlib {sname} {default}")
            if r is None or "ratio" not in r:
                continue
            out.append(dict(
                target=f"{case}: gradient <= 5x forward, simlib {sname} default ({default})",
                need=5.0, value=r["ratio"], status="MET" if r["ratio"] <= 5.0 else "MISSED",
                unit="x forward"))
            if "speedup" in r:
                out.append(dict(
                    target=f"{case}: gradient faster than diffrax {peer_name} "
                           f"(simlib {sname} {default})",
                    need=1.0, value=r["speedup"],
                    status="MET" if r["speedup"] > 1.0 else "MISSED",
                    unit="x (diffrax grad / simlib grad)"))
            else:
                out.append(dict(target=f"{case}: gradient faster than diffrax {peer_name}",
                                need=1.0, value=None, status="SKIPPED",
                                unit="(diffrax not run: absent, or above "
                                     "--ensemble-diffrax-max-steps)"))
    if memory:
        fits = memory["fits"]
        if "Checkpointed" in fits:
            e = fits["Checkpointed"]["exponent"]
            out.append(dict(target="memory: Checkpointed grows as sqrt(steps) (0.35..0.65)",
                            need=0.5, value=e, unit="exponent",
                            status="MET" if 0.35 <= e <= 0.65 else "MISSED"))
        if "Reversible" in fits:
            f = fits["Reversible"]
            e = f["exponent"]
            out.append(dict(target="memory: Reversible flat (exponent <= 0.2)", need=0.0,
                            value=e, unit="exponent", status="MET" if e <= 0.2 else "MISSED"))
            out.append(dict(
                target="memory: Reversible stores < 1% of a state per step",
                need=0.01, value=f["states_per_step_at_max"], unit="states/step",
                status="MET" if f["states_per_step_at_max"] < 0.01 else "MISSED"))
        if "Direct" in fits:
            e = fits["Direct"]["exponent"]
            out.append(dict(target="memory: Direct linear (0.85..1.15), for reference",
                            need=1.0, value=e, unit="exponent",
                            status="MET" if 0.85 <= e <= 1.15 else "MISSED"))
    return out


def issue12_targets(rows: list[dict], fast: bool) -> list[dict]:
    """The targets of issue 12 on its cases: ratios to the forward in this run."""
    out = []
    mode = "small-loop limit raised" if fast else "default XLA flags"

    def row(case, method):
        return next((r for r in rows if r["case"] == case and r["method"] == method
                     and "ratio" in r), None)

    def add(target, need, value, unit="x forward", met=None):
        status = "SKIPPED" if value is None else (
            "MET" if (value <= need if met is None else met) else "MISSED")
        out.append(dict(target=target, need=need, value=value, status=status, unit=unit))

    for case in sorted({r["case"] for r in rows if r.get("members") and " n=" not in r["case"]}):
        r = row(case, "default")
        v = None if r is None else r["ratio"]
        add(f"{case}: default gradient <= 5x forward ({mode})", 5.0, v)
        add(f"{case}: default gradient <= 4x forward (stretch)", 4.0, v)
        r = row(case, "Checkpointed")
        add(f"{case}: Checkpointed() <= 10x forward", 10.0, None if r is None else r["ratio"])
    for case in sorted({r["case"] for r in rows if r["case"].startswith("single ts ")
                        and " n=" not in r["case"]}):
        r = row(case, "default")
        need = 5.0 if fast else 30.0
        add(f"{case}: default gradient <= {need:g}x forward ({mode})", need,
            None if r is None else r["ratio"])
    for case in sorted({r["case"] for r in rows if r["case"].startswith("mlp ")}):
        r = row(case, "default")
        add(f"{case}: default gradient <= 10x forward ({mode})", 10.0,
            None if r is None else r["ratio"])
        sp = None if r is None else r.get("speedup")
        add(f"{case}: default gradient faster than diffrax RK4* RecursiveCheckpoint", 1.0, sp,
            unit="x (diffrax grad / simlib grad)", met=sp is not None and sp > 1.0)
    return out


def report(results: dict) -> str:
    lines = []
    p = lines.append
    p(f"simlib {results['simlib_version']} ({results['simlib_commit']}) | jax "
      f"{results['jax_version']} | diffrax {results['diffrax_version'] or 'skipped'} | "
      f"{results['backend']} | {results['cpu_count']} cpus | {results['date']} | load "
      f"{results['loadavg_start'][0]:.1f} -> {results['loadavg_end'][0]:.1f}")
    p("Lotka-Volterra, float64, t in [0, 10]; gradient w.r.t. the 4 parameters; best of "
      f"{results['repeats']} ({results['slow_repeats']} for calls over {results['slow_s']:g} s)")
    if any("issue12" in c for c in results["cases"]):
        p("issue 12 cases: RK4; default = adjoint omitted; single/batched ts: squared error at "
          "201 save times; vmap512: final loss; mlp: 2->32->32->2 tanh MLP field, 1,218 "
          "weights, sum(ys^2) at 101 save times")
    if results.get("xla_flags"):
        p(f"XLA_FLAGS={results['xla_flags']}")
    p("simlib ForwardMode: " + ("present" if results["has_forward_mode"]
                                else "absent (not in this simlib; skipped)"))
    p("")
    head = (f"{'case':22s} {'contender':34s} {'forward':>9s} {'gradient':>9s} {'grad/fwd':>8s} "
            f"{'ns/m-step':>9s} {'diffrax grad':>12s} {'speedup':>8s} {'compile':>9s} "
            f"{'rel diff':>8s}")
    p(head)
    p("-" * len(head))
    for r in results["rows"]:
        if "skipped" in r:
            p(f"{r['case']:22s} {r['name']:34s} skipped: {r['skipped'][:90]}")
            continue
        p(f"{r['case']:22s} {r['name']:34s} {fmt_s(r.get('forward_s')):>9s} "
          f"{fmt_s(r['grad_s']) + ('+' if r['timed_by_warmup'] else ''):>9s} "
          f"{fmt_r(r.get('ratio'), digits=1):>8s} "
          f"{r['ns_per_member_step']:9.1f} {fmt_s(r.get('peer_grad_s')):>12s} "
          f"{fmt_r(r.get('speedup'), digits=1):>8s} {fmt_s(r['compile_s']):>9s} "
          + (f"{r['rel_diff']:8.1e}" if "rel_diff" in r else f"{'-':>8s}"))
    p("grad/fwd = gradient time / the same family's forward time (loss with the default "
      "adjoint; diffrax: its own forward).")
    p("speedup = diffrax gradient (same tableau, RecursiveCheckpointAdjoint) / this gradient: "
      "> 1 means simlib faster.")
    p("ns/m-step = gradient time per member-step. rel diff = max|g - g_ref| / max|g_ref|, "
      "g_ref = simlib Direct (Checkpointed where Direct was not run), same tableau.")
    p("compile = jit(grad).lower().compile() after jax.clear_caches(). + = one call (the "
      f"warm-up, over {results['once_s']:g} s).")
    p("RK4* = classical RK4 declared as a diffrax AbstractERK (diffrax has no RK4 class).")
    p("")
    p("Forward times per member-step (ns): " + "; ".join(
        f"{c['label']}: " + ", ".join(
            f"{m.split(' forward')[0]} {t['time_s'] / (c['steps'] * (c['members'] or 1)) * 1e9:.1f}"
            for m, t in c["table"].items() if t["kind"] == "forward" and "time_s" in t)
        for c in results["cases"]))
    p("")
    p("Kernels per loop iteration in the optimized HLO (trip count x kernels; fusions and "
      "unfused ops):")
    for c in results["cases"]:
        for name in ("simlib RK4 forward", "simlib RK4 default", "simlib RK4 Direct",
                     "simlib RK4 Checkpointed",
                     "simlib RK4 ForwardMode", "simlib RK4 jacfwd (Direct)",
                     "simlib RK4 vmap(jacfwd) (Direct)", "floor RK4 forward",
                     "floor RK4 grad", "floor RK4 grad ckpt", "floor RK4 grad ckpt+remat",
                     "floor RK4 hand adjoint", "diffrax RK4* RecursiveCheckpoint"):
            loops = c["table"].get(name, {}).get("loops")
            if loops:
                p(f"  {c['label']:22s} {name:34s} " + ", ".join(
                    f"{t if t is not None else '?'} x {k}" for t, k in loops))
    mem = results.get("memory")
    if mem:
        p("")
        p(f"Peak memory of one gradient vs steps: {mem['system']}, {mem['solver']}, "
          f"t in {mem['t']}, state {fmt_b(mem['state_bytes'])}; fresh subprocess each, "
          "peak - baseline (baseline after imports, warm-up and compile)")
        head = f"{'strategy':12s} " + " ".join(f"{n:>12d}" for n in mem["steps"]) + \
            f" {'exponent':>9s} {'B/step at max':>14s} {'states/step':>11s}"
        p(head)
        for s in MEM_STRATEGIES:
            cells = []
            for n in mem["steps"]:
                r = next((r for r in mem["runs"] if r["strategy"] == s and r["steps"] == n), {})
                if "delta" in r:
                    cells.append(f"{fmt_b(r['delta']):>12s}")
                elif "projected_delta" in r:
                    cells.append(f"{'(' + fmt_b(r['projected_delta']) + ')':>12s}")
                else:
                    cells.append(f"{'-':>12s}")
            f = mem["fits"].get(s)
            tail = (f" {f['exponent']:9.2f} {f['bytes_per_step_at_max']:14.1f} "
                    f"{f['states_per_step_at_max']:11.4f}" if f else "")
            p(f"{s:12s} " + " ".join(cells) + tail)
        p("(parenthesised: not run, projected linearly from the largest run)")
        small = mem.get("reversible_small_state")
        big = [r for r in mem["runs"] if r["strategy"] == "Reversible" and "delta" in r]
        if small and "delta" in small and big:
            p(f"Reversible at n={small['steps']}: state of {mem['dim']} masses "
              f"{fmt_b(big[-1]['delta'])}, of {small['dim']} masses {fmt_b(small['delta'])} "
              "(growth that does not follow the state size is per-step bookkeeping, not states)")
        times = {(r["strategy"], r["steps"]): r["run_s"] for r in mem["runs"] if "run_s" in r}
        p("gradient run time: " + "; ".join(
            f"{s} " + ", ".join(fmt_s(times[s, n]) for n in mem["steps"] if (s, n) in times)
            for s in MEM_STRATEGIES))
        if mem["agreement"]:
            worst = max(mem["agreement"], key=lambda a: a["rel_diff"])
            p("gradients vs Checkpointed at the same steps: max rel diff "
              f"{worst['rel_diff']:.1e} ({worst['a']}, n={worst['steps']})")
    probe = results.get("ts_probe")
    if probe and not probe.get("ok", False):
        p("")
        p(f"simlib issue: jit(solve) with args traced and a concrete SaveAt(ts=...) at "
          f"{probe['steps']} RK4 steps: " + (probe.get("error") or
                                              f"result {probe['result']} after "
                                              f"{probe['num_steps']} steps")
          + " (ts is treated as traced: max_steps + len(ts) iterations). The 'ts' rows "
          "pass max_steps=n.")
    p("")
    p("Targets:")
    for t in results["targets"]:
        v = "-" if t["value"] is None else f"{t['value']:.3g}"
        p(f"  {t['status']:7s} {t['target']:72s} got {v} {t['unit']}")
    for k, v in results["skipped"].items():
        p(f"  {k} skipped: {v}")
    return "\n".join(lines)


def run(opts) -> dict:
    results = dict(
        date=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        jax_version=jax.__version__, jaxlib_version=_jaxlib_version(),
        diffrax_version=None if diffrax is None else diffrax.__version__,
        simlib_version=sl.__version__,
        simlib_commit=simlib_commit(Path(sl.__file__).resolve().parent.parent),
        python=platform.python_version(), platform=platform.platform(),
        cpu_model=_cpu_model(), backend=jax.default_backend(), cpu_count=os.cpu_count(),
        quick=opts.quick, repeats=opts.repeats, slow_repeats=opts.slow_repeats,
        slow_s=opts.slow_s, once_s=opts.once_s, has_forward_mode=HAS_FORWARD_MODE,
        problem=dict(system="lotka_volterra", args=LV_ARGS, y0=Y0, t=[T0, T1],
                     ts=TS.tolist(), data_args=DATA_ARGS,
                     ensemble_y0="[10, 5] * exp(0.1 * normal(PRNGKey(0)))"),
        skipped={}, cases=[], rows=[], loadavg_start=list(load_average()),
        xla_flags=os.environ.get("XLA_FLAGS", ""), cases_run=sorted(opts.cases),
        fast_cpu_loops="small_while_loop_byte_threshold" in os.environ.get("XLA_FLAGS", ""),
    )
    if diffrax is None:
        results["skipped"]["diffrax"] = DIFFRAX_ERROR
    if not HAS_FORWARD_MODE:
        results["skipped"]["simlib ForwardMode"] = "simlib has no ForwardMode"
    results["ts_probe"] = ts_probe()
    plan = []
    if "single" in opts.cases:
        plan += [("final", opts.single_steps, None), ("ts", opts.single_steps, None)]
    if "ensemble" in opts.cases:
        plan += [("final", n, opts.members) for n in opts.ensemble_steps]
    for loss, n, members in plan:
        label = (f"single {loss} n={n:.0e}" if members is None
                 else f"ens{members} {loss} n={n:.0e}").replace("e+0", "e")
        print(f"  {label}", flush=True)
        data = observations(n) if loss == "ts" else None
        case = dict(label=label, loss=loss, steps=n, members=members)
        case["contenders"] = contenders(loss, n, members, opts, data)
        table = measure_case(case, opts)
        del case["contenders"]
        case["table"] = table
        results["cases"].append(case)
        results["rows"] += summarize(case, table)
        jax.clear_caches()
    for name in ISSUE12_CASES:
        if name not in opts.cases:
            continue
        case = issue12_case(name, opts)
        print(f"  {case['label']}", flush=True)
        table = measure_case(case, opts)
        del case["contenders"]
        case["p0_size"] = int(np.size(case.pop("p0")))
        case["table"] = table
        results["cases"].append(case)
        results["rows"] += summarize(case, table)
        jax.clear_caches()
    if opts.memory_steps and "memory" in opts.cases:
        print("  memory", flush=True)
        results["memory"] = memory_scaling(opts.memory_steps, opts.chain_dim, opts.mem_limit_gb,
                                           opts.child_timeout)
    results["targets"] = targets(results["rows"], results.get("memory"))
    results["targets"] += issue12_targets(results["rows"], results["fast_cpu_loops"])
    results["loadavg_end"] = list(load_average())
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="10^4 single steps, ensemble of 1000 at 2*10^3 steps, memory "
                             "10^3..10^5, 2 repeats")
    parser.add_argument("--single-steps", type=int, default=None)
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--ensemble-steps", type=int, nargs="*", default=None)
    parser.add_argument("--ensemble-diffrax-max-steps", type=int, default=100_000,
                        help="diffrax ensemble rows only up to this many steps (RK4* gradient "
                             "~30 s per call at 10^5)")
    parser.add_argument("--ensemble-direct-max-steps", type=int, default=10_000)
    parser.add_argument("--ensemble-tsit5-max-steps", type=int, default=10_000)
    parser.add_argument("--no-tsit5", dest="tsit5", action="store_false", default=None,
                        help="RK4 rows only (the default with --quick)")
    parser.add_argument("--memory-steps", type=int, nargs="*", default=None)
    parser.add_argument("--chain-dim", type=int, default=1024)
    parser.add_argument("--mem-limit-gb", type=float, default=4.0,
                        help="skip a memory run projected above this (or half the free memory)")
    parser.add_argument("--child-timeout", type=float, default=300.0)
    parser.add_argument("--repeats", type=int, default=None, help="default 3; --quick 2")
    parser.add_argument("--slow-repeats", type=int, default=1)
    parser.add_argument("--slow-s", type=float, default=2.0)
    parser.add_argument("--once-s", type=float, default=15.0,
                        help="a contender whose warm-up call takes longer is timed by that call")
    parser.add_argument("--cases", nargs="+", default=["all"],
                        choices=["all", "old", "issue12", *OLD_CASES, *ISSUE12_CASES],
                        help="what to run: single (final and ts, n=--single-steps), ensemble, "
                             "memory (together: old), and the issue-12 cases single_ts "
                             "(5*10^4 steps, 201 save times), batched ((512, 2) state, "
                             "2*10^4), vmap512 (2*10^4, final), mlp (1,218 weights, 10^3 "
                             "steps) (together: issue12); all (default) runs everything")
    parser.add_argument("--fast-cpu-loops", action="store_true",
                        help="call simlib.fast_cpu_loops() first (XLA:CPU's small-loop "
                             "limit raised to 1 MiB)")
    parser.add_argument("--json", type=Path, default=RESULTS_PATH)
    parser.add_argument("--memory-child", nargs=3, metavar=("STRATEGY", "STEPS", "DIM"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.memory_child:
        s, n, d = opts.memory_child
        print("MEMORY " + json.dumps(memory_child(s, int(n), int(d))), flush=True)
        return 0
    cases = set()
    for c in opts.cases:
        cases |= {"all": {*OLD_CASES, *ISSUE12_CASES}, "old": set(OLD_CASES),
                  "issue12": set(ISSUE12_CASES)}.get(c, {c})
    opts.cases = cases
    if opts.single_steps is None:
        opts.single_steps = 10_000 if opts.quick else 100_000
    if opts.ensemble_steps is None:
        opts.ensemble_steps = [2_000] if opts.quick else [10_000, 100_000]
    if opts.memory_steps is None:
        opts.memory_steps = [10**3, 10**4, 10**5] if opts.quick else [10**3, 10**4, 10**5,
                                                                      10**6]
    if opts.repeats is None:
        opts.repeats = 2 if opts.quick else 3
    if opts.tsit5 is None:
        opts.tsit5 = not opts.quick

    with Timer() as wall:
        results = run(opts)
    results["wall_s"] = wall.wall
    text = report(results)
    return finish(results, text, opts.json)


if __name__ == "__main__":
    sys.exit(main())
