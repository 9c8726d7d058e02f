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

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

FAR = 1.0e15
"""Where padding bodies sit: far enough that their pull is zero in float32 and float64."""


def _kernel(eps2_ref, targets_ref, sources_ref, out_ref, *, lanes: int):
    """One tile: ``block`` targets (rows) against ``block`` sources, in chunks of ``lanes``
    source lanes whose sums stay lane-dense, (block, lanes) per quantity, until the end."""
    i, j = pl.program_id(0), pl.program_id(1)

    @pl.when(j == 0)
    def _():
        out_ref[...] = jnp.zeros_like(out_ref)

    t = targets_ref[...]                      # (block, 4): x, y, z, m per target row
    block = t.shape[0]
    eps2 = eps2_ref[0]

    def tile(diagonal: bool):
        acc = [jnp.zeros((block, lanes), t.dtype) for _ in range(4)]
        for c in range(block // lanes):
            s = sources_ref[:, c * lanes:(c + 1) * lanes]     # (4, lanes)
            d = [t[:, k:k + 1] - s[k:k + 1, :] for k in range(3)]
            r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2
            if diagonal:
                rows = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 0)
                cols = jax.lax.broadcasted_iota(jnp.int32, r2.shape, 1) + c * lanes
                self_pair = rows == cols
                inv = jnp.where(self_pair, 0.0, jax.lax.rsqrt(jnp.where(self_pair, 1.0, r2)))
            else:
                inv = jax.lax.rsqrt(r2)
            ms = s[3:4, :] * inv
            w = ms * inv * inv
            for k in range(3):
                acc[k] = acc[k] + w * d[k]
            acc[3] = acc[3] + ms
        out_ref[...] += jnp.concatenate(acc, axis=1)

    @pl.when(i != j)
    def _():
        tile(False)

    @pl.when(i == j)
    def _():
        tile(True)


@functools.partial(jax.jit, static_argnames=("block", "lanes", "interpret"))
def gravity_sums(positions, masses, softening, *, block: int = 512, lanes: int = 128,
                 interpret: bool = False):
    """``(a, phi)``: per body :math:`\\sum_j m_j s_{ij}^3 (x_i - x_j)` and
    :math:`\\sum_j m_j s_{ij}`, ``j != i``, of ``n`` bodies in 3D, from the tiled kernel."""
    n = positions.shape[0]
    dtype = positions.dtype
    n_pad = -(-n // block) * block
    x = jnp.full((n_pad, 3), FAR, dtype).at[:n].set(positions)
    # padding bodies apart from each other too, so that no pair of them has r = 0
    x = x.at[n:, 0].add(jnp.arange(n_pad - n, dtype=dtype) * FAR)
    m = jnp.zeros((n_pad,), dtype).at[:n].set(masses)
    bodies = jnp.concatenate([x, m[:, None]], axis=1)          # (n_pad, 4)
    eps2 = jnp.reshape(softening * softening, (1,)).astype(dtype)
    grid = (n_pad // block, n_pad // block)
    out = pl.pallas_call(
        functools.partial(_kernel, lanes=lanes),
        out_shape=jax.ShapeDtypeStruct((n_pad, 4 * lanes), dtype),
        grid=grid,
        in_specs=[pl.BlockSpec(memory_space=_smem()),
                  pl.BlockSpec((block, 4), lambda i, j: (i, 0)),
                  pl.BlockSpec((4, block), lambda i, j: (0, j))],
        out_specs=pl.BlockSpec((block, 4 * lanes), lambda i, j: (i, 0)),
        compiler_params=_compiler_params(),
        interpret=interpret,
    )(eps2, bodies, bodies.T)
    sums = out[:n].reshape(n, 4, lanes).sum(axis=2)
    return sums[:, :3], sums[:, 3]


def _smem():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.SMEM


def _compiler_params():
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary"))
