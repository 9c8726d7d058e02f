"""Population dynamics: the Lotka-Volterra predator-prey model.

All vector fields have the signature ``f(t, y, args)``, are written in
``jax.numpy`` and keep the floating-point precision of their inputs.
"""

from __future__ import annotations

import jax.numpy as jnp

from ._types import Args, Array, ArrayLike

LOTKA_VOLTERRA_DEFAULT_ARGS: tuple[float, float, float, float] = (1.5, 1.0, 3.0, 1.0)
"""Default ``(alpha, beta, gamma, delta)`` of :func:`lotka_volterra`."""


def lotka_volterra(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""Lotka-Volterra predator-prey model.

    .. math::

        \dot x = \alpha x - \beta x y, \qquad
        \dot y = -\gamma y + \delta x y .

    For positive initial populations the orbits are closed curves around the
    equilibrium :math:`(\gamma/\delta, \alpha/\beta)`; they are level sets of
    :func:`lotka_volterra_invariant`.

    Args:
        t: Time (unused; the system is autonomous).
        y: State ``[x, y]``: prey and predator populations (positive). Leading
            batch axes are allowed; the state is the last axis.
        args: ``(alpha, beta, gamma, delta)``: prey growth rate ``alpha``
            [1/time], predation rate ``beta`` [1/(population time)], predator
            death rate ``gamma`` [1/time] and predator growth per prey eaten
            ``delta`` [1/(population time)]. ``None`` selects the defaults
            ``(1.5, 1.0, 3.0, 1.0)``.

    Returns:
        ``dy/dt`` with the shape of ``y``.

    References:
        A. J. Lotka, *Elements of Physical Biology*, Williams & Wilkins, 1925.
        V. Volterra, "Fluctuations in the abundance of a species considered
        mathematically", *Nature* 118 (1926) 558-560.
    """
    del t
    alpha, beta, gamma, delta = LOTKA_VOLTERRA_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    prey = y[..., 0]
    pred = y[..., 1]
    return jnp.stack(
        [alpha * prey - beta * prey * pred, -gamma * pred + delta * prey * pred],
        axis=-1,
    )


def lotka_volterra_invariant(y: ArrayLike, args: Args = None) -> Array:
    r"""Conserved quantity of :func:`lotka_volterra`.

    .. math:: V(x, y) = \delta x - \gamma \ln x + \beta y - \alpha \ln y ,

    constant along every trajectory with ``x, y > 0`` (its time derivative
    along the flow vanishes identically); it is minimal at the equilibrium.

    Args:
        y: State ``[x, y]`` (positive); leading batch axes are allowed.
        args: ``(alpha, beta, gamma, delta)``, see :func:`lotka_volterra`;
            ``None`` selects the defaults ``(1.5, 1.0, 3.0, 1.0)``.

    Returns:
        ``V``, with the batch shape of ``y``.

    References:
        E. Hairer, C. Lubich and G. Wanner, *Geometric Numerical Integration*,
        2nd ed., Springer, 2006, Section I.1.1.
    """
    alpha, beta, gamma, delta = LOTKA_VOLTERRA_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    prey = y[..., 0]
    pred = y[..., 1]
    return delta * prey - gamma * jnp.log(prey) + beta * pred - alpha * jnp.log(pred)


__all__ = ["LOTKA_VOLTERRA_DEFAULT_ARGS", "lotka_volterra", "lotka_volterra_invariant"]
