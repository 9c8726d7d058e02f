"""The model a particle integrator steps: an energy and the space its positions move in.

jax-md passes an integrator a ``(displacement, shift)`` pair of functions and an energy
closed over them; here the two travel together as one pytree, :class:`Model`, so that the
energy's parameters, the box and the neighbour list stay explicit (differentiable, and
new values do not recompile) and an integrator reads ``model.space.shift`` and
``model.energy_and_forces`` from one argument.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from ._energy import Energy, as_energy
from ._space import Space, box_checked_upstream


@jax.tree_util.register_pytree_node_class
class Model:
    """The energy, with the space in which positions move (a pytree: both are leaves).

    ``model.space.shift(x, dx)`` moves positions (wrapping them into a periodic box) and
    ``model.energy_and_forces(x, params, neighbors)`` returns the potential energy and the
    forces :math:`F = -\\nabla U`, the two calls an :class:`Integrator`'s ``step`` makes.

    Args:
        energy: ``energy(positions, params, neighbors=None)``, from :func:`pair_energy`
            (its direct force path) or any function (forces by ``jax.grad``).
        space: :func:`free` or :func:`periodic`.
        box_checked: The caller has checked a traced box once, at the start, and reports
            it itself (as :func:`simulate` does, with a :class:`~simlib.Result` code), so
            the energy need not turn its outputs into NaN for a bad box at every step.
            ``False`` (default) keeps the energy's own check.

    Example:
        >>> from simlib import particles as sp
        >>> x, box = sp.lattice(3, 0.8442)
        >>> model = sp.Model(sp.pair_energy(sp.lennard_jones, sp.periodic(box), r_cut=2.5),
        ...                  sp.periodic(box))
        >>> e, f = model.energy_and_forces(x, dict(sigma=1.0, epsilon=1.0), None)
        >>> f.shape
        (108, 3)
    """

    energy: Energy
    space: Space

    def __init__(self, energy: Energy | Callable[..., jax.Array], space: Space, *,
                 box_checked: bool = False) -> None:
        if not isinstance(space, Space):
            raise TypeError(f"Model: space must be free() or periodic(box), got {space!r}")
        self.energy = as_energy(energy)
        self.space = space
        self.box_checked = bool(box_checked)

    def tree_flatten(self) -> tuple[tuple, bool]:
        return (self.energy, self.space), self.box_checked

    @classmethod
    def tree_unflatten(cls, box_checked: bool, children: tuple) -> Model:
        model = object.__new__(cls)   # the leaves may be placeholders: no conversion
        model.energy, model.space = children
        model.box_checked = box_checked
        return model

    def __repr__(self) -> str:
        return f"Model({self.energy!r}, {self.space!r})"

    def energy_and_forces(self, positions: jax.Array, params,
                          neighbors=None) -> tuple[jax.Array, jax.Array]:
        """``(U, F)``: the potential energy and the forces at ``positions``."""
        if self.box_checked:
            with box_checked_upstream():
                return self.energy.energy_and_forces(positions, params, neighbors)
        return self.energy.energy_and_forces(positions, params, neighbors)
