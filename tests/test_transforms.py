"""solve under jax.jit, jax.vmap and jax.grad; pytree states; compilation caching; dtypes.

Gradients are checked against central finite differences in float64.  With a
relative step ``eps = 1e-6`` the truncation error of the difference quotient is
O(eps^2) ~ 1e-12 and its round-off error ~ 1e-16 / eps = 1e-10 (relative), so a
correct gradient agrees to better than 1e-6.  Through an adaptive solver the
finite difference differentiates the whole discrete map, step-size controller
included, which is what simlib's reverse pass replays; perturbations this small do
not flip any accept/reject decision.
"""

from __future__ import annotations

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import _adaptive, _fixed

A0 = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([1.0, 1.0])
T1 = 3.0
TS = jnp.array([0.4, 1.3, 2.2, 2.9])


def lotka_volterra(t, y, a):
    return jnp.stack([a[0] * y[0] - a[1] * y[0] * y[1], -a[2] * y[1] + a[3] * y[0] * y[1]])


FIXED = {"solver": sl.RK4(), "dt": 0.01}
ADAPTIVE = {"solver": sl.Tsit5(), "rtol": 1e-10, "atol": 1e-10}
MODES = {
    "fixed": FIXED,
    "adaptive": ADAPTIVE,
    "fixed_ts": {**FIXED, "saveat": sl.SaveAt(ts=TS)},
    "adaptive_ts": {**ADAPTIVE, "saveat": sl.SaveAt(ts=TS)},
}


def run(y0, a, kw):
    return sl.solve(lotka_volterra, y0, 0.0, T1, args=a, **kw)


# --------------------------------------------------------------------------------------
# vmap and jit


@pytest.mark.parametrize("mode", sorted(MODES))
def test_vmap_over_y0_equals_loop(mode):
    kw = MODES[mode]
    y0s = jnp.array([[1.0, 1.0], [2.0, 0.5], [0.5, 3.0]])
    batched = jax.vmap(lambda y: run(y, A0, kw))(y0s)
    for i, y0 in enumerate(y0s):
        single = run(y0, A0, kw)
        np.testing.assert_allclose(np.asarray(batched.ys[i]), np.asarray(single.ys), rtol=0,
                                   atol=1e-12)
        np.testing.assert_array_equal(np.asarray(batched.ts[i]), np.asarray(single.ts))
        assert int(batched.stats["num_steps"][i]) == int(single.stats["num_steps"])


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_vmap_over_args_equals_loop(mode):
    kw = MODES[mode]
    args = jnp.stack([A0, A0 * 1.1, A0 * jnp.array([0.8, 1.2, 1.0, 0.9])])
    batched = jax.vmap(lambda a: run(Y0, a, kw))(args)
    for i, a in enumerate(args):
        single = run(Y0, a, kw)
        np.testing.assert_allclose(np.asarray(batched.ys[i]), np.asarray(single.ys), rtol=0,
                                   atol=1e-12)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_jit_equals_eager(mode):
    kw = MODES[mode]
    jitted = jax.jit(lambda y, a: run(y, a, kw))(Y0, A0)
    eager = run(Y0, A0, kw)
    np.testing.assert_allclose(np.asarray(jitted.ys), np.asarray(eager.ys), rtol=0, atol=1e-13)
    np.testing.assert_array_equal(np.asarray(jitted.ts), np.asarray(eager.ts))
    assert int(jitted.stats["num_steps"]) == int(eager.stats["num_steps"])


@pytest.mark.parametrize("saveat", [sl.SaveAt(t1=True), sl.SaveAt(ts=TS)], ids=["t1", "ts"])
def test_traced_dt_equals_eager(saveat):
    @jax.jit
    def traced(dt):
        return sl.solve(lotka_volterra, Y0, 0.0, T1, args=A0, solver=sl.RK4(), dt=dt,
                        saveat=saveat, max_steps=400)

    for dt in (0.01, 0.0125, 0.03):  # 300, 240 and 100 steps, the last one short
        eager = sl.solve(lotka_volterra, Y0, 0.0, T1, args=A0, solver=sl.RK4(), dt=dt,
                         saveat=saveat)
        jitted = traced(dt)
        assert int(jitted.result) == 0
        np.testing.assert_allclose(np.asarray(jitted.ys), np.asarray(eager.ys), rtol=0,
                                   atol=1e-13)
        assert int(jitted.stats["num_steps"]) == int(eager.stats["num_steps"])
        assert float(jitted.stats["t_final"]) == T1


def test_traced_dt_beyond_max_steps_reports_budget():
    @jax.jit
    def traced(dt):
        return sl.solve(lotka_volterra, Y0, 0.0, T1, args=A0, solver=sl.RK4(), dt=dt,
                        max_steps=50, throw=False)

    assert int(traced(0.1).result) == 0  # 30 steps
    assert int(traced(0.01).result) == sl.Result.MAX_STEPS_REACHED  # 300 steps


# --------------------------------------------------------------------------------------
# gradients


