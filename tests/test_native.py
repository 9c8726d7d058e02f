"""The optional native CPU kernels against simlib's pure-JAX kernels and numpy.

The pure-JAX paths are the reference: the native kernels must give the same forces,
energies and neighbour sets, and simlib must work unchanged without them.
"""

import os
import pickle
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _native_required import native, with_and_without_native

from simlib import particles as sp
from simlib.particles import _native
from simlib.particles._neighbors import _build_native, _build_pure


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
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_native_gravity_without_softening_skips_exactly_the_self_pair(dtype):
    """The kernel skips j = i by splitting the row's loop at i (no per-pair mask): with
    softening 0 the self term would be 0/0, so any leak shows as NaN; rows 0 and n-1 and a
    count that is no multiple of the vector width (17) meet the loop's edges."""
    x = jnp.asarray(np.random.default_rng(5).normal(size=(17, 3)), dtype)
    m = jnp.asarray(np.linspace(0.5, 2.0, 17), dtype)
    e_nat, f_nat = jax.jit(sp.pair_energy(sp.gravity, sp.free()).energy_and_forces)(
        x, dict(G=0.7, softening=0.0, masses=m))
    e_np, f_np = _numpy_gravity(np.asarray(x, np.float64), np.asarray(m, np.float64), 0.7, 0.0)
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    assert np.all(np.isfinite(np.asarray(f_nat)))
    np.testing.assert_allclose(np.asarray(f_nat, np.float64), f_np,
                               atol=tol * np.max(np.abs(f_np)), rtol=0)
    assert abs(float(e_nat) - e_np) < tol * abs(e_np)


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


# --- Extreme inputs: the kernels must never crash, whatever the positions. -----------------
# Each run happens in a subprocess, so a segfault fails the test instead of killing pytest.

_KERNEL_SCRIPT = textwrap.dedent("""
    import pickle, sys
    import jax, jax.numpy as jnp, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib.particles import _native
    assert _native.load() is not None, _native.unavailable_reason()
    cases = pickle.load(open(sys.argv[1], "rb"))
    out = {}

    def neighbors(c):
        x = np.asarray(c["x"])
        n, d = x.shape
        geometry = np.concatenate([c["origin"], c["size"], c["box"]]).astype(x.dtype)
        name = "simlib_neighbors_f32" if x.dtype == np.float32 else "simlib_neighbors_f64"
        call = jax.ffi.ffi_call(name, (jax.ShapeDtypeStruct((n, c["capacity"]), jnp.int32),
                                       jax.ShapeDtypeStruct((2,), jnp.int32)))
        g = tuple(c["grid"]) + (1,) * (3 - len(c["grid"]))
        idx, stats = jax.jit(lambda x, geo: call(x, geo, periodic=int(c["periodic"]),
                             g0=g[0], g1=g[1], g2=g[2], reach=float(c["reach"])))(x, geometry)
        return dict(idx=np.asarray(idx), stats=np.asarray(stats))

    def gravity(c):
        x = np.asarray(c["x"])
        name = "simlib_gravity_f32" if x.dtype == np.float32 else "simlib_gravity_f64"
        call = jax.ffi.ffi_call(name, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                       jax.ShapeDtypeStruct((), x.dtype)))
        forces, e = jax.jit(call)(x, np.asarray(c["masses"]), np.asarray(c["constants"]))
        return dict(forces=np.asarray(forces), energy=float(e))

    def lj(c):
        x = np.asarray(c["x"])
        name = "simlib_lj_f32" if x.dtype == np.float32 else "simlib_lj_f64"
        call = jax.ffi.ffi_call(name, (jax.ShapeDtypeStruct(x.shape, x.dtype),
                                       jax.ShapeDtypeStruct((), x.dtype),
                                       jax.ShapeDtypeStruct((), x.dtype)))
        forces, e, w = jax.jit(lambda *a: call(*a, r_cut=c["r_cut"], shift=int(c["shift"]),
                                               periodic=int(c["periodic"])))(
            x, np.asarray(c["idx"], np.int32), np.asarray(c["sigma"], x.dtype),
            np.asarray(c["epsilon"], x.dtype), np.asarray(c["box"], x.dtype))
        return dict(forces=np.asarray(forces), energy=float(e), virial=float(w))

    kernels = dict(neighbors=neighbors, gravity=gravity, lj=lj)
    for name, c in cases.items():
        print("case", name, flush=True)           # the last one printed is the one that died
        try:
            out[name] = kernels[c["kernel"]](c)
        except Exception as err:                  # an FFI error is fine; a crash is not
            out[name] = dict(error=f"{type(err).__name__}: {err}")
    pickle.dump(out, open(sys.argv[2], "wb"))
    print("done", flush=True)
""")


