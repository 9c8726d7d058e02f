"""Gradient strategies for ``solve(..., adjoint=...)``.

- :class:`Direct`: reverse mode straight through the loop; memory grows with the steps.
- :class:`Checkpointed`: reverse mode that stores the state only at segment boundaries
  and recomputes each segment in the backward pass (Griewank and Walther, *Evaluating
  Derivatives*, 2nd ed., 2008, ch. 12): memory grows as the square root of the steps
  with segments of ``sqrt(n)`` steps, at the cost of one extra forward pass.
- :class:`Reversible`: for time-symmetric symplectic steppers, the backward pass
  re-creates each state by stepping backwards (``Phi_{-h} = Phi_h^{-1}``) instead of
  storing it: exact gradients (to round-off) in memory that does not grow with the
  number of steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import CustomVJPPrimal

from ._static import register_static
from ._util import split_inexact


class AbstractAdjoint:
    """How ``jax.grad`` goes through a :func:`~simlib.solve` (its ``adjoint=`` argument).

    The base class of :class:`Direct`, :class:`Checkpointed`, :class:`Reversible`, and
    of :class:`ForwardMode` and the default (``adjoint=None``), which live in
    simlib/_auto.py with the forward-mode machinery they share. Each strategy owns how the
    differentiated computation is built; ``solve`` (fixed step, adaptive, SDEs) and
    ``simulate`` call the same hooks and never dispatch on the strategy's class:

    - :meth:`check`: whether the strategy can differentiate a run of this solver or
      integrator, with these events (``Reversible``: time-symmetric steppers, no events);
    - :meth:`wrap`: the whole run, ``core(tree, strategy)``, differentiated this strategy's
      way (forward mode wraps it in a custom VJP built from forward-mode derivatives; the
      default chooses at trace time; the others run it as it is), and
      :meth:`with_closures` for a run whose values ``wrap`` cannot all see;
    - :meth:`scan`: the differentiated loop, ``lax.scan(body, carry0, None, length=n)``
      (``Checkpointed`` recomputes segments of it in the backward pass; ``Reversible`` runs
      the driver's :class:`Steps`, its time-symmetric step and that step's inverse, through
      :func:`reversible_loop`), with
      :attr:`saves_as_outputs`, :meth:`nested` (frames of steps) and :meth:`times`;
      :meth:`remat`/:meth:`chunk_length` for loops that a driver builds itself (the
      adaptive replay's chunks) and :meth:`run_adaptive` for the adaptive run.

    It is not an extension point. Strategies are frozen dataclasses registered as pytrees
    without leaves (static arguments of the compiled cores); see docs/gradients.md.
    """

    def wrap(self, core: Callable[[Any, AbstractAdjoint], Any], tree: Any, *, jvp_able: bool,
             reverse: AbstractAdjoint, where: str) -> Any:
        """``core(tree, strategy)`` as this strategy differentiates it.

        ``tree`` holds every traced input (nothing closed over); ``jvp_able``: whether the
        run built with :data:`TANGENTS_ONLY` is a plain computation (fixed step, particles)
        rather than a custom VJP (adaptive); ``reverse``: the driver's reverse-mode strategy
        for the default's choice; ``where``: the caller's name, for messages.
        """
        return core(tree, self)

    def scan(self, body: Callable, carry0: Any, n_iter: int, *, padding: bool = False,
             steps: Steps | None = None) -> tuple[Any, Any]:
        """``lax.scan(body, carry0, None, length=n_iter)``, differentiated this way.

        ``padding``: iterations past ``n_iter`` are no-ops (the fixed-step walk's zero steps
        at ``t1``), so a strategy may run a few more. ``steps``: the same loop described by
        its step and that step's inverse (:class:`Steps`; ``None`` where the driver has
        none), for a strategy that runs the steps its own way (:class:`Reversible`)."""
        return lax.scan(body, carry0, None, length=n_iter)

    def nested(self, n_outer: int, n_inner: int) -> tuple[AbstractAdjoint, AbstractAdjoint]:
        """The strategies of an outer loop of ``n_outer`` iterations over inner loops of
        ``n_inner`` (the particle engine's frames of steps), so that together they do what
        this strategy does to one loop of ``n_outer * n_inner`` iterations."""
        return self, self

    def chunk_length(self, n_iter: int, default: int) -> int:
        """Iterations per chunk of a loop of ``n_iter`` that a driver builds in chunks."""
        return default

    def remat(self, fn: Callable) -> Callable:
        """A chunk function, as this strategy differentiates it (``Checkpointed``:
        recomputed in the backward pass)."""
        return fn

    saves_as_outputs: bool = False
    """Whether a fixed-step loop's saves leave the loop as per-step :class:`SaveWrites`
    (the save buffer then lives outside the differentiated loop: ``Checkpointed``) rather
    than in its carry."""

    def check(self, stepper: Any, events: Any = None, *, where: str = "solve") -> None:
        """Raise a ``ValueError`` if this strategy cannot differentiate a run of ``stepper``
        (a solver, or ``simulate``'s integrator) with ``events``; every strategy but
        :class:`Reversible` takes every run."""

    def times(self, times: Any) -> Any:
        """The run's times (``t0``, ``t1``, ``dt``, save times) as this strategy
        differentiates them: unchanged (``Reversible`` refuses their gradients)."""
        return times

    def run_adaptive(self, forward: Callable[[], Any],
                     replay: Callable[[AbstractAdjoint], Any]) -> Any:
        """An adaptive run: ``replay(self)``, the custom VJP whose backward pass replays
        the attempts with this strategy's chunks; the plain computation (forward mode's
        inner run) is ``forward()``, the ``while_loop`` itself, which ``jax.jvp`` goes
        through."""
        return replay(self)

    def with_closures(self, closes_over: Callable[[], bool],
                      reverse: AbstractAdjoint) -> AbstractAdjoint:
        """The strategy for a run whose computation may close over traced values that
        :meth:`wrap` cannot take as inputs (``simulate``'s energy): this one, except for
        the default, whose custom JVP cannot see them: ``reverse`` when ``closes_over()``."""
        return self


@register_static
@dataclass(frozen=True)
class Direct(AbstractAdjoint):
    """Reverse mode through every step; residuals of all steps are stored."""


@register_static
@dataclass(frozen=True)
class Checkpointed(AbstractAdjoint):
    """Reverse mode with recomputation in segments (memory ~ sqrt of the steps).

    Attributes:
        steps_per_segment: Steps per recomputed segment; ``None`` takes
            ``ceil(sqrt(n_steps))``, which minimises stored states plus one segment's
            residuals.
    """

    steps_per_segment: int | None = None
    saves_as_outputs = True

    def __post_init__(self):
        if self.steps_per_segment is not None and self.steps_per_segment < 1:
            raise ValueError(
                f"Checkpointed: steps_per_segment must be a positive integer, got "
                f"{self.steps_per_segment!r}"
            )

    def segment_length(self, n_steps: int) -> int:
        if self.steps_per_segment is not None:
            return int(self.steps_per_segment)
        return max(1, math.ceil(math.sqrt(n_steps)))

    def scan(self, body: Callable, carry0: Any, n_iter: int, *, padding: bool = False,
             steps: Steps | None = None) -> tuple[Any, Any]:
        """Segments of :meth:`segment_length` iterations, recomputed in reverse; the last
        one padded with no-op iterations when ``padding``, else a shorter segment."""
        segment = min(self.segment_length(n_iter), max(n_iter, 1))
        if padding:
            return checkpointed_scan(body, carry0, n_iter, segment)
        whole = n_iter - n_iter % segment
        carry, outs = checkpointed_scan(body, carry0, whole, segment)
        if whole == n_iter:
            return carry, outs
        carry, rest = checkpointed_scan(body, carry, n_iter - whole, n_iter - whole)
        return carry, jax.tree_util.tree_map(lambda a, b: jnp.concatenate([a, b]), outs, rest)

    def chunk_length(self, n_iter: int, default: int) -> int:
        return self.segment_length(n_iter)

    def nested(self, n_outer: int, n_inner: int) -> tuple[AbstractAdjoint, AbstractAdjoint]:
        # A segment of k steps: whole inner loops (k // n_inner of them) when k >= n_inner,
        # else segments of k inside each inner loop, whose ends are stored too.
        k = self.segment_length(n_outer * n_inner)
        if k >= n_inner:
            return Checkpointed(max(1, round(k / n_inner))), Direct()
        return Checkpointed(1), Checkpointed(k)

    def remat(self, fn):
        return jax.checkpoint(fn)


@register_static
@dataclass(frozen=True)
class Reversible(AbstractAdjoint):
    """Backward pass by integrating backwards: memory independent of the step count.

    For fixed-step, time-symmetric symplectic solvers (``VelocityVerlet``, ``Yoshida4``,
    ``PEFRL``), whose step satisfies ``Phi_{-h}(Phi_h(y)) = y``. Gradients flow to
    ``y0`` and ``args``; the times (``t0``, ``t1``, ``dt``, save times) are treated as
    constants. Round-off in the reconstruction grows with the number of steps (and
    exponentially on chaotic problems); compare with :class:`Checkpointed` when in doubt.
    """

    def scan(self, body: Callable, carry0: Any, n_iter: int, *, padding: bool = False,
             steps: Steps | None = None) -> tuple[Any, Any]:
        """The loop of ``steps`` with a backward pass that integrates backwards
        (:func:`reversible_loop` over :meth:`Steps.loop`); a plain ``lax.scan`` of ``body``
        without ``steps`` (a loop that is not differentiated: an eager chunk)."""
        if steps is None:
            return lax.scan(body, carry0, None, length=n_iter)
        loop = steps.loop(carry0, n_iter)
        return loop.finish(reversible_loop(
            loop.forward, loop.step, loop.unstep, loop.split, loop.d0, loop.params, loop.consts,
            blocks=loop.blocks, n_blocks=loop.n_blocks, n_inner=loop.n_inner, plan=loop.plan,
            unpack=loop.unpack, inject_block=loop.inject_block, inject_step=loop.inject_step))

    def nested(self, n_outer: int, n_inner: int) -> tuple[AbstractAdjoint, AbstractAdjoint]:
        return self, Direct()  # the outer loop runs backwards, its inner loops with it

    def check(self, stepper: Any, events: Any = None, *, where: str = "solve") -> None:
        if not stepper.time_symmetric:
            raise ValueError(
                f"{where}: adjoint=Reversible() needs a time-symmetric stepper (the "
                f"symplectic solvers VelocityVerlet, Yoshida4, PEFRL, ImplicitMidpoint; "
                f"simulate's NVE()), got {stepper!r}")
        if events is not None:
            raise ValueError(f"{where}: events cannot be used with adjoint=Reversible() (its "
                             "backward pass retraces a fixed grid); use Direct(), "
                             "Checkpointed() or ForwardMode()")

    def times(self, times: Any) -> Any:
        return reject_time_gradients(times, "Reversible")


class TangentsOnly(AbstractAdjoint):
    """The plain forward computation, which ``jax.jvp`` can go through: what forward mode
    (``ForwardMode()``, and the default's forward branch) pushes its tangents through.
    Internal (:data:`TANGENTS_ONLY`); not a user's choice."""

    def run_adaptive(self, forward, replay):
        return forward()


register_static(TangentsOnly)
TANGENTS_ONLY = TangentsOnly()


def first_order_only(fn, where: str = "solve"):
    """``fn``, whose own derivative raises a ``TypeError`` at trace time: for the derivative
    rules of adaptive runs (a first derivative evaluates ``fn`` on primal values only, so
    the rule is never reached then; a second derivative would differentiate ``fn``).

    The adaptive loop's second derivative came out NaN (``jax.hessian`` and
    ``jacrev(jacrev(...))`` of a Tsit5 solve of Lotka-Volterra, Direct() and the default),
    or died in XLA, so it is refused with a message that says what does work."""

    @jax.custom_jvp
    def guarded(*xs):
        return fn(*xs)

    @guarded.defjvp
    def guarded_jvp(primals, tangents):
        raise TypeError(
            f"{where}: second derivatives (jax.hessian, jacrev(jacrev(...)), jacfwd(grad)) "
            "of an adaptive run (rtol/atol) are not supported: the adaptive loop's second "
            "derivative came out NaN. Use a fixed-step run (dt=..., no rtol/atol), where "
            "every strategy supports them; an adaptive run supports first derivatives in "
            "reverse mode (jax.grad, jax.jacrev, jax.vjp)")

    return guarded


def reject_time_gradients(times, strategy: str):
    """``times`` unchanged; a gradient that would flow into them raises instead of being
    silently zero (for strategies that treat the time grid as a constant)."""

    @jax.custom_vjp
    def guard(x):
        return x

    def guard_fwd(x):
        primals = jax.tree_util.tree_leaves(x, is_leaf=lambda v: isinstance(v, CustomVJPPrimal))
        if any(v.perturbed for v in primals):
            raise ValueError(
                f"adjoint={strategy}() treats the times (t0, t1, dt, saveat.ts) as constants, "
                "so it cannot differentiate with respect to them; use simlib.Checkpointed(), "
                "simlib.Direct() or simlib.ForwardMode() for gradients with respect to times")
        return jax.tree_util.tree_map(lambda v: v.value, x,
                                      is_leaf=lambda v: isinstance(v, CustomVJPPrimal)), None

    def guard_bwd(_, cotangent):
        return (cotangent,)

    guard.defvjp(guard_fwd, guard_bwd, symbolic_zeros=True)
    floats, others, merge = split_inexact(times)
    return merge(guard(floats), others)


def checkpointed_scan(body, carry0, n_iter: int, segment: int):
    """``lax.scan(body, carry0, None, length=n_iter)`` with segments recomputed in reverse.

    Runs ``ceil(n_iter / segment) * segment`` iterations; the extra ones must be no-ops
    (the fixed-step walk makes them zero steps at ``t1``) and their outputs are dropped.

    A body whose per-step output is a :class:`SaveWrites` gets, instead of the stacked
    outputs, the buffer those writes fill: the buffer then lives outside the recomputed
    segments (see :func:`_checkpointed_writes`).
    """
    n_seg = -(-n_iter // segment)
    writes = jax.eval_shape(lambda c: body(c, None)[1], carry0)
    if isinstance(writes, SaveWrites):
        return _checkpointed_writes(body, carry0, n_seg, segment, writes)
    inner = jax.checkpoint(lambda c: lax.scan(body, c, None, length=segment))
    carry, outs = lax.scan(lambda c, _: inner(c), carry0, None, length=n_seg)
    outs = jax.tree_util.tree_map(
        lambda o: o.reshape((n_seg * segment,) + o.shape[2:])[:n_iter], outs)
    return carry, outs


def hoist_constants(fn: Callable, example: Any) -> tuple[Callable, list]:
    """``(fn2, consts)`` with ``fn2(x, *consts) == fn(x)`` and every value ``fn`` closes
    over, integer tracers included (``jax.closure_convert`` hoists only float ones), in
    ``consts``, so that a custom VJP can take them as arguments."""
    closed = jax.make_jaxpr(fn)(example)
    out_tree = jax.tree_util.tree_structure(jax.eval_shape(fn, example))
    jaxpr_fn = jax.extend.core.jaxpr_as_fun(
        jax.extend.core.ClosedJaxpr(closed.jaxpr.replace(
            invars=closed.jaxpr.constvars + closed.jaxpr.invars, constvars=[]), []))

    def fn2(x, *consts):
        return jax.tree_util.tree_unflatten(
            out_tree, jaxpr_fn(*consts, *jax.tree_util.tree_leaves(x)))

    return fn2, list(closed.consts)


def _zero_cotangent(tree):
    """Zero cotangents for inputs that are not differentiated (float0 for integers)."""
    return jax.tree_util.tree_map(
        lambda x: jnp.zeros(jnp.shape(x), jnp.result_type(x))
        if jnp.issubdtype(jnp.result_type(x), jnp.inexact)
        else np.zeros(jnp.shape(x), jax.dtypes.float0), tree)


class StepLoop(NamedTuple):
    """A loop of time-symmetric steps in the terms of :func:`reversible_loop` (see there
    for each field), and ``finish``, which turns the loop's outputs into what the driver's
    ``lax.scan`` would return: ``(carry, outs)``."""

    forward: Callable
    step: Callable
    unstep: Callable
    split: Callable
    d0: Any
    params: Any
    consts: Any
    blocks: Callable
    n_blocks: int
    n_inner: int
    plan: Callable
    unpack: Callable
    finish: Callable
    inject_block: Callable | None = None
    inject_step: Callable | None = None


class Steps:
    """A driver's loop described by its step, handed to :meth:`AbstractAdjoint.scan`
    (``steps=``) for a strategy that runs the steps its own way.

    A driver describes what its loop is made of and never chooses how it is differentiated:
    :meth:`step` is one step, ``z1 = Phi_h(z)``, with plan item ``x`` (the step's time and
    length), :meth:`unstep` its inverse (``Phi_{-h}``, the same step with ``-h``: exact for a
    time-symmetric method) and :meth:`loop` the whole loop from a carry, in the terms of
    :func:`reversible_loop`. :class:`Reversible` runs it with a backward pass that re-creates
    each state with :meth:`unstep` (the fixed-step driver's walk, simlib/_fixed.py, and the
    particle engine's frames, simlib/particles/_simulate.py)."""

    def step(self, z: Any, params: Any, x: Any) -> Any:
        """One step from the full state ``z`` with plan item ``x``."""
        raise NotImplementedError

    def unstep(self, z1: Any, params: Any, x: Any) -> Any:
        """The state before the step ``x`` that ended at ``z1``: :meth:`step` with ``-h``."""
        raise NotImplementedError

    def loop(self, carry0: Any, n_iter: int) -> StepLoop:
        """The loop of ``n_iter`` iterations from the driver's ``carry0``."""
        raise NotImplementedError


def reversible_loop(forward: Callable, step: Callable, unstep: Callable, split: Callable,
                    d0: Any, params: Any, consts: Any, *, blocks: Any, n_blocks: int,
                    n_inner: int, plan: Callable, unpack: Callable,
                    inject_block: Callable | None = None,
                    inject_step: Callable | None = None) -> Any:
    """``forward(d0, params, consts)[0]``, a loop of time-symmetric steps, with a backward
    pass that integrates backwards: the one reversible adjoint of ``solve`` and ``simulate``.

    The loop is ``n_blocks`` blocks of ``n_inner`` steps. ``forward(d0, params, consts)``
    returns ``(outs, z_end)``: the loop's outputs and its final full state. A full state
    ``z`` splits as ``split(z) -> (d, merge)`` into its differentiated part ``d`` and
    ``merge(d)``, which puts a new ``d`` into ``z``. ``step(z, params, x)`` is one step
    with plan item ``x`` and ``unstep(z1, params, x)`` its inverse (the same step with
    ``-h``, exact for a time-symmetric method: ``Phi_{-h} = Phi_h^{-1}``).

    The backward pass walks the blocks in reverse from ``z_end``: at each block's end it
    adds the block's output cotangent (``inject_block(z, g, g_params, block_ct, params)``,
    ``block_ct`` from ``unpack``), then, for each step in reverse, adds the step's output
    cotangent (``inject_step(g, x, step_cts)``), re-creates the state before the step with
    ``unstep`` and applies the step's VJP there. So memory holds a few states, not the
    trajectory; round-off in the reconstruction grows with the steps (exponentially on
    chaotic problems). ``unpack(cotangent of outs)`` gives ``(g_end, block_cts,
    step_cts)``: the final state's cotangent (like ``d``), the per-block cotangents (a
    leading axis of ``n_blocks``, or ``None``) and whatever ``inject_step`` reads.
    ``blocks(consts)`` are the blocks' inputs (leading axis ``n_blocks``, or ``None``) and
    ``plan(block, consts)`` the ``n_inner`` plan items of one block (or ``None``).
    ``consts`` (inputs that get no gradient) and everything else the functions use must be
    explicit inputs: a backward pass closing over a traced value would leak it.
    """

    @jax.custom_vjp
    def run(d0, params, consts):
        return forward(d0, params, consts)[0]

    def run_fwd(d0, params, consts):
        outs, z_end = forward(d0, params, consts)
        return outs, (z_end, params, consts)

    def run_bwd(res, cotangent):
        z_end, params, consts = res
        g_end, block_cts, step_cts = unpack(cotangent)

        def back_step(c, x):
            z1, g, g_params = c
            if inject_step is not None:
                g = inject_step(g, x, step_cts)
            z = unstep(z1, params, x)
            d, merge = split(z)
            _, vjp = jax.vjp(lambda dd, pp: split(step(merge(dd), pp, x))[0], d, params)
            gd, gp = vjp(g)
            return (z, gd, jax.tree_util.tree_map(jnp.add, g_params, gp)), None

        def back_block(c, xs):
            block, block_ct = xs
            z1, g, g_params = c
            if inject_block is not None:
                g, g_params = inject_block(z1, g, g_params, block_ct, params)
            c, _ = lax.scan(back_step, (z1, g, g_params), plan(block, consts),
                            length=n_inner, reverse=True)
            return c, None

        zero = jax.tree_util.tree_map(jnp.zeros_like, params)
        (_, g0, g_params), _ = lax.scan(back_block, (z_end, g_end, zero),
                                        (blocks(consts), block_cts), length=n_blocks,
                                        reverse=True)
        return g0, g_params, _zero_cotangent(consts)

    run.defvjp(run_fwd, run_bwd)
    return run(d0, params, consts)


# ---- save buffers outside the recomputed segments (issue 12)
@jax.tree_util.register_pytree_node_class
class SaveWrites:
    """A scan body's per-step output meaning "write ``value`` at row ``slot`` of a buffer
    of ``n_rows`` rows filled with ``fill``" (a ``slot`` of ``n_rows - 1`` is the scratch
    row of a step that saves nothing). ``checkpointed_scan`` returns the filled buffer."""

    def __init__(self, slot, value, n_rows: int, fill: float):
        self.slot, self.value, self.n_rows, self.fill = slot, value, n_rows, fill

    def tree_flatten(self):  # the fill as text: a NaN would make tree structures unequal
        return (self.slot, self.value), (self.n_rows, repr(float(self.fill)))

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children, aux[0], float(aux[1]))


def _checkpointed_writes(body, carry0, n_seg: int, segment: int, spec: SaveWrites):
    """``checkpointed_scan`` for a body that returns :class:`SaveWrites`.

    A save buffer carried through the loop (``SaveAt(ts=...)``) would be an input of every
    recomputed segment: ``jax.checkpoint`` stores it at each segment start (the whole
    buffer, once per segment) and the backward sweep carries its cotangent through every
    step. When differentiated, each segment here returns its steps'
    ``(slot, value)`` and the outer loop scatters them into the buffer, so the segments
    carry only the state and the backward sweep gathers the saved rows' cotangents once
    per segment. Undifferentiated, the loop writes the buffer in place step by step (the
    scatter would slow the forward run; docs/benchmarks.md): a ``custom_jvp`` whose rule
    is the segmented version's JVP, which reverse mode transposes (and ``jax.jvp`` still
    goes through).
    """
    step, consts = hoist_constants(lambda c: body(c, None), carry0)

    def buf0():  # made where it is used: a custom VJP must not close over a tracer
        return jax.tree_util.tree_map(
            lambda v: jnp.full((spec.n_rows,) + v.shape, spec.fill, v.dtype), spec.value)

    def write_rows(buf, slot, value):
        return jax.tree_util.tree_map(lambda b, v: b.at[slot].set(v.astype(b.dtype)), buf,
                                      value)

    def plain(carry0, consts):
        def inner(c, _):
            carry, buf = c
            carry, w = step(carry, *consts)
            return (carry, jax.tree_util.tree_map(
                lambda b, v: lax.dynamic_update_index_in_dim(b, v.astype(b.dtype), w.slot, 0),
                buf, w.value)), None

        def outer(c, _):
            return lax.scan(inner, c, None, length=segment)[0], None

        return lax.scan(outer, (carry0, buf0()), None, length=n_seg)[0]

    def segmented(carry0, consts):
        def run_segment(c):
            c, w = lax.scan(lambda c, _: step(c, *consts), c, None, length=segment)
            return c, (w.slot, w.value)

        recomputed = jax.checkpoint(run_segment)

        def outer(c, _):
            carry, buf = c
            carry, (slot, value) = recomputed(carry)
            return (carry, write_rows(buf, slot, value)), None

        return lax.scan(outer, (carry0, buf0()), None, length=n_seg)[0]

    @jax.custom_jvp
    def run(carry0, consts):
        return plain(carry0, consts)

    @run.defjvp
    def run_jvp(primals, tangents):  # reverse mode transposes this (jax.checkpoint's)
        return jax.jvp(segmented, primals, tangents)

    return run(carry0, consts)


# ---- the adaptive replay's loop of chunks: only the chunks that run (issue 24)
def live_chunks(chunk: Callable, live: Callable, carry0: Any, consts: Any,
                n_chunks: int) -> tuple[Any, Any]:
    """``lax.scan`` over ``n_chunks`` iterations of ``chunk(s, consts) -> (s, records)``
    while ``live(s, consts)``, zero records (and ``s`` unchanged) after: the adaptive
    replay's loop of attempts (simlib/_adaptive.py), whose ``n_chunks`` is sized for
    ``max_steps``. ``chunk`` and ``live`` close over no traced value: everything traced
    is in ``carry0`` and ``consts`` (which get cotangents).

    Once ``live(s)`` is false it stays false, so the chunks that run are a prefix. A
    ``lax.scan`` of ``lax.cond(live, chunk, skip)`` pays for every chunk in reverse mode:
    the residuals of a skipped chunk are zeros the size of a run one's, so its memory and
    time grow with ``max_steps``, not with the attempts made (the transistor amplifier,
    380 attempts with ``max_steps=200_000``: 13 KB of temporaries per attempt of budget,
    a gradient 1,060x the forward solve). Here the forward pass is a ``while_loop`` over
    the live chunks that stores each one's starting carry (Griewank and Walther,
    *Evaluating Derivatives*, 2nd ed., 2008, ch. 12: a checkpoint per chunk), and the
    backward pass a ``while_loop`` back over them that recomputes each chunk's pullback
    from its checkpoint: time and memory (beyond the records and the checkpoints) of the
    chunks that ran.
    """
    rec_shapes = jax.eval_shape(lambda c, k: chunk(c, k)[1], carry0, consts)
    carry_shapes = jax.eval_shape(lambda c: c, carry0)

    def forward(carry0, consts):
        recs0 = jax.tree_util.tree_map(
            lambda s: jnp.zeros((n_chunks,) + s.shape, s.dtype), rec_shapes)
        starts0 = jax.tree_util.tree_map(
            lambda x: jnp.zeros((n_chunks,) + jnp.shape(x), jnp.result_type(x)), carry0)

        def cond(st):
            i, s = st[0], st[1]
            return (i < n_chunks) & live(s, consts)

        def body(st):
            i, s, recs, starts = st
            starts = jax.tree_util.tree_map(
                lambda b, x: lax.dynamic_update_index_in_dim(b, x, i, 0), starts, s)
            s, rec = chunk(s, consts)
            recs = jax.tree_util.tree_map(
                lambda b, x: lax.dynamic_update_index_in_dim(b, x, i, 0), recs, rec)
            return i + 1, s, recs, starts

        n_run, s, recs, starts = lax.while_loop(
            cond, body, (jnp.int32(0), carry0, recs0, starts0))
        return (s, recs), (n_run, starts)

    @jax.custom_vjp
    def run(carry0, consts):
        return forward(carry0, consts)[0]

    def run_fwd(carry0, consts):
        out, (n_run, starts) = forward(carry0, consts)
        return out, (n_run, starts, consts)

    def run_bwd(res, cotangent):
        n_run, starts, consts = res
        ct_s, ct_recs = cotangent
        c_f0, c_o, c_merge = split_inexact(consts)

        def body(st):  # chunk i's pullback, recomputed from its starting carry
            i, ct_s_f, ct_c_f = st
            start = jax.tree_util.tree_map(lambda b: b[i], starts)
            ct_rec = jax.tree_util.tree_map(lambda b: b[i], ct_recs)
            s_f, s_o, s_merge = split_inexact(start)

            def fn(s_f, c_f):
                s1, rec = chunk(s_merge(s_f, s_o), c_merge(c_f, c_o))
                return split_inexact((s1, rec))[0]

            _, vjp = jax.vjp(fn, s_f, c_f0)
            rec_f = _float_cotangents(rec_shapes, ct_rec)
            g_s, g_c = vjp(list(ct_s_f) + rec_f)
            return i - 1, g_s, [a + b for a, b in zip(ct_c_f, g_c, strict=True)]

        ct_s_f = _float_cotangents(carry_shapes, ct_s)
        zero_c = [jnp.zeros_like(x) for x in c_f0]
        _, g_s, g_c = lax.while_loop(lambda st: st[0] >= 0, body, (n_run - 1, ct_s_f, zero_c))
        return _with_float0(carry_shapes, g_s), _with_float0(consts, g_c)

    run.defvjp(run_fwd, run_bwd)
    return run(carry0, consts)


def _is_inexact(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.inexact)


def _float_cotangents(primal, cotangent) -> list:
    """The leaves of ``cotangent`` where ``primal`` (same structure; arrays or shapes) has a
    floating-point leaf."""
    kinds = [_is_inexact(x) for x in jax.tree_util.tree_leaves(primal)]
    cts = jax.tree_util.tree_leaves(cotangent)
    return [ct for ct, f in zip(cts, kinds, strict=True) if f]


def _with_float0(primal, float_cts) -> Any:
    """A cotangent shaped like ``primal``: ``float_cts`` at its floating-point leaves, in
    order, float0 zeros at the others."""
    cts = iter(float_cts)
    return jax.tree_util.tree_map(
        lambda x: next(cts) if _is_inexact(x)
        else np.zeros(jnp.shape(x), jax.dtypes.float0), primal)
