"""What a step costs with the state kept in the Pallas kernel's layout: the ceiling of the
cell kernel inside an NVE run, when no step gathers the particles into cells.

    python benchmarks/ljcells_layout.py [CELLS] [STEPS] [SKIN]  # $OUT/layout_skin<SKIN>.json

The prototype of ``simulate``'s layout path (``simlib/particles/_layout.py``, whose
``Layout`` moves it now uses), kept to time the parts of a step apart. Float32 LJ liquid
(``ljcells_variants.lj_liquid``, ``4 CELLS^3`` atoms, default 40: 256,000, melted by 100
steps), cells with ``SKIN`` (default 0.3) and capacity 40 as ``simulate`` builds them.
Positions and velocities are laid out once in the kernel's ``(3, capacity, lanes)`` order
and then advanced by velocity Verlet (``dt`` 0.005, unit masses) on the real cells' slots,
``STEPS`` steps (default 6, fewer than the steps between two rebuilds; checked): at each
step the image cells are refreshed from the real ones (a wrap-around pad, static slices
only), the kernel runs (``lane_pass``) and the images' forces are folded back
(``fold_images``). The end state, gathered back to the atoms, is compared with
``sp.simulate`` over the same steps (pure-JAX cell pass).

Rows (best of 10 after a warm-up): the ``STEPS``-step run per step, and its parts alone;
the rebuild round trip this design needs every ``k`` steps (positions and velocities
back to the atoms in one gather of rows, the cells rebuilt, both laid out again in one),
with ``k`` read from ``simulate``'s own build count over 100 steps, which is timed too
(the pure-JAX cell pass, best of 3); and the atom-steps per second the design would give.
``benchmarks/ljcells_simulate.py`` times the library path itself.
"""
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _timing  # noqa: E402
from ljcells_variants import lj_liquid  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles import _cells_pallas as cp  # noqa: E402
from simlib.particles._layout import Layout  # noqa: E402

DT = 0.005


def best_of(fn, *args, repeats=10):
    """``(best seconds, output)`` of ``fn(*args)`` after one warm-up call."""
    timing = _timing.best_of(lambda: fn(*args), repeats=repeats, slow_s=float("inf"))
    return timing.best, timing.out


def main() -> None:
    cells = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    skin = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
    out_path = Path(os.environ.get("OUT", "/tmp")) / f"layout_skin{skin:g}.json"
    interpret = jax.default_backend() != "tpu"
    x, box, space, energy, params = lj_liquid(cells, 0.1, 100, skin=0.3)
    n = x.shape[0]
    v = jnp.asarray(sp.maxwell_boltzmann(1.44, 1.0, key=jax.random.key(5), n=n), jnp.float32)
    v = v - v.mean(0)
    c = sp.cell_list(space, x, r_cut=2.5, skin=skin, capacity=40, kernel="pallas")
    grid, cap = c.grid, c.capacity
    geo = cp.geometry(grid)
    boxv = c.space.box_vector(3, x.dtype)
    res = dict(backend=jax.default_backend(), n=n, grid=grid, capacity=cap, steps=steps,
               skin=skin, lanes=geo.total, rows={})
    lay = Layout(c, n)                    # the library's layout (simlib/particles/_layout.py)

    def forces(xc):
        _, f = cp.lane_pass(lay.lanes(xc, boxv), 1.0, 1.0, grid=grid, r_cut=2.5, shift=False,
                            want_virial=False, interpret=interpret)
        return cp.fold_images(f, grid)[:, :, 1:-1, 1:-1, 1:-1]

    def lay_out(x, v, cells):              # one gather of rows (x, v) per slot
        atoms = lay.atoms(cells)
        xv = lay.gather(jnp.concatenate([x, v], axis=1), atoms)          # (6, cap, g...)
        return lay.unwrap(xv[:3], atoms, boxv), jnp.where(atoms < n, xv[3:], 0.0)

    def to_atoms(a, cells):                # (k, cap, gx, gy, gz) -> (n, k), one gather
        return lay.to_atoms(a, cells)

    @jax.jit
    def run(xc, vc, fc):
        def step(carry, _):
            xc, vc, fc = carry
            vh = vc + 0.5 * DT * fc
            xn = xc + DT * vh
            fn = forces(xn)
            return (xn, vh + 0.5 * DT * fn, fn), None
        return jax.lax.scan(step, (xc, vc, fc), None, length=steps)[0]

    @jax.jit
    def rebuild(xc, vc, cells):            # what this design does every k steps
        xv = to_atoms(jnp.concatenate([xc, vc]), cells)
        xa = jnp.mod(xv[:, :3], boxv)
        new = cells.build(xa)
        return lay_out(xa, xv[:, 3:], new), new

    xc, vc = jax.jit(lay_out)(x, v, c)
    fc = jax.jit(forces)(xc)
    secs, (x1, v1, _) = best_of(run, xc, vc, fc)
    res["rows"]["step in layout (kernel, images, fold, Verlet)"] = dict(ms=1e3 * secs / steps)
    x_end = np.asarray(jax.jit(to_atoms)(x1, c))
    disp = np.max(np.linalg.norm(np.asarray(jnp.mod(x_end - np.asarray(x) + 0.5 * box, box)
                                            - 0.5 * box), axis=1))
    traj = sp.simulate(energy, sp.State(x, v, 1.0), params, space=space, dt=DT, n_steps=steps,
                       save_every=steps, neighbors=sp.cell_list(space, x, r_cut=2.5, skin=skin,
                                                                kernel="jax"))
    ref = np.asarray(traj.positions[-1])
    diff = np.mod(x_end - ref + 0.5 * box, box) - 0.5 * box
    res["check"] = dict(max_position_diff_vs_simulate=float(np.max(np.abs(diff))),
                        max_displacement=float(disp), half_skin=skin / 2)
    print(res["check"], flush=True)
    for name, fn, args in [("part: images refreshed (pad, shift, lanes)",
                            jax.jit(lambda xc: lay.lanes(xc, boxv)),
                            (xc,)),
                           ("part: kernel (lane_pass)", jax.jit(lambda xl: cp.lane_pass(
                               xl, 1.0, 1.0, grid=grid, r_cut=2.5, shift=False,
                               want_virial=False, interpret=interpret)[1]),
                            (jax.jit(lambda xc: lay.lanes(xc, boxv))(xc),)),
                           ("rebuild round trip", rebuild, (xc, vc, c))]:
        secs, _ = best_of(fn, *args)
        res["rows"][name] = dict(ms=1e3 * secs)
        print(name, res["rows"][name], flush=True)
    cells_jax = sp.cell_list(space, x, r_cut=2.5, skin=skin, capacity=cap, kernel="jax")

    def simulate_100():
        return sp.simulate(energy, sp.State(x, v, 1.0), params, space=space, dt=DT,
                           n_steps=100, save_every=100, neighbors=cells_jax)

    secs, traj = best_of(simulate_100, repeats=3)
    builds = int(traj.stats["n_builds"])
    res["rows"]["today: simulate, 100 NVE steps, pure-JAX cells (per step)"] = dict(
        ms=10 * secs, atom_steps_per_s=n * 100 / secs)
    res["simulate_builds_per_100_steps"] = builds
    step_ms = res["rows"]["step in layout (kernel, images, fold, Verlet)"]["ms"]
    rebuild_ms = res["rows"]["rebuild round trip"]["ms"]
    per_step = step_ms + (rebuild_ms * builds / 100 if builds else 0.0)
    res["estimate"] = dict(ms_per_step=per_step, atom_steps_per_s=n / (per_step * 1e-3))
    print(res["rows"], res["estimate"], flush=True)
    out_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
