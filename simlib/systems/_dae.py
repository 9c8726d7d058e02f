"""Index-1 differential-algebraic test problems of the Bari test set, ``M y' = f(t, y, args)``.

Both problems are written as the test set's Fortran writes them (``chemakzo.f`` and
``transamp.f``): same equations, parameters, consistent initial values and the published
reference solution at ``t1``.

Reference: F. Mazzia and C. Magherini, *Test Set for Initial Value Problem Solvers*,
release 2.4, Department of Mathematics, University of Bari, 2008
(https://archimede.uniba.it/~testset/). The reference solutions were computed there with
PSIDE at tolerance ``1e-19`` (Akzo Nobel) and ``1e-14`` (transistor amplifier).

All vector fields have the signature ``f(t, y, args)``, are written in ``jax.numpy`` and
keep the floating-point precision of their inputs; ``args=None`` selects the defaults.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from ._types import Array, ArrayLike

# --------------------------------------------------------------------------------------
# Chemical Akzo Nobel problem (CHEMAKZO)

AKZO_NOBEL_DEFAULT_ARGS: tuple[float, ...] = (
    18.7, 0.58, 0.09, 0.42, 34.4, 3.3, 115.83, 0.9, 737.0)
"""Default ``(k1, k2, k3, k4, K, klA, Ks, pCO2, H)`` of :func:`akzo_nobel` (``chemakzo.f``)."""

AKZO_NOBEL_T1 = 180.0
"""End of the Akzo Nobel interval ``[0, 180]`` (minutes)."""

AKZO_NOBEL_REFERENCE: np.ndarray = np.array([
    0.1150794920661702,
    0.1203831471567715e-2,
    0.1611562887407974,
    0.3656156421249283e-3,
    0.1708010885264404e-1,
    0.4873531310307455e-2,
])
"""Published solution of :func:`akzo_nobel` at ``t = 180`` (``chemakzo.f``, PSIDE, tol 1e-19)."""
AKZO_NOBEL_REFERENCE.setflags(write=False)


def akzo_nobel(t: ArrayLike, y: ArrayLike, args: Any = None) -> Array:
    r"""Chemical Akzo Nobel problem, ``M y' = f(y)`` with ``M = diag(1, 1, 1, 1, 1, 0)``.

    .. math::

        r_1 = k_1 y_1^4 \sqrt{y_2},\ r_2 = k_2 y_3 y_4,\ r_3 = \tfrac{k_2}{K} y_1 y_5,\
        r_4 = k_3 y_1 y_4^2,\ r_5 = k_4 y_6^2 \sqrt{y_2},\
        F_{in} = k_{lA} (p_{CO_2} / H - y_2),

        f = (-2 r_1 + r_2 - r_3 - r_4,\ -\tfrac12 r_1 - r_4 - \tfrac12 r_5 + F_{in},\
             r_1 - r_2 + r_3,\ -r_2 + r_3 - 2 r_4,\ r_2 - r_3 + r_5,\ K_s y_1 y_4 - y_6).

    The last equation is algebraic (``y6`` is the concentration of an ion pair in fast
    equilibrium); index 1. ``y2`` must stay non-negative (``sqrt``): the Fortran returns an
    error flag there; here the result is NaN, which an adaptive solver rejects.

    Args:
        t: Time (unused; autonomous).
        y: The six concentrations (the last axis; leading batch axes allowed).
        args: ``(k1, k2, k3, k4, K, klA, Ks, pCO2, H)``; ``None`` for
            :data:`AKZO_NOBEL_DEFAULT_ARGS`.

    Returns:
        ``f(y)`` with the shape of ``y``.

    References:
        Mazzia and Magherini, *Test Set for IVP Solvers*, release 2.4, "Chemical Akzo
        Nobel problem" (``chemakzo.f``).
    """
    del t
    k1, k2, k3, k4, kbig, kla, ks, po2, hen = AKZO_NOBEL_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    y1, y2, y3, y4, y5, y6 = (y[..., i] for i in range(6))
    sqrt_y2 = jnp.sqrt(y2)
    r1 = k1 * y1**4 * sqrt_y2
    r2 = k2 * y3 * y4
    r3 = k2 / kbig * y1 * y5
    r4 = k3 * y1 * y4**2
    r5 = k4 * y6**2 * sqrt_y2
    fin = kla * (po2 / hen - y2)
    return jnp.stack([
        -2.0 * r1 + r2 - r3 - r4,
        -0.5 * r1 - r4 - 0.5 * r5 + fin,
        r1 - r2 + r3,
        -r2 + r3 - 2.0 * r4,
        r2 - r3 + r5,
        ks * y1 * y4 - y6,
    ], axis=-1)


def akzo_nobel_mass_matrix() -> np.ndarray:
    """The Akzo Nobel mass matrix ``diag(1, 1, 1, 1, 1, 0)`` (float64 numpy, dense)."""
    return np.diag([1.0, 1.0, 1.0, 1.0, 1.0, 0.0])


def akzo_nobel_initial(args: Any = None) -> np.ndarray:
    """Consistent initial values ``(0.444, 0.00123, 0, 0.007, 0, Ks 0.444 0.007)`` (float64)."""
    ks = (AKZO_NOBEL_DEFAULT_ARGS if args is None else args)[6]
    return np.array([0.444, 0.00123, 0.0, 0.007, 0.0, float(ks) * 0.444 * 0.007])


# --------------------------------------------------------------------------------------
# Transistor amplifier (TRANSAMP)

TRANSISTOR_AMPLIFIER_DEFAULT_ARGS: tuple[float, ...] = (
    6.0, 0.026, 0.99, 1e-6,                       # ub, uf, alpha, beta
    1000.0, 9000.0, 9000.0, 9000.0, 9000.0,       # r0, r1, r2, r3, r4
    9000.0, 9000.0, 9000.0, 9000.0, 9000.0,       # r5, r6, r7, r8, r9
    1e-6, 2e-6, 3e-6, 4e-6, 5e-6,                 # c1, c2, c3, c4, c5
)
"""Default ``(ub, uf, alpha, beta, r0, ..., r9, c1, ..., c5)`` of
:func:`transistor_amplifier` (``transamp.f``): volts, ohms, farads."""

TRANSISTOR_AMPLIFIER_T1 = 0.2
"""End of the transistor amplifier interval ``[0, 0.2]`` (seconds)."""

TRANSISTOR_AMPLIFIER_REFERENCE: np.ndarray = np.array([
    -0.5562145012262709e-2,
    0.3006522471903042e1,
    0.2849958788608128e1,
    0.2926422536206241e1,
    0.2704617865010554e1,
    0.2761837778393145e1,
    0.4770927631616772e1,
    0.1236995868091548e1,
])
"""Published solution of :func:`transistor_amplifier` at ``t = 0.2`` (``transamp.f``,
PSIDE, tol 1e-14)."""
TRANSISTOR_AMPLIFIER_REFERENCE.setflags(write=False)


def transistor_amplifier(t: ArrayLike, y: ArrayLike, args: Any = None) -> Array:
    r"""Right-hand side of the transistor amplifier, ``M y' = f(t, y)``.

    Node voltages ``U1..U8`` of a two-stage amplifier; with
    ``g(u) = beta (exp(u / uf) - 1)`` and input ``Ue(t) = 0.1 sin(200 pi t)``,

    .. math::

        f = \bigl((U_1 - U_e)/R_0,\ U_2/R_1 + (U_2 - U_b)/R_2 + (1-\alpha) g(U_2 - U_3),\
        U_3/R_3 - g(U_2 - U_3),\ (U_4 - U_b)/R_4 + \alpha g(U_2 - U_3),

        U_5/R_5 + (U_5 - U_b)/R_6 + (1-\alpha) g(U_5 - U_6),\ U_6/R_7 - g(U_5 - U_6),\
        (U_7 - U_b)/R_8 + \alpha g(U_5 - U_6),\ U_8/R_9\bigr),

    and the singular (rank 5) mass matrix of :func:`transistor_amplifier_mass_matrix`.
    Index 1.

    Args:
        t: Time.
        y: The eight node voltages (last axis; leading batch axes allowed).
        args: ``(ub, uf, alpha, beta, r0, ..., r9, c1, ..., c5)`` (19 values; the
            capacitances are used by the mass matrix only); ``None`` for
            :data:`TRANSISTOR_AMPLIFIER_DEFAULT_ARGS`.

    Returns:
        ``f(t, y)`` with the shape of ``y``.

    References:
        Mazzia and Magherini, *Test Set for IVP Solvers*, release 2.4, "Transistor
        amplifier" (``transamp.f``); E. Hairer, Ch. Lubich and M. Roche, *The Numerical
        Solution of Differential-Algebraic Systems by Runge-Kutta Methods*, Springer LNM
        1409, 1989.
    """
    p = TRANSISTOR_AMPLIFIER_DEFAULT_ARGS if args is None else args
    ub, uf, alpha, beta = p[0], p[1], p[2], p[3]
    r0, r1, r2, r3, r4, r5, r6, r7, r8, r9 = p[4:14]
    y = jnp.asarray(y)
    u = [y[..., i] for i in range(8)]
    uet = 0.1 * jnp.sin(200.0 * jnp.pi * jnp.asarray(t, dtype=y.dtype))
    fac1 = beta * (jnp.exp((u[1] - u[2]) / uf) - 1.0)
    fac2 = beta * (jnp.exp((u[4] - u[5]) / uf) - 1.0)
    return jnp.stack([
        (u[0] - uet) / r0,
        u[1] / r1 + (u[1] - ub) / r2 + (1.0 - alpha) * fac1,
        u[2] / r3 - fac1,
        (u[3] - ub) / r4 + alpha * fac1,
        u[4] / r5 + (u[4] - ub) / r6 + (1.0 - alpha) * fac2,
        u[5] / r7 - fac2,
        (u[6] - ub) / r8 + alpha * fac2,
        u[7] / r9,
    ], axis=-1)


def transistor_amplifier_mass_matrix(args: Any = None) -> Array:
    r"""The transistor amplifier's constant mass matrix (dense ``8 x 8``, rank 5).

    .. math::

        M = \begin{pmatrix} -C_1 & C_1 \\ C_1 & -C_1 \end{pmatrix} \oplus (-C_2) \oplus
            \begin{pmatrix} -C_3 & C_3 \\ C_3 & -C_3 \end{pmatrix} \oplus (-C_4) \oplus
            \begin{pmatrix} -C_5 & C_5 \\ C_5 & -C_5 \end{pmatrix}

    A ``jax.numpy`` array built from the capacitances in ``args`` (so it can be
    differentiated with respect to them); float64 numpy values give a float64 matrix.
    """
    p = TRANSISTOR_AMPLIFIER_DEFAULT_ARGS if args is None else args
    c1, c2, c3, c4, c5 = (jnp.asarray(c) for c in p[14:19])
    z = jnp.zeros_like(c1 * 1.0)
    rows = [
        [-c1, c1, z, z, z, z, z, z],
        [c1, -c1, z, z, z, z, z, z],
        [z, z, -c2, z, z, z, z, z],
        [z, z, z, -c3, c3, z, z, z],
        [z, z, z, c3, -c3, z, z, z],
        [z, z, z, z, z, -c4, z, z],
        [z, z, z, z, z, z, -c5, c5],
        [z, z, z, z, z, z, c5, -c5],
    ]
    return jnp.stack([jnp.stack(r, axis=-1) for r in rows], axis=-2)


def transistor_amplifier_initial(args: Any = None) -> np.ndarray:
    """Consistent initial values (``transamp.f``): ``(0, ub r1/(r1+r2), same, ub, ub r5/(r5+r6),
    same, ub, 0)`` = ``(0, 3, 3, 6, 3, 3, 6, 0)`` for the defaults (float64)."""
    p = TRANSISTOR_AMPLIFIER_DEFAULT_ARGS if args is None else args
    ub, r1, r2, r5, r6 = (float(p[i]) for i in (0, 5, 6, 9, 10))
    u2 = ub / (r2 / r1 + 1.0)
    u5 = ub / (r6 / r5 + 1.0)
    return np.array([0.0, u2, u2, ub, u5, u5, ub, 0.0])


def transistor_amplifier_initial_derivative(args: Any = None) -> np.ndarray:
    """``y'(0)`` as ``transamp.f`` gives it (for residual-form solvers such as IDA):
    ``y3' = -y2 / (c2 r3)``, ``y6' = -y5 / (c4 r7)`` exactly, the other six values as
    the Fortran's numerically determined decimals (defaults only)."""
    p = TRANSISTOR_AMPLIFIER_DEFAULT_ARGS if args is None else args
    y = transistor_amplifier_initial(p)
    r3, r7, c2, c4 = (float(p[i]) for i in (7, 11, 15, 17))
    return np.array([51.338775, 51.338775, -y[1] / (c2 * r3), -24.9757667, -24.9757667,
                     -y[4] / (c4 * r7), -10.00564453, -10.00564453])


