"""Reaction-diffusion PDEs discretised in space (method of lines): Brusselators in 1-D and 2-D.

The vector fields are written with :mod:`simlib.pde`'s operators on a state whose leading
axes are the grid and whose last axis holds the two species ``(u, v)``; the grid is
inferred from the state's shape, so one function serves every resolution.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from .. import pde
from ._types import Args, Array, ArrayLike

BRUSSELATOR_1D_DEFAULT_ARGS: tuple[float, float, float] = (1.0, 3.0, 0.02)
"""Default ``(A, B, alpha)`` of :func:`brusselator_1d` (Hairer and Wanner's values)."""

BRUSSELATOR_2D_DEFAULT_ARGS: tuple[float, float, float] = (3.4, 1.0, 10.0)
"""Default ``(A, B, alpha)`` of :func:`brusselator_2d` (the SciMLBenchmarks values)."""


def brusselator_1d_grid(n: int) -> pde.Grid:
    """The grid of :func:`brusselator_1d` with ``n`` interior points: ``x_i = i / (n + 1)``,
    Dirichlet boundaries at ``x = 0`` and ``x = 1``."""
    return pde.Grid.uniform((n,), lengths=1.0, bc="dirichlet")


def brusselator_1d(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""The Brusselator with diffusion in one space dimension.

    .. math::

        u_t = A + u^2 v - (B + 1) u + \alpha u_{xx}, \qquad
        v_t = B u - u^2 v + \alpha v_{xx}, \qquad 0 < x < 1,

    with Dirichlet boundaries at the homogeneous steady state, ``u = A`` and ``v = B/A``
    at ``x = 0, 1`` (Hairer and Wanner's ``u = 1``, ``v = 3`` at the default
    parameters), on ``n`` interior points ``x_i = i / (n + 1)`` with the second-order
    Laplacian of :func:`simlib.pde.laplacian`: ``2 n`` states, the two species of a point
    next to each other, so the Jacobian is banded with bandwidth ``(2, 2)``. Stiff for
    large ``n``: the diffusion eigenvalues reach ``-4 alpha (n + 1)^2``. The usual set-up
    is :func:`brusselator_1d_initial` on ``[0, 10]``.

    Args:
        t: Time (unused, the system is autonomous).
        y: State of shape ``(n, 2)``: ``y[:, 0] = u``, ``y[:, 1] = v`` at the points.
        args: ``(A, B, alpha)``: feed concentration, rate constant and diffusion
            coefficient (dimensionless). ``None`` selects ``(1, 3, 1/50)``.

    Returns:
        ``dy/dt`` with the shape and dtype of ``y``.

    References:
        E. Hairer and G. Wanner, *Solving Ordinary Differential Equations II*, 2nd ed.,
        Springer, 1996, section IV.1 (the problem BRUSS); E. Hairer, S. P. Norsett and
        G. Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., 1993, II.10
        (10.14).
    """
    del t
    a, b, alpha = BRUSSELATOR_1D_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    grid = brusselator_1d_grid(y.shape[0])
    edge = jnp.stack([jnp.asarray(a, y.dtype), jnp.asarray(b / a, y.dtype)])
    diffusion = alpha * pde.laplacian(y, grid, lower=edge, upper=edge)
    u, v = y[:, 0], y[:, 1]
    uuv = u * u * v
    return diffusion + jnp.stack([a + uuv - (b + 1) * u, b * u - uuv], axis=-1)


def brusselator_1d_initial(n: int) -> np.ndarray:
    """Hairer and Wanner's initial state, ``u = 1 + sin(2 pi x)``, ``v = 3``: shape
    ``(n, 2)``, float64."""
    (x,) = brusselator_1d_grid(n).coordinates()
    return np.stack([1.0 + np.sin(2 * np.pi * x), np.full(n, 3.0)], axis=-1)


def brusselator_2d_grid(n: int) -> pde.Grid:
    """The grid of :func:`brusselator_2d`: ``n x n`` points ``x_i = i / (n - 1)``, periodic
    with period ``n / (n - 1)`` (the SciMLBenchmarks set-up: ``range(0, 1, length=N)``
    with the neighbours wrapping around)."""
    return pde.Grid((n, n), spacing=1.0 / (n - 1), bc="periodic")


def brusselator_2d(t: ArrayLike, y: ArrayLike, args: Args = None) -> Array:
    r"""The 2-D Brusselator of the SciMLBenchmarks and DifferentialEquations.jl tutorials.

    .. math::

        u_t = B + u^2 v - (A + 1) u + \alpha \nabla^2 u + f(x, y, t), \qquad
        v_t = A u - u^2 v + \alpha \nabla^2 v,

    on the periodic ``n x n`` grid of :func:`brusselator_2d_grid` with the 5-point
    Laplacian (:func:`simlib.pde.laplacian`), and the forcing ``f = 5`` inside the disk
    ``(x - 0.3)^2 + (y - 0.6)^2 <= 0.1^2`` for ``t >= 1.1``, zero elsewhere. ``2 n^2``
    states in the layout ``(n, n, 2)`` (axis 0 is ``x``, axis 1 is ``y``, the species
    last). The usual set-up is :func:`brusselator_2d_initial` on ``[0, 11.5]``; with
    ``alpha = 10`` the diffusion eigenvalues reach ``-8 alpha (n - 1)^2`` (about
    ``-5.2e6`` at ``n = 256``).

    Args:
        t: Time (the forcing switches on at ``t = 1.1``).
        y: State of shape ``(n, n, 2)``: ``y[..., 0] = u``, ``y[..., 1] = v``.
        args: ``(A, B, alpha)``. ``None`` selects ``(3.4, 1, 10)``.

    Returns:
        ``dy/dt`` with the shape and dtype of ``y``.

    References:
        SciML/SciMLBenchmarks.jl, ``benchmarks/StiffODE/Bruss.jmd`` ("Brusselator
        Work-Precision Diagrams", C. Rackauckas and Utkarsh): ``brusselator_2d_loop``,
        ``p = (3.4, 1., 10., step(xyd_brusselator))``, ``tspan = (0, 11.5)``; the same
        problem is DifferentialEquations.jl's "Solving Large Stiff Equations" tutorial.
    """
    a, b, alpha = BRUSSELATOR_2D_DEFAULT_ARGS if args is None else args
    y = jnp.asarray(y)
    grid = brusselator_2d_grid(y.shape[0])
    xs, ys = grid.mesh()
    disk = jnp.asarray(((xs - 0.3) ** 2 + (ys - 0.6) ** 2) <= 0.1**2, y.dtype)
    forcing = jnp.where(jnp.asarray(t) >= 1.1, 5.0, 0.0).astype(y.dtype) * disk
    u, v = y[..., 0], y[..., 1]
    uuv = u * u * v
    reaction = jnp.stack([b + uuv - (a + 1) * u + forcing, a * u - uuv], axis=-1)
    return alpha * pde.laplacian(y, grid) + reaction


def brusselator_2d_initial(n: int) -> np.ndarray:
    """The benchmark's initial state, ``u = 22 (y (1 - y))^{3/2}``, ``v = 27 (x (1 -
    x))^{3/2}``: shape ``(n, n, 2)``, float64."""
    xs, ys = brusselator_2d_grid(n).mesh()
    return np.stack([22.0 * np.clip(ys * (1 - ys), 0.0, None) ** 1.5,
                     27.0 * np.clip(xs * (1 - xs), 0.0, None) ** 1.5], axis=-1)


__all__ = [
    "BRUSSELATOR_1D_DEFAULT_ARGS",
    "BRUSSELATOR_2D_DEFAULT_ARGS",
    "brusselator_1d",
    "brusselator_1d_grid",
    "brusselator_1d_initial",
    "brusselator_2d",
    "brusselator_2d_grid",
    "brusselator_2d_initial",
]
