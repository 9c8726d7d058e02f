"""Banded Jacobians: ``lower + upper + 1`` JVPs and a banded LU with partial pivoting.

A Jacobian with ``J_ij = 0`` for ``j < i - lower`` or ``j > i + upper`` (1-D PDEs on a
grid, chains, ladders) is stored by rows, ``R[i, j] = J[i, i - lower + j]`` for
``j = 0 .. lower + upper``, and found from ``w = lower + upper + 1`` forward-mode products:
the columns ``col = k (mod w)`` never share a row, so the seed
``e_k = sum_{col = k mod w} e_col`` gives them all at once (Curtis, Powell and Reid,
J. Inst. Math. Appl. 13, 1974, 117-119).

The LU is Gaussian elimination with partial pivoting restricted to the band, as LAPACK's
``gbtrf`` does it: the pivot of column ``k`` is sought in rows ``k .. k + lower``, so the
upper band of ``U`` grows to ``lower + upper`` (Golub and Van Loan, *Matrix
Computations*, 4th ed., 2013, 4.3.5). Two kernels give the same factorisation:

- a ``lax.scan`` over the columns carrying the ``(lower + 1) x w`` active window (pure
  JAX: the reference, and the fallback without a compiler);
- a C++ loop through ``jax.ffi`` (``simlib/_linalg/native/banded.cc``), used when the
  native library loads (see ``simlib/_native.py``).

Memory ``O(n (2 lower + upper))``, work ``O(n lower (lower + upper))`` per factorisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._static import register_static
from . import _kernels
from ._base import Array, Field, LinearSolver


def band_seeds(n: int, lower: int, upper: int, dtype) -> Array:
    """The ``(w, n)`` 0/1 seeds: ``seeds[k, col] = 1`` where ``col = k (mod w)``."""
    w = lower + upper + 1
    return jnp.asarray(np.arange(w)[:, None] == (np.arange(n) % w)[None, :], dtype)


def band_from_compressed(compressed: Array, lower: int, upper: int) -> Array:
    """``R[i, j] = J[i, i - lower + j]`` from ``compressed[:, k] = J @ seed_k``."""
    n = compressed.shape[0]
    w = lower + upper + 1
    col = np.arange(n)[:, None] - lower + np.arange(w)[None, :]
    inside = (col >= 0) & (col < n)
    picked = jnp.take_along_axis(compressed, jnp.asarray(col % w), axis=1)
    return jnp.where(jnp.asarray(inside), picked, 0.0)


def band_matvec(band: Array, x: Array, lower: int, transpose: bool = False) -> Array:
    """``B x`` (``B^T x``) for ``B`` stored by rows (``band[i, j] = B[i, i - lower + j]``)."""
    n, w = band.shape
    col = np.arange(n)[:, None] - lower + np.arange(w)[None, :]
    inside = jnp.asarray((col >= 0) & (col < n))
    idx = jnp.asarray(np.clip(col, 0, n - 1))
    vals = jnp.where(inside, band, 0.0)
    if not transpose:
        return jnp.sum(vals * x[idx], axis=1)
    return jnp.zeros((n,), jnp.result_type(band, x)).at[idx].add(vals * x[:, None])


def mask_band(band: Array, lower: int) -> Array:
    """``band`` with the slots of columns outside ``0 .. n-1`` set to zero."""
    n, w = band.shape
    col = np.arange(n)[:, None] - lower + np.arange(w)[None, :]
    return jnp.where(jnp.asarray((col >= 0) & (col < n)), band, 0.0)


def dense_from_band(band, lower: int) -> np.ndarray:
    """The ``(n, n)`` matrix of a band stored by rows (for tests and small checks)."""
    band = np.asarray(band)
    n, w = band.shape
    out = np.zeros((n, n), band.dtype)
    for j in range(w):
        rows = np.arange(n)
        cols = rows - lower + j
        ok = (cols >= 0) & (cols < n)
        out[rows[ok], cols[ok]] = band[ok, j]
    return out


class BandLU(NamedTuple):
    """``L_{n-1}^-1 P_{n-1} ... L_0^-1 P_0 A = U`` as ``gbtrf`` leaves it.

    Attributes:
        u: ``(n, lower + upper + 1)``, ``u[k, j] = U[k, k + j]``.
        mult: ``(n, lower)``, the multipliers of column ``k`` for rows ``k+1 .. k+lower``.
        pivot: ``(n,)`` int32, the row ``k + pivot[k]`` swapped with row ``k``.
    """

    u: Array
    mult: Array
    pivot: Array


def _window0(band: Array, lower: int, upper: int) -> Array:
    """The active window before column 0: rows ``0 .. lower``, columns ``0 .. lower+upper``
    of ``A`` (zero rows past ``n``)."""
    n, _ = band.shape
    w = lower + upper + 1
    r = np.arange(lower + 1)[:, None]
    j = np.arange(w)[None, :]
    src = j - r + lower  # A[r, j] = band[r, j - r + lower]
    ok = (src >= 0) & (src < w) & (r < n) & (j < n)
    vals = band[np.clip(r, 0, n - 1), np.clip(src, 0, w - 1)]
    return jnp.where(jnp.asarray(ok), vals, 0.0)


def band_lu_scan(band: Array, lower: int, upper: int) -> BandLU:
    """Banded LU with partial pivoting of ``A`` (stored by rows with ``lower``, ``upper``)
    as one ``lax.scan`` over columns (pure JAX).

    The carry is the active window ``W[r, j] = A[k + r, k + j]`` (``r <= lower``,
    ``j < lower + upper + 1``, after the eliminations of columns ``< k``). Column ``k``:
    pivot ``p = argmax |W[:, 0]|``, swap rows ``0`` and ``p``, ``U[k] = W[0]``,
    ``m = W[1:, 0] / W[0, 0]``, ``W[1:] -= m W[0]``; then the window moves one down and
    right, taking in row ``k + lower + 1`` of the band.
    """
    n, w = band.shape
    dtype = band.dtype
    band = mask_band(band, lower)
    # rows k + lower + 1 entering at step k: band rows lower+1 .. n-1, then zero rows
    incoming = jnp.concatenate([band[lower + 1:], jnp.zeros((lower + 1, w), dtype)])[:n]

    def step(win, row_in):
        p = jnp.argmax(jnp.abs(win[:, 0]))
        top = win[p]
        win = win.at[p].set(win[0]).at[0].set(top)
        piv = top[0]
        m = win[1:, 0] / jnp.where(piv == 0, 1.0, piv)
        rest = win[1:] - m[:, None] * top[None, :]
        nxt = jnp.concatenate([rest[:, 1:], jnp.zeros((lower, 1), dtype)], axis=1)
        nxt = jnp.concatenate([nxt, row_in[None, :]], axis=0)
        return nxt, (top, m, p.astype(jnp.int32))

    _, (u, mult, pivot) = lax.scan(step, _window0(band, lower, upper), incoming)
    return BandLU(u, mult, pivot)


def band_lu_solve_scan(lu: BandLU, b: Array, transpose: bool = False) -> Array:
    """``A^-1 b`` (``A^-T b``) for a vector ``b`` from :func:`band_lu_scan`'s factors."""
    u, mult, pivot = lu
    n, w = u.shape
    lower = mult.shape[1]
    dtype = jnp.result_type(u, b)
    b = b.astype(dtype)
    if not transpose:
        # forward: interchanges and the multipliers, a window of lower + 1 entries
        incoming = jnp.concatenate([b[lower + 1:], jnp.zeros((lower + 1,), dtype)])[:n]

        def fwd(win, xs):
            m, p, b_in = xs
            top = win[p]
            win = win.at[p].set(win[0]).at[0].set(top)
            rest = win[1:] - m * top
            return jnp.concatenate([rest, b_in[None]]), top

        win0 = jnp.concatenate([b, jnp.zeros((lower + 1,), dtype)])[: lower + 1]
        _, y = lax.scan(fwd, win0, (mult, pivot, incoming))

        # back substitution with U (upper bandwidth w - 1), carrying x[k+1 .. k+w-1]
        def back(nxt, xs):
            urow, yk = xs
            xk = (yk - jnp.dot(urow[1:], nxt)) / urow[0]
            return jnp.concatenate([xk[None], nxt])[: w - 1], xk

        _, x = lax.scan(back, jnp.zeros((w - 1,), dtype), (u, y), reverse=True)
        return x

    # transpose: U^T z = b (forward), then z <- P_k L_k^-T z for k = n-1 .. 0
    ut = _u_columns(u)  # ut[k, j] = U[k - j, k] = u[k - j, j]

    def fwd_t(prev, xs):  # prev = z[k-1], z[k-2], ..., z[k-w+1]
        col, bk = xs
        zk = (bk - jnp.dot(col[1:], prev)) / col[0]
        return jnp.concatenate([zk[None], prev])[: w - 1], zk

    _, z = lax.scan(fwd_t, jnp.zeros((w - 1,), dtype), (ut, b))

    def back_t(win, xs):  # win = z[k+1 .. k+lower] (final except for earlier steps)
        m, p, zk = xs
        zk = zk - jnp.dot(m, win)
        full = jnp.concatenate([zk[None], win])
        a, bb = full[0], full[p]
        full = full.at[0].set(bb).at[p].set(a)
        return full[:lower], full[lower]

    win, tail = lax.scan(back_t, jnp.zeros((lower,), dtype), (mult, pivot, z), reverse=True)
    # tail[k] is x[k + lower] (positions past n are padding)
    return jnp.concatenate([win, tail])[:n]


