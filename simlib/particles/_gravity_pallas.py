r"""Direct-sum gravity as Pallas kernels for TPUs: tiles of target rows by source lanes.

Grid cell ``(i, j)`` takes ``block_targets`` target bodies (rows) against ``block_sources``
source bodies (lanes), 128 source lanes at a time, and adds for every target
:math:`\phi_i = \sum_j m_j s_{ij}` and :math:`a_i = \sum_j m_j s_{ij}^3 (x_i - x_j)`,
:math:`s_{ij} = (r_{ij}^2 + \epsilon^2)^{-1/2}` (one ``rsqrt`` per pair), into lane-dense
partial sums that stay in VMEM while ``j`` runs and are summed over lanes at the end.
:func:`gravity_sums` visits every ordered pair; :func:`gravity_sums_symmetric` visits each
pair once and adds it to both bodies (Newton's third law), the sources' sums resident in
VMEM, in a circulant order of source blocks; :func:`gravity_pair_sums` picks it where
those sums fit. Only the cells that hold a body's own pair mask it. The force is
:math:`F_i = -G m_i a_i` and the energy :math:`U = -\tfrac12 G \sum_i m_i \phi_i`.
Padding bodies have zero mass and sit far away; their rows are dropped. Tile shapes were
chosen on a TPU v5e chip (docs/particles.md, "Accelerators").

Reference: Nyland, Harris and Prins, "Fast N-Body Simulation with CUDA", GPU Gems 3,
ch. 31 (2007): the tiled all-pairs sum this follows, with TPU tiles in place of CUDA
thread blocks. The pure-JAX kernel (``_energy._gravity_direct``) is the reference and
serves reverse mode; CI runs these kernels in Pallas's interpret mode on the CPU
(tests/test_gravity_pallas.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

FAR = 1.0e15
"""Where padding bodies sit: far enough that their pull is zero in float32 and float64."""


ROWS, LANES = 8, 128
"""A vector register holds 8 x 128 values: 8 sublanes by 128 lanes."""

ZERO = np.int32(0)
"""Block index 0 for the index maps: a Python ``0`` becomes an int64 under x64, which Mosaic
does not take."""


def _kernel(eps2_ref, targets_ref, sources_ref, out_ref):
    """One grid cell: ``block_targets`` target rows against ``block_sources`` source lanes,
    in slabs of ``block_targets x 128`` pairs whose four sums stay lane-dense until the
    cell's end; only cells that hold a body's own pair mask it."""
    i, j = pl.program_id(0), pl.program_id(1)
    bt, bs = targets_ref.shape[0], sources_ref.shape[1]
    eps2 = eps2_ref[0]

    @pl.when(j == 0)
    def _():
        out_ref[...] = jnp.zeros_like(out_ref)

    t = targets_ref[...]
    tk = [t[:, k:k + 1] for k in range(3)]

    def slabs(masked: bool):
        acc = [jnp.zeros((bt, LANES), t.dtype) for _ in range(4)]
        for c in range(bs // LANES):
            s = sources_ref[:, c * LANES:(c + 1) * LANES]
            d = [tk[k] - s[ROWS * k:ROWS * k + 1, :] for k in range(3)]
            r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2
            if masked:
                rows = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 0) + i * bt
                cols = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 1) + j * bs + c * LANES
                same = rows == cols
                inv = jnp.where(same, 0.0, jax.lax.rsqrt(jnp.where(same, 1.0, r2)))
            else:
                inv = jax.lax.rsqrt(r2)
            ms = s[3 * ROWS:3 * ROWS + 1, :] * inv
            w = ms * inv * inv
            for k in range(3):
                acc[k] = acc[k] + w * d[k]
            acc[3] = acc[3] + ms
        out_ref[...] += jnp.concatenate(acc, axis=1)

    overlap = (i * bt < (j + 1) * bs) & (j * bs < (i + 1) * bt)

    @pl.when(jnp.logical_not(overlap))
    def _():
        slabs(False)

    @pl.when(overlap)
    def _():
        slabs(True)


@functools.partial(jax.jit, static_argnames=("block_targets", "block_sources", "interpret"))
def gravity_sums(positions, masses, softening, *, block_targets: int = 64,
                 block_sources: int = 8192, interpret: bool = False):
    """``(a, phi)``: per body :math:`\\sum_j m_j s_{ij}^3 (x_i - x_j)` and
    :math:`\\sum_j m_j s_{ij}`, ``j != i``, of ``n`` bodies in 3D, from the tiled kernel."""
    n = positions.shape[0]
    dtype = positions.dtype
    bt, bs = _blocks(n, block_targets, block_sources)
    n_pad = -(-n // bs) * bs
    bodies, sources, eps2 = _padded(positions, masses, softening, n_pad)
    out = pl.pallas_call(
        _kernel,
        out_shape=jax.ShapeDtypeStruct((n_pad, 4 * LANES), dtype),
        grid=(n_pad // bt, n_pad // bs),
        in_specs=[_scalar_spec(),
                  pl.BlockSpec((bt, 4), lambda i, j: (i, ZERO)),
                  pl.BlockSpec((4 * ROWS, bs), lambda i, j: (ZERO, j))],
        out_specs=pl.BlockSpec((bt, 4 * LANES), lambda i, j: (i, ZERO)),
        compiler_params=_compiler_params(),
        interpret=interpret,
    )(eps2, bodies, sources)
    sums = out[:n].reshape(n, 4, LANES).sum(axis=2)
    return sums[:, :3], sums[:, 3]


def _div(a, b: int):
    """``a // b`` for non-negative int32 ``a`` with an int32 ``b``: ``//`` under x64 passes
    an int64 scalar, which Mosaic does not take."""
    return jax.lax.div(a, jnp.int32(b))


def _rem(a, b: int):
    """``a % b`` for non-negative int32 ``a``, as :func:`_div`."""
    return jax.lax.rem(a, jnp.int32(b))


def _symmetric_kernel(n_blocks, eps2_ref, targets_ref, sources_ref, out_ref, src_ref):
    """One grid cell of the Newton's-third-law sum: target block ``i`` (``block_targets``
    rows from ``r0``, inside source block ``I``) against source block ``J = (I + k) mod
    n_blocks``, ``k = 0 ... n_blocks // 2`` (a circulant schedule: each pair of source
    blocks once, none skipped; for even ``n_blocks`` the pairs ``k = n_blocks / 2`` are
    taken by the lower block). For ``k > 0`` each pair is evaluated once for both sides: the
    sources' sums of ``-a``, partial over 8 sublanes, go to the resident ``src_ref``. In
    block ``I`` itself a slab of 128 sources that meets the rows is taken one-sided by the
    targets, the self pair masked, and a slab after them both-sided; one before them is
    left to the roles swapped. The targets' ``phi`` is halved on one-sided slabs, so that
    :math:`\\sum_i m_i \\phi_i` counts each pair once."""
    i, k = pl.program_id(0), pl.program_id(1)
    bt, bs = targets_ref.shape[0], sources_ref.shape[1]
    n_slabs, n_own = bs // LANES, max(1, bt // LANES)
    r0 = i * bt
    own = _div(r0, bs)
    block = _rem(own + k, n_blocks)
    eps2 = eps2_ref[0]

    @pl.when((i == 0) & (k == 0))
    def _():
        src_ref[...] = jnp.zeros_like(src_ref)

    @pl.when(k == 0)
    def _():
        out_ref[...] = jnp.zeros_like(out_ref)

    t = targets_ref[...]
    tk = [t[:, q:q + 1] for q in range(4)]

    def slab(acc, c, both: bool):
        """Add slab ``c`` (lanes ``c*128 ...`` of the source block), both-sided or not."""
        # a static slab offset stays a Python int: under x64 it would become an int64
        # scalar, which Mosaic does not take
        c0 = c * LANES if isinstance(c, int) else pl.multiple_of(c * LANES, LANES)
        s = sources_ref[:, pl.ds(c0, LANES)]
        d = [tk[q] - s[ROWS * q:ROWS * q + 1, :] for q in range(3)]
        r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2
        if both:
            inv = jax.lax.rsqrt(r2)
        else:
            rows = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 0) + r0
            cols = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 1) + block * bs + c0
            same = rows == cols
            inv = jnp.where(same, 0.0, jax.lax.rsqrt(jnp.where(same, 1.0, r2)))
        inv3 = inv * inv * inv
        mj = s[3 * ROWS:3 * ROWS + 1, :]
        w = mj * inv3
        acc = [acc[q] + w * d[q] for q in range(3)] + [
            acc[3] + (mj * inv if both else 0.5 * (mj * inv))]
        if both:
            wi = tk[3] * inv3
            col = pl.multiple_of(block * bs + c0, LANES)
            for q in range(3):
                src_ref[ROWS * q:ROWS * (q + 1), pl.ds(col, LANES)] += jnp.sum(
                    (wi * d[q]).reshape(bt // ROWS, ROWS, LANES), axis=0)
        return acc

    zero = [jnp.zeros((bt, LANES), t.dtype) for _ in range(4)]
    half = n_blocks % 2 == 0
    other = (k > 0) & jnp.logical_not(half & (2 * k == n_blocks) & (2 * own >= n_blocks))

    @pl.when(other)
    def _():
        acc = zero
        for c in range(n_slabs):
            acc = slab(acc, c, True)
        out_ref[...] += jnp.concatenate(acc, axis=1)

    @pl.when(k == 0)
    def _():
        first = _div(r0 - own * bs, LANES)            # the first slab that meets the rows
        acc = zero
        for q in range(n_own):
            acc = slab(acc, first + q, False)
        acc = jax.lax.fori_loop(first + n_own, jnp.int32(n_slabs),
                                lambda c, acc: slab(acc, c, True), acc)
        out_ref[...] += jnp.concatenate(acc, axis=1)


@functools.partial(jax.jit, static_argnames=("block_targets", "block_sources", "interpret"))
def gravity_sums_symmetric(positions, masses, softening, *, block_targets: int = 64,
                           block_sources: int = 8192, interpret: bool = False):
    """``(a, phi_half)``: ``a`` as :func:`gravity_sums`, each pair evaluated once (Newton's
    third law), and per-body sums with :math:`\\sum_i m_i \\phi^{1/2}_i =
    \\tfrac12 \\sum_i m_i \\phi_i`, the energy's pair sum counted once."""
    n = positions.shape[0]
    dtype = positions.dtype
    bt, bs = _blocks(n, block_targets, block_sources)
    if not (bt % LANES == 0 or LANES % bt == 0):
        raise ValueError(f"block_targets={bt} must divide 128 or be a multiple of it")
    n_pad = -(-n // bs) * bs
    n_blocks = n_pad // bs
    bodies, sources, eps2 = _padded(positions, masses, softening, n_pad)
    out, src = pl.pallas_call(
        functools.partial(_symmetric_kernel, n_blocks),
        out_shape=(jax.ShapeDtypeStruct((n_pad, 4 * LANES), dtype),
                   jax.ShapeDtypeStruct((3 * ROWS, n_pad), dtype)),
        grid=(n_pad // bt, n_blocks // 2 + 1),
        in_specs=[_scalar_spec(),
                  pl.BlockSpec((bt, 4), lambda i, k: (i, ZERO)),
                  pl.BlockSpec((4 * ROWS, bs),
                               lambda i, k: (ZERO, _rem(_div(i * bt, bs) + k, n_blocks)))],
        out_specs=(pl.BlockSpec((bt, 4 * LANES), lambda i, k: (i, ZERO)),
                   pl.BlockSpec((3 * ROWS, n_pad), lambda i, k: (ZERO, ZERO))),
        compiler_params=_compiler_params(("arbitrary", "arbitrary"),
                                         _resident_bytes(n_pad, jnp.dtype(dtype).itemsize)),
        interpret=interpret,
    )(eps2, bodies, sources)
    sums = out[:n].reshape(n, 4, LANES).sum(axis=2)
    src = src[:, :n].reshape(3, ROWS, n).sum(axis=1)
    return sums[:, :3] - src.T, sums[:, 3]


RESIDENT_SLACK = 16 * 2**20
"""VMEM the symmetric kernel asks for beyond its resident source sums: its tiles, double
buffered, with room to spare."""


def _resident_bytes(n_pad: int, itemsize: int) -> int:
    """VMEM of :func:`gravity_sums_symmetric`: its resident source sums (``24 x n_pad``
    values) and :data:`RESIDENT_SLACK`."""
    return 3 * ROWS * n_pad * itemsize + RESIDENT_SLACK


def symmetric_fits(n: int, itemsize: int, vmem_capacity: int | None,
                   block_targets: int = 64, block_sources: int = 8192) -> bool:
    """Whether :func:`gravity_sums_symmetric`'s VMEM (:func:`_resident_bytes`) fits the
    core's; ``None`` (not known) is no."""
    _, bs = _blocks(n, block_targets, block_sources)
    return (vmem_capacity is not None
            and _resident_bytes(-(-n // bs) * bs, itemsize) <= vmem_capacity)


def vmem_capacity() -> int | None:
    """VMEM bytes per TensorCore of the default TPU, or ``None`` off a TPU."""
    try:
        from jax.experimental.pallas import tpu as pltpu
        return int(pltpu.get_tpu_info().vmem_capacity_bytes)
    except Exception:  # not a TPU, or a JAX without the query: take the one-sided kernel
        return None


def gravity_pair_sums(positions, masses, softening):
    """``(a, u)``: :math:`a_i = \\sum_{j \\ne i} m_j s_{ij}^3 (x_i - x_j)` and
    :math:`u = \\sum_{i<j} m_i m_j s_{ij}`, from the symmetric kernel where its resident
    sums fit VMEM (each pair once: 1.38x the one-sided kernel at 10^5 bodies on a TPU v5e,
    1.47x at 10^6), else from the one-sided :func:`gravity_sums`."""
    n, itemsize = positions.shape[0], jnp.dtype(positions.dtype).itemsize
    if symmetric_fits(n, itemsize, vmem_capacity()):
        a, phi_half = gravity_sums_symmetric(positions, masses, softening)
        return a, jnp.sum(masses * phi_half)
    a, phi = gravity_sums(positions, masses, softening)
    return a, 0.5 * jnp.sum(masses * phi)


def _padded(positions, masses, softening, n_pad: int):
    """The kernels' inputs for ``n_pad`` bodies: ``bodies`` ``(n_pad, 4)`` (x, y, z, m) as
    target rows, ``sources`` ``(32, n_pad)`` (each of the four repeated on 8 sublanes) and
    the softening's square. Padding bodies have zero mass and sit :data:`FAR` away, apart
    from each other too, so that no pair of them has ``r = 0``."""
    n, dtype = positions.shape[0], positions.dtype
    x = jnp.full((n_pad, 3), FAR, dtype).at[:n].set(positions)
    x = x.at[n:, 0].add(jnp.arange(n_pad - n, dtype=dtype) * FAR)
    m = jnp.zeros((n_pad,), dtype).at[:n].set(masses)
    bodies = jnp.concatenate([x, m[:, None]], axis=1)
    sources = jnp.repeat(bodies.T, ROWS, axis=0)
    return bodies, sources, jnp.reshape(softening * softening, (1,)).astype(dtype)


def _blocks(n: int, block_targets: int, block_sources: int) -> tuple[int, int]:
    """Tiles for ``n`` bodies: source blocks of at most ``block_sources`` lanes, shrunk so
    that padding ``n`` to whole blocks wastes little (1.5% at 10^5 bodies, where whole
    8192-lane blocks would pad by 6.5% and compute 13% more pairs); target blocks divide
    them."""
    unit = math.lcm(block_targets, LANES)
    blocks = -(-n // block_sources)
    bs = -(-n // (blocks * unit)) * unit
    return block_targets, bs


def _scalar_spec():
    """The softening's square, one value in SMEM."""
    from jax.experimental.pallas import tpu as pltpu
    return pl.BlockSpec((1,), lambda i, j: (ZERO,), memory_space=pltpu.SMEM)


def _compiler_params(semantics: tuple[str, str] = ("parallel", "arbitrary"),
                     vmem_bytes: int | None = None):
    """Mosaic's settings: the grid axes' semantics (the symmetric kernel's resident sums
    make both ``"arbitrary"``) and, where given, the VMEM limit."""
    from jax.experimental.pallas import tpu as pltpu
    extra = {} if vmem_bytes is None else dict(vmem_limit_bytes=vmem_bytes)
    return pltpu.CompilerParams(dimension_semantics=semantics, **extra)
