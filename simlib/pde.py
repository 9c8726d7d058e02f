"""Finite-difference operators on uniform grids, for PDEs by the method of lines.

A PDE such as ``u_t = D lap(u) + R(u)`` becomes a system of ODEs once space is
discretised: the state holds ``u`` at every grid point and the vector field applies a
difference stencil. This module gives the stencils users otherwise write by hand (and get
wrong at the boundaries), and the sparsity pattern of each, so that a stiff solve of the
resulting system can be handed its Jacobian structure instead of detecting it.

Layout: a field on a :class:`Grid` is an array whose **leading** axes are the grid axes
(``grid.shape``, one to three of them); any trailing axes (species, vector components)
are carried along, every operator acting on each trailing entry alone. A two-species
system on a 64 x 64 grid is one array of shape ``(64, 64, 2)``; flattened in C order
(``y.reshape(-1)``, as ``jax.flatten_util.ravel_pytree`` does) its species sit next to
each other at every point ("interleaved"), which keeps the Jacobian of a 1-D problem
banded. Batches are added with ``jax.vmap``.

Boundaries, per side of each axis (:class:`Grid`'s ``bc``):

* ``"periodic"``: the first and last points are neighbours (``x_i = i h``, period
  ``n h``).
* ``"dirichlet"``: the value on the boundary is given; the boundary sits one spacing
  outside the first (last) unknown, which is the ghost point (``x_i = (i + 1) h`` on
  ``[0, (n + 1) h]``: the unknowns are the interior points, LeVeque 2007, section 2.4).
* ``"neumann"``: the derivative ``du/dx`` along the axis is given on the boundary face,
  half a spacing outside the first (last) point (cell-centred, ``x_i = (i + 1/2) h`` on
  ``[0, n h]``). The ghost point mirrors the first point across the face,
  ``u_{-1} = u_0 - h g`` (``u_n = u_{n-1} + h g`` on the upper side): the discrete
  Laplacian is then symmetric and, for ``g = 0``, conserves ``sum(u)`` exactly (a
  finite-volume scheme; LeVeque 2007, section 2.12 and chapter 9).

The boundary values ``g`` are arguments of each call (``lower=``, ``upper=``), so they
may be traced, differentiated and vary in time; they default to zero. :meth:`Grid.uniform`
and :meth:`Grid.coordinates` place the points of a given domain for these rules.

Sparsity: :func:`laplacian_pattern`, :func:`gradient_pattern` and
:func:`divergence_pattern` return the pattern of each operator on the grid points,
:func:`pattern` combines them with the point-wise coupling of the species into the
Jacobian pattern of a whole system, in the state's order, and :func:`bandwidth` reads off
its ``(lower, upper)`` bandwidth: the ``jac_sparsity`` and ``jac_bandwidth`` of a stiff
solve (scipy's ``solve_ivp`` takes the same ``jac_sparsity``; simlib's stiff solvers take
both with the sparse and banded linear solvers of issue 23).

Reference: R. J. LeVeque, *Finite Difference Methods for Ordinary and Partial
Differential Equations*, SIAM, 2007 (chapters 1, 2, 3 and 9).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse
from jax import lax

__all__ = [
    "Grid",
    "bandwidth",
    "diffusion_preconditioner",
    "divergence",
    "divergence_pattern",
    "gradient",
    "gradient_pattern",
    "laplacian",
    "laplacian_pattern",
    "pattern",
]

BOUNDARIES = ("periodic", "dirichlet", "neumann")
# Distance from the boundary to the nearest unknown, in spacings (the upper "boundary" of a
# periodic axis is the image of the first point, one spacing after the last).
_OFFSET = {"periodic": (0.0, 1.0), "dirichlet": (1.0, 1.0), "neumann": (0.5, 0.5)}


# --------------------------------------------------------------------------------------
# the grid


def _per_axis(value: Any, ndim: int, name: str) -> tuple:
    """``value`` repeated on every axis, or its items checked to be one per axis."""
    if isinstance(value, (tuple, list)):
        if len(value) != ndim:
            raise ValueError(f"Grid: {name} has {len(value)} items for a {ndim}-D grid; give "
                             f"one per axis, or a single value for all of them.")
        return tuple(value)
    return (value,) * ndim


def _normalise_bc(bc: Any, ndim: int) -> tuple[tuple[str, str], ...]:
    if ndim == 1 and isinstance(bc, (tuple, list)) and len(bc) == 2:
        raise ValueError(f"Grid: bc={bc!r} has 2 items for a 1-D grid, which has one axis; "
                         f"for its lower and upper sides write bc=[{tuple(bc)!r}].")
    items = _per_axis(bc, ndim, "bc")
    out = []
    for axis, item in enumerate(items):
        pair = (item, item) if isinstance(item, str) else item
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(s, str) for s in pair)):
            raise ValueError(f"Grid: bc[{axis}] must be one of {BOUNDARIES} or a "
                             f"(lower, upper) pair of them, got {item!r}.")
        for side in pair:
            if side not in BOUNDARIES:
                raise ValueError(f"Grid: unknown boundary {side!r} on axis {axis}; valid: "
                                 f"{', '.join(BOUNDARIES)}.")
        if ("periodic" in pair) and pair[0] != pair[1]:
            raise ValueError(f"Grid: axis {axis} is periodic on one side only ({pair}); a "
                             f"periodic axis is periodic on both sides.")
        out.append((pair[0], pair[1]))
    return tuple(out)


@dataclass(frozen=True, init=False)
class Grid:
    """A uniform grid of 1 to 3 axes, with the boundary condition of each side.

    Args:
        shape: Number of unknowns along each axis, ``(nx,)``, ``(nx, ny)`` or
            ``(nx, ny, nz)``; at least 2 each.
        spacing: Grid spacing ``h`` of each axis (a tuple, one per axis), or one value for
            all; positive, finite, in the units of the domain.
        bc: Boundary conditions: one of ``"periodic"``, ``"dirichlet"``, ``"neumann"`` for
            every side of every axis, or a sequence with one item per axis, each a name
            (both sides) or a ``(lower, upper)`` pair of names. A periodic axis is
            periodic on both sides. Where the points sit relative to each kind of boundary
            is described in :mod:`simlib.pde` (and computed by :meth:`coordinates`).

    Attributes:
        shape: As given, a tuple of ints.
        spacing: A tuple of floats, one per axis.
        bc: A tuple with one ``(lower, upper)`` pair of names per axis.

    The grid is structure, not data: hashable, compared by value, and a pytree with no
    leaves, so it may be closed over or passed in ``args`` without being traced.

    Example:
        >>> from simlib import pde
        >>> grid = pde.Grid.uniform((4,), lengths=1.0, bc="dirichlet")
        >>> grid.spacing, grid.coordinates()[0].tolist()
        ((0.2,), [0.2, 0.4, 0.6000000000000001, 0.8])
    """

    shape: tuple[int, ...]
    spacing: tuple[float, ...]
    bc: tuple[tuple[str, str], ...]

    def __init__(self, shape: int | Sequence[int], spacing: float | Sequence[float],
                 bc: str | Sequence[str | tuple[str, str]] = "periodic") -> None:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if not 1 <= len(shape) <= 3:
            raise ValueError(f"Grid: shape must have 1 to 3 axes, got {shape}.")
        for n in shape:
            if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 2:
                raise ValueError(f"Grid: shape must be integers >= 2 per axis, got {shape}.")
        shape = tuple(int(n) for n in shape)
        spacing = tuple(_per_axis(spacing, len(shape), "spacing"))
        for h in spacing:
            if isinstance(h, jax.core.Tracer):
                raise TypeError("Grid: spacing must be a concrete number (the grid is "
                                "static structure); scale the operator's result instead to "
                                "differentiate with respect to a length.")
            if not (isinstance(h, (int, float, np.number)) and math.isfinite(h) and h > 0):
                raise ValueError(f"Grid: spacing must be positive and finite, got {spacing}.")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "spacing", tuple(float(h) for h in spacing))
        object.__setattr__(self, "bc", _normalise_bc(bc, len(shape)))

    @classmethod
    def uniform(cls, shape: int | Sequence[int], lengths: float | Sequence[float] = 1.0,
                bc: str | Sequence[str | tuple[str, str]] = "periodic") -> Grid:
        """The grid that covers a domain of the given ``lengths`` with ``shape`` unknowns.

        The spacing follows from where each kind of boundary sits: ``h = L / n``
        (periodic), ``L / (n + 1)`` (Dirichlet on both sides), ``L / n`` (Neumann on both
        sides), ``L / (n + 1/2)`` (Dirichlet on one side, Neumann on the other).
        """
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        bcs = _normalise_bc(bc, len(shape))
        lengths = _per_axis(lengths, len(shape), "lengths")
        spacing = []
        for n, length, (lo, hi) in zip(shape, lengths, bcs, strict=True):
            if not (isinstance(length, (int, float, np.number)) and length > 0
                    and math.isfinite(length)):
                raise ValueError(f"Grid.uniform: lengths must be positive and finite, got "
                                 f"{lengths}.")
            spacing.append(float(length) / (n - 1 + _OFFSET[lo][0] + _OFFSET[hi][1]))
        return cls(shape, tuple(spacing), bcs)

    @property
    def ndim(self) -> int:
        """Number of grid axes."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of grid points (unknowns per field)."""
        return math.prod(self.shape)

    @property
    def lengths(self) -> tuple[float, ...]:
        """Length of the domain along each axis (boundary to boundary; the period of a
        periodic axis)."""
        return tuple(h * (n - 1 + _OFFSET[lo][0] + _OFFSET[hi][1]) for n, h, (lo, hi)
                     in zip(self.shape, self.spacing, self.bc, strict=True))

    def coordinates(self, origin: float | Sequence[float] = 0.0) -> tuple[np.ndarray, ...]:
        """Positions of the points along each axis, for a domain whose lower boundary is at
        ``origin``: ``origin + (i + offset) h`` with ``offset`` 0 (periodic), 1
        (Dirichlet) or 1/2 (Neumann) from the kind of the lower side. float64 numpy arrays.
        """
        origin = _per_axis(origin, self.ndim, "origin")
        return tuple(o + (np.arange(n) + _OFFSET[lo][0]) * h for n, h, (lo, _), o
                     in zip(self.shape, self.spacing, self.bc, origin, strict=True))

    def mesh(self, origin: float | Sequence[float] = 0.0) -> tuple[np.ndarray, ...]:
        """The coordinates broadcast to ``shape`` (``numpy.meshgrid`` with
        ``indexing="ij"``): one array of shape ``shape`` per axis."""
        return tuple(np.meshgrid(*self.coordinates(origin), indexing="ij"))


