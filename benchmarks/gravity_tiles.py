"""Direct-sum gravity on an accelerator: simlib's kernels against a plain ``jnp`` all-pairs sum.

    python benchmarks/gravity_tiles.py --bodies 100000 1000000 --json out.json

Float32, one force evaluation (energy and forces for simlib, forces alone for the plain
sum), uniform normal positions, softening 0.01, G 1, masses 1/n. Rows: the plain row-block
sum (the peer, as in benchmarks/gpu.sh), simlib's pure-JAX kernel, and the two Pallas
kernels (one-sided, and each pair once by Newton's third law) at several tile sizes.
Warm-up first; best of ``--repeats``; compile time apart.
On a CPU the Pallas rows run in interpret mode and are skipped unless --interpret.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of  # noqa: E402

import simlib.particles as sp  # noqa: E402
from simlib.particles import _energy  # noqa: E402
from simlib.particles._gravity_pallas import gravity_sums, gravity_sums_symmetric  # noqa: E402


def plain(x, m, eps):
    """The same sum written directly, by components, in row blocks of 512."""
    n = x.shape[0]
    block = 512 if n % 512 == 0 else n
    xt = x.T

    def rows(i0):
        xi = jax.lax.dynamic_slice_in_dim(xt, i0, block, axis=1)
        d = [xi[k][:, None] - xt[k][None, :] for k in range(3)]
        inv = jax.lax.rsqrt(d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps * eps)
        w = m[None, :] * inv * inv * inv
        return jnp.stack([-jnp.sum(w * d[k], axis=1) for k in range(3)], axis=1)

    return jax.lax.map(rows, jnp.arange(0, n, block)).reshape(n, 3) * m[:, None]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bodies", type=int, nargs="+", default=[100_000])
    ap.add_argument("--blocks", nargs="*", default=["64x8192", "32x8192", "128x4096"],
                    help="Pallas tiles to try, TARGETSxSOURCES (the kernel's default 64x8192)")
    ap.add_argument("--symmetric", nargs="*", default=["64x8192", "128x8192", "32x8192"],
                    help="tiles of the Newton's-third-law kernel to try (its default 64x8192)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--interpret", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    on_cpu = jax.default_backend() == "cpu"
    rows = []
    for n in a.bodies:
        x = jax.random.normal(jax.random.key(1), (n, 3), jnp.float32)
        m = jnp.full((n,), 1.0 / n, jnp.float32)
        eps = jnp.float32(0.01)
        params = dict(G=jnp.float32(1.0), softening=eps, masses=m)
        energy = sp.pair_energy(sp.gravity, sp.free())
        contenders = {
            "plain jnp all-pairs (peer)": jax.jit(lambda x, m, eps: plain(x, m, eps)),
            "simlib pair_energy(gravity)": jax.jit(
                lambda x, m, eps, energy=energy: energy.energy_and_forces(
                    x, dict(G=jnp.float32(1.0), softening=eps, masses=m))[1]),
            "simlib pure-JAX kernel": jax.jit(
                lambda x, m, eps, energy=energy: _energy._gravity_direct(
                    energy, x, m, jnp.stack([jnp.float32(1.0), eps]))[1]),
        }
        if not on_cpu or a.interpret:
            for label, kernel, tiles in (("pallas", gravity_sums, a.blocks),
                                         ("pallas symmetric", gravity_sums_symmetric,
                                          a.symmetric)):
                for b in tiles:
                    bt, bs = (int(v) for v in b.split("x"))
                    contenders[f"{label} {b}"] = jax.jit(
                        lambda x, m, eps, bt=bt, bs=bs, kernel=kernel: -m[:, None] * kernel(
                            x, m, eps, block_targets=bt, block_sources=bs,
                            interpret=on_cpu)[0])
        ref = None
        for name, fn in contenders.items():
            try:
                timing = best_of(functools.partial(fn, x, m, eps), a.repeats,
                                 slow_s=float("inf"))
            except Exception as err:  # a variant that does not lower is a row, not a crash
                rows.append(dict(bodies=n, name=name, error=f"{type(err).__name__}: {err}"))
                print(f"{n:>9,} {name:<28} FAILED {type(err).__name__}: {str(err)[:300]}")
                continue
            out, first, best = timing.out, timing.warmup, timing.best
            if ref is None:
                ref = out
            err = float(jnp.max(jnp.abs(out - ref)) / jnp.max(jnp.abs(ref)))
            rows.append(dict(bodies=n, name=name, best_s=best, first_call_s=first,
                             g_pairs_per_s=n * n / best / 1e9, max_rel_diff_vs_plain=err))
            print(f"{n:>9,} {name:<28} {best * 1e3:9.2f} ms  {n * n / best / 1e9:7.1f} G pairs/s"
                  f"  first call {first:6.2f} s  rel diff {err:.1e}", flush=True)
            if a.json:
                Path(a.json).write_text(json.dumps(dict(rows=rows), indent=1))
        del params
    if a.json:
        Path(a.json).write_text(json.dumps(dict(backend=jax.default_backend(),
                                                devices=[str(d) for d in jax.devices()],
                                                jax=jax.__version__, rows=rows), indent=1))


if __name__ == "__main__":
    main()
