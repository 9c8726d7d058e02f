"""The cell-dense Lennard-Jones pass on an accelerator: where its time goes, by variant.

    python benchmarks/ljcells_variants.py --cells 40 --json out.json

Float32 LJ (r_c 2.5, density 0.8442) at ``4 cells^3`` atoms, from an fcc lattice displaced
by ``--jitter`` sigma (uniform, per axis; a lattice start alone packs some cells to twice
the mean). One force evaluation (energy and forces) per contender, warm-up first, best of
``--repeats``, compile time apart:

* ``library``: ``pair_energy(...).energy_and_forces(x, params, cells)`` (the shipped path);
* ``half shell, r2 kernel``: the same half shell of cell blocks, with the LJ written on
  ``r^2`` (one reciprocal a pair; no square root, no division by ``r``, no ``jvp``);
* ``full shell, r2 kernel``: all 27 neighbour blocks, each pair twice, forces only on the
  home cell (no rolling of the partner forces back);
* ``sort``: the cell build alone;
* ``simulate``: NVE steps through ``sp.simulate`` at each capacity, and at each
  ``--configs CAPACITY:SKIN:SHELL`` (``cell_list(capacity=, skin=, shell=)``).

The capacity rows repeat the library at capacities set by hand. All contenders are checked
against the library's forces (the largest relative difference is printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles._cells import _half_shell  # noqa: E402


def r2_pass(x_atoms, cells, space, r_cut, full: bool):
    """LJ (sigma = epsilon = 1) over the cell blocks, written on r^2."""
    n, d = x_atoms.shape
    grid, cap, n_cells = cells.grid, cells.capacity, cells.n_cells
    shape = (*grid, cap)
    occ = (cells.slot_atom < n).reshape(shape)
    atom = cells.slot_atom.reshape(shape)
    safe = jnp.where(cells.slot_atom < n, cells.slot_atom, 0)
    x = [x_atoms[:, k][safe].reshape(shape) for k in range(d)]
    axes = tuple(range(d))
    box = space.box_vector(d, x_atoms.dtype)

    def lanes(a):
        return a.reshape(n_cells, cap).T

    def grid_of(b):
        return b.T.reshape(shape)

    offsets = (np.asarray(list(np.ndindex(3, 3, 3)), np.int32) - 1) if full else _half_shell(d)

    def body(acc, offset):
        def roll(a, sign=-1):
            return jnp.roll(a, tuple(sign * offset[k] for k in range(d)), axes)

        dr = []
        for k in range(d):
            t = lanes(x[k])[:, None, :] - lanes(roll(x[k]))[None, :, :]
            dr.append(t - box[k] * jnp.round(t / box[k]))
        r2 = dr[0] * dr[0] + dr[1] * dr[1] + dr[2] * dr[2]
        ai, aj = lanes(atom)[:, None, :], lanes(roll(atom))[None, :, :]
        same = jnp.all(offset == 0)
        order = jnp.where(same, (ai != aj) if full else (ai < aj), True)
        valid = lanes(occ)[:, None, :] & lanes(roll(occ))[None, :, :] & order
        mask = valid & (r2 < r_cut * r_cut)
        inv = jnp.where(mask, 1.0 / jnp.where(mask, r2, 1.0), 0.0)
        s6 = inv * inv * inv
        u = 4.0 * (s6 * s6 - s6)
        c = -24.0 * (2.0 * s6 * s6 - s6) * inv          # u'(r) / r
        e = jnp.sum(u) * (0.5 if full else 1.0)
        fi = jnp.stack([-jnp.sum(c * dr[k], axis=1) for k in range(d)])
        if not full:
            fi = fi + jnp.stack([lanes(roll(grid_of(jnp.sum(c * dr[k], axis=0)), sign=1))
                                 for k in range(d)])
        return (acc[0] + e, acc[1] + fi), None

    init = (jnp.zeros((), x_atoms.dtype), jnp.zeros((d, cap, n_cells), x_atoms.dtype))
    (u, f), _ = lax.scan(body, init, jnp.asarray(offsets))
    f = jnp.transpose(f, (2, 1, 0)).reshape(-1, d)
    return u, f[cells.atom_slot]


def lj_liquid(cells: int, jitter: float, melt: int, skin: float = 0.0):
    """``(x, box, space, energy, params)``: float32 LJ (r_c 2.5, density 0.8442, sigma =
    epsilon = 1) at ``4 cells^3`` atoms, an fcc lattice displaced by ``jitter`` (uniform, per
    axis) and melted by ``melt`` NVE steps at T = 1.44 over cells with ``skin``."""
    pos, box = sp.lattice(cells, 0.8442)
    n = pos.shape[0]
    rng = np.random.default_rng(0)
    pos = np.asarray(pos) + rng.uniform(-jitter, jitter, np.shape(pos))
    x = jnp.asarray(np.mod(pos, box), jnp.float32)
    space = sp.periodic(jnp.float32(box))
    energy = sp.pair_energy(sp.lennard_jones, space, r_cut=2.5)
    params = dict(sigma=jnp.float32(1.0), epsilon=jnp.float32(1.0))
    if melt:
        v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(2), n=n),
                        jnp.float32)
        traj = sp.simulate(energy, sp.State(x, v - v.mean(0), 1.0), params, space=space,
                           dt=0.005, n_steps=melt, save_every=melt,
                           neighbors=sp.cell_list(space, x, r_cut=2.5, skin=skin))
        x = jnp.asarray(np.mod(np.asarray(traj.positions[-1]), box), jnp.float32)
    return x, box, space, energy, params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=40)
    ap.add_argument("--jitter", type=float, default=0.1)
    ap.add_argument("--melt", type=int, default=0,
                    help="NVE steps from the lattice at T = 1.44 first (a liquid start)")
    ap.add_argument("--capacities", type=int, nargs="*", default=[])
    ap.add_argument("--simulate", type=int, default=0,
                    help="also time simulate for this many NVE steps at each capacity")
    ap.add_argument("--configs", nargs="*", default=[],
                    help="more simulate rows, each CAPACITY:SKIN:SHELL (e.g. 32:0.3:full; "
                         "CAPACITY 'auto' takes cell_list's default)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--simulate-only", action="store_true",
                    help="time only the simulate rows (and jax-md): no single-pass variants")
    ap.add_argument("--jaxmd", action="store_true",
                    help="also run jax-md's neighbour-list LJ (NVE, --simulate steps) at this "
                         "size, and print simlib's simulate rows as ratios to it")
    ap.add_argument("--json")
    a = ap.parse_args()
    x, box, space, energy, params = lj_liquid(a.cells, a.jitter, a.melt)
    n = x.shape[0]
    cl = sp.cell_list(space, x, r_cut=2.5, kernel="jax")
    occupancy = np.bincount(np.asarray(cl.atom_slot) // cl.capacity, minlength=cl.n_cells)
    print(f"{n:,} atoms, grid {cl.grid}, capacity {cl.capacity}, fullest cell "
          f"{int(cl.max_cell_occupancy)}, mean {occupancy.mean():.1f}", flush=True)
    lib = jax.jit(energy.energy_and_forces)
    contenders = {
        f"library (capacity {cl.capacity})": (lambda c: lib(x, params, c), cl),
        "half shell, r2 kernel": (jax.jit(lambda c: r2_pass(x, c, space, 2.5, False)), cl),
        "full shell, r2 kernel": (jax.jit(lambda c: r2_pass(x, c, space, 2.5, True)), cl),
        "sort (build)": (jax.jit(lambda c: c.build(x).slot_atom), cl),
    }
    if a.simulate_only:
        contenders = {}
    for cap in a.capacities:
        c2 = sp.cell_list(space, x, r_cut=2.5, capacity=cap, kernel="jax")
        contenders[f"library (capacity {cap})"] = (lambda c: lib(x, params, c), c2)
        contenders[f"half shell, r2 kernel (capacity {cap})"] = (
            jax.jit(lambda c: r2_pass(x, c, space, 2.5, False)), c2)
    if a.simulate:
        v = jnp.asarray(sp.maxwell_boltzmann(1.0, 1.0, key=jax.random.key(3), n=n), jnp.float32)

        def run(c):
            return sp.simulate(energy, sp.State(x, v - v.mean(0), 1.0), params, space=space,
                               dt=0.005, n_steps=a.simulate, save_every=a.simulate,
                               neighbors=c).positions

        plain = {cl.capacity: cl, **{c2.capacity: c2 for _, c2 in contenders.values()}}
        for c in ({} if a.simulate_only and a.configs else plain).values():
            contenders[f"simulate {a.simulate} steps (capacity {c.capacity})"] = (run, c)
        for config in a.configs:
            cap, skin, shell = config.split(":")
            c = sp.cell_list(space, x, r_cut=2.5, capacity=None if cap == "auto" else int(cap),
                             skin=float(skin), shell=shell,
                             kernel="jax")    # the pure-JAX pass (a TPU's "auto": the kernel)
            contenders[f"simulate {a.simulate} steps ({config}, grid {c.grid[0]})"] = (run, c)
    ref = np.asarray(lib(x, params, cl)[1], np.float64)
    rows = []
    for name, (fn, c) in contenders.items():
        t = best_of(lambda fn=fn, c=c: fn(c), repeats=a.repeats)
        out = t.out
        diff = ""
        if name.startswith("simulate"):
            diff = f"{n * a.simulate / t.best / 1e6:.2f} M atom-steps/s"
        elif isinstance(out, tuple):
            f = np.asarray(out[1], np.float64)
            diff = f"{np.max(np.abs(f - ref)) / np.max(np.abs(ref)):.1e}"
        row = dict(name=name, best_s=t.best, first_s=t.warmup, capacity=c.capacity,
                   slots_per_atom=c.pair_slots() / n, max_rel_force_diff=diff)
        rows.append(row)
        print(f"{name:42s} {1e3 * t.best:8.2f} ms  first {t.warmup:6.2f} s  slots/atom "
              f"{c.pair_slots() / n:6.0f}  {diff}", flush=True)
    jaxmd = None
    if a.jaxmd and a.simulate:
        from _particle_peers import jaxmd_lj
        try:
            jaxmd = jaxmd_lj(a.cells, a.simulate, repeats=a.repeats, chunk=a.simulate,
                             warmup=a.simulate)
            print(f"jax-md OrderedSparse list, {a.simulate} steps: "
                  f"{jaxmd['rate'] / 1e6:.2f} M atom-steps/s", flush=True)
            for row in rows:
                if row["name"].startswith("simulate"):
                    ratio = n * a.simulate / row["best_s"] / jaxmd["rate"]
                    row["vs_jaxmd"] = ratio
                    print(f"  {row['name']:42s} {ratio:6.2f}x jax-md", flush=True)
        except Exception as err:  # out of memory on the chip is a result, not a crash
            jaxmd = dict(error=f"{type(err).__name__}: {str(err)[:500]}")
            print(f"jax-md FAILED {jaxmd['error']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(dict(n=n, backend=jax.default_backend(),
                                                rows=rows, jax_md=jaxmd), indent=1))


if __name__ == "__main__":
    main()
