"""simlib.particles neighbour lists: the listed pairs against a brute-force numpy search,
rebuilds after moves of half the skin, overflow flags and reallocation, the debug check,
and energies and forces through a list against all pairs.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simlib import particles as sp
from simlib.particles import _native
from simlib.particles._neighbors import _build_pure

R_CUT, SKIN = 1.0, 0.3


def np_distances(x, box):
    """All-pairs distances (inf on the diagonal), the shortest over every neighbouring image."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    dv = x[:, None, :] - x[None, :, :]
    if box is None:
        r = np.linalg.norm(dv, axis=-1)
    else:
        box = np.broadcast_to(np.asarray(box, np.float64), (d,))
        dv = (dv + box / 2) % box - box / 2            # into [-L/2, L/2), then try images
        r = np.full((n, n), np.inf)
        for k in itertools.product((-1, 0, 1), repeat=d):
            r = np.minimum(r, np.linalg.norm(dv + np.asarray(k) * box, axis=-1))
    np.fill_diagonal(r, np.inf)
    return r


def np_pair_set(x, box, radius):
    r = np_distances(x, box)
    return {(int(i), int(j)) for i, j in zip(*np.nonzero(r < radius), strict=True)}, r


def listed_pairs(nl):
    """The (i, j) pairs of a list, after checking each row's layout: distinct, no self,
    real entries first and then padding with n."""
    idx = np.asarray(nl.idx)
    n = idx.shape[0]
    assert idx.shape == (n, nl.capacity)
    pairs = set()
    for i, row in enumerate(idx):
        real = row[row < n]
        assert np.all(row[: len(real)] < n) and np.all(row[len(real):] == n), row
        assert len(set(real.tolist())) == len(real), row
        assert i not in real
        pairs.update((i, int(j)) for j in real)
    return pairs


def assert_list_is_exact(nl, x, box):
    """The list holds exactly the pairs within r_cut + skin (pairs within 1e-9 of that
    radius, where round-off decides, are left out of the comparison)."""
    radius = nl.r_cut + nl.skin
    want, r = np_pair_set(x, box, radius)
    got = listed_pairs(nl)
    ambiguous = {(int(i), int(j)) for i, j in zip(*np.nonzero(np.abs(r - radius) < 1e-9),
                                                   strict=True)}
    assert got - ambiguous == want - ambiguous
    assert got == {(j, i) for i, j in got}                       # symmetric
    return want


@jax.jit
def _update(nl, x):
    return nl.update(x)


# --------------------------------------------------------------------------------------
# 3. the list against brute force


# With the capacities fixed, examples with the same grid share one compiled build.
N_HYP = {2: 64, 3: 96}


@pytest.mark.slow   # 9 s; the open-space brute-force check stays in the default suite
@settings(max_examples=20)
@given(seed=st.integers(0, 2**32 - 1), dim=st.sampled_from([2, 3]),
       sides=st.lists(st.floats(2 * (R_CUT + SKIN), 6.0 * (R_CUT + SKIN),
                                allow_subnormal=False), min_size=3, max_size=3))
def test_periodic_list_is_the_brute_force_pair_set(seed, dim, sides):
    """Densities from 0.3 to 25 particles per unit volume (area); small boxes take the
    all-pairs search."""
    rng = np.random.default_rng(seed)
    n = N_HYP[dim]
    box = np.asarray(sides[:dim])
    space = sp.periodic(box)
    x = rng.uniform(0, 1, (n, dim)) * box
    x[: 2 * dim] = _near_faces(rng, box, dim)
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, capacity=n - 1, cell_capacity=n)
    assert not bool(nl.overflow)
    assert int(nl.n_builds) == 1
    want = assert_list_is_exact(nl, x, box)
    counts = np.bincount(np.array([i for i, _ in want], int), minlength=n)
    assert int(nl.max_neighbors) == counts.max()

    # Moves below skin / 2 (wrapped across the faces): no rebuild, still no pair missed.
    step = rng.normal(size=x.shape)
    step *= (rng.uniform(0, 0.499 * SKIN, n) / np.linalg.norm(step, axis=1))[:, None]
    x1 = np.asarray(space.wrap(jnp.asarray(x + step)))
    nl1 = _update(nl, jnp.asarray(x1))
    assert int(nl1.n_builds) == 1
    np.testing.assert_array_equal(nl1.idx, nl.idx)
    within, _ = np_pair_set(x1, box, R_CUT)
    assert within <= listed_pairs(nl1)

    # One particle moves past skin / 2 from where the list was built: rebuilt there.
    x2 = x1.copy()
    k = int(rng.integers(n))
    direction = rng.normal(size=dim)
    x2[k] = x[k] + 0.51 * SKIN * direction / np.linalg.norm(direction)
    x2 = np.asarray(space.wrap(jnp.asarray(x2)))
    nl2 = _update(nl1, jnp.asarray(x2))
    assert int(nl2.n_builds) == 2
    np.testing.assert_array_equal(nl2.reference_positions, x2)
    assert not bool(nl2.overflow)
    assert_list_is_exact(nl2, x2, box)


