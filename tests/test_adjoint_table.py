"""The table of docs/gradients.md ("Which transformation works with which strategy"): every
strategy against grad, jacfwd, jacrev, hessian, vmap(grad) and grad(vmap), for a
fixed-step solve, an adaptive solve and simulate. A cell that works must equal Direct()'s
derivative (itself checked against central differences); a cell that does not must raise a
TypeError at trace time, never return a number. The sweep is slow; a few cells run in the
default suite (tests/test_adjoint_mechanism.py, tests/test_adjoint.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import particles as sp

P0 = jnp.array([1.3, 0.7])  # spring constant and initial position
TS = jnp.linspace(0.0, 2.0, 3)


def oscillator(t, y, args):
    q, p = y
    return p, -args * q


def solve_loss(params, adjoint, adaptive):
    k, q0 = params[0], params[1]
    if adaptive:
        sol = sl.solve(lambda t, y, a: jnp.stack([y[1], -a * y[0]]), jnp.stack([q0, 0.5]), 0.0,
                       2.0, solver=sl.Tsit5(), rtol=1e-8, atol=1e-8, args=k, adjoint=adjoint,
                       saveat=sl.SaveAt(ts=TS), max_steps=128)
        return jnp.sum(sol.ys ** 2) + jnp.sum(sol.ys[:, 0] ** 3)
    sol = sl.solve(oscillator, (q0, jnp.asarray(0.5)), 0.0, 2.0, solver=sl.VelocityVerlet(),
                   dt=0.05, args=k, adjoint=adjoint, saveat=sl.SaveAt(ts=TS))
    q, p = sol.ys
    return jnp.sum(q ** 2 + p ** 2) + jnp.sum(q ** 3)


N = 4
X0 = jnp.stack([jnp.arange(N) * 1.1, 0.1 * jnp.sin(jnp.arange(N)), jnp.zeros(N)], 1)
V0 = 0.1 * jax.random.normal(jax.random.key(0), (N, 3))
CHAIN = sp.bond_energy(sp.harmonic, sp.free(), jnp.stack([jnp.arange(N - 1),
                                                          jnp.arange(1, N)], 1))


def simulate_loss(params, adjoint):
    k, shift = params[0], params[1]
    t = sp.simulate(CHAIN, sp.State(X0.at[0, 0].add(shift), V0, 1.0), dict(k=k, r0=1.0),
                    space=sp.free(), dt=0.01, n_steps=40, save_every=20, adjoint=adjoint)
    return jnp.sum(t.positions[:, :, 0] ** 2) + jnp.sum(t.kinetic_energy ** 2)


LOSSES = {"fixed": lambda p, a: solve_loss(p, a, False),
          "adaptive": lambda p, a: solve_loss(p, a, True),
          "simulate": simulate_loss}
ADJOINTS = {"default": None, "Direct": sl.Direct(), "Checkpointed": sl.Checkpointed(),
            "ForwardMode": sl.ForwardMode(), "Reversible": sl.Reversible()}
PS = jnp.stack([P0, P0 * 1.05])


def _sum_vmap(loss):
    return lambda p: jnp.sum(jax.vmap(loss)(jnp.stack([p, 1.05 * p])))


TRANSFORMS = {
    "grad": lambda loss: jax.grad(loss)(P0),
    "jacfwd": lambda loss: jax.jacfwd(loss)(P0),
    "jacrev": lambda loss: jax.jacrev(loss)(P0),
    "hessian": lambda loss: jax.hessian(loss)(P0),
    "vmap(grad)": lambda loss: jax.vmap(jax.grad(loss))(PS),
    "grad(vmap)": lambda loss: jax.grad(_sum_vmap(loss))(P0),
}

# What docs/gradients.md's table says: "refused" cells raise a TypeError at trace time;
# "n/a": the strategy is refused for the run itself (Reversible needs a time-symmetric
# fixed-step method).
REFUSED = {("adaptive", a, t) for a in ("default", "Direct", "Checkpointed", "ForwardMode")
           for t in ("jacfwd", "hessian")} | {
    (case, "Reversible", "jacfwd") for case in ("fixed", "simulate")}
NOT_APPLICABLE = {("adaptive", "Reversible", t) for t in TRANSFORMS}


def expected(case, transform):
    """Direct()'s value of the cell (the adaptive hessian: none; its rows are then not
    compared)."""
    loss = lambda p: LOSSES[case](p, sl.Direct())  # noqa: E731
    if case == "adaptive" and transform in ("jacfwd", "hessian"):
        return None
    return np.asarray(TRANSFORMS[transform](loss))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LOSSES))
def test_direct_matches_finite_differences(case):
    loss = lambda p: LOSSES[case](p, sl.Direct())  # noqa: E731
    g = np.asarray(jax.grad(loss)(P0))
    fd = np.array([(float(loss(P0 + 1e-6 * e)) - float(loss(P0 - 1e-6 * e))) / 2e-6
                   for e in jnp.eye(2)])
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    if case != "adaptive":
        grad = jax.grad(loss)
        h = np.asarray(jax.hessian(loss)(P0))
        fd2 = np.stack([(grad(P0 + 1e-5 * e) - grad(P0 - 1e-5 * e)) / 2e-5 for e in jnp.eye(2)])
        np.testing.assert_allclose(h, fd2, rtol=1e-6, atol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("transform", list(TRANSFORMS))
@pytest.mark.parametrize("adjoint", list(ADJOINTS))
@pytest.mark.parametrize("case", list(LOSSES))
def test_table_cell(case, adjoint, transform):
    loss = lambda p: LOSSES[case](p, ADJOINTS[adjoint])  # noqa: E731
    if (case, adjoint, transform) in NOT_APPLICABLE:
        with pytest.raises(ValueError, match="Reversible"):
            TRANSFORMS[transform](loss)
    elif (case, adjoint, transform) in REFUSED:
        with pytest.raises(TypeError):
            TRANSFORMS[transform](loss)
    else:
        np.testing.assert_allclose(TRANSFORMS[transform](loss), expected(case, transform),
                                   rtol=1e-8, atol=1e-10)
