"""The native linear-algebra kernels (``native/linalg.cc``) and their JAX wrappers.

Built and loaded like every simlib native library (:mod:`simlib._native`); ``load()``
returns ``None`` (with a warning) where they cannot be built, and the callers then use
their pure-JAX or host paths. Every FFI call takes a leading batch (``vmap`` passes the
whole batch to one call, ``vmap_method="expand_dims"``: unbatched operands such as the
pattern keep a batch of one, and factors shared by a batch of right-hand sides are not
copied); the kernels loop over it.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._native import NativeLibrary

_LIBRARY = NativeLibrary(
    Path(__file__).parent / "native",
    sources=("linalg.cc",),
    targets=tuple(f"simlib_{k}_{d}" for k in ("band_lu", "band_solve", "sparse_lu",
                                               "sparse_lu_masked", "sparse_solve")
                  for d in ("f32", "f64")),
    library="libsimlib_linalg.so",
)


def load():
    """The loaded library (FFI targets registered) or ``None``."""
    return _LIBRARY.load()


def unavailable_reason() -> str | None:
    return _LIBRARY.unavailable_reason()


def _require():
    if load() is None:
        raise RuntimeError(f"native linear-algebra kernels unavailable: {unavailable_reason()}")


def _suffix(dtype) -> str:
    _require()
    dtype = jnp.dtype(dtype)
    if dtype == jnp.float64:
        return "f64"
    if dtype == jnp.float32:
        return "f32"
    raise TypeError(f"native linear algebra supports float32 and float64, not {dtype}")


def band_lu_native(band, lower: int, upper: int):
    """:func:`simlib._linalg._banded.band_lu_scan` in C++: the factors ``(u, mult, pivot)``
    of a ``BandLU``, as a plain tuple (``_banded`` wraps them)."""
    n, w = band.shape[-2:]
    call = jax.ffi.ffi_call(
        f"simlib_band_lu_{_suffix(band.dtype)}",
        (jax.ShapeDtypeStruct(band.shape, band.dtype),
         jax.ShapeDtypeStruct((*band.shape[:-2], n, lower), band.dtype),
         jax.ShapeDtypeStruct((*band.shape[:-2], n), jnp.int32)),
        vmap_method="expand_dims")
    u, mult, piv = call(band, jnp.asarray([lower], jnp.int32))
    return u, mult, piv


def band_solve_native(lu, b, transpose: bool):
    """:func:`simlib._linalg._banded.band_lu_solve_scan` in C++."""
    u, mult, piv = lu
    lower = mult.shape[-1]
    b = b.astype(u.dtype)
    call = jax.ffi.ffi_call(f"simlib_band_solve_{_suffix(u.dtype)}",
                            jax.ShapeDtypeStruct(b.shape, b.dtype),
                            vmap_method="expand_dims")
    return call(u, mult, piv, b, jnp.asarray([lower, int(transpose)], jnp.int32))


def _unbatched(x, batched: bool):
    """A pattern operand (``fp``, ``fi``, ``diag``, flags) without its batch axis.

    These come from the host (the symbolic factorisation of a static pattern), so every
    member of a batch holds the same copy: a batch axis on them only appears when a
    transformation broadcasts them (``vmap`` of a ``lax.cond`` with a batched predicate
    turns it into a ``select`` over both branches, broadcasting every operand), and the
    kernels take one pattern with a batch of values."""
    return x[0] if batched else x


def _sparse_lu_call(values, fp, fi, diag):
    call = jax.ffi.ffi_call(
        f"simlib_sparse_lu_{_suffix(values.dtype)}",
        (jax.ShapeDtypeStruct(values.shape, values.dtype),
         jax.ShapeDtypeStruct(values.shape[:-1], jnp.int32)),
        vmap_method="expand_dims")
    return call(values, fp, fi, diag)


@jax.custom_batching.custom_vmap
def sparse_lu_native(values, fp, fi, diag):
    """LU (no pivoting) of the matrix with ``values`` on the closed pattern ``(fp, fi)``:
    ``(lu values, info)``, ``info = 0`` or one plus the first row with a zero pivot.
    ``values`` may carry leading batch axes (and ``vmap`` adds one); the pattern is
    shared by the batch."""
    return _sparse_lu_call(values, fp, fi, diag)


@sparse_lu_native.def_vmap
def _sparse_lu_vmap(axis_size, in_batched, values, fp, fi, diag):
    values_b, *pattern_b = in_batched
    fp, fi, diag = (_unbatched(x, b) for x, b in zip((fp, fi, diag), pattern_b, strict=True))
    # through the custom_vmap function again, so that an enclosing vmap is handled alike
    out = sparse_lu_native(values, fp, fi, diag)
    return out, (values_b, values_b)


def _sparse_lu_masked_call(mask, values, old, position, fp, fi, diag):
    call = jax.ffi.ffi_call(
        f"simlib_sparse_lu_masked_{_suffix(old.dtype)}",
        (jax.ShapeDtypeStruct(old.shape, old.dtype),
         jax.ShapeDtypeStruct(old.shape[:-1], jnp.int32)),
        vmap_method="expand_dims", input_output_aliases={1: 0})
    return call(values, old, mask.astype(jnp.int32), position, fp, fi, diag)


@jax.custom_batching.custom_vmap
def _sparse_lu_masked(mask, values, old, position, fp, fi, diag):
    # at the top level: nothing to do unless some member (of leading axes) asks
    return lax.cond(jnp.any(mask),
                    lambda: _sparse_lu_masked_call(mask, values, old, position, fp, fi, diag),
                    lambda: (old, jnp.zeros(mask.shape, jnp.int32)))


@_sparse_lu_masked.def_vmap
def _sparse_lu_masked_vmap(axis_size, in_batched, mask, values, old, position, fp, fi, diag):
    *member_b, position_b, fp_b, fi_b, diag_b = in_batched
    position, fp, fi, diag = (_unbatched(x, b) for x, b in
                              zip((position, fp, fi, diag), (position_b, fp_b, fi_b, diag_b),
                                  strict=True))
    mask, values, old = (x if b else jnp.broadcast_to(x, (axis_size, *x.shape))
                         for x, b in zip((mask, values, old), member_b, strict=True))
    return _sparse_lu_masked(mask, values, old, position, fp, fi, diag), (True, True)


def sparse_lu_masked(mask, values, old, position, fp, fi, diag):
    """:func:`sparse_lu_native` member by member: where ``mask``, the factors of the
    matrix with ``values`` on ``A``'s pattern (scattered into the closed pattern's slots
    ``position`` by the kernel); elsewhere ``old``, untouched (the output is aliased to
    it). Under ``vmap`` the batched ``mask`` goes into one kernel call, so that only the
    members that ask are factorised (where ``vmap`` of a ``lax.cond`` factorises them all),
    and the call is skipped when none asks. ``info`` is ``0`` for a kept member.
    Operands carry no derivatives (the caller cuts them)."""
    mask = jnp.broadcast_to(jnp.asarray(mask, bool), old.shape[:-1])
    return _sparse_lu_masked(mask, values.astype(old.dtype), old, position, fp, fi, diag)


def sparse_lu_count() -> int:
    """Member factorisations done by the native sparse LU kernels in this process (a
    counter kept by the library, for tests of what a batch factorises)."""
    _require()
    f = load().simlib_sparse_lu_count
    f.restype = ctypes.c_int64
    return int(f())


def _sparse_solve_call(lu, fp, fi, diag, b, flags):
    call = jax.ffi.ffi_call(f"simlib_sparse_solve_{_suffix(lu.dtype)}",
                            jax.ShapeDtypeStruct(b.shape, b.dtype),
                            vmap_method="expand_dims")
    return call(lu, fp, fi, diag, b, flags)


@jax.custom_batching.custom_vmap
def _sparse_solve(lu, fp, fi, diag, b, flags):
    return _sparse_solve_call(lu, fp, fi, diag, b, flags)


@_sparse_solve.def_vmap
def _sparse_solve_vmap(axis_size, in_batched, lu, fp, fi, diag, b, flags):
    lu_b, fp_b, fi_b, diag_b, b_b, flags_b = in_batched
    fp, fi, diag, flags = (_unbatched(x, f) for x, f in
                           zip((fp, fi, diag, flags), (fp_b, fi_b, diag_b, flags_b),
                               strict=True))
    # The kernel takes factors with b's leading axes, or without any (shared by every
    # right-hand side). Keep to that: b gets this axis when lu has it, and factors with
    # leading axes of their own get b's (a copy, under nested vmaps only).
    if lu_b and not b_b:
        b = jnp.broadcast_to(b, (axis_size, *b.shape))
    lead = b.shape[:-1]
    if lu.ndim > 1 and lu.shape[:-1] != lead:
        if lu_b:  # (axis, nnz) against (axis, *inner)
            lu = lu.reshape((axis_size,) + (1,) * (len(lead) - 1) + lu.shape[-1:])
        lu = jnp.broadcast_to(lu, lead + lu.shape[-1:])
    return _sparse_solve(lu, fp, fi, diag, b, flags), lu_b or b_b


def sparse_solve_native(lu, fp, fi, diag, b, transpose: bool):
    """``A^-1 b`` (``A^-T b``) from :func:`sparse_lu_native`'s factors (``b`` and ``lu``
    with the same leading batch axes, or ``lu`` unbatched: shared by every ``b``)."""
    b = b.astype(lu.dtype)
    return _sparse_solve(lu, fp, fi, diag, b, jnp.asarray([int(transpose)], jnp.int32))


def symbolic_fill(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The LU fill pattern (CSR) of a matrix with the symmetric pattern ``(indptr,
    indices)`` (both triangles and the diagonal), by the elimination tree (C++)."""
    _require()
    lib = load()
    n = indptr.size - 1
    sp_ = np.ascontiguousarray(indptr, np.int64)
    si = np.ascontiguousarray(indices, np.int64)
    fp = np.zeros(n + 1, np.int64)
    ptr = ctypes.POINTER(ctypes.c_int64)
    for f in (lib.simlib_symbolic_count, lib.simlib_symbolic_fill):
        f.restype = ctypes.c_int64
    nnz = lib.simlib_symbolic_count(ctypes.c_int64(n), sp_.ctypes.data_as(ptr),
                                    si.ctypes.data_as(ptr), fp.ctypes.data_as(ptr))
    if nnz < 0:
        raise ValueError("symbolic factorisation: bad pattern")
    fi = np.zeros(nnz, np.int64)
    lib.simlib_symbolic_fill(ctypes.c_int64(n), sp_.ctypes.data_as(ptr), si.ctypes.data_as(ptr),
                             fp.ctypes.data_as(ptr), fi.ctypes.data_as(ptr))
    return fp, fi


def nested_dissection(indptr: np.ndarray, indices: np.ndarray, leaf: int) -> np.ndarray:
    """A nested-dissection ordering (new index -> old) of the graph with the symmetric
    pattern ``(indptr, indices)``: separators from level structures (C++, ``linalg.cc``)."""
    _require()
    lib = load()
    n = indptr.size - 1
    sp_ = np.ascontiguousarray(indptr, np.int64)
    si = np.ascontiguousarray(indices, np.int64)
    order = np.zeros(n, np.int64)
    ptr = ctypes.POINTER(ctypes.c_int64)
    f = lib.simlib_nested_dissection
    f.restype = ctypes.c_int64
    if f(ctypes.c_int64(n), sp_.ctypes.data_as(ptr), si.ctypes.data_as(ptr),
         ctypes.c_int64(leaf), order.ctypes.data_as(ptr)) < 0:
        raise ValueError("nested dissection: bad pattern")
    return order