jax.tree_util.register_static(Grid)


# --------------------------------------------------------------------------------------
# boundary values and ghost points


def _field(u: Any, grid: Grid, name: str, fn: str) -> jax.Array:
    if not isinstance(grid, Grid):
        raise TypeError(f"{fn}: grid must be a simlib.pde.Grid, got {type(grid).__name__}.")
    u = jnp.asarray(u)
    if not jnp.issubdtype(u.dtype, jnp.inexact):
        raise TypeError(f"{fn}: {name} must be a floating-point array, got dtype {u.dtype}.")
    if u.shape[:grid.ndim] != grid.shape:
        raise ValueError(f"{fn}: {name} has shape {u.shape}, but its leading axes must be the "
                         f"grid's {grid.shape} (grid axes first, species or components after; "
                         f"batch with jax.vmap).")
    return u


def _side_values(spec: Any, grid: Grid, side: str, fn: str) -> tuple:
    """One boundary value (or None for zero) per axis from ``lower=``/``upper=``."""
    if spec is None:
        return (None,) * grid.ndim
    if isinstance(spec, (tuple, list)):
        if len(spec) != grid.ndim:
            raise ValueError(f"{fn}: {side} has {len(spec)} items for a {grid.ndim}-D grid; "
                             f"give one per axis (None for zero), or a single array for all "
                             f"non-periodic axes.")
        for axis, v in enumerate(spec):
            if v is not None and grid.bc[axis][0] == "periodic":
                raise ValueError(f"{fn}: {side}[{axis}] is given, but axis {axis} is periodic "
                                 f"and has no boundary; pass None there.")
        return tuple(spec)
    return tuple(None if lo == "periodic" else spec for lo, _ in grid.bc)


