"""Sparse Jacobians (a given or detected pattern, coloured JVPs) and a sparse direct LU.

``J``'s values live on a static CSR pattern (the diagonal always included, since
``A = M - c J``); they come from one JVP per colour (:mod:`._coloring`). The matrix is
factorised by one of two kernels:

- ``"native"``: LU without pivoting on a fixed symbolic factorisation (C++,
  ``native/linalg.cc``), after a fill-reducing symmetric ordering computed once on the
  host: the elimination tree of the symmetrised pattern gives the fill, the numeric
  factorisation reuses it for every ``c`` and every state. Static pivoting is safe when
  ``A`` is close to diagonally dominant, as ``I - c J`` is for the small ``c`` of accurate
  steps; a zero or non-finite pivot is reported (``Factorisation.ok``), so that a step
  fails (and is retried smaller) instead of returning a wrong answer.
- ``"host"``: scipy's SuperLU (``splu``, partial pivoting) through ``jax.pure_callback``.
  A SuperLU object cannot live in a JAX array, so the factorisation is redone at each
  solve; under ``vmap`` the callback runs once per member (``vmap_method="sequential"``).
  The fallback where no compiler is present.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .._static import register_static
from . import _kernels
from ._base import Array, Factorisation, Field, LazyModule, LinearSolver
from ._coloring import CompressedPattern, index_constant
from ._sparsity import jacobian_sparsity

sp = LazyModule("scipy.sparse")
csgraph = LazyModule("scipy.sparse.csgraph")
spla = LazyModule("scipy.sparse.linalg")

ORDERINGS = ("auto", "nd", "mmd", "rcm", "natural")
ND_LEAF = 16  # nested dissection keeps subgraphs of this size in natural order


def fill_reducing_order(pattern: CompressedPattern, ordering: str) -> np.ndarray:
    """A symmetric ordering ``q`` (new index -> old) of the symmetrised pattern:
    ``"nd"`` (nested dissection with level-structure separators, George 1973; George and
    Liu 1981; native, :func:`._kernels.nested_dissection`), ``"mmd"`` (multiple minimum
    degree on ``A + A^T``, SuperLU's ``MMD_AT_PLUS_A``, taken
    from scipy's ``splu`` run once on a diagonally dominant matrix of the pattern),
    ``"rcm"`` (reverse Cuthill-McKee, scipy) or ``"natural"``."""
    n = pattern.n
    if ordering == "natural":
        return np.arange(n)
    if ordering == "auto":
        raise ValueError("ordering 'auto' is chosen by SymbolicLU (it compares the fill)")
    s = pattern.matrix()
    s = (s + s.T).tocsr()
    if ordering == "nd":
        s.sort_indices()
        return _kernels.nested_dissection(s.indptr, s.indices, ND_LEAF)
    if ordering == "rcm":
        return np.asarray(csgraph.reverse_cuthill_mckee(s, symmetric_mode=True), np.int64)
    if ordering == "mmd":
        s.data[:] = 1.0
        dominant = (s + sp.identity(n) * (np.abs(s).sum(axis=1).max() + 1.0)).tocsc()
        lu = spla.splu(dominant, permc_spec="MMD_AT_PLUS_A", diag_pivot_thresh=0.0,
                       options=dict(SymmetricMode=True))
        return np.argsort(lu.perm_c).astype(np.int64)
    raise ValueError(f"ordering must be one of {ORDERINGS}; got {ordering!r}")


def _permuted(pattern: CompressedPattern, q: np.ndarray):
    """``A``'s entries ``(r, c)`` under the symmetric ordering ``q``, the inverse of
    ``q``, and the symmetrised permuted pattern (CSR, sorted)."""
    n = pattern.n
    inv = np.empty(n, np.int64)
    inv[q] = np.arange(n)
    r, c = inv[pattern.rows], inv[pattern.cols]
    permuted = sp.csr_matrix((np.ones(r.size), (r, c)), shape=(n, n))
    s = (permuted + permuted.T).tocsr()
    s.sort_indices()
    return r, c, inv, permuted, s


def envelope_bound(s: sp.csr_matrix) -> int:
    """An upper bound on the LU fill (L + U, the diagonal once) of a matrix with the
    symmetric, sorted pattern ``s``: its envelope, ``n + 2 sum_i (i - f_i)`` with ``f_i``
    the first column of row ``i`` (fill stays inside the envelope: George and Liu 1981,
    ch. 4)."""
    n = s.shape[0]
    first = np.minimum(s.indices[s.indptr[:-1]], np.arange(n))
    return int(n + 2 * np.sum(np.arange(n) - first))


class SymbolicLU:
    """The fill pattern ``F`` of ``P A P^T`` (CSR, int32) and where ``A``'s values go.

    ``ordering="auto"`` takes nested dissection unless reverse Cuthill-McKee's envelope
    (an upper bound on its fill) is smaller than nested dissection's fill, as on 1-D
    (banded) patterns; ``self.ordering`` is the one used."""

    def __init__(self, pattern: CompressedPattern, ordering: str, fill: bool = True):
        n = pattern.n
        chosen = "nd" if ordering == "auto" else ordering
        q = fill_reducing_order(pattern, chosen)
        r, c, inv, permuted, s = _permuted(pattern, q)
        if fill:
            fp, fi = _kernels.symbolic_fill(s.indptr, s.indices)
            if ordering == "auto":
                q_rcm = fill_reducing_order(pattern, "rcm")
                r2, c2, inv2, permuted2, s2 = _permuted(pattern, q_rcm)
                if envelope_bound(s2) < fp[-1]:
                    chosen, q, r, c, inv, permuted, s = ("rcm", q_rcm, r2, c2, inv2,
                                                         permuted2, s2)
                    fp, fi = _kernels.symbolic_fill(s.indptr, s.indices)
        else:  # ILU(0): the pattern itself
            permuted.sort_indices()
            fp, fi = permuted.indptr.astype(np.int64), permuted.indices.astype(np.int64)
        if fp[-1] >= 2 ** 31:
            raise ValueError(f"sparse LU: {fp[-1]} non-zeros in the factors exceed int32")
        keys = np.repeat(np.arange(n), np.diff(fp)) * n + fi
        self.position = np.searchsorted(keys, r * n + c)  # A's value k -> F slot
        self.position32 = self.position.astype(np.int32)
        if not np.array_equal(keys[self.position], r * n + c):
            raise AssertionError("symbolic LU: the fill pattern misses an entry of A")
        frows = np.repeat(np.arange(n), np.diff(fp))
        self.fp = fp.astype(np.int32)
        self.fi = fi.astype(np.int32)
        self.diag = np.flatnonzero(fi == frows).astype(np.int32)
        self.order = q
        self.inverse = inv
        self.nnz = int(fp[-1])
        self.ordering = chosen


class Sparse(LinearSolver):
    """``J`` on a static sparsity pattern from one JVP per colour, and a sparse LU of
    ``A = M - c J``.

    Args:
        jac_sparsity: The pattern (a boolean ``(n, n)`` array or scipy sparse matrix, as
            scipy's ``solve_ivp`` takes it), or ``None`` to detect it from the vector
            field (:meth:`bind`).
        kernel: ``"auto"`` (native if the library loads, else host), ``"native"``,
            ``"host"``.
        ordering: The fill-reducing ordering of the native kernel: ``"auto"`` (nested
            dissection, or reverse Cuthill-McKee where its envelope is smaller than nested
            dissection's fill, as on 1-D patterns: :class:`SymbolicLU`), ``"nd"``,
            ``"mmd"``, ``"rcm"``, ``"natural"``.
        color_order: The greedy colouring's order (``"largest_first"``, ``"natural"``).
    """

    def __init__(self, jac_sparsity: Any = None, kernel: str = "auto", ordering: str = "auto",
                 color_order: str = "largest_first") -> None:
        if kernel not in ("auto", "native", "host"):
            raise ValueError(f"kernel must be 'auto', 'native' or 'host'; got {kernel!r}")
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS}; got {ordering!r}")
        self.pattern = (None if jac_sparsity is None
                        else CompressedPattern(jac_sparsity, color_order)
                        if not isinstance(jac_sparsity, CompressedPattern) else jac_sparsity)
        self.kernel = kernel
        self.ordering = ordering
        self.color_order = color_order

    def bind(self, g: Field, t: Any, v: Array) -> Sparse:
        """This solver with its pattern: the given one (checked against ``v``'s size), or
        the one detected from ``g`` (:func:`~._sparsity.jacobian_sparsity`)."""
        if self.pattern is not None:
            if self.pattern.n != v.size:
                raise ValueError(f"jac_sparsity is for {self.pattern.n} components; the "
                                 f"state has {v.size}")
            return self
        detected = jacobian_sparsity(g, t, v)
        return Sparse(CompressedPattern(detected, self.color_order), self.kernel,
                      self.ordering, self.color_order)

    def _pattern(self) -> CompressedPattern:
        if self.pattern is None:
            raise ValueError("Sparse() without jac_sparsity: call bind(g, t, v) first (it "
                             "detects the pattern from the vector field)")
        return self.pattern

    def _use_native(self) -> bool:
        if self.kernel == "host" or self._pattern().n == 0:  # nothing to factorise
            return False
        if _kernels.load() is not None:
            return True
        if self.kernel == "native":
            raise RuntimeError(f"native linear-algebra kernels unavailable: "
                               f"{_kernels.unavailable_reason()}")
        return False

    def symbolic(self) -> SymbolicLU:
        """The symbolic factorisation (computed once per pattern and ordering)."""
        pat = self._pattern()
        cache = pat.__dict__.setdefault("_symbolic", {})
        if self.ordering not in cache:
            cache[self.ordering] = SymbolicLU(pat, self.ordering)
        return cache[self.ordering]

    # ------------------------------------------------------------------ protocol
    def materialise(self, linear_map: Callable[[Array], Array], n: int, dtype: Any) -> Any:
        pat = self._pattern()
        if n != pat.n:
            raise ValueError(f"jac_sparsity is for {pat.n} components; the map has {n}")
        return pat.jacobian(linear_map, dtype)

    def operator(self, jac: Array, c: Array, mass: Any) -> Array:
        """The values of ``A = M - c J`` on the pattern (``mass``: ``None``, an ``(n,)``
        diagonal, or values on the pattern)."""
        pat = self._pattern()
        a = -c.astype(jac.dtype) * jac
        diag = index_constant(pat, "diag", pat.diag)
        if mass is None:
            return a.at[diag].add(1.0)
        mass = jnp.asarray(mass, jac.dtype)
        if mass.shape == (pat.n,) and pat.nnz != pat.n:
            return a.at[diag].add(mass)
        return a + mass

    def _zero_mass(self, n, dtype):
        return jnp.zeros((n,), dtype)

    def matvec(self, jac: Any, c: Array, mass: Any, x: Array, *, field: Field | None = None,
               transpose: bool = False) -> Array:
        pat = self._pattern()
        vals = self.operator(jac, c, mass)
        rows, cols = index_constant(pat, "rows", pat.rows), index_constant(pat, "cols", pat.cols)
        if transpose:
            rows, cols = cols, rows
        return jax.ops.segment_sum(vals * x[cols], rows, num_segments=pat.n)

    def _factor(self, jac, c, mass):
        a = self.operator(jac, c, mass)
        if not self._use_native():
            return a, jnp.all(jnp.isfinite(a))
        sym = self.symbolic()
        position = index_constant(sym, "position", sym.position)
        vals = jnp.zeros(a.shape[:-1] + (sym.nnz,), a.dtype).at[..., position].set(a)
        lu, info = _kernels.sparse_lu_native(vals, _kernels.pattern_key(sym))
        return lu, (info == 0) & jnp.all(jnp.isfinite(lu))

    @property
    def factors_per_member(self) -> bool:  # type: ignore[override]
        return self._use_native()

    def factor_where(self, pred: Array, old: Factorisation, jac: Any, c: Array,
                     mass: Any = None) -> Factorisation:
        """The native kernel's masked batch (:func:`._kernels.sparse_lu_masked`): under
        ``vmap`` only the members with ``pred`` are factorised, the others keep ``old``'s
        factors without a copy, and nothing runs when no member asks."""
        if not self._use_native():
            return super().factor_where(pred, old, jac, c, mass)
        sg = lax.stop_gradient
        c = jnp.asarray(c)
        pred = sg(jnp.asarray(pred, bool))
        a = self.operator(jax.tree_util.tree_map(sg, jac), sg(c),
                          jax.tree_util.tree_map(sg, mass))
        sym = self.symbolic()
        lu, info = _kernels.sparse_lu_masked(pred, a, sg(old.data), _kernels.pattern_key(sym))
        ok = jnp.where(pred, info == 0, old.ok)
        c_new = jnp.where(pred, c.astype(jnp.result_type(old.c)), old.c)
        mass_new = (mass if mass is None else jax.tree_util.tree_map(
            lambda m, o: jnp.where(pred, m, o), mass, old.mass))
        return Factorisation(jac, c_new, mass_new, lu, ok)

    def _solve(self, fac, b, transpose, field):
        if not self._use_native():
            return _host_solve(self._pattern(), fac.data, b, transpose)
        sym = self.symbolic()
        x = _kernels.sparse_solve_native(fac.data, _kernels.pattern_key(sym),
                                         b[index_constant(sym, "order", sym.order)], transpose)
        return x[index_constant(sym, "inverse", sym.inverse)]


def _host_solve(pat: CompressedPattern, values, b, transpose: bool):
    """``A^-1 b`` by scipy's ``splu`` in a host callback (factorised at every call)."""

    def run(vals, rhs):
        a = sp.csc_matrix(pat.matrix(np.asarray(vals)))
        try:
            x = spla.splu(a).solve(np.asarray(rhs), trans="T" if transpose else "N")
        except RuntimeError:  # exactly singular: SuperLU refuses
            x = np.full(rhs.shape, np.nan)
        return x.astype(rhs.dtype)

    return jax.pure_callback(run, jax.ShapeDtypeStruct(b.shape, b.dtype), values, b,
                             vmap_method="sequential")


register_static(Sparse)
