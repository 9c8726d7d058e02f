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

__all__ = ["BrownianPath", "BrownianSteps", "VirtualBrownianPath", "levels_for", "split_keys"]

_U32 = jnp.uint32
_ROOT, _BRIDGE, _STEPS = 0, 1000, 2000
"""Stream numbers: the root pair is stream 0, the split normals of level ``j`` streams
``1 + 2j`` (``z1``) and ``2 + 2j`` (``z2``), the bridge normals of a tree ``k`` deep streams
``1000 + 4k`` (increment only) and ``1001 + 4k``, ``1002 + 4k`` (increment and area);
:class:`BrownianSteps` uses stream 2000."""


def _mix(x):
    """The ``lowbias32`` finalizer (Wellons, "Hash function prospector", 2018): a bijection of
    32-bit words with low avalanche bias."""
    x = x ^ (x >> 16)
    x = x * _U32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * _U32(0x846CA68B)
    return x ^ (x >> 16)


def _hash_pair(seed, stream: int, pair, channel):
    """Two 32-bit words from (seed, stream, pair, channel): keyed ``lowbias32`` rounds.

    The stream is hashed with the seed first, and only then combined with the pair: XOR-ing
    ``stream * G`` and ``pair * G`` directly made ``(stream a, pair b)`` and ``(stream b,
    pair a)`` give the same words for every key, so that two nodes of every path drew the
    same normals (tests/test_sde.py checks that no two counters of a tree collide).
    """
    if isinstance(stream, int):
        s0 = _mix(seed[0] ^ _U32((stream * 0x9E3779B1) & 0xFFFFFFFF))
    else:  # a traced stream number (the virtual path's loop over levels): the same words
        s0 = _mix(seed[0] ^ (jnp.asarray(stream).astype(_U32) * _U32(0x9E3779B1)))
    x = _mix((pair * _U32(0x9E3779B1)) ^ s0)
    x = _mix(x ^ (channel * _U32(0x85EBCA77) + seed[1]))
    return x, _mix(x ^ (seed[1] + _U32(0x68E31DA4)))


# Taylor coefficients of sin and cos in x^2 (on [0, pi/2] the f64 set is accurate to 3e-16,
# the f32 set to 6e-8)
def _taylor(n):
    sin_c = [(-1) ** k / math.factorial(2 * k + 1) for k in range(n)]
    cos_c = [(-1) ** k / math.factorial(2 * k) for k in range(n + 1)]
    return sin_c, cos_c


_SINCOS = {8: _taylor(10), 4: _taylor(6)}


def _unit(bits, nbits: int, dtype):
    """The top ``nbits`` of the 32-bit words ``bits`` as a float in ``[1, 2)``, placed in the
    mantissa (no integer-to-float conversion, which does not vectorise on x86)."""
    if jnp.dtype(dtype).itemsize >= 8:
        m = (bits >> (32 - nbits)).astype(jnp.uint64) << (52 - nbits)
        return lax.bitcast_convert_type(m | jnp.uint64(0x3FF0000000000000), jnp.float64)
    m = bits >> (32 - min(nbits, 23)) << (23 - min(nbits, 23))
    return lax.bitcast_convert_type(m | _U32(0x3F800000), jnp.float32)


def _sincos_quarter(b, dtype):
    """``(cos theta, sin theta)`` for an angle ``theta`` uniform on ``[0, 2 pi)`` taken from
    the word ``b``: its top two bits choose the quadrant, the next 30 the angle in it (a
    Taylor polynomial on ``[0, pi/2)``, no range reduction)."""
    sin_c, cos_c = _SINCOS[8 if jnp.dtype(dtype).itemsize >= 8 else 4]
    x = (_unit(b << 2, 30, dtype) - 1.0) * (0.5 * math.pi)
    x2 = x * x
    s = sin_c[-1]
    for c in sin_c[-2::-1]:
        s = s * x2 + c
    s = s * x
    c_ = cos_c[-1]
    for c in cos_c[-2::-1]:
        c_ = c_ * x2 + c
    q = b >> 30
    swap = (q & _U32(1)) == 1
    cos_t = jnp.where(swap, s, c_)
    sin_t = jnp.where(swap, c_, s)
    cos_t = jnp.where((q == 1) | (q == 2), -cos_t, cos_t)
    sin_t = jnp.where(q >= 2, -sin_t, sin_t)
    return cos_t, sin_t


