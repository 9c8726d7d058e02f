"""The optional native CPU kernels against simlib's pure-JAX kernels and numpy.

The pure-JAX paths are the reference: the native kernels must give the same forces,
energies and neighbour sets, and simlib must work unchanged without them.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from simlib import particles as sp
from simlib.particles import _native
from simlib.particles._neighbors import _build_native, _build_pure

native = pytest.mark.skipif(_native.load() is None, reason="no native kernels on this machine")


def _numpy_gravity(x, m, G, eps):
    d = x[None, :, :] - x[:, None, :]
    r2 = np.sum(d * d, -1) + eps**2
    np.fill_diagonal(r2, np.inf)
    inv = r2 ** -0.5
    forces = G * m[:, None] * np.sum((m[None, :] * inv**3)[:, :, None] * d, axis=1)
    energy = -0.5 * G * np.sum(m[:, None] * m[None, :] * inv)
    return energy, forces


@native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_native_gravity_matches_numpy_and_pure_jax(dtype):
    x, _, m = sp.plummer(300, key=jax.random.key(3), dtype=dtype)
    m = m * (1.0 + jnp.arange(300, dtype=dtype) / 300)
    params = dict(G=1.5, softening=0.05, masses=m)
    energy = sp.pair_energy(sp.gravity, sp.free())
    assert energy._native_gravity(x, params, None)
    e_nat, f_nat = jax.jit(energy.energy_and_forces)(x, params)
    e_jax, f_jax = jax.jit(energy._energy_and_forces)(x, params)
    e_np, f_np = _numpy_gravity(np.asarray(x, np.float64), np.asarray(m, np.float64), 1.5, 0.05)
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    scale = np.max(np.abs(f_np))
    assert abs(float(e_nat) - e_np) < tol * abs(e_np)
    assert np.max(np.abs(np.asarray(f_nat, np.float64) - f_np)) < tol * scale
    assert np.max(np.abs(np.asarray(f_nat) - np.asarray(f_jax))) < tol * scale
    assert abs(float(e_nat) - float(e_jax)) < tol * abs(e_np)


@native
def test_native_gravity_gradients_equal_the_pure_jax_ones():
    x, _, m = sp.plummer(64, key=jax.random.key(4))
    params = dict(G=1.0, softening=0.1, masses=m)
    energy = sp.pair_energy(sp.gravity, sp.free())

    def loss(fn):
        return lambda x, p: jnp.sum(jnp.sin(fn(x, p)[1])) + fn(x, p)[0]

    g_nat = jax.grad(loss(energy.energy_and_forces), argnums=(0, 1))(x, params)
    g_jax = jax.grad(loss(energy._energy_and_forces), argnums=(0, 1))(x, params)
    for a, b in zip(jax.tree_util.tree_leaves(g_nat), jax.tree_util.tree_leaves(g_jax),
                    strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@native
@pytest.mark.parametrize("dim,periodic", [(3, True), (2, True), (3, False), (2, False)])
def test_native_neighbor_build_equals_pure_build(dim, periodic):
    key = jax.random.key(dim + 10 * periodic)
    n = 600
    box = (n / 0.7) ** (1 / dim)
    x = jax.random.uniform(key, (n, dim)) * box
    space = sp.periodic(box) if periodic else sp.free()
    nbrs = sp.neighbor_list(space, x, r_cut=1.2, skin=0.2)
    assert nbrs.grid is not None
    x2 = x + 0.3 * jax.random.normal(jax.random.key(1), x.shape)   # unwrapped positions too
    for pos in (x, x2):
        a = jax.jit(_build_pure)(nbrs, pos)
        b = jax.jit(_build_native)(nbrs, pos)
        assert int(a[1]) == int(b[1])              # largest neighbour count
        assert int(a[3]) == int(b[3])              # largest cell occupancy
        rows_a = np.sort(np.asarray(a[0]), axis=1)
        rows_b = np.sort(np.asarray(b[0]), axis=1)
        np.testing.assert_array_equal(rows_a, rows_b)
        assert rows_b.max() == n                   # padded with n


def test_everything_works_without_native_kernels(tmp_path):
    script = (
        "import jax, numpy as np\n"
        "from simlib import particles as sp\n"
        "from simlib.particles import _native\n"
        "assert _native.load() is None\n"
        "x, box = sp.lattice(4, 0.8)\n"
        "space = sp.periodic(box)\n"
        "e = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)\n"
        "nb = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)\n"
        "p = dict(sigma=1.0, epsilon=1.0)\n"
        "assert abs(float(e(x, p, neighbors=nb)) - float(e(x, p))) < 1e-3\n"
        "g = sp.pair_energy(sp.gravity, sp.free())\n"
        "q, v, m = sp.plummer(50, key=jax.random.key(0))\n"
        "print(float(g.energy_and_forces(q, dict(G=1.0, softening=0.1, masses=m))[0]))\n"
    )
    env = dict(os.environ, SIMLIB_NATIVE="0")
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert np.isfinite(float(run.stdout.strip().splitlines()[-1]))


def test_loading_native_kernels_keeps_subnormal_floats():
    """The library must not switch the process to flush-to-zero (as -ffast-math would).
    (XLA's own CPU kernels flush subnormals inside their computations; numpy must not.)"""
    _native.load()
    tiny64 = np.float64(1e-310)
    tiny32 = np.float32(1e-40)
    assert tiny64 * np.float64(1.0) != 0.0
    assert tiny32 * np.float32(1.0) != 0.0