def _loss(kw):
    weights = jnp.array([0.7, -1.3])

    def loss(y0, a):
        ys = run(y0, a, kw).ys
        return jnp.sum(jnp.sin(ys) * weights)

    return loss


def _central_difference(fun, x, eps_rel=1e-6):
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for i in range(x.size):
        h = eps_rel * max(1.0, abs(x[i]))
        e = np.zeros_like(x)
        e[i] = h
        out[i] = (float(fun(jnp.asarray(x + e))) - float(fun(jnp.asarray(x - e)))) / (2 * h)
    return out


@pytest.mark.parametrize("mode", sorted(MODES))
def test_grad_matches_finite_differences(mode):
    loss = _loss(MODES[mode])
    g_y0, g_a = jax.grad(loss, argnums=(0, 1))(Y0, A0)
    fd_y0 = _central_difference(lambda y: loss(y, A0), Y0)
    fd_a = _central_difference(lambda a: loss(Y0, a), A0)
    for g, fd in ((g_y0, fd_y0), (g_a, fd_a)):
        g = np.asarray(g)
        assert np.all(np.isfinite(g))
        assert np.linalg.norm(g - fd) <= 1e-6 * np.linalg.norm(fd), (g, fd)


# --------------------------------------------------------------------------------------
# pytree states


def _field_flat(z):
    # A nonlinear, non-separable field on R^7.
    return -0.5 * z + 0.3 * jnp.sin(jnp.roll(z, 1)) + 0.1 * z * jnp.roll(z, -2)


# The pytree state: a tuple holding a dict (leaves of shapes (2,) and ()) and a (2, 2)
# array; leaves of different shapes, nested in both a tuple and a dict.
def _flatten(y):
    d, m = y
    return jnp.concatenate([d["x"], d["s"][None], m.ravel()])


def _unflatten(z):
    return {"x": z[:2], "s": z[2]}, z[3:7].reshape(2, 2)


Z0 = jnp.array([0.5, -1.0, 0.25, 2.0, -0.75, 1.5, 0.1])


@pytest.mark.parametrize(
    "kw",
    [
        FIXED,
        {**FIXED, "saveat": sl.SaveAt(ts=TS)},
        ADAPTIVE,
        {**ADAPTIVE, "saveat": sl.SaveAt(ts=TS)},
    ],
    ids=["fixed", "fixed_ts", "adaptive", "adaptive_ts"],
)
def test_pytree_state_matches_flat_state(kw):
    def f_tree(t, y, args):
        return _unflatten(_field_flat(_flatten(y)))

    def f_flat(t, z, args):
        return _field_flat(z)

    tree = sl.solve(f_tree, _unflatten(Z0), 0.0, T1, **kw)
    flat = sl.solve(f_flat, Z0, 0.0, T1, **kw)
    assert jax.tree_util.tree_structure(tree.ys) == jax.tree_util.tree_structure(_unflatten(Z0))
    n_save = flat.ys.shape[0]
    for leaf, y0_leaf in zip(jax.tree_util.tree_leaves(tree.ys),
                             jax.tree_util.tree_leaves(_unflatten(Z0)), strict=True):
        assert leaf.shape == (n_save,) + y0_leaf.shape
    np.testing.assert_array_equal(np.asarray(tree.ts), np.asarray(flat.ts))
    np.testing.assert_allclose(np.asarray(jax.vmap(_flatten)(tree.ys)), np.asarray(flat.ys),
                               rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------
# no recompilation for new values


def _cache_sizes():
    return _fixed.fixed_jit._cache_size(), _adaptive.adaptive_jit._cache_size()


def test_fixed_step_does_not_recompile_for_new_values():
    def call(y0, a, t1, dt):
        return sl.solve(lotka_volterra, y0, 0.0, t1, args=a, solver=sl.RK4(), dt=dt)

    call(Y0, A0, 1.0, 0.1)
    before = _cache_sizes()
    call(Y0 * 2.0, A0, 1.0, 0.1)  # new y0
    call(Y0, A0 * 0.5, 1.0, 0.1)  # new args
    call(Y0, A0, 1.0, 0.1 + 1e-9)  # new dt, same 10 steps
    out = call(Y0, A0, 1.1, 0.11)  # new t1 and dt, same 10 steps
    assert _cache_sizes() == before
    assert int(out.stats["num_steps"]) == 10


def test_adaptive_does_not_recompile_for_new_values():
    def call(y0, a, t1, rtol, atol, dt=None):
        return sl.solve(lotka_volterra, y0, 0.0, t1, args=a, solver=sl.Tsit5(), rtol=rtol,
                        atol=atol, dt=dt)

    call(Y0, A0, 1.0, 1e-6, 1e-8)
    call(Y0, A0, 1.0, 1e-6, 1e-8, dt=0.01)
    before = _cache_sizes()
    call(Y0 * 2.0, A0, 1.0, 1e-6, 1e-8)  # new y0
    call(Y0, A0 * 0.5, 1.0, 1e-6, 1e-8)  # new args
    call(Y0, A0, 1.0, 1e-7, 1e-8)  # new rtol
    call(Y0, A0, 1.0, 1e-6, 1e-9)  # new atol
    call(Y0, A0, 2.5, 1e-6, 1e-8)  # new t1
    call(Y0, A0, 1.0, 1e-6, 1e-8, dt=0.02)  # new first step
    assert _cache_sizes() == before


# --------------------------------------------------------------------------------------
# dtypes


@pytest.mark.parametrize(
    "kw, tol",
    [
        ({"solver": sl.Tsit5(), "rtol": 1e-5, "atol": 1e-5}, 1e-4),
        ({"solver": sl.RK4(), "dt": 0.05}, 1e-4),
        ({"solver": sl.Tsit5(), "rtol": 1e-5, "atol": 1e-5,
          "saveat": sl.SaveAt(t0=True, ts=[0.5, 1.0])}, 1e-4),
    ],
    ids=["adaptive", "fixed", "adaptive_ts"],
)
def test_float32_stays_float32(kw, tol):
    rate = jnp.float32(0.7)
    sol = sl.solve(lambda t, y, a: -a * y, jnp.array([1.0, 2.0], jnp.float32), 0.0, 1.0,
                   args=rate, **kw)
    assert sol.ys.dtype == jnp.float32
    # time is carried in the default float (float64 under x64), not the state's dtype
    assert sol.ts.dtype == jnp.float64
    exact = np.exp(-0.7 * np.asarray(sol.ts, np.float64))[:, None] * np.array([1.0, 2.0])
    np.testing.assert_allclose(np.asarray(sol.ys, np.float64), exact, rtol=tol)


def test_float32_pytree_symplectic_stays_float32():
    q0, p0 = jnp.ones(2, jnp.float32), jnp.zeros(2, jnp.float32)
    sol = sl.solve(lambda t, y, a: (y[1], -y[0]), (q0, p0), 0.0, 1.0,
                   solver=sl.VelocityVerlet(), dt=0.01)
    assert sol.ys[0].dtype == jnp.float32 and sol.ys[1].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(sol.ys[0][0]), np.cos(1.0), rtol=1e-4)


