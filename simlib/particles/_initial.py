"""Initial conditions: lattices, Maxwell-Boltzmann velocities, a Plummer sphere."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike, DTypeLike

_BASIS = {
    "cubic": np.zeros((1, 3)),
    "fcc": np.array([[0, 0, 0], [0.5, 0.5, 0], [0.5, 0, 0.5], [0, 0.5, 0.5]]),
}


def lattice(n_cells: int, density: float, *, kind: str = "fcc", dim: int = 3,
            dtype: DTypeLike | None = None) -> tuple[jax.Array, float]:
    """Particles on a cubic or face-centred cubic lattice at a number density.

    ``n_cells`` unit cells along each side; ``kind="fcc"`` (3D, 4 per cell) or ``"cubic"``
    (1 per cell, 2D or 3D). Returns ``(positions, box)``: ``(n, dim)`` positions in
    ``[0, box)`` and the cubic box side ``(n / density) ** (1 / dim)``.

    Example:
        >>> positions, box = lattice(10, 0.8442)      # 4,000 particles
        >>> positions.shape, round(float(box), 4)     # box = (4000 / 0.8442) ** (1 / 3)
        ((4000, 3), 16.796)
    """
    if kind not in _BASIS:
        raise ValueError(f"lattice: kind must be 'fcc' or 'cubic', got {kind!r}")
    if kind == "fcc" and dim != 3:
        raise ValueError(f"lattice: an fcc lattice is 3D, got dim={dim}")
    if dim not in (2, 3):
        raise ValueError(f"lattice: dim must be 2 or 3, got {dim}")
    if int(n_cells) < 1 or not density > 0:
        raise ValueError(f"lattice: need n_cells >= 1 and density > 0, got {n_cells}, {density}")
    basis = _BASIS[kind][:, :dim]
    cells = np.stack(np.meshgrid(*[np.arange(n_cells)] * dim, indexing="ij"), -1).reshape(-1, dim)
    unit = (cells[:, None, :] + basis[None] + 0.25).reshape(-1, dim)
    n = unit.shape[0]
    box = (n / density) ** (1.0 / dim)
    dtype = dtype or jnp.result_type(float)
    return jnp.asarray(unit * (box / n_cells), dtype), float(box)


def maxwell_boltzmann(masses: ArrayLike, kT: float, *, key: jax.Array, dim: int = 3,
                      n: int | None = None, zero_momentum: bool = True,
                      dtype: DTypeLike | None = None) -> jax.Array:
    r"""Velocities drawn from the Maxwell-Boltzmann distribution at temperature ``kT``.

    Each component is normal with variance :math:`kT/m_i`; with ``zero_momentum`` the
    centre-of-mass velocity is subtracted (the drawn temperature then has :math:`d(n-1)`
    degrees of freedom). ``masses`` is ``(n,)``, or a scalar with ``n`` given.

    ``kT`` must be finite and non-negative and the masses finite and positive: concrete
    values outside are refused with a ``ValueError``; traced ones (under ``jit`` or
    ``vmap``, where there is no result code to report) give NaN velocities.
    """
    m = jnp.asarray(masses, dtype or jnp.result_type(float))
    if m.ndim == 0:
        if n is None:
            raise ValueError("maxwell_boltzmann: give n when masses is a scalar")
        m = jnp.full((n,), m)
    if not isinstance(kT, jax.core.Tracer):
        if np.ndim(kT) != 0 or not (np.isfinite(kT) and kT >= 0):
            raise ValueError(f"maxwell_boltzmann: kT must be a finite temperature >= 0, "
                             f"got {kT!r}")
    if not isinstance(m, jax.core.Tracer):
        bad = ~(np.isfinite(np.asarray(m)) & (np.asarray(m) > 0))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"maxwell_boltzmann: masses must be positive and finite; "
                             f"particle {i} has {float(m[i])!r}")
    valid = jnp.isfinite(kT) & (kT >= 0) & jnp.all(jnp.isfinite(m) & (m > 0))
    v = jax.random.normal(key, (m.shape[0], dim), m.dtype) * jnp.sqrt(kT / m)[:, None]
    if zero_momentum:
        v = v - jnp.sum(m[:, None] * v, 0) / jnp.sum(m)
    return jnp.where(valid, v, jnp.nan)


def plummer(n: int, *, key: jax.Array, total_mass: float = 1.0, scale: float = 1.0,
            G: float = 1.0,
            dtype: DTypeLike | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    r"""A Plummer sphere in virial equilibrium (Aarseth, Hénon & Wielen, A&A 37, 183 (1974)).

    Radii from the cumulative mass :math:`M(r)/M = r^3/(r^2 + a^2)^{3/2}`, speeds by von
    Neumann rejection from :math:`g(q) = q^2 (1 - q^2)^{7/2}` with the escape speed
    :math:`v_e = \sqrt{2GM}(r^2 + a^2)^{-1/4}`; centre of mass at rest at the origin.
    Returns ``(positions, velocities, masses)`` with equal masses.
    """
    dtype = dtype or jnp.result_type(float)
    k_r, k_dir, k_q, k_vdir = jax.random.split(key, 4)
    u = jax.random.uniform(k_r, (n,), dtype, 1e-10, 1.0 - 1e-10)
    r = scale / jnp.sqrt(u ** (-2.0 / 3.0) - 1.0)

    def direction(k):
        z = jax.random.normal(k, (n, 3), dtype)
        return z / jnp.linalg.norm(z, axis=1, keepdims=True)

    # Rejection sampling, vectorised: enough candidates that all n accept with near certainty.
    m = 64
    kx, ky = jax.random.split(k_q)
    q = jax.random.uniform(kx, (n, m), dtype)
    y = jax.random.uniform(ky, (n, m), dtype) * 0.1
    ok = y < q**2 * (1.0 - q**2) ** 3.5
    q = q[jnp.arange(n), jnp.argmax(ok, axis=1)]
    v_esc = math.sqrt(2.0 * G * total_mass) * (r**2 + scale**2) ** -0.25
    x = r[:, None] * direction(k_dir)
    v = (q * v_esc)[:, None] * direction(k_vdir)
    x = x - jnp.mean(x, 0)
    v = v - jnp.mean(v, 0)
    return x, v, jnp.full((n,), total_mass / n, dtype)