def _face(value: Any, u: jax.Array, axis: int, what: str, fn: str) -> jax.Array:
    """``value`` broadcast to the face of ``u`` normal to ``axis`` (kept as a length-1 axis)."""
    face = u.shape[:axis] + u.shape[axis + 1:]
    v = jnp.asarray(value, dtype=u.dtype)
    try:
        v = jnp.broadcast_to(v, face)
    except ValueError:
        raise ValueError(f"{fn}: {what} has shape {v.shape}, which does not broadcast to the "
                         f"boundary face {face} (the field's shape without axis "
                         f"{axis}).") from None
    return jnp.expand_dims(v, axis)


def _extended(u: jax.Array, grid: Grid, axis: int, lower: Any, upper: Any,
              fn: str) -> jax.Array:
    """``u`` with one ghost layer on each side of ``axis``, from the boundary conditions.

    periodic: the opposite edge; dirichlet: the boundary value; neumann: the mirror of the
    edge across the face, ``u_0 - h g`` below and ``u_{n-1} + h g`` above.
    """
    n, h = grid.shape[axis], grid.spacing[axis]
    lo, hi = grid.bc[axis]
    first = lax.slice_in_dim(u, 0, 1, axis=axis)
    last = lax.slice_in_dim(u, n - 1, n, axis=axis)

    def ghost(kind, edge, opposite, value, sign, side):
        if kind == "periodic":
            return opposite
        g = _face(0.0 if value is None else value, u, axis, f"{side}[{axis}]", fn)
        if kind == "dirichlet":
            return g
        return edge + (sign * h) * g  # neumann

    below = ghost(lo, first, last, lower, -1.0, "lower")
    above = ghost(hi, last, first, upper, 1.0, "upper")
    return jnp.concatenate([below, u, above], axis=axis)


def _shifts(e: jax.Array, axis: int, n: int) -> tuple[jax.Array, jax.Array]:
    """``(u_{i-1}, u_{i+1})`` from the extended array ``e`` (length ``n + 2`` on ``axis``)."""
    return (lax.slice_in_dim(e, 0, n, axis=axis), lax.slice_in_dim(e, 2, n + 2, axis=axis))


# --------------------------------------------------------------------------------------
# operators


