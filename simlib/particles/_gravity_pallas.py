r"""Direct-sum gravity as a Pallas kernel for TPUs: tiles of target rows by source lanes.

Grid cell ``(i, j)`` takes ``block_targets`` target bodies (rows) against ``block_sources``
source bodies (lanes), 128 source lanes at a time, and adds for every target
:math:`\phi_i = \sum_j m_j s_{ij}` and :math:`a_i = \sum_j m_j s_{ij}^3 (x_i - x_j)`,
:math:`s_{ij} = (r_{ij}^2 + \epsilon^2)^{-1/2}` (one ``rsqrt`` per pair), into lane-dense
partial sums that stay in VMEM while ``j`` runs and are summed over lanes at the end.
Only the cells that hold a body's own pair mask it. The force is :math:`F_i = -G m_i a_i`
and the energy :math:`U = -\tfrac12 G \sum_i m_i \phi_i`. Padding bodies have zero mass
and sit far away; their rows are dropped. Tile shapes were chosen on a TPU v5e chip
(docs/particles.md, "Accelerators").

Reference: Nyland, Harris and Prins, "Fast N-Body Simulation with CUDA", GPU Gems 3,
ch. 31 (2007): the tiled all-pairs sum this follows, with TPU tiles in place of CUDA
thread blocks. The pure-JAX kernel (``_energy._gravity_direct``) is the reference and
serves reverse mode; CI runs this kernel in Pallas's interpret mode on the CPU
(tests/test_gravity_pallas.py).
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
"""A vector register holds 8 x 128 values: 8 sublanes by 128 lanes."""


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
    x = jnp.full((n_pad, 3), FAR, dtype).at[:n].set(positions)
    # padding bodies apart from each other too, so that no pair of them has r = 0
    x = x.at[n:, 0].add(jnp.arange(n_pad - n, dtype=dtype) * FAR)
    m = jnp.zeros((n_pad,), dtype).at[:n].set(masses)
    bodies = jnp.concatenate([x, m[:, None]], axis=1)                   # (n_pad, 4)
    sources = jnp.repeat(bodies.T, ROWS, axis=0)                        # (32, n_pad)
    eps2 = jnp.reshape(softening * softening, (1,)).astype(dtype)
    out = pl.pallas_call(
        _kernel,
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


def _blocks(n: int, block_targets: int, block_sources: int) -> tuple[int, int]:
    """Tiles for ``n`` bodies: source blocks of at most ``block_sources`` lanes, shrunk so
    that padding ``n`` to whole blocks wastes little (1.5% at 10^5 bodies, where whole
    8192-lane blocks would pad by 6.5% and compute 13% more pairs); target blocks divide
    them."""
    unit = math.lcm(block_targets, LANES)
    blocks = -(-n // block_sources)
    bs = -(-n // (blocks * unit)) * unit
    return block_targets, bs


def _smem():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.SMEM


def _compiler_params():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))
