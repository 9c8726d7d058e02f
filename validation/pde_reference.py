"""PDE problems by the method of lines, their NumPy right-hand sides for the peers, and
reference solutions at ``t1``.

Problems (JAX fields from :mod:`simlib.systems`, written with :mod:`simlib.pde`; the NumPy
fields below are the same discretisation written vectorised, for scipy and SUNDIALS):

* ``bruss1d``: the 1-D Brusselator of Hairer and Wanner (*Solving ODEs II*, IV.1),
  ``A = 1``, ``B = 3``, ``alpha = 1/50``, ``n`` interior points, ``2n`` states with the two
  species of a point next to each other (bandwidth ``(2, 2)``), ``t`` in ``[0, 10]``.
* ``bruss2d``: the 2-D Brusselator of SciMLBenchmarks.jl (``benchmarks/StiffODE/Bruss.jmd``),
  ``A = 3.4``, ``B = 1``, ``alpha = 10``, periodic ``n x n`` grid ``x_i = i / (n - 1)``,
  ``2 n^2`` states, ``t`` in ``[0, 11.5]``; the forcing switches on at ``t = 1.1``.
* the heat equation ``u_t = D u_xx`` on ``[0, 1]`` with the closed-form solutions
  ``exp(-(k pi)^2 D t) sin(k pi x)`` (Dirichlet) and ``exp(-(k pi)^2 D t) cos(k pi x)``
  (Neumann), and those of the semi-discrete system (the discrete eigenvalue
  ``-(4 / h^2) sin^2(k pi h / 2)`` in place of ``-(k pi)^2``): :func:`heat_problem`.

Reference solutions at ``t1`` (:func:`reference`): scipy ``Radau`` with ``jac_sparsity``
at ``rtol = atol = 1e-10`` for the 1-D problem. For the 2-D one scipy cannot reach the
larger grids (one sparse LU of the 128 x 128 problem takes seconds, Radau needs a
complex one too at every Jacobian update, and at 1e-10 there are hundreds of them; it
took 16 minutes on the 32 x 32 grid on a loaded machine), so every 2-D reference is
SUNDIALS CVODE (BDF) at ``rtol = atol = 1e-12``, integrated in two pieces at the
forcing's switch ``t = 1.1`` so that no step straddles it, with GMRES preconditioned by
the exact inverse of ``I - gamma alpha lap`` (the diffusion part, by FFT: the periodic
5-point Laplacian is diagonal in the discrete Fourier basis). :func:`cross_check`
compares it on the 32 x 32 grid with scipy Radau at 1e-10 (measured: 8.5e-9 relative)
and with itself at 1e-11 (6.0e-8). References are cached in
``validation/pde_reference.npz`` (tracked); ``python -m validation.pde_reference`` computes
the missing ones into it (``--force``: all of them; ``--out`` writes a separate file to
merge). A reference that validation/pde.py or benchmarks/pde.py compute on the way (a span
the tracked file lacks) goes to ``$SIMLIB_CACHE/pde_reference.npz`` (default
``~/.cache/simlib``), outside the repository, and is read from there after the tracked file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import numpy as np
import scipy.sparse
from scipy.integrate import solve_ivp

from simlib import pde, systems

CACHE = Path(__file__).resolve().parent / "pde_reference.npz"  # tracked: the shipped references
# References computed on the way (by validation/pde.py or benchmarks/pde.py, for a size or
# span that CACHE lacks) go here, outside the repository, so that a run does not rewrite a
# tracked file; ``python -m validation.pde_reference`` is the explicit way to add to CACHE.
LOCAL_CACHE = Path(os.environ.get("SIMLIB_CACHE") or Path(
    os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "simlib") / "pde_reference.npz"
WRITE_TO: Path | None = None  # where reference() stores a new one (None: LOCAL_CACHE)
REF_RTOL = 1e-10  # scipy Radau
CVODE_REF_RTOL = 1e-12  # CVODE with the FFT preconditioner (large grids)
SWITCH = 1.1  # the 2-D Brusselator's forcing switches on here
DEFAULT_T1 = {"bruss1d": 10.0, "bruss2d": 11.5}


# --------------------------------------------------------------------------------------
# NumPy right-hand sides (vectorised), for scipy and SUNDIALS


def bruss1d_np(t, y, args):
    """:func:`simlib.systems.brusselator_1d` on the flat interleaved state, in NumPy."""
    a, b, alpha = args
    n = y.size // 2
    c = alpha * (n + 1) ** 2
    u, v = y[0::2], y[1::2]
    out = np.empty_like(y)
    du, dv = out[0::2], out[1::2]
    uuv = u * u * v
    du[:] = a + uuv - (b + 1) * u - 2 * c * u
    dv[:] = b * u - uuv - 2 * c * v
    du[1:] += c * u[:-1]
    du[:-1] += c * u[1:]
    dv[1:] += c * v[:-1]
    dv[:-1] += c * v[1:]
    du[0] += c * a  # boundary values u = A, v = B/A
    du[-1] += c * a
    dv[0] += c * b / a
    dv[-1] += c * b / a
    return out


@functools.cache
def _disk(n: int) -> np.ndarray:
    xs, ys = systems.brusselator_2d_grid(n).mesh()
    return (((xs - 0.3) ** 2 + (ys - 0.6) ** 2) <= 0.1**2).astype(float)


def bruss2d_np(t, y, args, forcing: bool | None = None):
    """:func:`simlib.systems.brusselator_2d` on the flat ``(n, n, 2)`` state, in NumPy.

    ``forcing`` overrides the switch ``t >= 1.1`` (the reference integrates each side of
    it with the forcing fixed)."""
    a, b, alpha = args
    n = int(round(np.sqrt(y.size // 2)))
    c = alpha * (n - 1) ** 2
    w = y.reshape(n, n, 2)
    lap = -4.0 * w
    lap[1:] += w[:-1]
    lap[:-1] += w[1:]
    lap[0] += w[-1]
    lap[-1] += w[0]
    lap[:, 1:] += w[:, :-1]
    lap[:, :-1] += w[:, 1:]
    lap[:, 0] += w[:, -1]
    lap[:, -1] += w[:, 0]
    out = c * lap
    u, v = w[..., 0], w[..., 1]
    uuv = u * u * v
    on = (t >= SWITCH) if forcing is None else forcing
    out[..., 0] += b + uuv - (a + 1) * u + (5.0 * _disk(n) if on else 0.0)
    out[..., 1] += a * u - uuv
    return out.reshape(-1)


def bruss2d_jac_np(t, y, args) -> scipy.sparse.csr_array:
    """The exact Jacobian of :func:`bruss2d_np` (sparse): ``alpha lap`` per species plus the
    2 x 2 reaction block at each point."""
    a, b, alpha = args
    n = int(round(np.sqrt(y.size // 2)))
    lap = _laplacian_matrix_2d(n) * (alpha * (n - 1) ** 2)
    w = y.reshape(-1, 2)
    u, v = w[:, 0], w[:, 1]
    blocks = np.empty((n * n, 2, 2))
    blocks[:, 0, 0] = 2 * u * v - (a + 1)
    blocks[:, 0, 1] = u * u
    blocks[:, 1, 0] = a - 2 * u * v
    blocks[:, 1, 1] = -u * u
    reaction = scipy.sparse.block_diag(list(blocks), format="csr")
    return scipy.sparse.csr_array(scipy.sparse.kron(lap, scipy.sparse.eye_array(2)) + reaction)


@functools.cache
def _laplacian_matrix_2d(n: int) -> scipy.sparse.csr_array:
    one = scipy.sparse.diags_array([np.ones(n - 1), -2 * np.ones(n), np.ones(n - 1)],
                                   offsets=[-1, 0, 1]).tolil()
    one[0, n - 1] = one[n - 1, 0] = 1.0
    eye = scipy.sparse.eye_array(n)
    return scipy.sparse.csr_array(scipy.sparse.kron(one, eye) + scipy.sparse.kron(eye, one))


# --------------------------------------------------------------------------------------
# problems


@dataclass(frozen=True, eq=False)
class PDEProblem:
    """A method-of-lines problem on a flat state: ``f`` (JAX), ``f_np`` (NumPy),
    ``sparsity`` (from :func:`simlib.pde.pattern`) and its ``bandwidth``."""

    name: str
    label: str
    n: int
    f: object
    f_np: object
    y0: np.ndarray
    t1: float
    args: tuple
    sparsity: scipy.sparse.csr_array
    bandwidth: tuple[int, int]
    switch: float | None = None  # a discontinuity of f in t, if any
    source: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def states(self) -> int:
        return self.y0.size

    @property
    def key(self) -> str:
        """``bruss2d_128``; with a shorter span than the problem's own, ``bruss2d_128_t2``."""
        default = DEFAULT_T1[self.name]
        return f"{self.name}_{self.n}" + ("" if self.t1 == default else f"_t{self.t1:g}")

    def with_t1(self, t1: float | None) -> PDEProblem:
        """The same problem on ``[0, t1]`` (``None``: unchanged)."""
        if t1 is None or t1 == self.t1:
            return self
        if not 0 < t1:
            raise ValueError(f"t1 must be positive, got {t1}")
        return dataclasses.replace(self, t1=float(t1),
                                   label=f"{self.label}, t in [0, {t1:g}]")


