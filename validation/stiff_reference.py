"""Stiff test problems and their reference values at ``t1``.

Published reference solutions: F. Mazzia and C. Magherini, *Test Set for Initial Value
Problem Solvers*, release 2.4, University of Bari, 2008 (the "Bari test set",
https://archimede.uniba.it/~testset/). Each problem's Fortran file gives the solution at
the end of the interval in its ``solut`` routine, "computed using double precision RADAU
on an Alphaserver DS20E ... uround = 1.01d-19", i.e. with more digits than float64 keeps.
The values below are copied from the problem files ``rober.f``, ``vdpol.f`` and
``orego.f`` (revisions of 2006).

* ``robertson``: Robertson's chemical kinetics (Hairer and Wanner, *Solving ODEs II*,
  IV.1 (1.4); Bari ``rober``), ``k = (0.04, 3e7, 1e4)``, ``y0 = (1, 0, 0)``, to
  ``t1 = 1e11``. Same formulation as Bari's.
* ``van_der_pol``: Van der Pol with ``mu = 1000`` in simlib's (unscaled) form
  ``y0' = y1, y1' = mu (1 - y0^2) y1 - y0``, ``y0 = (2, 0)``, to ``t1 = 2000``. Bari's
  ``vdpol`` is the time-scaled form ``z0' = z1, eps z1' = (1 - z0^2) z1 - z0`` with
  ``eps = 1e-6`` on ``[0, 2]``. The substitution ``tau = mu t``, ``z0(t) = y0(mu t)``,
  ``z1(t) = mu y1(mu t)`` with ``eps = 1 / mu^2`` turns one into the other exactly, so
  ``y0(2000) = z0(2)`` and ``y1(2000) = z1(2) / 1000``: the converted values below.
  (The division by 1000 is exact up to one rounding.)
* ``oregonator``: the Oregonator of Field and Noyes (Hairer and Wanner, *Solving ODEs II*,
  IV.1 (1.3); Bari ``orego``), ``y0 = (1, 2, 3)``, to ``t1 = 360``. Same formulation.

:func:`scipy_reference` recomputes each value independently with scipy ``Radau`` at
``rtol = 1e-13`` (exact Jacobian), and the validation report prints the agreement.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

ROBERTSON_K = (0.04, 3e7, 1e4)  # k1, k2, k3 (Hairer and Wanner II, IV.1 (1.4))
VDP_MU = 1000.0
OREGO = (77.27, 8.375e-6, 0.161)  # s, q, w (Hairer and Wanner II, IV.1 (1.3))


def robertson(t, y, k):
    """``y0' = -k1 y0 + k3 y1 y2``, ``y1' = k1 y0 - k2 y1^2 - k3 y1 y2``, ``y2' = k2 y1^2``."""
    k1, k2, k3 = k
    return jnp.stack([-k1 * y[0] + k3 * y[1] * y[2],
                      k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
                      k2 * y[1] ** 2])


def robertson_np(t, y, k):
    k1, k2, k3 = k
    return np.array([-k1 * y[0] + k3 * y[1] * y[2],
                     k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2], k2 * y[1] ** 2])


def robertson_jac_np(t, y, k):
    k1, k2, k3 = k
    return np.array([[-k1, k3 * y[2], k3 * y[1]],
                     [k1, -2 * k2 * y[1] - k3 * y[2], -k3 * y[1]],
                     [0.0, 2 * k2 * y[1], 0.0]])


