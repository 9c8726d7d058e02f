"""The Bari index-1 DAEs solved with SUNDIALS IDA (scikit-sundae), for checks and timings.

IDA (A. C. Hindmarsh et al., "SUNDIALS: Suite of nonlinear and differential/algebraic
equation solvers", ACM TOMS 31, 2005, 363-396) integrates the residual form
``F(t, y, y') = M y' - f(t, y) = 0`` with variable-order BDF; here with its dense direct
linear solver and its own finite-difference Jacobian. The residuals below are numpy
transcriptions of the test set's Fortran (``chemakzo.f``, ``transamp.f``), written apart
from simlib's ``jax.numpy`` versions so that a slip in one shows as a disagreement.

scikit-sundae is a peer of the benchmarks only (``benchmarks/install_peers.sh``), never a
dependency of simlib: :func:`available` says whether it is installed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from simlib.systems import (
    AKZO_NOBEL,
    TRANSISTOR_AMPLIFIER,
    DAEProblem,
)


def available() -> bool:
    """Whether scikit-sundae (IDA) can be imported."""
    try:
        import sksundae.ida  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------------------
# numpy residuals (chemakzo.f, transamp.f)


def akzo_nobel_np(y: np.ndarray, p) -> np.ndarray:
    """``f(y)`` of the chemical Akzo Nobel problem (``chemakzo.f``'s ``feval``)."""
    k1, k2, k3, k4, kbig, kla, ks, po2, hen = p
    s2 = np.sqrt(y[1])
    r1 = k1 * y[0] ** 4 * s2
    r2 = k2 * y[2] * y[3]
    r3 = k2 / kbig * y[0] * y[4]
    r4 = k3 * y[0] * y[3] ** 2
    r5 = k4 * y[5] ** 2 * s2
    fin = kla * (po2 / hen - y[1])
    return np.array([-2 * r1 + r2 - r3 - r4, -0.5 * r1 - r4 - 0.5 * r5 + fin, r1 - r2 + r3,
                     -r2 + r3 - 2 * r4, r2 - r3 + r5, ks * y[0] * y[3] - y[5]])


def akzo_nobel_yp0(y0: np.ndarray, p) -> np.ndarray:
    """Consistent ``y'(0)``: ``f`` for the five differential rows, and ``y6' =
    Ks (y1' y4 + y1 y4')`` from differentiating the algebraic equation."""
    yp = akzo_nobel_np(y0, p)
    yp[5] = p[6] * (yp[0] * y0[3] + y0[0] * yp[3])
    return yp


def transistor_amplifier_np(t: float, y: np.ndarray, p) -> np.ndarray:
    """``f(t, y)`` of the transistor amplifier (``transamp.f``'s ``feval``)."""
    ub, uf, alpha, beta = p[0], p[1], p[2], p[3]
    r = p[4:14]
    uet = 0.1 * np.sin(200 * np.pi * t)
    g1 = beta * (np.exp((y[1] - y[2]) / uf) - 1)
    g2 = beta * (np.exp((y[4] - y[5]) / uf) - 1)
    return np.array([(y[0] - uet) / r[0],
                     y[1] / r[1] + (y[1] - ub) / r[2] + (1 - alpha) * g1,
                     y[2] / r[3] - g1,
                     (y[3] - ub) / r[4] + alpha * g1,
                     y[4] / r[5] + (y[4] - ub) / r[6] + (1 - alpha) * g2,
                     y[5] / r[7] - g2,
                     (y[6] - ub) / r[8] + alpha * g2,
                     y[7] / r[9]])


def transistor_amplifier_mass_np(p) -> np.ndarray:
    """The transistor amplifier's ``M`` (``transamp.f``'s ``meval``), dense."""
    c1, c2, c3, c4, c5 = p[14:19]
    m = np.zeros((8, 8))
    for (i, j), c in zip(((0, 1), (3, 4), (6, 7)), (c1, c3, c5), strict=True):
        m[i, i] = m[j, j] = -c
        m[i, j] = m[j, i] = c
    m[2, 2], m[5, 5] = -c2, -c4
    return m


def transistor_amplifier_yp0(p) -> np.ndarray:
    """``y'(0)`` of ``transamp.f``'s ``init`` (defaults only: six decimals there are
    "determined numerically")."""
    if tuple(p) != TRANSISTOR_AMPLIFIER.args:
        raise ValueError("transistor_amplifier_yp0: transamp.f gives y'(0) for the default "
                         "parameters only")
    r3, r7, c2, c4, ub = p[7], p[11], p[15], p[17], p[0]
    u2 = ub / 2
    return np.array([51.338775, 51.338775, -u2 / (c2 * r3), -24.9757667, -24.9757667,
                     -u2 / (c4 * r7), -10.00564453, -10.00564453])


# --------------------------------------------------------------------------------------
# IDA runs


@dataclass
class IDARun:
    """One IDA solve: the state at ``t1``, wall seconds, steps and residual evaluations."""

    y1: np.ndarray
    seconds: float
    steps: int
    nfev: int


def _residual(problem: DAEProblem, p):
    if problem.name == "akzo_nobel":
        def res(t, y, yp, out):  # M = diag(1, 1, 1, 1, 1, 0)
            f = akzo_nobel_np(y, p)
            out[:5] = yp[:5] - f[:5]
            out[5] = -f[5]
        return res
    m = transistor_amplifier_mass_np(p)

    def res(t, y, yp, out):
        out[:] = m @ yp - transistor_amplifier_np(t, y, p)
    return res


def ida_solve(problem: DAEProblem, rtol: float, atol: float, args=None,
              y0: np.ndarray | None = None) -> IDARun:
    """Solve ``problem`` to ``t1`` with IDA (dense linear solver, finite-difference
    Jacobian, numpy residual); ``args`` defaults to the problem's, ``y0`` to its
    consistent initial values. Raises ``RuntimeError`` when IDA fails."""
    from sksundae.ida import IDA

    p = tuple(problem.args if args is None else args)
    if problem.name == "akzo_nobel":
        y0 = (np.array([0.444, 0.00123, 0.0, 0.007, 0.0, p[6] * 0.444 * 0.007])
              if y0 is None else np.asarray(y0, float))
        yp0 = akzo_nobel_yp0(y0, p)
    elif problem.name == "transistor_amplifier":
        y0 = np.array(problem.y0) if y0 is None else np.asarray(y0, float)
        yp0 = transistor_amplifier_yp0(p)
    else:
        raise ValueError(f"ida_solve: no IDA residual for problem {problem.name!r}")
    solver = IDA(_residual(problem, p), rtol=rtol, atol=atol, linsolver="dense",
                 max_num_steps=500_000)
    start = time.perf_counter()
    sol = solver.solve(np.array([problem.t0, problem.t1]), y0, yp0)
    seconds = time.perf_counter() - start
    if not sol.success:
        raise RuntimeError(f"IDA failed on {problem.name}: {sol.message}")
    return IDARun(np.array(sol.y[-1]), seconds, len(sol.t) - 1, int(sol.nfev))


PROBLEMS = {p.name: p for p in (AKZO_NOBEL, TRANSISTOR_AMPLIFIER)}
