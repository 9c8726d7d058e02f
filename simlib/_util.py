"""Pytree helpers shared by the fixed-step and adaptive drivers."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from ._errors import Result
from ._solver._base import Field, PyTree, mass_matrix, user_args


def is_tracer(x) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree_util.tree_leaves(x))


def inside_trace() -> bool:
    """Whether we are being traced (under jit, vmap, grad...), even with concrete inputs:
    inside a trace, JAX stages new arrays as tracers."""
    return isinstance(jnp.zeros(()), jax.core.Tracer)


def tree_where(pred, a: PyTree, b: PyTree) -> PyTree:
    return jax.tree_util.tree_map(lambda x, y: jnp.where(pred, x, y), a, b)


def where_rows(mask: jax.Array, tree: PyTree, other) -> PyTree:
    """Per row ``i`` of every leaf: ``tree[i]`` where ``mask[i]``, else ``other`` (a scalar or a
    pytree like one row of ``tree``)."""
    if not isinstance(other, float):
        return jax.tree_util.tree_map(
            lambda v, o: jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)), v, o[None]),
            tree, other)
    return jax.tree_util.tree_map(
        lambda v: jnp.where(mask.reshape((-1,) + (1,) * (v.ndim - 1)), v, other), tree)


def all_finite(tree: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(tree)
    out = jnp.array(True)
    for leaf in leaves:
        out = out & jnp.all(jnp.isfinite(leaf))
    return out


def buffer(y: PyTree, n: int, fill: float) -> PyTree:
    return jax.tree_util.tree_map(lambda x: jnp.full((n,) + x.shape, fill, x.dtype), y)


def write(buf: PyTree, index, y: PyTree) -> PyTree:
    return jax.tree_util.tree_map(
        lambda b, x: lax.dynamic_update_index_in_dim(b, x.astype(b.dtype), index, 0), buf, y
    )


def time_dtype(y0: PyTree):
    """The dtype of ``t``, ``dt`` and ``Solution.ts``: JAX's default float (float64 when
    x64 is enabled, else float32), or the state's real dtype if that is wider.

    Not the state's own dtype: a float32 state at ``t = 1e5`` would round every step of
    ``1e-3`` to a multiple of float32's spacing there (``2**-7``), and the run would end
    at a time that is not ``t1`` (see docs/solving-odes.md, "Time and its precision").
    """
    dtype = jnp.dtype(jnp.result_type(float))
    for leaf in jax.tree_util.tree_leaves(y0):
        leaf_dtype = jnp.result_type(leaf)
        if jnp.issubdtype(leaf_dtype, jnp.inexact):
            dtype = jnp.promote_types(dtype, jnp.finfo(leaf_dtype).dtype)
    return dtype


class ClosureField(Field):
    """``f`` as ``g(t, y, fargs)``, ``fargs = (args, consts)``, with the values ``f`` closes
    over in ``consts``; the user's ``args`` and a DAE's mass matrix stay reachable through
    ``f``'s own :meth:`~Field.user_args` and :meth:`~Field.mass` (a field converted twice,
    as forward mode does, reaches them through both)."""

    def __init__(self, converted, inner):
        self.converted, self.inner = converted, inner

    def __call__(self, t, y, fargs):
        return self.converted(t, y, fargs[0], *fargs[1])

    def user_args(self, fargs):
        return user_args(self.inner, fargs[0])

    def mass(self, fargs):
        return mass_matrix(self.inner, fargs[0])


def convert_closure(f, t, y, args) -> tuple[ClosureField, tuple]:
    """``f`` as ``g(t, y, fargs)`` with everything it closes over moved into ``fargs``.

    A ``custom_vjp`` must see every value it differentiates as an input; a vector field
    that closes over traced values (e.g. a parameter under ``jax.grad``) would otherwise
    lose their gradient (``jax.closure_convert``).
    """
    f_conv, consts = jax.closure_convert(lambda t, y, a: f(t, y, a), t, y, args)
    return ClosureField(f_conv, f), (args, tuple(consts))


def split_inexact(tree: PyTree) -> tuple[list, list, Callable[[list, list], PyTree]]:
    """``(floats, others, merge)``: the floating-point leaves of ``tree``, its other leaves,
    and ``merge(floats, others)``, which puts (new) leaves back into the tree."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    is_float = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves]

    def merge(floats, others):
        fi, oi = iter(floats), iter(others)
        return jax.tree_util.tree_unflatten(treedef, [next(fi) if f else next(oi)
                                                      for f in is_float])

    return ([x for x, f in zip(leaves, is_float, strict=True) if f],
            [x for x, f in zip(leaves, is_float, strict=True) if not f], merge)


def checked_step(f, solver, t, y, h, args, state, count, failure):
    """One fixed step, recording the first non-finite state or failed implicit solve
    (``solver.step_failed``) in ``failure``.

    ``failure`` is ``(result, t_fail, step_fail)``; the state is not selected back on
    failure (a select of the whole state per step; its cost: docs/benchmarks.md, "Design
    measurements"), so the non-finite state propagates to later outputs while the time
    and step of the failure are kept.
    """
    y1, err, _, state1 = solver.step(f, t, y, h, args, state)
    return y1, state1, record_step_failure(solver, t, y1, err, count, failure)


def record_step_failure(solver, t, y1, err, count, failure):
    """``failure`` (``(result, t_fail, step_fail)``) updated for the step from ``t`` that
    gave ``y1`` and ``err``: the first non-finite state (``NONFINITE_STATE``) or failed
    implicit solve (``NEWTON_FAILED``) is kept with its time and step number."""
    result, fail_t, fail_step = failure
    newton_failed = solver.step_failed(err)
    newly_bad = (result == 0) & (~all_finite(y1) | newton_failed)
    code = jnp.where(newton_failed, Result.NEWTON_FAILED.value, Result.NONFINITE_STATE.value)
    return (jnp.where(newly_bad, code, result),
            jnp.where(newly_bad, t, fail_t), jnp.where(newly_bad, count, fail_step))
