"""Why a ``jax.vmap`` ensemble of adaptive BDF solves with the sparse LU is slower than a
loop of single solves (issue 23's 64-member target).

Counts the member factorisations done by the native sparse LU (the kernel's own counter,
``simlib._linalg._kernels.sparse_lu_count``) and the process CPU seconds of (a) a loop of
jitted single solves and (b) one jitted ``vmap`` over the members, on ``bruss2d_N`` (t in
[0, 11.5], rtol 1e-6), parameters ``(A, B, alpha) x exp(0.1 normal)`` as in
``benchmarks/pde.py``. BDF refactorises a member under ``vmap`` only when that member
needs it (the kernel takes the batch's mask), so the two counts agree; the members still
step in lockstep until the slowest one finishes, and a step that some member retries
with a new Jacobian evaluates it for every member.

Usage: ``python benchmarks/pde_ensemble_diagnose.py N MEMBERS`` (e.g. ``16 4``).
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false "
                      "intra_op_parallelism_threads=1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _timing import Timer, warm_up  # noqa: E402  (benchmarks/_timing.py, next to this file)

jax.config.update("jax_enable_x64", True)
import simlib as sl  # noqa: E402
from simlib._linalg import _kernels  # noqa: E402
from validation import pde_reference as ref  # noqa: E402


def main(n: int, m: int) -> None:
    prob = ref.problem("bruss2d", n)
    rng = np.random.default_rng(0)
    params = jnp.asarray(np.asarray(prob.args) * np.exp(0.1 * rng.standard_normal((m, 3))))
    ls = sl.SparseLU(prob.sparsity)

    def member(p):
        s = sl.solve(prob.f, jnp.asarray(prob.y0), 0.0, prob.t1, solver=sl.BDF(), rtol=1e-6,
                     atol=1e-6, args=(p[0], p[1], p[2]), linear_solver=ls, throw=False)
        return s.stats["num_accepted"], s.stats["num_steps"]

    one, many = jax.jit(member), jax.jit(jax.vmap(member))
    warm_up(lambda: one(params[0]))
    warm_up(lambda: many(params))
    c0 = _kernels.sparse_lu_count()
    with Timer() as t:
        steps = [tuple(int(x) for x in one(p)) for p in params]
    t_loop, f_loop = t.cpu, _kernels.sparse_lu_count() - c0
    c0 = _kernels.sparse_lu_count()
    with Timer() as t:
        _, attempts = jax.block_until_ready(many(params))
    t_vmap, f_vmap = t.cpu, _kernels.sparse_lu_count() - c0
    print(f"bruss2d_{n}, {m} members: loop CPU {t_loop:.2f} s, member factorisations "
          f"{f_loop} ((accepted, attempted) steps {steps}); vmap CPU {t_vmap:.2f} s, member "
          f"factorisations {f_vmap}, attempts {np.asarray(attempts).tolist()} (lockstep: "
          f"{int(np.max(attempts))} batched attempts)")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
