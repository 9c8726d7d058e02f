"""The default gradient strategy (``adjoint=None``): chosen from what is differentiated.

Forward mode costs about one forward pass per differentiated input component; reverse mode
costs a fixed multiple of the forward pass whatever the number of inputs. So when ``jax.grad``
(or ``jvp``, ``jacrev``, ...) reaches a solve, the rule below counts the floating-point
input components that actually carry a derivative (``y0``, ``args``, values the vector field
closes over, the times) and picks

- **forward mode** (the solve's Jacobian with respect to those components, pushed through
  the plain loop as one batch of tangents, :func:`jacobian_push`) when there are at most
  :data:`FORWARD_MODE_MAX` of them;
- **reverse mode** otherwise: the driver's reverse strategy (``Checkpointed`` for fixed-step
  runs of more than 1,024 steps, ``Direct`` below; the recorded replay for adaptive runs).

The choice is made at trace time, once per compilation, and logged on the ``simlib``
logger at level INFO (``logging.getLogger("simlib").setLevel("INFO")`` shows it). The
threshold was measured on the two problem shapes of benchmarks/gradients.py (one
trajectory, and a batched ensemble), see docs/gradients.md.

Fixed-step runs and ``simulate`` go through a ``jax.custom_jvp``, so ``jax.jvp``,
``jacfwd`` and ``hessian`` still work: the forward-mode branch's tangent is ``J @ t``
(linear, so reverse mode transposes it to ``J^T ct``) and the reverse branch is the plain
JVP of the loop, which
``jax.grad`` linearises and transposes as it would without the rule. Adaptive runs are
already a ``jax.custom_vjp`` (their reverse mode replays the attempts), so the choice there
is made in a ``custom_vjp`` forward rule. ``ForwardMode()`` is that custom VJP with forward
mode forced; under ``vmap`` it pushes the tangents outside the members
(:func:`jacobian_push`), which the custom JVP cannot do and still survive ``jax.hessian``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.flatten_util import ravel_pytree

from ._adjoint import TANGENTS_ONLY, AbstractAdjoint, first_order_only
from ._solver._base import register_static
from ._util import split_inexact

FORWARD_MODE_MAX = 8
"""Forward mode for at most this many differentiated input components (measured:
docs/gradients.md, "The default strategy")."""

logger = logging.getLogger("simlib")


def _is_float(x) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jnp.inexact)


def _size(x) -> int:
    return int(np.prod(jnp.shape(x), dtype=np.int64))


def jacobian_push(call, values, others, active, *, members_outside: bool = True):
    """``(out, jac)``: ``call(values, others)`` and, for every floating-point leaf of
    ``out``, its Jacobian with respect to the components of ``values[i]`` for ``i`` in
    ``active`` (a trailing axis, in ``ravel_pytree`` order).

    One pass of the computation carrying one tangent per active component (``vmap`` of
    ``jvp``, as ``jax.jacfwd`` does); the primal output comes back alongside. Under a
    ``vmap`` (an ensemble whose members each run forward mode) a batching rule keeps the
    tangent axis outside the members: ``vmap`` over the tangent basis of ``jvp`` of the
    member-``vmap``ped computation, one tangent per component of a member shared by all
    members (``jax.jacfwd(jax.vmap(...))``'s layout), faster than the nested layout
    (docs/benchmarks.md, "Design measurements"). All
    outputs of the rule are batched (see :func:`all_batched`). ``members_outside=False``
    keeps the plain nested layout, for a custom JVP rule: the batching rule does not
    survive a second derivative (``jax.hessian``).
    """

    def pushed(call, values, others, members):
        act = [values[i] for i in active]
        one = [jnp.zeros(jnp.shape(x)[1:] if b else jnp.shape(x), jnp.result_type(x))
               for x, b in zip(act, members, strict=True)]
        flat, unravel = ravel_pytree(one)

        def with_active(a):
            full = list(values)
            for i, x in zip(active, a, strict=True):
                full[i] = x
            return call(full, others)

        def push(v):
            tangent = [jnp.broadcast_to(t, jnp.shape(x)) for t, x in zip(unravel(v), act,
                                                                           strict=True)]
            out, d_out = jax.jvp(with_active, (act,), (tangent,))
            return out, [t for o, t in zip(jax.tree_util.tree_leaves(out),
                                           jax.tree_util.tree_leaves(d_out), strict=True)
                         if _is_float(o)]

        return jax.vmap(push, out_axes=(None, -1))(jnp.eye(flat.size, dtype=flat.dtype))

    if not members_outside:
        return pushed(call, values, others, [False] * len(active))
    fn = jax.custom_batching.custom_vmap(
        lambda values, others: pushed(call, values, others, [False] * len(active)))

    @fn.def_vmap
    def rule(axis_size, in_batched, values, others):
        vb, ob = in_batched
        members = jax.vmap(call, in_axes=([0 if b else None for b in vb],
                                          [0 if b else None for b in ob]), axis_size=axis_size)
        out = pushed(members, values, others, [vb[i] for i in active])
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return fn(values, others)


def all_batched(fn):
    """``fn`` whose outputs under ``jax.vmap`` are all batched, as those of
    :func:`jacobian_push` are (the primal and the forward pass of a custom derivative must
    agree on which outputs are batched)."""
    out = jax.custom_batching.custom_vmap(fn)

    @out.def_vmap
    def rule(axis_size, in_batched, *args):
        axes = jax.tree_util.tree_map(lambda b: 0 if b else None, in_batched)
        res = jax.vmap(fn, in_axes=tuple(axes), axis_size=axis_size)(*args)
        return res, jax.tree_util.tree_map(lambda _: True, res)

    return out


def _contract(out, jac, t_flat):
    """The tangent of ``out`` for the input tangent ``t_flat``: ``J @ t`` per float leaf,
    float0 zeros for the others."""
    leaves, treedef = jax.tree_util.tree_flatten(out)
    jac_iter = iter(jac)
    tangents = []
    for leaf in leaves:
        if _is_float(leaf) and t_flat is None:
            tangents.append(jnp.zeros_like(leaf))
        elif _is_float(leaf):
            tangents.append(jnp.tensordot(next(jac_iter), t_flat, axes=1).astype(leaf.dtype))
        else:
            tangents.append(np.zeros(jnp.shape(leaf), jax.dtypes.float0))
    return jax.tree_util.tree_unflatten(treedef, tangents)


def _log_choice(where: str, n: int, forward: bool, reverse_name: str):
    if forward:
        logger.info("%s: adjoint=None chose ForwardMode (%d differentiated input "
                    "components <= %d)", where, n, FORWARD_MODE_MAX)
    else:
        logger.info("%s: adjoint=None chose %s (%d differentiated input components > %d)",
                    where, reverse_name, n, FORWARD_MODE_MAX)


def auto_jvp(fn, reverse_fn, tree, *, where: str, reverse_name: str,
             max_forward: int | None = FORWARD_MODE_MAX, log: bool = True):
    """``fn(tree)`` (a plain, ``jvp``-able computation) whose derivative is forward mode for
    few differentiated components and ``jax.jvp(reverse_fn)`` otherwise.

    ``reverse_fn`` computes the same values as ``fn`` (e.g. the same scan with checkpointed
    segments). Every traced value must be in ``tree`` (nothing closed over).
    """
    floats0, others0, merge = split_inexact(tree)

    def call(floats, others):
        return fn(merge(floats, others))

    @jax.custom_jvp
    def run(floats, others):
        return call(floats, others)

    def run_jvp(primals, tangents):
        floats, others = primals
        d_floats, _ = tangents
        active = [i for i, d in enumerate(d_floats) if not isinstance(d, SymbolicZero)]
        n = sum(_size(floats[i]) for i in active)
        forward = max_forward is None or n <= max_forward
        if log:
            _log_choice(where, n, forward, reverse_name)
        if not active:
            out = call(floats, others)
            return out, _contract(out, [], None)
        if forward:
            out, jac = jacobian_push(call, list(floats), list(others), active,
                                     members_outside=False)
            t_flat, _ = ravel_pytree([d_floats[i] for i in active])
            return out, _contract(out, jac, t_flat)
        d_floats = [jnp.zeros_like(x) if isinstance(d, SymbolicZero) else d
                    for x, d in zip(floats, d_floats, strict=True)]
        return jax.jvp(lambda fl: reverse_fn(merge(fl, others)), (list(floats),), (d_floats,))

    run.defjvp(run_jvp, symbolic_zeros=True)
    return run(floats0, others0)


def auto_vjp(fn, forward_fn, reverse_fn, tree, *, where: str, reverse_name: str,
             max_forward: int | None = FORWARD_MODE_MAX):
    """``fn(tree)`` for computations that already have a custom VJP (``reverse_fn``, e.g. an
    adaptive solve's replay): the VJP is built from forward mode through ``forward_fn`` (a
    ``jvp``-able computation of the same values) for few differentiated components, and is
    ``reverse_fn``'s own otherwise. ``max_forward=None``: always forward mode
    (``ForwardMode()``)."""
    floats0, others0, merge = split_inexact(tree)

    def call(floats, others):
        return fn(merge(floats, others))

    @jax.custom_vjp
    def run(floats, others):
        return all_batched(call)(floats, others)

    # The branch taken travels in the residuals' structure (a dict key), and the active
    # inputs as the values of ``marks`` (None for the others): JAX may trace the forward
    # rule more than once (under vmap), so nothing is kept on the side.
    def run_fwd(floats, others):
        values = [x.value for x in floats]
        other_values = [x.value for x in others]
        active = [i for i, x in enumerate(floats) if x.perturbed]
        n = sum(_size(values[i]) for i in active)
        forward = max_forward is None or n <= max_forward
        if max_forward is not None:
            _log_choice(where, n, forward, reverse_name)
        if n == 0:
            return all_batched(call)(values, other_values), {}
        if forward:
            out, jac = first_order_only(lambda v, o: jacobian_push(
                lambda fl, ot: forward_fn(merge(fl, ot)), v, o, active), where)(
                    values, other_values)
            marks = [v if i in active else None for i, v in enumerate(values)]
            return out, {"forward": (jac, marks)}
        out, vjp = jax.vjp(lambda fl: reverse_fn(merge(fl, other_values)), values)
        return out, {"reverse": vjp}

    def run_bwd(res, cotangent):
        n_other = len(others0)
        if not res:
            return [None] * len(floats0), [None] * n_other
        ct_leaves = jax.tree_util.tree_leaves(
            cotangent, is_leaf=lambda x: isinstance(x, SymbolicZero))
        if "forward" in res:
            jac, marks = res["forward"]
            float_cts = [ct for ct in ct_leaves if _is_float_ct(ct)]
            flat, unravel = ravel_pytree([m for m in marks if m is not None])
            total = jnp.zeros(flat.shape, flat.dtype)
            for ct, jl in zip(float_cts, jac, strict=True):
                if not isinstance(ct, SymbolicZero):
                    total = total + jnp.tensordot(ct, jl, axes=jnp.ndim(ct)).astype(flat.dtype)
            per_active = iter(unravel(total))
            return [None if m is None else next(per_active) for m in marks], [None] * n_other
        treedef = jax.tree_util.tree_structure(
            cotangent, is_leaf=lambda x: isinstance(x, SymbolicZero))
        dense = jax.tree_util.tree_unflatten(treedef, [_instantiate(ct) for ct in ct_leaves])
        (d_floats,) = res["reverse"](dense)
        return list(d_floats), [None] * n_other

    run.defvjp(run_fwd, run_bwd, symbolic_zeros=True)
    return run(floats0, others0)


def _is_float_ct(ct) -> bool:
    if isinstance(ct, SymbolicZero):
        return jnp.issubdtype(ct.aval.dtype, jnp.inexact)
    return _is_float(ct) and ct.dtype != jax.dtypes.float0


def _instantiate(ct):
    if isinstance(ct, SymbolicZero):
        dtype = ct.aval.dtype
        return (np.zeros(ct.aval.shape, jax.dtypes.float0)
                if not jnp.issubdtype(dtype, jnp.inexact) else jnp.zeros(ct.aval.shape, dtype))
    return ct


@register_static
@dataclass(frozen=True)
class ForwardMode(AbstractAdjoint):
    """Gradients from forward-mode derivatives (``jax.jvp``), for a handful of inputs.

    The forward pass carries one tangent per differentiated input component alongside the
    state (``jax.jacfwd``), so it costs about ``1 + n`` forward passes for ``n``
    differentiated components, in memory independent of the steps; the backward pass is a
    contraction with that Jacobian. Gradients flow to ``y0``, ``args`` (and values the
    vector field closes over), and to the times (``t0``, ``t1``, ``dt``, ``saveat.ts``):
    the exact derivative of the discrete solution (tests/test_adjoint.py checks it against
    ``Direct()`` and central differences). Adaptive runs push tangents for ``rtol`` and
    ``atol`` as well when they are differentiated (that derivative has no test).
    Only the inputs actually differentiated get tangents. Works for fixed-step and adaptive
    runs. A fixed-step run (and ``simulate``) is a custom JVP, which every transformation
    goes through (``jax.jvp``, ``jacfwd``, ``hessian``); an adaptive run is a custom VJP
    (reverse-mode transformations only; docs/gradients.md has the table).
    """

    def wrap(self, core, tree, *, jvp_able, reverse, where):
        # the default's machinery (below), with forward mode forced
        def plain(t):
            return core(t, TANGENTS_ONLY)
        if jvp_able:  # a custom JVP: jvp, jacfwd, hessian and jacrev(jacrev) go through
            return auto_jvp(plain, plain, tree, where=where, reverse_name="",
                            max_forward=None, log=False)
        return auto_vjp(plain, plain, None, tree, where=where, reverse_name="",
                        max_forward=None)


@register_static
@dataclass(frozen=True)
class Automatic(AbstractAdjoint):
    """The default strategy (``adjoint=None``): forward mode for at most
    :data:`FORWARD_MODE_MAX` differentiated input components, the driver's reverse strategy
    otherwise (module docstring)."""

    def wrap(self, core, tree, *, jvp_able, reverse, where):
        name = f"{type(reverse).__name__}()"
        if jvp_able:
            return auto_jvp(lambda t: core(t, TANGENTS_ONLY), lambda t: core(t, reverse), tree,
                            where=where, reverse_name=name)
        return auto_vjp(lambda t: core(t, reverse), lambda t: core(t, TANGENTS_ONLY),
                        lambda t: core(t, reverse), tree, where=where, reverse_name=name)

    def with_closures(self, closes_over, reverse):
        # its custom JVP cannot see values the computation closes over; reverse mode
        # through the plain loop can
        return reverse if closes_over() else self


AUTOMATIC = Automatic()
