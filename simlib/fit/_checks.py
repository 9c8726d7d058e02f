"""Argument checks shared by :func:`fit` and :func:`least_squares`."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._transforms import leaf_names

PyTree = Any


def as_float_tree(params0: PyTree, root: str = "params0") -> PyTree:
    """``params0`` with every leaf a strongly typed inexact JAX array (integers and bools
    become the default float), after checking that each leaf is concrete, numeric and
    finite; errors name the leaf (``root['k']``)."""
    leaves, treedef = jax.tree_util.tree_flatten(params0)
    if not leaves:
        raise ValueError(f"{root} has no array leaves: {params0!r}")
    out = []
    for name, leaf in zip(leaf_names(params0, root), leaves, strict=True):
        if isinstance(leaf, jax.core.Tracer):
            raise TypeError(f"{name} is a traced value; call fit() outside jit/vmap/grad")
        arr = np.asarray(leaf)
        if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
            raise TypeError(f"{name} must be numeric, got {leaf!r}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got {leaf!r}")
        x = jnp.asarray(leaf)
        dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.result_type(float)
        out.append(jnp.array(x, dtype=dtype))  # jnp.array with a dtype: not weakly typed
    return jax.tree_util.tree_unflatten(treedef, out)


def check_positive_int(value: Any, name: str) -> int:
    """``value`` as an ``int`` when it is a positive integer (not a bool), else a
    ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