def _box_muller(a, b, dtype):
    """Two independent standard normals from two 32-bit words (Box and Muller 1958). The
    radius uses ``u = 2 - (1 + a / 2^32)`` in ``(0, 1]`` (32 bits in float64, 23 in float32),
    so the tails are cut at 6.66 sigma (float64) or 5.65 sigma (float32)."""
    u1 = 2.0 - _unit(a, 32, dtype)
    r = jnp.sqrt(-2.0 * jnp.log(u1))
    cos_t, sin_t = _sincos_quarter(b, dtype)
    return r * cos_t, r * sin_t


def _normals(seed, stream: int, n: int, d: int, dtype):
    """Normals ``0 .. n-1`` of a stream, ``(n, d)``; normals ``2p`` and ``2p + 1`` are the
    Box-Muller pair of hash ``(stream, p, channel)``."""
    pairs = (n + 1) // 2
    a, b = _hash_pair(seed, stream, jnp.arange(pairs, dtype=_U32)[:, None],
                      jnp.arange(d, dtype=_U32)[None])
    z0, z1 = _box_muller(a, b, dtype)
    return jnp.stack([z0, z1], axis=1).reshape(2 * pairs, d)[:n]


def _normal_at(seed, stream: int, index, d: int, dtype):
    """Normal ``index`` of a stream for every channel, ``(d,)`` (``index`` may be traced)."""
    index = jnp.asarray(index).astype(_U32)
    a, b = _hash_pair(seed, stream, index >> 1, jnp.arange(d, dtype=_U32))
    z0, z1 = _box_muller(a, b, dtype)
    return jnp.where((index & _U32(1)) == 0, z0, z1)


def normal_pair(seed, node, channel, dtype):
    """The Box-Muller pair of ``(node, channel)`` in stream 0 (for statistical checks)."""
    return _box_muller(*_hash_pair(seed, 0, node, channel), dtype)


def _split(dw, h, length, z1, z2):
    """Left half ``(dW_1, H_1)`` and right half ``(dW_2, H_2)`` of an interval of
    ``length`` with increment ``dw`` and area ``h``, given two standard normals.

    Conditional law of the left half (unit length): mean ``(dW/2 + 3H/2, H/4)``, covariance
    ``[[1/16, -1/32], [-1/32, 7/192]]``, whose Cholesky factor is
    ``[[1/4, 0], [-1/8, 1/sqrt(48)]]``. ``z2 = None``: the increments only.
    """
    s = jnp.sqrt(length)
    dw1 = 0.5 * dw + 1.5 * h + s * (0.25 * z1)
    dw2 = dw - dw1
    if z2 is None:
        return dw1, None, dw2, None
    h1 = 0.25 * h + s * (-0.125 * z1 + z2 / math.sqrt(48.0))
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


def split_keys(key: jax.Array, n: int) -> jax.Array:
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


def _bridge_streams(levels: int, area: bool) -> tuple[int, ...]:
    base = _BRIDGE + 4 * levels
    return (base + 1, base + 2) if area else (base,)