# --------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True, eq=False)
class DAEProblem:
    """An index-1 DAE ``M y' = f(t, y, args)``, ``y(t0) = y0`` (consistent) on ``[t0, t1]``.

    Attributes:
        name: Short identifier (the vector field's name).
        vector_field: ``f(t, y, args)``.
        mass_matrix: ``mass_matrix(args)``: the constant (singular) ``M`` as an array.
        y0: Consistent initial values (read-only float64 numpy).
        t0, t1: The interval.
        args: Default parameters (tuple of floats).
        reference: The published solution at ``t1`` (read-only float64 numpy).
        description: One line.
    """

    name: str
    vector_field: Callable[..., Any]
    mass_matrix: Callable[..., Any]
    y0: np.ndarray
    t0: float
    t1: float
    args: tuple[float, ...]
    reference: np.ndarray
    description: str

    def __post_init__(self) -> None:
        for attr in ("y0", "reference"):
            a = np.array(getattr(self, attr), dtype=np.float64)
            a.setflags(write=False)
            object.__setattr__(self, attr, a)


def scd(y: ArrayLike, reference: ArrayLike) -> np.ndarray:
    """Significant correct digits per component, ``-log10(|y - ref| / |ref|)``, as the
    Bari test set's ``SCD`` routine defines them (its ``US2`` is the minimum over the
    components). ``inf`` where ``y`` equals the reference."""
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(reference, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return -np.log10(np.abs(y - ref) / np.abs(ref))


AKZO_NOBEL = DAEProblem(
    name="akzo_nobel",
    vector_field=akzo_nobel,
    mass_matrix=lambda args=None: jnp.asarray(akzo_nobel_mass_matrix()),
    y0=akzo_nobel_initial(),
    t0=0.0,
    t1=AKZO_NOBEL_T1,
    args=AKZO_NOBEL_DEFAULT_ARGS,
    reference=AKZO_NOBEL_REFERENCE,
    description="Chemical Akzo Nobel problem (Bari CHEMAKZO): 6 species, one algebraic, "
                "to t = 180.",
)

TRANSISTOR_AMPLIFIER = DAEProblem(
    name="transistor_amplifier",
    vector_field=transistor_amplifier,
    mass_matrix=transistor_amplifier_mass_matrix,
    y0=transistor_amplifier_initial(),
    t0=0.0,
    t1=TRANSISTOR_AMPLIFIER_T1,
    args=TRANSISTOR_AMPLIFIER_DEFAULT_ARGS,
    reference=TRANSISTOR_AMPLIFIER_REFERENCE,
    description="Transistor amplifier (Bari TRANSAMP): 8 node voltages, M of rank 5, "
                "to t = 0.2.",
)

DAE_PROBLEMS: tuple[DAEProblem, ...] = (AKZO_NOBEL, TRANSISTOR_AMPLIFIER)
"""The Bari index-1 problems: :data:`AKZO_NOBEL`, :data:`TRANSISTOR_AMPLIFIER`."""
