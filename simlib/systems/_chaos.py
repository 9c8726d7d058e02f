"""Dissipative oscillators and chaotic flows: Lorenz system, Van der Pol oscillator.

All vector fields have the signature ``f(t, y, args)``, are written in
``jax.numpy`` and keep the floating-point precision of their inputs.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._types import Args, Array, ArrayLike

LORENZ_DEFAULT_ARGS: tuple[float, float, float] = (10.0, 28.0, 8.0 / 3.0)
"""Default ``(sigma, rho, beta)`` of :func:`lorenz` (the classic chaotic regime)."""

VAN_DER_POL_DEFAULT_ARGS: tuple[float] = (1.0,)
"""Default ``(mu,)`` of :func:`van_der_pol`."""


def lorenz(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""Lorenz system.

    .. math::

        \dot x = \sigma (y - x), \qquad
        \dot y = x (\rho - z) - y, \qquad
        \dot z = x y - \beta z .

    With the defaults the flow is chaotic (the Lorenz attractor).

    Args:
        t: Time (dimensionless; unused, the system is autonomous).
        y: State ``[x, y, z]`` (dimensionless convection amplitudes). Leading
            batch axes are allowed; the state is the last axis.
        args: ``(sigma, rho, beta)``: Prandtl number ``sigma``, reduced
            Rayleigh number ``rho`` and geometric factor ``beta`` (all
            dimensionless). ``None`` selects the defaults ``(10, 28, 8/3)``.

    Returns:
        ``dy/dt`` with the shape of ``y``.

    References:
        E. N. Lorenz, "Deterministic nonperiodic flow", *J. Atmos. Sci.* 20
        (1963) 130-141.
    """
    del t
    sigma, rho, beta = LORENZ_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    x1 = y[..., 0]
    x2 = y[..., 1]
    x3 = y[..., 2]
    return jnp.stack(
        [sigma * (x2 - x1), x1 * (rho - x3) - x2, x1 * x2 - beta * x3],
        axis=-1,
    )


def van_der_pol(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""Van der Pol oscillator.

    .. math::

        \ddot x = \mu (1 - x^2) \dot x - x,

    written as ``x' = v``, ``v' = mu (1 - x^2) v - x``. Every trajectory except
    the origin approaches a limit cycle; the problem becomes stiff (relaxation
    oscillations with period :math:`\approx (3 - 2\ln 2)\mu`) for large ``mu``.

    Args:
        t: Time (dimensionless; unused, the system is autonomous).
        y: State ``[x, v]``. Leading batch axes are allowed; the state is the
            last axis.
        args: ``(mu,)``: nonlinear damping strength (dimensionless, ``mu >= 0``).
            ``None`` selects the default ``(1.0,)``.

    Returns:
        ``dy/dt`` with the shape of ``y``.

    References:
        B. van der Pol, "On relaxation-oscillations", *Phil. Mag.* 2 (1926)
        978-992. E. Hairer and G. Wanner, *Solving Ordinary Differential
        Equations II*, 2nd ed., Springer, 1996, Section IV.1.
    """
    del t
    (mu,) = VAN_DER_POL_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    x = y[..., 0]
    v = y[..., 1]
    return jnp.stack([v, mu * (1 - x**2) * v - x], axis=-1)


__all__ = ["LORENZ_DEFAULT_ARGS", "VAN_DER_POL_DEFAULT_ARGS", "lorenz", "van_der_pol"]
