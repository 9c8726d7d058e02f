"""Central finite differences, the outside reference of the gradient tests."""

import jax.numpy as jnp
import numpy as np


def central_differences(fn, x, eps=1e-6):
    """``d fn / d x`` componentwise: ``(fn(x + eps e_j) - fn(x - eps e_j)) / (2 eps)``."""
    x = np.asarray(x, float)
    out = np.zeros_like(x)
    for j in range(x.size):
        e = np.zeros_like(x)
        e.flat[j] = eps
        out.flat[j] = (float(fn(jnp.asarray(x + e))) - float(fn(jnp.asarray(x - e)))) / (2 * eps)
    return out
