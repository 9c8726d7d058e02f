"""Smooth PME: simlib against OpenMM on the same box, charges, alpha, grid and cutoff.

A box of ``--n`` random charges (+-0.8 e, neutral) at the atom density of water
(100 atoms/nm^3), cutoff ``--r-cut`` nm, OpenMM's PME parameters for ``--tolerance``
(``getPMEParametersInContext``) given to both. Prints:

* agreement: simlib (float64) against OpenMM's Reference platform (double): relative
  energy error and RMS force error over RMS force;
* one force evaluation: simlib (jitted, float32 and float64, neighbour list built once;
  the real-space pairs from the native kernel, and from the pure-JAX kernel that
  ``SIMLIB_NATIVE=0`` uses) against OpenMM's CPU platform (``--threads``; mixed
  precision), every contender timed in turn, best of ``--repeats``;
* simlib's time split: spreading, FFT and convolution (forward), the reverse pass
  (gathering: the gradient of the reciprocal energy minus its forward), the real-space
  pairs over the neighbour list (native and pure JAX), and the virial (NPT needs one a
  step).

    python benchmarks/pme.py                 # n = 3000, about a minute on 2 cores
    python benchmarks/pme.py --n 24000 --threads 2 --repeats 5

OpenMM is a peer, never a dependency (``benchmarks/install_peers.sh``); without it the
script times simlib alone with parameters from ``sp.ewald_parameters``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import load_average, round_robin, timed  # noqa: E402

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


def _pure_energy_and_forces(E, x, p, nb):
    """``E.energy_and_forces`` with the real-space pairs from the pure-JAX kernel: the path
    ``SIMLIB_NATIVE=0`` (or no compiler) takes, timed in the same process."""
    q = p["charges"]
    box = E.space.box_vector(3, x.dtype)
    e_real, f_real = E._real._energy_and_forces(x, E._real_params(q), nb)
    e_long, g_long = jax.value_and_grad(E._long_range)(x, q, box)
    k = E.coulomb_constant
    return k * (e_real + e_long), k * (f_real - g_long)


def simlib_calls(energy, x, q, space, r_cut, dtype):
    """Zero-argument calls (jitted, compile time reported apart) for one dtype: the force
    call with the native pairs and with the pure-JAX ones, the virial, and the split."""
    xs = jnp.asarray(x, dtype)
    params = dict(charges=jnp.asarray(q, dtype))
    nbrs = sp.neighbor_list(space, xs, r_cut=r_cut, skin=0.1)
    box = energy.space.box_vector(3, dtype)
    qd = params["charges"]
    charge = jax.jit(lambda E, x, q, b: E.spread(x, q, b))(energy, xs, qd, box)
    jits = {
        "force call": (lambda E, x, p, nb: E.energy_and_forces(x, p, nb), (xs, params, nbrs)),
        "force call, pure-JAX pairs": (_pure_energy_and_forces, (xs, params, nbrs)),
        "virial (for NPT)": (lambda E, x, p, nb: E.virial(x, p, nb), (xs, params, nbrs)),
        "real space, native": (lambda E, x, q, nb: E._real_space(x, q, box, nb, True),
                               (xs, qd, nbrs)),
        "real space, pure JAX": (lambda E, x, p, nb: E._real._energy_and_forces(
            x, E._real_params(p["charges"]), nb), (xs, params, nbrs)),
        "spreading": (lambda E, x, q, b: E.spread(x, q, b), (xs, qd, box)),
        "FFT + convolution": (lambda E, g, b: E.reciprocal_from_grid(g, b), (charge, box)),
        "reciprocal forward": (lambda E, x, q, b: E._reciprocal(x, q, b), (xs, qd, box)),
        "reciprocal with gradient": (lambda E, x, q, b: jax.value_and_grad(E._reciprocal)(
            x, q, b), (xs, qd, box)),
    }
    calls, compile_s = {}, {}
    for name, (fn, args) in jits.items():
        f = jax.jit(fn)
        compile_s[name] = timed(lambda f=f, args=args: f(energy, *args))[1]
        calls[name] = functools.partial(f, energy, *args)
    return calls, compile_s


def _cpu_seconds(call):
    """Process CPU seconds (every thread) of one call."""
    start = time.process_time()
    jax.block_until_ready(call())
    return time.process_time() - start


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

    calls, compile_s = {}, {}
    for d in (jnp.float32, jnp.float64):
        c, cs = simlib_calls(energy, x, q, space, args.r_cut, d)
        name = jnp.dtype(d).name
        calls.update({(name, k): v for k, v in c.items()})
        compile_s.update({(name, k): v for k, v in cs.items()})
    if have_openmm:
        cpu, _ = openmm_context(x, q, L, args.r_cut, args.tolerance, "CPU", args.threads,
                                pme=(alpha, *grid))
        calls[("openmm", "force call")] = lambda: openmm_state(cpu)
    # every contender in turn, repeat by repeat, so that the load hits them alike
    t = {k: v.best for k, v in round_robin(calls, args.repeats).items()}
    # CPU seconds per call (all threads; best of the repeats): what a call costs the
    # machine, less sensitive than wall time to other work on a shared machine
    main_calls = {k: v for k, v in calls.items() if k[1].startswith("force call")}
    cpu = {k: min(_cpu_seconds(c) for _ in range(args.repeats)) for k, c in main_calls.items()}
    for name in ("float32", "float64"):
        print(f"simlib {name}: {1e3 * t[(name, 'force call')]:.1f} ms per force call, "
              f"{1e3 * t[(name, 'force call, pure-JAX pairs')]:.1f} ms with the pure-JAX "
              f"pairs (compile {compile_s[(name, 'force call')]:.1f} s); CPU time "
              f"{1e3 * cpu[(name, 'force call')]:.1f} and "
              f"{1e3 * cpu[(name, 'force call, pure-JAX pairs')]:.1f} ms")
        for (dn, k), v in t.items():
            if dn == name and k != "force call":
                print(f"    {k:32s} {1e3 * v:8.1f} ms")
        g = t[(name, "reciprocal with gradient")] - t[(name, "reciprocal forward")]
        print(f"    {'gathering (gradient - forward)':32s} {1e3 * g:8.1f} ms")
    if have_openmm:
        o = t[("openmm", "force call")]
        print(f"OpenMM CPU ({args.threads} threads, mixed precision): {1e3 * o:.1f} ms "
              f"per force call; CPU time {1e3 * cpu[('openmm', 'force call')]:.1f} ms")
        c = cpu[("openmm", "force call")]
        for name in ("float32", "float64"):
            print(f"ratio simlib {name} / OpenMM: {t[(name, 'force call')] / o:.2f} "
                  f"(pure-JAX pairs: {t[(name, 'force call, pure-JAX pairs')] / o:.2f}); "
                  f"CPU time {cpu[(name, 'force call')] / c:.2f} "
                  f"(pure: {cpu[(name, 'force call, pure-JAX pairs')] / c:.2f})")
    print(f"load average at end: {load_average()}")


if __name__ == "__main__":
    main()
