"""Spaces: how displacements and positions behave at the boundary.

A space is a small pytree (its box is an array leaf, so ``jax.grad`` can see it) with
``displacement(a, b)`` and ``shift(x, dx)``. ``free()`` is open Euclidean space;
``periodic(box)`` is an orthorhombic box with periodic images, where the displacement is
the minimum image (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed., 2017, §1.6).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.typing import ArrayLike

from .._errors import Result


@jax.tree_util.register_pytree_node_class
class Space:
    """A simulation space. Build one with :func:`free` or :func:`periodic`.

    Attributes:
        box: Side lengths, shape ``()`` (a cube) or ``(d,)``; ``None`` in free space.
        periodic: Whether positions wrap around the box.
    """

    def __init__(self, box: ArrayLike | None, periodic: bool) -> None:
        self.box = box
        self.periodic = periodic

    def tree_flatten(self):
        return (self.box,), self.periodic

    @classmethod
    def tree_unflatten(cls, periodic, children):
        return cls(children[0], periodic)

    def __repr__(self) -> str:
        return f"periodic(box={self.box!r})" if self.periodic else "free()"

    def minimum_image(self, d: jax.Array, axis: int | None = None) -> jax.Array:
        """The minimum image ``d - L round(d / L)`` of displacements ``d`` (``d`` itself in
        free space). The one implementation every energy, neighbour list and observable uses.

        Args:
            d: Displacements: ``(..., dim)`` vectors, or one component when ``axis`` is given.
            axis: Which side length applies to a single component ``d`` (``None``: the box
                broadcasts against the last axis of ``d``).
        """
        if not self.periodic:
            return d
        box = jnp.asarray(self.box, d.dtype)
        if axis is not None and box.ndim:
            box = box[axis]
        return d - box * jnp.round(d / box)

    def displacement(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """``a - b``, the minimum image in a periodic box: ``d - L round(d / L)``."""
        return self.minimum_image(a - b)

    def wrap(self, x: jax.Array) -> jax.Array:
        """Positions mapped into the box ``[0, L)`` (unchanged in free space)."""
        if not self.periodic:
            return x
        box = jnp.asarray(self.box, x.dtype)
        return x - box * jnp.floor(x / box)

    def shift(self, x: jax.Array, dx: jax.Array) -> jax.Array:
        """Move positions ``x`` by ``dx`` and wrap them into the box."""
        return self.wrap(x + dx)

    def volume(self, dim: int) -> jax.Array:
        """The box volume (area in 2D) for ``dim`` dimensions; an error in free space."""
        if not self.periodic:
            raise ValueError("free space has no volume; pressure and density need periodic(box)")
        box = jnp.asarray(self.box)
        return box**dim if box.ndim == 0 else jnp.prod(box)

    def box_vector(self, dim: int, dtype=None) -> jax.Array:
        """The side lengths as a ``(dim,)`` array."""
        box = jnp.asarray(self.box, dtype)
        return jnp.broadcast_to(box, (dim,))


def free() -> Space:
    """Open space without boundaries: ``displacement(a, b) = a - b``."""
    return Space(None, False)


def periodic(box: ArrayLike) -> Space:
    """An orthorhombic periodic box with side lengths ``box`` (a scalar for a cube, or ``(d,)``).

    Positions wrap into ``[0, L)`` and displacements are minimum images, which is exact for
    interactions whose range is below half the shortest side.

    Example:
        >>> import jax.numpy as jnp
        >>> space = periodic(10.0)
        >>> space.displacement(jnp.array([9.5, 0.0]), jnp.array([0.5, 0.0])).tolist()
        [-1.0, 0.0]
    """
    if box is None:
        raise ValueError("periodic: box must be given (a positive scalar or (d,) array); "
                         "use free() for open space")
    if np.ndim(box) > 1:
        raise ValueError(f"periodic: box must be a scalar or a (d,) array, got shape "
                         f"{np.shape(box)}")
    if not isinstance(box, jax.core.Tracer):
        b = np.asarray(box)
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise ValueError(f"periodic: box side lengths must be positive and finite, got {box!r}")
    return Space(jnp.asarray(box) if not isinstance(box, (float, int)) else box, True)


def check_box(space: Space, dim: int, reach: float | None = None, *, caller: str,
              what: str = "r_cut") -> jax.Array | None:
    r"""The one check of a periodic box against positions in ``dim`` dimensions and an
    interaction range ``reach``, eagerly and traced.

    The minimum image is exact only for a range of at most half the shortest side,
    :math:`r_c \le \min_k L_k / 2` (Allen & Tildesley 2017, §1.6); beyond it pairs with
    a second image inside the cutoff are missed. Checked here:

    * the box's shape, always (it is static): a scalar or one side per dimension;
    * a concrete box: each side positive and finite, and ``reach <= min(L) / 2``, or a
      ``ValueError`` naming ``caller``, ``what`` and both values;
    * a traced box (under ``jit``, ``vmap`` or ``grad``): the same conditions in the
      graph, returned as an int32 :class:`~simlib.Result` code (``SUCCESSFUL``,
      ``INVALID_BOX`` or ``BOX_TOO_SMALL``) for the caller to report or to turn into NaN.

    Returns ``None`` when nothing is left to check in the graph (free space, or a box
    that passed the eager check).
    """
    if not space.periodic:
        return None
    shape = np.shape(space.box)
    if len(shape) > 1 or (len(shape) == 1 and shape[0] != dim):
        raise ValueError(f"{caller}: the periodic box has side lengths of shape {shape}, but "
                         f"positions are {dim}-dimensional: give a scalar or {dim} sides")
    if not isinstance(space.box, jax.core.Tracer):
        b = np.asarray(space.box, np.float64)
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise ValueError(f"{caller}: the periodic box's side lengths must be positive "
                             f"and finite, got {space.box!r}")
        half = 0.5 * float(np.min(b))
        if reach is not None and reach > half:
            raise ValueError(f"{caller}: {what}={reach} exceeds half the shortest side of "
                             f"the box ({half:.6g}): minimum images would miss pairs; use "
                             f"a larger box (space=periodic(...)) or a smaller r_cut")
        return None
    if _CHECKED_UPSTREAM.get():
        return None
    b = lax.stop_gradient(jnp.asarray(space.box))
    valid = jnp.all(jnp.isfinite(b) & (b > 0))
    code = jnp.where(valid, jnp.int32(Result.SUCCESSFUL), jnp.int32(Result.INVALID_BOX))
    if reach is not None:
        code = jnp.where(valid & (reach > 0.5 * jnp.min(b)), jnp.int32(Result.BOX_TOO_SMALL),
                         code)
    return code


def nan_unless_valid(code: jax.Array | None, *values):
    """``values`` unchanged where ``code`` (from :func:`check_box`) is zero, else NaN: how a
    function without a :class:`~simlib.Result` path (an energy, its forces, the pressure)
    refuses a traced box that the eager check would have refused."""
    if code is None:
        return values if len(values) != 1 else values[0]
    out = tuple(jnp.where(code == 0, v, jnp.nan) for v in values)
    return out if len(out) != 1 else out[0]


def check_run_box(energy, space: Space, neighbors, dim: int, caller: str) -> jax.Array | None:
    """:func:`check_box` for a run (``simulate``, ``minimize``): the space it moves in,
    the energy's own space (when another one) against the energy's ``r_cut``, and the
    neighbour list's against its ``r_cut + skin``. A ``ValueError`` for a concrete box;
    the first failing in-graph code for traced ones (``None`` when none is traced)."""
    r_cut = getattr(energy, "r_cut", None)
    checks = [(space, r_cut, "the energy's r_cut")]
    own = getattr(energy, "space", None)
    if isinstance(own, Space) and own is not space:
        checks.append((own, r_cut, "the energy's r_cut"))
    if neighbors is not None:
        skin = getattr(neighbors, "skin", 0.0)          # a cell list has none
        checks.append((neighbors.space, neighbors.r_cut + skin,
                       "the neighbour list's r_cut + skin" if skin else
                       "the cell list's r_cut"))
    codes = [check_box(s, dim, reach, caller=caller, what=what) for s, reach, what in checks]
    code = None
    for c in reversed([c for c in codes if c is not None]):
        code = c if code is None else jnp.where(c != 0, c, code)
    return code


# Set while simulate() and minimize() trace their steps: they check the box once, at the
# start, and report it as a Result code; the box does not change during the run, so the
# energies inside need not turn their outputs into NaN at every step.
_CHECKED_UPSTREAM: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "simlib_box_checked_upstream", default=False)


def checked_upstream() -> bool:
    """Whether :func:`box_checked_upstream` is active."""
    return _CHECKED_UPSTREAM.get()


@contextlib.contextmanager
def box_checked_upstream() -> Iterator[None]:
    """Inside this block (while tracing), :func:`check_box` leaves a traced box to the
    caller, which has checked it in the graph already (its static and eager checks stay)."""
    token = _CHECKED_UPSTREAM.set(True)
    try:
        yield
    finally:
        _CHECKED_UPSTREAM.reset(token)
