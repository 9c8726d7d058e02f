r"""Lennard-Jones over cells as a Pallas kernel for TPUs: cells in vector lanes, slots in
sublanes, the half shell of neighbour blocks of every cell read as dense tiles.

The grid of a :class:`~simlib.particles.CellList` is padded by one periodic image cell on
every side, flattened, and laid out as ``(3, capacity, lanes)``: each coordinate of every
slot, one padded cell per vector lane, the whole array resident in VMEM. In that order the
cell at offset ``o = (a, b, c)`` from a cell sits a fixed ``a (g_y+2)(g_z+2) + b (g_z+2) + c``
lanes away, so the kernel reads the neighbour blocks of ``LANES`` consecutive cells as
shifted windows of the same array (an aligned load and a lane rotation each). For each
partner slot ``b`` it meets all ``capacity`` target slots with slot ``b`` of the partner cell
in every lane: a ``(capacity, LANES)`` tile of pairs, no index gathered. Half shell: each
cell meets itself (slot pairs ``a < b``) and the 13 offsets after ``(0, 0, 0)``; a pair's
force goes to the target and, summed over the target slots, to the partner's lanes in a
resident force array, whose image cells are folded back onto their cells at the end. With
:math:`s = \sigma^2/r^2`,

.. math::
    u = 4\epsilon (s^6 - s^3) - u(r_c), \qquad
    \mathbf f_i = 24\epsilon (2 s^6 - s^3) / r^2 \, (\mathbf r_i - \mathbf r_j),

summed over pairs with :math:`r < r_c`; the virial is :math:`W = \sum r\cdot f`. Slots are
unwrapped to the image nearest their (padded) cell's centre, so that no pair needs a minimum
image; empty slots sit at ``-FAR`` as partners and ``+FAR`` as targets, beyond every cutoff.
Only float32, an orthorhombic periodic box and one ``sigma`` and ``epsilon``; the resident
arrays must fit VMEM (:func:`resident_bytes`).

Cost on a TPU v5e (docs/particles.md, "Accelerators"): the pair tiles are cheap; laying the
particles out in cell order at every call (a gather of ``3 x capacity`` values per padded
cell) is not. So :func:`~simlib.particles.simulate` keeps an NVE run's state in this
layout between sorts of the cells (``_layout``) and calls :func:`lane_pass` directly; one
evaluation (:func:`lj_cells`) pays the gathers.

Dense cell blocks: Anderson, Lorenz & Travesset, J. Comput. Phys. 227, 5342 (2008); cell
lists: Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed. (2017), §5.3. The
pure-JAX cell pass (``_cells.cell_pass``) is the reference and serves derivatives; CI runs
this kernel in Pallas's interpret mode on the CPU (tests/test_cells_pallas.py).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl

FAR = 1.0e15
"""Where empty slots sit."""

LANES = 128
"""Cells per kernel step: one vector register's lanes."""

SELF = 13
"""The index of the offset ``(0, 0, 0)`` among the 27 in lexicographic order."""


class Geometry(NamedTuple):
    """Where the padded grid's cells sit in the lanes (all static)."""

    padded: tuple[int, int, int]       # (g_x + 2, g_y + 2, g_z + 2)
    margin: int                        # lanes before padded cell 0
    total: int                         # lanes in all
    first: int                         # first lane of the kernel's target blocks
    blocks: int                        # target blocks of LANES lanes
    windows: tuple[tuple[int, int], ...]   # per offset: (q, r), shift = q LANES + r


