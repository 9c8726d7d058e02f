"""The native PME spreading and gathering (``_native/pme.cc``) against the pure-JAX
reciprocal sum, the Ewald sum and finite differences: energy, forces, dE/dq, the box
derivative and dE/dalpha; gradients and second derivatives; vmap; the compiled gradient
holds no scatter; non-finite, huge and empty inputs in a subprocess; ``SIMLIB_NATIVE=0``
gives the same numbers."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _native_required import native, same_bits_on_one_and_two_threads, with_and_without_native

from simlib import particles as sp

GRID = (16, 18, 20)                     # not cubic, an odd factor: index order is tested


@functools.cache
def _system(n=216, seed=0):
    """Random charges of unequal size, neutral, at water's atom density (100 per nm^3);
    some positions outside the box (the spreading wraps them)."""
    L = (n / 100.0) ** (1 / 3)
    rng = np.random.default_rng(seed)
    x = rng.uniform(-0.3 * L, 1.3 * L, (n, 3))
    q = np.tile([0.8, -0.8], n // 2) * rng.uniform(0.5, 1.5, n)
    q -= q.mean()
    return x, q, np.array([L, 1.1 * L, 1.2 * L])


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


def _args(dtype, alpha=3.5):
    x, q, box = _system()
    return (jnp.asarray(x, dtype), jnp.asarray(q, dtype), jnp.asarray(box, dtype),
            jnp.asarray(alpha, dtype))


@native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("order", [pytest.param(4, marks=pytest.mark.slow), 5])
def test_native_reciprocal_matches_pure_jax(dtype, order):
    """(E, F, dE/dq, dE/dL, dE/dalpha) of native spreading + gathering against autodiff of
    the pure-JAX reciprocal sum (float64 to 1e-13, float32 to its rounding)."""
    from simlib.particles._electrostatics import _pme_reciprocal_native, _pme_reciprocal_pure
    args = _args(dtype)
    nat = jax.jit(functools.partial(_pme_reciprocal_native, GRID, order))(*args)
    ref = jax.jit(functools.partial(_pme_reciprocal_pure, GRID, order))(*args)
    tol = 1e-13 if dtype == jnp.float64 else 3e-6
    for name, a, b in zip(("energy", "forces", "dE/dq", "dE/dL", "dE/dalpha"), nat, ref,
                          strict=True):
        assert a.dtype == dtype, name
        assert _rel(a, b) < tol, name


@pytest.mark.slow
@native
def test_native_reciprocal_gradients_match_finite_differences():
    """The gradients of the public energy (through the custom_jvp) against central
    differences of the native energy: positions, charges, the box (at fixed positions)
    and alpha."""
    from simlib.particles._electrostatics import _pme_reciprocal
    x, q, box, alpha = _args(jnp.float64)
    energy = jax.jit(lambda x, q, b, a: _pme_reciprocal(GRID, 5, x, q, b, a)[0])
    grads = jax.jit(jax.grad(lambda *a: _pme_reciprocal(GRID, 5, *a)[0],
                             argnums=(0, 1, 2, 3)))(x, q, box, alpha)

    def fd(k, index, h):
        args = [x, q, box, alpha]
        plus, minus = list(args), list(args)
        plus[k] = args[k].at[index].add(h)
        minus[k] = args[k].at[index].add(-h)
        return float(energy(*plus) - energy(*minus)) / (2 * h)

    for k, index, h in ((0, (3, 0), 1e-5), (0, (100, 2), 1e-5), (1, 7, 1e-5),
                        (2, 1, 1e-6), (3, (), 1e-6)):
        g = float(grads[k][index])
        assert abs(fd(k, index, h) - g) < 1e-6 * max(abs(g), 1e-3), (k, index)


@pytest.mark.slow
@native
def test_native_pme_forces_within_tolerance_of_ewald():
    """The public PME (native reciprocal) against the Ewald sum at the requested
    relative force error (units q_rms^2 / l^2, as :func:`ewald_parameters` defines it)."""
    x, q, box = _system()
    space = sp.periodic(jnp.asarray(box))
    params = dict(charges=jnp.asarray(q))
    xs = jnp.asarray(x)
    tolerance = 1e-5
    _, f = sp.pme(space, 0.6, tolerance=tolerance).energy_and_forces(xs, params)
    _, f_ref = sp.ewald(space, 0.6, tolerance=1e-9).energy_and_forces(xs, params)
    unit = np.mean(q**2) / (np.prod(box) / len(q)) ** (2 / 3)
    rms = np.sqrt(np.mean(np.sum((np.asarray(f) - np.asarray(f_ref)) ** 2, axis=1)))
    assert rms / unit < tolerance


@native
def test_gradient_holds_no_scatter_and_one_spread_and_gather():
    """The mechanism: reverse mode through the PME energy and the virial runs the native
    spreading and gathering once each and no XLA scatter (the pure-JAX spreading is a
    scatter-add, and its gradient would be there if the custom_jvp leaked it)."""
    x, q, box, _ = _args(jnp.float64)
    energy = sp.pme(sp.periodic(box), 0.6, alpha=3.5, grid=GRID)

    def text(fn, *args):
        return jax.jit(fn).lower(*args).compile().as_text()

    forces = text(lambda x, q: energy.energy_and_forces(x, dict(charges=q)), x, q)
    virial = text(lambda x, q: energy.virial_tensor(x, dict(charges=q)), x, q)
    for t in (forces, virial):
        assert " scatter(" not in t                        # the HLO op
        assert t.count('custom_call_target="simlib_pme_spread_f64"') == 1
        assert t.count('custom_call_target="simlib_pme_gather_f64"') == 1
    pure = text(lambda x, q: energy.spread(x, q, box), x, q)
    assert " scatter(" in pure                              # the check above can fail


@pytest.mark.slow
@native
def test_native_reciprocal_second_derivatives_and_vmap():
    """A Hessian-vector product of the energy (the forces' tangent, from the pure-JAX
    path) and a vmapped call equal the pure-JAX ones."""
    from simlib.particles._electrostatics import _pme_reciprocal, _pme_reciprocal_pure
    x, q, box, alpha = _args(jnp.float64)
    v = jnp.asarray(np.random.default_rng(1).normal(size=x.shape))

    def hvp(fn):
        return jax.jit(lambda x: jax.jvp(lambda x: fn(GRID, 5, x, q, box, alpha)[1],
                                         (x,), (v,))[1])(x)

    assert _rel(hvp(_pme_reciprocal), hvp(_pme_reciprocal_pure)) < 1e-11
    batch = jnp.stack([x, x + 0.01 * jnp.sin(x)])
    e_b, f_b, *_ = jax.jit(jax.vmap(lambda x: _pme_reciprocal(GRID, 5, x, q, box, alpha)))(
        batch)
    for k in range(2):
        e, f, *_ = _pme_reciprocal_pure(GRID, 5, batch[k], q, box, alpha)
        assert abs(float(e_b[k] - e)) < 1e-13 * abs(float(e))
        assert _rel(f_b[k], f) < 1e-12


@pytest.mark.slow
@native
def test_spreading_is_deterministic_across_thread_counts(tmp_path):
    """Each grid point receives its contributions in particle order whatever the thread
    count: one and two OpenMP threads give the same bits."""
    same_bits_on_one_and_two_threads(_THREADS_SCRIPT, tmp_path)


_THREADS_SCRIPT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib.particles import _native
    from simlib.particles._electrostatics import _pme_spread_ffi
    assert _native.load() is not None
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.uniform(0, 2.0, (500, 3)))
    q = jnp.asarray(rng.normal(size=500))
    grid = _pme_spread_ffi((24, 20, 18), 5, x, q, jnp.full(3, 2.0))
    np.save(sys.argv[1], np.asarray(grid))
""")