@pytest.mark.parametrize("kw", [{"solver": sl.Tsit5(), "rtol": 1e-4}, {"solver": sl.RK4(),
                                                                          "dt": 0.1}],
                         ids=["adaptive", "fixed"])
def test_f_promoting_float32_state(kw):
    """A float64 parameter promotes f's result to float64; solve casts it back to the
    state's dtype (documented in solve: the state's dtype wins), so the run succeeds and
    stays float32."""
    y0 = jnp.array([1.0, 2.0], jnp.float32)
    f = lambda t, y, a: -a * y  # noqa: E731
    assert jax.eval_shape(f, 0.0, y0, jnp.float64(0.7)).dtype == jnp.float64
    sol = sl.solve(f, y0, 0.0, 1.0, args=jnp.float64(0.7), **kw)
    assert sol.ys.dtype == jnp.float32 and sol.ts.dtype == jnp.float64
    np.testing.assert_allclose(np.asarray(sol.ys[-1]), np.exp(-0.7) * np.asarray(y0), rtol=1e-4)


def _scan_lengths(jaxpr):
    """The ``length`` of every ``scan`` in a jaxpr, nested ones included."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            out.append(eqn.params["length"])
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                if isinstance(sub, jex.core.ClosedJaxpr):
                    out += _scan_lengths(sub.jaxpr)
                elif isinstance(sub, jex.core.Jaxpr):
                    out += _scan_lengths(sub)
    return out


def test_jit_with_concrete_closed_over_inputs():
    """Inputs that are concrete inside an outer jit (closed-over arrays, numpy save times)
    still give the host-counted step grid, and failures still raise."""
    y0 = jnp.array([1.0])
    ts = np.linspace(0.0, 1.0, 6)

    @jax.jit
    def run():
        sol = sl.solve(lambda t, y, a: -y, y0, 0.0, 1.0, solver=sl.RK4(), dt=0.01,
                       saveat=sl.SaveAt(ts=ts))
        return sol.ys, sol.stats["num_steps"]

    ys, steps = run()
    np.testing.assert_allclose(np.asarray(ys)[:, 0], np.exp(-ts), rtol=1e-9)
    assert int(steps) == 100
    # The compiled loop itself runs over the grid t0 + k dt (100 steps, plus at most one
    # iteration per save time and one spare), not max_steps + len(ts) = 4102 iterations
    # (the traced path, whose count of non-zero steps would also be 100).
    lengths = _scan_lengths(jax.make_jaxpr(run)().jaxpr)
    assert len(lengths) == 1 and 100 <= lengths[0] <= 100 + len(ts) + 1, lengths

    @jax.jit
    def blow_up():
        return sl.solve(lambda t, y, a: y ** 2, y0, 0.0, 2.0, solver=sl.RK4(), dt=0.1).ys

    with pytest.raises(Exception, match="non-finite"):
        jax.block_until_ready(blow_up())
