"""Lennard-Jones over all pairs in float64 numpy: the reference of the cell and kernel
tests (nothing from simlib)."""

from __future__ import annotations

import numpy as np


def numpy_lj(x, box, sigma, epsilon, r_cut, shift=False):
    """Energy, forces and virial ``sum_pairs -r u'(r)`` of LJ truncated at ``r_cut``
    (shifted to zero there with ``shift``) over all pairs, the nearest image of each in the
    orthorhombic ``box``. ``sigma`` and ``epsilon``: one value, or one per particle with
    Lorentz-Berthelot mixing (``(s_i + s_j) / 2``, ``sqrt(e_i e_j)``)."""
    x = np.asarray(x, np.float64)
    i, j = np.triu_indices(len(x), 1)
    dv = x[i] - x[j]
    dv -= box * np.round(dv / box)
    r2 = np.sum(dv * dv, axis=1)
    sigma, epsilon = np.asarray(sigma, np.float64), np.asarray(epsilon, np.float64)
    s = 0.5 * (sigma[i] + sigma[j]) if sigma.ndim else sigma
    e = np.sqrt(epsilon[i] * epsilon[j]) if epsilon.ndim else epsilon
    inside = r2 < r_cut**2
    s6 = (s * s / r2) ** 3
    c6 = (s / r_cut) ** 6
    u = np.where(inside, 4 * e * (s6 * s6 - s6 - (c6 * c6 - c6 if shift else 0)), 0.0)
    c = np.where(inside, 24 * e * (2 * s6 * s6 - s6) / r2, 0.0)     # -u'(r) / r
    forces = np.zeros_like(x)
    np.add.at(forces, i, c[:, None] * dv)
    np.add.at(forces, j, -c[:, None] * dv)
    return u.sum(), forces, np.sum(c * r2)