def _build(seed, t0, t1, levels: int, d: int, dtype, area: bool, bridge: bool):
    """Node values ``W`` (``2^levels + 1``, ``d`` channels); with ``area``, leaf areas ``H``
    and node time integrals ``I(t) = int_{t0}^t W``; with ``bridge``, the bridge normals of
    every leaf (else they are hashed when a query needs them)."""
    span = (t1 - t0).astype(dtype)
    z = _normals(seed, _ROOT, 2, d, dtype)
    dw, h = jnp.sqrt(span) * z[:1], jnp.sqrt(span / 12.0) * z[1:]
    for j in range(levels):
        n = 2 ** j
        z1 = _normals(seed, 1 + 2 * j, n, d, dtype)
        z2 = _normals(seed, 2 + 2 * j, n, d, dtype) if area or j < levels - 1 else None
        dw1, h1, dw2, h2 = _split(dw, h, span / n, z1, z2)
        dw = jnp.stack([dw1, dw2], axis=1).reshape(2 * n, d)
        h = None if h1 is None else jnp.stack([h1, h2], axis=1).reshape(2 * n, d)
    zero = jnp.zeros((1, d), dtype)
    # associative_scan: the same additions in the same order with or without vmap (XLA's
    # cumsum may block a batched array differently), so the path is bit-identical
    w = jnp.concatenate([zero, lax.associative_scan(jnp.add, dw, axis=0)])
    integral = None
    if area:
        leaf = span / 2 ** levels
        integral = jnp.concatenate([zero, lax.associative_scan(
            jnp.add, leaf * (w[:-1] + h + 0.5 * dw), axis=0)])
    else:
        h = None
    zb = None
    if bridge:
        zb = tuple(_normals(seed, s, 2 ** levels, d, dtype)
                   for s in _bridge_streams(levels, area))
    return w, h, integral, zb


_build_jit = jax.jit(_build, static_argnums=(3, 4, 5, 6, 7))


def _init_tree(path, key, t0, t1, shape, levels, max_levels: int, area, dtype) -> None:
    """The fields a tree path (built or virtual) shares, with its arguments checked."""
    if not isinstance(levels, int | np.integer) or not 0 <= levels <= max_levels:
        raise ValueError(f"levels must be an integer in [0, {max_levels}], got {levels!r}")
    path.shape = tuple(int(n) for n in shape) if isinstance(shape, tuple | list) else (
        (int(shape),))
    path.dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
    path.levels, path.area = int(levels), bool(area)
    path.t0 = jnp.asarray(t0, path.dtype)
    path.t1 = jnp.asarray(t1, path.dtype)
    path.seed = _seed(key)