def _near_faces(rng, box, dim):
    """Two particles per axis: one just inside a face, the other just inside the opposite
    face, within r_cut of each other through the boundary."""
    pts = []
    for k in range(dim):
        a = rng.uniform(0.2, 0.8, dim) * box
        a[k] = rng.uniform(0, 0.2)
        b = a + rng.uniform(-0.2, 0.2, dim)
        b[k] = box[k] - rng.uniform(1e-12, 0.5)
        pts += [a, b]
    return np.asarray(pts)


@settings(max_examples=12)
@given(seed=st.integers(0, 2**32 - 1), dim=st.sampled_from([2, 3]),
       spread=st.floats(1.0, 15.0, allow_subnormal=False), clustered=st.booleans())
def test_free_space_list_is_the_brute_force_pair_set(seed, dim, spread, clustered):
    rng = np.random.default_rng(seed)
    n = N_HYP[dim]
    if clustered:       # two dense clumps far apart
        x = rng.normal(size=(n, dim)) * 0.8
        x[: n // 2] += spread * 3
    else:
        x = rng.uniform(-spread, spread, (n, dim))
    nl = sp.neighbor_list(sp.free(), jnp.asarray(x), R_CUT, SKIN, capacity=n - 1,
                          cell_capacity=n)
    assert not bool(nl.overflow)
    assert_list_is_exact(nl, x, None)
    # Particles leaving the box the grid was sized for are still found (edge cells).
    x1 = x * 1.02 + 0.5 * spread
    nl1 = _update(nl, jnp.asarray(x1))
    assert not bool(nl1.overflow) and int(nl1.n_builds) == 2
    assert_list_is_exact(nl1, x1, None)


CONFIGS = {
    # id: (dim, box or None, n): small boxes use the all-pairs search (grid None)
    "periodic1d-cells": (1, 12.0, 30),
    "periodic2d-small-box-all-pairs": (2, (3.0, 4.5), 40),
    "periodic3d-small-box-all-pairs": (3, 3.0, 50),
    "periodic2d-cells": (2, (7.0, 5.5), 150),
    "periodic3d-cells": (3, (5.5, 4.0, 6.5), 200),
    "free2d": (2, None, 150),
    "free3d": (3, None, 200),
}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_list_with_default_capacities(config):
    dim, box, n = CONFIGS[config]
    rng = np.random.default_rng(sorted(CONFIGS).index(config))
    if box is None:
        space, x = sp.free(), rng.uniform(-3, 3, (n, dim))
    else:
        box = np.broadcast_to(np.asarray(box, float), (dim,))
        space, x = sp.periodic(box), rng.uniform(0, 1, (n, dim)) * box
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    assert (nl.grid is None) == ("all-pairs" in config)
    assert not bool(nl.overflow)
    want = assert_list_is_exact(nl, x, box)
    most = max(np.bincount(np.array([i for i, _ in want], int), minlength=n))
    assert int(nl.max_neighbors) == most
    assert nl.capacity == int(np.ceil(1.25 * most))


# --------------------------------------------------------------------------------------
# rebuilds, overflow, missing pairs, the debug check


@pytest.fixture(scope="module")
def fluid():
    """A 3D periodic configuration big enough for cells: 160 particles in a 6 x 6 x 6 box."""
    rng = np.random.default_rng(42)
    box = 6.0
    x = rng.uniform(0, box, (160, 3))
    return sp.periodic(box), box, x


def test_rebuild_only_after_a_move_of_half_the_skin(fluid):
    space, box, x = fluid
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    assert nl.grid is not None
    # Everyone moves 0.49 skin: the list is kept, and still covers every pair within r_cut.
    rng = np.random.default_rng(0)
    u = rng.normal(size=x.shape)
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    x1 = (x + 0.49 * SKIN * u) % box
    nl1 = _update(nl, jnp.asarray(x1))
    assert int(nl1.n_builds) == 1
    assert np_pair_set(x1, box, R_CUT)[0] <= listed_pairs(nl1)
    # Everyone then moves back, and one particle 0.51 skin away: rebuilt.
    x2 = x.copy()
    x2[17] = (x[17] + 0.51 * SKIN * u[17]) % box
    nl2 = _update(nl1, jnp.asarray(x2))
    assert int(nl2.n_builds) == 2
    assert_list_is_exact(nl2, x2, box)
    # Updating at the positions it was just built at keeps it.
    nl3 = _update(nl2, jnp.asarray(x2))
    assert int(nl3.n_builds) == 2


def test_stale_list_misses_pairs_and_missing_pairs_counts_them(fluid):
    space, box, x = fluid
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    assert int(sp.missing_pairs(nl, jnp.asarray(x))) == 0
    x1 = (x + np.random.default_rng(1).normal(0, 0.6, x.shape)) % box
    within, _ = np_pair_set(x1, box, R_CUT)
    missing = within - listed_pairs(nl)
    assert len(missing) > 10
    assert int(sp.missing_pairs(nl, jnp.asarray(x1))) == len(missing)   # ordered pairs


def test_debug_list_counts_missed_pairs(fluid):
    space, box, x = fluid
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, debug=True)
    rng = np.random.default_rng(2)
    x1 = (x + rng.uniform(-0.08, 0.08, x.shape)) % box        # under skin / 2 = 0.15
    nl1 = _update(nl, jnp.asarray(x1))
    assert int(nl1.missed_pairs) == 0 and int(nl1.n_builds) == 1
    # A corrupted list (particle 0's neighbours wiped) is caught at the next update.
    idx = np.asarray(nl1.idx).copy()
    lost = int(np.sum(idx[0] < len(x)))
    within0 = [j for (i, j) in np_pair_set(x1, box, R_CUT)[0] if i == 0]
    assert len(within0) > 0
    idx[0] = len(x)
    broken = nl1.replace(idx=jnp.asarray(idx))
    nl2 = _update(broken, jnp.asarray(x1))
    assert lost >= len(within0)
    assert int(nl2.missed_pairs) == len(within0)


