r"""NVE with the run's state kept in the Pallas cell kernel's layout (the accelerator path of
:func:`~simlib.particles.simulate`).

A force evaluation through the cell kernel (:func:`._cells_pallas.lj_cells`) lays the atoms
out in cell order, a gather of ``3 x capacity`` values per padded cell, and reads their
forces back, a gather per atom. On a TPU v5e those two gathers cost more than the kernel
(docs/particles.md, "Accelerators"). Here the state itself lives in cell order between two
sorts of the cells: positions, velocities and forces as ``(3, capacity, g_x, g_y, g_z)``
arrays, one slot per place in a cell (empty slots: positions at ``-FAR``, velocity and force
zero), each position unwrapped to the image nearest its cell's centre. A velocity Verlet
step (Swope, Andersen, Berens & Wilson, J. Chem. Phys. 76, 637 (1982)) is then elementwise,

.. math::
    v_{1/2} = v + \tfrac{h}{2m} F(x), \quad x' = x + h v_{1/2}, \quad
    v' = v_{1/2} + \tfrac{h}{2m} F(x'),

and a step moves no data besides the kernel's but the image cells' refresh (a wrap-around
pad: static slices). The atoms go back to atom order only where something needs them: a
sort (some slot has moved ``skin / 2`` since the last one; then the cells are built again
and the atoms laid out anew), a saved frame and the end of a chunk.

:func:`frames` stands in for :func:`._loop.frames` (same arguments, same results: the
carry in atom order, the failure, the frames), so the eager driver (:mod:`._chunked`) runs
it unchanged: reallocation after an overflow, progress, checkpoints. Every step is checked
as :func:`._health.status` checks it. :func:`applies` says when it serves: NVE, one mass,
and cells whose Lennard-Jones the kernel takes (``cell_list(kernel="pallas")``, or
``"auto"`` on a TPU: :func:`._cells.keeps_layout`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from . import _cells_pallas as cp
from ._cells import CellList, keeps_layout
from ._dynamics import NVE, Carry, kinetic
from ._energy import PairEnergy
from ._health import Failure, classify, merge, move_limit


def applies(model, integrator, positions, masses, params, neighbors) -> bool:
    """Whether :func:`frames` serves this run: :class:`NVE`, one mass for every atom, and
    cells whose ``kernel`` keeps the layout (:func:`._cells.keeps_layout`: ``"pallas"``, or
    ``"auto"`` on a TPU), for a Lennard-Jones energy the kernel takes
    (:meth:`PairEnergy._pallas_lj`: one ``sigma`` and ``epsilon``, float32, 3D, the half
    shell, a capacity a multiple of 8, resident arrays that fit VMEM)."""
    return (type(integrator) is NVE and isinstance(neighbors, CellList)
            and keeps_layout(neighbors.kernel)
            and isinstance(model.energy, PairEnergy) and jnp.ndim(masses) == 0
            and model.energy._pallas_lj(jnp.asarray(positions), params,
                                        neighbors.replace(kernel="pallas")))


class Layout:
    """The static shape of the cell layout of ``cells``: grid, capacity, and the moves
    between atom order ``(n, k)`` and cell order ``(k, capacity, g_x, g_y, g_z)``."""

    def __init__(self, cells: CellList, n: int):
        self.grid, self.capacity, self.n = cells.grid, cells.capacity, n
        self.geo = cp.geometry(cells.grid)

    def atoms(self, cells: CellList):
        """``(capacity, g_x, g_y, g_z)``: the atom in each slot (``n`` where empty)."""
        return jnp.moveaxis(cells.slot_atom.reshape(*self.grid, self.capacity), -1, 0)

    def gather(self, rows, atoms):
        """``rows`` ``(n, k)`` in cell order ``(k, capacity, g...)`` (one gather of rows;
        empty slots hold atom 0's row)."""
        return jnp.moveaxis(rows[jnp.where(atoms < self.n, atoms, 0)], -1, 0)

    def unwrap(self, x, atoms, box):
        """Positions in cell order moved to the image nearest their cell's centre; empty
        slots at ``-FAR``."""
        width = box / jnp.asarray(self.grid, x.dtype)
        out = []
        for k in range(3):
            shape = [1, 1, 1, 1]
            shape[1 + k] = self.grid[k]
            centre = (jnp.arange(self.grid[k], dtype=x.dtype) + 0.5).reshape(shape) * width[k]
            out.append(x[k] - box[k] * jnp.round((x[k] - centre) / box[k]))
        return jnp.where(atoms < self.n, jnp.stack(out), -cp.FAR)

    def to_atoms(self, a, cells: CellList):
        """``a`` ``(k, capacity, g...)`` back in atom order ``(n, k)`` (one gather of rows).
        An atom that did not fit its cell reads a wrong row; the overflow is flagged."""
        slot = cells.atom_slot
        rows = jnp.moveaxis(a, 0, -1).reshape(self.capacity, math.prod(self.grid), a.shape[0])
        return rows[slot % self.capacity, slot // self.capacity]

    def lanes(self, x, box):
        """The kernel's input ``(3, capacity, lanes)``: the cells padded by one periodic image
        on every side (shifted by the box), flattened into lanes between margins at
        ``-FAR`` (:func:`._cells_pallas.geometry`)."""
        geo = self.geo
        p = jnp.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1), (1, 1)), mode="wrap")
        images = []
        for k in range(3):
            side = np.zeros(geo.padded[k], np.float32)
            side[0], side[-1] = -1.0, 1.0
            shape = [1, 1, 1, 1]
            shape[1 + k] = geo.padded[k]
            images.append(p[k] + jnp.asarray(side, x.dtype).reshape(shape) * box[k])
        size = math.prod(geo.padded)
        cap = self.capacity
        return jnp.concatenate([jnp.full((3, cap, geo.margin), -cp.FAR, x.dtype),
                                jnp.stack(images).reshape(3, cap, size),
                                jnp.full((3, cap, geo.total - geo.margin - size), -cp.FAR,
                                         x.dtype)], axis=-1)

    def energy_and_forces(self, x, box, energy: PairEnergy, params):
        """``(U, F)`` in cell order from the kernel (the pair part of the energy)."""
        dtype = x.dtype
        sums, f = cp.lane_pass(self.lanes(x, box), jnp.asarray(params["sigma"], dtype),
                               jnp.asarray(params["epsilon"], dtype), grid=self.grid,
                               r_cut=energy.r_cut, shift=energy.shift, want_virial=False,
                               interpret=cp.interpret())
        # image cells, empty slots and lanes without a cell are targets at +FAR: zero terms
        return jnp.sum(sums[0]), cp.fold_images(f, self.grid)[:, :, 1:-1, 1:-1, 1:-1]


