"""Parameter transforms: the optimiser works on unconstrained values, the user sees physical ones.

A transform maps an unconstrained real ``u`` to a physical value ``x = forward(u)``;
``inverse`` maps a physical value back. :func:`simlib.fit.fit` optimises ``u`` and
reports ``x``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any

__all__ = ["Bounded", "Identity", "Positive", "Transform"]


class Transform:
    """Base class: a smooth bijection from the real line onto a parameter's domain.

    Subclasses implement :meth:`forward` (unconstrained -> physical), :meth:`inverse`
    (physical -> unconstrained) and :meth:`check` (raise ``ValueError`` when a physical
    value lies outside the domain).
    """

    def forward(self, u: jax.Array) -> jax.Array:
        """Map unconstrained values ``u`` to physical values."""
        raise NotImplementedError

    def inverse(self, x: jax.Array) -> jax.Array:
        """Map physical values ``x`` to unconstrained values."""
        raise NotImplementedError

    def check(self, x: np.ndarray, name: str) -> None:
        """Raise ``ValueError`` naming ``name`` if ``x`` lies outside the domain."""
        del x, name


@dataclass(frozen=True)
class Identity(Transform):
    """No constraint: ``x = u``."""

    def forward(self, u: jax.Array) -> jax.Array:
        return u

    def inverse(self, x: jax.Array) -> jax.Array:
        return x


@dataclass(frozen=True)
class Positive(Transform):
    r"""Strictly positive parameters.

    .. math::

        x = e^{u} \quad (\texttt{kind="exp"}), \qquad
        x = \log(1 + e^{u}) \quad (\texttt{kind="softplus"}).

    ``"exp"`` (the default) optimises ``log x``: a step of the optimiser changes ``x`` by
    a fixed *relative* amount, whatever the parameter's scale, which suits rate constants
    spanning orders of magnitude. ``"softplus"`` is linear for large ``x`` (steps of fixed
    absolute size) and behaves like ``exp`` near zero. The inverse of softplus is computed
    stably as ``u = x + log(-expm1(-x))``.

    Args:
        kind: ``"exp"`` or ``"softplus"``.

    References:
        B. Carpenter et al., "Stan: a probabilistic programming language", *J. Stat.
        Softw.* 76 (2017); Stan Reference Manual, "Constraint transforms" (lower bound).
    """

    kind: str = "exp"

    def __post_init__(self):
        if self.kind not in ("exp", "softplus"):
            raise ValueError(f"Positive(kind=...) must be 'exp' or 'softplus', got {self.kind!r}")

    def forward(self, u: jax.Array) -> jax.Array:
        return jnp.exp(u) if self.kind == "exp" else jax.nn.softplus(u)

    def inverse(self, x: jax.Array) -> jax.Array:
        if self.kind == "exp":
            return jnp.log(x)
        return x + jnp.log(-jnp.expm1(-x))

    def check(self, x: np.ndarray, name: str) -> None:
        if not np.all(x > 0):
            raise ValueError(f"{name} must be > 0 for its Positive() transform, got {_show(x)}")


@dataclass(frozen=True, eq=False)
class Bounded(Transform):
    r"""Parameters in an open interval ``(lo, hi)`` (sigmoid scaling).

    .. math::

        x = lo + (hi - lo)\,\sigma(u), \quad \sigma(u) = \frac{1}{1 + e^{-u}}, \qquad
        u = \log z - \log(1 - z), \quad z = \frac{x - lo}{hi - lo}.

    Args:
        lo: Lower bound (scalar or array broadcastable to the parameter).
        hi: Upper bound, ``hi > lo`` everywhere.

    References:
        Stan Reference Manual, "Constraint transforms" (lower and upper bounded scalar).
    """

    lo: Any
    hi: Any

    def __post_init__(self):
        lo = np.asarray(self.lo, dtype=np.float64)
        hi = np.asarray(self.hi, dtype=np.float64)
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise ValueError(f"Bounded(lo, hi) needs finite bounds, got lo={self.lo!r}, "
                             f"hi={self.hi!r}; use Positive() for a one-sided bound")
        try:
            ok = np.all(lo < hi)
        except ValueError as err:
            raise ValueError(f"Bounded: lo and hi do not broadcast: {err}") from None
        if not ok:
            raise ValueError(f"Bounded(lo, hi) needs lo < hi, got lo={self.lo!r}, hi={self.hi!r}")

    def forward(self, u: jax.Array) -> jax.Array:
        lo, hi = self._bounds(u)
        return lo + (hi - lo) * jax.nn.sigmoid(u)

    def inverse(self, x: jax.Array) -> jax.Array:
        lo, hi = self._bounds(x)
        z = (x - lo) / (hi - lo)
        return jnp.log(z) - jnp.log1p(-z)

    def check(self, x: np.ndarray, name: str) -> None:
        lo = np.asarray(self.lo, dtype=np.float64)
        hi = np.asarray(self.hi, dtype=np.float64)
        try:
            inside = np.all((x > lo) & (x < hi))
        except ValueError:
            raise ValueError(f"{name} (shape {np.shape(x)}) does not broadcast with the bounds "
                             f"of Bounded(lo={self.lo!r}, hi={self.hi!r})") from None
        if not inside:
            raise ValueError(f"{name} must lie strictly inside (lo, hi) = ({self.lo!r}, "
                             f"{self.hi!r}) for its Bounded transform, got {_show(x)}")

    def _bounds(self, ref: jax.Array) -> tuple[jax.Array, jax.Array]:
        dtype = jnp.result_type(ref)
        return jnp.asarray(self.lo, dtype), jnp.asarray(self.hi, dtype)


def _show(x: np.ndarray) -> str:
    x = np.asarray(x)
    return repr(float(x)) if x.ndim == 0 else np.array2string(x, threshold=8)


def _is_transform_leaf(x: Any) -> bool:
    return x is None or isinstance(x, Transform)


def leaf_transforms(transforms: PyTree, params: PyTree) -> list[Transform]:
    """One transform per leaf of ``params``.

    ``transforms`` is ``None`` (identity everywhere) or a pytree whose structure is a
    prefix of ``params``' structure, with :class:`Transform` instances or ``None``
    (identity) as leaves; a transform at an inner node applies to every leaf below it.
    """
    n_leaves = len(jax.tree_util.tree_leaves(params))
    if transforms is None:
        return [Identity()] * n_leaves
    t_leaves, t_def = jax.tree_util.tree_flatten(transforms, is_leaf=_is_transform_leaf)
    for leaf in t_leaves:
        if not _is_transform_leaf(leaf):
            raise TypeError(
                "transforms must hold simlib.fit transforms (Positive(), Bounded(lo, hi), "
                f"Identity()) or None as leaves, got {leaf!r}"
            )
    try:
        subtrees = t_def.flatten_up_to(params)
    except (ValueError, TypeError) as err:
        p_def = jax.tree_util.tree_structure(params)
        raise ValueError(
            "transforms does not match params0: its structure must equal params0's, or be a "
            f"prefix of it; transforms is {t_def}, params0 is {p_def} ({err})"
        ) from None
    out: list[Transform] = []
    for t, sub in zip(t_leaves, subtrees, strict=True):
        out.extend([Identity() if t is None else t] * len(jax.tree_util.tree_leaves(sub)))
    return out


def leaf_names(params: PyTree, root: str = "params0") -> list[str]:
    """Readable names of ``params``' leaves, e.g. ``params0['args'][1]``."""
    paths = jax.tree_util.tree_flatten_with_path(params)[0]
    return [root + jax.tree_util.keystr(path) for path, _ in paths]


def make_maps(
    transforms: PyTree, params: PyTree
) -> tuple[Callable[[PyTree], PyTree], Callable[[PyTree], PyTree]]:
    """``(to_physical, to_unconstrained)`` for ``params``' structure, after checking that
    every leaf of ``params`` lies in its transform's domain."""
    per_leaf = leaf_transforms(transforms, params)
    leaves, treedef = jax.tree_util.tree_flatten(params)
    for t, leaf, name in zip(per_leaf, leaves, leaf_names(params), strict=True):
        t.check(np.asarray(leaf, dtype=np.float64), name)

    def to_physical(u: PyTree) -> PyTree:
        u_leaves = treedef.flatten_up_to(u)
        return treedef.unflatten([t.forward(x) for t, x in zip(per_leaf, u_leaves, strict=True)])

    def to_unconstrained(x: PyTree) -> PyTree:
        x_leaves = treedef.flatten_up_to(x)
        return treedef.unflatten([t.inverse(v) for t, v in zip(per_leaf, x_leaves, strict=True)])

    return to_physical, to_unconstrained
