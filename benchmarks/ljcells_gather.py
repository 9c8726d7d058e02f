"""The Pallas cell kernel's input layout on the chip: ways to gather the coordinates into
lanes, timed against the one ``lane_positions`` uses.

    python benchmarks/ljcells_gather.py [CELLS] [MELT]      # writes $OUT/gather.json

Float32 LJ liquid (``ljcells_variants.lj_liquid``, ``4 CELLS^3`` atoms, default 40:
256,000), cells with skin 0.3 and capacity 40 as ``simulate`` builds them. Each variant
returns the ``(3, capacity, lanes)`` array of :func:`lane_positions` (checked equal to
it), best of 10 after a warm-up:

* ``A current``: ``positions.T[:, atoms]``, one element gather per slot and axis;
* ``C rows``: ``positions[atoms]``, one row per slot, then a transpose;
* ``E flat``: one gather from the flat ``(3 n,)`` coordinates;
* ``H``: the atoms first gathered in cell order (``n`` rows), then each lane's cell as a
  window of ``capacity`` consecutive atoms (``dynamic_slice`` under ``vmap``), and its two
  parts alone; ``H2``: the second part as an element gather.
"""
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _timing  # noqa: E402
from ljcells_variants import lj_liquid  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles import _cells_pallas as cp  # noqa: E402


def best_of(fn, *args, repeats=10):
    """``(best seconds, output)`` of ``fn(*args)`` after one warm-up call."""
    timing = _timing.best_of(lambda: fn(*args), repeats=repeats, slow_s=float("inf"))
    return timing.best, timing.out


def main() -> None:
    cells = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    melt = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    out_path = Path(os.environ.get("OUT", "/tmp")) / "gather.json"
    x, box, space, energy, params = lj_liquid(cells, 0.1, melt, skin=0.3)
    n = x.shape[0]
    c = sp.cell_list(space, x, r_cut=2.5, skin=0.3, capacity=40, kernel="pallas")
    grid, cap = c.grid, c.capacity
    boxv = c.space.box_vector(3, x.dtype)
    atoms = jax.jit(cp.lane_atoms, static_argnums=(1, 2, 3))(c.slot_atom, grid, cap, n)
    res = dict(backend=jax.default_backend(), n=n, grid=grid, cap=cap,
               lanes=int(atoms.shape[1]), melt=melt)
    lane_cell = cp._lane_tables(grid)[0]
    n_cells = int(np.prod(grid))
    slots = np.asarray(c.slot_atom).reshape(n_cells, cap)
    counts = (slots < n).sum(1)
    start = np.cumsum(counts) - counts
    order = jnp.asarray(slots[slots < n])                 # the atoms in cell order
    cell = np.minimum(lane_cell, n_cells - 1)
    lane_start = jnp.asarray(np.where(lane_cell < n_cells, start[cell], 0), jnp.int32)
    lane_count = jnp.asarray(np.where(lane_cell < n_cells, counts[cell], 0), jnp.int32)

    def unwrap(xx, occupied):  # as lane_positions: the image nearest each cell's centre
        return cp.unwrap_to_cells(xx, occupied, grid, boxv)

    @jax.jit
    def current(pos, atoms):
        return cp.lane_positions(pos, atoms, grid, boxv)

    @jax.jit
    def rows(pos, atoms):
        occupied = atoms < n
        return unwrap(jnp.moveaxis(pos[jnp.where(occupied, atoms, 0)], -1, 0), occupied)

    @jax.jit
    def flat(pos, atoms):
        occupied = atoms < n
        i = jnp.where(occupied, atoms, 0)
        return unwrap(pos.reshape(-1)[i[None] * 3 + jnp.arange(3)[:, None, None]], occupied)

    @jax.jit
    def in_cell_order(pos, order):
        return pos[order].T                                # (3, n)

    def occupied_slots(counts):
        return jnp.arange(cap)[:, None] < counts[None, :]

    @jax.jit
    def windows(xs, starts, counts):
        xs = jnp.pad(xs, ((0, 0), (0, cap)))
        w = jax.vmap(lambda s: lax.dynamic_slice(xs, (0, s), (3, cap)))(starts)
        return unwrap(jnp.transpose(w, (1, 2, 0)), occupied_slots(counts))

    @jax.jit
    def sorted_and_windows(pos, order, starts, counts):
        return windows(in_cell_order(pos, order), starts, counts)

    @jax.jit
    def element_gather_from_sorted(xs, starts, counts):
        xs = jnp.pad(xs, ((0, 0), (0, cap)))
        return unwrap(xs[:, starts[None, :] + jnp.arange(cap)[:, None]],
                      occupied_slots(counts))

    reference = np.asarray(current(x, atoms))
    xs = in_cell_order(x, order)
    variants = [("A current", current, (x, atoms)), ("C rows", rows, (x, atoms)),
                ("E flat", flat, (x, atoms)),
                ("H sort+windows", sorted_and_windows, (x, order, lane_start, lane_count)),
                ("H part: gather n atoms in cell order", in_cell_order, (x, order)),
                ("H part: windows from sorted", windows, (xs, lane_start, lane_count)),
                ("H2 part: element gather from sorted", element_gather_from_sorted,
                 (xs, lane_start, lane_count))]
    res["rows"] = {}
    for name, fn, args in variants:
        try:
            secs, out = best_of(fn, *args)
            row = dict(ms=1e3 * secs)
            if np.shape(out) == reference.shape:
                row["max_diff"] = float(np.max(np.abs(np.asarray(out) - reference)))
        except Exception as err:  # noqa: BLE001 - out of memory on the chip is a result
            row = dict(error=f"{type(err).__name__}: {str(err)[:300]}")
        res["rows"][name] = row
        print(name, row, flush=True)
        out_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
