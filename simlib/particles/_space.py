"""Spaces: how displacements and positions behave at the boundary.

A space is a small pytree (its box is an array leaf, so ``jax.grad`` can see it) with
``displacement(a, b)`` and ``shift(x, dx)``. ``free()`` is open Euclidean space;
``periodic(box)`` is an orthorhombic box with periodic images, where the displacement is
the minimum image (Allen & Tildesley, *Computer Simulation of Liquids*, 2nd ed., 2017, §1.6).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


@jax.tree_util.register_pytree_node_class
class Space:
    """A simulation space. Build one with :func:`free` or :func:`periodic`.

    Attributes:
        box: Side lengths, shape ``()`` (a cube) or ``(d,)``; ``None`` in free space.
        periodic: Whether positions wrap around the box.
    """

    def __init__(self, box, periodic: bool):
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


def periodic(box) -> Space:
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
    if not isinstance(box, jax.core.Tracer):
        b = np.asarray(box)
        if b.ndim > 1:
            raise ValueError(f"periodic: box must be a scalar or a (d,) array, got shape {b.shape}")
        if not np.all(np.isfinite(b)) or np.any(b <= 0):
            raise ValueError(f"periodic: box side lengths must be positive and finite, got {box!r}")
    return Space(jnp.asarray(box) if not isinstance(box, (float, int)) else box, True)