def laplacian(u: Any, grid: Grid, *, lower: Any = None, upper: Any = None) -> jax.Array:
    r"""The Laplacian :math:`\nabla^2 u` by second-order central differences.

    .. math::

        (\nabla^2_h u)_i = \sum_{k} \frac{u_{i - e_k} - 2 u_i + u_{i + e_k}}{h_k^2}

    (the 3-, 5- and 7-point stencils in 1-D, 2-D and 3-D). Neighbours outside the grid are
    ghost points set by the boundary conditions: the opposite edge (periodic), the
    boundary value (Dirichlet, one spacing outside), or the mirror ``u_0 - h g`` of the
    edge across the face half a spacing outside (Neumann, ``g = du/dx_k`` on the face).

    Order: the local truncation error is :math:`h^2 (u_{xxxx} / 12)` per axis at every
    point of a periodic or Dirichlet axis; at a Neumann boundary point it is
    :math:`O(h)` (the ghost value is exact for quadratics only), while the solution of
    the discrete problem still converges at second order (LeVeque 2007, sections 2.12
    and 3.1-3.2). With periodic or homogeneous Neumann boundaries ``sum(laplacian(u))``
    is zero (mass is conserved) and the operator is symmetric negative semi-definite.

    Args:
        u: Field of shape ``grid.shape + extra`` (any trailing axes are independent
            fields); float32 or float64, kept.
        grid: The :class:`Grid`.
        lower, upper: Boundary values on the lower and upper side of each non-periodic
            axis: the value of ``u`` (Dirichlet) or of ``du/dx_k`` along the axis
            (Neumann). ``None`` (default) is zero; one array-like applies to every
            non-periodic axis; a tuple gives one per axis (``None`` for zero, and ``None``
            on periodic axes). Each broadcasts against the face, i.e. ``u``'s shape
            without that axis (so ``jnp.array([1.0, 3.0])`` gives two species their own
            value). Traced values are fine.

    Returns:
        The Laplacian, with the shape and dtype of ``u``.

    References:
        R. J. LeVeque, *Finite Difference Methods for Ordinary and Partial Differential
        Equations*, SIAM, 2007: (2.9) and (3.12) for the stencils, section 2.12 for
        Neumann boundaries by ghost points.

    Example:
        >>> import jax.numpy as jnp
        >>> from simlib import pde
        >>> grid = pde.Grid.uniform((4,), lengths=1.0, bc="dirichlet")
        >>> x = jnp.asarray(grid.coordinates()[0])
        >>> pde.laplacian(x**2, grid, lower=0.0, upper=1.0)  # exact: u'' = 2
        Array([2., 2., 2., 2.], dtype=float64)
    """
    fn = "laplacian"
    u = _field(u, grid, "u", fn)
    lows = _side_values(lower, grid, "lower", fn)
    highs = _side_values(upper, grid, "upper", fn)
    out = jnp.zeros_like(u)
    for axis in range(grid.ndim):
        below, above = _shifts(_extended(u, grid, axis, lows[axis], highs[axis], fn), axis,
                               grid.shape[axis])
        out = out + (below - 2 * u + above) * (1.0 / grid.spacing[axis] ** 2)
    return out


def gradient(u: Any, grid: Grid, *, lower: Any = None, upper: Any = None) -> jax.Array:
    r"""The gradient :math:`\nabla u` by second-order central differences.

    .. math::

        (\partial_k u)_i = \frac{u_{i + e_k} - u_{i - e_k}}{2 h_k}

    with the same ghost points as :func:`laplacian` (periodic edge, Dirichlet value,
    Neumann mirror ``u_0 - h g``). Second order at interior points; first order at a
    Neumann boundary point, where the ghost value is exact for quadratics only (LeVeque
    2007, (1.3) and section 2.12). Central differences do not damp the highest
    frequency: for advection-dominated transport add diffusion or use an upwind scheme.

    Args:
        u: Field of shape ``grid.shape + extra``; float32 or float64, kept.
        grid: The :class:`Grid`.
        lower, upper: Boundary values, as for :func:`laplacian`.

    Returns:
        ``u.shape + (grid.ndim,)``: component ``k`` (last axis) is ``du/dx_k``.

    References:
        R. J. LeVeque, *Finite Difference Methods for Ordinary and Partial Differential
        Equations*, SIAM, 2007, (1.3) and section 2.12.
    """
    fn = "gradient"
    u = _field(u, grid, "u", fn)
    lows = _side_values(lower, grid, "lower", fn)
    highs = _side_values(upper, grid, "upper", fn)
    parts = []
    for axis in range(grid.ndim):
        below, above = _shifts(_extended(u, grid, axis, lows[axis], highs[axis], fn), axis,
                               grid.shape[axis])
        parts.append((above - below) * (0.5 / grid.spacing[axis]))
    return jnp.stack(parts, axis=-1)


def divergence(flux: Any, grid: Grid, *, lower: Any = None, upper: Any = None) -> jax.Array:
    r"""The divergence :math:`\nabla \cdot F` by second-order central differences.

    .. math::

        (\nabla \cdot F)_i = \sum_k \frac{F_{k, i + e_k} - F_{k, i - e_k}}{2 h_k}

    Component ``F_k`` is differenced along axis ``k`` only, with ghost points from axis
    ``k``'s boundary conditions applied to ``F_k`` (periodic edge; Dirichlet: the value
    of ``F_k`` on the boundary; Neumann: ``dF_k/dx_k`` on the face). Order as for
    :func:`gradient`. The composition ``divergence(gradient(u))`` is a Laplacian on the
    wide stencil of spacing ``2h``, which leaves the highest frequency undamped: use
    :func:`laplacian` for diffusion.

    Args:
        flux: Vector field of shape ``grid.shape + extra + (grid.ndim,)``, component
            ``k`` on the last axis; float32 or float64, kept.
        grid: The :class:`Grid`.
        lower, upper: Boundary values of the normal component on each side, as for
            :func:`laplacian` (broadcast against the face of ``flux[..., k]``).

    Returns:
        ``flux.shape[:-1]``.

    References:
        R. J. LeVeque, *Finite Difference Methods for Ordinary and Partial Differential
        Equations*, SIAM, 2007, (1.3) and section 2.12.
    """
    fn = "divergence"
    flux = _field(flux, grid, "flux", fn)
    if flux.ndim < grid.ndim + 1 or flux.shape[-1] != grid.ndim:
        raise ValueError(f"{fn}: flux has shape {flux.shape}; its last axis must hold the "
                         f"{grid.ndim} components of a vector field on the {grid.ndim}-D grid "
                         f"(shape grid.shape + extra + ({grid.ndim},)).")
    lows = _side_values(lower, grid, "lower", fn)
    highs = _side_values(upper, grid, "upper", fn)
    out = jnp.zeros_like(flux[..., 0])
    for axis in range(grid.ndim):
        component = flux[..., axis]
        below, above = _shifts(_extended(component, grid, axis, lows[axis], highs[axis], fn),
                               axis, grid.shape[axis])
        out = out + (above - below) * (0.5 / grid.spacing[axis])
    return out


