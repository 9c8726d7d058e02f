"""BDF's sums over the rows of its differences ``D`` (shape ``(max_order + 3, n)``) are
written out row by row: the step's program holds no reduction or cumulative sum over
``D``'s row axis (which XLA's CPU backend ran at 1 to 1.5 ms for 8 x 10,000 float64, half
of a 10,000-state solve: docs/pde.md). The solutions are checked against scipy in
tests/test_bdf.py."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp

import simlib as sl

N = 37  # states: no other axis of the program has this size next to D's rows


def _field(t, y, args):
    k = args
    return -k * y + jnp.roll(y, 1) - y


def _eqns(jaxpr):
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from _eqns(sub)


def test_bdf_step_has_no_reduction_over_the_rows_of_its_differences():
    solver = sl.BDF()
    y0 = jnp.ones(N)
    args = jnp.linspace(1.0, 50.0, N)

    def one_step(y0, args):
        state = solver.init(_field, 0.0, y0, args)
        return solver.step(_field, 0.0, y0, 1e-3, args, state)

    jaxpr = jax.make_jaxpr(one_step)(y0, args).jaxpr
    rows = solver.init(_field, 0.0, y0, args).D.shape[0]
    over_rows = [eqn for eqn in _eqns(jaxpr)
                 if eqn.primitive.name in ("reduce_sum", "cumsum", "cumlogsumexp")
                 and eqn.invars[0].aval.shape == (rows, N)
                 and tuple(eqn.params.get("axes", (eqn.params.get("axis"),))) == (0,)]
    assert over_rows == [], [str(e) for e in over_rows]
