"""A Brownian path that is a function of a key and a time interval: a dyadic tree of
increments and space-time Lévy areas, drawn with a counter-based hash.

The path ``W`` on ``[t0, t1]`` (``T = t1 - t0``) is built top-down. Every dyadic interval
of length ``l`` carries its increment ``dW`` and its space-time Lévy area
``H = (1/l) int (W_s - W_a - (s - a)/l dW) ds`` (``dW ~ N(0, l)``, ``H ~ N(0, l/12)``,
independent). An interval is split at its midpoint by drawing the left half's
``(dW_1, H_1)`` from its Gaussian law given ``(dW, H)`` (two normals; the right half follows
from ``dW = dW_1 + dW_2`` and ``H = (H_1 + H_2)/2 + (dW_1 - dW_2)/4``). The normals of a node
depend only on the key and the node's position in the tree, so the values at the dyadic
times ``t0 + j T / 2^k`` are the same however deep the tree is built: a solve with any
``dt`` sees the same Brownian motion there. Foster, Lyons and Oberhauser (2020), "An optimal
polynomial approximation of Brownian motion", SIAM J. Numer. Anal. 58(3) give the
increment/area pair; the conditional laws below are Gaussian conditioning, derived in
docs/sde.md.

A query at a time inside a finest interval (a leaf, of length ``T / 2^levels``) splits that
leaf at the query's fraction ``r`` with the same conditional law and two normals keyed on
the leaf and on ``r``: exact for a solve whose step points fall at most one per leaf
(``levels`` is chosen from ``dt`` so that a leaf is at most one step long), and converging
to the canonical path as the tree deepens.

Random numbers: each normal pair comes from a 32-bit integer hash of (seed, node, channel)
(two rounds of the ``lowbias32`` integer finalizer) and the Box-Muller transform; see
docs/sde.md for the statistical checks and what it guarantees.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

__all__ = ["BrownianPath", "levels_for", "split_keys"]

_U32 = jnp.uint32


def _mix(x):
    """The ``lowbias32`` finalizer (Wellons, "Hash function prospector", 2018): a bijection of
    32-bit words with low avalanche bias."""
    x = x ^ (x >> 16)
    x = x * _U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _U32(0x846CA68B)
    return x ^ (x >> 16)


def _hash_pair(seed, node, channel):
    """Two 32-bit words from (seed, node, channel): a keyed two-round hash."""
    x = _mix(node * _U32(0x9E3779B1) ^ seed[0])
    x = _mix(x ^ (channel * _U32(0x85EBCA77) + seed[1]))
    return _mix(x + _U32(0x68E31DA4)), _mix(x + _U32(0x1B56C4E9) ^ seed[0])


def normal_pair(seed, node, channel, dtype):
    """Two independent standard normals per ``(node, channel)`` (Box-Muller on two 32-bit
    uniforms in ``(0, 1)``; the tails are cut at ``sqrt(2 * 32 ln 2) = 6.66`` sigma)."""
    a, b = _hash_pair(seed, node, channel)
    scale = 2.0 ** -32
    u1 = (a.astype(dtype) + 0.5) * scale
    u2 = (b.astype(dtype) + 0.5) * scale
    r = jnp.sqrt(-2.0 * jnp.log(u1))
    theta = (2.0 * math.pi) * u2
    return r * jnp.cos(theta), r * jnp.sin(theta)


def _split(dw, h, length, z1, z2):
    """Left half ``(dW_1, H_1)`` and right half ``(dW_2, H_2)`` of an interval of
    ``length`` with increment ``dw`` and area ``h``, given two standard normals.

    Conditional law of the left half (unit length): mean ``(dW/2 + 3H/2, H/4)``, covariance
    ``[[1/16, -1/32], [-1/32, 7/192]]``, whose Cholesky factor is
    ``[[1/4, 0], [-1/8, 1/sqrt(48)]]``.
    """
    s = jnp.sqrt(length)
    dw1 = 0.5 * dw + 1.5 * h + s * (0.25 * z1)
    h1 = 0.25 * h + s * (-0.125 * z1 + z2 / math.sqrt(48.0))
    dw2 = dw - dw1
    h2 = 2.0 * h - h1 - 0.5 * (dw1 - dw2)
    return dw1, h1, dw2, h2


def _split_at(dw, h, length, r, z1, z2):
    """Left piece ``(dW_1, H_1)`` of an interval cut at fraction ``r`` in ``(0, 1)``.

    Unit length: ``dW_1 | (dW, H)`` has mean ``r dW + 6 r (1-r) H``, variance
    ``r (1-r) (1 - 3 r (1-r))``; ``H_1`` has mean ``r^2 H``, variance ``r (1 - r^3)/12``;
    their covariance is ``-r^3 (1-r)/2``.
    """
    q = r * (1.0 - r)
    v_w = jnp.maximum(q * (1.0 - 3.0 * q), 0.0)
    v_h = r * (1.0 - r ** 3) / 12.0
    c = -(r ** 3) * (1.0 - r) / 2.0
    l11 = jnp.sqrt(v_w)
    l21 = jnp.where(l11 > 0, c / jnp.where(l11 > 0, l11, 1.0), 0.0)
    l22 = jnp.sqrt(jnp.maximum(v_h - l21 ** 2, 0.0))
    s = jnp.sqrt(length)
    dw1 = r * dw + 6.0 * q * h + s * (l11 * z1)
    h1 = r * r * h + s * (l21 * z1 + l22 * z2)
    return dw1, h1


def levels_for(t0: float, t1: float, dt: float) -> int:
    """Tree depth for steps of ``dt`` on ``[t0, t1]``: the least ``k`` with
    ``(t1 - t0) / 2^k <= |dt|`` (a leaf is at most one step long)."""
    ratio = abs(float(t1) - float(t0)) / abs(float(dt))
    if not np.isfinite(ratio) or ratio <= 1.0:
        return 0
    return int(math.ceil(math.log2(ratio * (1.0 - 1e-12))))


def split_keys(key, n: int):
    """``n`` independent keys for an ensemble of ``n`` paths (``jax.random.split``).

    Example: ``jax.vmap(lambda k: sl.solve(..., key=k))(sl.split_keys(key, 100))``.
    """
    if not isinstance(n, int | np.integer) or n <= 0:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    return jax.random.split(key, int(n))


def _seed(key):
    """Two 32-bit seed words from a JAX key (typed or legacy ``uint32[2]``)."""
    if isinstance(key, jax.Array | jax.core.Tracer) and jnp.issubdtype(
            key.dtype, jax.dtypes.prng_key):
        return jax.random.bits(key, (2,), jnp.uint32)
    arr = jnp.asarray(key)
    if arr.dtype != jnp.uint32 or arr.shape != (2,):
        raise TypeError(f"key must be a JAX PRNG key (jax.random.key(0) or "
                        f"jax.random.PRNGKey(0)), got {key!r}")
    return jax.random.bits(arr, (2,), jnp.uint32)


def _build(seed, t0, t1, levels: int, d: int, dtype):
    """Node values ``W`` (``2^levels + 1``), leaf areas ``H`` (``2^levels``) and node time
    integrals ``I(t) = int_{t0}^t W`` (``2^levels + 1``), each with ``d`` channels."""
    span = (t1 - t0).astype(dtype)
    channel = jnp.arange(d, dtype=_U32)
    z1, z2 = normal_pair(seed, _U32(0), channel, dtype)
    dw = (jnp.sqrt(span) * z1)[None]
    h = (jnp.sqrt(span / 12.0) * z2)[None]
    for j in range(levels):
        n = 2 ** j
        node = (jnp.arange(n, dtype=_U32) + _U32(n))[:, None]
        z1, z2 = normal_pair(seed, node, channel[None], dtype)
        dw1, h1, dw2, h2 = _split(dw, h, span / n, z1, z2)
        dw = jnp.stack([dw1, dw2], axis=1).reshape(2 * n, d)
        h = jnp.stack([h1, h2], axis=1).reshape(2 * n, d)
    leaf = span / 2 ** levels
    zero = jnp.zeros((1, d), dtype)
    w = jnp.concatenate([zero, jnp.cumsum(dw, axis=0)])
    area = leaf * (w[:-1] + h + 0.5 * dw)
    integral = jnp.concatenate([zero, jnp.cumsum(area, axis=0)])
    return w, h, integral


_build_jit = jax.jit(_build, static_argnums=(3, 4, 5))


class BrownianPath:
    """A Brownian motion ``W`` on ``[t0, t1]`` with ``W(t0) = 0``, a function of ``key``
    and the interval: the same key gives the same values at the dyadic times
    ``t0 + j (t1 - t0) / 2^k`` whatever ``dt`` or ``levels``.

    Args:
        key: A JAX PRNG key.
        t0, t1: The interval (``t1 > t0``).
        shape: Shape of ``W(t)`` (independent components).
        dt: The step the path is queried at: the tree is built ``levels_for(t0, t1, dt)``
            deep, so a solve with this ``dt`` sees exactly this path.
        levels: The tree depth instead of ``dt``.
        dtype: Floating dtype (default: JAX's default float).

    Methods: :meth:`evaluate` (``W(t)``), :meth:`increment`, :meth:`time_integral`
    (``int_{t0}^t W(s) ds``). A pytree: ``jax.vmap`` a function that builds one over keys.
    """

    def __init__(self, key, t0, t1, shape: tuple[int, ...] = (), *, dt=None,
                 levels: int | None = None, dtype: Any = None):
        if levels is None:
            if dt is None:
                raise ValueError("BrownianPath needs dt (the step it is queried at) or levels")
            levels = levels_for(t0, t1, dt)
        if not isinstance(levels, int | np.integer) or not 0 <= levels <= 24:
            raise ValueError(f"levels must be an integer in [0, 24], got {levels!r}")
        shape = tuple(int(n) for n in shape) if isinstance(shape, tuple | list) else (
            (int(shape),))
        dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
        self.shape, self.levels, self.dtype = shape, int(levels), dtype
        self.t0 = jnp.asarray(t0, dtype)
        self.t1 = jnp.asarray(t1, dtype)
        self.seed = _seed(key)
        d = int(np.prod(shape)) if shape else 1
        self.w, self.h, self.i = _build_jit(self.seed, self.t0, self.t1, self.levels, d, dtype)

    # -- evaluation (pure JAX; t may be traced)
    def _flat_at(self, t, need_integral: bool):
        """``(W(t), I(t))`` flat, ``(d,)`` each (``I`` is ``None`` unless asked for)."""
        n_leaf = 2 ** self.levels
        t = jnp.asarray(t, self.dtype)
        leaf_len = (self.t1 - self.t0) / n_leaf
        u = jnp.clip((t - self.t0) / leaf_len, 0.0, float(n_leaf))
        nearest = jnp.round(u)
        tol = 8 * jnp.finfo(self.dtype).eps * (1.0 + u)
        on_node = jnp.abs(u - nearest) <= tol

        def node():
            k = nearest.astype(jnp.int32)
            wk = lax.dynamic_index_in_dim(self.w, k, keepdims=False)
            ik = lax.dynamic_index_in_dim(self.i, k, keepdims=False) if need_integral else None
            return wk, ik

        def inside():
            k = jnp.clip(jnp.floor(u), 0, n_leaf - 1).astype(jnp.int32)
            r = u - k.astype(u.dtype)
            wa = lax.dynamic_index_in_dim(self.w, k, keepdims=False)
            wb = lax.dynamic_index_in_dim(self.w, k + 1, keepdims=False)
            ha = lax.dynamic_index_in_dim(self.h, k, keepdims=False)
            rbits = lax.bitcast_convert_type(r.astype(jnp.float32), _U32)
            node_id = _mix(k.astype(_U32) ^ _U32(0xA5A5A5A5)) ^ rbits
            d = wa.shape[-1]
            z1, z2 = normal_pair(self.seed, node_id, jnp.arange(d, dtype=_U32)
                                 + _U32(1 << 31), self.dtype)
            dw1, h1 = _split_at(wb - wa, ha, leaf_len, r, z1, z2)
            w = wa + dw1
            if not need_integral:
                return w, None
            ia = lax.dynamic_index_in_dim(self.i, k, keepdims=False)
            return w, ia + r * leaf_len * (wa + h1 + 0.5 * dw1)

        return lax.cond(on_node, node, inside)

    def _shape_out(self, x):
        return x.reshape(self.shape)

    def evaluate(self, t) -> jax.Array:
        """``W(t) - W(t0)``, shaped ``shape``."""
        return self._shape_out(self._flat_at(t, False)[0])

    def increment(self, s, t) -> jax.Array:
        """``W(t) - W(s)``."""
        return self.evaluate(t) - self.evaluate(s)

    def time_integral(self, t) -> jax.Array:
        """``int_{t0}^t (W(s) - W(t0)) ds``."""
        return self._shape_out(self._flat_at(t, True)[1])

    def __repr__(self) -> str:
        return f"BrownianPath(shape={self.shape}, levels={self.levels}, dtype={self.dtype})"


def _flatten(p):
    return (p.t0, p.t1, p.seed, p.w, p.h, p.i), (p.shape, p.levels, p.dtype)


def _unflatten(aux, leaves):
    p = object.__new__(BrownianPath)
    p.shape, p.levels, p.dtype = aux
    p.t0, p.t1, p.seed, p.w, p.h, p.i = leaves
    return p


jax.tree_util.register_pytree_node(BrownianPath, _flatten, _unflatten)