@functools.lru_cache(maxsize=64)
def geometry(grid: tuple[int, int, int]) -> Geometry:
    """The lane layout of the padded ``grid``: margins wide enough for every window, and
    target blocks over the planes ``x = 1 ... g_x`` (the two all-image planes skipped)."""
    padded = tuple(g + 2 for g in grid)
    plane, row = padded[1] * padded[2], padded[2]
    reach = plane + row + 1
    margin = -(-(reach + 2 * LANES) // LANES) * LANES
    first = (margin + plane) // LANES * LANES
    end = -(-(margin + (padded[0] - 1) * plane) // LANES) * LANES
    total = -(-(end + reach + 2 * LANES) // LANES) * LANES
    windows = []
    for a, b, c in itertools.product((-1, 0, 1), repeat=3):
        shift = a * plane + b * row + c
        windows.append((shift // LANES, shift % LANES))
    return Geometry(padded, margin, total, first, (end - first) // LANES, tuple(windows))


@functools.lru_cache(maxsize=64)
def _lane_tables(grid: tuple[int, int, int]):
    """Per lane: the cell it holds (``n_cells`` for none), the padded cell's index on each
    axis (for its centre) and whether it is a real (not image) cell; and per cell its
    lane."""
    geo = geometry(grid)
    n_cells = math.prod(grid)
    f = np.arange(geo.total) - geo.margin
    valid = (f >= 0) & (f < math.prod(geo.padded))
    p = np.stack(np.unravel_index(np.where(valid, f, 0), geo.padded))        # (3, total)
    src = np.ravel_multi_index(tuple((p[k] - 1) % grid[k] for k in range(3)), grid)
    lane_cell = np.where(valid, src, n_cells).astype(np.int32)
    interior = valid & np.all((p >= 1) & (p <= np.asarray(grid)[:, None]), axis=0)
    c = np.stack(np.unravel_index(np.arange(n_cells), grid))
    cell_lane = (geo.margin + np.ravel_multi_index(tuple(c + 1), geo.padded)).astype(np.int32)
    return lane_cell, p.astype(np.float64), interior, cell_lane


def interpret() -> bool:
    """Whether the kernel runs in Pallas's interpret mode: off a TPU."""
    return jax.default_backend() != "tpu"


def resident_bytes(grid: tuple[int, int, int], capacity: int, itemsize: int = 4) -> int:
    """VMEM the kernel asks for: the resident coordinates and forces, double buffered, and
    8 MiB more."""
    return 2 * 2 * 3 * capacity * geometry(grid).total * itemsize + 8 * 2**20


def fits(grid: tuple[int, int, int], capacity: int, vmem: int | None) -> bool:
    """Whether the kernel's resident arrays (:func:`resident_bytes`) fit ``vmem`` bytes of
    VMEM (``None``: not known, off a TPU, where interpret mode has no limit)."""
    return vmem is None or resident_bytes(grid, capacity) <= vmem


def _kernel(geo: Geometry, want_virial: bool, scalars_ref, inside_ref, x_ref, sums_ref,
            forces_ref, win_ref, partner_ref):
    """One step: ``LANES`` cells' ``capacity`` target slots against the half shell of
    neighbour cells (the cell itself, slot pairs ``a < b``, and the 13 offsets after it), a
    partner slot (one sublane, broadcast) at a time. Each partner's force is added into the
    resident force array at its own lanes (image cells included, folded back afterwards);
    image cells take no part as targets."""
    from jax.experimental.pallas import tpu as pltpu
    rc2, sig2, eps4, eps24, ushift = (scalars_ref[k] for k in range(5))
    cap = x_ref.shape[1]
    base = np.int32(geo.first) + pl.program_id(0) * np.int32(LANES)
    here = pl.ds(pl.multiple_of(base, LANES), LANES)
    xt = [x_ref[k, :, here] for k in range(3)]
    keep = (inside_ref[...] > 0) & (xt[0] > -0.5 * FAR)     # image cells and empty slots:
    dtype = xt[0].dtype     # typed constants: a weak one is float64 under x64, which Mosaic
    far, one, zero = (jnp.asarray(c, dtype) for c in (FAR, 1.0, 0.0))  # cannot truncate
    xt = [jnp.where(keep, a, far) for a in xt]               # far from every partner

    @pl.when(pl.program_id(0) == 0)
    def _():
        forces_ref[...] = jnp.zeros_like(forces_ref)

    rows = lax.broadcasted_iota(jnp.int32, xt[0].shape, 0)

    def pair(acc, b, own):
        xp = win_ref[:, pl.ds(b, 1), :]                          # (3, 1, LANES)
        d = [xt[k] - xp[k] for k in range(3)]
        r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2]
        mask = r2 < rc2
        if own:                                                  # in the cell itself: a < b
            mask = mask & (rows < b)
        inv = 1.0 / jnp.where(mask, r2, one)
        s3 = sig2 * inv
        s3 = s3 * s3 * s3
        c = jnp.where(mask, eps24 * s3 * (2.0 * s3 - 1.0) * inv, zero)
        u = jnp.where(mask, eps4 * s3 * (s3 - 1.0) - ushift, zero)
        f = [c * d[k] for k in range(3)]
        for k in range(3):
            partner_ref[k, pl.ds(b, 1), :] = -jnp.sum(f[k], axis=0, keepdims=True)
        out = [acc[k] + f[k] for k in range(3)] + [acc[3] + u]
        if want_virial:
            out.append(acc[4] + c * r2)
        return tuple(out)

    acc = (jnp.zeros_like(xt[0]),) * (5 if want_virial else 4)
    first, slots = jnp.int32(0), jnp.int32(cap)    # int32 indices and shifts, also under x64
    for o in range(SELF, 27):
        q, r = geo.windows[o]
        start = pl.multiple_of(base + np.int32(q * LANES), LANES)
        window = pl.ds(start, 2 * LANES)
        for k in range(3):
            w = x_ref[k, :, window]
            if r:
                w = pltpu.roll(w, np.int32(2 * LANES - r), 1)     # lane j <- lane j + r
            win_ref[k] = w[:, :LANES]
        acc = lax.fori_loop(first, slots, functools.partial(
            lambda b, a, own: pair(a, b, own), own=o == SELF), acc)
        for k in range(3):       # the partners' forces, back to their own lanes
            add = jnp.concatenate([partner_ref[k], jnp.zeros_like(partner_ref[k])], 1)
            if r:
                add = pltpu.roll(add, np.int32(r), 1)             # lane j + r <- lane j
            forces_ref[k, :, window] = forces_ref[k, :, window] + add
    for k in range(3):
        forces_ref[k, :, here] = forces_ref[k, :, here] + acc[k]
    for k, a in enumerate(acc[3:]):
        sums_ref[k] = a


def lane_atoms(slot_atom, grid: tuple[int, int, int], capacity: int, n: int):
    """``(capacity, lanes)``: the particle in each slot of the padded grid's cells, one cell
    per lane (:func:`geometry`); ``n`` for an empty slot or a lane without a cell."""
    lane_cell = _lane_tables(grid)[0]
    rows = jnp.concatenate([slot_atom.reshape(-1, capacity),
                            jnp.full((1, capacity), n, slot_atom.dtype)])
    return rows[jnp.asarray(lane_cell)].T


def lane_positions(positions, atoms, grid: tuple[int, int, int], box):
    """``(3, capacity, lanes)``: the coordinates of the particles ``atoms`` (from
    :func:`lane_atoms`), each unwrapped to the image nearest its padded cell's centre; empty
    slots at ``-FAR``."""
    occupied = atoms < positions.shape[0]
    return unwrap_to_cells(positions.T[:, jnp.where(occupied, atoms, 0)], occupied, grid, box)


def unwrap_to_cells(x, occupied, grid: tuple[int, int, int], box):
    """``x`` (``(3, capacity, lanes)`` coordinates in the lane layout) with each slot moved
    to the image nearest its padded cell's centre; slots not ``occupied`` at ``-FAR``."""
    dtype = x.dtype
    p = _lane_tables(grid)[1]
    box = jnp.asarray(box, dtype)
    centre = (jnp.asarray(p, dtype) - 0.5) * (box / jnp.asarray(grid, dtype))[:, None]
    x = x - box[:, None, None] * jnp.round((x - centre[:, None, :]) / box[:, None, None])
    return jnp.where(occupied, x, -FAR)


def lane_pass(x, sigma, epsilon, *, grid: tuple[int, int, int], r_cut: float, shift: bool,
              want_virial: bool = True, interpret: bool = False):
    """The kernel on coordinates already in its layout, ``x``: ``(3, capacity, lanes)``
    (:func:`lane_positions`). Returns ``(sums, f)``: per target slot of the real cells'
    lanes, the energy (and the virial with ``want_virial``), ``(1 or 2, capacity, span)``,
    and the forces on every slot, image cells included, ``(3, capacity, lanes)``
    (:func:`fold_images` adds the images' onto their cells)."""
    from jax.experimental.pallas import tpu as pltpu
    dtype = x.dtype
    capacity = x.shape[1]
    geo = geometry(grid)
    interior = _lane_tables(grid)[2]
    sigma, epsilon = jnp.asarray(sigma, dtype), jnp.asarray(epsilon, dtype)
    sc6 = (sigma * sigma / (r_cut * r_cut)) ** 3
    ushift = 4.0 * epsilon * (sc6 * sc6 - sc6) if shift else jnp.zeros((), dtype)
    scalars = jnp.stack([jnp.asarray(r_cut * r_cut, dtype), sigma * sigma, 4.0 * epsilon,
                         24.0 * epsilon, ushift]).astype(dtype)
    zero = np.int32(0)
    span = geo.blocks * LANES
    lanes = slice(geo.first, geo.first + span)
    n_sums = 2 if want_virial else 1
    everything = pl.BlockSpec((3, capacity, geo.total), lambda i: (zero, zero, zero))
    return pl.pallas_call(
        functools.partial(_kernel, geo, want_virial),
        out_shape=[jax.ShapeDtypeStruct((n_sums, capacity, span), dtype),
                   jax.ShapeDtypeStruct((3, capacity, geo.total), dtype)],
        grid=(geo.blocks,),
        in_specs=[pl.BlockSpec((5,), lambda i: (zero,), memory_space=pltpu.SMEM),
                  pl.BlockSpec((1, LANES), lambda i: (zero, i)),
                  everything],
        out_specs=[pl.BlockSpec((n_sums, capacity, LANES), lambda i: (zero, zero, i)),
                   everything],
        scratch_shapes=[pltpu.VMEM((3, capacity, LANES), dtype),
                        pltpu.VMEM((3, capacity, LANES), dtype)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("arbitrary",),        # the force array is shared by all
            vmem_limit_bytes=resident_bytes(grid, capacity, jnp.dtype(dtype).itemsize)),
        interpret=interpret,
    )(scalars, jnp.asarray(interior[None, lanes], dtype), x)


def fold_images(f, grid: tuple[int, int, int]):
    """``(3, capacity, g_x + 2, g_y + 2, g_z + 2)``: the kernel's forces on the padded grid,
    each image cell's added onto the cell it copies (one axis after the other); the real
    cells are ``[..., 1:-1, 1:-1, 1:-1]``."""
    geo = geometry(grid)
    g = f[:, :, geo.margin:geo.margin + math.prod(geo.padded)]
    g = g.reshape(*f.shape[:2], *geo.padded)
    for axis in (2, 3, 4):
        def at(i, axis=axis):
            index = [slice(None)] * 5
            index[axis] = i
            return tuple(index)

        g = g.at[at(1)].add(g[at(-1)]).at[at(-2)].add(g[at(0)])
    return g


@functools.partial(jax.jit, static_argnames=("grid", "capacity", "r_cut", "shift",
                                             "want_virial", "interpret"))
def lj_cells(positions, slot_atom, atom_slot, box, sigma, epsilon, *,
             grid: tuple[int, int, int], capacity: int, r_cut: float, shift: bool,
             want_virial: bool = True, interpret: bool = False):
    """``(U, forces (n, 3), W)`` of Lennard-Jones over the cells, each pair once (``W`` is
    zero without ``want_virial``)."""
    dtype = positions.dtype
    n = positions.shape[0]
    geo = geometry(grid)
    interior = _lane_tables(grid)[2]
    atoms = lane_atoms(slot_atom, grid, capacity, n)
    x = lane_positions(positions, atoms, grid, box)
    sums, f = lane_pass(x, sigma, epsilon, grid=grid, r_cut=r_cut, shift=shift,
                        want_virial=want_virial, interpret=interpret)
    lanes = slice(geo.first, geo.first + geo.blocks * LANES)
    counted = (atoms[:, lanes] < n) & jnp.asarray(interior[lanes])
    u = jnp.sum(jnp.where(counted, sums[0], 0.0))
    w = jnp.sum(jnp.where(counted, sums[1], 0.0)) if want_virial else jnp.zeros((), dtype)
    g = fold_images(f, grid)
    slot = jnp.minimum(atom_slot, math.prod(grid) * capacity - 1)   # overflow: flagged anyway
    cell = np.stack(np.unravel_index(np.arange(math.prod(grid)), grid)) + 1
    c = slot // capacity
    forces = g[:, slot % capacity, *(jnp.asarray(cell[k])[c] for k in range(3))].T
    return u, forces, w
