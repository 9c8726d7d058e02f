"""The native linear-algebra kernels (``native/linalg.cc``) and their JAX wrappers.

Built and loaded like every simlib native library (:mod:`simlib._native`); ``load()``
returns ``None`` (with a warning) where they cannot be built, and the callers then use
their pure-JAX or host paths. Every FFI call takes a leading batch (``vmap`` passes the
whole batch to one call, ``vmap_method="expand_dims"``: unbatched operands such as the
pattern keep a batch of one, and factors shared by a batch of right-hand sides are not
copied); the kernels loop over it. The sparse kernels take their pattern by key, from a
registry in the library (:func:`register_pattern`), not as operands.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
import weakref
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


def native_library() -> NativeLibrary:
    """The linear-algebra kernels' library (not loaded until :meth:`NativeLibrary.load`)."""
    return _LIBRARY


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


class _PatternKeys:
    """The key under which each symbolic factorisation is registered with the library.

    A key is a hash of the pattern's contents (``fp, fi, diag, position``), so equal
    patterns share one entry and the compiled programs that use them agree; it is kept per
    object (weakly: the table does not keep a factorisation alive) and per process, so an
    object unpickled in another process registers again, and a forked child inherits both
    the table and the library's entries."""

    def __init__(self) -> None:
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, sym) -> int:
        with self._lock:
            key = self._keys.get(sym)
        if key is None:
            key = register_pattern(sym.fp, sym.fi, sym.diag, sym.position32)
            with self._lock:
                self._keys[sym] = key
        return key


pattern_key = _PatternKeys()


def register_pattern(fp: np.ndarray, fi: np.ndarray, diag: np.ndarray,
                     position: np.ndarray) -> int:
    """Registers the closed pattern ``(fp, fi)`` (CSR, sorted columns), its diagonal slots
    ``diag`` and ``position`` (``A``'s value ``j`` goes to slot ``position[j]``) with the
    native library, and returns its key: the first 8 bytes of a BLAKE2b hash of the
    contents, as a signed 64-bit integer. The kernels take this key (an FFI attribute)
    instead of the arrays, which therefore never enter a compiled program. The library
    reads the arrays in place: they are kept (made read-only) for the life of the process.
    Registering the same contents again returns the same key; a bad pattern raises
    ``ValueError``."""
    _require()
    arrays = [np.ascontiguousarray(x, np.int32) for x in (fp, fi, diag, position)]
    fp, fi, diag, position = arrays
    n, nnz, na = diag.size, fi.size, position.size
    if fp.size != n + 1:
        raise ValueError(f"sparse pattern: fp has {fp.size} entries, diag {n}")
    digest = hashlib.blake2b(digest_size=8)
    digest.update(np.asarray([n, nnz, na], np.int64).tobytes())
    for x in arrays:
        digest.update(memoryview(x).cast("B"))
    key = int(np.frombuffer(digest.digest(), np.int64)[0])
    with _PINNED_LOCK:
        if key in _PINNED:  # registered: the library holds the first arrays
            arrays = _PINNED[key]
            same = all(np.array_equal(a, b) for a, b in zip(arrays, (fp, fi, diag, position),
                                                            strict=True))
            if not same:
                raise RuntimeError(f"sparse pattern: hash collision on key {key}")
            return key
        status = _register(key, fp, fi, diag, position)
        if status >= 0:
            for x in (fp, fi, diag, position):
                x.flags.writeable = False
            _PINNED[key] = (fp, fi, diag, position)
    if status == -1:
        raise ValueError("sparse pattern: fp, fi, diag or position out of range, or columns "
                         "unsorted, or a diagonal entry missing")
    if status == -2:
        raise RuntimeError(f"sparse pattern: hash collision on key {key}")
    if status < 0:
        raise MemoryError("sparse pattern: registration failed")
    return key


# The arrays of every registered pattern, by key: the library reads them in place (it does
# not copy them), so they live, read-only, as long as the process.
_PINNED: dict[int, tuple[np.ndarray, ...]] = {}
_PINNED_LOCK = threading.Lock()


def registered_patterns_arrays() -> list[tuple[np.ndarray, ...]]:
    """The ``(fp, fi, diag, position)`` of every pattern registered in this process: what
    a stored program's kernels look up by key (``simlib._programs`` stores them with it
    and registers them again before loading it)."""
    with _PINNED_LOCK:
        return list(_PINNED.values())


def _register(key: int, fp, fi, diag, position) -> int:
    n, nnz, na = diag.size, fi.size, position.size
    f = load().simlib_sparse_register
    f.restype = ctypes.c_int64
    ptr = ctypes.POINTER(ctypes.c_int32)
    status = f(ctypes.c_int64(key), ctypes.c_int64(n), ctypes.c_int64(nnz),
               fp.ctypes.data_as(ptr), fi.ctypes.data_as(ptr), diag.ctypes.data_as(ptr),
               ctypes.c_int64(na), position.ctypes.data_as(ptr))
    return int(status)


def pattern_is_closed(key: int) -> bool:
    """Whether the pattern registered under ``key`` is closed under elimination (checked
    by the library at registration: structurally symmetric, its order a perfect
    elimination ordering), so that its LU updates every entry of a row without checking
    that the row holds it. A symbolic fill is; ILU(0)'s pattern usually is not."""
    return bool(_pattern_query("simlib_sparse_pattern_closed", key))


def pattern_chains(key: int) -> int:
    """The number of rows ``k`` of the pattern registered under ``key`` whose strict upper
    part is ``{k + 1}`` and then row ``k + 1``'s (one supernode: the factorisation applies
    such rows to a row in groups of up to 8, in one pass)."""
    return _pattern_query("simlib_sparse_pattern_chains", key)


