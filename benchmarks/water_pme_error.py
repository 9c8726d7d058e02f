"""PME's RMS force error on an SPC/E box against a tight Ewald sum, in simlib's unit.

    python benchmarks/water_pme_error.py [molecules=216] [r_cut=0.9]

The unit of ``tolerance`` is ``k q_rms^2 / l^2``, l = (V/N)^(1/3); float64; randomly
oriented molecules on the lattice; the intramolecular pairs excluded. For simlib's rule at
three tolerances (and the same alpha on coarser grids) and for OpenMM's own parameters at
its default ``ewaldErrorTolerance`` 5e-4: whether the grids the rule picks are finer than
the requested error needs on water (the rule's constant was measured on random charges).
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import water_speed as ws  # noqa: E402

import simlib.particles as sp  # noqa: E402


def main() -> None:
    jax.config.update("jax_enable_x64", True)
    w = int(sys.argv[1]) if len(sys.argv) > 1 else 216
    r_cut = float(sys.argv[2]) if len(sys.argv) > 2 else 0.9
    water = sp.spce_water(w, key=jax.random.key(3))
    water = water._replace(positions=jnp.asarray(water.positions, jnp.float64),
                           charges=jnp.asarray(water.charges, jnp.float64))
    space = sp.periodic(water.box)
    x, q = water.positions, water.charges
    params = dict(charges=q)
    reference = sp.ewald(space, r_cut, tolerance=1e-11, exclusions=water.exclusions)
    f_ref = np.asarray(jax.jit(reference.energy_and_forces)(x, params)[1])
    spacing = (water.box**3 / x.shape[0]) ** (1 / 3)
    unit = float(jnp.mean(q**2)) / spacing**2
    rms = np.sqrt(np.mean(np.sum(f_ref**2, 1))) / unit
    print(f"{w} molecules, box {water.box:.4f} nm, r_c {r_cut}; RMS force {rms:.3f} units")

    def error(energy):
        f = np.asarray(jax.jit(energy.energy_and_forces)(x, params)[1])
        return np.sqrt(np.mean(np.sum((f - f_ref) ** 2, 1))) / unit

    for tol in (5e-4, 1e-4, 1e-5):
        p = sp.ewald_parameters(water.box, r_cut, tol)
        e = sp.pme(space, r_cut, tolerance=tol, exclusions=water.exclusions)
        print(f"simlib tolerance {tol:g}: alpha {p.alpha:.3f} grid {p.grid}: "
              f"error {error(e):.2e}")
        for g in range(16, p.grid[0], 4):
            e = sp.pme(space, r_cut, tolerance=tol, alpha=p.alpha, grid=g,
                       exclusions=water.exclusions)
            print(f"    grid {g}: error {error(e):.2e}")
    alpha, grid, _ = ws.openmm_pme_parameters(water, r_cut, 5e-4)
    e = sp.pme(space, r_cut, alpha=alpha, grid=grid, exclusions=water.exclusions)
    print(f"OpenMM's parameters for 5e-4: alpha {alpha:.3f} grid {grid}: error {error(e):.2e}")


if __name__ == "__main__":
    main()
