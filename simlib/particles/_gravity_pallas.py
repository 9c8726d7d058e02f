r"""Direct-sum gravity as a Pallas kernel for TPUs: square tiles of target and source bodies.

Each grid cell ``(i, j)`` takes ``block`` targets (sublanes) against ``block`` sources
(lanes) and adds, for every target, :math:`\phi_i = \sum_j m_j s_{ij}` and
:math:`a_i = \sum_j m_j s_{ij}^3 (x_i - x_j)` with :math:`s_{ij} = (r_{ij}^2 +
\epsilon^2)^{-1/2}` (one ``rsqrt`` per pair) into the target's row of the output, which
stays in VMEM while ``j`` runs. Only the diagonal tiles (``i == j``) mask the self pair.
The force is :math:`F_i = -G m_i a_i` and the energy :math:`U = -\tfrac12 G \sum_i m_i
\phi_i`. Padding bodies have zero mass, sit far away, and their rows are dropped.

Reference: Nyland, Harris and Prins, "Fast N-Body Simulation with CUDA", GPU Gems 3,
ch. 31 (2007): the tiled all-pairs sum this follows, with TPU tiles in place of CUDA
thread blocks. The pure-JAX kernel (``_energy._gravity_direct``) is the reference; CI
runs this one in Pallas's interpret mode on the CPU (tests/test_gravity_pallas.py).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

FAR = 1.0e15
"""Where padding bodies sit: far enough that their pull is zero in float32 and float64."""


ROWS, LANES = 8, 128
"""One vector register's tile: 8 target bodies (sublanes) by 128 source bodies (lanes)."""


def _kernel(eps2_ref, targets_ref, sources_ref, out_ref, *, unroll: int):
    """One grid cell: ``block_targets`` rows against ``block_sources`` lanes, a register
    tile (8 x 128 pairs) at a time, the four sums of a row group kept in registers."""
    i, j = pl.program_id(0), pl.program_id(1)
    bt, bs = targets_ref.shape[0], sources_ref.shape[1]
    eps2 = eps2_ref[0]

    @pl.when(j == 0)
    def _():
        out_ref[...] = jnp.zeros_like(out_ref)

    def tiles(masked: bool):
        def row_group(r, carry):
            t = targets_ref[pl.ds(r * ROWS, ROWS), :]                      # (8, 4)
            tk = [jnp.broadcast_to(t[:, k:k + 1], (ROWS, LANES)) for k in range(3)]

            def source_chunk(c, acc):
                lane0 = pl.multiple_of(c * LANES, LANES)
                s = [sources_ref[pl.ds(ROWS * k, ROWS), pl.ds(lane0, LANES)]
                     for k in range(4)]                                     # 4 x (8, 128)
                d = [tk[k] - s[k] for k in range(3)]
                r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2
                if masked:
                    rows = (jax.lax.broadcasted_iota(jnp.int32, (ROWS, LANES), 0)
                            + i * bt + r * ROWS)
                    cols = (jax.lax.broadcasted_iota(jnp.int32, (ROWS, LANES), 1)
                            + j * bs + lane0)
                    same = rows == cols
                    inv = jnp.where(same, 0.0, jax.lax.rsqrt(jnp.where(same, 1.0, r2)))
                else:
                    inv = jax.lax.rsqrt(r2)
                ms = s[3] * inv
                w = ms * inv * inv
                return (acc[0] + w * d[0], acc[1] + w * d[1], acc[2] + w * d[2], acc[3] + ms)

            zero = jnp.zeros((ROWS, LANES), t.dtype)
            acc = jax.lax.fori_loop(0, bs // LANES, source_chunk, (zero,) * 4,
                                    unroll=unroll)
            out_ref[pl.ds(r * ROWS, ROWS), :] += jnp.concatenate(acc, axis=1)
            return carry

        jax.lax.fori_loop(0, bt // ROWS, row_group, 0)

    overlap = (i * bt < (j + 1) * bs) & (j * bs < (i + 1) * bt)

    @pl.when(jnp.logical_not(overlap))
    def _():
        tiles(False)

    @pl.when(overlap)
    def _():
        tiles(True)


def _kernel_slabs(eps2_ref, targets_ref, sources_ref, out_ref, *, unroll: int):
    """As :func:`_kernel`, with all ``block_targets`` rows at once against each chunk of 128
    source lanes (slabs of ``block_targets x 128`` pairs)."""
    del unroll
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


@functools.partial(jax.jit, static_argnames=("block_targets", "block_sources", "unroll",
                                             "slabs", "interpret"))
def gravity_sums(positions, masses, softening, *, block_targets: int = 512,
                 block_sources: int = 2048, unroll: int = 4, slabs: bool = False,
                 interpret: bool = False):
    """``(a, phi)``: per body :math:`\\sum_j m_j s_{ij}^3 (x_i - x_j)` and
    :math:`\\sum_j m_j s_{ij}`, ``j != i``, of ``n`` bodies in 3D, from the tiled kernel."""
    n = positions.shape[0]
    dtype = positions.dtype
    bt, bs = block_targets, block_sources
    n_pad = -(-n // math.lcm(bt, bs)) * math.lcm(bt, bs)
    x = jnp.full((n_pad, 3), FAR, dtype).at[:n].set(positions)
    # padding bodies apart from each other too, so that no pair of them has r = 0
    x = x.at[n:, 0].add(jnp.arange(n_pad - n, dtype=dtype) * FAR)
    m = jnp.zeros((n_pad,), dtype).at[:n].set(masses)
    bodies = jnp.concatenate([x, m[:, None]], axis=1)                   # (n_pad, 4)
    sources = jnp.repeat(bodies.T, ROWS, axis=0)                        # (32, n_pad)
    eps2 = jnp.reshape(softening * softening, (1,)).astype(dtype)
    out = pl.pallas_call(
        functools.partial(_kernel_slabs if slabs else _kernel,
                          unroll=min(unroll, bs // LANES)),
        out_shape=jax.ShapeDtypeStruct((n_pad, 4 * LANES), dtype),
        grid=(n_pad // bt, n_pad // bs),
        in_specs=[pl.BlockSpec(memory_space=_smem()),
                  pl.BlockSpec((bt, 4), lambda i, j: (i, 0)),
                  pl.BlockSpec((4 * ROWS, bs), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((bt, 4 * LANES), lambda i, j: (i, 0)),
        compiler_params=_compiler_params(),
        interpret=interpret,
    )(eps2, bodies, sources)
    sums = out[:n].reshape(n, 4, LANES).sum(axis=2)
    return sums[:, :3], sums[:, 3]


def _smem():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.SMEM


def _compiler_params():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))