def pattern_band(key: int) -> tuple[int, int]:
    """The band widths ``(l, u)`` with which the solves of the pattern registered under
    ``key`` take the banded sweeps (a full band of at most 4 each side: the factors of a 1-D
    grid in reverse Cuthill-McKee order), or ``(0, 0)`` (the general sweeps)."""
    code = _pattern_query("simlib_sparse_pattern_band", key)
    return code // 8, code % 8


def _pattern_query(name: str, key: int) -> int:
    """The library function ``name`` (``int64 f(int64 key)``) of the pattern registered
    under ``key``; a negative answer means no such pattern."""
    _require()
    f = getattr(load(), name)
    f.restype = ctypes.c_int64
    status = int(f(ctypes.c_int64(key)))
    if status < 0:
        raise KeyError(f"no sparse pattern registered under key {key}")
    return status


def registered_patterns() -> int:
    """The number of patterns registered with the native library in this process."""
    _require()
    f = load().simlib_sparse_pattern_count
    f.restype = ctypes.c_int64
    return int(f())


def _sparse_lu_call(values, key: int):
    call = jax.ffi.ffi_call(
        f"simlib_sparse_lu_{_suffix(values.dtype)}",
        (jax.ShapeDtypeStruct(values.shape, values.dtype),
         jax.ShapeDtypeStruct(values.shape[:-1], jnp.int32)),
        vmap_method="expand_dims")
    return call(values, pattern=np.int64(key))


def sparse_lu_native(values, key: int):
    """LU (no pivoting) of the matrix with ``values`` on the closed pattern registered
    under ``key`` (:func:`register_pattern`, :data:`pattern_key`): ``(lu values, info)``,
    ``info = 0`` or one plus the first row with a zero pivot. ``values`` may carry leading
    batch axes (and ``vmap`` adds one: the kernel loops over them)."""
    return _sparse_lu_call(values, key)


def _sparse_lu_masked_call(mask, values, old, key):
    call = jax.ffi.ffi_call(
        f"simlib_sparse_lu_masked_{_suffix(old.dtype)}",
        (jax.ShapeDtypeStruct(old.shape, old.dtype),
         jax.ShapeDtypeStruct(old.shape[:-1], jnp.int32)),
        vmap_method="expand_dims", input_output_aliases={1: 0})
    return call(values, old, mask.astype(jnp.int32), pattern=np.int64(key))


@functools.cache
def _masked_for(key: int):
    """The masked factorisation for one pattern key (a ``custom_vmap`` function takes array
    operands only, so the key is closed over)."""

    @jax.custom_batching.custom_vmap
    def masked(mask, values, old):
        # at the top level: nothing to do unless some member (of leading axes) asks
        return lax.cond(jnp.any(mask), lambda: _sparse_lu_masked_call(mask, values, old, key),
                        lambda: (old, jnp.zeros(mask.shape, jnp.int32)))

    @masked.def_vmap
    def _vmap(axis_size, in_batched, mask, values, old):
        mask, values, old = (x if b else jnp.broadcast_to(x, (axis_size, *x.shape))
                             for x, b in zip((mask, values, old), in_batched, strict=True))
        return masked(mask, values, old), (True, True)

    return masked


def sparse_lu_masked(mask, values, old, key: int):
    """:func:`sparse_lu_native` member by member: where ``mask``, the factors of the
    matrix with ``values`` on ``A``'s pattern (scattered into the closed pattern's slots
    ``position``, registered with the pattern under ``key``, by the kernel); elsewhere
    ``old``, untouched (the output is aliased to it). Under ``vmap`` the batched ``mask``
    goes into one kernel call, so that only the members that ask are factorised (where
    ``vmap`` of a ``lax.cond`` factorises them all), and the call is skipped when none asks.
    ``info`` is ``0`` for a kept member. Operands carry no derivatives (the caller cuts
    them)."""
    mask = jnp.broadcast_to(jnp.asarray(mask, bool), old.shape[:-1])
    return _masked_for(int(key))(mask, values.astype(old.dtype), old)


def sparse_lu_count() -> int:
    """Member factorisations done by the native sparse LU kernels in this process (a
    counter kept by the library, for tests of what a batch factorises)."""
    _require()
    f = load().simlib_sparse_lu_count
    f.restype = ctypes.c_int64
    return int(f())


def _sparse_solve_call(lu, b, key, transpose):
    call = jax.ffi.ffi_call(f"simlib_sparse_solve_{_suffix(lu.dtype)}",
                            jax.ShapeDtypeStruct(b.shape, b.dtype),
                            vmap_method="expand_dims")
    return call(lu, b, pattern=np.int64(key), transpose=np.int64(transpose))


@functools.cache
def _solve_for(key: int, transpose: bool):
    """The solve for one pattern key and direction (closed over, as in :func:`_masked_for`)."""

    @jax.custom_batching.custom_vmap
    def solve(lu, b):
        return _sparse_solve_call(lu, b, key, transpose)

    @solve.def_vmap
    def _vmap(axis_size, in_batched, lu, b):
        lu_b, b_b = in_batched
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
        return solve(lu, b), lu_b or b_b

    return solve


def sparse_solve_native(lu, key: int, b, transpose: bool):
    """``A^-1 b`` (``A^-T b``) from :func:`sparse_lu_native`'s factors on the pattern
    registered under ``key`` (``b`` and ``lu`` with the same leading batch axes, or ``lu``
    unbatched: shared by every ``b``)."""
    b = b.astype(lu.dtype)
    return _solve_for(int(key), bool(transpose))(lu, b)


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
