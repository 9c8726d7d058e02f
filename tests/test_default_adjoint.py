"""The default gradient strategy (``adjoint=None``, simlib/_auto.py): forward mode for a few
differentiated components, reverse mode otherwise; each against Direct() and central finite
differences, with the choice read from the ``simlib`` logger."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _finite_differences import central_differences

import simlib as sl
from simlib import particles as sp
from simlib._auto import FORWARD_MODE_MAX
from simlib.systems import lotka_volterra

P0 = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([10.0, 5.0])
TS = jnp.linspace(0.0, 4.0, 9)
FIXED = dict(solver=sl.RK4(), dt=2e-3)          # 2,000 steps: reverse is Checkpointed()
SHORT = dict(solver=sl.RK4(), dt=0.01)          # 400 steps: reverse is Direct()
ADAPTIVE = dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-10, max_steps=1024)


def loss(p, y0=Y0, adjoint=None, kw=FIXED):
    sol = sl.solve(lotka_volterra, y0, 0.0, 4.0, args=tuple(p), adjoint=adjoint,
                   saveat=sl.SaveAt(ts=TS), **kw)
    return jnp.sum(sol.ys ** 2)




def choices(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "simlib"]


@pytest.mark.parametrize("kw", [FIXED, ADAPTIVE], ids=["fixed", "adaptive"])
def test_few_parameters_take_forward_mode(kw, caplog):
    with caplog.at_level(logging.INFO, logger="simlib"):
        g = jax.grad(loss)(P0, Y0, None, kw)
    assert any("chose ForwardMode (4 differentiated" in m for m in choices(caplog))
    fd = central_differences(lambda p: loss(p, Y0, None, kw), P0, 1e-6)
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    np.testing.assert_allclose(g, jax.grad(loss)(P0, Y0, sl.Direct(), kw), rtol=1e-10)


@pytest.mark.parametrize("kw, name", [(FIXED, "Checkpointed()"), (SHORT, "Direct()"),
                                      (ADAPTIVE, "Direct()")], ids=["fixed", "short", "adaptive"])
def test_many_components_take_reverse_mode(kw, name, caplog):
    y0s = Y0 * jnp.linspace(0.9, 1.1, FORWARD_MODE_MAX)[:, None]  # 2 * 16 components
    with caplog.at_level(logging.INFO, logger="simlib"):
        g = jax.grad(lambda y: loss(P0, y, None, kw))(y0s)
    assert any(f"chose {name} ({2 * FORWARD_MODE_MAX} differentiated" in m
               for m in choices(caplog))
    ref = jax.grad(lambda y: loss(P0, y, sl.Direct(), kw))(y0s)
    np.testing.assert_allclose(g, ref, rtol=1e-10)
    fd_row = central_differences(  # one member's row
        lambda y: loss(P0, y0s.at[3].set(y), None, kw), y0s[3], 1e-6)
    np.testing.assert_allclose(g[3], fd_row, rtol=1e-6)


def test_explicit_adjoint_wins(caplog):
    with caplog.at_level(logging.INFO, logger="simlib"):
        jax.grad(loss)(P0, Y0, sl.Checkpointed())
    assert choices(caplog) == []


def test_default_keeps_forward_mode_transformations():
    """A fixed-step default solve is a custom JVP: jvp, jacfwd and hessian still work (and
    the hessian matches Direct's, itself checked against differences of the gradient)."""
    h = jax.hessian(loss)(P0)
    h_direct = jax.hessian(lambda p: loss(p, Y0, sl.Direct()))(P0)
    np.testing.assert_allclose(h, h_direct, rtol=1e-9)
    grad = jax.grad(lambda p: loss(p, Y0, sl.Direct()))
    fd = np.stack([(grad(P0.at[j].add(1e-5)) - grad(P0.at[j].add(-1e-5))) / 2e-5
                   for j in range(4)])
    np.testing.assert_allclose(h, fd, rtol=1e-5)
    _, t = jax.jvp(loss, (P0,), (jnp.array([1.0, 0.0, 0.0, 0.0]),))
    np.testing.assert_allclose(t, jax.grad(loss)(P0)[0], rtol=1e-10)


def test_default_under_vmap_and_jit():
    ps = P0 * jnp.array([[1.0], [1.01], [0.99]])
    g = jax.jit(jax.vmap(jax.grad(loss)))(ps)
    for j in range(3):
        np.testing.assert_allclose(g[j], jax.grad(loss)(ps[j], Y0, sl.Direct()), rtol=1e-10)


def test_closed_over_parameter_gets_its_gradient():
    def closed(a):
        sol = sl.solve(lambda t, y, _: -a * y, jnp.ones(3), 0.0, 1.0, solver=sl.RK4(),
                       dt=1e-3)
        return jnp.sum(sol.ys)
    np.testing.assert_allclose(jax.grad(closed)(0.7), -3 * np.exp(-0.7), rtol=1e-10)


# ---- particles: simulate(adjoint=None) and Checkpointed(steps_per_segment)
N = 6
X0 = jnp.stack([jnp.arange(N) * 1.1, 0.1 * jnp.sin(jnp.arange(N)), jnp.zeros(N)], 1)
V0 = 0.1 * jax.random.normal(jax.random.key(0), (N, 3))
M = jnp.linspace(1.0, 2.0, N)
CHAIN = sp.bond_energy(sp.harmonic, sp.free(), jnp.stack([jnp.arange(N - 1),
                                                          jnp.arange(1, N)], 1))


def chain_loss(k, x0=X0, adjoint=None, n_steps=120, save_every=30):
    t = sp.simulate(CHAIN, sp.State(x0, V0, M), dict(k=k, r0=1.0), space=sp.free(), dt=0.01,
                    n_steps=n_steps, save_every=save_every, adjoint=adjoint)
    return jnp.sum(t.positions[:, :, 0] ** 2) + jnp.sum(t.kinetic_energy) + jnp.sum(
        t.final.velocities)


def test_simulate_default_chooses_by_what_is_differentiated(caplog):
    with caplog.at_level(logging.INFO, logger="simlib"):
        gk = jax.grad(chain_loss)(2.0)
        gx = jax.grad(lambda x: chain_loss(2.0, x))(X0)
    msgs = choices(caplog)
    assert any("simulate: adjoint=None chose ForwardMode (1 differentiated" in m for m in msgs)
    assert any(f"simulate: adjoint=None chose Checkpointed() ({3 * N} differentiated" in m
               for m in msgs)
    fd = (float(chain_loss(2.0 + 1e-6)) - float(chain_loss(2.0 - 1e-6))) / 2e-6
    assert abs(float(gk) - fd) < 1e-6 * abs(fd)
    np.testing.assert_allclose(gx, jax.grad(lambda x: chain_loss(2.0, x, sl.Direct()))(X0),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.slow   # 7 s: a simulate compile per strategy
def test_simulate_takes_forward_mode_and_refuses_a_non_adjoint_with_type_error():
    """docs/gradients.md says simulate takes the same strategies as solve: ForwardMode()
    too (it raised a ValueError), against central differences; a non-adjoint is a
    TypeError, as in solve (it was a ValueError)."""
    g = float(jax.grad(lambda k: chain_loss(k, adjoint=sl.ForwardMode()))(2.0))
    fd = (float(chain_loss(2.0 + 1e-6)) - float(chain_loss(2.0 - 1e-6))) / 2e-6
    assert abs(g - fd) < 1e-6 * abs(fd)
    with pytest.raises(TypeError, match="adjoint must be"):
        chain_loss(2.0, adjoint="checkpointed")
    with pytest.raises(TypeError, match="adjoint must be"):
        sl.solve(lotka_volterra, Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.1, adjoint="checkpointed")


@pytest.mark.parametrize("k", [1, 7, 30, 45, 1000])
def test_simulate_checkpointed_segments_match_direct(k):
    """Segments shorter than, equal to, longer than a frame, and not dividing the run."""
    g = jax.grad(lambda x: chain_loss(2.0, x, sl.Checkpointed(k)))(X0)
    ref = jax.grad(lambda x: chain_loss(2.0, x, sl.Direct()))(X0)
    np.testing.assert_allclose(g, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("k", [7, 333])
def test_solve_checkpointed_segments_with_a_remainder(k):
    g = jax.grad(loss)(P0, Y0, sl.Checkpointed(k))
    np.testing.assert_allclose(g, jax.grad(loss)(P0, Y0, sl.Direct()), rtol=1e-10)


def test_simulate_energy_closing_over_a_traced_value():
    """An energy that closes over the differentiated value: the default falls back to
    reverse mode through the plain scan, and the gradient is still right."""
    def loss(k):
        def energy(x, params, neighbors=None):
            r = jnp.linalg.norm(x[1:] - x[:-1], axis=1)
            return 0.5 * k * jnp.sum((r - 1.0) ** 2)
        t = sp.simulate(energy, sp.State(X0, V0, M), {}, space=sp.free(), dt=0.01,
                        n_steps=60, save_every=30)
        return jnp.sum(t.positions[:, :, 0] ** 2)
    g = jax.grad(loss)(2.0)
    fd = (float(loss(2.0 + 1e-6)) - float(loss(2.0 - 1e-6))) / 2e-6
    assert abs(float(g) - fd) < 1e-6 * abs(fd)
