r"""Neighbour lists: fixed-capacity lists of the particles within ``r_cut + skin``.

Built in O(n) from a cell list (Allen & Tildesley 2017, §5.3; Verlet, Phys. Rev. 159, 98
(1967) for the skin): space is cut into cells at least ``r_cut + skin`` wide, particles are
binned by cell, and each particle looks at the ``3^d`` cells around its own. The list keeps
up to ``capacity`` neighbours per particle (padded with ``n``), and is rebuilt only when some
particle has moved more than ``skin / 2`` since the last build, which guarantees that no pair
within ``r_cut`` is missed in between.

Overflow (a particle with more than ``capacity`` neighbours, or a cell with more than
``cell_capacity`` particles) is never silent: the list carries a sticky ``overflow`` flag,
:func:`~simlib.particles.simulate` reallocates and re-runs, and under a user's own ``jit``
the step raises or reports it.
"""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from .._util import inside_trace, is_tracer
from . import _native
from ._space import Space


@jax.tree_util.register_pytree_node_class
class NeighborList:
    """A fixed-capacity neighbour list (a pytree). Build it with :func:`neighbor_list`.

    Attributes:
        idx: ``(n, capacity)`` int32 indices of neighbours, padded with ``n``.
        reference_positions: ``(n, d)`` positions at the last build.
        overflow: Whether any build since allocation ran out of room (sticky).
        max_neighbors: The largest neighbour count seen in a build.
        max_cell_occupancy: The largest cell occupancy seen in a build.
        n_builds: How many times the list was built.
        missed_pairs: With ``debug=True``, pairs within ``r_cut`` absent from the list
            (checked against all pairs at every update); always 0 otherwise.
        space, r_cut, skin, capacity, cell_capacity, grid, debug: Its configuration.
    """

    def __init__(self, idx: jax.Array, reference_positions: jax.Array, overflow: jax.Array,
                 max_neighbors: jax.Array, max_cell_occupancy: jax.Array,
                 n_builds: jax.Array, missed_pairs: jax.Array, space: Space,
                 cell_origin: jax.Array, cell_size: jax.Array, *, r_cut: float, skin: float,
                 capacity: int, cell_capacity: int, grid: tuple[int, ...] | None,
                 debug: bool) -> None:
        self.idx = idx
        self.reference_positions = reference_positions
        self.overflow = overflow
        self.max_neighbors = max_neighbors
        self.max_cell_occupancy = max_cell_occupancy
        self.n_builds = n_builds
        self.missed_pairs = missed_pairs
        self.space = space
        self.cell_origin = cell_origin
        self.cell_size = cell_size
        self.r_cut = r_cut
        self.skin = skin
        self.capacity = capacity
        self.cell_capacity = cell_capacity
        self.grid = grid
        self.debug = debug

    def _static(self):
        return dict(r_cut=self.r_cut, skin=self.skin, capacity=self.capacity,
                    cell_capacity=self.cell_capacity, grid=self.grid, debug=self.debug)

    def tree_flatten(self):
        children = (self.idx, self.reference_positions, self.overflow, self.max_neighbors,
                    self.max_cell_occupancy, self.n_builds, self.missed_pairs, self.space,
                    self.cell_origin, self.cell_size)
        return children, tuple(sorted(self._static().items()))

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(*children, **dict(static))

    def __repr__(self):
        return (f"NeighborList(n={self.idx.shape[0]}, capacity={self.capacity}, "
                f"r_cut={self.r_cut}, skin={self.skin}, grid={self.grid})")

    def replace(self, **kw) -> NeighborList:
        children = dict(idx=self.idx, reference_positions=self.reference_positions,
                        overflow=self.overflow, max_neighbors=self.max_neighbors,
                        max_cell_occupancy=self.max_cell_occupancy, n_builds=self.n_builds,
                        missed_pairs=self.missed_pairs, space=self.space,
                        cell_origin=self.cell_origin, cell_size=self.cell_size)
        static = self._static()
        for k, v in kw.items():
            (static if k in static else children)[k] = v
        return NeighborList(**children, **static)

    def build(self, positions) -> NeighborList:
        """The list rebuilt from scratch at ``positions`` (jittable)."""
        if not _traced(self, positions):
            return _build_jit(self, positions)
        idx, count, cell_overflow, occupancy = _build(self, positions)
        overflow = self.overflow | (count > self.capacity) | cell_overflow
        return self.replace(idx=idx, reference_positions=positions, overflow=overflow,
                            max_neighbors=jnp.maximum(self.max_neighbors, count),
                            max_cell_occupancy=jnp.maximum(self.max_cell_occupancy, occupancy),
                            n_builds=self.n_builds + 1)

    def needs_rebuild(self, positions) -> jax.Array:
        """Whether some particle moved more than ``skin / 2`` since the last build."""
        # One contiguous row per axis: XLA's CPU code for the (n, d) layout, with its sum
        # over an axis of 2-3 entries, is slower (docs/benchmarks.md, "Design measurements").
        d = positions.T - self.reference_positions.T
        r2 = sum(self.space.minimum_image(d[k], k) ** 2 for k in range(d.shape[0]))
        # Written so that a nan displacement (non-finite positions) also rebuilds.
        return ~(jnp.max(r2) <= (0.5 * self.skin) ** 2)

    def update(self, positions) -> NeighborList:
        """Rebuild if needed (``lax.cond``); with ``debug``, also count missed pairs.

        Called eagerly it runs one compiled function (shared by all calls)."""
        if not _traced(self, positions):
            return _update_jit(self, positions)
        out = lax.cond(self.needs_rebuild(positions), lambda: self.build(positions), lambda: self)
        if self.debug:
            out = out.replace(missed_pairs=out.missed_pairs + missing_pairs(out, positions))
        return out

    def reallocate(self, positions, capacity_multiplier: float = 1.5) -> NeighborList:
        """A larger list built at ``positions``: see :func:`reallocate`."""
        return _reallocate_list(self, positions, capacity_multiplier)

    def did_overflow(self) -> bool:
        """``overflow`` as a Python bool (eager use)."""
        return bool(self.overflow)


