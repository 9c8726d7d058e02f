r"""Cell-dense pair sums: particles sorted into cells of fixed capacity, cells against cells.

A neighbour list gathers the coordinates of every listed pair (``x[idx]``: ``n * capacity``
indexed reads), which suits a CPU and is slow on an accelerator. Here the periodic box is
cut into a grid of cells at least ``r_cut`` wide, the particles are sorted by cell (one
``argsort``) and laid out as a dense array ``(gx, gy, gz, capacity)`` padded to a fixed
capacity per cell, and each cell meets its neighbour cells as dense ``capacity x capacity``
blocks (a half shell of them: each pair of cells once). The neighbour blocks come from
``jnp.roll`` of the whole grid: no per-pair index is ever gathered. Only ``n`` rows are
gathered, to lay the particles out and to read their forces back. Cell lists: Allen &
Tildesley, *Computer Simulation of Liquids*, 2nd ed. (2017), §5.3; dense cell blocks as in
GPU codes, e.g. Anderson, Lorenz & Travesset, J. Comput. Phys. 227, 5342 (2008).

The price is wasted pairs: a block holds ``capacity^2`` slots where a cell pair has on
average ``(rho w^d)^2`` pairs, of which only those within ``r_cut`` count.
:meth:`CellList.pair_slots` says how many slots one evaluation computes.

A :class:`CellList` stands wherever a :class:`NeighborList` does (``energy(x, params,
neighbors=cells)``, ``simulate(..., neighbors=cells)``). By default it is rebuilt at every
update (a sort, no skin); with ``skin > 0`` the cells are ``r_cut + skin`` wide and re-sorted
only once some particle has moved ``skin / 2``, as a Verlet list is (Allen & Tildesley §5.1).
``shell="full"`` meets all ``3^d`` cells around each one and computes every pair twice, with
no rolling of the partners' forces back onto their cells.

A cell over capacity sets the sticky ``overflow`` flag, which ``simulate``
repairs as it does for neighbour lists (:func:`~simlib.particles.reallocate`, then the
chunk again); a box that shrinks below ``grid * r_cut`` on some side (a barostat) would
miss pairs, and counts in ``missed_pairs`` instead.
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
from ._mixing import PairParams
from ._neighbors import NeighborList, neighbor_list
from ._space import Space


@jax.tree_util.register_pytree_node_class
class CellList:
    """Particles sorted into a periodic grid of cells of fixed capacity (a pytree).

    Build it with :func:`cell_list`.

    Attributes:
        slot_atom: ``(n_cells * capacity,)`` int32: the particle in each cell slot, ``n``
            for an empty slot.
        atom_slot: ``(n,)`` int32: the slot of each particle (``n_cells * capacity`` if its
            cell was full).
        overflow: Whether any build since allocation found a cell over capacity (sticky).
        max_cell_occupancy: The most particles seen in one cell.
        n_builds: How many times the cells were built.
        missed_pairs: 1 if the box became narrower than ``grid * r_cut`` on some side in an
            update (pairs within ``r_cut`` could then be missed), else 0.
        reference_positions: ``(n, d)``: the positions at the last build.
        space, r_cut, capacity, grid: Its configuration (``capacity``: slots per cell).
        skin: Cells are ``r_cut + skin`` wide and rebuilt only once some particle has moved
            more than ``skin / 2`` since the last build (``0``: at every update).
        shell: ``"half"`` (each pair of cells once, the partner's force rolled back) or
            ``"full"`` (all ``3^d`` cells around each one, every pair from both ends).
        kernel: Which pass sums Lennard-Jones over the cells (see :func:`cell_list`).
    """

    debug = False

    def __init__(self, slot_atom: jax.Array, atom_slot: jax.Array, overflow: jax.Array,
                 max_cell_occupancy: jax.Array, n_builds: jax.Array, missed_pairs: jax.Array,
                 reference_positions: jax.Array, space: Space, *, r_cut: float, capacity: int,
                 grid: tuple[int, ...], skin: float = 0.0, shell: str = "half",
                 kernel: str = "auto") -> None:
        self.slot_atom = slot_atom
        self.atom_slot = atom_slot
        self.overflow = overflow
        self.max_cell_occupancy = max_cell_occupancy
        self.n_builds = n_builds
        self.missed_pairs = missed_pairs
        self.reference_positions = reference_positions
        self.space = space
        self.r_cut = r_cut
        self.capacity = capacity
        self.grid = grid
        self.skin = skin
        self.shell = shell
        self.kernel = kernel

    def _static(self):
        return dict(r_cut=self.r_cut, capacity=self.capacity, grid=self.grid, skin=self.skin,
                    shell=self.shell, kernel=self.kernel)

    def tree_flatten(self):
        return ((self.slot_atom, self.atom_slot, self.overflow, self.max_cell_occupancy,
                 self.n_builds, self.missed_pairs, self.reference_positions, self.space),
                tuple(sorted(self._static().items())))

    @classmethod
    def tree_unflatten(cls, static, children):
        return cls(*children, **dict(static))

    def __repr__(self):
        return (f"CellList(n={self.n_particles}, grid={self.grid}, capacity={self.capacity}, "
                f"r_cut={self.r_cut}, skin={self.skin}, shell={self.shell!r}, "
                f"kernel={self.kernel!r})")

    def replace(self, **kw) -> CellList:
        children = dict(slot_atom=self.slot_atom, atom_slot=self.atom_slot,
                        overflow=self.overflow, max_cell_occupancy=self.max_cell_occupancy,
                        n_builds=self.n_builds, missed_pairs=self.missed_pairs,
                        reference_positions=self.reference_positions, space=self.space)
        static = self._static()
        for k, v in kw.items():
            (static if k in static else children)[k] = v
        return CellList(**children, **static)

    @property
    def n_particles(self) -> int:
        return self.atom_slot.shape[0]

    @property
    def n_cells(self) -> int:
        return math.prod(self.grid)

    def pair_slots(self) -> int:
        """Pair slots one evaluation computes: ``n_cells * (3^d + 1)/2 * capacity^2`` for a
        half shell of neighbour cells (each pair within ``r_cut`` is one of them), and
        ``n_cells * 3^d * capacity^2`` for a full shell (each pair twice)."""
        blocks = 3 ** len(self.grid) if self.shell == "full" else (3 ** len(self.grid) + 1) // 2
        return self.n_cells * blocks * self.capacity**2

    def build(self, positions) -> CellList:
        """The cells rebuilt at ``positions`` (jittable): one sort by cell."""
        if not (inside_trace() or is_tracer((self, positions))):
            return _build_jit(self, positions)
        slot_atom, atom_slot, occupancy = _sort_into_cells(self, positions)
        box = self.space.box_vector(len(self.grid), positions.dtype)
        narrow = jnp.any(box / jnp.asarray(self.grid, positions.dtype) < self.r_cut + self.skin)
        return self.replace(
            slot_atom=slot_atom, atom_slot=atom_slot, reference_positions=positions,
            overflow=self.overflow | (occupancy > self.capacity),
            max_cell_occupancy=jnp.maximum(self.max_cell_occupancy, occupancy),
            n_builds=self.n_builds + 1,
            missed_pairs=jnp.maximum(self.missed_pairs, narrow.astype(jnp.int32)))

    def update(self, positions) -> CellList:
        """Rebuilt if needed (:meth:`needs_rebuild`, a ``lax.cond``); without a skin, at every
        update (the same as :meth:`build`)."""
        if self.skin == 0.0:
            return self.build(positions)
        if not (inside_trace() or is_tracer((self, positions))):
            return _update_jit(self, positions)
        return lax.cond(self.needs_rebuild(positions), lambda: self.build(positions),
                        lambda: self)

    def needs_rebuild(self, positions) -> jax.Array:
        """Whether some particle moved more than ``skin / 2`` since the last build (always,
        without a skin). Between builds a particle stays within ``skin / 2`` of its place at
        the build, so a pair within ``r_cut`` was within ``r_cut + skin`` then: in the same
        or adjacent cells of width ``r_cut + skin``."""
        if self.skin == 0.0:
            return jnp.asarray(True)
        d = positions.T - self.reference_positions.T
        r2 = sum(self.space.minimum_image(d[k], k) ** 2 for k in range(d.shape[0]))
        return ~(jnp.max(r2) <= (0.5 * self.skin) ** 2)      # a nan displacement rebuilds

    def reallocate(self, positions, capacity_multiplier: float = 1.5) -> CellList:
        """Larger cells built at ``positions``: see :func:`reallocate_cells`."""
        return reallocate_cells(self, positions, capacity_multiplier)

    def did_overflow(self) -> bool:
        """``overflow`` as a Python bool (eager use)."""
        return bool(self.overflow)


@jax.jit
def _build_jit(cells, positions):
    return cells.build(positions)


@jax.jit
def _update_jit(cells, positions):
    return cells.update(positions)


def _cell_ids(space: Space, grid, positions):
    """The flat cell id of each particle (positions wrapped into the box first; a
    non-finite position goes to cell 0, where its distances are nan and mask themselves)."""
    g = jnp.asarray(grid, positions.dtype)
    box = space.box_vector(len(grid), positions.dtype)
    c = jnp.floor(space.wrap(positions) / (box / g))
    c = jnp.clip(jnp.where(jnp.isfinite(c), c, 0.0), 0.0, g - 1.0).astype(jnp.int32)
    flat = c[:, 0]
    for k in range(1, len(grid)):
        flat = flat * grid[k] + c[:, k]
    return flat


def _sort_into_cells(cells: CellList, positions):
    """``(slot_atom, atom_slot, largest occupancy)`` by a stable sort of the cell ids."""
    n = positions.shape[0]
    n_cells, cap = cells.n_cells, cells.capacity
    cid = _cell_ids(cells.space, cells.grid, positions)
    order = jnp.argsort(cid, stable=True).astype(jnp.int32)
    sorted_cid = cid[order]
    counts = jnp.zeros(n_cells, jnp.int32).at[cid].add(1)
    start = jnp.cumsum(counts) - counts
    rank = jnp.arange(n, dtype=jnp.int32) - start[sorted_cid]
    slot = jnp.where(rank < cap, sorted_cid * cap + rank, n_cells * cap)
    slot_atom = jnp.full(n_cells * cap, n, jnp.int32).at[slot].set(order, mode="drop")
    atom_slot = jnp.zeros(n, jnp.int32).at[order].set(slot)
    return slot_atom, atom_slot, jnp.max(counts)


def cell_list(space: Space, positions: ArrayLike, r_cut: float, *, capacity: int | None = None,
              capacity_multiplier: float = 1.5, skin: float = 0.0,
              shell: str = "half", kernel: str = "auto") -> CellList:
    """Sort particles into a periodic grid of cells at least ``r_cut`` wide, for the
    cell-dense pair sum (the accelerator path; see the module docstring).

    Args:
        space: A :func:`~simlib.particles.periodic` space; its box must be at least
            ``3 r_cut`` on every side (3 cells, so that the 27 cells around one are distinct;
            use :func:`~simlib.particles.neighbor_list` in smaller boxes).
        positions: ``(n, d)`` positions (concrete: the grid and capacity are sized from them).
        r_cut: The cutoff of the energy it serves.
        capacity: Slots per cell; default ``capacity_multiplier`` times the fullest cell at
            ``positions``, rounded up to a multiple of 8.
        capacity_multiplier: Headroom of the default capacity.
        skin: Cells ``r_cut + skin`` wide, rebuilt only when some particle has moved more
            than ``skin / 2`` (fewer sorts, more pair slots); ``0`` rebuilds at every update.
        shell: ``"half"``: each pair of cells once, the partner's force rolled back onto its
            cell (Newton's third law); ``"full"``: all ``3^d`` cells around each one, every
            pair computed from both ends and forces kept on the home cell only (twice the
            pair slots, no rolling back).
        kernel: The pass that sums Lennard-Jones over the cells in ``energy_and_forces`` and
            ``virial`` (the energy alone and its gradient keep the pure-JAX pass):
            ``"pallas"``, the Pallas kernel (``_cells_pallas``; one ``sigma`` and
            ``epsilon``, float32, 3D, the half shell; compiled on a TPU, in Pallas's
            interpret mode elsewhere: slow, for tests); ``"jax"``, the pure-JAX pass;
            ``"auto"`` (the default), the pure-JAX pass for an evaluation. In
            :func:`simulate`, an NVE run with one mass over cells built with ``"pallas"``,
            or ``"auto"`` on a TPU (:func:`keeps_layout`), keeps its state in the kernel's
            cell layout (``_layout``): on a TPU v5e that ran 2.8x the pure-JAX pass at
            256,000 atoms, where one evaluation by the kernel, which gathers the atoms into
            the layout, ran 0.77x (docs/particles.md, "Accelerators"). Other
            energies always take the pure-JAX pass.
    """
    if not isinstance(space, Space) or not space.periodic:
        raise ValueError("cell_list: space must be periodic(box); the cell-dense path tiles a "
                         "periodic box (use neighbor_list in free space)")
    if is_tracer((space.box, positions)):
        raise TypeError("cell_list: positions and the box must be concrete (the grid and the "
                        "capacity are sized from them); build the cells outside jit")
    positions = jnp.asarray(positions)
    if positions.ndim != 2 or positions.shape[0] == 0:
        raise ValueError(f"cell_list: positions must have shape (n, d) with n > 0, got "
                         f"{positions.shape}")
    d = positions.shape[1]
    if not np.all(np.isfinite(np.asarray(positions))):
        raise ValueError("cell_list: positions has non-finite entries")
    if not (isinstance(r_cut, (int, float)) and math.isfinite(r_cut) and r_cut > 0):
        raise ValueError(f"cell_list: r_cut must be a positive finite number, got {r_cut!r}")
    if not (isinstance(skin, (int, float)) and math.isfinite(skin) and skin >= 0):
        raise ValueError(f"cell_list: skin must be a finite number >= 0, got {skin!r}")
    if shell not in ("half", "full"):
        raise ValueError(f"cell_list: shell must be 'half' or 'full', got {shell!r}")
    if kernel not in ("auto", "jax", "pallas"):
        raise ValueError(f"cell_list: kernel must be 'auto', 'jax' or 'pallas', got "
                         f"{kernel!r}")
    box = np.broadcast_to(np.asarray(space.box, float), (d,))
    width = r_cut + skin
    grid = tuple(int(g) for g in np.floor(box / width))
    if min(grid) < 3:
        raise ValueError(f"cell_list: the box {box.tolist()} holds fewer than 3 cells of width "
                         f"r_cut + skin={width} on some side (grid {grid}); the 27 cells "
                         f"around one would not be distinct: use neighbor_list in a box this "
                         f"small")
    if capacity is None:
        counts = np.bincount(np.asarray(_cell_ids(space, grid, positions)),
                             minlength=math.prod(grid))
        capacity = max(8, 8 * math.ceil(capacity_multiplier * int(counts.max()) / 8))
    if not (isinstance(capacity, (int, np.integer)) and capacity > 0):
        raise ValueError(f"cell_list: capacity must be a positive integer, got {capacity!r}")
    n = positions.shape[0]
    empty = CellList(jnp.full(math.prod(grid) * int(capacity), n, jnp.int32),
                     jnp.zeros(n, jnp.int32), jnp.asarray(False), jnp.asarray(0, jnp.int32),
                     jnp.asarray(0, jnp.int32), jnp.asarray(0, jnp.int32), positions, space,
                     r_cut=float(r_cut), capacity=int(capacity), grid=grid, skin=float(skin),
                     shell=shell, kernel=kernel)
    return empty.build(positions)


def keeps_layout(kernel: str, backend: str | None = None) -> bool:
    """Whether :func:`simulate` keeps an NVE run's state in the Pallas kernel's layout over
    cells built with ``kernel``, on ``backend`` (default ``jax.default_backend()``):
    ``"pallas"`` always, ``"auto"`` on a TPU, ``"jax"`` never (the energy and masses
    permitting: ``_layout.applies``)."""
    if kernel == "auto":
        return (jax.default_backend() if backend is None else backend) == "tpu"
    return kernel == "pallas"


def pair_search(space: Space, positions: ArrayLike, r_cut: float, skin: float = 0.3, *,
                method: str = "auto", backend: str | None = None) -> NeighborList | CellList:
    """The pair structure that suits the backend: a neighbour list on the CPU, cells elsewhere.

    ``method="auto"`` gives :func:`~simlib.particles.neighbor_list` on the CPU (where the
    native list kernels run) and :func:`cell_list` on an accelerator (where per-pair gathers
    are slow; docs/particles.md, "Accelerators"), falling back to the list where cells
    cannot serve (free space, or a box under ``3 (r_cut + skin)`` on some side). The cells
    take the same skin (sorted again only when some particle has moved half of it), the
    half shell and 1.25 times the fullest cell's count as capacity: on one TPU v5e chip at
    256,000 Lennard-Jones atoms that ran 2.5x the steps per second of cells sorted at every
    step (benchmarks/results/accelerator_tpu_v5e_ljcells_skin.json); on a TPU,
    :func:`simulate` then keeps an NVE run's state in the Pallas kernel's layout
    (:func:`keeps_layout`), 2.8x faster again. ``"list"`` and
    ``"cells"`` choose one. Either result goes wherever ``neighbors=`` is taken.

    Args:
        space, positions, r_cut: As for :func:`~simlib.particles.neighbor_list`.
        skin: The skin of the list or of the cells.
        method: ``"auto"``, ``"list"`` or ``"cells"``.
        backend: The backend to choose for (default ``jax.default_backend()``).
    """
    if method not in ("auto", "list", "cells"):
        raise ValueError(f"pair_search: method must be 'auto', 'list' or 'cells', got "
                         f"{method!r}")
    if method == "auto":
        backend = jax.default_backend() if backend is None else backend
        box = None if not (isinstance(space, Space) and space.periodic) else space.box
        fits = box is not None and bool(np.all(np.asarray(box, float) >= 3 * (r_cut + skin)))
        method = "cells" if backend != "cpu" and fits else "list"
    if method == "cells":
        return cell_list(space, positions, r_cut, skin=skin, capacity_multiplier=1.25)
    return neighbor_list(space, positions, r_cut, skin)


def reallocate_cells(cells: CellList, positions, capacity_multiplier: float = 1.5) -> CellList:
    """Larger cells after an overflow: room for ``capacity_multiplier`` times the fullest cell
    seen so far or found at ``positions``."""
    fresh = cell_list(cells.space, positions, cells.r_cut,
                      capacity_multiplier=capacity_multiplier, skin=cells.skin, shell=cells.shell,
                      kernel=cells.kernel)
    capacity = max(fresh.capacity, cells.capacity + 8,
                   8 * math.ceil(capacity_multiplier * int(cells.max_cell_occupancy) / 8))
    return cell_list(cells.space, positions, cells.r_cut, capacity=capacity, skin=cells.skin,
                     shell=cells.shell, kernel=cells.kernel)


def _half_shell(d: int) -> np.ndarray:
    """The cell itself and the ``(3^d - 1) / 2`` neighbour offsets that come first in
    lexicographic order after it: each unordered pair of cells once (Newton's third law)."""
    offsets = [o for o in itertools.product((-1, 0, 1), repeat=d) if o > (0,) * d]
    return np.asarray([(0,) * d, *offsets], np.int32)


BLOCK_ELEMENTS = 20 * 2 ** 20
"""Most pair slots one shell offset computes at once: above it the cells are taken in
chunks (a ``lax.map``) so that the pair blocks' temporaries stay under ~80 MB in float32.
Measured on a TPU v5e chip (``benchmarks/ljcells_split.py``, LJ, capacity 40): one force
pass at 10^6 atoms took 212 ms in one chunk of 81 M slots, 127 ms in 2, 106 ms in 4-5 and
111 ms in 20; at 256,000 atoms (19.5 M slots) one chunk was fastest (20 ms, 22 ms in 2)."""


def _full_shell(d: int) -> np.ndarray:
    """All ``3^d`` offsets around a cell, itself included."""
    return np.asarray(list(itertools.product((-1, 0, 1), repeat=d)), np.int32)


def cell_pass(energy, positions, params, cells: CellList, want_derivative: bool):
    r"""The pair sum over cells, a shell of neighbour blocks at a time.

    Half shell: each cell meets itself (pairs ``i < j``) and the ``(3^d - 1)/2`` neighbour
    cells of the half shell; the force of a pair goes to both particles (the neighbour side
    is rolled back onto its own cell), so every pair within ``r_cut`` is computed once.
    Full shell: each cell meets all ``3^d`` cells around it (pairs ``i != j``), keeps the
    forces on its own particles, and every pair is computed from both ends (the energy and
    the virial are halved).

    Returns ``(U, per-slot forces (n_cells * capacity, d) or None, W)``: the energy
    :math:`U = \sum_{i<j} u(r_{ij})` and the virial :math:`W = -\sum_{i<j} r u'(r)` (``None``
    without the derivative). ``energy`` is a :class:`~simlib.particles.PairEnergy`; its
    kernel ``_terms`` masks empty slots, the self pair and pairs beyond ``r_cut``.
    """
    n, d = positions.shape
    grid, cap = cells.grid, cells.capacity
    n_cells = cells.n_cells
    full = cells.shell == "full"
    shape = (*grid, cap)
    occupied = (cells.slot_atom < n).reshape(shape)
    atom = cells.slot_atom.reshape(shape)
    safe = jnp.where(cells.slot_atom < n, cells.slot_atom, 0)
    x = [positions[:, k][safe].reshape(shape) for k in range(d)]      # n rows, per axis
    axes = tuple(range(d))

    # Per-slot arrays are rolled in the grid layout (*grid, capacity) and paired in the
    # layout (capacity, n_cells): the long cell axis last, so that the pair blocks
    # (capacity, capacity, n_cells) fill an accelerator's vector lanes (a capacity-long
    # last axis would pad each row of 48 to 128 lanes on a TPU).
    def lanes(a):
        return a.reshape(n_cells, cap).T

    def grid_of(b):
        return b.T.reshape(shape)

    def cellwise(a):
        return jnp.asarray(a)[safe].reshape(shape)

    n_chunks = -(-cap * cap * n_cells // BLOCK_ELEMENTS)
    width = -(-n_cells // n_chunks)                # cells (lanes) per chunk
    pad = n_chunks * width - n_cells

    def padded(a):                                 # (cap, n_cells) -> (n_chunks, cap, width)
        a = jnp.pad(a, ((0, 0), (0, pad)))
        return jnp.moveaxis(a.reshape(cap, n_chunks, width), 1, 0)

    def unpadded(a):                               # (n_chunks, ..., width) -> (..., n_cells)
        return jnp.moveaxis(a, 0, -2).reshape(*a.shape[1:-1], n_chunks * width)[..., :n_cells]

    def block(offset):
        def roll(a, sign=-1):
            return jnp.roll(a, tuple(sign * offset[k] for k in range(d)), axes)

        # the partners' slots, rolled in the grid layout, then both sides in lanes
        side_i = dict(x=[lanes(x[k]) for k in range(d)], atom=lanes(atom),
                      occupied=lanes(occupied))
        side_j = dict(x=[lanes(roll(x[k])) for k in range(d)], atom=lanes(roll(atom)),
                      occupied=lanes(roll(occupied)))
        side_i, side_j = jax.tree.map(padded, (side_i, side_j))

        def chunk(parts):
            c, si, sj = parts
            dr = [energy.space.minimum_image(si["x"][k][:, None, :] - sj["x"][k][None, :, :],
                                             k) for k in range(d)]
            # a distinct cell: every pair of occupied slots; the cell itself: i < j (half
            # shell) or i != j (full shell) only
            ai, aj = si["atom"][:, None, :], sj["atom"][None, :, :]
            order = jnp.where(jnp.all(offset == 0), (ai != aj) if full else (ai < aj), True)
            valid = si["occupied"][:, None, :] & sj["occupied"][None, :, :] & order

            def per_pair(a, rolled):               # a per-particle (n,) array -> this chunk
                a = cellwise(a)
                a = lanes(roll(a) if rolled else a)
                return lax.dynamic_index_in_dim(padded(a), c, 0, keepdims=False)

            pp = PairParams(params, n, lambda a: per_pair(a, False)[:, None, :],
                            lambda a: per_pair(a, True)[None, :, :], energy.rules)
            u, cc, r = energy._terms(dr, valid, pp, want_derivative)
            if not want_derivative:
                return jnp.sum(u), None, None, None
            fi = jnp.stack([-jnp.sum(cc * dr[k], axis=1) for k in range(d)])
            fj = None if full else jnp.stack([jnp.sum(cc * dr[k], axis=0) for k in range(d)])
            return jnp.sum(u), fi, fj, -jnp.sum(cc * r * r)

        if n_chunks == 1:
            u, fi, fj, w = jax.tree.map(lambda a: a[None], chunk(
                (0, *jax.tree.map(lambda a: a[0], (side_i, side_j)))))
        else:
            u, fi, fj, w = lax.map(chunk, (jnp.arange(n_chunks), side_i, side_j))
        u = jnp.sum(u)
        if not want_derivative:
            return u, None, None
        fi, w = unpadded(fi), jnp.sum(w)                                # (d, cap, cells)
        if full:
            return u, fi, w
        fj = unpadded(fj)
        fj = jnp.stack([lanes(roll(grid_of(fj[k]), sign=1)) for k in range(d)])
        return u, fi + fj, w

    def body(acc, offset):
        u, f, w = block(offset)
        if not want_derivative:
            return (acc[0] + u, None, None), None
        return (acc[0] + u, acc[1] + f, acc[2] + w), None

    zero = jnp.zeros((), positions.dtype)
    init = (zero, jnp.zeros((d, cap, n_cells), positions.dtype) if want_derivative else None,
            zero if want_derivative else None)
    shell = _full_shell(d) if full else _half_shell(d)
    (u, f, w), _ = lax.scan(body, init, jnp.asarray(shell))
    if full:                                  # every pair was counted from both ends
        u = 0.5 * u
        w = None if w is None else 0.5 * w
    if f is not None:
        f = jnp.transpose(f, (2, 1, 0)).reshape(-1, d)       # slot = cell * capacity + s
    return u, f, w


def check_cells(cells: CellList, positions) -> None:
    """What a cell list adds to the neighbour-list checks of an energy: its grid's
    dimension against the positions'."""
    if len(cells.grid) != positions.shape[1]:
        raise ValueError(f"the cell list is {len(cells.grid)}-D, positions are "
                         f"{positions.shape[1]}-D")