def bruss1d_problem(n: int) -> PDEProblem:
    grid = systems.brusselator_1d_grid(n)
    sparsity = pde.pattern(grid, pde.laplacian_pattern(grid), species=2)

    def f(t, y, args):
        return systems.brusselator_1d(t, y.reshape(n, 2), args).reshape(-1)

    return PDEProblem("bruss1d", f"1-D Brusselator, {2 * n:,} states", n, f, bruss1d_np,
                      systems.brusselator_1d_initial(n).reshape(-1), DEFAULT_T1["bruss1d"],
                      systems.BRUSSELATOR_1D_DEFAULT_ARGS, sparsity, pde.bandwidth(sparsity),
                      source="Hairer and Wanner, Solving ODEs II, IV.1")


def bruss2d_problem(n: int) -> PDEProblem:
    grid = systems.brusselator_2d_grid(n)
    sparsity = pde.pattern(grid, pde.laplacian_pattern(grid), species=2)

    def f(t, y, args):
        return systems.brusselator_2d(t, y.reshape(n, n, 2), args).reshape(-1)

    return PDEProblem("bruss2d", f"2-D Brusselator {n} x {n}, {2 * n * n:,} states", n, f,
                      bruss2d_np, systems.brusselator_2d_initial(n).reshape(-1),
                      DEFAULT_T1["bruss2d"],
                      systems.BRUSSELATOR_2D_DEFAULT_ARGS, sparsity, pde.bandwidth(sparsity),
                      switch=SWITCH, source="SciMLBenchmarks.jl, benchmarks/StiffODE/Bruss.jmd")


