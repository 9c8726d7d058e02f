"""Type aliases shared by the systems modules."""

from __future__ import annotations

from collections.abc import Sequence

import jax
from jax.typing import ArrayLike

Array = jax.Array
"""A JAX array."""

Args = Sequence[ArrayLike] | None
"""Parameters of a vector field, in documented order; ``None`` selects the defaults."""

__all__ = ["Args", "Array", "ArrayLike"]
