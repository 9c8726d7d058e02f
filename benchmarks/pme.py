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
* simlib's time split of the reciprocal part with forces (what a step needs): spreading
  (the native kernel ``_native/pme.cc``, and the pure-JAX scatter-add for reference), FFT,
  convolution and the potential grid (``rfftn``, the influence function and, by reverse
  mode, one ``irfftn``), gathering (the native kernel), and the whole reciprocal energy
  with its gradient (native, and pure JAX as ``SIMLIB_NATIVE=0`` runs it); then the
  real-space pairs over the neighbour list (native and pure JAX) and the virial (NPT
  needs one a step);
* OpenMM's split: the same context with the reciprocal space in its own force group
  (``setReciprocalSpaceForceGroup(1)``), timed as ``getState(getForces=True,
  groups={1})`` (reciprocal only) and ``groups={0}`` (direct space only). OpenMM does not
  expose its spreading, FFT and gathering apart, so its reciprocal time is one figure.

    python benchmarks/pme.py                 # n = 3000, about a minute on 2 cores
    python benchmarks/pme.py --n 24000 --threads 2 --repeats 5 --json out.json

OpenMM is a peer, never a dependency (``benchmarks/install_peers.sh``); without it the
script times simlib alone with parameters from ``sp.ewald_parameters``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import jax

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import fmt_load, load_average, round_robin, timed  # noqa: E402

from simlib import particles as sp  # noqa: E402
from simlib.particles import _electrostatics as el  # noqa: E402

ONE_4PI_EPS0 = 138.935457644382      # OpenMM's Coulomb constant, kJ mol^-1 nm e^-2