def test_overflow_is_flagged_and_sticky_and_reallocate_fixes_it(fluid):
    space, box, x = fluid
    full = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    most = int(full.max_neighbors)
    small = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, capacity=most - 1)
    assert bool(small.overflow) and small.did_overflow()
    assert int(small.max_neighbors) == most
    # The flag stays set after a rebuild at positions that would fit.
    grid = np.stack(np.meshgrid(np.arange(6), np.arange(6), np.arange(5) * 1.2,
                                indexing="ij"), -1).reshape(-1, 3)
    sparse = grid[: len(x)] + 0.1              # a loose lattice, 6 neighbours at most
    assert max(np.sum(np_distances(sparse, box) < R_CUT + SKIN, axis=1)) < small.capacity
    again = _update(small, jnp.asarray(sparse))
    assert int(again.n_builds) == 2 and bool(again.overflow)
    bigger = sp.reallocate(small, jnp.asarray(x))
    assert not bool(bigger.overflow) and bigger.capacity > small.capacity
    assert bigger.capacity >= 1.5 * most
    assert_list_is_exact(bigger, x, box)


def test_cell_capacity_overflow(fluid):
    """The pure-JAX cell build keeps ``cell_capacity`` particles per cell and flags more;
    the native CPU build (when present) has no cell capacity and must then lose nothing."""
    space, box, x = fluid
    crowded = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, cell_capacity=2)
    assert crowded.grid is not None and int(crowded.max_cell_occupancy) > 2
    if _native.load() is None:
        assert bool(crowded.overflow)
    else:
        assert not bool(crowded.overflow)
        assert_list_is_exact(crowded, x, box)
    _, _, cell_overflow, occupancy = jax.jit(_build_pure)(crowded, jnp.asarray(x))
    assert bool(cell_overflow) and int(occupancy) == int(crowded.max_cell_occupancy)
    # Everything squeezed into a corner: the occupancy is tracked, and flagged where it counts.
    squeezed = x * 0.3
    roomy = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, capacity=len(x) - 1)
    after = _update(roomy, jnp.asarray(squeezed))
    assert int(after.max_cell_occupancy) > roomy.cell_capacity
    assert bool(after.overflow) == (_native.load() is None)
    if not bool(after.overflow):
        assert_list_is_exact(after, squeezed, box)