def van_der_pol(t, y, mu):
    """``y0' = y1``, ``y1' = mu (1 - y0^2) y1 - y0``."""
    return jnp.stack([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def van_der_pol_np(t, y, mu):
    return np.array([y[1], mu * (1 - y[0] ** 2) * y[1] - y[0]])


def van_der_pol_jac_np(t, y, mu):
    return np.array([[0.0, 1.0], [-2 * mu * y[0] * y[1] - 1, mu * (1 - y[0] ** 2)]])


def oregonator(t, y, p):
    """``y0' = s (y1 + y0 (1 - q y0 - y1))``, ``y1' = (y2 - (1 + y0) y1) / s``,
    ``y2' = w (y0 - y2)``."""
    s, q, w = p
    return jnp.stack([s * (y[1] + y[0] * (1 - q * y[0] - y[1])),
                      (y[2] - (1 + y[0]) * y[1]) / s, w * (y[0] - y[2])])


def oregonator_np(t, y, p):
    s, q, w = p
    return np.array([s * (y[1] + y[0] * (1 - q * y[0] - y[1])),
                     (y[2] - (1 + y[0]) * y[1]) / s, w * (y[0] - y[2])])


def oregonator_jac_np(t, y, p):
    s, q, w = p
    return np.array([[s * (1 - 2 * q * y[0] - y[1]), s * (1 - y[0]), 0.0],
                     [-y[1] / s, -(1 + y[0]) / s, 1 / s],
                     [w, 0.0, -w]])


@dataclass(frozen=True)
class StiffProblem:
    """A stiff test problem: ``f`` (JAX), ``f_np``/``jac_np`` (NumPy, for scipy), the
    published value at ``t1`` and the ratio ``atol / rtol`` the suite uses for it."""

    name: str
    f: object
    f_np: object
    jac_np: object
    args: tuple | float
    y0: tuple
    t1: float
    published: tuple
    atol_per_rtol: float
    source: str


PROBLEMS = {
    "robertson": StiffProblem(
        "robertson", robertson, robertson_np, robertson_jac_np, ROBERTSON_K,
        (1.0, 0.0, 0.0), 1e11,
        (0.2083340149701255e-7, 0.8333360770334713e-13, 0.9999999791665050),
        # y1 falls to 8e-14 and y0 to 2e-8 by t = 1e11: both far below any rtol scale, so
        # atol decides their accuracy (tolerance units count them against atol)
        1e-6,
        "Bari test set 2.4, rober.f (solut), t = 1e11",
    ),
    "van_der_pol": StiffProblem(
        "van_der_pol", van_der_pol, van_der_pol_np, van_der_pol_jac_np, VDP_MU,
        (2.0, 0.0), 2000.0,
        (0.1706167732170483e1, -0.8928097010247975e0 / VDP_MU),
        1.0,
        "Bari test set 2.4, vdpol.f (solut, eps = 1e-6, t = 2), converted: "
        "y(2000) = z0(2), y'(2000) = z1(2) / 1000",
    ),
    "oregonator": StiffProblem(
        "oregonator", oregonator, oregonator_np, oregonator_jac_np, OREGO,
        (1.0, 2.0, 3.0), 360.0,
        (0.1000814870318523e1, 0.1228178521549917e4, 0.1320554942846706e3),
        1.0,
        "Bari test set 2.4, orego.f (solut), t = 360",
    ),
}


def published(name: str) -> np.ndarray:
    """The published reference state at ``t1`` (see the module docstring)."""
    return np.array(PROBLEMS[name].published, dtype=np.float64)


@functools.cache
def scipy_reference(name: str, method: str = "Radau", rtol: float = 1e-12):
    """``(y(t1), steps)`` from scipy ``solve_ivp`` with the exact Jacobian at ``rtol`` and
    ``atol = rtol * atol_per_rtol`` (the independent cross-check of the published values)."""
    from scipy.integrate import solve_ivp

    p = PROBLEMS[name]
    sol = solve_ivp(p.f_np, (0.0, p.t1), np.array(p.y0), method=method, rtol=rtol,
                    atol=rtol * p.atol_per_rtol, jac=p.jac_np, args=(p.args,))
    if not sol.success:
        raise RuntimeError(f"scipy {method} reference for {name} failed: {sol.message}")
    return sol.y[:, -1].copy(), sol.t.size - 1


def scipy_run(name: str, method: str, rtol: float):
    """``(y(t1), steps, nfev)`` of scipy ``solve_ivp`` at the suite's ``rtol``/``atol``."""
    from scipy.integrate import solve_ivp

    p = PROBLEMS[name]
    sol = solve_ivp(p.f_np, (0.0, p.t1), np.array(p.y0), method=method, rtol=rtol,
                    atol=rtol * p.atol_per_rtol, jac=p.jac_np, args=(p.args,))
    return (sol.y[:, -1].copy() if sol.success else np.full(len(p.y0), np.nan),
            sol.t.size - 1, sol.nfev)


def tol_units(y, ref, rtol: float, atol: float) -> float:
    """``max_i |y_i - ref_i| / (atol + rtol |ref_i|)`` (nan if ``y`` is not finite)."""
    y, ref = np.asarray(y, np.float64), np.asarray(ref, np.float64)
    if not np.all(np.isfinite(y)):
        return float("nan")
    return float(np.max(np.abs(y - ref) / (atol + rtol * np.abs(ref))))