def _run_kernels(tmp_path, cases):
    """Run the native kernels on ``cases`` in a subprocess; its exit code must be 0."""
    src, dst = tmp_path / "cases.pkl", tmp_path / "out.pkl"
    src.write_bytes(pickle.dumps(cases))
    env = dict(os.environ, SIMLIB_NATIVE="1")
    run = subprocess.run([sys.executable, "-c", _KERNEL_SCRIPT, str(src), str(dst)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (f"exit {run.returncode} (negative: killed by a signal)\n"
                                 f"{run.stdout[-1500:]}\n{run.stderr[-2500:]}")
    return pickle.loads(dst.read_bytes())


def _brute_neighbors(x, box, reach, periodic):
    """Pairs within ``reach`` among the finite rows of ``x`` (numpy, float64 minimum image),
    and the pairs within a relative 1e-5 of ``reach`` (rounding may put them either side)."""
    x = np.asarray(x, np.float64)
    finite = np.all(np.isfinite(x), axis=1)
    with np.errstate(invalid="ignore", over="ignore"):
        d = x[:, None, :] - x[None, :, :]
        if periodic:
            d = d - box * np.round(d / box)
        r = np.sqrt(np.sum(d * d, axis=-1))
    ok = finite[:, None] & finite[None, :] & ~np.eye(len(x), dtype=bool)
    return ok & (r < reach), ok & (np.abs(r - reach) <= 1e-5 * reach)


def _check_structure(res, n, capacity):
    idx = res["idx"]
    assert idx.shape == (n, capacity)
    assert idx.min(initial=n) >= 0 and idx.max(initial=n) <= n
    for i, row in enumerate(idx):
        listed = row[row < n]
        assert i not in listed                           # never its own neighbour
        assert len(set(listed.tolist())) == len(listed)  # no duplicates
        assert np.all(row[len(listed):] == n)            # padding after the neighbours
    assert 0 <= res["stats"][0] and 0 <= res["stats"][1] <= n


def _check_against_brute(res, x, box, reach, periodic, rows=None, columns=None):
    """Rows ``rows`` (default: the finite ones) list exactly the brute-force neighbours among
    ``columns`` (default: all); non-finite rows are empty and appear in no row."""
    n = len(x)
    close, band = _brute_neighbors(x, box, reach, periodic)
    finite = np.all(np.isfinite(np.asarray(x, np.float64)), axis=1)
    rows = np.flatnonzero(finite) if rows is None else rows
    columns = np.arange(n) if columns is None else columns
    idx = res["idx"]
    for i in np.flatnonzero(~finite):
        assert np.all(idx[i] == n), f"non-finite particle {i} has neighbours {idx[i]}"
        assert not np.any(idx == i), f"non-finite particle {i} is listed as a neighbour"
    for i in rows:
        got = set(idx[i][idx[i] < n].tolist()) & set(columns.tolist())
        want = set(np.flatnonzero(close[i]).tolist()) & set(columns.tolist())
        unsure = set(np.flatnonzero(band[i]).tolist())
        assert got - unsure == want - unsure, f"row {i}: {sorted(got ^ want)}"


def _uniform(n, d, box, seed):
    return np.random.default_rng(seed).uniform(0, box, (n, d))


def _neighbor_case(x, dtype, *, box, reach=1.5, periodic=True, grid=None, origin=None,
                   size=None, capacity=None):
    x = np.asarray(x, dtype)
    d = x.shape[1]
    box_v = np.full(d, box, np.float64)
    grid = tuple(grid) if grid is not None else tuple(
        np.maximum(np.floor(box_v / reach), 1).astype(int).tolist())
    return dict(kernel="neighbors", x=x, periodic=periodic, reach=reach, grid=grid,
                origin=np.zeros(d) if origin is None else np.asarray(origin, np.float64),
                size=box_v / np.asarray(grid) if size is None else np.asarray(size, np.float64),
                box=box_v if periodic else np.zeros(d), capacity=capacity or max(len(x), 1))


def _bad_rows(x, dtype):
    x = np.array(x, np.float64)
    x[3, 0] = np.nan
    x[7] = np.nan
    x[11, 1] = np.inf
    x[12, -1] = -np.inf
    x[20] = [np.inf, -np.inf, np.nan][: x.shape[1]]
    return x.astype(dtype)


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_neighbor_kernel_survives_extreme_positions(tmp_path, dtype):
    box, reach = 8.0, 1.5
    base = _uniform(150, 3, box, 0)
    huge = base.copy()
    big = [1e30, -1e30, 1e20, 3e38, 1e300 if dtype == np.float64 else 3.4e38]
    for k, v in enumerate(big):
        huge[30 + k] = [v, 0.5, -v]
    far = base.copy()
    far[40] = [1000.3, -37.1, 4.0]                 # finite, far outside the periodic box
    far[41] = [-24.2, 2.0, 801.7]
    two_d = _uniform(120, 2, box, 1)
    cases = {
        "periodic_nonfinite": _neighbor_case(_bad_rows(base, dtype), dtype, box=box),
        "free_nonfinite": _neighbor_case(_bad_rows(base, dtype), dtype, box=box, periodic=False,
                                         grid=(5, 5, 5), size=np.full(3, 1.6)),
        "periodic_huge": _neighbor_case(huge, dtype, box=box),
        "free_huge": _neighbor_case(huge, dtype, box=box, periodic=False, grid=(5, 5, 5),
                                    size=np.full(3, 1.6)),
        "periodic_far": _neighbor_case(far, dtype, box=box),
        "free_far": _neighbor_case(far, dtype, box=box, periodic=False, grid=(5, 5, 5),
                                   size=np.full(3, 1.6)),
        "periodic_2d_nonfinite": _neighbor_case(_bad_rows(two_d, dtype), dtype, box=box),
        "periodic_grid_1": _neighbor_case(base, dtype, box=box, grid=(1, 1, 1)),
        "periodic_grid_2": _neighbor_case(base, dtype, box=box, grid=(2, 2, 2)),
        "periodic_grid_1_2_5": _neighbor_case(base, dtype, box=box, grid=(1, 2, 5)),
        "free_grid_1": _neighbor_case(base, dtype, box=box, periodic=False, grid=(1, 1, 1),
                                      size=np.full(3, box)),
        "n0": _neighbor_case(np.zeros((0, 3)), dtype, box=box, capacity=4),
        "n1": _neighbor_case([[1.0, 2.0, 3.0]], dtype, box=box),
        "n1_nan": _neighbor_case([[np.nan, 2.0, 3.0]], dtype, box=box),
        "tiny_box": _neighbor_case(base[:20] * 1e-4, dtype, box=8e-4, grid=(3, 3, 3)),
        "zero_box": _neighbor_case(base[:20], dtype, box=0.0, grid=(3, 3, 3)),
        "nan_geometry": _neighbor_case(base[:20], dtype, box=np.nan, grid=(3, 3, 3)),
        "zero_cell_size": _neighbor_case(base[:20], dtype, box=box, periodic=False,
                                         grid=(5, 5, 5), size=np.zeros(3)),
        "grid_0": _neighbor_case(base[:20], dtype, box=box, grid=(0, 4, 4), size=np.ones(3)),
        "grid_huge": _neighbor_case(base[:20], dtype, box=box, grid=(2**20, 2**20, 2**20),
                                    size=np.ones(3)),
    }
    out = _run_kernels(tmp_path, cases)
    for name in ("grid_0", "grid_huge"):                   # refused with an error, no crash
        assert "grid sizes must be >= 1" in out[name].get("error", ""), out[name]
    for name, case in cases.items():
        if name in ("grid_0", "grid_huge"):
            continue
        res, x = out[name], case["x"]
        assert "error" not in res, (name, res)
        _check_structure(res, len(x), case["capacity"])
        box_k, periodic = case["box"][:1], case["periodic"]
        if name.endswith("huge") and periodic:     # huge finite values wrap to somewhere:
            normal = np.setdiff1d(np.arange(len(x)), np.arange(30, 35))
            _check_against_brute(res, x, box, reach, True, rows=normal, columns=normal)
        elif name in ("zero_box", "nan_geometry"):
            assert np.all(res["idx"] == len(x)), name        # no usable box: no neighbours
        elif name not in ("tiny_box", "zero_cell_size"):
            _check_against_brute(res, x, box_k if periodic else None, reach, periodic)
        if name in ("periodic_grid_1", "periodic_grid_2", "free_far", "periodic_far"):
            counts = np.sum(res["idx"] < len(x), axis=1)
            assert res["stats"][0] == counts.max() > 0


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_gravity_kernel_survives_extreme_positions(tmp_path, dtype):
    x = np.random.default_rng(2).normal(size=(20, 3))
    m = np.linspace(0.5, 1.5, 20)
    constants = np.array([1.3, 0.05])

    def case(x, masses=None):
        x = np.asarray(x, dtype)
        return dict(kernel="gravity", x=x, constants=constants.astype(dtype),
                    masses=np.asarray(m[: len(x)] if masses is None else masses, dtype))

    nan_x, inf_x, huge_x = x.copy(), x.copy(), x.copy()
    nan_x[4, 1] = np.nan
    inf_x[5, 0] = np.inf
    huge_x[6] = [1e30, -1e30, 1e30] if dtype == np.float64 else [1e18, -1e18, 1e18]
    cases = dict(n0=case(np.zeros((0, 3))), n1=case(x[:1]), normal=case(x), nan=case(nan_x),
                 inf=case(inf_x), huge=case(huge_x), masses_too_short=case(x, m[:19]))
    out = _run_kernels(tmp_path, cases)
    assert "need masses (n,)" in out["masses_too_short"].get("error", "")
    assert out["n0"]["forces"].shape == (0, 3) and out["n0"]["energy"] == 0.0
    assert np.all(out["n1"]["forces"] == 0.0) and out["n1"]["energy"] == 0.0
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for name in ("normal", "nan", "inf", "huge"):
        xc = np.asarray(cases[name]["x"], np.float64)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            e_np, f_np = _numpy_gravity(xc, m, 1.3, 0.05)
        f = out[name]["forces"].astype(np.float64)
        # Non-finite inputs give non-finite outputs where numpy's do (the caller detects
        # them), never a crash; finite entries agree with numpy.
        np.testing.assert_array_equal(np.isfinite(f), np.isfinite(f_np), err_msg=name)
        assert np.isfinite(out[name]["energy"]) == np.isfinite(e_np), name
        ok = np.isfinite(f_np)
        scale = np.max(np.abs(f_np[ok]), initial=1.0)
        assert np.max(np.abs(f[ok] - f_np[ok]), initial=0.0) <= tol * scale, name
        if np.isfinite(e_np):
            assert abs(out[name]["energy"] - e_np) <= tol * abs(e_np), name


_BLOWUP_SCRIPT = textwrap.dedent("""
    import jax
    from simlib import particles as sp
    from simlib.particles import _native
    assert _native.load() is not None, _native.unavailable_reason()
    positions, box = sp.lattice(6, 0.8442); space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    vel = sp.maxwell_boltzmann(1.0, 0.722, key=jax.random.key(0), n=len(positions))
    nb = sp.neighbor_list(space, positions, r_cut=2.5, skin=0.3)
    assert nb.grid is not None                  # the native cell-list build is used
    pos = positions.at[1].set(positions[0] + 0.01)
    try:
        sp.simulate(energy, sp.State(pos, vel, 1.0), dict(sigma=1.0, epsilon=1.0),
                    space=space, dt=0.005, n_steps=200, save_every=100, neighbors=nb,
                    throw=False)
    except Exception as err:                    # an error is acceptable; a crash is not
        print("raised", type(err).__name__, err)
    print("survived")
""")


@native
def test_blown_up_lennard_jones_run_does_not_crash_the_process():
    """The issue's reproduction: two atoms 0.01 sigma apart blow up (positions go to NaN or
    inf); the native neighbour build segfaulted on them (exit 139)."""
    env = dict(os.environ, SIMLIB_NATIVE="1")
    run = subprocess.run([sys.executable, "-c", _BLOWUP_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, f"exit {run.returncode}\n{run.stderr[-3000:]}"
    assert "survived" in run.stdout


# --- Lennard-Jones over a neighbour list ---------------------------------------------------

def _numpy_lj(x, listed, r_cut, sigma, epsilon, shift, box=None):
    """Energy and forces of the pairs ``listed[i, j]`` within ``r_cut`` (numpy, float64):
    Lorentz-Berthelot for per-particle ``sigma``/``epsilon``, minimum image when ``box``.
    As a masked sum: a pair's energy counts only inside the cutoff, its force term is
    ``where(inside, c, 0) * d`` (so a NaN neighbour makes the force NaN, as in JAX)."""
    x = np.asarray(x, np.float64)
    n = len(x)
    sig = np.broadcast_to(np.asarray(sigma, np.float64), (n,))
    eps = np.broadcast_to(np.asarray(epsilon, np.float64), (n,))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        d = x[:, None, :] - x[None, :, :]
        if box is not None:
            d = d - box * np.round(d / box)
        r2 = np.sum(d * d, axis=-1)
        s_ij = 0.5 * (sig[:, None] + sig[None, :])
        e_ij = np.sqrt(eps[:, None] * eps[None, :])
        inside = listed & (r2 < r_cut**2)
        s6 = (s_ij**2 / r2) ** 3
        u = 4 * e_ij * (s6 * s6 - s6)
        if shift:
            c6 = (s_ij / r_cut) ** 6
            u = u - 4 * e_ij * (c6 * c6 - c6)
        c = 24 * e_ij * (2 * s6 * s6 - s6) / r2
        energy = 0.5 * np.sum(np.where(inside, u, 0.0))
        forces = np.sum(np.where(inside, c, 0.0)[:, :, None] * d, axis=1)
    return energy, forces


def _listed(idx, n):
    """The ``(n, n)`` matrix of the pairs a neighbour index ``(n, capacity)`` lists."""
    idx = np.asarray(idx)
    listed = np.zeros((n, n + 1), bool)
    listed[np.arange(n)[:, None], np.where((idx >= 0) & (idx < n), idx, n)] = True
    return listed[:, :n]


def _lj_system(dtype, periodic, mixed, cells=5):
    """A perturbed fcc block (4 cells^3 atoms): in a periodic box, or the same atoms in free
    space."""
    x, box = sp.lattice(cells, 0.8442, dtype=dtype)
    x = x + jnp.asarray(np.random.default_rng(7).normal(scale=0.08, size=x.shape), dtype)
    space = sp.periodic(box) if periodic else sp.free()
    n = x.shape[0]
    if mixed:                                      # two species, mixed by Lorentz-Berthelot
        kind = np.arange(n) % 3 == 0
        params = dict(sigma=jnp.asarray(np.where(kind, 1.1, 0.95), dtype),
                      epsilon=jnp.asarray(np.where(kind, 0.7, 1.2), dtype))
    else:
        params = dict(sigma=1.05, epsilon=0.9)
    return x, box, space, params


@native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("periodic,shift,mixed", [(True, False, False), (True, True, True),
                                                  (False, True, False), (False, False, True)])
def test_native_lj_matches_numpy_and_pure_jax(dtype, periodic, shift, mixed):
    x, box, space, params = _lj_system(dtype, periodic, mixed)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=shift)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    assert energy._native_lj(x, params, nbrs)
    e_nat, f_nat = jax.jit(energy.energy_and_forces)(x, params, nbrs)
    e_jax, f_jax = jax.jit(energy._energy_and_forces)(x, params, nbrs)
    assert e_nat.dtype == f_nat.dtype == dtype
    n = x.shape[0]
    e_np, f_np = _numpy_lj(x, ~np.eye(n, dtype=bool), 2.5, params["sigma"], params["epsilon"],
                           shift, box=float(box) if periodic else None)
    tol = 2e-5 if dtype == jnp.float32 else 1e-11
    scale = np.max(np.abs(f_np))
    assert abs(float(e_nat) - e_np) < tol * abs(e_np)
    assert np.max(np.abs(np.asarray(f_nat, np.float64) - f_np)) < tol * scale
    assert np.max(np.abs(np.asarray(f_nat, np.float64) - np.asarray(f_jax, np.float64))) \
        < tol * scale
    assert abs(float(e_nat) - float(e_jax)) < tol * abs(e_np)


@native
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("mixed", [False, True])
def test_native_lj_virial_matches_numpy_and_comes_from_the_kernel(dtype, mixed):
    """The pair virial W = 1/2 sum_ij r_ij . f_ij from the native pass (the pressure's share,
    one pass with the forces): against numpy over all pairs, its gradient in a parameter
    against the pure-JAX virial's, and the compiled virial calls the kernel."""
    x, box, space, params = _lj_system(dtype, True, mixed)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    assert energy._native_lj(x, params, nbrs)
    w = jax.jit(energy.virial)(x, params, nbrs)
    assert w.dtype == dtype
    xs = np.asarray(x, np.float64)
    n = len(xs)
    sig = np.broadcast_to(np.asarray(params["sigma"], np.float64), (n,))
    eps = np.broadcast_to(np.asarray(params["epsilon"], np.float64), (n,))
    d = xs[:, None, :] - xs[None, :, :]
    d -= float(box) * np.round(d / float(box))
    r2 = np.sum(d * d, axis=-1) + np.eye(n)
    s6 = ((0.5 * (sig[:, None] + sig[None, :])) ** 2 / r2) ** 3
    c = 24 * np.sqrt(eps[:, None] * eps[None, :]) * (2 * s6 * s6 - s6) / r2
    w_np = 0.5 * np.sum(np.where((r2 < 2.5**2) & ~np.eye(n, dtype=bool), c * r2, 0.0))
    tol = 2e-5 if dtype == jnp.float32 else 1e-11
    assert abs(float(w) - w_np) < tol * abs(w_np), (float(w), w_np)
    assert "simlib_lj_f" in str(jax.make_jaxpr(energy.virial)(x, params, nbrs))
    # forces and virial in one program (a barostat's step): one kernel call, not two
    both = jax.jit(lambda y: (energy.energy_and_forces(y, params, nbrs),
                              energy.virial(y, params, nbrs)))
    assert both.lower(x).compile().as_text().count('custom_call_target="simlib_lj_f') == 1
    if dtype == jnp.float64:
        def pure(eps_scale):
            p = dict(params, epsilon=params["epsilon"] * eps_scale)
            _, cc, r, _ = energy._neighbor_pass(x, p, nbrs, True)
            return -0.5 * jnp.sum(cc * r * r)

        g = jax.grad(lambda a: energy.virial(x, dict(params, epsilon=params["epsilon"] * a),
                                             nbrs))(1.0)
        assert abs(float(g) - float(jax.grad(pure)(1.0))) < 1e-10 * abs(w_np)


@native
def test_native_lj_is_used_only_where_it_gives_the_pure_result():
    x, box, space, params = _lj_system(jnp.float32, True, False)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    assert energy._native_lj(x, params, nbrs)
    assert not energy._native_lj(x, params, None)                   # all pairs: pure JAX
    if jax.config.jax_enable_x64:                                   # float64 params promote
        assert not energy._native_lj(x, dict(sigma=jnp.float64(1.0), epsilon=1.0), nbrs)
    table = dict(sigma=jnp.ones((2, 2)), epsilon=jnp.ones((2, 2)),
                 species=jnp.zeros(x.shape[0], jnp.int32))
    assert not energy._native_lj(x, table, nbrs)                    # species tables
    other = sp.pair_energy(sp.wca, space, r_cut=2.5)
    assert not other._native_lj(x, params, nbrs)
    custom = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5,
                            mixing=dict(sigma=lambda a, b: jnp.maximum(a, b)))
    assert not custom._native_lj(x, params, nbrs)


@native
@pytest.mark.parametrize("periodic", [True, False])
def test_native_lj_derivatives_equal_the_pure_jax_ones(periodic):
    """custom_jvp: forward and reverse mode come from the pure-JAX kernel, and the gradient
    of the native energy is minus the numpy forces."""
    x, box, space, params = _lj_system(jnp.float64, periodic, True, cells=4)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)

    def loss(fn):
        return lambda x, p: fn(x, p, nbrs)[0] + jnp.sum(jnp.sin(fn(x, p, nbrs)[1]))

    # (sin of the forces: the loss's cotangents see the primal forces, which differ between
    # the kernels by round-off, ~1e-13 of forces of order 1e3)
    g_nat = jax.jit(jax.grad(loss(energy.energy_and_forces), argnums=(0, 1)))(x, params)
    g_jax = jax.jit(jax.grad(loss(energy._energy_and_forces), argnums=(0, 1)))(x, params)
    v = jnp.asarray(np.random.default_rng(1).normal(size=x.shape))
    t_nat = jax.jvp(lambda x: energy.energy_and_forces(x, params, nbrs), (x,), (v,))
    t_jax = jax.jvp(lambda x: energy._energy_and_forces(x, params, nbrs), (x,), (v,))
    for a, b in zip(jax.tree_util.tree_leaves((g_nat, t_nat)),
                    jax.tree_util.tree_leaves((g_jax, t_jax)), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9 * np.max(np.abs(b)))


@native
def test_native_lj_energy_gradient_is_minus_the_numpy_forces():
    x, box, space, params = _lj_system(jnp.float64, True, True, cells=4)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    assert energy._native_lj(x, params, nbrs)
    _, f_np = _numpy_lj(x, ~np.eye(x.shape[0], dtype=bool), 2.5, params["sigma"],
                        params["epsilon"], True, box=float(box))
    grad_e = jax.grad(lambda x: energy.energy_and_forces(x, params, nbrs)[0])(x)
    np.testing.assert_allclose(-np.asarray(grad_e), f_np, atol=1e-10 * np.max(np.abs(f_np)))


def _lj_case(x, dtype, idx, *, box=8.0, periodic=True, r_cut=2.5, shift=True, sigma=None,
             epsilon=None):
    x = np.asarray(x, dtype)
    n = len(x)
    return dict(kernel="lj", x=x, idx=np.asarray(idx, np.int32), r_cut=r_cut, shift=shift,
                periodic=periodic, box=np.full(3, box if periodic else 0.0),
                sigma=np.ones(1) if sigma is None else np.asarray(sigma),
                epsilon=np.ones(1) if epsilon is None else np.asarray(epsilon),
                n=n)


@native
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_lj_kernel_survives_extreme_inputs(tmp_path, dtype):
    """Overlapping atoms, NaN/inf/huge positions and neighbour indices outside [0, n): no
    crash; finite entries agree with numpy, non-finite ones are non-finite where numpy's
    are; bad shapes are errors."""
    rng = np.random.default_rng(3)
    n = 40
    x = rng.uniform(0, 8.0, (n, 3))
    full = np.array([[j for j in range(n) if j != i] for i in range(n)])    # all pairs
    overlap, nan_x, inf_x, huge_x = x.copy(), x.copy(), x.copy(), x.copy()
    overlap[1] = overlap[0]
    nan_x[4, 1] = np.nan
    inf_x[5, 0] = np.inf
    huge_x[6] = [1e30, -1e30, 1e30] if dtype == np.float64 else [1e18, -1e18, 1e18]
    junk = full.copy()                          # indices outside [0, n) are skipped
    junk[:, ::5] = np.array([-1, -7, n, n + 5, 2**31 - 1, -(2**31)])[
        np.arange(n)[:, None] % 6 + np.zeros((1, junk[:, ::5].shape[1]), int)]
    sig = np.linspace(0.9, 1.1, n)
    cases = dict(
        normal=_lj_case(x, dtype, full), overlap=_lj_case(overlap, dtype, full),
        nan=_lj_case(nan_x, dtype, full), inf=_lj_case(inf_x, dtype, full),
        huge_free=_lj_case(huge_x, dtype, full, periodic=False),
        huge_periodic=_lj_case(huge_x, dtype, full),
        junk_indices=_lj_case(x, dtype, junk),
        mixed_nan=_lj_case(nan_x, dtype, full, sigma=sig, epsilon=sig[::-1]),
        self_listed=_lj_case(x, dtype, np.arange(n)[:, None]),
        n0=_lj_case(np.zeros((0, 3)), dtype, np.zeros((0, 4))),
        capacity0=_lj_case(x, dtype, np.zeros((n, 0))),
        sigma_too_short=_lj_case(x, dtype, full, sigma=sig[:-1], epsilon=sig[:-1]),
        idx_wrong_rows=_lj_case(x, dtype, full[:-1]),
        r_cut_nan=_lj_case(x, dtype, full, r_cut=float("nan")),
    )
    out = _run_kernels(tmp_path, cases)
    assert "need sigma and epsilon" in out["sigma_too_short"].get("error", "")
    assert "shape (n, capacity)" in out["idx_wrong_rows"].get("error", "")
    assert "r_cut" in out["r_cut_nan"].get("error", "")
    assert out["n0"]["forces"].shape == (0, 3) and out["n0"]["energy"] == 0.0
    assert np.all(out["capacity0"]["forces"] == 0.0) and out["capacity0"]["energy"] == 0.0
    # Overlapping atoms and an atom listed as its own neighbour: r = 0 is not hidden.
    assert not np.isfinite(out["overlap"]["energy"])
    assert not np.all(np.isfinite(out["overlap"]["forces"][:2]))
    assert not np.isfinite(out["self_listed"]["energy"])
    tol = 1e-5 if dtype == np.float32 else 1e-12
    # huge_periodic: x - 1e30 rounds to -1e30, whose minimum image is 0, so atom 6 sits on
    # every atom (r = 0): non-finite forces everywhere, as in numpy.
    for name in ("normal", "overlap", "nan", "inf", "huge_free", "huge_periodic",
                 "junk_indices", "mixed_nan"):
        c = cases[name]
        xc = np.asarray(c["x"], np.float64)
        s, e = (c["sigma"], c["epsilon"]) if len(c["sigma"]) > 1 else (1.0, 1.0)
        e_np, f_np = _numpy_lj(xc, _listed(c["idx"], n), 2.5, s, e, True,
                               box=8.0 if c["periodic"] else None)
        f = out[name]["forces"].astype(np.float64)
        # The kernel marks whole rows: a force with a non-finite component in numpy is
        # NaN in all three components here; every other row agrees with numpy.
        ok = np.all(np.isfinite(f_np), axis=1)
        np.testing.assert_array_equal(np.all(np.isfinite(f), axis=1), ok, err_msg=name)
        assert not np.any(np.isfinite(f[~ok])), name
        assert np.isfinite(out[name]["energy"]) == np.isfinite(e_np), name
        scale = np.max(np.abs(f_np[ok]), initial=1.0)
        assert np.max(np.abs(f[ok] - f_np[ok]), initial=0.0) <= tol * scale, name
        if np.isfinite(e_np):
            assert abs(out[name]["energy"] - e_np) <= tol * max(abs(e_np), 1.0), name


_FALLBACK_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    jax.config.update("jax_enable_x64", True)
    from simlib import particles as sp
    from simlib.particles import _native
    x, box = sp.lattice(5, 0.8442)
    x = x + np.random.default_rng(7).normal(scale=0.05, size=x.shape)
    space = sp.periodic(box)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5, shift=True)
    nb = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    sigma = np.where(np.arange(len(x)) % 2 == 0, 1.0, 0.9)
    params = dict(sigma=sigma, epsilon=1.0)
    e, f = energy.energy_and_forces(x, params, nb)
    v = sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(0), n=len(x))
    traj = sp.simulate(energy, sp.State(x, v, 1.0), params, space=space, dt=0.002,
                       n_steps=50, save_every=50, neighbors=nb)
    np.savez(sys.argv[1], e=float(e), f=np.asarray(f), native=_native.load() is not None,
             final=np.asarray(traj.final.positions), pe=np.asarray(traj.potential_energy))