def _u_columns(u: Array) -> Array:
    """``ut[k, j] = U[k - j, k] = u[k - j, j]`` (zero for ``k < j``): ``U``'s columns."""
    n, w = u.shape
    k = np.arange(n)[:, None]
    j = np.arange(w)[None, :]
    ok = k - j >= 0
    return jnp.where(jnp.asarray(ok), u[np.clip(k - j, 0, n - 1), j], 0.0)


class Banded(LinearSolver):
    """``J`` with ``J_ij = 0`` outside ``-lower <= j - i <= upper``, from
    ``lower + upper + 1`` JVPs, and a banded LU with partial pivoting.

    Args:
        lower, upper: The bandwidths (``jac_bandwidth=(lower, upper)``), non-negative ints.
        kernel: ``"auto"`` (the native kernel when the library loads, else the scan),
            ``"scan"`` (pure JAX) or ``"native"`` (an error if it cannot load).

    A Jacobian entry outside the band is silently dropped by the compression (it lands on
    a column of the same colour): give the true bandwidths.
    """

    def __init__(self, lower: int, upper: int, kernel: str = "auto") -> None:
        for name, value in (("lower", lower), ("upper", upper)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"jac_bandwidth: {name} must be a non-negative int; "
                                 f"got {value!r}")
        if kernel not in ("auto", "scan", "native"):
            raise ValueError(f"kernel must be 'auto', 'scan' or 'native'; got {kernel!r}")
        self.lower = int(lower)
        self.upper = int(upper)
        self.kernel = kernel

    def _native(self):
        if self.kernel == "scan":
            return None
        lib = _kernels.load()
        if lib is None and self.kernel == "native":
            raise RuntimeError(f"native linear-algebra kernels unavailable: "
                               f"{_kernels.unavailable_reason()}")
        return lib

    def materialise(self, linear_map: Callable[[Array], Array], n: int, dtype: Any) -> Any:
        seeds = band_seeds(n, self.lower, self.upper, dtype)
        compressed = jax.vmap(linear_map, out_axes=1)(seeds)
        return band_from_compressed(compressed, self.lower, self.upper)

    def _zero_mass(self, n, dtype):
        return jnp.zeros((n,), dtype)

    def operator(self, jac: Array, c: Array, mass: Any) -> Array:
        """``A = M - c J`` in the band (``mass``: ``None``, an ``(n,)`` diagonal or a band
        of the same shape)."""
        n, _ = jac.shape
        a = -c.astype(jac.dtype) * jac
        if mass is None:
            return a.at[:, self.lower].add(1.0)
        mass = jnp.asarray(mass, jac.dtype)
        if mass.shape == (n,):
            return a.at[:, self.lower].add(mass)
        return a + mass

    def matvec(self, jac: Any, c: Array, mass: Any, x: Array, *, field: Field | None = None,
               transpose: bool = False) -> Array:
        return band_matvec(self.operator(jac, c, mass), x, self.lower, transpose)

    def _factor(self, jac, c, mass):
        a = self.operator(jac, c, mass)
        lib = self._native()
        if lib is not None:
            lu = BandLU(*_kernels.band_lu_native(a, self.lower, self.upper))
        else:
            lu = band_lu_scan(a, self.lower, self.upper)
        d = lu.u[:, 0]
        ok = jnp.all(jnp.isfinite(lu.u)) & jnp.all(d != 0)
        return lu, ok

    def _solve(self, fac, b, transpose, field):
        lib = self._native()
        if lib is not None:
            return _kernels.band_solve_native(fac.data, b, transpose)
        return band_lu_solve_scan(fac.data, b, transpose)


register_static(Banded)
