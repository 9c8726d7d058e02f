"""The Pallas gravity kernel (TPUs) against the pure-JAX direct sum and NumPy, in Pallas's
interpret mode on the CPU: tile shapes that do not divide the bodies, the self pair with
and without softening, and padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib.particles._gravity_pallas import (
    _blocks,
    gravity_sums,
    gravity_sums_symmetric,
    symmetric_fits,
)


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


@pytest.mark.parametrize("n, blocks, eps", [
    (300, (8, 128), 0.0),          # 3 source blocks: the circulant schedule, odd
    (1000, (64, 256), 0.05),       # 4 blocks, even: the middle pairs taken once
    pytest.param(900, (256, 512), 0.01,    # targets wider than a slab: two one-sided slabs
                 marks=pytest.mark.slow),  # (interpret mode: 3-9 s each)
    pytest.param(1500, (128, 256), 0.0, marks=pytest.mark.slow),  # 6 blocks, even
    pytest.param(1000, (128, 1024), 0.0, marks=pytest.mark.slow),  # one block, the diagonal
])
def test_symmetric_kernel_matches_numpy(n, blocks, eps):
    """Each pair once (Newton's third law), in Pallas's interpret mode: ``a`` per body and
    the pair sum of the energy against the float64 NumPy sum over all ordered pairs."""
    x = jax.random.normal(jax.random.key(0), (n, 3))
    m = jax.random.uniform(jax.random.key(1), (n,)) + 0.5
    a, phi_half = gravity_sums_symmetric(x, m, jnp.asarray(eps), block_targets=blocks[0],
                                         block_sources=blocks[1], interpret=True)
    a_ref, phi_ref = _numpy_sums(x, np.asarray(m), eps)
    mm = np.asarray(m)
    assert np.abs(np.asarray(a) - a_ref).max() <= 1e-12 * np.abs(a_ref).max()
    assert abs(mm @ np.asarray(phi_half) - 0.5 * mm @ phi_ref) <= 1e-12 * (mm @ phi_ref)


def _pallas_grid(fn, *args, **kw):
    jaxpr = jax.make_jaxpr(lambda *a: fn.__wrapped__(*a, **kw))(*args)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    return tuple(eqn.params["grid_mapping"].grid)


def test_symmetric_kernel_visits_each_pair_of_blocks_once():
    """The mechanism: 13 source blocks take 7 grid columns (k = 0 ... 6 of the circulant
    schedule) against the one-sided kernel's 13, for the same target rows."""
    n = 13 * 256
    x = jax.random.normal(jax.random.key(0), (n, 3), jnp.float32)
    m = jnp.ones((n,), jnp.float32)
    eps = jnp.float32(0.01)
    one = _pallas_grid(gravity_sums, x, m, eps, block_targets=64, block_sources=256)
    sym = _pallas_grid(gravity_sums_symmetric, x, m, eps, block_targets=64, block_sources=256)
    assert one == (n // 64, 13) and sym == (n // 64, 7)


@pytest.mark.parametrize("kernel", [gravity_sums, gravity_sums_symmetric])
def test_kernels_hold_no_int64_scalars_under_x64(kernel):
    """Mosaic takes no int64 scalars: under x64 (the tests' setting, and benchmarks/gpu.sh's)
    the kernel's and the index maps' integers must stay int32. Before, ``//`` passed an
    int64 and the index maps returned a literal ``0`` as int64: gpu.sh's gravity section
    failed to compile on the chip."""
    n = 1000
    x = jax.random.normal(jax.random.key(0), (n, 3), jnp.float32)
    m = jnp.ones((n,), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda x, m: kernel.__wrapped__(
        x, m, jnp.float32(0.01), block_sources=256))(x, m)
    (eqn,) = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "pallas_call"]
    assert jax.config.jax_enable_x64
    assert "i64" not in str(eqn.params["jaxpr"])
    for mapping in eqn.params["grid_mapping"].block_mappings:
        index_map = mapping.index_map_jaxpr
        assert "i64" not in str(index_map), index_map
        assert all(a.dtype == jnp.int32 for a in index_map.out_avals), index_map


@pytest.mark.parametrize("n, capacity, fits", [
    (100_000, 128 * 2**20, True),       # TPU v5e: 9.7 MB of source sums
    (1_000_000, 128 * 2**20, True),     # 96.7 MB + slack: still fits 128 MiB
    (2_000_000, 128 * 2**20, False),    # the one-sided kernel takes over
    (100_000, 16 * 2**20, False),       # a 16 MiB core (TPU v4): not even 10^5
    (100_000, None, False),             # not a TPU
])
def test_symmetric_kernel_chosen_where_its_sums_fit(n, capacity, fits):
    assert symmetric_fits(n, 4, capacity) is fits


@pytest.mark.slow  # interpret mode, two kernels batched and unbatched
@pytest.mark.parametrize("kernel", [gravity_sums, gravity_sums_symmetric])
def test_kernels_under_vmap_equal_each_system_alone(kernel):
    """An ensemble of systems: the batched kernel (the resident source sums, zeroed at the
    first cell, per system) gives each system's own sums bit for bit."""
    xs = jax.random.normal(jax.random.key(0), (2, 300, 3))
    ms = jax.random.uniform(jax.random.key(1), (2, 300)) + 0.5

    def one(x, m):
        return kernel(x, m, jnp.asarray(0.01), block_targets=8, block_sources=128,
                      interpret=True)

    a_b, phi_b = jax.vmap(one)(xs, ms)
    for i in range(2):
        a, phi = one(xs[i], ms[i])
        np.testing.assert_array_equal(a_b[i], a)
        np.testing.assert_array_equal(phi_b[i], phi)
