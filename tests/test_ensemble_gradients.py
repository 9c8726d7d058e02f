"""Gradients on ensembles (issue 12): the code paths added for batched states.

* ``Checkpointed`` with ``SaveAt(ts=...)``: the save buffer is filled outside the
  recomputed segments (``SaveWrites`` in simlib/_adjoint.py), on a batched state and
  under ``vmap``, save times on and off the step grid, segments that do not divide the
  step count;
* ``ForwardMode`` under ``vmap``, with shared and per-member differentiated inputs, and
  under two nested ``vmap`` (fixed-step runs: since issue 22 the default's custom JVP with
  forward mode forced, tangents inside each member; adaptive runs push them outside the
  members, the ``custom_vmap`` rule in simlib/_auto.py).

Each gradient is compared with central finite differences of the loss and with
``Direct()``'s gradient (reverse mode through the plain loop, a code path that neither
change touches).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _finite_differences import central_differences

import simlib as sl
from simlib.systems import lotka_volterra

P0 = jnp.array([1.5, 1.0, 3.0, 1.0])
T1, N = 2.0, 200
Y0S = jnp.array([10.0, 5.0]) * jnp.exp(
    0.1 * jax.random.normal(jax.random.PRNGKey(0), (6, 2), dtype=jnp.float64))
TS_ON = np.linspace(0.0, T1, 11)  # on the grid of dt = T1 / N
TS_OFF = np.concatenate([TS_ON[:1], TS_ON[1:] - T1 / N / 3])
DATA = jnp.linspace(1.0, 6.0, 12).reshape(6, 2)




def batched_loss(adjoint, ts):
    """A (6, 2) batched state, saved at ``ts``."""
    def loss(p, y0s=Y0S):
        sol = sl.solve(lotka_volterra, y0s, 0.0, T1, solver=sl.RK4(), dt=T1 / N,
                       args=tuple(p), saveat=sl.SaveAt(ts=ts), adjoint=adjoint)
        return jnp.sum(jnp.square(sol.ys - DATA))
    return loss


def vmapped_loss(adjoint, saveat):
    """``vmap`` of a (2,) solve over the 6 members."""
    def one(p, y0):
        return sl.solve(lotka_volterra, y0, 0.0, T1, solver=sl.RK4(), dt=T1 / N,
                        args=tuple(p), saveat=saveat, adjoint=adjoint).ys

    def loss(p, y0s=Y0S):
        return jnp.sum(jnp.square(jax.vmap(one, in_axes=(None, 0))(p, y0s) - DATA[:, None]))
    return loss


@pytest.fixture(scope="module")
def batched_refs():
    return {name: (np.asarray(jax.grad(batched_loss(sl.Direct(), ts))(P0)),
                   central_differences(batched_loss(sl.Direct(), ts), P0))
            for name, ts in (("on", TS_ON), ("off", TS_OFF))}


@pytest.mark.parametrize("ts_name", ["on", "off"])
@pytest.mark.parametrize("adjoint", [sl.Checkpointed(), sl.Checkpointed(7)],
                         ids=["sqrt", "seg7"])
def test_checkpointed_saves_on_a_batched_state(batched_refs, ts_name, adjoint):
    ts = TS_ON if ts_name == "on" else TS_OFF
    loss = batched_loss(adjoint, ts)
    direct, fd = batched_refs[ts_name]
    g = np.asarray(jax.jit(jax.grad(loss))(P0))
    np.testing.assert_allclose(g, direct, rtol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)
    # the saved values themselves: the undifferentiated run writes the buffer in place,
    # the differentiated one scatters it per segment; both are Direct()'s values
    ys_ref = sl.solve(lotka_volterra, Y0S, 0.0, T1, solver=sl.RK4(), dt=T1 / N, args=tuple(P0),
                      saveat=sl.SaveAt(ts=ts), adjoint=sl.Direct()).ys
    val, _ = jax.value_and_grad(loss)(P0)
    assert float(val) == pytest.approx(float(jnp.sum(jnp.square(ys_ref - DATA))), rel=1e-14)


def test_checkpointed_saves_gradient_with_respect_to_the_states():
    loss = batched_loss(sl.Checkpointed(7), TS_OFF)
    g = np.asarray(jax.grad(loss, argnums=1)(P0, Y0S))
    direct = np.asarray(jax.grad(batched_loss(sl.Direct(), TS_OFF), argnums=1)(P0, Y0S))
    np.testing.assert_allclose(g, direct, rtol=1e-12)
    fd = central_differences(lambda y: loss(P0, y), Y0S)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


@pytest.fixture(scope="module")
def vmapped_refs():
    saveat = sl.SaveAt(ts=TS_OFF)
    return saveat, (np.asarray(jax.grad(vmapped_loss(sl.Direct(), saveat))(P0)),
                    central_differences(vmapped_loss(sl.Direct(), saveat), P0))


@pytest.mark.parametrize("adjoint", [sl.Checkpointed(7), sl.ForwardMode()],
                         ids=["checkpointed", "forward"])
def test_vmapped_gradients(vmapped_refs, adjoint):
    saveat, (direct, fd) = vmapped_refs
    g = np.asarray(jax.jit(jax.grad(vmapped_loss(adjoint, saveat)))(P0))
    np.testing.assert_allclose(g, direct, rtol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_forward_mode_under_vmap_per_member_inputs():
    """Differentiated inputs that are batched (each member's own ``y0`` and parameters)
    next to shared ones: the rule's tangents are one-hot per member component."""
    def one(p, scale, y0, adjoint):
        return sl.solve(lotka_volterra, y0, 0.0, T1, solver=sl.RK4(), dt=T1 / N,
                        args=(p[0] * scale, p[1], p[2], p[3]), saveat=sl.SaveAt(t1=True),
                        adjoint=adjoint).ys[-1]

    scales = jnp.linspace(0.9, 1.1, 6)

    def loss(p, scales, y0s, adjoint):
        ys = jax.vmap(one, in_axes=(None, 0, 0, None))(p, scales, y0s, adjoint)
        return jnp.sum(ys[:, 0] * ys[:, 1])

    g = jax.grad(loss, argnums=(0, 1, 2))(P0, scales, Y0S, sl.ForwardMode())
    ref = jax.grad(loss, argnums=(0, 1, 2))(P0, scales, Y0S, sl.Direct())
    for a, b in zip(g, ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)
    fd = central_differences(lambda s: loss(P0, s, Y0S, sl.Direct()), scales)
    np.testing.assert_allclose(np.asarray(g[1]), fd, rtol=1e-6)


def test_forward_mode_under_nested_vmap():
    def one(p, y0, adjoint):
        return sl.solve(lotka_volterra, y0, 0.0, T1, solver=sl.RK4(), dt=T1 / N,
                        args=tuple(p), saveat=sl.SaveAt(ts=TS_ON), adjoint=adjoint).ys

    def loss(p, adjoint):
        inner = jax.vmap(one, in_axes=(None, 0, None))
        ys = jax.vmap(inner, in_axes=(None, 0, None))(p, Y0S.reshape(2, 3, 2), adjoint)
        return jnp.sum(ys ** 2)

    g = np.asarray(jax.grad(loss)(P0, sl.ForwardMode()))
    np.testing.assert_allclose(g, np.asarray(jax.grad(loss)(P0, sl.Direct())), rtol=1e-12)
    np.testing.assert_allclose(g, central_differences(lambda p: loss(p, sl.Direct()), P0),
                               rtol=1e-6)


def test_forward_mode_autodiff_through_checkpointed_saves(batched_refs):
    """``jax.jacfwd`` (a JVP) through ``Checkpointed`` with ``SaveAt(ts)``: the save-buffer
    path is a ``custom_jvp``, so forward-mode autodiff still goes through it."""
    direct, fd = batched_refs["off"]
    g = np.asarray(jax.jacfwd(batched_loss(sl.Checkpointed(7), TS_OFF))(P0))
    np.testing.assert_allclose(g, direct, rtol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)