class BrownianPath:
    """A Brownian motion ``W`` on ``[t0, t1]`` with ``W(t0) = 0``, a function of ``key``
    and the interval: the same key gives the same values at the dyadic times
    ``t0 + j (t1 - t0) / 2^k`` whatever ``dt``, ``levels`` or ``area``.

    Args:
        key: A JAX PRNG key.
        t0, t1: The interval (``t1 > t0``).
        shape: Shape of ``W(t)`` (independent components).
        dt: The step the path is queried at: the tree is built ``levels_for(t0, t1, dt)``
            deep, so a solve with this ``dt`` sees exactly this path.
        levels: The tree depth instead of ``dt`` (at most 24).
        area: Also carry the space-time Lévy areas, for :meth:`time_integral` (the path
            :class:`SRA1` sees; off the dyadic times its values differ from
            ``area=False``, which samples the bridge given the increments only).
        dtype: Floating dtype (default: JAX's default float).
        precompute: Draw the bridge normals of every leaf when building (for many queries
            off the dyadic times, e.g. a solve whose ``dt`` does not divide ``t1 - t0`` in
            a power of two); else each such query hashes its own. Same values either way.

    Methods: :meth:`evaluate` (``W(t)``), :meth:`increment`, :meth:`time_integral`
    (``int_{t0}^t W(s) ds``). A pytree: ``jax.vmap`` a function that builds one over keys.
    """

    def __init__(self, key: jax.Array, t0: float | jax.Array, t1: float | jax.Array,
                 shape: tuple[int, ...] = (), *, dt: float | jax.Array | None = None,
                 levels: int | None = None, area: bool = False, dtype: Any = None,
                 precompute: bool = False) -> None:
        if levels is None:
            if dt is None:
                raise ValueError("BrownianPath needs dt (the step it is queried at) or levels")
            levels = levels_for(t0, t1, dt)
        _init_tree(self, key, t0, t1, shape, levels, 24, area, dtype)
        shape, dtype = self.shape, self.dtype
        d = int(np.prod(shape)) if shape else 1
        self.w, self.h, self.i, self.zb = _build_jit(self.seed, self.t0, self.t1, self.levels,
                                                     d, dtype, self.area, bool(precompute))

    # -- evaluation (pure JAX; t may be traced)
    def _flat_at(self, t, need_integral: bool):
        """``(W(t), I(t))`` flat, ``(d,)`` each (``I`` is ``None`` unless asked for)."""
        if need_integral and not self.area:
            raise ValueError("this BrownianPath was built without area=True: it has no "
                             "time integral")
        n_leaf = 2 ** self.levels
        d = self.w.shape[-1]
        t = lax.stop_gradient(jnp.asarray(t, self.dtype))  # the path is data: no d/dt
        leaf_len = (self.t1 - self.t0) / n_leaf
        u = jnp.clip((t - self.t0) / leaf_len, 0.0, float(n_leaf))
        nearest = jnp.round(u)
        tol = 8 * jnp.finfo(self.dtype).eps * (1.0 + u)
        on_node = jnp.abs(u - nearest) <= tol
        k = jnp.clip(jnp.floor(u), 0, n_leaf - 1).astype(jnp.int32)
        r = jnp.where(on_node, 0.5, u - k.astype(u.dtype))

        def at(x, i):
            return lax.dynamic_index_in_dim(x, i, axis=-2, keepdims=False)

        streams = _bridge_streams(self.levels, self.area)
        zs = [at(zb, k) for zb in self.zb] if self.zb is not None else [
            _normal_at(self.seed, s, k, d, self.dtype) for s in streams]
        wa, wb = at(self.w, k), at(self.w, k + 1)
        w_node = at(self.w, nearest.astype(jnp.int32))
        if not self.area:  # the Brownian bridge given the leaf's increment
            w = wa + r * (wb - wa) + jnp.sqrt(r * (1.0 - r) * leaf_len) * zs[0]
            return jnp.where(on_node, w_node, w), None
        dw1, h1 = _split_at(wb - wa, at(self.h, k), leaf_len, r, zs[0], zs[1])
        w = jnp.where(on_node, w_node, wa + dw1)
        if not need_integral:
            return w, None
        i = at(self.i, k) + r * leaf_len * (wa + h1 + 0.5 * dw1)
        return w, jnp.where(on_node, at(self.i, nearest.astype(jnp.int32)), i)

    def _shape_out(self, x):
        return x.reshape(x.shape[:-1] + self.shape)

    # -- the stepping interface of the SDE methods (simlib/_solver/_sde.py)
    def _start(self, t, need_area: bool):
        """The state a solve carries: ``(W(t), I(t))``, flat."""
        return self._flat_at(t, need_area)

    def _step(self, t, h, state, need_area: bool):
        """``(dW, dZ, state1)`` over ``[t, t + h]``, ``dZ = int_t^{t+h} (W_s - W_t) ds``
        (``None`` unless ``need_area``)."""
        w0, i0 = state
        w1, i1 = self._flat_at(t + h, need_area)
        dz = None if i0 is None else i1 - i0 - h.astype(w0.dtype) * w0
        return w1 - w0, dz, (w1, i1)

    def evaluate(self, t) -> jax.Array:
        """``W(t) - W(t0)``, shaped ``shape``."""
        return self._shape_out(self._flat_at(t, False)[0])

    def increment(self, s, t) -> jax.Array:
        """``W(t) - W(s)``."""
        return self.evaluate(t) - self.evaluate(s)

    def time_integral(self, t) -> jax.Array:
        """``int_{t0}^t (W(s) - W(t0)) ds`` (a path built with ``area=True``)."""
        return self._shape_out(self._flat_at(t, True)[1])

    def __repr__(self) -> str:
        return (f"BrownianPath(shape={self.shape}, levels={self.levels}, area={self.area}, "
                f"dtype={self.dtype})")


