"""Stochastic differential equations with closed forms: the Ornstein-Uhlenbeck process and
geometric Brownian motion, as drift/diffusion pairs for ``simlib.solve(..., diffusion=)``.

Drifts and diffusions have the signature ``f(t, x, args)``, act elementwise on any array
``x`` (diagonal noise: one Brownian motion per component) and keep its precision. The
closed forms are of the Itô equations (for these two the Itô and Stratonovich forms differ
only for geometric Brownian motion, whose Stratonovich solution is also given).
"""

from __future__ import annotations

import jax.numpy as jnp

from ._types import Args, Array, ArrayLike

ORNSTEIN_UHLENBECK_DEFAULT_ARGS: tuple[float, float, float] = (1.0, 0.0, 1.0)
"""Default ``(theta, mu, sigma)`` of the Ornstein-Uhlenbeck functions."""

GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS: tuple[float, float] = (0.05, 0.2)
"""Default ``(mu, sigma)`` of the geometric Brownian motion functions."""


def ornstein_uhlenbeck_drift(t: ArrayLike, x: ArrayLike, args: Args = None) -> Array:
    r"""Drift of the Ornstein-Uhlenbeck process
    :math:`dX = -\theta (X - \mu)\,dt + \sigma\,dW`: ``-theta (x - mu)``.

    Args:
        t: Time (unused).
        x: State, any shape.
        args: ``(theta, mu, sigma)``: relaxation rate, mean, noise amplitude; ``None``
            selects ``(1, 0, 1)``.

    References:
        G. E. Uhlenbeck and L. S. Ornstein, "On the theory of the Brownian motion",
        *Phys. Rev.* 36 (1930) 823-841.
    """
    del t
    theta, mu, _ = ORNSTEIN_UHLENBECK_DEFAULT_ARGS if args is None else args
    x = jnp.asarray(x)
    return -theta * (x - mu)


def ornstein_uhlenbeck_diffusion(t: ArrayLike, x: ArrayLike, args: Args = None) -> Array:
    """Diffusion of the Ornstein-Uhlenbeck process: ``sigma``, shaped like ``x``
    (additive noise: it does not read ``x``'s values, so :class:`~simlib.SRA1` accepts it).
    """
    del t
    _, _, sigma = ORNSTEIN_UHLENBECK_DEFAULT_ARGS if args is None else args
    return sigma * jnp.ones_like(jnp.asarray(x))


def ornstein_uhlenbeck_moments(x0: ArrayLike, t: ArrayLike,
                               args: Args = None) -> tuple[Array, Array]:
    r"""Mean and variance of :math:`X_t` from :math:`X_0 = x_0`:
    :math:`\mu + (x_0 - \mu) e^{-\theta t}` and
    :math:`\sigma^2 (1 - e^{-2 \theta t}) / (2 \theta)` (the law is Gaussian; the
    stationary one, :math:`t \to \infty`, is :math:`N(\mu, \sigma^2 / 2\theta)`)."""
    theta, mu, sigma = ORNSTEIN_UHLENBECK_DEFAULT_ARGS if args is None else args
    e = jnp.exp(-theta * jnp.asarray(t))
    return mu + (jnp.asarray(x0) - mu) * e, sigma ** 2 / (2 * theta) * (1 - e * e)


def geometric_brownian_motion_drift(t: ArrayLike, x: ArrayLike, args: Args = None) -> Array:
    r"""Drift of geometric Brownian motion :math:`dX = \mu X\,dt + \sigma X\,dW`:
    ``mu x``.

    Args:
        t: Time (unused).
        x: State, any shape.
        args: ``(mu, sigma)``: growth rate and volatility; ``None`` selects
            ``(0.05, 0.2)``.

    References:
        P. E. Kloeden and E. Platen, *Numerical Solution of Stochastic Differential
        Equations* (Springer, 1992), sec. 4.4.
    """
    del t
    mu, _ = GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS if args is None else args
    return mu * jnp.asarray(x)


def geometric_brownian_motion_diffusion(t: ArrayLike, x: ArrayLike,
                                        args: Args = None) -> Array:
    """Diffusion of geometric Brownian motion: ``sigma x`` (multiplicative noise)."""
    del t
    _, sigma = GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS if args is None else args
    return sigma * jnp.asarray(x)


def geometric_brownian_motion_exact(x0: ArrayLike, t: ArrayLike, w_t: ArrayLike,
                                    args: Args = None, *,
                                    stratonovich: bool = False) -> Array:
    r"""The solution on a given Brownian path: :math:`x_0 \exp((\mu - \sigma^2/2) t +
    \sigma W_t)` (Itô), or :math:`x_0 \exp(\mu t + \sigma W_t)` for the Stratonovich
    equation :math:`dX = \mu X\,dt + \sigma X \circ dW`."""
    mu, sigma = GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS if args is None else args
    t = jnp.asarray(t)
    rate = mu if stratonovich else mu - sigma ** 2 / 2
    return jnp.asarray(x0) * jnp.exp(rate * t + sigma * jnp.asarray(w_t))


def geometric_brownian_motion_moments(x0: ArrayLike, t: ArrayLike,
                                      args: Args = None) -> tuple[Array, Array]:
    r"""Mean and variance of the Itô :math:`X_t`: :math:`x_0 e^{\mu t}` and
    :math:`x_0^2 e^{2 \mu t} (e^{\sigma^2 t} - 1)`."""
    mu, sigma = GEOMETRIC_BROWNIAN_MOTION_DEFAULT_ARGS if args is None else args
    t = jnp.asarray(t)
    m = jnp.asarray(x0) * jnp.exp(mu * t)
    return m, m * m * jnp.expm1(sigma ** 2 * t)