def frames(model, integrator, carry: Carry, masses, params, dt, key, n_frames: int,
           save_every: int, adjoint):
    """:func:`._loop.frames` for a run :func:`applies` to, the state in cell order
    (``key`` and ``adjoint`` are unused: NVE, eager). Returns ``((carry, code, Failure),
    (positions, velocities, U, K, observed))`` as it does."""
    cells0 = carry.neighbors
    n = carry.positions.shape[0]
    lay = Layout(cells0, n)
    energy, space = model.energy, model.space
    dtype = carry.positions.dtype
    box = space.box_vector(3, dtype)
    dt = jnp.asarray(dt, dtype)
    kick = 0.5 * dt / jnp.asarray(masses, dtype)
    limit = move_limit(model, cells0, dtype)
    half_skin2 = (0.5 * cells0.skin) ** 2
    tail = energy.tail_energy(carry.positions, params)

    def laid_out(x, v, f, cells, reference):
        atoms = lay.atoms(cells)
        rows = lay.gather(jnp.concatenate([x, reference, v, f], axis=1), atoms)
        occupied = atoms < n
        return (lay.unwrap(rows[0:3], atoms, box), jnp.where(occupied, rows[6:9], 0.0),
                jnp.where(occupied, rows[9:12], 0.0), lay.unwrap(rows[3:6], atoms, box), atoms)

    def sort(x, v, cells):
        """The cells built again at the atoms' positions, and the state laid out anew."""
        rows = lay.to_atoms(jnp.concatenate([x, v]), cells)
        xa = space.wrap(rows[:, :3])
        new = cells.build(xa)
        atoms = lay.atoms(new)
        laid = lay.gather(jnp.concatenate([xa, rows[:, 3:]], axis=1), atoms)
        x = lay.unwrap(laid[0:3], atoms, box)
        return x, jnp.where(atoms < n, laid[3:6], 0.0), x, atoms, new

    def check(s):
        """:func:`._health.status` on the state in cell order (slots named by their atom)."""
        x, v = s["x"], s["v"]
        v2 = jnp.sum(v * v, axis=0)
        energies = jnp.isfinite(s["e"]) & jnp.isfinite(0.5 * jnp.asarray(masses, dtype)
                                                       * jnp.sum(v2))
        finite = jnp.all(jnp.isfinite(x), axis=0) & jnp.all(jnp.isfinite(v), axis=0)
        code, atom = classify(v2.reshape(-1), finite.reshape(-1), energies, s["cells"], dt,
                              limit, s["atoms"].reshape(-1), n)
        return code, Failure(jnp.where(code != 0, s["step"], -1).astype(jnp.int32),
                             atom.astype(jnp.int32))

    def one_step(state, _):
        s, code, failure = state
        vh = s["v"] + kick * s["f"]
        x = s["x"] + dt * vh
        d2 = jnp.max(sum((x[k] - s["reference"][k]) ** 2 for k in range(3)))
        x, vh, reference, atoms, cells = lax.cond(
            ~(d2 <= half_skin2), sort, lambda x, v, c: (x, v, s["reference"], s["atoms"], c),
            x, vh, s["cells"])
        e, f = lay.energy_and_forces(x, box, energy, params)
        s = dict(x=x, v=vh + kick * f, f=f, e=e + tail, reference=reference, atoms=atoms,
                 cells=cells, step=s["step"] + 1)
        code, failure = merge((code, failure), check(s))
        return (s, code, failure), None

    def in_atom_order(s, names):
        """``s[name]`` for each of ``names`` (positions first, wrapped) in atom order."""
        rows = lay.to_atoms(jnp.concatenate([s[k] for k in names]), s["cells"])
        parts = [rows[:, 3 * i:3 * i + 3] for i in range(len(names))]
        return [space.wrap(parts[0]), *parts[1:]]

    def one_frame(state, _):
        state, _ = lax.scan(one_step, state, None, length=save_every)
        s = state[0]
        x, v = in_atom_order(s, ("x", "v"))
        c = Carry(x, v, None, s["e"], None, s["step"])
        return state, (x, v, s["e"], kinetic(v, masses), integrator.observe(c, masses))

    x, v, f, reference, atoms = laid_out(carry.positions, carry.velocities, carry.forces,
                                         cells0, cells0.reference_positions)
    s0 = dict(x=x, v=v, f=f, e=carry.potential_energy, reference=reference, atoms=atoms,
              cells=cells0, step=carry.step)
    (s, code, failure), records = lax.scan(one_frame, (s0, *check(s0)), None,
                                           length=n_frames)
    x, v, f = in_atom_order(s, ("x", "v", "f"))
    end = carry._replace(positions=x, velocities=v, forces=f, potential_energy=s["e"],
                         neighbors=s["cells"], step=s["step"])
    return (end, code, failure), records