def _flatten(p):
    return (p.t0, p.t1, p.seed, p.w, p.h, p.i, p.zb), (p.shape, p.levels, p.dtype, p.area)


def _unflatten(aux, leaves):
    p = object.__new__(BrownianPath)
    p.shape, p.levels, p.dtype, p.area = aux
    p.t0, p.t1, p.seed, p.w, p.h, p.i, p.zb = leaves
    return p


jax.tree_util.register_pytree_node(BrownianPath, _flatten, _unflatten)


class VirtualBrownianPath:
    """The :class:`BrownianPath` of the same key, evaluated without building the tree: a
    query at ``t`` descends from the root to the leaf holding ``t``, drawing the two normals
    of each node on the way (``2 levels`` normals a query), then samples the leaf's bridge
    as :class:`BrownianPath` does. Equal to ``BrownianPath(key, t0, t1, shape,
    levels=levels, area=area)`` to rounding, at any ``t``; memory independent of
    ``levels``. Built by an adaptive SDE solve (``rtol``/``atol``), whose steps fall
    anywhere: ``levels`` (default 20) sets the resolution ``(t1 - t0) / 2^levels`` below
    which two query times share one leaf's bridge sample.
    """

    def __init__(self, key, t0, t1, shape: tuple[int, ...] = (), *, levels: int = 20,
                 area: bool = False, dtype: Any = None):
        _init_tree(self, key, t0, t1, shape, levels, 30, area, dtype)

    def _flat_at(self, t, need_integral: bool):
        if need_integral:
            raise ValueError("VirtualBrownianPath has no time integral (an adaptive SDE "
                             "method does not use it)")
        levels, dtype = self.levels, self.dtype
        d = int(np.prod(self.shape)) if self.shape else 1
        n_leaf = 2 ** levels
        span = self.t1 - self.t0
        t = lax.stop_gradient(jnp.asarray(t, dtype))  # the path is data: no d/dt
        u = jnp.clip((t - self.t0) / (span / n_leaf), 0.0, float(n_leaf))
        nearest = jnp.round(u)
        on_node = jnp.abs(u - nearest) <= 8 * jnp.finfo(dtype).eps * (1.0 + u)
        k = jnp.clip(jnp.floor(u), 0, n_leaf - 1).astype(jnp.uint32)
        z = _normals(self.seed, _ROOT, 2, d, dtype)
        dw, h = jnp.sqrt(span) * z[0], jnp.sqrt(span / 12.0) * z[1]
        def level(j, carry):  # the node of level j holding leaf k, then its child
            w_left, dw, h = carry
            j = j.astype(_U32)
            node = k >> (_U32(levels) - j)
            z1 = _normal_at(self.seed, 1 + 2 * j, node, d, dtype)
            # (the tree draws no z2 at its last level without areas; the area drawn here
            # then is never used, and the increments do not depend on it)
            z2 = _normal_at(self.seed, 2 + 2 * j, node, d, dtype)
            dw1, h1, dw2, h2 = _split(dw, h, span / (2.0 ** j.astype(dtype)), z1, z2)
            right = ((k >> (_U32(levels) - _U32(1) - j)) & _U32(1)) == 1
            return (jnp.where(right, w_left + dw1, w_left), jnp.where(right, dw2, dw1),
                    jnp.where(right, h2, h1))

        w_left, dw, h = lax.fori_loop(0, levels, level, (jnp.zeros((d,), dtype), dw, h))
        leaf_len = span / n_leaf
        r = jnp.where(on_node, 0.5, u - k.astype(dtype))
        at_node = jnp.where(nearest.astype(jnp.uint32) > k, w_left + dw, w_left)
        streams = _bridge_streams(levels, self.area)
        zs = [_normal_at(self.seed, s_, k, d, dtype) for s_ in streams]
        if not self.area:
            w = w_left + r * dw + jnp.sqrt(r * (1.0 - r) * leaf_len) * zs[0]
        else:
            w = w_left + _split_at(dw, h, leaf_len, r, zs[0], zs[1])[0]
        return jnp.where(on_node, at_node, w), None

    def evaluate(self, t) -> jax.Array:
        """``W(t) - W(t0)``, shaped ``shape``."""
        w = self._flat_at(t, False)[0]
        return w.reshape(w.shape[:-1] + self.shape)

    _start = BrownianPath._start
    _step = BrownianPath._step

    def __repr__(self) -> str:
        return (f"VirtualBrownianPath(shape={self.shape}, levels={self.levels}, "
                f"area={self.area}, dtype={self.dtype})")