_EXTREME_SCRIPT = textwrap.dedent("""
    import sys, pickle
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib.particles import _native
    from simlib.particles._electrostatics import (_pme_reciprocal_native,
                                                  _pme_reciprocal_pure)
    assert _native.load() is not None
    cases = pickle.load(open(sys.argv[1], "rb"))
    out = {}
    for name, (x, q, box) in cases.items():
        args = (jnp.asarray(x), jnp.asarray(q), jnp.asarray(box),
                jnp.asarray(3.0, x.dtype))
        res = []
        for fn in (_pme_reciprocal_native, _pme_reciprocal_pure):
            try:
                res.append([np.asarray(v) for v in jax.jit(
                    lambda *a, fn=fn: fn((12, 12, 12), 5, *a))(*args)])
            except Exception as err:      # an FFI error is a Python exception, not a crash
                res.append(str(err))
        out[name] = res
    pickle.dump(out, open(sys.argv[2], "wb"))
""")


@pytest.mark.slow
@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_spreading_survives_extreme_positions(tmp_path, dtype):
    """NaN, inf, huge and empty inputs (in a subprocess: no crash). A non-finite position
    makes the energy and every force NaN, as in the pure-JAX sum; a huge finite one gives
    finite numbers; no particles give zero energy; finite cases equal the pure-JAX sum."""
    import pickle
    rng = np.random.default_rng(5)
    n, L = 60, 2.0
    x = rng.uniform(0, L, (n, 3)).astype(dtype)
    q = np.tile([1.0, -1.0], n // 2).astype(dtype)
    box = np.full(3, L, dtype)
    variants = {k: x.copy() for k in ("normal", "nan", "inf", "-inf", "huge", "far")}
    variants["nan"][4, 1] = np.nan
    variants["inf"][5, 0] = np.inf
    variants["-inf"][6, 2] = -np.inf
    variants["huge"][6] = 1e30 if dtype == np.float64 else 1e18
    variants["far"][7] = [-1e4 * L + 0.3, 3e3 * L + 0.1, -7.5]     # wrapped exactly enough
    cases = {k: (v, q, box) for k, v in variants.items()}
    cases["empty"] = (np.zeros((0, 3), dtype), np.zeros(0, dtype), box)
    src, dst = tmp_path / "cases.pkl", tmp_path / "out.pkl"
    src.write_bytes(pickle.dumps(cases))
    run = subprocess.run([sys.executable, "-c", _EXTREME_SCRIPT, str(src), str(dst)],
                         env=dict(os.environ, SIMLIB_NATIVE="1"), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-2500:]}"
    out = pickle.loads(dst.read_bytes())
    tol = 1e-12 if dtype == np.float64 else 3e-5
    for name in ("nan", "inf", "-inf"):
        (e, f, *_), (e_ref, f_ref, *_) = out[name]
        assert np.isnan(e) and not np.isfinite(e_ref), name
        assert np.all(np.isnan(f)) and not np.any(np.isfinite(f_ref)), name
    (e, f, *_), _ = out["huge"]
    assert np.isfinite(e) and np.all(np.isfinite(f))
    for name in ("normal", "far"):
        (e, f, *_), (e_ref, f_ref, *_) = out[name]
        assert abs(e - e_ref) <= tol * abs(e_ref), name
        assert _rel(f, f_ref) < tol, name
    (e, f, phi, gb, ga), _ = out["empty"]
    assert e == 0 and f.shape == (0, 3) and phi.shape == (0,) and np.all(gb == 0) and ga == 0


_FALLBACK_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib import particles as sp
    from simlib.particles import _native
    water = sp.spce_water(64, key=jax.random.key(2))
    energy = sp.spce_energy(water, 0.45, tolerance=1e-5)
    e, f = energy.energy_and_forces(water.positions, water.params)
    w = energy.virial(water.positions, water.params)
    np.savez(sys.argv[1], e=float(e), f=np.asarray(f), w=float(w),
             native=_native.load() is not None)
""")


@pytest.mark.slow
@native
def test_water_reciprocal_equals_the_simlib_native_0_fallback(tmp_path):
    """SPC/E water without a neighbour list (only the reciprocal part is native): energy,
    forces and virial with and without the native kernels."""
    a, b = with_and_without_native(_FALLBACK_SCRIPT, tmp_path)
    np.testing.assert_allclose(a["e"], b["e"], rtol=1e-12)
    np.testing.assert_allclose(a["f"], b["f"], atol=1e-11 * np.max(np.abs(b["f"])))
    np.testing.assert_allclose(a["w"], b["w"], rtol=1e-11)