# --------------------------------------------------------------------------------------
# sparsity


def _bool_csr(rows: np.ndarray, cols: np.ndarray, n: int) -> scipy.sparse.csr_array:
    """The boolean ``(n, n)`` pattern with true entries at ``(rows, cols)`` (repeats merge),
    with 32-bit indices where they fit (what SUNDIALS-based and older consumers expect)."""
    index = np.int32 if max(n, rows.size) < 2**31 - 1 else np.int64
    m = scipy.sparse.coo_array((np.ones(rows.size, np.int8),
                                (rows.astype(index), cols.astype(index))), shape=(n, n))
    m = m.tocsr()
    m.sum_duplicates()
    return scipy.sparse.csr_array((m.data != 0, m.indices.astype(index, copy=False),
                                   m.indptr.astype(index, copy=False)), shape=(n, n))


def _nonzeros(m: Any) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the entries of sparse ``m`` that are not zero (scipy's
    ``kron`` can store explicit zeros)."""
    coo = scipy.sparse.coo_array(m)
    keep = coo.data != 0
    return coo.row[keep], coo.col[keep]


def _axis_pattern(n: int, bc: tuple[str, str], centre: bool) -> scipy.sparse.csr_array:
    """Pattern of a 3-point stencil on one axis: neighbours, the centre if ``centre``, the
    wrap-around of a periodic axis, and the centre of a Neumann edge (its ghost is a
    function of the edge point)."""
    i = np.arange(n)
    rows = [i[1:], i[:-1]]
    cols = [i[:-1], i[1:]]
    if centre:
        rows.append(i), cols.append(i)
    lo, hi = bc
    if lo == "periodic":
        rows.append(np.array([0, n - 1])), cols.append(np.array([n - 1, 0]))
    if lo == "neumann":
        rows.append(np.array([0])), cols.append(np.array([0]))
    if hi == "neumann":
        rows.append(np.array([n - 1])), cols.append(np.array([n - 1]))
    return _bool_csr(np.concatenate(rows), np.concatenate(cols), n)


def _union_over_axes(grid: Grid, centre: bool) -> scipy.sparse.csr_array:
    """OR over axes of ``I x ... x P_k x ... x I`` (C order: the last axis varies fastest)."""
    rows, cols = [], []
    for axis, (n, bc) in enumerate(zip(grid.shape, grid.bc, strict=True)):
        before = math.prod(grid.shape[:axis])
        after = math.prod(grid.shape[axis + 1:])
        p = _axis_pattern(n, bc, centre)
        p = scipy.sparse.kron(scipy.sparse.eye_array(before, dtype=np.int8),
                              scipy.sparse.kron(p.astype(np.int8),
                                                scipy.sparse.eye_array(after, dtype=np.int8)),
                              format="coo")
        rows.append(_nonzeros(p)[0]), cols.append(_nonzeros(p)[1])
    return _bool_csr(np.concatenate(rows), np.concatenate(cols), grid.size)


def laplacian_pattern(grid: Grid) -> scipy.sparse.csr_array:
    """Jacobian pattern of :func:`laplacian` on the grid points.

    Returns:
        A boolean ``scipy.sparse.csr_array`` of shape ``(grid.size, grid.size)``: entry
        ``(i, j)`` is true where the Laplacian at point ``i`` (C order over the grid)
        depends on ``u`` at point ``j``: the centre, the two neighbours along each axis and
        the wrap-around of periodic axes (``1 + 2 d`` entries per row away from Dirichlet
        and Neumann boundaries). Dirichlet ghosts are constants and add nothing; a Neumann
        ghost falls on the centre.
    """
    _check_grid(grid, "laplacian_pattern")
    return _union_over_axes(grid, centre=True)


def gradient_pattern(grid: Grid) -> scipy.sparse.csr_array:
    """Jacobian pattern of :func:`gradient` on the grid points, over all its components.

    Entry ``(i, j)`` is true where some component of the gradient at point ``i`` depends
    on ``u`` at point ``j``: the two neighbours along each axis, the wrap-around of
    periodic axes, and the point itself at a Neumann edge (its ghost is ``u_0 - h g``). It
    is the pattern of any point-wise combination of the components, such as ``v . grad u``
    with ``v`` given.

    Returns:
        A boolean ``scipy.sparse.csr_array`` of shape ``(grid.size, grid.size)``.
    """
    _check_grid(grid, "gradient_pattern")
    return _union_over_axes(grid, centre=False)


def divergence_pattern(grid: Grid) -> scipy.sparse.csr_array:
    """Jacobian pattern of ``divergence(F(u))`` on the grid points, for a flux ``F``
    computed point by point from ``u``.

    The divergence differences component ``k`` along axis ``k`` with the stencil of
    :func:`gradient`, so over all components it couples the same points as
    :func:`gradient_pattern` (which it returns).

    Returns:
        A boolean ``scipy.sparse.csr_array`` of shape ``(grid.size, grid.size)``.
    """
    _check_grid(grid, "divergence_pattern")
    return _union_over_axes(grid, centre=False)


def _check_grid(grid: Any, fn: str) -> None:
    if not isinstance(grid, Grid):
        raise TypeError(f"{fn}: grid must be a simlib.pde.Grid, got {type(grid).__name__}.")


def pattern(grid: Grid, *operators: Any, species: int = 1, reaction: Any = True,
            layout: str = "interleaved") -> scipy.sparse.csr_array:
    """Jacobian sparsity of a system of ``species`` fields on ``grid``.

    For a vector field of the form ``f_s(u) = sum_op D_s op(u_s) + R_s(u at the same
    point)`` (reaction-diffusion, advection-reaction, ...), the Jacobian is the OR of the
    spatial patterns acting on each species alone and the point-wise coupling of the
    species:

    ``S = OR_op kron(P_op, diag(species it moves)) OR kron(I, reaction)``

    (for ``layout="interleaved"``; the Kronecker factors swap for ``"blocked"``).

    Args:
        grid: The :class:`Grid`.
        *operators: Spatial patterns of shape ``(grid.size, grid.size)``, from
            :func:`laplacian_pattern`, :func:`gradient_pattern`, ... (or any boolean
            matrix of that shape). Each one acts on every species, or give a sequence of
            ``species`` items (a pattern, or ``None`` for a species it does not act on).
        species: Number of fields per grid point (``>= 1``).
        reaction: The point-wise coupling: ``True`` (default) when every species' rate
            may depend on every species at the same point, ``False`` for no point-wise
            term, or a boolean ``(species, species)`` array ``R`` with ``R[a, b]`` true
            where species ``a``'s rate depends on species ``b`` at the same point.
        layout: Order of the flattened state. ``"interleaved"`` (default): the array of
            shape ``grid.shape + (species,)`` flattened in C order, the species of a point
            next to each other (simlib's layout; banded in 1-D). ``"blocked"``: one whole
            field after the other, the order of ``(species,) + grid.shape`` and of a tuple
            of ``species`` fields flattened by ``jax.flatten_util.ravel_pytree``.

    Returns:
        A boolean ``scipy.sparse.csr_array`` of shape ``(n, n)``, ``n = grid.size *
        species``, in the order of the flattened state: the ``jac_sparsity`` of a stiff
        solve (simlib's, or scipy's ``solve_ivp``).

    Example:
        >>> from simlib import pde
        >>> grid = pde.Grid((32, 32), spacing=1 / 31, bc="periodic")
        >>> S = pde.pattern(grid, pde.laplacian_pattern(grid), species=2)
        >>> S.shape, S.nnz  # per row: 4 neighbours, itself and the other species
        ((2048, 2048), 12288)
    """
    _check_grid(grid, "pattern")
    if isinstance(species, bool) or not isinstance(species, (int, np.integer)) or species < 1:
        raise ValueError(f"pattern: species must be an integer >= 1, got {species!r}.")
    if layout not in ("interleaved", "blocked"):
        raise ValueError(f"pattern: layout must be 'interleaved' or 'blocked', got {layout!r}.")
    n, s = grid.size, int(species)

    def place(spatial, coupling):
        a, b = (spatial, coupling) if layout == "interleaved" else (coupling, spatial)
        return scipy.sparse.kron(a, b, format="coo")

    def spatial(p, where):
        p = scipy.sparse.csr_array(p)
        if p.shape != (n, n):
            raise ValueError(f"pattern: {where} has shape {p.shape}; a spatial pattern on this "
                             f"grid is ({n}, {n}) (grid.size squared).")
        return (p != 0).astype(np.int8)

    parts = []
    for i, op in enumerate(operators):
        if isinstance(op, (list, tuple)):
            if len(op) != s:
                raise ValueError(f"pattern: operators[{i}] has {len(op)} items; give one per "
                                 f"species ({s}), None where it does not act.")
            for k, p in enumerate(op):
                if p is not None:
                    e = np.zeros((s, s), np.int8)
                    e[k, k] = 1
                    parts.append(place(spatial(p, f"operators[{i}][{k}]"), e))
        else:
            parts.append(place(spatial(op, f"operators[{i}]"), np.eye(s, dtype=np.int8)))
    if reaction is True:
        r = np.ones((s, s), np.int8)
    elif reaction is False or reaction is None:
        r = None
    else:
        r = np.asarray(reaction)
        if r.shape != (s, s):
            raise ValueError(f"pattern: reaction has shape {r.shape}; it must be True, False or "
                             f"a ({s}, {s}) boolean array.")
        r = (r != 0).astype(np.int8)
    if r is not None:
        parts.append(place(scipy.sparse.eye_array(n, dtype=np.int8), r))
    if not parts:
        return _bool_csr(np.zeros(0, int), np.zeros(0, int), n * s)
    rows = np.concatenate([_nonzeros(p)[0] for p in parts])
    cols = np.concatenate([_nonzeros(p)[1] for p in parts])
    return _bool_csr(rows, cols, n * s)


def bandwidth(sparsity: Any) -> tuple[int, int]:
    """The ``(lower, upper)`` bandwidth of a Jacobian pattern.

    ``lower = max(i - j)`` and ``upper = max(j - i)`` over the nonzero entries ``(i, j)``
    (zero when there are none): the ``jac_bandwidth`` of a banded solve. A periodic axis
    couples the first and last points, so its pattern is as wide as the matrix; in 2-D
    and 3-D the bandwidth is at least the size of a grid plane times the species.

    Args:
        sparsity: A boolean array or scipy sparse matrix (e.g. from :func:`pattern`).

    Example:
        >>> from simlib import pde
        >>> grid = pde.Grid((100,), spacing=0.01, bc="dirichlet")
        >>> pde.bandwidth(pde.pattern(grid, pde.laplacian_pattern(grid), species=2))
        (2, 2)
    """
    m = scipy.sparse.coo_array(sparsity)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"bandwidth: sparsity must be a square matrix, got shape {m.shape}.")
    m.sum_duplicates()
    rows, cols = (a.astype(np.int64) for a in _nonzeros(m))
    if rows.size == 0:
        return (0, 0)
    return (int(max(0, np.max(rows - cols))), int(max(0, np.max(cols - rows))))


# --------------------------------------------------------------------------------------
# preconditioners


def _axis_eigenvalues(n: int, h: float, bc: tuple[str, str], half: bool) -> np.ndarray:
    """Eigenvalues of the 1-D second difference on one axis in its transform's order:
    ``-(4/h^2) sin^2(pi k / n)`` for a periodic axis (the DFT; ``k <= n // 2`` with
    ``half``, for ``rfft``), ``-(4/h^2) sin^2(pi k / (2 n))`` for homogeneous Neumann on
    both sides (the DCT-II; LeVeque 2007, sections 2.10 and 3.2)."""
    k = np.arange(n // 2 + 1 if half else n)
    arg = np.pi * k / n if bc == ("periodic", "periodic") else np.pi * k / (2 * n)
    return -(4.0 / h**2) * np.sin(arg) ** 2


def _grid_eigenvalues(grid: Grid, half_last: bool) -> np.ndarray:
    """The Laplacian's eigenvalues on the grid, ``sum_k lambda_k`` over the axes' spectra
    (:func:`_axis_eigenvalues`), broadcast to the transform's shape; ``half_last``: the
    last axis halved, as ``rfftn`` returns it."""
    ndim = grid.ndim
    lam = np.zeros((1,) * ndim)
    for a, (n, h) in enumerate(zip(grid.shape, grid.spacing, strict=True)):
        ev = _axis_eigenvalues(n, h, grid.bc[a], half=half_last and a == ndim - 1)
        lam = lam + ev.reshape([-1 if b == a else 1 for b in range(ndim)])
    return lam


def _paired_fft_preconditioner(grid: Grid, d: np.ndarray, species: int,
                               layout: str) -> Callable[[Any, jax.Array], jax.Array]:
    """:func:`diffusion_preconditioner` on a periodic grid whose species pair up with equal
    diffusivities (``d[2p] == d[2p + 1]``): each pair is one complex field ``u_{2p} + i
    u_{2p+1}`` and the real operator acts on both parts at once, so one complex FFT of the
    grid serves two species. The transformed axes are the minor ones, so no transposes of
    ``rfftn``'s ``species``-last layout are needed (on the CPU, about 0.7x the time of
    the ``rfftn`` form on a 128 x 128 x 2 state)."""
    ndim, pairs = grid.ndim, species // 2
    lam = _grid_eigenvalues(grid, half_last=False)[None] * d[0::2].reshape(
        (pairs,) + (1,) * ndim)                                       # (pairs, spectrum...)
    axes = tuple(range(1, ndim + 1))

    def precondition(c, x):
        if layout == "interleaved":   # grid..., pairs, 2 -> pairs, grid...
            u = jnp.moveaxis(x.reshape(grid.shape + (pairs, 2)), ndim, 0)
            re, im = u[..., 0], u[..., 1]
        else:                         # pairs, 2, grid...
            u = x.reshape((pairs, 2) + grid.shape)
            re, im = u[:, 0], u[:, 1]
        z = lax.complex(re, im)
        denom = 1.0 - jnp.asarray(c, x.dtype) * jnp.asarray(lam, x.dtype)
        z = jnp.fft.ifftn(jnp.fft.fftn(z, axes=axes) / denom, axes=axes)
        if layout == "interleaved":
            out = jnp.stack([z.real, z.imag], axis=-1)                # pairs, grid..., 2
            out = jnp.moveaxis(out, 0, ndim)                          # grid..., pairs, 2
        else:
            out = jnp.stack([z.real, z.imag], axis=1)                 # pairs, 2, grid...
        return out.astype(x.dtype).reshape(-1)

    return precondition


def diffusion_preconditioner(grid: Grid, diffusivity: Any, *, species: int = 1,
                             layout: str = "interleaved") -> Callable[[Any, jax.Array],
                                                                      jax.Array]:
    r"""The exact inverse of a system's diffusion part, :math:`(I - c D \nabla^2_h)^{-1}`,
    for :class:`simlib.NewtonKrylov`'s ``preconditioner``.

    For ``u_t = D lap(u) + R(u)`` the Newton matrix of an implicit step is
    :math:`I - c (D \nabla^2_h + R'(u))`; this solves the first two terms exactly, in
    :math:`O(n \log n)`: :func:`laplacian`'s stencil is diagonal in the discrete Fourier
    basis on a periodic axis and in the cosine basis (DCT-II) on an axis with Neumann
    sides, so

    .. math::

        z = T^{-1} \left[ T x \,/\, (1 - c D_s \textstyle\sum_k \lambda_{k}) \right]

    with :math:`\lambda_k` the eigenvalues of each axis. GMRES then sees only the
    reaction's coupling, and needs a handful of iterations where ILU(0)'s grow with the
    grid (SUNDIALS' CVODE examples precondition the same way; Brown and Hindmarsh,
    Appl. Math. Comput. 31, 40-91, 1989). It assumes ``M = I``; Dirichlet sides (a sine
    transform, which ``jax.numpy`` lacks) are refused.

    Args:
        grid: The :class:`Grid`; every side periodic or Neumann, each axis both alike.
        diffusivity: ``D``: one value, or one per species (a sequence of ``species``).
        species: Fields per grid point.
        layout: The state's order, as in :func:`pattern`: ``"interleaved"`` (the array of
            shape ``grid.shape + (species,)`` flattened) or ``"blocked"``.

    Returns:
        ``precondition(c, x) -> z``, for a flat ``x`` of ``grid.size * species`` values;
        jit- and vmap-able.

    Example:
        >>> import jax.numpy as jnp
        >>> from simlib import pde
        >>> grid = pde.Grid((8, 8), spacing=0.1, bc="periodic")
        >>> p = pde.diffusion_preconditioner(grid, 0.5)
        >>> x = jnp.ones(64)                          # constant: the Laplacian's null space
        >>> bool(jnp.allclose(p(0.01, x), x))
        True
    """
    _check_grid(grid, "diffusion_preconditioner")
    if isinstance(species, bool) or not isinstance(species, (int, np.integer)) or species < 1:
        raise ValueError(f"diffusion_preconditioner: species must be an integer >= 1, got "
                         f"{species!r}.")
    if layout not in ("interleaved", "blocked"):
        raise ValueError(f"diffusion_preconditioner: layout must be 'interleaved' or "
                         f"'blocked', got {layout!r}.")
    for axis, sides in enumerate(grid.bc):
        if sides not in (("periodic", "periodic"), ("neumann", "neumann")):
            raise ValueError(f"diffusion_preconditioner: grid.bc of axis {axis} is {sides}; "
                             "only periodic or Neumann axes (both sides alike) have a fast "
                             "transform here.")
    d = np.asarray(diffusivity, dtype=np.float64)
    if d.ndim > 1 or (d.ndim == 1 and d.shape[0] != species) or not np.all(np.isfinite(d)):
        raise ValueError(f"diffusion_preconditioner: diffusivity must be one finite value or "
                         f"{species} (one per species), got {diffusivity!r}.")
    d = np.broadcast_to(d, (species,))
    ndim = grid.ndim
    periodic = [a for a in range(ndim) if grid.bc[a][0] == "periodic"]
    neumann = [a for a in range(ndim) if grid.bc[a][0] == "neumann"]
    if not neumann and species % 2 == 0 and np.all(d[0::2] == d[1::2]):
        return _paired_fft_preconditioner(grid, d, species, layout)
    real_fft = not neumann                                  # rfftn over every axis
    lam = _grid_eigenvalues(grid, half_last=real_fft)[..., None] * d  # (spectrum..., species)
    shape = grid.shape + (species,)
    axes = tuple(range(ndim))

    def precondition(c, x):
        u = x.reshape(shape) if layout == "interleaved" else jnp.moveaxis(
            x.reshape((species,) + grid.shape), 0, -1)
        denom = 1.0 - jnp.asarray(c, x.dtype) * jnp.asarray(lam, x.dtype)
        if real_fft:
            z = jnp.fft.irfftn(jnp.fft.rfftn(u, axes=axes) / denom, s=grid.shape, axes=axes)
        else:
            if neumann:
                u = jax.scipy.fft.dctn(u, type=2, axes=neumann, norm="ortho")
            if periodic:
                u = jnp.fft.fftn(u, axes=periodic)
            u = u / denom
            if periodic:
                u = jnp.fft.ifftn(u, axes=periodic).real
            z = (jax.scipy.fft.idctn(u, type=2, axes=neumann, norm="ortho") if neumann
                 else u)
        z = z.astype(x.dtype)
        return (z if layout == "interleaved" else jnp.moveaxis(z, -1, 0)).reshape(-1)

    return precondition