def _traced(nl, positions) -> bool:
    return inside_trace() or is_tracer((nl, positions))


@jax.jit
def _update_jit(nl, positions):
    return nl.update(positions)


@jax.jit
def _build_jit(nl, positions):
    return nl.build(positions)


def _candidate_pairs_all(positions):
    n = positions.shape[0]
    cand = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32)[None, :], (n, n))
    return cand


def _cell_index(nl, positions):
    """Integer cell coordinates ``(n, d)``, always inside the grid.

    In a periodic box positions are wrapped first, so the cell is the one the minimum image
    sees whatever the position (a far-away position's floor would overflow int32 and land
    in an unrelated cell); in free space cells are clamped to the grid's edge. The clamp is
    done in floating point, before the cast, and a non-finite position goes to cell 0
    (its distances are nan, so it has no neighbours and no one has it as one).
    """
    grid = jnp.asarray(nl.grid, positions.dtype)
    x = nl.space.wrap(positions) if nl.space.periodic else positions
    c = jnp.floor((x - nl.cell_origin) / nl.cell_size)
    c = jnp.where(jnp.isfinite(c), c, 0.0)
    return jnp.clip(c, 0.0, grid - 1.0).astype(jnp.int32)


def _flat(c, grid):
    flat = c[..., 0]
    for k in range(1, len(grid)):
        flat = flat * grid[k] + c[..., k]
    return flat


def _cell_neighbors(grid, periodic):
    """For each cell, the flat ids of the ``3^d`` cells around it (``n_cells`` stands for an
    empty cell outside a free-space grid). Static: computed once per grid, in numpy."""
    d = len(grid)
    n_cells = math.prod(grid)
    cells = np.stack(np.meshgrid(*[np.arange(g) for g in grid], indexing="ij"), -1)
    cells = cells.reshape(-1, d)
    offsets = np.asarray(list(itertools.product((-1, 0, 1), repeat=d)))
    around = cells[:, None, :] + offsets[None]
    g = np.asarray(grid)
    if periodic:
        around = np.mod(around, g)
        inside = np.ones(around.shape[:2], bool)
    else:
        inside = np.all((around >= 0) & (around < g), axis=-1)
        around = np.clip(around, 0, g - 1)
    flat = np.ravel_multi_index(tuple(around[..., k] for k in range(d)), grid)
    return np.where(inside, flat, n_cells).astype(np.int32)