def problem(name: str, n: int) -> PDEProblem:
    return {"bruss1d": bruss1d_problem, "bruss2d": bruss2d_problem}[name](n)


# --------------------------------------------------------------------------------------
# heat equation with closed forms


@dataclass(frozen=True, eq=False)
class HeatProblem:
    """``u_t = D u_xx`` on ``[0, 1]`` from ``u0 = mode(k pi x)`` (``sin`` with Dirichlet,
    ``cos`` with Neumann): the mode decays with rate ``(k pi)^2 D`` (the PDE) or
    ``(4/h^2) sin^2(k pi h/2) D`` (the semi-discrete system on ``grid``)."""

    bc: str
    n: int
    k: int
    diffusion: float
    grid: pde.Grid

    @property
    def x(self) -> np.ndarray:
        return self.grid.coordinates()[0]

    def mode(self) -> np.ndarray:
        kx = self.k * np.pi * self.x
        return np.sin(kx) if self.bc == "dirichlet" else np.cos(kx)

    def exact(self, t: float) -> np.ndarray:
        """The PDE's solution at the grid points."""
        return np.exp(-(self.k * np.pi) ** 2 * self.diffusion * t) * self.mode()

    def semi_discrete(self, t: float) -> np.ndarray:
        """The solution of the ODE system (no time error)."""
        h = self.grid.spacing[0]
        rate = 4 / h**2 * np.sin(self.k * np.pi * h / 2) ** 2 * self.diffusion
        return np.exp(-rate * t) * self.mode()

    def f(self, t, y, args):
        (d,) = args
        return d * pde.laplacian(y, self.grid)


def heat_problem(bc: str, n: int, k: int = 2, diffusion: float = 0.1) -> HeatProblem:
    if bc not in ("dirichlet", "neumann"):
        raise ValueError(f"heat_problem: bc must be 'dirichlet' or 'neumann', got {bc!r}")
    return HeatProblem(bc, n, k, diffusion, pde.Grid.uniform((n,), lengths=1.0, bc=bc))


# --------------------------------------------------------------------------------------
# references


