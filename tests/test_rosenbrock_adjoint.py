"""Reverse mode through a Rosenbrock step: each stage solve ``(M - h gamma J) w = rhs`` is
differentiated as the exact solve it approximates (one transposed solve with the step's
LU per stage), not through its refinement (issue 24: the amplifier's gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import jaxprs_in_params

import simlib as sl
from simlib.systems import TRANSISTOR_AMPLIFIER as AMP

FIXED = tuple(AMP.args[:4])
RC = np.asarray(AMP.args[4:])  # r0..r9, c1..c5 (the capacitances enter through M)


def _args(rc):
    return FIXED + tuple(rc[i] for i in range(15))


def _top_level_solves(jaxpr) -> int:
    """``custom_linear_solve`` equations run by ``jaxpr`` (not those inside one's own
    solve functions)."""
    n = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "custom_linear_solve":
            n += 1
            continue
        for sub in jaxprs_in_params(eqn.params):
            n += _top_level_solves(sub)
    return n


def test_rodas_step_pullback_has_one_transposed_solve_per_stage():
    """The gradient of one Rodas5P step runs its 8 stage solves and 8 transposed ones; the
    refinement differentiated (before) doubled both (32)."""
    f = sl.systems.transistor_amplifier
    solver = sl.Rodas5P()
    from simlib._dae import MassField  # the field a DAE's solver sees (f, M in args)

    field = MassField(f)

    def step(y, rc):
        args = _args(rc)
        y1 = solver.step(field, 0.0, y, 1e-6, (args, AMP.mass_matrix(args)), None)[0]
        return jnp.sum(y1 ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(step, argnums=(0, 1)))(jnp.asarray(AMP.y0),
                                                           jnp.asarray(RC))
    assert _top_level_solves(jaxpr.jaxpr) == 16


@pytest.mark.slow
@pytest.mark.parametrize("solver", [sl.Rodas5P(), sl.Rosenbrock23()], ids=lambda s: str(s))
def test_fixed_step_dae_gradient_matches_central_differences(solver):
    """jax.grad (and jax.jacfwd) of a fixed-step solve of the amplifier with respect to its
    resistances and capacitances against central differences of the same solve."""
    y0 = jnp.asarray(AMP.y0)

    def loss(rc):
        args = _args(rc)
        sol = sl.solve(AMP.vector_field, y0, 0.0, 2e-4, solver=solver, dt=2e-5, args=args,
                       mass_matrix=AMP.mass_matrix(args), initialize="none")
        return jnp.sum(sol.ys[-1] * jnp.arange(1.0, 9.0))

    rc = jnp.asarray(RC)
    grad = np.asarray(jax.jit(jax.grad(loss))(rc))
    fwd = np.asarray(jax.jit(jax.jacfwd(loss))(rc))
    lossj = jax.jit(loss)
    fd = np.empty(15)
    for i in range(15):
        h = 1e-4 * RC[i]  # truncation ~1e-7 relative here, rounding ~1e-9
        fd[i] = (float(lossj(rc.at[i].add(h))) - float(lossj(rc.at[i].add(-h)))) / (2 * h)
    scale = np.abs(fd * RC)  # relative sensitivities p dL/dp: compared where not negligible
    big = scale > 1e-6 * scale.max()
    assert big.sum() >= 10
    np.testing.assert_allclose(grad[big], fd[big], rtol=1e-5)
    np.testing.assert_allclose(fwd[big], fd[big], rtol=1e-5)