# Candidate pairs (member x candidate) that the pure-JAX cell build handles in one pass; a
# larger grid is built in chunks of cells, so that its temporaries (distances, mask) stay
# near a gigabyte (one pass over a large system does not fit an accelerator's memory:
# docs/benchmarks.md, "Design measurements").
_PAIRS_PER_CHUNK = 1 << 25


def _build_cells(nl, positions, radius):
    """The list in cell-major layout ``(n_cells * cell_capacity, capacity)``, with each
    particle's row in it, the largest neighbour count and the largest cell occupancy.

    Particles are binned into a ``(n_cells, cell_capacity)`` table. Every member of a cell
    shares the same candidates (the members of the ``3^d`` cells around it), so the
    distances are a broadcast of ``(n_cells, cell_capacity)`` members against
    ``(n_cells, 3^d cell_capacity)`` candidates, with no per-particle gather; above
    ``_PAIRS_PER_CHUNK`` such pairs, cells are taken in chunks by ``lax.map``.
    """
    n, d = positions.shape
    grid, cap = nl.grid, nl.cell_capacity
    n_cells = math.prod(grid)
    cell_id = _flat(_cell_index(nl, positions), grid)
    order = jnp.argsort(cell_id).astype(jnp.int32)
    sorted_id = cell_id[order]
    occupancy = jnp.zeros(n_cells, jnp.int32).at[cell_id].add(1)
    start = jnp.cumsum(occupancy) - occupancy
    rank = jnp.arange(n, dtype=jnp.int32) - start[sorted_id]
    table = jnp.full((n_cells + 1, cap), n, jnp.int32)
    table = table.at[sorted_id, rank].set(order, mode="drop")     # row n_cells stays empty
    members = table[:n_cells]                                       # (n_cells, cap)
    cand = table[_cell_neighbors(grid, nl.space.periodic)].reshape(n_cells, -1)
    x_pad = jnp.concatenate([positions, jnp.zeros((1, d), positions.dtype)])

    def chunk(members, cand):
        k = members.shape[0]
        xm, xc = x_pad[members], x_pad[cand]                        # (k, cap|C, d)
        r2 = 0.0
        for a in range(d):
            da = nl.space.minimum_image(xm[:, :, None, a] - xc[:, None, :, a], a)
            r2 = r2 + da * da
        mask = ((members[:, :, None] < n) & (cand[:, None, :] < n)
                & (members[:, :, None] != cand[:, None, :]) & (r2 < radius**2))
        mask = mask.reshape(k * cap, -1)
        cand = jnp.broadcast_to(cand[:, None, :], (k, cap, cand.shape[1])).reshape(k * cap, -1)
        mask, cand = lax.optimization_barrier((mask, cand))
        count = jnp.max(jnp.sum(mask, axis=1, dtype=jnp.int32))
        return _compact(mask, cand, nl.capacity, n), count

    per_chunk = max(1, _PAIRS_PER_CHUNK // (cap * cand.shape[1]))
    if n_cells <= per_chunk:
        idx, count = chunk(members, cand)
    else:
        n_chunks = -(-n_cells // per_chunk)
        pad = n_chunks * per_chunk - n_cells
        members = jnp.pad(members, ((0, pad), (0, 0)), constant_values=n)
        cand = jnp.pad(cand, ((0, pad), (0, 0)), constant_values=n)
        idx, count = lax.map(lambda mc: chunk(*mc),
                             (members.reshape(n_chunks, per_chunk, cap),
                              cand.reshape(n_chunks, per_chunk, -1)))
        idx, count = idx.reshape(-1, nl.capacity)[:n_cells * cap], jnp.max(count)
    # Where each particle sits in the table (particles beyond a full cell are lost: overflow).
    slot = jnp.zeros(n, jnp.int32).at[order].set(sorted_id * cap + jnp.minimum(rank, cap - 1))
    return idx, slot, count, jnp.max(occupancy)


def _within(nl, positions, cand, radius):
    """Which candidates ``cand`` (``(n, C)``, padded with ``n``) are within ``radius``."""
    n, d = positions.shape
    valid = (cand < n) & (cand != jnp.arange(n)[:, None])
    j = jnp.where(valid, cand, 0)
    xt = positions.T
    r2 = 0.0
    for k in range(d):
        dk = nl.space.minimum_image(xt[k][:, None] - xt[k][j], k)
        r2 = r2 + dk * dk
    return valid & (r2 < radius**2)


def _compact(mask, cand, capacity, fill):
    """The first ``capacity`` candidates of each row where ``mask`` holds, padded with ``fill``.

    Scatters and sorts are slow on XLA's CPU backend, so this selects with bit operations:
    the mask is packed into 32-bit words, slot ``k`` finds its word by binary search over
    the running popcount, then its bit by a five-step select within the word.
    """
    n, c = mask.shape
    n_words = -(-c // 32)
    bits = jnp.pad(mask, ((0, 0), (0, n_words * 32 - c))).reshape(n, n_words, 32)
    words = jnp.sum(bits.astype(jnp.uint32) << jnp.arange(32, dtype=jnp.uint32), axis=2,
                    dtype=jnp.uint32)
    inclusive = jnp.cumsum(lax.population_count(words).astype(jnp.int32), axis=1)
    # Materialise the small arrays once (XLA would otherwise fuse the packing into each use).
    words, inclusive = lax.optimization_barrier((words, inclusive))
    k = jnp.arange(capacity, dtype=jnp.int32)[None, :]
    # w = number of words whose inclusive count is <= k: the word holding the k-th set bit.
    w = jnp.zeros((n, capacity), jnp.int32)
    step = 1 << (n_words - 1).bit_length()
    while step:
        trial = w + step
        seen = jnp.take_along_axis(inclusive, jnp.minimum(trial, n_words) - 1, axis=1)
        w = jnp.where((trial <= n_words) & (seen <= k), trial, w)
        step //= 2
    w = jnp.minimum(w, n_words - 1)
    before = jnp.take_along_axis(inclusive, w, axis=1) - lax.population_count(
        jnp.take_along_axis(words, w, axis=1)).astype(jnp.int32)
    rank = k - before
    word = jnp.take_along_axis(words, w, axis=1)
    bit = jnp.zeros_like(rank)
    for width in (16, 8, 4, 2, 1):
        low = lax.population_count((word >> bit.astype(jnp.uint32))
                                   & jnp.uint32((1 << width) - 1)).astype(jnp.int32)
        go = rank >= low
        rank = jnp.where(go, rank - low, rank)
        bit = jnp.where(go, bit + width, bit)
    picked = jnp.take_along_axis(cand, jnp.minimum(w * 32 + bit, c - 1), axis=1)
    return jnp.where(k < inclusive[:, -1:], picked, fill).astype(jnp.int32)


def _build_pure(nl, positions):
    """``(idx, max count, cell overflow, max occupancy)`` from the pure-JAX build."""
    radius = nl.r_cut + nl.skin
    if nl.grid is None:
        cand = _candidate_pairs_all(positions)
        mask = _within(nl, positions, cand, radius)
        mask, cand = lax.optimization_barrier((mask, cand))
        count = jnp.max(jnp.sum(mask, 1, dtype=jnp.int32))
        return (_compact(mask, cand, nl.capacity, positions.shape[0]), count, jnp.array(False),
                jnp.int32(0))
    idx, slot, count, occupancy = _build_cells(nl, positions, radius)
    return idx[slot], count, occupancy > nl.cell_capacity, occupancy


def _build_native(nl, positions):
    """The same from the native cell-list kernel (``_native/neighbors.cc``): no cell
    capacity, so cells never overflow."""
    n, d = positions.shape
    box = (nl.space.box_vector(d, positions.dtype) if nl.space.periodic
           else jnp.zeros(d, positions.dtype))
    geometry = jnp.concatenate([jnp.asarray(nl.cell_origin, positions.dtype),
                                jnp.asarray(nl.cell_size, positions.dtype), box])
    grid = tuple(nl.grid) + (1,) * (3 - d)
    name = "simlib_neighbors_f32" if positions.dtype == jnp.float32 else "simlib_neighbors_f64"
    call = jax.ffi.ffi_call(name, (jax.ShapeDtypeStruct((n, nl.capacity), jnp.int32),
                                   jax.ShapeDtypeStruct((2,), jnp.int32)),
                            vmap_method="sequential")
    idx, stats = call(positions, geometry, periodic=int(nl.space.periodic), g0=grid[0],
                      g1=grid[1], g2=grid[2], reach=float(nl.r_cut + nl.skin))
    return idx, stats[0], jnp.array(False), stats[1]


def _build(nl, positions):
    """``(idx, max count, cell overflow, max occupancy)`` for a list built at ``positions``:
    the native kernel on the CPU where it is available, the pure-JAX build otherwise."""
    positions = lax.stop_gradient(positions)
    if (nl.grid is not None and positions.dtype in (jnp.float32, jnp.float64)
            and _native.load() is not None):
        return lax.platform_dependent(
            positions, cpu=lambda x: _build_native(nl, x), default=lambda x: _build_pure(nl, x))
    return _build_pure(nl, positions)


def missing_pairs(nl: NeighborList, positions: jax.Array) -> jax.Array:
    """How many pairs ``(i, j)`` within ``r_cut`` are absent from the list (O(n^2); debug)."""
    n = positions.shape[0]
    d = nl.space.displacement(positions[:, None, :], positions[None, :, :])
    close = (jnp.sum(d * d, axis=-1) < nl.r_cut**2) & ~jnp.eye(n, dtype=bool)
    listed = jnp.zeros((n, n + 1), bool).at[jnp.arange(n)[:, None], nl.idx].set(True)[:, :n]
    return jnp.sum(close & ~listed, dtype=jnp.int32)


def neighbor_list(space: Space, positions: ArrayLike, r_cut: float, skin: float = 0.3, *,
                  capacity: int | None = None, capacity_multiplier: float = 1.25,
                  cell_capacity: int | None = None, debug: bool = False) -> NeighborList:
    """Allocate and build a neighbour list of the pairs within ``r_cut + skin``.

    Call it eagerly (capacities and the cell grid are sized from the concrete positions);
    then ``nbrs.update(positions)`` inside jitted code, and :func:`simulate` for runs.

    Args:
        space: The space (``periodic(box)`` or ``free()``).
        positions: ``(n, d)`` positions.
        r_cut: The interaction cutoff.
        skin: Extra radius; the list stays valid until a particle moves ``skin / 2``.
        capacity: Neighbours kept per particle; by default ``capacity_multiplier`` times the
            largest count at ``positions``.
        capacity_multiplier: Headroom for density fluctuations.
        cell_capacity: Particles kept per cell; sized like ``capacity`` by default.
        debug: Check the list against all pairs at every update (O(n^2)); missed pairs are
            counted in ``missed_pairs`` and reported by :func:`simulate`.

    Example:
        >>> from simlib import particles as sp
        >>> positions, box = sp.lattice(4, 0.8442)
        >>> nbrs = sp.neighbor_list(sp.periodic(box), positions, r_cut=2.5, skin=0.3)
        >>> nbrs = nbrs.update(positions + 0.01)     # inside jit too, after each move
    """
    if not isinstance(space, Space):
        raise TypeError(f"neighbor_list: space must be free() or periodic(box), got {space!r}")
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[1] not in (1, 2, 3):
        raise ValueError(f"neighbor_list: positions must have shape (n, d) with d in 1..3, "
                         f"got {positions.shape}")
    if isinstance(positions, jax.core.Tracer):
        raise ValueError("neighbor_list: allocate the list outside jit (its capacity is sized "
                         "from concrete positions); inside jit use nbrs.update(positions)")
    if positions.shape[0] == 0:
        raise ValueError(f"neighbor_list: positions has no particles (shape "
                         f"{positions.shape}); a list needs at least one")
    finite = np.all(np.isfinite(np.asarray(positions)), axis=-1)
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(f"neighbor_list: positions must be finite; particle {i} is at "
                         f"{np.asarray(positions[i])}")
    if space.periodic:
        # As simulate(): beyond eps |x| > L / 1024 wrapping loses a particle's place in the box.
        box = np.broadcast_to(np.asarray(space.box, np.float64), (positions.shape[1],))
        far = np.any(np.abs(np.asarray(positions, np.float64))
                     * np.finfo(positions.dtype).eps > box / 1024, axis=-1)
        if far.any():
            i = int(np.argmax(far))
            raise ValueError(f"neighbor_list: positions are too far outside the periodic box "
                             f"to wrap into it; particle {i} is at {np.asarray(positions[i])}")
    if not r_cut > 0 or skin < 0:
        raise ValueError(f"neighbor_list: need r_cut > 0 and skin >= 0, got r_cut={r_cut!r}, "
                         f"skin={skin!r}")
    if capacity_multiplier < 1:
        raise ValueError(f"neighbor_list: capacity_multiplier must be >= 1, got "
                         f"{capacity_multiplier!r}")
    return _allocate(space, positions, float(r_cut), float(skin), capacity, cell_capacity,
                     float(capacity_multiplier), bool(debug))


def _allocate(space, positions, r_cut, skin, capacity, cell_capacity, multiplier, debug,
              min_capacity=0, min_cell_capacity=0):
    n, d = positions.shape
    reach = r_cut + skin
    x = np.asarray(positions, np.float64)
    if space.periodic:
        box = np.broadcast_to(np.asarray(space.box, np.float64), (d,))
        if reach > 0.5 * box.min():
            raise ValueError(f"neighbor_list: r_cut + skin = {reach} exceeds half the shortest "
                             f"box side {box.min()}; minimum images would be wrong")
        grid = np.floor(box / reach).astype(int)
        origin = np.zeros(d)
        extent = box
    else:
        origin = x.min(0)
        extent = np.maximum(x.max(0) - origin, reach)
        # (capped before the cast: a far-away particle must not overflow the integer)
        grid = np.maximum(np.floor(np.minimum(extent / reach, 2.0**20)).astype(int), 1)
        while np.prod(grid) > 2 * n + 27 and grid.max() > 1:   # sparse: larger cells
            grid = np.maximum(grid // 2, 1)
    size = extent / grid
    grid = tuple(int(g) for g in grid) if grid.min() >= 3 else None
    blank = NeighborList(
        jnp.zeros((n, 1), jnp.int32), positions, jnp.array(False), jnp.int32(0), jnp.int32(0),
        jnp.int32(0), jnp.int32(0), space, jnp.asarray(origin, positions.dtype),
        jnp.asarray(size, positions.dtype), r_cut=r_cut, skin=skin, capacity=n,
        cell_capacity=n, grid=grid, debug=debug)
    # Measure at these positions with room for everything, then allocate with headroom.
    if grid is not None:
        cell_id = np.asarray(_flat(_cell_index(blank, positions), grid))
        occupancy = int(np.bincount(cell_id, minlength=math.prod(grid)).max())
        if cell_capacity is None:
            cell_capacity = max(math.ceil(occupancy * multiplier) + 1, min_cell_capacity)
        blank = blank.replace(cell_capacity=int(cell_capacity))
    if capacity is None:
        count = int(_count_jit(blank.replace(capacity=1), positions))   # counts are not capped
        capacity = max(1, math.ceil(count * multiplier), min_capacity)
    nl = blank.replace(capacity=int(capacity))
    return _first_build(nl, positions)


@jax.jit
def _count_jit(nl, positions):
    return _build(nl, positions)[1]


@jax.jit
def _first_build(nl, positions):
    return nl.build(positions).replace(n_builds=jnp.int32(1))


def reallocate(nl: NeighborList, positions: ArrayLike,
               capacity_multiplier: float = 1.5) -> NeighborList:
    """A larger list after an overflow, built at ``positions``: room for ``capacity_multiplier``
    times the most neighbours (and cell occupants) seen so far or found at ``positions``.
    A :class:`~simlib.particles.CellList` gets larger cells the same way (each kind of pair
    search reallocates itself: ``nl.reallocate(positions, capacity_multiplier)``)."""
    return nl.reallocate(positions, capacity_multiplier)


def _reallocate_list(nl: NeighborList, positions, capacity_multiplier: float) -> NeighborList:
    return _allocate(nl.space, jnp.asarray(positions), nl.r_cut, nl.skin, None, None,
                     capacity_multiplier, nl.debug,
                     min_capacity=max(nl.capacity + 1,
                                      math.ceil(int(nl.max_neighbors) * capacity_multiplier)),
                     min_cell_capacity=math.ceil(int(nl.max_cell_occupancy) * capacity_multiplier))
