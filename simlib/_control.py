"""Step-size control: the PI controller and the automatic first step.

References:
    Hairer, Norsett and Wanner, *Solving ODEs I*, 2nd ed. (1993), II.4 (initial step,
    error norm); Hairer and Wanner, *Solving ODEs II*, 2nd ed. (1996), IV.2
    (the PI controller of Gustafsson, with exponents ``0.7/k`` and ``0.4/k``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._solver._base import PyTree, VectorField, axpy
from ._solver._explicit_rk import error_scale, safe_sqrt

SAFETY = 0.9
FACTOR_MIN = 0.2
FACTOR_MAX = 10.0
BETA1 = 0.7  # proportional exponent, divided by k = error order + 1
BETA2 = 0.4  # integral exponent, divided by k


def pi_factor(ratio, ratio_prev, k: int):
    """Step-size factor ``SAFETY * ratio**(-0.7/k) * ratio_prev**(0.4/k)``, clipped.

    ``ratio`` is the scaled error of this step (accept when at most one),
    ``ratio_prev`` that of the last accepted step, and ``k`` the error order plus one.
    After a rejection the factor never exceeds one.
    """
    # Below 1e-10 the factor is clipped to FACTOR_MAX anyway; the floor keeps the
    # derivative of the power finite, so that reverse mode gives no nan.
    r = jnp.maximum(ratio, 1e-10)
    r_prev = jnp.maximum(ratio_prev, 1e-10)
    accepted = SAFETY * r ** (-BETA1 / k) * r_prev ** (BETA2 / k)
    rejected = SAFETY * r ** (-1.0 / k)
    factor = jnp.where(ratio <= 1.0, accepted, jnp.minimum(rejected, 1.0))
    factor = jnp.clip(factor, FACTOR_MIN, FACTOR_MAX)
    return jnp.where(jnp.isfinite(ratio), factor, FACTOR_MIN)


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
