"""The sparsity pattern of ``dg/dv`` read from the vector field's jaxpr.

An abstract interpreter runs ``g``'s jaxpr on dependency sets instead of numbers: every
element of every intermediate array carries the set of state components it depends on,
held for a whole array as a boolean sparse matrix ``P`` (one row per element, one column
per state component; scipy CSR). The rules, by kind of primitive:

- elementwise (``add``, ``mul``, ``exp``, ...): the union of the operands' rows (a known
  constant zero factor of ``mul`` removes the other factor's dependencies there);
- ``select_n`` (``jnp.where``): the union of the branches, whatever the predicate, unless
  the predicate is a known constant; a ``where`` on the state gives a conservative,
  correct pattern (the union of what either branch could need);
- data movement (slicing, ``gather``, ``concatenate``, ``reshape``, ``transpose``,
  ``pad``, ``rev``, ``broadcast_in_dim``, ``dynamic_slice``, ``dynamic_update_slice``,
  ``scatter`` i.e. ``.at[].set``): an index map, found by running the primitive itself on
  arrays of element numbers;
- ``scatter-add`` (``.at[].add``) and reductions (``reduce_sum``, ``max``, ...), cumulative
  sums: each output's union over the inputs that flow into it (the scatter's targets come
  from its transpose, a gather, run on element numbers);
- ``dot_general``: ``out[i, j]`` depends on ``lhs[i, k]`` where ``rhs[k, j]`` may be non-zero
  and on ``rhs[k, j]`` where ``lhs[i, k]`` may be (a known constant's zeros count);
- ``conv_general_dilated`` with a constant kernel: through the convolution's patches;
- comparisons, rounding, integer and boolean results, ``stop_gradient``: no derivative;
- ``jit``, ``custom_jvp``/``custom_vjp`` functions, ``checkpoint``: their inner jaxpr;
  ``cond``: the union of the branches (or the known branch); ``while``/``scan``: a fixed
  point of the loop body's dependencies (conservative over iterations);
- any other primitive: every output element depends on everything its inputs depend on
  (dense rows: correct, possibly far from sparse), with a warning naming it.

Gather and dynamic-slice indices that depend on the state or on ``args`` (unknown at
trace time) make the gathered elements depend on the whole operand: conservative.
Values that are not the state (``t``, ``args``) are unknown but carry no dependency;
constants in the jaxpr are known. The result is a superset of the true pattern for every
state (it is exact on the stencils, reactions and boundaries tested), as the colouring
needs. (The approach is that of SparseConnectivityTracer.jl, A. Hill and G. Dalle 2025,
and of sparsity detection in ADOL-C; written here for jaxprs.)
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend import core as jcore

from ._base import LazyModule

sp = LazyModule("scipy.sparse")  # imported on first use (0.2 s)

_ZERO_DERIVATIVE = {
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "floor", "ceil", "round",
    "sign", "is_finite", "stop_gradient", "argmax", "argmin", "iota", "shift_left",
    "shift_right_logical", "shift_right_arithmetic", "population_count", "random_bits",
    "random_seed", "random_wrap", "random_unwrap", "rem_int", "clz", "reduce_and",
    "reduce_or", "reduce_xor",
}
_ELEMENTWISE = {
    "add", "sub", "mul", "div", "neg", "exp", "exp2", "log", "log1p", "expm1", "sin", "cos",
    "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "atan2", "pow", "integer_pow", "sqrt", "rsqrt", "cbrt", "max", "min", "abs", "logistic",
    "square", "erf", "erfc", "erf_inv", "lgamma", "digamma", "igamma", "igammac", "rem",
    "nextafter", "copy", "copy_p", "reduce_precision", "real", "imag", "conj", "complex",
    "convert_element_type", "clamp", "select_n", "add_any", "bessel_i0e", "bessel_i1e",
    "polygamma", "zeta", "regularized_incomplete_beta", "pjit_identity",
    "optimization_barrier", "mul_add",
}
_INDEX_MAP = {
    "reshape", "squeeze", "expand_dims", "broadcast_in_dim", "transpose", "rev", "slice",
    "pad", "concatenate", "gather", "dynamic_slice", "dynamic_update_slice", "scatter",
    "copy_p", "split", "stack",
}
_REDUCE = {"reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_precision"}
_CUMULATIVE = {"cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"}
_EXACT_LOOP_CAP = 1000
_SCATTER_COMBINE = {"scatter-add", "scatter_add", "scatter-mul", "scatter_mul",
                    "scatter-min", "scatter_min", "scatter-max", "scatter_max"}
_INNER_JAXPR = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr",
                "core_call": "call_jaxpr", "custom_jvp_call": "call_jaxpr",
                "custom_vjp_call": "call_jaxpr", "custom_vjp_call_jaxpr": "fun_jaxpr",
                "checkpoint": "jaxpr", "remat": "jaxpr", "custom_lin": None}


class Known:
    """An array whose value is known at trace time (a constant): no dependencies."""

    def __init__(self, value):
        self.value = np.asarray(value)
        self.shape = self.value.shape


class Free:
    """An array whose value is unknown (``t``, ``args``) and independent of the state."""

    def __init__(self, shape):
        self.shape = tuple(shape)


class Dep:
    """An array that depends on the state: ``rows[e]`` is the set of components that
    element ``e`` (row-major) depends on."""

    def __init__(self, shape, rows: sp.csr_matrix):
        self.shape = tuple(shape)
        self.rows = rows


def pattern(m) -> sp.csr_matrix:
    """``m`` as a 0/1 ``int32`` CSR pattern (duplicates summed, explicit zeros dropped)."""
    m = sp.csr_matrix(m)
    m.sum_duplicates()
    m.eliminate_zeros()
    m.data = np.ones_like(m.data, dtype=np.int32)
    return m


def _select(n_in: int, src: np.ndarray) -> sp.csr_matrix:
    """The 0/1 matrix ``S[o, src[o]] = 1`` (rows with ``src < 0`` empty)."""
    src = np.asarray(src).ravel()
    ok = src >= 0
    rows = np.flatnonzero(ok)
    return sp.csr_matrix((np.ones(rows.size, np.int32), (rows, src[ok])),
                         shape=(src.size, n_in))


def rows_of(x, n: int, size: int) -> sp.csr_matrix:
    """Dependency rows of ``x`` broadcast to ``size`` elements (a shape-() operand is
    broadcast; a non-dependent one has empty rows)."""
    if isinstance(x, Dep):
        if x.rows.shape[0] == size:
            return x.rows
        if x.rows.shape[0] == 1:
            return pattern(sp.vstack([x.rows] * size)) if size else sp.csr_matrix((0, n))
        raise ValueError(f"cannot broadcast {x.shape} to {size} elements")
    return sp.csr_matrix((size, n), dtype=np.int32)


def size_of(shape) -> int:
    """The number of elements of an array of ``shape``."""
    return int(np.prod(shape, dtype=np.int64))


class Interpreter:
    """Propagates dependency patterns through a jaxpr over ``n`` state components
    (:meth:`run`): each value is a :class:`Dep` (its elements' rows of dependencies) or
    a :class:`Free` (no dependency on the state)."""

    def __init__(self, n: int):
        self.n = n
        self.warned: set[str] = set()

    # -------------------------------------------------------------- helpers
    def _dense_union(self, ins, out_avals):
        """Every output element depends on all that any input depends on."""
        total = sp.csr_matrix((1, self.n), dtype=np.int32)
        for x in ins:
            if isinstance(x, Dep) and x.rows.nnz:
                total = total + sp.csr_matrix(x.rows.sum(axis=0) > 0, dtype=np.int32)
        total = pattern(total)
        return [self._dep_or_free(a.shape, pattern(sp.vstack([total] * size_of(a.shape)))
                                  if size_of(a.shape) else sp.csr_matrix((0, self.n)), a)
                for a in out_avals]

    def _dep_or_free(self, shape, rows, aval=None):
        if aval is not None and not jnp.issubdtype(aval.dtype, jnp.inexact):
            return Free(shape)  # integer / boolean results carry no derivative
        if rows.nnz == 0:
            return Free(shape)
        return Dep(shape, rows)

    def _ids(self, ins, data_positions):
        """Element-number arrays for the data operands (``offset + index + 1``; ``0`` marks
        'no source'), the stacked dependency rows, and the float dtype used."""
        total = sum(size_of(ins[i].shape) for i in data_positions)
        dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
        if total + 1 >= (2 ** 53 if dtype == np.float64 else 2 ** 24):
            raise ValueError(f"sparsity detection: {total} elements are too many to number "
                             f"exactly in {np.dtype(dtype).name}")
        offset, stacks, ids = 0, [], {}
        for i in data_positions:
            size = size_of(ins[i].shape)
            ids[i] = (np.arange(size, dtype=dtype) + offset + 1).reshape(ins[i].shape)
            stacks.append(rows_of(ins[i], self.n, size))
            offset += size
        stacked = sp.vstack(stacks).tocsr() if stacks else sp.csr_matrix((0, self.n))
        return ids, stacked, dtype

    def _from_ids(self, out_ids, stacked, aval):
        out = np.asarray(out_ids, dtype=np.float64).ravel()
        src = np.where(np.isfinite(out) & (out > 0), out - 1, -1).astype(np.int64)
        return self._dep_or_free(aval.shape, pattern(_select(stacked.shape[0], src) @ stacked),
                                 aval)

    # -------------------------------------------------------------- rules
    def index_map(self, eqn, ins):
        prim, params = eqn.primitive, eqn.params
        name = prim.name
        if name == "gather":
            data, idx_pos = [0], [1]
        elif name == "dynamic_slice":
            data, idx_pos = [0], list(range(1, len(ins)))
        elif name == "dynamic_update_slice":
            data, idx_pos = [0, 1], list(range(2, len(ins)))
        elif name == "scatter":
            data, idx_pos = [0, 2], [1]
        else:
            data, idx_pos = list(range(len(ins))), []
        if any(not isinstance(ins[i], Known) for i in idx_pos):
            return None  # state- or args-dependent indices: conservative
        ids, stacked, dtype = self._ids(ins, data)
        args = [ids[i] if i in ids else ins[i].value for i in range(len(ins))]
        if name == "gather" and params.get("fill_value") is not None:
            params = dict(params, fill_value=0)
        outs = prim.bind(*[jnp.asarray(a) for a in args], **params)
        outs = outs if prim.multiple_results else [outs]
        return [self._from_ids(o, stacked, v.aval) for o, v in zip(outs, eqn.outvars, strict=True)]

    def scatter_combine(self, eqn, ins):
        operand, indices, updates = ins
        if not isinstance(indices, Known):
            return None
        dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
        out_aval = eqn.outvars[0].aval
        n_out, n_upd = size_of(out_aval.shape), size_of(updates.shape)
        params = dict(eqn.params)
        zeros = jnp.zeros(out_aval.shape, dtype)
        idx = jnp.asarray(indices.value)

        def add(u):
            return lax.scatter_add(zeros, idx, u, params["dimension_numbers"],
                                   indices_are_sorted=params.get("indices_are_sorted", False),
                                   unique_indices=params.get("unique_indices", False),
                                   mode=params.get("mode"))

        numbers = jnp.asarray(np.arange(n_out, dtype=dtype).reshape(out_aval.shape) + 1)
        (target,) = jax.linear_transpose(add, jnp.zeros(updates.shape, dtype))(numbers)
        target = np.asarray(target).ravel()
        ok = np.isfinite(target) & (target > 0)
        t = sp.csr_matrix((np.ones(ok.sum(), np.int32),
                           ((target[ok] - 1).astype(np.int64), np.flatnonzero(ok))),
                          shape=(n_out, n_upd))
        rows = rows_of(operand, self.n, n_out) + t @ rows_of(updates, self.n, n_upd)
        return [self._dep_or_free(out_aval.shape, pattern(rows), out_aval)]

    def reduce(self, eqn, ins):
        (x,) = ins[:1]
        axes = tuple(eqn.params["axes"])
        out_aval = eqn.outvars[0].aval
        keep = [d for d in range(len(x.shape)) if d not in axes]
        out_num = np.arange(size_of(out_aval.shape)).reshape([x.shape[d] for d in keep])
        target = np.broadcast_to(np.expand_dims(out_num, axes), x.shape).ravel()
        t = sp.csr_matrix((np.ones(target.size, np.int32), (target, np.arange(target.size))),
                          shape=(size_of(out_aval.shape), target.size))
        return [self._dep_or_free(out_aval.shape, pattern(t @ x.rows), out_aval)]

    def cumulative(self, eqn, ins):
        (x,) = ins
        axis, reverse = eqn.params["axis"], eqn.params.get("reverse", False)
        shape = x.shape
        num = np.arange(size_of(shape)).reshape(shape)
        pos = np.moveaxis(num, axis, -1).reshape(-1, shape[axis])
        length = shape[axis]
        tri = np.tril(np.ones((length, length), bool)) if not reverse else np.triu(
            np.ones((length, length), bool))
        r, c = np.nonzero(tri)
        rows = pos[:, r].ravel()
        cols = pos[:, c].ravel()
        t = sp.csr_matrix((np.ones(rows.size, np.int32), (rows, cols)),
                          shape=(num.size, num.size))
        return [self._dep_or_free(shape, pattern(t @ x.rows), eqn.outvars[0].aval)]

    def elementwise(self, eqn, ins):
        out_aval = eqn.outvars[0].aval
        size = size_of(out_aval.shape)
        name = eqn.primitive.name
        operands = list(ins)
        if name == "select_n":
            pred, cases = operands[0], operands[1:]
            if isinstance(pred, Known):
                which = np.broadcast_to(pred.value.astype(np.int64), out_aval.shape).ravel()
                rows = sp.csr_matrix((size, self.n), dtype=np.int32)
                for k, case in enumerate(cases):
                    mask = sp.diags((which == k).astype(np.int32), dtype=np.int32)
                    rows = rows + mask @ rows_of(case, self.n, size)
                return [self._dep_or_free(out_aval.shape, pattern(rows), out_aval)]
            operands = cases
        if name == "mul" and len(operands) == 2:
            a, b = operands
            rows = sp.csr_matrix((size, self.n), dtype=np.int32)
            for this, other in ((a, b), (b, a)):
                part = rows_of(this, self.n, size)
                if isinstance(other, Known):
                    nz = np.broadcast_to(other.value != 0, out_aval.shape).ravel()
                    part = sp.diags(nz.astype(np.int32), dtype=np.int32) @ part
                rows = rows + part
            return [self._dep_or_free(out_aval.shape, pattern(rows), out_aval)]
        if name == "clamp":  # clamp(lo, x, hi): x's dependencies (and bounds' if traced)
            pass
        rows = sp.csr_matrix((size, self.n), dtype=np.int32)
        for x in operands:
            rows = rows + rows_of(x, self.n, size)
        return [self._dep_or_free(out_aval.shape, pattern(rows), out_aval)]

    def dot_general(self, eqn, ins):
        lhs, rhs = ins
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        out_aval = eqn.outvars[0].aval

        def canon(x, batch, contract, contract_last):
            nd = len(x.shape)
            free = [d for d in range(nd) if d not in batch and d not in contract]
            order = [*batch, *free, *contract] if contract_last else [*batch, *contract, *free]
            num = np.arange(size_of(x.shape)).reshape(x.shape).transpose(order)
            sizes = [size_of([x.shape[d] for d in g]) for g in (batch, free, contract)]
            b, f, c = sizes
            num = num.reshape((b, f, c) if contract_last else (b, c, f))
            if isinstance(x, Known):
                nz = (x.value != 0).transpose(order).reshape(num.shape)
            else:
                nz = np.ones(num.shape, bool)
            return num, nz, b, f, c

        ln, lnz, nb, m, k = canon(lhs, lb, lc, True)
        rn, rnz, _, nn, _ = canon(rhs, rb, rc, False)
        # out[b, i, j] <- lhs[b, i, k] where rhs[b, k, j] != 0, and rhs[b, k, j] where
        # lhs[b, i, k] != 0; out is (batch, lhs free, rhs free) row-major, as dot_general's
        rows = sp.csr_matrix((nb * m * nn, self.n), dtype=np.int32)
        if isinstance(lhs, Dep):
            blocks = [sp.kron(sp.eye(m, dtype=np.int32),
                              sp.csr_matrix(rnz[b].T.astype(np.int32))) for b in range(nb)]
            t = sp.block_diag(blocks, format="csr") @ _select(size_of(lhs.shape), ln.ravel())
            rows = rows + t @ lhs.rows
        if isinstance(rhs, Dep):
            # rhs in (b, k, j) order: numbers rn[b] are (k, j)
            blocks = [sp.kron(sp.csr_matrix(lnz[b].astype(np.int32)),
                              sp.eye(nn, dtype=np.int32)) for b in range(nb)]
            t = sp.block_diag(blocks, format="csr") @ _select(size_of(rhs.shape), rn.ravel())
            rows = rows + t @ rhs.rows
        return [self._dep_or_free(out_aval.shape, pattern(rows), out_aval)]

    def conv(self, eqn, ins):
        lhs, rhs = ins
        p = eqn.params
        if (not isinstance(rhs, Known) or p["feature_group_count"] != 1
                or p["batch_group_count"] != 1 or not isinstance(lhs, Dep)):
            return None
        dn = p["dimension_numbers"]
        rhs_spec, out_spec = dn.rhs_spec, dn.out_spec
        kernel = rhs.value
        filter_shape = tuple(kernel.shape[d] for d in rhs_spec[2:])
        dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
        numbers = jnp.asarray(np.arange(size_of(lhs.shape), dtype=dtype).reshape(lhs.shape) + 1)
        # one output feature per (input feature, filter offset), its kernel a single 1: the
        # convolution then returns, for every output position, the number of the input
        # element at that offset (0 where it falls in the padding)
        c_in = kernel.shape[rhs_spec[1]]
        q = c_in * size_of(filter_shape)
        onehot = np.eye(q, dtype=dtype).reshape(q, c_in, *filter_shape)
        onehot = np.transpose(onehot, np.argsort(rhs_spec))
        params = {k: v for k, v in p.items() if k not in ("precision", "preferred_element_type")}
        patches = lax.conv_general_dilated_p.bind(
            numbers, jnp.asarray(onehot), **params, precision=lax.Precision.HIGHEST,
            preferred_element_type=None)
        patches = np.asarray(patches)
        # kernel non-zeros as (C_out, C_in * prod(filter)), in the same (C_in, offset) order
        kt = np.transpose(kernel, rhs_spec)
        knz = (kt != 0).reshape(kt.shape[0], -1)
        pt = np.transpose(patches, out_spec)
        nb, nf = pt.shape[:2]
        spatial = size_of(pt.shape[2:])
        pt = pt.reshape(nb, nf, spatial)
        out_aval = eqn.outvars[0].aval
        out_num = np.arange(size_of(out_aval.shape)).reshape(out_aval.shape)
        out_num = np.transpose(out_num, out_spec)
        out_num = out_num.reshape(nb, knz.shape[0], spatial)
        r_list, c_list = [], []
        for o in range(knz.shape[0]):
            feats = np.flatnonzero(knz[o])
            src = pt[:, feats, :]                      # (nb, nnz_feats, spatial)
            tgt = np.broadcast_to(out_num[:, o, None, :], src.shape)
            ok = np.rint(src) > 0
            r_list.append(tgt[ok])
            c_list.append(np.rint(src[ok]).astype(np.int64) - 1)
        r = np.concatenate(r_list)
        c = np.concatenate(c_list)
        t = sp.csr_matrix((np.ones(r.size, np.int32), (r, c)),
                          shape=(size_of(out_aval.shape), size_of(lhs.shape)))
        return [self._dep_or_free(out_aval.shape, pattern(t @ lhs.rows), out_aval)]

    def cond(self, eqn, ins):
        index, ops = ins[0], ins[1:]
        branches = eqn.params["branches"]
        if isinstance(index, Known):
            return self.run(branches[int(index.value)], ops)
        results = [self.run(b, ops) for b in branches]
        return [self._union(list(outs), v.aval) for outs, v in zip(zip(*results, strict=True),
                                                                     eqn.outvars, strict=True)]

    def _union(self, xs, aval):
        size = size_of(aval.shape)
        rows = sp.csr_matrix((size, self.n), dtype=np.int32)
        for x in xs:
            rows = rows + rows_of(x, self.n, size)
        return self._dep_or_free(aval.shape, pattern(rows), aval)

    def _same(self, a, b):
        ra = a.rows if isinstance(a, Dep) else None
        rb = b.rows if isinstance(b, Dep) else None
        if ra is None or rb is None:
            return ra is None and rb is None
        return (ra != rb).nnz == 0

    def while_loop(self, eqn, ins):
        p = eqn.params
        nc, nb = p["cond_nconsts"], p["body_nconsts"]
        cond_consts, body_consts = ins[:nc], ins[nc:nc + nb]
        carry = list(ins[nc + nb:])
        # a loop whose condition is known at every iteration (fori_loop's counter) is run
        # exactly, up to a cap; otherwise a fixed point over any number of iterations
        exact = list(carry)
        for _ in range(_EXACT_LOOP_CAP):
            (go,) = self.run(p["cond_jaxpr"], [*cond_consts, *exact])
            if not isinstance(go, Known):
                break
            if not bool(go.value):
                return exact
            exact = self.run(p["body_jaxpr"], [*body_consts, *exact])
        carry = [Free(c.shape) if isinstance(c, Known) else c for c in carry]
        avals = [v.aval for v in eqn.outvars]
        for _ in range(10_000):
            out = self.run(p["body_jaxpr"], [*body_consts, *carry])
            new = [self._union([c, o], a) for c, o, a in zip(carry, out, avals, strict=True)]
            if all(self._same(a, b) for a, b in zip(new, carry, strict=True)):
                return new
            carry = new
        raise RuntimeError("sparsity detection: while_loop fixed point not reached")

    def scan(self, eqn, ins):
        p = eqn.params
        n_consts, n_carry = p["num_consts"], p["num_carry"]
        consts = ins[:n_consts]
        carry = [Free(c.shape) if isinstance(c, Known) else c
                 for c in ins[n_consts:n_consts + n_carry]]
        xs = ins[n_consts + n_carry:]
        avals = [v.aval for v in eqn.outvars]
        if p["length"] <= _EXACT_LOOP_CAP:
            return self._scan_exact(p, consts, list(ins[n_consts:n_consts + n_carry]), xs,
                                    avals)
        x_el = []
        for x in xs:  # one iteration's slice: the union over the scanned axis
            shape = x.shape[1:]
            if isinstance(x, Dep):
                length = x.shape[0]
                per = size_of(shape)
                t = sp.csr_matrix((np.ones(length * per, np.int32),
                                   (np.tile(np.arange(per), length), np.arange(length * per))),
                                  shape=(per, length * per))
                x_el.append(self._dep_or_free(shape, pattern(t @ x.rows)))
            else:
                x_el.append(Free(shape))
        body = p["jaxpr"]
        for _ in range(10_000):
            out = self.run(body, [*consts, *carry, *x_el])
            new = [self._union([c, o], a) for c, o, a in
                   zip(carry, out[:n_carry], avals[:n_carry], strict=True)]
            if all(self._same(a, b) for a, b in zip(new, carry, strict=True)):
                break
            carry = new
        else:
            raise RuntimeError("sparsity detection: scan fixed point not reached")
        ys = []
        for y, aval in zip(out[n_carry:], avals[n_carry:], strict=True):
            size = size_of(aval.shape)
            if isinstance(y, Dep):
                per = y.rows.shape[0]
                idx = np.tile(np.arange(per), size // max(per, 1))
                ys.append(self._dep_or_free(aval.shape, pattern(_select(per, idx) @ y.rows), aval))
            else:
                ys.append(Free(aval.shape))
        return [*new, *ys]

    def _scan_exact(self, p, consts, carry, xs, avals):
        """A scan run iteration by iteration (its length is at most the cap)."""
        length, n_carry = p["length"], p["num_carry"]
        order = range(length - 1, -1, -1) if p.get("reverse", False) else range(length)
        ys = {}
        for it in order:
            x_it = []
            for x in xs:
                if isinstance(x, Known):
                    x_it.append(Known(x.value[it]))
                elif isinstance(x, Dep):
                    per = size_of(x.shape[1:])
                    x_it.append(self._dep_or_free(x.shape[1:], x.rows[it * per:(it + 1) * per]))
                else:
                    x_it.append(Free(x.shape[1:]))
            out = self.run(p["jaxpr"], [*consts, *carry, *x_it])
            carry = out[:n_carry]
            ys[it] = out[n_carry:]
        stacked = []
        for j, aval in enumerate(avals[n_carry:]):
            per = size_of(aval.shape[1:])
            parts = [ys[it][j] for it in range(length)]
            if all(isinstance(y, Known) for y in parts):
                stacked.append(Known(np.stack([y.value for y in parts])))
                continue
            rows = sp.vstack([rows_of(y, self.n, per) for y in parts]).tocsr()
            stacked.append(self._dep_or_free(aval.shape, pattern(rows), aval))
        return [*carry, *stacked]

    # -------------------------------------------------------------- driver
    def eqn(self, eqn, ins):
        prim = eqn.primitive
        name = prim.name
        if all(isinstance(x, Known) for x in ins):
            try:
                outs = prim.bind(*[jnp.asarray(x.value) for x in ins], **eqn.params)
                outs = outs if prim.multiple_results else [outs]
                return [Known(np.asarray(o)) for o in outs]
            except Exception:  # noqa: BLE001 - fall through: treat the values as unknown
                pass
        if not any(isinstance(x, Dep) for x in ins):
            return [Free(v.aval.shape) for v in eqn.outvars]
        out = None
        if name in _ZERO_DERIVATIVE:
            return [Free(v.aval.shape) for v in eqn.outvars]
        if name in _INNER_JAXPR and name != "custom_lin":
            inner = eqn.params[_INNER_JAXPR[name]]
            out = self.run(inner, ins)
        elif name in _INDEX_MAP:
            out = self.index_map(eqn, ins)
        elif name in _SCATTER_COMBINE:
            out = self.scatter_combine(eqn, ins)
        elif name in _REDUCE and name != "reduce_precision":
            out = self.reduce(eqn, ins)
        elif name in _CUMULATIVE:
            out = self.cumulative(eqn, ins)
        elif name in _ELEMENTWISE:
            out = self.elementwise(eqn, ins)
        elif name == "dot_general":
            out = self.dot_general(eqn, ins)
        elif name == "conv_general_dilated":
            out = self.conv(eqn, ins)
        elif name == "cond":
            out = self.cond(eqn, ins)
        elif name == "while":
            out = self.while_loop(eqn, ins)
        elif name == "scan":
            out = self.scan(eqn, ins)
        if out is None:
            if name not in self.warned:
                self.warned.add(name)
                warnings.warn(f"sparsity detection: no rule for the primitive {name!r} (or "
                              "its indices depend on the state or args): its outputs are "
                              "taken to depend on everything its inputs depend on",
                              RuntimeWarning, stacklevel=4)
            out = self._dense_union(ins, [v.aval for v in eqn.outvars])
        return out

    def run(self, jaxpr, ins):
        if isinstance(jaxpr, jcore.ClosedJaxpr):
            consts = [Known(np.asarray(c)) if _concrete(c) else Free(np.shape(c))
                      for c in jaxpr.consts]
            jaxpr = jaxpr.jaxpr
        else:
            consts = []
        env = {}

        def read(v):
            if isinstance(v, jcore.Literal):
                return Known(np.asarray(v.val))
            return env[v]

        for v, x in zip(jaxpr.constvars, consts, strict=True):
            env[v] = x
        for v, x in zip(jaxpr.invars, ins, strict=True):
            env[v] = x
        for e in jaxpr.eqns:
            outs = self.eqn(e, [read(v) for v in e.invars])
            for v, x in zip(e.outvars, outs, strict=True):
                if not isinstance(v, jcore.DropVar):
                    env[v] = x
        return [read(v) for v in jaxpr.outvars]


def _concrete(x) -> bool:
    if isinstance(x, jax.core.Tracer):
        return False
    try:
        np.asarray(x)
        return True
    except Exception:  # noqa: BLE001
        return False


def jacobian_sparsity(g: Callable, t, v) -> sp.csr_matrix:
    """The sparsity pattern of ``dg/dv`` at any state, from ``g``'s jaxpr.

    Args:
        g: The flattened field ``g(t, v)`` (``v`` a vector of ``n`` components); what it
            closes over (``args``, even traced ones) is treated as unknown and independent
            of ``v``.
        t, v: Example arguments (only their shapes and dtypes matter).

    Returns:
        An ``(n_out, n)`` boolean CSR matrix: ``True`` where ``d g_i / d v_j`` may be
        non-zero for some state. Conservative (a superset) where the field's structure
        depends on the state or where a primitive has no rule (with a warning).
    """
    v = jnp.asarray(v)
    n = v.size
    closed = jax.make_jaxpr(g)(t, v)
    interp = Interpreter(n)
    start = Dep(v.shape, pattern(sp.identity(n, dtype=np.int32, format="csr")))
    (out,) = interp.run(closed, [Free(np.shape(t)), start])
    rows = rows_of(out, n, size_of(out.shape))
    m = sp.csr_matrix(rows, dtype=bool)
    m.sort_indices()
    return m