def scipy_solve(prob: PDEProblem, method: str, rtol: float, atol: float, **options):
    """scipy ``solve_ivp`` to ``t1`` with ``jac_sparsity``, in two pieces at the problem's
    switch (if any, with the forcing fixed on each side) when ``split``; returns
    ``(y1, info)``."""
    split = options.pop("split", False)
    pieces = ([(0.0, prob.switch, False), (prob.switch, prob.t1, True)]
              if split and prob.switch is not None else [(0.0, prob.t1, None)])
    y, info = prob.y0, dict(steps=0, nfev=0, njev=0, nlu=0)
    for t0, t1, forcing in pieces:
        def rhs(t, y, forcing=forcing):
            return (prob.f_np(t, y, prob.args) if forcing is None
                    else prob.f_np(t, y, prob.args, forcing=forcing))
        sol = solve_ivp(rhs, (t0, t1), y, method=method, rtol=rtol, atol=atol,
                        jac_sparsity=prob.sparsity, **options)
        if not sol.success:
            raise RuntimeError(f"scipy {method} failed on {prob.key}: {sol.message}")
        y = sol.y[:, -1]
        info["steps"] += sol.t.size - 1
        for k in ("nfev", "njev", "nlu"):
            info[k] += int(getattr(sol, k))
    return y, info


