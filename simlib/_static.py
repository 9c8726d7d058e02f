"""Objects that are all settings: small immutable pytrees without leaves (solvers, linear
solvers) that compare and hash by their settings, so that they can be static arguments of
compiled functions (a new instance with the same settings reuses the compilation)."""

from __future__ import annotations

from typing import TypeVar

import jax

T = TypeVar("T", bound=type)


def register_static(cls: T) -> T:
    """Register ``cls`` as a pytree with no leaves (the instance is all structure)."""
    jax.tree_util.register_pytree_node(cls, lambda s: ((), s), lambda s, _: s)
    return cls


class Settings:
    """Identity by settings: ``repr``, ``==`` and ``hash`` from :meth:`settings`."""

    def settings(self) -> tuple:
        """``(name, value)`` pairs that, with the class, identify the object: its instance
        attributes, sorted by name (none for a method fixed by its class)."""
        return tuple(sorted(vars(self).items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.settings())
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.settings() == other.settings()

    def __hash__(self) -> int:
        return hash((type(self), self.settings()))
