"""Micro-benchmarks of the linear algebra of the stiff solvers (simlib/_linalg).

Three parts, float64 on the CPU, best of ``--repeats`` runs of each (the machine may be
shared: compare the ratios between contenders of one run, not absolute times):

1. banded ``A = I - c J`` at n = 1,000 and 10,000 with bandwidths (1,1), (2,2), (4,4):
   factor and solve of the pure-JAX ``lax.scan`` LU, the native C++ LU (jax.ffi), LAPACK's
   ``dgbtrf``/``dgbtrs`` through scipy, scipy's ``splu`` on the same matrix;
2. sparse, the 2-D Brusselator's pattern (2 species, periodic 5-point Laplacian) at 32x32,
   128x128, 256x256: detection, colouring, the coloured Jacobian, the native static-pivot
   LU after a nested-dissection / MMD / RCM ordering (symbolic, factor, solve, fill),
   scipy ``splu`` with its default COLAMD ordering (factor, solve, fill), and the
   host-callback path (a ``splu`` per solve);
3. matrix-free GMRES on ``I - c J`` of the same Brusselator: iterations and time to a 1e-8
   relative residual for ``c = h`` (a first-order BDF step; ``h / alpha_k`` at higher
   orders differs by at most 2.3x), ``h`` from 1e-4 to 1e-1, without a preconditioner,
   with block-Jacobi (the 2x2 species block of each grid point) and ILU(0) (GMRES(50),
   at most 1,000 iterations; one timed run after the warm-up); and simlib's
   GMRES against ``jax.scipy.sparse.linalg.gmres`` on the same system.

Run: ``python benchmarks/linalg.py [--quick] [--repeats 5]``; writes
``benchmarks/results/linalg.json`` (``--out``).
"""

# ruff: noqa: B023 - the timed lambdas are called at once by best(), inside their loop
from __future__ import annotations

import argparse
import json
import math
import platform
from pathlib import Path

import jax
from _timing import best_of, timed  # benchmarks/_timing.py, next to this file

jax.config.update("jax_enable_x64", True)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.linalg.lapack as lapack  # noqa: E402
import scipy.sparse as sp  # noqa: E402
import scipy.sparse.linalg as spla  # noqa: E402

from simlib._linalg import _kernels  # noqa: E402
from simlib._linalg._banded import (  # noqa: E402
    band_lu_scan,
    band_lu_solve_scan,
    dense_from_band,
)
from simlib._linalg._coloring import CompressedPattern  # noqa: E402
from simlib._linalg._krylov import Krylov, gmres  # noqa: E402
from simlib._linalg._sparse import Sparse, _host_solve  # noqa: E402
from simlib._linalg._sparsity import jacobian_sparsity  # noqa: E402


def best(fn, repeats):
    """Best wall time of ``fn()`` (blocked until ready) over ``repeats`` runs, after a
    warm-up run (compilation excluded)."""
    return best_of(fn, repeats, slow_s=math.inf).best


# ---------------------------------------------------------------------------- banded
def banded(sizes, widths, repeats):
    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        for lower, upper in widths:
            w = lower + upper + 1
            # I - c J with J a diffusion-reaction-like band: diagonally weighted, random
            band = rng.normal(size=(n, w)) * 0.3
            band[:, lower] += 1.0 + np.abs(band).sum(axis=1) * 0.5 * rng.uniform(0, 2, n)
            band = np.where(_inside(n, lower, w), band, 0.0)
            b = rng.normal(size=n)
            jb, jrhs = jnp.asarray(band), jnp.asarray(b)
            row = dict(n=n, lower=lower, upper=upper)
            scan_lu = jax.jit(band_lu_scan, static_argnums=(1, 2))
            scan_solve = jax.jit(band_lu_solve_scan, static_argnums=2)
            lu = scan_lu(jb, lower, upper)
            row["scan_factor_s"] = best(lambda: scan_lu(jb, lower, upper), repeats)
            row["scan_solve_s"] = best(lambda: scan_solve(lu, jrhs, False), repeats)
            x_scan = np.asarray(scan_solve(lu, jrhs, False))
            if _kernels.load() is not None:
                nat_lu = jax.jit(_kernels.band_lu_native, static_argnums=(1, 2))
                nat_solve = jax.jit(_kernels.band_solve_native, static_argnums=2)
                lu_n = nat_lu(jb, lower, upper)
                row["native_factor_s"] = best(lambda: nat_lu(jb, lower, upper), repeats)
                row["native_solve_s"] = best(lambda: nat_solve(lu_n, jrhs, False), repeats)
                row["native_vs_scan_max_diff"] = float(
                    np.abs(np.asarray(nat_solve(lu_n, jrhs, False)) - x_scan).max())
            # LAPACK gbtrf/gbtrs through scipy: ab has 2 lower + upper + 1 rows
            ab = np.zeros((2 * lower + upper + 1, n))
            for j in range(w):
                i = np.arange(n)
                col = i - lower + j
                ok = (col >= 0) & (col < n)
                ab[lower + upper + i[ok] - col[ok], col[ok]] = band[ok, j]
            lub, piv, _ = lapack.dgbtrf(ab, lower, upper)
            row["lapack_factor_s"] = best(lambda: lapack.dgbtrf(ab, lower, upper), repeats)
            row["lapack_solve_s"] = best(lambda: lapack.dgbtrs(lub, lower, upper, b, piv),
                                         repeats)
            x_ref = lapack.dgbtrs(lub, lower, upper, b, piv)[0]
            row["scan_vs_lapack_max_rel"] = float(np.abs(x_scan - x_ref).max()
                                                  / np.abs(x_ref).max())
            a = sp.csc_matrix(dense_from_band(band, lower)) if n <= 2000 else _band_csc(
                band, lower)
            f = spla.splu(a)
            row["splu_factor_s"] = best(lambda: spla.splu(a), repeats)
            row["splu_solve_s"] = best(lambda: f.solve(b), repeats)
            rows.append(row)
            print("banded", _fmt(row), flush=True)
    return rows


