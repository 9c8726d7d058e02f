"""Step-size control: the PI controller and the automatic first step.

References:
    Hairer, Norsett and Wanner, *Solving ODEs I*, 2nd ed. (1993), II.4 (initial step,
    error norm); Hairer and Wanner, *Solving ODEs II*, 2nd ed. (1996), IV.2
    (the PI controller of Gustafsson, with exponents ``0.7/k`` and ``0.4/k``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ._solver._base import PyTree, VectorField, axpy, error_scale, safe_sqrt

SAFETY = 0.9
FACTOR_MIN = 0.2
FACTOR_MAX = 10.0
BETA1 = 0.7  # proportional exponent, divided by k = error order + 1
BETA2 = 0.4  # integral exponent, divided by k
_LOG_SAFETY = math.log(SAFETY)
_LOG_FACTOR_MIN = math.log(FACTOR_MIN)
_LOG_FACTOR_MAX = math.log(FACTOR_MAX)


def pi_factor(log_ratio, log_ratio_prev, k: int):
    """Step-size factor ``SAFETY * r**(-0.7/k) * r_prev**(0.4/k)``, clipped to [0.2, 10].

    Takes logarithms: ``log_ratio`` is ``log r`` of this step's scaled error (accept when
    ``r <= 1``), ``log_ratio_prev`` that of the last accepted step, and ``k`` the error
    order plus one. After a rejection the factor is ``SAFETY * r**(-1/k)``, at most one.
    Computed as one ``exp`` of a combination of logarithms: three ``pow`` calls per
    attempt cost about 40% of a Lorenz ensemble's adaptive step under ``vmap``.
    """
    accepted = BETA2 / k * log_ratio_prev - BETA1 / k * log_ratio
    rejected = jnp.minimum(-log_ratio / k, -_LOG_SAFETY)
    log_factor = _LOG_SAFETY + jnp.where(log_ratio <= 0.0, accepted, rejected)
    log_factor = jnp.clip(log_factor, _LOG_FACTOR_MIN, _LOG_FACTOR_MAX)
    return jnp.exp(jnp.where(jnp.isfinite(log_ratio), log_factor, _LOG_FACTOR_MIN))


def log_error_ratio(ratio):
    """``log r``, floored at ``log 1e-10``: below it the factor is clipped to FACTOR_MAX
    anyway, and the floor keeps reverse mode free of ``log 0``."""
    return jnp.log(jnp.maximum(ratio, 1e-10))


def _rms(tree: PyTree, scale: PyTree) -> jax.Array:
    leaves = jax.tree_util.tree_leaves(jax.tree_util.tree_map(lambda x, s: x / s, tree, scale))
    n = sum(x.size for x in leaves)
    return safe_sqrt(sum(jnp.sum(jnp.square(x)) for x in leaves) / n)


def initial_step(f: VectorField, t0, y0: PyTree, f0: PyTree, args, direction, order: int,
                 rtol, atol):
    """Hairer's algorithm for the first step (Hairer et al. 1993, II.4, p. 169).

    ``d0 = ||y0||``, ``d1 = ||f0||``, ``h0 = 0.01 d0/d1``; one Euler step gives
    ``d2 = ||f(t0 + h0, y0 + h0 f0) - f0|| / h0``, and
    ``h1 = (0.01 / max(d1, d2))**(1/(order+1))``; the step is ``min(100 h0, h1)``.
    Norms are RMS norms scaled by ``atol + rtol |y0|``. Returns a signed step.
    """
    scale = error_scale(y0, y0, rtol, atol)
    d0 = _rms(y0, scale)
    d1 = _rms(f0, scale)
    small = (d0 < 1e-5) | (d1 < 1e-5)
    h0 = jnp.where(small, 1e-6, 0.01 * d0 / jnp.where(small, 1.0, d1))
    y1 = axpy(y0, direction * h0, [(1.0, f0)])
    f1 = f(t0 + direction * h0, y1, args)
    d2 = _rms(jax.tree_util.tree_map(lambda a, b: a - b, f1, f0), scale) / h0
    dmax = jnp.maximum(d1, d2)
    h1 = jnp.where(
        dmax <= 1e-15,
        jnp.maximum(1e-6, h0 * 1e-3),
        (0.01 / jnp.where(dmax <= 1e-15, 1.0, dmax)) ** (1.0 / (order + 1)),
    )
    return direction * jnp.minimum(100 * h0, h1)