@pytest.mark.parametrize("pairs_per_chunk", [1, 3 * 10**4])
def test_pure_build_in_chunks_of_cells_is_the_brute_force_pair_set(fluid, monkeypatch,
                                                                   pairs_per_chunk):
    """Large grids are built by the pure-JAX path in chunks of cells (bounded memory on
    accelerators); with a tiny chunk budget (one cell a chunk, or a few with the last chunk
    padded) the list is still exact and the counts are those of brute force."""
    from simlib.particles import _neighbors

    space, box, x = fluid
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN, capacity=len(x) - 1)
    monkeypatch.setattr(_neighbors, "_PAIRS_PER_CHUNK", pairs_per_chunk)
    idx, count, cell_overflow, occupancy = jax.jit(_build_pure)(nl, jnp.asarray(x))
    n_cells = math.prod(nl.grid)
    per = max(1, pairs_per_chunk // (nl.cell_capacity * 3 ** x.shape[1] * nl.cell_capacity))
    assert per == (1 if pairs_per_chunk == 1 else 13) and n_cells == 64  # 64 % 13: padded
    want = assert_list_is_exact(nl.replace(idx=idx), x, box)
    counts = np.bincount(np.array([i for i, _ in want], int), minlength=len(x))
    assert int(count) == counts.max() and not bool(cell_overflow)
    assert int(occupancy) == int(nl.max_cell_occupancy)


def test_capacity_overflow_when_the_density_rises(fluid):
    space, box, x = fluid
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    dense = np.asarray(x).copy()
    dense[:60] = 2.0 + np.random.default_rng(5).uniform(0, 0.8, (60, 3))
    out = _update(nl, jnp.asarray(dense))
    assert int(out.n_builds) == 2
    assert bool(out.overflow)
    # Too many neighbours (or, in the pure-JAX cell build, too many particles in a cell).
    assert (int(out.max_neighbors) > nl.capacity
            or int(out.max_cell_occupancy) > nl.cell_capacity)


# --------------------------------------------------------------------------------------
# 2. energies and forces through a list


@pytest.mark.parametrize("dim, periodic", [(2, True), (3, True), (3, False)])
def test_energy_and_forces_with_a_list_equal_all_pairs(dim, periodic):
    rng = np.random.default_rng(10 + dim)
    n = 90 if dim == 3 else 28
    box = np.array([6.0, 5.5, 6.5])[:dim] if periodic else None
    space = sp.periodic(box) if periodic else sp.free()
    x = _spread(rng, n, dim, box, min_sep=0.8 if dim == 3 else 0.75)
    params = dict(sigma=rng.uniform(0.9, 1.1, n), epsilon=rng.uniform(0.5, 1.5, n))
    energy = sp.pair_energy(sp.lennard_jones, space, 2.0, shift=True)
    nl = sp.neighbor_list(space, jnp.asarray(x), 2.0, 0.4)
    assert np.any(np.asarray(nl.idx) == n)       # padded slots are present

    @jax.jit
    def both(x, nl):
        e_all, f_all = energy.energy_and_forces(x, params)
        e_nl, f_nl = energy.energy_and_forces(x, params, nl)
        g_nl = -jax.grad(energy)(x, params, nl)
        return e_all, f_all, e_nl, f_nl, g_nl, energy(x, params, nl)

    e_all, f_all, e_nl, f_nl, g_nl, e_nl2 = (np.asarray(a) for a in both(jnp.asarray(x), nl))
    scale = np.abs(f_all).max()
    assert float(e_nl) == pytest.approx(float(e_all), rel=1e-12)
    assert float(e_nl2) == pytest.approx(float(e_all), rel=1e-12)
    np.testing.assert_allclose(f_nl, f_all, atol=1e-12 * scale)
    np.testing.assert_allclose(g_nl, f_all, atol=1e-12 * scale)
    # Against numpy: sum of u(r) - u(r_c) over pairs within r_c, Lorentz-Berthelot mixed.
    r = np_distances(x, box)
    sig = 0.5 * (params["sigma"][:, None] + params["sigma"][None])
    eps = np.sqrt(params["epsilon"][:, None] * params["epsilon"][None])
    u = 4 * eps * ((sig / r) ** 12 - (sig / r) ** 6 - (sig / 2.0) ** 12 + (sig / 2.0) ** 6)
    assert float(e_nl) == pytest.approx(0.5 * np.sum(np.where(r < 2.0, u, 0.0)), rel=1e-12)
    # After moves within the skin, the same list still gives the all-pairs result.
    x1 = x + rng.uniform(-0.19, 0.19, x.shape) / np.sqrt(dim)
    nl1 = _update(nl, jnp.asarray(x1))
    assert int(nl1.n_builds) == 1
    e_all, f_all, e_nl, f_nl, _, _ = (np.asarray(a) for a in both(jnp.asarray(x1), nl1))
    assert float(e_nl) == pytest.approx(float(e_all), rel=1e-12)
    np.testing.assert_allclose(f_nl, f_all, atol=1e-12 * np.abs(f_all).max())


def _spread(rng, n, dim, box, min_sep=0.8):
    hi = box if box is not None else np.full(dim, 5.0)
    pts = []
    while len(pts) < n:
        p = rng.uniform(0, 1, dim) * hi
        if pts:
            dv = np.asarray(pts) - p
            if box is not None:
                dv -= box * np.round(dv / box)
            if np.min(np.linalg.norm(dv, axis=1)) < min_sep:
                continue
        pts.append(p)
    return np.asarray(pts)


# --------------------------------------------------------------------------------------
# errors


def test_list_errors(fluid):
    space, box, x = fluid
    with pytest.raises(ValueError, match="exceeds half the shortest box side"):
        sp.neighbor_list(sp.periodic(4.0), x, 1.8, 0.3)
    with pytest.raises(ValueError, match="allocate the list outside jit"):
        jax.jit(lambda y: sp.neighbor_list(space, y, R_CUT, SKIN).idx)(jnp.asarray(x))
    with pytest.raises(ValueError, match=r"shape \(n, d\)"):
        sp.neighbor_list(space, x[:, :, None], R_CUT, SKIN)
    with pytest.raises(ValueError, match="skin >= 0"):
        sp.neighbor_list(space, x, R_CUT, -0.1)
    with pytest.raises(ValueError, match="capacity_multiplier must be >= 1"):
        sp.neighbor_list(space, x, R_CUT, SKIN, capacity_multiplier=0.5)
    with pytest.raises(TypeError, match="space must be"):
        sp.neighbor_list("box", x, R_CUT, SKIN)
    nl = sp.neighbor_list(space, jnp.asarray(x), R_CUT, SKIN)
    params = dict(sigma=1.0, epsilon=1.0)
    with pytest.raises(ValueError, match="below the energy's r_cut"):
        sp.pair_energy(sp.lennard_jones, space, 1.2)(x, params, nl)
    with pytest.raises(ValueError, match="this energy has no r_cut"):
        sp.pair_energy(sp.lennard_jones, space)(x, params, nl)
    with pytest.raises(ValueError, match="the neighbour list is for 160 particles"):
        sp.pair_energy(sp.lennard_jones, space, 1.0)(x[:100], params, nl)
