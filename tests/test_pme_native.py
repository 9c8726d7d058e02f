"""The native real-space Ewald kernel (``_native/ewald.cc``) against the pure-JAX pair sum
and finite differences: energy, forces, virial, gradients with respect to charges, alpha
and positions, under jit and vmap; exclusions (SPC/E water) exact; non-finite positions
give non-finite results, never a crash; ``SIMLIB_NATIVE=0`` gives the same numbers."""

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
from _native_required import native, with_and_without_native

from simlib import particles as sp

R_CUT = 0.7


@functools.cache
def _system(n=512, seed=0):
    """Random +-charges of unequal size at water's atom density (100 per nm^3)."""
    L = (n / 100.0) ** (1 / 3)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, L, (n, 3))
    q = np.tile([0.8, -0.8], n // 2) * rng.uniform(0.5, 1.5, n)
    q -= q.mean()
    return x, q, L


def _energy(L, dtype=jnp.float64, r_cut=R_CUT):
    box = jnp.full(3, L, dtype)
    return sp.pme(sp.periodic(box), r_cut, alpha=3.5, grid=16)     # small grid: fast tests


SMALL, SMALL_CUT = 216, 0.5            # the default tests' system: box 1.29, r_c + skin 0.6


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.max(np.abs(a - b)) / np.max(np.abs(b))


@native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_native_real_space_matches_pure_jax(dtype):
    """Energy, forces, dU/dq, the box derivative and dU/dalpha of the kernel against the
    pure-JAX pair sum over the same list (float64 to 1e-13, float32 to its rounding)."""
    from simlib.particles._electrostatics import _ewald_real_ffi, _ewald_real_pure
    x, q, L = _system(SMALL)
    xs, qs = jnp.asarray(x, dtype), jnp.asarray(q, dtype)
    nbrs = sp.neighbor_list(sp.periodic(L), xs, r_cut=SMALL_CUT, skin=0.1)
    args = (xs, nbrs.idx, qs, jnp.full(3, L, dtype), jnp.asarray(4.5, dtype))
    nat = _ewald_real_ffi(SMALL_CUT, *args)
    ref = jax.jit(functools.partial(_ewald_real_pure, SMALL_CUT))(*args)
    tol = 1e-13 if dtype == jnp.float64 else 3e-6
    for name, a, b in zip(("energy", "forces", "dU/dq", "dU/dL", "dU/dalpha"), nat, ref,
                          strict=True):
        assert a.dtype == dtype, name
        assert _rel(a, b) < tol, name


@pytest.mark.slow
@native
def test_pme_with_native_pairs_equals_all_pairs_and_finite_differences():
    """The public PME with a neighbour list (the native pair sum) against the all-pairs
    pure-JAX sum: energy, forces, virial tensor, dU/dq, dU/dalpha; and forces, dU/dq and
    the virial against central differences of the native energy."""
    x, q, L = _system()
    energy = _energy(L)
    xs, params = jnp.asarray(x), dict(charges=jnp.asarray(q))
    nbrs = sp.neighbor_list(sp.periodic(L), xs, r_cut=R_CUT, skin=0.1)
    ef = jax.jit(lambda E, x, p, nb: E.energy_and_forces(x, p, nb))
    e1, f1 = ef(energy, xs, params, nbrs)
    e0, f0 = ef(energy, xs, params, None)
    assert abs(float(e1 - e0)) < 1e-12 * abs(float(e0))
    assert _rel(f1, f0) < 1e-12
    w1 = jax.jit(lambda E, x, p, nb: E.virial_tensor(x, p, nb))(energy, xs, params, nbrs)
    w0 = jax.jit(lambda E, x, p: E.virial_tensor(x, p))(energy, xs, params)
    assert _rel(w1, w0) < 1e-12

    def u(E, x, q, nb):
        return E(x, dict(charges=q), nb)

    g1 = jax.jit(jax.grad(u, argnums=(0, 1, 2)))(energy, xs, params["charges"], nbrs)
    g0 = jax.jit(jax.grad(u, argnums=(0, 1, 2)))(energy, xs, params["charges"], None)
    # dU/dalpha nearly cancels between real and reciprocal space: compare on U/alpha
    assert abs(float(g1[0].alpha - g0[0].alpha)) < 1e-12 * abs(float(e0) / 3.5)
    assert _rel(g1[1], -f0) < 1e-12                       # dU/dx = -F
    assert _rel(g1[2], g0[2]) < 1e-12                     # dU/dq

    e_of = jax.jit(u)
    h = 1e-5
    for i, a in ((0, 0), (17, 2)):
        step = jnp.zeros_like(xs).at[i, a].set(h)
        fd = (e_of(energy, xs + step, params["charges"], nbrs)
              - e_of(energy, xs - step, params["charges"], nbrs)) / (2 * h)
        assert abs(float(-fd - f1[i, a])) < 1e-6 * abs(float(f1[i, a]))
    for i in (3, 250):
        step = jnp.zeros_like(params["charges"]).at[i].set(h)
        fd = (e_of(energy, xs, params["charges"] + step, nbrs)
              - e_of(energy, xs, params["charges"] - step, nbrs)) / (2 * h)
        assert abs(float(fd - g1[2][i])) < 1e-7 * abs(float(g1[2][i]))
    # W_xx = -L dU/dL at fixed scaled coordinates (alpha and grid held fixed). The cutoff is
    # not scaled, so pairs that cross it make the energy jump by erfc(alpha r_c) q_i q_j/r_c:
    # a larger alpha (erfc(alpha r_c) ~ 1e-8) and a small step keep that out of the
    # difference.
    h = 1e-7
    lam = np.array([1.0 + h, 1.0, 1.0])
    sharp = sp.pme(sp.periodic(jnp.full(3, L)), R_CUT, alpha=5.5, grid=16)
    w = sharp.virial_tensor(xs, params, nbrs)
    wide, narrow = (sp.pme(sp.periodic(jnp.asarray(L * s, jnp.float64)), R_CUT,
                           alpha=5.5, grid=16)
                    for s in (lam, 2.0 - lam))
    fd = (e_of(wide, xs * lam, params["charges"], nbrs)
          - e_of(narrow, xs * (2.0 - lam), params["charges"], nbrs)) / (2 * h)
    assert abs(float(-fd - w[0])) < 1e-6 * abs(float(w[0]))


@pytest.mark.slow
@native
def test_native_pairs_under_vmap_and_second_derivatives():
    """vmap over configurations equals one call each; a Hessian-vector product (the
    derivative of the forces, from the pure-JAX tangents) equals the all-pairs one."""
    x, q, L = _system()
    energy = _energy(L)
    xs, params = jnp.asarray(x), dict(charges=jnp.asarray(q))
    nbrs = sp.neighbor_list(sp.periodic(L), xs, r_cut=R_CUT, skin=0.15)
    batch = jnp.stack([xs, xs + 0.01 * jnp.sin(xs)])
    ef = jax.jit(jax.vmap(lambda x: energy.energy_and_forces(x, params, nbrs)))
    e_b, f_b = ef(batch)
    for k in range(2):
        e, f = energy.energy_and_forces(batch[k], params, nbrs)
        # (the batched FFT and scatter of the reciprocal part may round differently)
        assert abs(float(e_b[k] - e)) < 1e-13 * abs(float(e))
        assert _rel(f_b[k], f) < 1e-13
    v = jnp.asarray(np.random.default_rng(1).normal(size=xs.shape))

    def hvp(nb):
        return jax.jvp(lambda x: energy.energy_and_forces(x, params, nb)[1], (xs,), (v,))[1]

    assert _rel(jax.jit(hvp)(nbrs), jax.jit(hvp)(None)) < 1e-11


@native
def test_gradient_of_the_native_energy_is_one_kernel_call():
    """The mechanism: reverse mode through the energy and the virial uses the kernel's own
    derivatives, so the compiled gradient holds no (n, capacity) pair array (the pure-JAX
    pass would)."""
    x, q, L = _system(SMALL)
    energy = _energy(L, r_cut=SMALL_CUT)
    xs, qs = jnp.asarray(x), jnp.asarray(q)
    nbrs = sp.neighbor_list(sp.periodic(L), xs, r_cut=SMALL_CUT, skin=0.1)
    pair_shape = f"f64[{xs.shape[0]},{nbrs.idx.shape[1]}]"

    def grad_text(fn):
        return jax.jit(fn).lower(energy, xs, qs, nbrs).compile().as_text()

    g = grad_text(lambda E, x, q, nb: jax.grad(lambda x, q: E(x, dict(charges=q), nb),
                                               argnums=(0, 1))(x, q))
    w = grad_text(lambda E, x, q, nb: E.virial_tensor(x, dict(charges=q), nb))
    for text in (g, w):
        assert "simlib_ewald_f64" in text
        assert pair_shape not in text
    # the pure-JAX path does build such arrays (so the check above can fail)
    pure = jax.jit(lambda E, x, q, nb: E._real._energy_and_forces(
        x, E._real_params(q), nb)).lower(energy, xs, qs, nbrs).compile().as_text()
    assert pair_shape in pure


@pytest.mark.slow
@native
def test_water_with_native_pairs_equals_all_pairs_with_exclusions():
    """SPC/E water (intramolecular exclusions; Lennard-Jones and PME over one list):
    energy, forces and virial with the native kernels equal the all-pairs pure-JAX sums."""
    water = sp.spce_water(125, key=jax.random.key(2))
    energy = sp.spce_energy(water, 0.6, tolerance=1e-5)
    space = sp.periodic(water.box)
    nbrs = sp.neighbor_list(space, water.positions, r_cut=0.6, skin=0.05)
    ef = jax.jit(lambda x, nb: energy.energy_and_forces(x, water.params, nb))
    e1, f1 = ef(water.positions, nbrs)
    e0, f0 = ef(water.positions, None)
    assert abs(float(e1 - e0)) < 1e-12 * abs(float(e0))
    assert _rel(f1, f0) < 1e-11
    w1 = energy.virial(water.positions, water.params, nbrs)
    w0 = energy.virial(water.positions, water.params)
    assert abs(float(w1 - w0)) < 1e-11 * abs(float(w0))


@pytest.mark.slow
@native
def test_native_pairs_are_bit_identical_between_calls():
    x, q, L = _system()
    energy = _energy(L)
    xs, params = jnp.asarray(x), dict(charges=jnp.asarray(q))
    nbrs = sp.neighbor_list(sp.periodic(L), xs, r_cut=R_CUT, skin=0.1)
    call = jax.jit(lambda x, nb: energy.energy_and_forces(x, params, nb))
    e0, f0 = call(xs, nbrs)
    for _ in range(10):
        e, f = call(xs, nbrs)
        assert float(e) == float(e0)
        np.testing.assert_array_equal(np.asarray(f), np.asarray(f0))


_EXTREME_SCRIPT = textwrap.dedent("""
    import sys, pickle
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib.particles import _native
    from simlib.particles._electrostatics import _ewald_real_ffi, _ewald_real_pure
    assert _native.load() is not None
    cases = pickle.load(open(sys.argv[1], "rb"))
    out = {}
    for name, (x, idx, ref_idx, q, box, alpha) in cases.items():
        args = (jnp.asarray(x), jnp.asarray(idx, jnp.int32), jnp.asarray(q),
                jnp.asarray(box), jnp.asarray(alpha))
        ref_args = (args[0], jnp.asarray(ref_idx, jnp.int32), *args[2:])
        try:
            nat = [np.asarray(v) for v in _ewald_real_ffi(0.7, *args)]
        except Exception as err:          # an FFI error is a Python exception, not a crash
            nat = str(err)
        try:
            ref = [np.asarray(v) for v in _ewald_real_pure(0.7, *ref_args)]
        except Exception as err:
            ref = str(err)
        out[name] = (nat, ref)
    pickle.dump(out, open(sys.argv[2], "wb"))
""")


@pytest.mark.slow
@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_kernel_survives_non_finite_positions(tmp_path, dtype):
    """NaN, inf and huge positions, overlapping atoms and junk neighbour indices: no crash
    (the kernel runs in a subprocess); rows that are finite in the pure-JAX sum agree with
    it, rows that are not are NaN."""
    import pickle
    rng = np.random.default_rng(5)
    n, L = 60, 2.0
    x = rng.uniform(0, L, (n, 3)).astype(dtype)
    q = np.tile([1.0, -1.0], n // 2).astype(dtype)
    full = np.array([[j for j in range(n) if j != i] for i in range(n)], np.int32)
    junk = full.copy()
    junk[:, ::7] = np.array([-1, n, n + 9, 2**31 - 1, -(2**31)])[np.arange(n) % 5][:, None]
    variants = {"normal": x.copy(), "nan": x.copy(), "inf": x.copy(), "huge": x.copy(),
                "overlap": x.copy()}
    variants["nan"][4, 1] = np.nan
    variants["inf"][5, 0] = np.inf
    variants["huge"][6] = 1e30 if dtype == np.float64 else 1e18
    variants["overlap"][1] = variants["overlap"][0]
    box, alpha = np.full(3, L, dtype), np.asarray(3.0, dtype)
    cases = {k: (v, full, full, q, box, alpha) for k, v in variants.items()}
    # the kernel skips every index outside [0, n) (the pure kernel would wrap negative
    # ones, which no neighbour list holds): its reference is the list with them as padding
    cases["junk_indices"] = (x, junk, np.where((junk < 0) | (junk > n), n, junk), q, box,
                             alpha)
    cases["wrong_rows"] = (x, full[:-1], full[:-1], q, box, alpha)
    src, dst = tmp_path / "cases.pkl", tmp_path / "out.pkl"
    src.write_bytes(pickle.dumps(cases))
    run = subprocess.run([sys.executable, "-c", _EXTREME_SCRIPT, str(src), str(dst)],
                         env=dict(os.environ, SIMLIB_NATIVE="1"), capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-2500:]}"
    out = pickle.loads(dst.read_bytes())
    assert "shape (n, capacity)" in out["wrong_rows"][0]
    assert not np.isfinite(out["overlap"][0][0])              # r = 0 is not hidden
    tol = 1e-12 if dtype == np.float64 else 3e-6
    for name in ("normal", "nan", "inf", "huge", "overlap", "junk_indices"):
        (e, f, phi, *_), (e_ref, f_ref, *_) = out[name]
        ok = np.all(np.isfinite(f_ref), axis=1)
        np.testing.assert_array_equal(np.all(np.isfinite(f), axis=1), ok, err_msg=name)
        assert not np.any(np.isfinite(f[~ok])), name
        if ok.any():
            assert _rel(f[ok], f_ref[ok]) < tol, name
        if np.isfinite(e_ref):
            assert abs(e - e_ref) <= tol * abs(e_ref), name


_FALLBACK_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib import particles as sp
    from simlib.particles import _native
    water = sp.spce_water(125, key=jax.random.key(2))
    energy = sp.spce_energy(water, 0.6, tolerance=1e-5)
    nb = sp.neighbor_list(sp.periodic(water.box), water.positions, r_cut=0.6, skin=0.05)
    e, f = energy.energy_and_forces(water.positions, water.params, nb)
    w = energy.virial(water.positions, water.params, nb)
    np.savez(sys.argv[1], e=float(e), f=np.asarray(f), w=float(w),
             native=_native.load() is not None)
""")


@pytest.mark.slow
@native
def test_water_equals_the_simlib_native_0_fallback(tmp_path):
    a, b = with_and_without_native(_FALLBACK_SCRIPT, tmp_path)
    np.testing.assert_allclose(a["e"], b["e"], rtol=1e-12)
    np.testing.assert_allclose(a["f"], b["f"], atol=1e-11 * np.max(np.abs(b["f"])))
    np.testing.assert_allclose(a["w"], b["w"], rtol=1e-11)
