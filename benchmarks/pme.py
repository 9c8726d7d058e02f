"""Smooth PME: simlib against OpenMM on the same box, charges, alpha, grid and cutoff.

A box of ``--n`` random charges (+-0.8 e, neutral) at the atom density of water
(100 atoms/nm^3), cutoff ``--r-cut`` nm, OpenMM's PME parameters for ``--tolerance``
(``getPMEParametersInContext``) given to both. Prints:

* agreement: simlib (float64) against OpenMM's Reference platform (double): relative
  energy error and RMS force error over RMS force;
* one force evaluation: simlib (jitted, float32 and float64, neighbour list built once)
  against OpenMM's CPU platform (``--threads``; mixed precision), best of ``--repeats``;
* simlib's time split: spreading, FFT and convolution (forward), the reverse pass
  (gathering: the gradient of the reciprocal energy minus its forward), and the
  real-space pairs over the neighbour list.

    python benchmarks/pme.py                 # n = 3000, about a minute on 2 cores
    python benchmarks/pme.py --n 24000 --threads 2 --repeats 5

OpenMM is a peer, never a dependency (``benchmarks/install_peers.sh``); without it the
script times simlib alone with parameters from ``sp.ewald_parameters``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of, load_average, timed  # noqa: E402

from simlib import particles as sp  # noqa: E402

ONE_4PI_EPS0 = 138.935457644382      # OpenMM's Coulomb constant, kJ mol^-1 nm e^-2


def system(n: int, seed: int = 0):
    L = (n / 100.0) ** (1 / 3)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, L, (n, 3))
    q = np.tile([0.8, -0.8], n // 2)
    return x, q, L


def openmm_context(x, q, L, r_cut, tolerance, platform, threads=None, pme=None):
    import openmm as mm

    s = mm.System()
    force = mm.NonbondedForce()
    for qi in q:
        s.addParticle(1.0)
        force.addParticle(float(qi), 1.0, 0.0)
    s.setDefaultPeriodicBoxVectors(mm.Vec3(L, 0, 0), mm.Vec3(0, L, 0), mm.Vec3(0, 0, L))
    force.setNonbondedMethod(mm.NonbondedForce.PME)
    force.setCutoffDistance(r_cut)
    force.setEwaldErrorTolerance(tolerance)
    if pme is not None:
        force.setPMEParameters(*pme)
    force.setUseDispersionCorrection(False)
    s.addForce(force)
    props = {"Threads": str(threads)} if threads else {}
    ctx = mm.Context(s, mm.VerletIntegrator(1e-3), mm.Platform.getPlatformByName(platform),
                     props)
    ctx.setPositions([mm.Vec3(*map(float, r)) for r in x])
    return ctx, force


def openmm_state(ctx):
    st = ctx.getState(getEnergy=True, getForces=True)
    return st.getPotentialEnergy()._value, np.asarray(st.getForces(asNumpy=True)._value)


def time_simlib(energy, x, q, space, r_cut, dtype, repeats):
    """One force call of simlib's PME in ``dtype`` and its time split (seconds)."""
    xs = jnp.asarray(x, dtype)
    params = dict(charges=jnp.asarray(q, dtype))
    nbrs = sp.neighbor_list(space, xs, r_cut=r_cut, skin=0.1)
    call = jax.jit(lambda E, x, p, nb: E.energy_and_forces(x, p, nb))
    compile_s = timed(lambda: call(energy, xs, params, nbrs))[1]
    t = best_of(lambda: call(energy, xs, params, nbrs), repeats)
    box = energy.space.box_vector(3, dtype)
    qd = params["charges"]
    spread = jax.jit(lambda E, x, q, b: E.spread(x, q, b))
    fft = jax.jit(lambda E, g, b: E.reciprocal_from_grid(g, b))
    forward = jax.jit(lambda E, x, q, b: E._reciprocal(x, q, b))
    backward = jax.jit(lambda E, x, q, b: jax.value_and_grad(E._reciprocal)(x, q, b))
    real = jax.jit(lambda E, x, p, nb: E._real._energy_and_forces(
        x, E._real_params(p["charges"]), nb))
    charge = spread(energy, xs, qd, box)
    split = {
        "spreading": best_of(lambda: spread(energy, xs, qd, box), repeats).best,
        "FFT + convolution": best_of(lambda: fft(energy, charge, box), repeats).best,
        "reciprocal forward": best_of(lambda: forward(energy, xs, qd, box),
                                      repeats).best,
        "reciprocal with gradient": best_of(lambda: backward(energy, xs, qd, box),
                                            repeats).best,
        "real space (neighbour list)": best_of(lambda: real(energy, xs, params, nbrs),
                                               repeats).best,
    }
    split["gathering (gradient - forward)"] = (split["reciprocal with gradient"]
                                               - split["reciprocal forward"])
    name = jnp.dtype(dtype).name
    print(f"simlib {name}: {1e3 * t.best:.1f} ms per force call (compile {compile_s:.1f} s)")
    for k, v in split.items():
        print(f"    {k:32s} {1e3 * v:8.1f} ms")
    return t.best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--r-cut", type=float, default=0.9)
    ap.add_argument("--tolerance", type=float, default=5e-4, help="OpenMM's ewaldErrorTolerance")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)

    print(f"load average at start: {load_average()}")
    x, q, L = system(args.n)
    try:
        import openmm  # noqa: F401
        have_openmm = True
    except ImportError:
        have_openmm = False
        print("openmm is not installed: simlib alone (bash benchmarks/install_peers.sh)")

    if have_openmm:
        ctx, force = openmm_context(x, q, L, args.r_cut, args.tolerance, "Reference")
        alpha, *grid = force.getPMEParametersInContext(ctx)
        grid = tuple(int(g) for g in grid)
    else:
        p = sp.ewald_parameters(L, args.r_cut, args.tolerance)
        alpha, grid = p.alpha, p.grid
    print(f"n = {args.n}, box = {L:.4f} nm, r_cut = {args.r_cut} nm, alpha = {alpha:.6f} "
          f"/nm, grid = {grid}, order 5")

    space = sp.periodic(L)
    energy = sp.pme(space, args.r_cut, alpha=alpha, grid=grid, coulomb_constant=ONE_4PI_EPS0)
    params64 = dict(charges=jnp.asarray(q))
    x64 = jnp.asarray(x)
    nbrs64 = sp.neighbor_list(space, x64, r_cut=args.r_cut, skin=0.1)

    if have_openmm:
        e_ref, f_ref = openmm_state(ctx)
        e, f = energy.energy_and_forces(x64, params64, nbrs64)
        rms = np.sqrt(np.mean(f_ref**2))
        print(f"agreement with OpenMM Reference (double): energy {abs(e - e_ref) / abs(e_ref):.2e}"
              f" relative, forces {np.sqrt(np.mean((f - f_ref) ** 2)) / rms:.2e} RMS relative")

    rows = {jnp.dtype(d).name: time_simlib(energy, x, q, space, args.r_cut, d, args.repeats)
            for d in (jnp.float32, jnp.float64)}

    if have_openmm:
        cpu, _ = openmm_context(x, q, L, args.r_cut, args.tolerance, "CPU", args.threads,
                                pme=(alpha, *grid))
        t = best_of(lambda: openmm_state(cpu), args.repeats)
        print(f"OpenMM CPU ({args.threads} threads, mixed precision): {1e3 * t.best:.1f} ms "
              f"per force call")
        for name, s in rows.items():
            print(f"ratio simlib {name} / OpenMM: {s / t.best:.1f}x slower")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