def _inside(n, lower, w):
    col = np.arange(n)[:, None] - lower + np.arange(w)[None, :]
    return (col >= 0) & (col < n)


def _band_csc(band, lower):
    n, w = band.shape
    i = np.repeat(np.arange(n), w)
    col = i - lower + np.tile(np.arange(w), n)
    ok = (col >= 0) & (col < n)
    return sp.csc_matrix((band.ravel()[ok], (i[ok], col[ok])), shape=(n, n))


# ---------------------------------------------------------------------------- sparse
def brusselator(n_grid, alpha=10.0, a=3.4, b=1.0):
    """The 2-D Brusselator of SciMLBenchmarks (periodic, no forcing term), flattened as
    ``(2, N, N)``: ``u' = b + u^2 v - (a+1) u + alpha lap u``, ``v' = a u - u^2 v +
    alpha lap v``, ``dx = 1/N``."""
    scale = alpha * n_grid ** 2

    def g(t, y):
        u, v = y.reshape(2, n_grid, n_grid)

        def lap(z):
            return (jnp.roll(z, 1, 0) + jnp.roll(z, -1, 0) + jnp.roll(z, 1, 1)
                    + jnp.roll(z, -1, 1) - 4 * z)

        uuv = u * u * v
        return jnp.stack([b + uuv - (a + 1) * u + scale * lap(u),
                          a * u - uuv + scale * lap(v)]).ravel()

    return g


def brusselator_state(n_grid):
    x = np.linspace(0, 1, n_grid, endpoint=False)
    xx, yy = np.meshgrid(x, x, indexing="ij")
    u = 22 * (yy * (1 - yy)) ** 1.5
    v = 27 * (xx * (1 - xx)) ** 1.5
    return jnp.asarray(np.stack([u, v]).ravel())


