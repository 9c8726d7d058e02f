"""The Pallas gravity kernel (TPUs) against the pure-JAX direct sum and NumPy, in Pallas's
interpret mode on the CPU: tile shapes that do not divide the bodies, the self pair with
and without softening, and padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib.particles._gravity_pallas import _blocks, gravity_sums


def _numpy_sums(x, m, eps):
    x = np.asarray(x, np.float64)
    d = x[:, None] - x[None]
    r2 = (d**2).sum(-1) + eps**2
    own = np.eye(len(x), dtype=bool)
    s = np.where(own, 0.0, 1.0 / np.sqrt(np.where(own, 1.0, r2)))
    return ((m[None, :] * s**3)[..., None] * d).sum(1), (m[None] * s).sum(1)


@pytest.mark.parametrize("eps", [0.0, 0.05])
@pytest.mark.parametrize("blocks", [(8, 128), (16, 256)])
def test_pallas_gravity_sums_match_numpy(eps, blocks):
    n = 300                                   # pads to whole blocks of 128 or 256 lanes
    x = jax.random.normal(jax.random.key(0), (n, 3))
    m = jax.random.uniform(jax.random.key(1), (n,)) + 0.5
    a, phi = gravity_sums(x, m, jnp.asarray(eps), block_targets=blocks[0],
                          block_sources=blocks[1], interpret=True)
    a_ref, phi_ref = _numpy_sums(x, np.asarray(m), eps)
    assert np.abs(np.asarray(a) - a_ref).max() <= 1e-12 * np.abs(a_ref).max()
    assert np.abs(np.asarray(phi) - phi_ref).max() <= 1e-12 * np.abs(phi_ref).max()


def test_pallas_gravity_float32_matches_the_float64_sum():
    n = 200
    x = jax.random.normal(jax.random.key(2), (n, 3), jnp.float32)
    m = jnp.full((n,), 1.0 / n, jnp.float32)
    a, phi = gravity_sums(x, m, jnp.float32(0.01), block_targets=8, block_sources=128,
                          interpret=True)
    assert a.dtype == jnp.float32
    a_ref, phi_ref = _numpy_sums(np.asarray(x, np.float64), np.asarray(m, np.float64), 0.01)
    assert np.abs(np.asarray(a, np.float64) - a_ref).max() <= 1e-5 * np.abs(a_ref).max()
    assert np.abs(np.asarray(phi, np.float64) - phi_ref).max() <= 1e-5 * np.abs(phi_ref).max()


@pytest.mark.parametrize("n", [1, 127, 100_000, 1_000_000])
def test_blocks_pad_little_and_divide(n):
    bt, bs = _blocks(n, 64, 8192)
    n_pad = -(-n // bs) * bs
    assert bs % bt == 0 and bs % 128 == 0 and bs <= 8192
    assert n_pad - n < 128 * -(-n // 8192)    # under 128 padding bodies per source block
