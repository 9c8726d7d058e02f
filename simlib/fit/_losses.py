"""Trajectory misfits: the weighted mean-squared error and its residual vector."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ArrayLike = Any

__all__ = ["mse_loss", "trajectory_residuals"]


def _weighted_difference(predicted, observed, sigma):
    predicted = jnp.asarray(predicted)
    observed = jnp.asarray(observed)
    try:
        shape = jnp.broadcast_shapes(predicted.shape, observed.shape)
    except ValueError:
        raise ValueError(
            f"predicted (shape {predicted.shape}) and observed (shape {observed.shape}) "
            "must have the same shape"
        ) from None
    if predicted.shape != observed.shape:
        raise ValueError(
            f"predicted (shape {predicted.shape}) and observed (shape {observed.shape}) "
            f"must have the same shape (they broadcast to {shape}, which is not accepted "
            "to avoid silent mistakes)"
        )
    diff = predicted - observed
    if sigma is not None:
        sigma = jnp.asarray(sigma)
        try:
            jnp.broadcast_shapes(sigma.shape, diff.shape)
        except ValueError:
            raise ValueError(
                f"sigma (shape {sigma.shape}) must broadcast against observed (shape "
                f"{observed.shape}): a scalar, one value per component, or one per entry"
            ) from None
        if jnp.broadcast_shapes(sigma.shape, diff.shape) != diff.shape:
            raise ValueError(
                f"sigma (shape {sigma.shape}) must not have more entries than observed "
                f"(shape {observed.shape})"
            )
        if not isinstance(sigma, jax.core.Tracer) and not bool(np.all(np.asarray(sigma) > 0)):
            raise ValueError("sigma must be positive everywhere")
        diff = diff / sigma
    return diff


def _broadcast_mask(mask, shape) -> np.ndarray | jax.Array:
    try:
        jnp.broadcast_shapes(np.shape(mask), shape)
    except ValueError:
        raise ValueError(
            f"mask (shape {np.shape(mask)}) must broadcast against observed (shape {shape}), "
            "e.g. one boolean per state component"
        ) from None
    if isinstance(mask, jax.core.Tracer):
        return jnp.broadcast_to(jnp.asarray(mask, bool), shape)
    out = np.broadcast_to(np.asarray(mask, bool), shape)
    if not out.any():
        raise ValueError("mask selects no observation")
    return out


def mse_loss(
    predicted: ArrayLike,
    observed: ArrayLike,
    *,
    sigma: ArrayLike | None = None,
    mask: ArrayLike | None = None,
) -> jax.Array:
    r"""Weighted mean-squared trajectory error over the observed entries.

    .. math::

        L = \frac{1}{|M|} \sum_{(i, j) \in M}
            \left(\frac{\hat y_{ij} - y_{ij}}{\sigma_{ij}}\right)^2 ,

    where ``M`` is the set of observed entries (``mask`` true). With ``sigma`` the noise
    standard deviations, ``L`` is ``2 / |M|`` times the Gaussian negative log-likelihood
    (up to a constant), so minimising it is weighted least squares; without ``sigma`` it is
    the plain mean-squared error. ``L`` equals ``mean(trajectory_residuals(...) ** 2)``.

    Args:
        predicted: Model values, e.g. ``sol.ys`` of shape ``(n_times, n_components)``.
        observed: Observations, the same shape as ``predicted``.
        sigma: Noise standard deviation: a scalar, one value per component (shape
            ``(n_components,)``) or one per entry. ``None`` means 1.
        mask: Booleans broadcastable to ``observed``, true where an entry is observed (e.g.
            ``[True, False]`` when only the first component is measured). ``None`` means
            all entries. May be traced.

    Returns:
        The scalar ``L``.

    References:
        J. Nocedal and S. J. Wright, *Numerical Optimization*, 2nd ed., Springer, 2006,
        Chapter 10 (least-squares problems).
    """
    diff = _weighted_difference(predicted, observed, sigma)
    if mask is None:
        return jnp.mean(diff**2)
    m = _broadcast_mask(mask, diff.shape)
    m = jnp.asarray(m, diff.dtype)
    return jnp.sum(m * diff**2) / jnp.sum(m)


def trajectory_residuals(
    predicted: ArrayLike,
    observed: ArrayLike,
    *,
    sigma: ArrayLike | None = None,
    mask: ArrayLike | None = None,
) -> jax.Array:
    r"""The weighted residual vector of :func:`mse_loss`.

    .. math:: r = \left[\frac{\hat y_{ij} - y_{ij}}{\sigma_{ij}}\right]_{(i, j) \in M},

    flattened in row-major order over the observed entries only, so that
    ``mse_loss(...) == mean(r ** 2)``. Pass a function returning it as ``residuals`` to
    :func:`simlib.fit.fit` for standard errors.

    Args:
        predicted: Model values, e.g. ``sol.ys``.
        observed: Observations, the same shape as ``predicted``.
        sigma: Noise standard deviation (scalar, per component, or per entry).
        mask: Booleans broadcastable to ``observed``, true where observed. Unlike in
            :func:`mse_loss` it must be concrete (a numpy array or Python list, not a traced
            value) because it fixes the length of ``r``.

    Returns:
        A 1-D array of length ``|M|``.

    References:
        J. Nocedal and S. J. Wright, *Numerical Optimization*, 2nd ed., Springer, 2006,
        Chapter 10.
    """
    diff = _weighted_difference(predicted, observed, sigma)
    if mask is None:
        return jnp.ravel(diff)
    if isinstance(mask, jax.core.Tracer):
        raise TypeError(
            "trajectory_residuals: mask must be concrete (numpy or a list), not a traced "
            "value, because it fixes the length of the residual vector"
        )
    m = _broadcast_mask(mask, diff.shape)
    return jnp.ravel(diff)[np.flatnonzero(np.ravel(m))]
