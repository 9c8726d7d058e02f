"""The sparse LU's edge cases."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from simlib._linalg._sparse import Sparse


def test_an_empty_system_solves_to_an_empty_vector():
    """Zero states: nothing to factorise (the native kernel is not called), an empty
    solution, with either kernel choice."""
    for kernel in ("auto", "host"):
        ls = Sparse(np.zeros((0, 0), bool), kernel=kernel)
        fac = ls.factor(jnp.zeros(0), jnp.asarray(0.1))
        assert bool(fac.ok)
        assert ls.solve(fac, jnp.zeros(0)).shape == (0,)


def test_a_non_square_pattern_is_refused():
    with pytest.raises(ValueError, match="jac_sparsity must be square"):
        Sparse(np.ones((3, 4), bool))
