"""Column colouring of a sparsity pattern, and the Jacobian from one JVP per colour.

Two columns of ``J`` may share a colour when no row has a non-zero in both (they are not
adjacent in the column intersection graph ``P^T P``); the sum of a colour's unit vectors
is then a seed whose JVP holds every column of that colour without overlap (Curtis,
Powell and Reid 1974; the graph view: Coleman and More, SIAM J. Numer. Anal. 20, 1983,
187-209). Greedy colouring in largest-first order (most neighbours first) uses at most
``max degree + 1`` colours and at least the largest number of non-zeros in a row.
"""

from __future__ import annotations

import hashlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ._base import Array, LazyModule

sp = LazyModule("scipy.sparse")  # imported on first use (0.2 s)


def wrong_shape(shape: tuple[int, ...], n: int | None = None) -> ValueError:
    """The error for a ``jac_sparsity`` of ``shape`` that is not ``(n, n)``, ``n`` the
    number of state components (``None``: not known here; then it says square)."""
    want = (f"({n}, {n}) for a state of {n} components" if n is not None
            else "square (a row and a column per state component)")
    return ValueError(f"jac_sparsity must be {want}; got shape {tuple(shape)}")


def as_pattern(jac_sparsity, n: int | None = None) -> sp.csr_matrix:
    """``jac_sparsity`` (a boolean array or a scipy sparse matrix, as scipy's
    ``solve_ivp`` takes it) as a boolean CSR matrix with sorted indices, checked square,
    and ``(n, n)`` when ``n`` (the number of state components) is given."""
    if sp.issparse(jac_sparsity):
        m = sp.csr_matrix(jac_sparsity, dtype=bool)
    else:
        arr = np.asarray(jac_sparsity)
        if arr.ndim != 2:
            raise ValueError(f"jac_sparsity must be a 2-D boolean array or scipy sparse "
                             f"matrix; got shape {arr.shape}")
        m = sp.csr_matrix(arr != 0)
    m.eliminate_zeros()
    m.sort_indices()
    if m.shape[0] != m.shape[1] or (n is not None and m.shape[0] != n):
        raise wrong_shape(m.shape, n)
    return m


def color_columns(pattern: sp.csr_matrix, order: str = "largest_first") -> np.ndarray:
    """A colour per column such that columns sharing a row differ (greedy).

    Args:
        pattern: The ``(m, n)`` sparsity pattern.
        order: ``"largest_first"`` (by degree in the column intersection graph) or
            ``"natural"``.

    Returns:
        ``(n,)`` int32 colours ``0 .. ncolors - 1``.
    """
    p = sp.csr_matrix(pattern, dtype=np.int32)
    g = (p.T @ p).tocsr()  # column intersection graph (with the diagonal)
    n = g.shape[0]
    degree = np.diff(g.indptr)
    if order == "largest_first":
        visit = np.argsort(-degree, kind="stable")
    elif order == "natural":
        visit = np.arange(n)
    else:
        raise ValueError(f"order must be 'largest_first' or 'natural'; got {order!r}")
    colors = np.full(n, -1, np.int64)
    seen = np.full(int(degree.max(initial=0)) + 2, -1, np.int64)
    indptr, indices = g.indptr, g.indices
    for c in visit.tolist():
        nb = colors[indices[indptr[c]:indptr[c + 1]]]
        seen[nb[nb >= 0]] = c
        k = 0
        while seen[k] == c:
            k += 1
        colors[c] = k
    return colors.astype(np.int32)


def index_constant(owner: Any, name: str, values: np.ndarray) -> Array:
    """``values`` as an int32 JAX array (int64 past 2^31), made once per ``owner`` and kept
    on it: every use in a traced program is then the same constant, which JAX passes once,
    where a NumPy array converted at each use enters the program once per use (a 2-D
    Brusselator of 131,072 states had 14 copies of one index array)."""
    cache = owner.__dict__.setdefault("_index_constants", {})
    if name not in cache:
        values = np.asarray(values)
        small = values.size == 0 or (values.min() >= -2 ** 31 and values.max() < 2 ** 31)
        with jax.ensure_compile_time_eval():
            cache[name] = jnp.asarray(values, jnp.int32 if small else jnp.int64)
    return cache[name]


class CompressedPattern:
    """A static sparsity pattern with its colouring: the seeds, and the map from the
    compressed JVPs to the values of the CSR pattern.

    Hashes and compares by content, so that solvers holding it are static settings.

    Attributes:
        n: Size.
        indptr, indices: CSR of the pattern (the diagonal always included).
        colors: ``(n,)`` colour of each column; ``ncolors`` their number.
        rows, cols: ``(nnz,)`` coordinates of the values, in CSR order.
    """

    def __init__(self, pattern, order: str = "largest_first"):
        m = as_pattern(pattern)
        n = m.shape[0]
        m = (m + sp.identity(n, dtype=bool, format="csr")).tocsr()
        m.sort_indices()
        self.n = n
        self.indptr = m.indptr.astype(np.int64)
        self.indices = m.indices.astype(np.int64)
        self.rows = np.repeat(np.arange(n), np.diff(self.indptr))
        self.cols = self.indices
        self.colors = color_columns(m, order)
        self.ncolors = int(self.colors.max(initial=-1)) + 1
        self.diag = np.flatnonzero(self.indices == self.rows)  # one per row, in order
        digest = hashlib.sha256(self.indptr.tobytes() + self.indices.tobytes())
        self._key = (n, digest.hexdigest(), order)

    @property
    def nnz(self) -> int:
        return int(self.indices.size)

    def matrix(self, values=None) -> sp.csr_matrix:
        """The pattern as a scipy CSR matrix (with ``values``, or ones)."""
        data = np.ones(self.nnz) if values is None else np.asarray(values)
        return sp.csr_matrix((data, self.indices, self.indptr), shape=(self.n, self.n))

    def seeds(self, dtype) -> Array:
        """``(ncolors, n)`` 0/1 seeds, one per colour."""
        # built in the program from the (n,) colours: a constant of n int32, not ncolors * n
        colors = index_constant(self, "colors", self.colors)
        return (jnp.arange(self.ncolors, dtype=jnp.int32)[:, None] == colors[None, :]).astype(dtype)

    def decompress(self, compressed: Array) -> Array:
        """The ``(nnz,)`` values (CSR order) from ``compressed[k] = J @ seed_k``."""
        # one index per value into the flattened (ncolors * n) JVPs
        flat = index_constant(self, "flat",
                              self.colors[self.cols].astype(np.int64) * self.n + self.rows)
        return compressed.reshape(*compressed.shape[:-2], -1)[..., flat]

    def jacobian(self, linear_map, dtype) -> Array:
        """The values of ``linear_map``'s matrix on the pattern, from ``ncolors`` JVPs."""
        return self.decompress(jax.vmap(linear_map)(self.seeds(dtype)))

    def __hash__(self):
        return hash(self._key)

    def __eq__(self, other):
        return isinstance(other, CompressedPattern) and self._key == other._key

    def __repr__(self):
        return f"CompressedPattern(n={self.n}, nnz={self.nnz}, ncolors={self.ncolors})"