def system(n: int, seed: int = 0):
    L = (n / 100.0) ** (1 / 3)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, L, (n, 3))
    q = np.tile([0.8, -0.8], n // 2)
    return x, q, L


def openmm_context(x, q, L, r_cut, tolerance, platform, threads=None, pme=None,
                   split=False):
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
    if split:                        # reciprocal space alone in force group 1
        force.setReciprocalSpaceForceGroup(1)
    s.addForce(force)
    props = {"Threads": str(threads)} if threads else {}
    ctx = mm.Context(s, mm.VerletIntegrator(1e-3), mm.Platform.getPlatformByName(platform),
                     props)
    ctx.setPositions([mm.Vec3(*map(float, r)) for r in x])
    return ctx, force


def openmm_state(ctx, groups=None):
    kw = {} if groups is None else {"groups": groups}
    st = ctx.getState(getEnergy=True, getForces=True, **kw)
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
    g, o = energy.grid, energy.order
    alpha = jnp.asarray(energy.alpha, dtype)

    def potential(E, c, b):              # rfftn, influence function, irfftn (reverse mode)
        return jax.value_and_grad(lambda c: E.reciprocal_from_grid(c, b))(c)

    pot = jax.jit(potential)(energy, charge, box)[1]
    jits = {
        "force call": (lambda E, x, p, nb: E.energy_and_forces(x, p, nb), (xs, params, nbrs)),
        "force call, pure-JAX pairs": (_pure_energy_and_forces, (xs, params, nbrs)),
        "virial (for NPT)": (lambda E, x, p, nb: E.virial(x, p, nb), (xs, params, nbrs)),
        "real space, native": (lambda E, x, q, nb: E._real_space(x, q, box, nb, True),
                               (xs, qd, nbrs)),
        "real space, pure JAX": (lambda E, x, p, nb: E._real._energy_and_forces(
            x, E._real_params(p["charges"]), nb), (xs, params, nbrs)),
        "spreading, native": (lambda E, x, q, b: el._pme_spread_ffi(g, o, x, q, b),
                              (xs, qd, box)),
        "spreading, pure JAX": (lambda E, x, q, b: E.spread(x, q, b), (xs, qd, box)),
        "FFT + convolution + potential": (potential, (charge, box)),
        "gathering, native": (lambda E, x, q, b, p: el._pme_gather_ffi(g, o, x, q, b, p),
                              (xs, qd, box, pot)),
        "reciprocal with gradient": (lambda E, x, q, b: jax.value_and_grad(E._reciprocal)(
            x, q, b), (xs, qd, box)),
        "reciprocal with gradient, pure JAX": (
            lambda E, x, q, b, a: el._pme_reciprocal_pure(g, o, x, q, b, a),
            (xs, qd, box, alpha)),
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
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)

    start_load = load_average()
    print(f"load average at start: {start_load}")
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

    agreement = {}
    if have_openmm:
        e_ref, f_ref = openmm_state(ctx)
        e, f = energy.energy_and_forces(x64, params64, nbrs64)
        rms = np.sqrt(np.mean(f_ref**2))
        agreement = dict(energy=float(abs(e - e_ref) / abs(e_ref)),
                         forces_rms=float(np.sqrt(np.mean((f - f_ref) ** 2)) / rms))
        print(f"agreement with OpenMM Reference (double): energy {agreement['energy']:.2e}"
              f" relative, forces {agreement['forces_rms']:.2e} RMS relative")

    calls, compile_s = {}, {}
    for d in (jnp.float32, jnp.float64):
        c, cs = simlib_calls(energy, x, q, space, args.r_cut, d)
        name = jnp.dtype(d).name
        calls.update({(name, k): v for k, v in c.items()})
        compile_s.update({(name, k): v for k, v in cs.items()})
    if have_openmm:
        cpu, _ = openmm_context(x, q, L, args.r_cut, args.tolerance, "CPU", args.threads,
                                pme=(alpha, *grid), split=True)
        calls[("openmm", "force call")] = lambda: openmm_state(cpu)
        calls[("openmm", "reciprocal only")] = lambda: openmm_state(cpu, {1})
        calls[("openmm", "direct space only")] = lambda: openmm_state(cpu, {0})
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
    if have_openmm:
        o = t[("openmm", "force call")]
        print(f"OpenMM CPU ({args.threads} threads, mixed precision): {1e3 * o:.1f} ms "
              f"per force call; CPU time {1e3 * cpu[('openmm', 'force call')]:.1f} ms; "
              f"reciprocal only {1e3 * t[('openmm', 'reciprocal only')]:.1f} ms, direct "
              f"space only {1e3 * t[('openmm', 'direct space only')]:.1f} ms")
        r = t[("openmm", "reciprocal only")]
        for name in ("float32", "float64"):
            print(f"ratio simlib {name} reciprocal with gradient / OpenMM reciprocal only: "
                  f"{t[(name, 'reciprocal with gradient')] / r:.2f} (pure JAX: "
                  f"{t[(name, 'reciprocal with gradient, pure JAX')] / r:.2f})")
        c = cpu[("openmm", "force call")]
        for name in ("float32", "float64"):
            print(f"ratio simlib {name} / OpenMM: {t[(name, 'force call')] / o:.2f} "
                  f"(pure-JAX pairs: {t[(name, 'force call, pure-JAX pairs')] / o:.2f}); "
                  f"CPU time {cpu[(name, 'force call')] / c:.2f} "
                  f"(pure: {cpu[(name, 'force call, pure-JAX pairs')] / c:.2f})")
    end_load = load_average()
    print(f"load average at end: {end_load}")
    if args.json:
        out = dict(n=args.n, box_nm=L, r_cut=args.r_cut, tolerance=args.tolerance,
                   alpha=float(alpha), grid=list(grid), order=5, threads=args.threads,
                   cpus=os.cpu_count(), repeats=args.repeats, jax=jax.__version__,
                   load_start=fmt_load(start_load), load_end=fmt_load(end_load),
                   agreement_with_openmm_reference=agreement,
                   best_ms={f"{a} / {b}": 1e3 * v for (a, b), v in t.items()},
                   cpu_ms={f"{a} / {b}": 1e3 * v for (a, b), v in cpu.items()},
                   compile_s={f"{a} / {b}": v for (a, b), v in compile_s.items()})
        if have_openmm:
            import openmm
            out["openmm"] = openmm.__version__
        Path(args.json).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