""")


@native
def test_native_lj_and_simulate_equal_the_simlib_native_0_fallback(tmp_path):
    """The same energy, forces and 50-step trajectory with SIMLIB_NATIVE=1 and =0."""
    a, b = with_and_without_native(_FALLBACK_SCRIPT, tmp_path)
    np.testing.assert_allclose(a["e"], b["e"], rtol=1e-12)
    np.testing.assert_allclose(a["f"], b["f"], atol=1e-10 * np.max(np.abs(b["f"])))
    np.testing.assert_allclose(a["final"], b["final"], atol=1e-9)
    np.testing.assert_allclose(a["pe"], b["pe"], rtol=1e-10)


@native
def test_native_lj_results_are_bit_identical_between_calls():
    """Rows go to threads dynamically; the energy is still summed in row order, so repeated
    calls (a checkpointed run resumed) give the same bits."""
    x, _, space, params = _lj_system(jnp.float64, True, False)
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    nbrs = sp.neighbor_list(space, x, r_cut=2.5, skin=0.3)
    call = jax.jit(energy.energy_and_forces)
    e0, f0 = call(x, params, nbrs)
    for _ in range(20):
        e, f = call(x, params, nbrs)
        assert float(e) == float(e0)
        np.testing.assert_array_equal(np.asarray(f), np.asarray(f0))