jax.tree_util.register_pytree_node(
    VirtualBrownianPath, lambda p: ((p.t0, p.t1, p.seed), (p.shape, p.levels, p.dtype, p.area)),
    lambda aux, leaves: _unflatten_virtual(aux, leaves))


def _unflatten_virtual(aux, leaves):
    p = object.__new__(VirtualBrownianPath)
    p.shape, p.levels, p.dtype, p.area = aux
    p.t0, p.t1, p.seed = leaves
    return p


class BrownianSteps:
    """Brownian increments drawn step by step: the increment over the solver's ``n``-th
    step ``[t, t + h]`` is ``sqrt(h) z_n`` (and, for methods that need it, the step's
    space-time Lévy area ``sqrt(h/12) z'_n``), with ``z_n, z'_n`` the Box-Muller pair hashed
    from ``(key, n, channel)``.

    One normal per step and channel, no tree and no lookups: the fastest source, for
    ensembles and statistics. What it guarantees: the same key and the same step sequence
    (``t0``, ``t1``, ``dt``, ``saveat``) give bit-identical paths across calls, ``jit`` and
    ``vmap``; different keys independent paths. What it does not: the path is a function of
    the step sequence, so a solve with another ``dt`` sees an unrelated Brownian motion
    (no convergence in ``dt`` on one path; use the default tree, :class:`BrownianPath`,
    for that). The analogue of diffrax's ``UnsafeBrownianPath``, but reproducible.

    Built by ``solve(..., brownian="steps")``; its state in a solve is the step counter.
    """

    def __init__(self, key, shape: tuple[int, ...] = (), *, dtype: Any = None):
        shape = tuple(int(n) for n in shape) if isinstance(shape, tuple | list) else (
            (int(shape),))
        self.shape = shape
        self.dtype = jnp.dtype(dtype) if dtype is not None else jnp.result_type(float)
        self.seed = _seed(key)

    def _start(self, t, need_area: bool):
        return jnp.zeros((), _U32)

    def _step(self, t, h, state, need_area: bool):
        d = int(np.prod(self.shape)) if self.shape else 1
        a, b = _hash_pair(self.seed, _STEPS, state, jnp.arange(d, dtype=_U32))
        z0, z1 = _box_muller(a, b, self.dtype)
        h = jnp.asarray(h).astype(self.dtype)
        sq = jnp.sqrt(h)
        dw = sq * z0
        dz = None
        if need_area:  # int (W_s - W_t) ds = h (dW / 2 + H), H ~ N(0, h / 12)
            dz = h * (0.5 * dw + sq * (z1 / math.sqrt(12.0)))
        return dw, dz, state + _U32(1)

    def __repr__(self) -> str:
        return f"BrownianSteps(shape={self.shape}, dtype={self.dtype})"


jax.tree_util.register_pytree_node(
    BrownianSteps, lambda p: ((p.seed,), (p.shape, p.dtype)),
    lambda aux, leaves: _unflatten_steps(aux, leaves))


def _unflatten_steps(aux, leaves):
    p = object.__new__(BrownianSteps)
    p.shape, p.dtype = aux
    (p.seed,) = leaves
    return p
