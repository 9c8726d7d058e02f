"""Where forward mode stops paying: gradient time of ``ForwardMode()`` against reverse mode
(``Checkpointed()``) as the number of differentiated input components grows.

The default strategy (``adjoint=None``, simlib/_auto.py) takes forward mode for at most
``FORWARD_MODE_MAX`` differentiated components; this script measures the crossover on the
two problem shapes of issue 12: one Lotka-Volterra trajectory (2 states) and the same model
as a batched (512, 2) state, RK4 fixed step, 201 save times, float64. The differentiated
input is a vector ``w`` of ``n`` components that scales the four rates (every component
feeds the field, so each carries a real tangent).

    python benchmarks/adjoint_threshold.py [--quick]
    XLA_FLAGS=--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=100000000 \
        python benchmarks/adjoint_threshold.py      # the small-loop limit raised
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from _timing import best_of  # benchmarks/_timing.py, next to this file

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import simlib as sl  # noqa: E402
from simlib.systems import lotka_volterra  # noqa: E402

BASE = jnp.array([1.5, 1.0, 3.0, 1.0])


def field(t, y, w):
    scale = 1.0 + 0.01 * jnp.tanh(jnp.mean(w) + 0.1 * jnp.sum(w ** 2))
    return lotka_volterra(t, y, tuple(BASE * scale))


def make_loss(y0, n_steps, adjoint):
    ts = jnp.linspace(0.0, 10.0, 201)
    data = jnp.ones((201,) + y0.shape)

    def loss(w):
        sol = sl.solve(field, y0, 0.0, 10.0, solver=sl.RK4(), dt=10.0 / n_steps, args=w,
                       saveat=sl.SaveAt(ts=ts), adjoint=adjoint)
        return jnp.sum((sol.ys - data) ** 2)
    return loss


def best_time(fn, x, repeats):
    return best_of(lambda: fn(x), repeats, slow_s=math.inf).best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer steps and sizes")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    ns = [1, 4, 16, 64] if a.quick else [1, 2, 4, 8, 16, 32, 64]
    shapes = {"single (2,)": (jnp.array([10.0, 5.0]), 5_000 if a.quick else 50_000),
              "batched (512, 2)": (jnp.tile(jnp.array([10.0, 5.0]), (512, 1))
                                   * jnp.linspace(0.9, 1.1, 512)[:, None],
                                   1_000 if a.quick else 5_000)}
    flags = os.environ.get("XLA_FLAGS", "")
    print(f"simlib {sl.__version__} | jax {jax.__version__} | XLA_FLAGS={flags!r}")
    print(f"{'shape':18s} {'steps':>6s} {'n':>4s} {'forward':>9s} {'ForwardMode':>12s} "
          f"{'Checkpointed':>13s} {'FM/fwd':>7s} {'ck/fwd':>7s} {'faster':>12s}")
    rows = []
    for name, (y0, steps) in shapes.items():
        for n in ns:
            w = jnp.linspace(-0.5, 0.5, n)
            fwd = jax.jit(make_loss(y0, steps, sl.Direct()))
            fm = jax.jit(jax.grad(make_loss(y0, steps, sl.ForwardMode())))
            ck = jax.jit(jax.grad(make_loss(y0, steps, sl.Checkpointed())))
            t_f, t_fm, t_ck = (best_time(g, w, 3) for g in (fwd, fm, ck))
            rel = float(jnp.max(jnp.abs(fm(w) - ck(w))) / jnp.max(jnp.abs(ck(w))))
            row = dict(shape=name, steps=steps, n=n, forward=t_f, forward_mode=t_fm,
                       checkpointed=t_ck, rel_diff=rel)
            rows.append(row)
            print(f"{name:18s} {steps:6d} {n:4d} {t_f * 1e3:7.1f}ms {t_fm * 1e3:10.1f}ms "
                  f"{t_ck * 1e3:11.1f}ms {t_fm / t_f:6.1f}x {t_ck / t_f:6.1f}x "
                  f"{'ForwardMode' if t_fm < t_ck else 'Checkpointed':>12s}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(dict(xla_flags=flags, rows=rows), indent=1))


if __name__ == "__main__":
    main()