def fft_preconditioner(prob: PDEProblem):
    """CVODE's preconditioner solve ``z = (I - gamma alpha lap)^-1 r`` for the 2-D
    Brusselator, exact for the diffusion part: the periodic 5-point Laplacian is diagonal
    in the discrete Fourier basis, with eigenvalues ``-(4/h^2) (sin^2(pi k1/n) +
    sin^2(pi k2/n))`` (LeVeque 2007, (3.13) with periodic modes)."""
    if prob.name != "bruss2d":
        raise ValueError("fft_preconditioner: for bruss2d only (periodic, constant diffusion)")
    n, (_, _, alpha) = prob.n, prob.args
    h = 1.0 / (n - 1)
    k = np.arange(n)
    lam = -(4 / h**2) * (np.sin(np.pi * k / n)[:, None] ** 2
                         + np.sin(np.pi * k[: n // 2 + 1] / n)[None, :] ** 2)

    def psolve(t, y, yp, r, z, gamma, delta, lr):
        spec = np.fft.rfft2(r.reshape(n, n, 2), axes=(0, 1))
        spec /= (1.0 - gamma * alpha * lam)[:, :, None]
        z[:] = np.fft.irfft2(spec, s=(n, n), axes=(0, 1)).reshape(-1)

    return psolve


def cvode_fft_solve(prob: PDEProblem, rtol: float, atol: float):
    """CVODE (BDF) with GMRES preconditioned by :func:`fft_preconditioner`, in two pieces
    at the switch. The 2-D Brusselator only. Needs scikit-sundae."""
    import sksundae

    psolve = fft_preconditioner(prob)

    def rhs_with(forcing):  # scikit-sundae reads the arity: exactly (t, y, yp)
        def rhs(t, y, yp):
            yp[:] = prob.f_np(t, y, prob.args, forcing=forcing)
        return rhs

    y, info = prob.y0, dict(steps=0, nfev=0, njev=0)
    pieces = ([(0.0, prob.switch, False), (prob.switch, prob.t1, True)]
              if prob.t1 > prob.switch else [(0.0, prob.t1, False)])
    for t0, t1, forcing in pieces:
        solver = sksundae.cvode.CVODE(
            rhs_with(forcing), rtol=rtol, atol=atol, linsolver="gmres", krylov_dim=20,
            precond=sksundae.cvode.CVODEPrecond(None, psolve, side="left"),
            max_num_steps=10**7)
        sol = solver.solve(np.array([t0, 0.5 * (t0 + t1), t1]), y)
        if not sol.success:
            raise RuntimeError(f"CVODE failed on {prob.key}: {sol.message}")
        y = sol.y[-1]
        info["nfev"] += int(sol.nfev)
    return y, info


def compute_reference(prob: PDEProblem) -> tuple[np.ndarray, str]:
    """``(y1, how)``: scipy Radau at 1e-10 (1-D), CVODE-FFT at 1e-12 in two pieces (2-D)."""
    if prob.name == "bruss1d":
        y, info = scipy_solve(prob, "Radau", REF_RTOL, REF_RTOL)
        return y, f"scipy Radau, rtol = atol = {REF_RTOL:g}, jac_sparsity ({info['steps']} steps)"
    y, info = cvode_fft_solve(prob, CVODE_REF_RTOL, CVODE_REF_RTOL)
    split = f", split at t = {SWITCH}" if prob.t1 > SWITCH else ""
    return y, (f"CVODE BDF + GMRES with the FFT diffusion preconditioner, rtol = atol = "
               f"{CVODE_REF_RTOL:g}{split}")


def _load_file(path: Path) -> dict:
    if not path.exists():
        return {}
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def _load() -> dict:
    """The cached references: the local cache's, then the tracked file's (which win)."""
    return {**_load_file(LOCAL_CACHE), **_load_file(CACHE)}


def reference(prob: PDEProblem, compute: bool = True) -> np.ndarray | None:
    """The cached reference at ``t1`` (computed and cached when missing and ``compute``)."""
    cached = _load()
    if prob.key in cached:
        y = cached[prob.key]
        if y.shape != prob.y0.shape:
            raise ValueError(f"{CACHE.name}: {prob.key} has shape {y.shape}, expected "
                             f"{prob.y0.shape}; rerun python -m validation.pde_reference --force")
        return y
    if not compute:
        return None
    y, how = compute_reference(prob)
    target = WRITE_TO or LOCAL_CACHE
    stored = _load_file(target)
    stored[prob.key] = y
    stored[prob.key + "__how"] = np.array(how)
    target.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(target, **stored)
    return y


def reference_note(prob: PDEProblem) -> str:
    return str(_load().get(prob.key + "__how", "not computed"))


def cross_check(n: int = 32) -> dict:
    """The 2-D reference (CVODE-FFT at 1e-12) against scipy ``Radau`` with ``jac_sparsity``
    at 1e-10 and against CVODE-FFT at 1e-11, on the same grid: the max relative difference
    ``|a - b| / (|b| + 1)`` of each."""
    prob = bruss2d_problem(n)
    cached = reference(prob)
    radau, _ = scipy_solve(prob, "Radau", REF_RTOL, REF_RTOL, split=True)
    loose, _ = cvode_fft_solve(prob, 1e-11, 1e-11)
    return {f"scipy Radau {REF_RTOL:g}": float(np.max(np.abs(radau - cached)
                                                      / (np.abs(cached) + 1))),
            "CVODE-FFT 1e-11": float(np.max(np.abs(loose - cached) / (np.abs(cached) + 1)))}


DEFAULT_SIZES = {"bruss1d": (500, 5000), "bruss2d": (32, 128, 256)}


def main(argv=None) -> int:
    global CACHE, WRITE_TO
    parser = argparse.ArgumentParser(description="Compute the cached PDE references.")
    parser.add_argument("--force", action="store_true", help="recompute cached ones too")
    parser.add_argument("--only", default=None,
                        help="comma-separated keys, e.g. bruss1d_500,bruss2d_32")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"cache file to write (default {CACHE.name}; compute elsewhere, "
                        "then --merge it)")
    parser.add_argument("--merge", type=Path, nargs="*", default=(),
                        help="add the entries of these cache files to the cache, then stop")
    opts = parser.parse_args(argv)
    if opts.out is not None:
        CACHE = opts.out
    WRITE_TO = CACHE  # this command, and only it, writes the (tracked) cache file
    if opts.merge:
        cached = _load()
        for path in opts.merge:
            with np.load(path) as data:
                cached.update({k: data[k] for k in data.files})
        np.savez_compressed(CACHE, **cached)
        print(f"{CACHE}: {sorted(k for k in cached if '__' not in k)}")
        return 0
    jax.config.update("jax_enable_x64", True)
    keys = [f"{name}_{n}" for name, ns in DEFAULT_SIZES.items() for n in ns]
    if opts.only:
        keys = [k.strip() for k in opts.only.split(",")]
    cached = _load()
    for key in keys:
        name, n = key.rsplit("_", 1)
        prob = problem(name, int(n))
        if key in cached and not opts.force:
            print(f"{key}: cached ({reference_note(prob)})")
            continue
        if opts.force:
            cached.pop(key, None)
            np.savez_compressed(CACHE, **cached)
        start = time.perf_counter()
        reference(prob)
        print(f"{key}: {reference_note(prob)}, {time.perf_counter() - start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["PDEProblem", "bruss1d_np", "bruss2d_jac_np", "bruss2d_np", "bruss1d_problem",
           "bruss2d_problem", "heat_problem", "problem", "reference", "scipy_solve",
           "cvode_fft_solve", "cross_check", "fft_preconditioner"]
