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


def _d_shaped(jaxpr, rows, primitives):
    return [eqn for eqn in _eqns(jaxpr) if eqn.primitive.name in primitives
            and any(getattr(v.aval, "shape", None) == (rows, N) for v in eqn.outvars)]


def test_bdf_step_updates_its_differences_in_one_elementwise_pass():
    """A step's rescaling and its update by the correction reach ``D`` as one matrix on
    the rows of ``[D; d]``, written out elementwise: no matrix product over ``D`` (the
    rescaling and the update's tail sums were two, each a pass over ``D`` plus a select on
    ``D`` after each: docs/pde.md), and accepting or rejecting the step selects the matrix,
    not a ``D``-shaped array."""
    solver = sl.BDF()
    y0 = jnp.ones(N)
    args = jnp.linspace(1.0, 50.0, N)
    state = solver.init(_field, 0.0, y0, args)
    rows = state.D.shape[0]

    def one_step(y0, args, state):
        return solver.step(_field, 0.0, y0, 1e-3, args, state)

    step_jaxpr = jax.make_jaxpr(one_step)(y0, args, state).jaxpr
    assert _d_shaped(step_jaxpr, rows, ("dot_general", "cumsum")) == []
    assert len(_d_shaped(step_jaxpr, rows, ("select_n",))) <= 1  # the dense output's mask

    _, err, _, state1 = jax.eval_shape(one_step, y0, args, state)

    def propose(accept, ratio, err, state, state1):
        return solver.propose_step(1e-3, ratio, accept, err, state, state1, 1e-6, 1e-6,
                                   sl.PIDController())

    propose_jaxpr = jax.make_jaxpr(propose)(True, 0.5, err, state, state1).jaxpr
    assert _d_shaped(propose_jaxpr, rows, ("select_n", "dot_general")) == []
