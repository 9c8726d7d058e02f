"""The solver protocol shared by every stepper, and pytree arithmetic helpers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any
VectorField = Callable[[Any, PyTree, Any], PyTree]


def register_static(cls):
    """Register a solver class as a pytree with no leaves (all its fields are structure)."""
    jax.tree_util.register_pytree_node(
        cls, lambda s: ((), s), lambda s, _: s
    )
    return cls


def axpy(y: PyTree, h, terms: list[tuple[float, PyTree]]) -> PyTree:
    """``y + h * sum_j coef_j * k_j`` leaf by leaf, skipping zero coefficients.

    ``h`` is cast to each leaf's dtype so that the state keeps its dtype.
    """
    terms = [(c, k) for c, k in terms if c != 0.0]
    if not terms:
        return y

    def leaf(y_leaf, *k_leaves):
        acc = terms[0][0] * k_leaves[0]
        for (c, _), k_leaf in zip(terms[1:], k_leaves[1:], strict=True):
            acc = acc + c * k_leaf
        return y_leaf + jnp.asarray(h, y_leaf.dtype) * acc

    return jax.tree_util.tree_map(leaf, y, *[k for _, k in terms])


def linear_combination(terms: list[tuple[float, PyTree]]) -> PyTree:
    """``sum_j coef_j * k_j`` leaf by leaf, skipping zero coefficients."""
    terms = [(c, k) for c, k in terms if c != 0.0]

    def leaf(*k_leaves):
        acc = terms[0][0] * k_leaves[0]
        for (c, _), k_leaf in zip(terms[1:], k_leaves[1:], strict=True):
            acc = acc + c * k_leaf
        return acc

    return jax.tree_util.tree_map(leaf, *[k for _, k in terms])


class AbstractSolver:
    """A one-step method ``y_{n+1} = Phi(t_n, y_n, h)``: the base class of every solver.

    Subclasses provide:
        order: Order of the method.
        adaptive: Whether ``step`` returns an embedded error estimate.
        symplectic: Whether the method needs a separable ``(q, p)`` state.
        init(f, t, y, args): per-run state carried between steps (e.g. the FSAL stage);
            ``None`` by default.
        step(f, t, y, h, args, state): returns ``(y1, error_info, dense_info, new_state)``,
            pure JAX on pytrees, with ``h`` possibly traced.
        Adaptive solvers also ``error_order``, ``error_ratio(y, y1, err, h, rtol, atol)``
        (accept when at most one) and ``interpolate(f, args, t, y, h, y1, dense_info,
        theta)`` for ``SaveAt(ts=...)``; see :class:`ExplicitRungeKutta`, which provides all
        of this from a :class:`ButcherTableau`. Solvers compare and hash by class, since
        they are static arguments of the compiled cores: keep configuration in class
        attributes. Adding a method: docs/extending.md.
    """

    order: int = 0
    adaptive: bool = False
    symplectic: bool = False
    reference: str = ""

    def init(self, f: VectorField, t, y: PyTree, args) -> PyTree:
        return None

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __eq__(self, other) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))