def sparse(grids, repeats, c=1e-3):
    rows = []
    for n_grid in grids:
        g = brusselator(n_grid)
        y = brusselator_state(n_grid)
        n = y.size
        row = dict(grid=n_grid, n=n, c=c)
        pattern, row["detect_first_s"] = timed(lambda: jacobian_sparsity(g, 0.0, y))
        row["detect_again_s"] = timed(lambda: jacobian_sparsity(g, 0.0, y))[1]
        cp, row["color_s"] = timed(lambda: CompressedPattern(pattern))
        row["colors"] = cp.ncolors
        row["nnz_J"] = cp.nnz
        ls = Sparse(cp, kernel="native" if _kernels.load() is not None else "host")
        jac_fn = jax.jit(lambda yy: ls.linearise(g, 0.0, yy))
        jac = jac_fn(y)
        row["jacobian_s"] = best(lambda: jac_fn(y), repeats)
        f_eval = jax.jit(lambda yy: g(0.0, yy))
        row["f_eval_s"] = best(lambda: f_eval(y), repeats)
        a_vals = np.asarray(ls.operator(jac, jnp.asarray(c), None))
        a = cp.matrix(a_vals).tocsc()
        rhs = np.random.default_rng(1).normal(size=n)
        ref = spla.spsolve(a, rhs)
        # scipy splu (SuperLU, COLAMD, partial pivoting)
        f = spla.splu(a)
        row["splu_factor_s"] = best(lambda: spla.splu(a), max(1, repeats // 2))
        row["splu_solve_s"] = best(lambda: f.solve(rhs), repeats)
        row["splu_fill"] = int(f.L.nnz + f.U.nnz)
        # native static-pivot LU after a fill-reducing ordering
        if _kernels.load() is not None:
            # RCM's profile fill grows like n^1.5 (22.5M entries at 32,768 states): skipped
            # above 10,000 states
            for ordering in ("nd", "mmd", "rcm") if n <= 10_000 else ("nd", "mmd"):
                nat = Sparse(cp, kernel="native", ordering=ordering)
                sym, row[f"native_{ordering}_symbolic_s"] = timed(nat.symbolic)
                row[f"native_{ordering}_fill"] = sym.nnz
                factor = jax.jit(lambda j, c, nat=nat: nat.factor(j, c))
                solve = jax.jit(lambda fac, b, nat=nat: nat.solve(fac, b))
                fac = factor(jac, jnp.asarray(c))
                row[f"native_{ordering}_factor_s"] = best(lambda: factor(jac, jnp.asarray(c)),
                                                          repeats)
                row[f"native_{ordering}_solve_s"] = best(lambda: solve(fac, jnp.asarray(rhs)),
                                                         repeats)
                x = np.asarray(solve(fac, jnp.asarray(rhs)))
                row[f"native_{ordering}_err"] = float(np.abs(x - ref).max() / np.abs(ref).max())
                row[f"native_{ordering}_ok"] = bool(fac.ok)
        # host callback: splu inside every solve
        host = jax.jit(lambda v, b: _host_solve(cp, v, b, False))
        av = jnp.asarray(a_vals)
        row["host_callback_solve_s"] = best(lambda: host(av, jnp.asarray(rhs)),
                                            max(1, repeats // 2))
        rows.append(row)
        print("sparse", _fmt(row), flush=True)
    return rows


# ---------------------------------------------------------------------------- krylov
def krylov(grids, hs, repeats):
    rows = []
    for n_grid in grids:
        g = brusselator(n_grid)
        y = brusselator_state(n_grid)
        n = y.size
        pattern = CompressedPattern(jacobian_sparsity(g, 0.0, y))
        half = n // 2
        blocks = np.stack([np.arange(half), np.arange(half) + half], 1)
        rhs = jnp.asarray(np.random.default_rng(2).normal(size=n))
        pres = [None, "block_jacobi"] + (["ilu0"] if _kernels.load() is not None else [])
        for pre in pres:
            ls = Krylov(pre, pattern if pre else None, blocks=blocks if pre else None,
                        rtol=1e-8, restart=50, max_restarts=20)
            op = jax.jit(lambda yy, ls=ls: ls.linearise(g, 0.0, yy))(y)
            for h in hs:
                factor = jax.jit(lambda op, c, ls=ls: ls.factor(op, c))
                run = jax.jit(lambda fac, b, ls=ls: ls.solve_with_info(fac, b, field=g))
                fac = factor(op, jnp.asarray(h))
                _, info = run(fac, rhs)  # the warm-up; one timed run (GMRES can be long)
                row = dict(grid=n_grid, n=n, h=h, preconditioner=pre or "none",
                           iterations=int(info.iterations), residual=float(info.residual),
                           converged=bool(info.converged),
                           precond_setup_s=best(lambda: factor(op, jnp.asarray(h)), repeats),
                           solve_s=timed(lambda: run(fac, rhs))[1])
                rows.append(row)
                print("krylov", _fmt(row), flush=True)
        # simlib's GMRES against jax.scipy's on the unpreconditioned system, h = 1e-3
        c = 1e-3

        def mv(x):
            return x - c * jax.jvp(lambda w: g(0.0, w), (y,), (x,))[1]

        ours = jax.jit(lambda b: gmres(mv, b, rtol=1e-8, restart=50, max_restarts=40)[0])
        theirs = jax.jit(lambda b: jax.scipy.sparse.linalg.gmres(
            mv, b, tol=1e-8, atol=0.0, restart=50, maxiter=40)[0])
        row = dict(grid=n_grid, n=n, h=c, compare="gmres",
                   simlib_s=best(lambda: ours(rhs), 1), jax_scipy_s=best(lambda: theirs(rhs), 1))
        for key, fn in (("simlib", ours), ("jax_scipy", theirs)):
            x = fn(rhs)
            row[f"{key}_residual"] = float(jnp.linalg.norm(mv(x) - rhs) / jnp.linalg.norm(rhs))
        rows.append(row)
        print("gmres", _fmt(row), flush=True)
    return rows


def _fmt(row):
    return " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in row.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--parts", default="banded,sparse,krylov")
    parser.add_argument("--grids", type=int, nargs="*", help="Brusselator grids (N)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "linalg.json"))
    args = parser.parse_args()
    parts = args.parts.split(",")
    sizes = [1000] if args.quick else [1000, 10_000]
    grids = args.grids or ([32] if args.quick else [32, 128, 256])
    out = dict(machine=dict(platform=platform.platform(), processor=platform.processor(),
                            cpus=len(jax.devices("cpu")), jax=jax.__version__,
                            native=_kernels.load() is not None),
               repeats=args.repeats)
    if "banded" in parts:
        out["banded"] = banded(sizes, [(1, 1), (2, 2), (4, 4)], args.repeats)
    if "sparse" in parts:
        out["sparse"] = sparse(grids, args.repeats)
    if "krylov" in parts:
        out["krylov"] = krylov(grids, [1e-4, 1e-3, 1e-2, 1e-1], args.repeats)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
