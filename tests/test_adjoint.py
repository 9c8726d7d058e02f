"""Gradient strategies (adjoint=): each against central finite differences, and each other."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _finite_differences import central_differences

import simlib as sl
from simlib.systems import kepler, lotka_volterra

P0 = jnp.array([1.5, 1.0, 3.0, 1.0])
Y0 = jnp.array([10.0, 5.0])
TS = jnp.linspace(0.0, 4.0, 9)
Q0, PQ0 = jnp.array([0.5, 0.0]), jnp.array([0.0, np.sqrt(3.0)])  # Kepler, e = 0.5

RK_CASES = {
    "fixed_rk4": dict(solver=sl.RK4(), dt=2e-3),
    "adaptive_tsit5": dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-10, max_steps=1024),
}


def lv_loss(p, adjoint, kw):
    sol = sl.solve(lotka_volterra, Y0, 0.0, 4.0, args=tuple(p), adjoint=adjoint,
                   saveat=sl.SaveAt(ts=TS), **kw)
    return jnp.sum(sol.ys ** 2)


def kepler_loss(q0, mu, adjoint, solver, saveat):
    sol = sl.solve(kepler, (q0, PQ0), 0.0, 10.0, solver=solver, dt=0.01, adjoint=adjoint,
                   args=(mu,), saveat=saveat)
    q, p = sol.ys
    return jnp.sum(q ** 2) + jnp.sum(p ** 3)




@pytest.fixture(scope="module", params=list(RK_CASES))
def rk_case(request):
    kw = RK_CASES[request.param]
    fd = central_differences(lambda p: lv_loss(p, None, kw), P0, 1e-6)
    return kw, fd


@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.Checkpointed(), sl.Checkpointed(5),
                                     sl.ForwardMode()],
                         ids=["direct", "checkpointed", "checkpointed5", "forward"])
def test_runge_kutta_gradients_match_finite_differences(rk_case, adjoint):
    kw, fd = rk_case
    g = np.asarray(jax.grad(lv_loss)(P0, adjoint, kw))
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_runge_kutta_strategies_agree(rk_case):
    kw, _ = rk_case
    gd = np.asarray(jax.grad(lv_loss)(P0, sl.Direct(), kw))
    gc = np.asarray(jax.grad(lv_loss)(P0, sl.Checkpointed(), kw))
    gf = np.asarray(jax.grad(lv_loss)(P0, sl.ForwardMode(), kw))
    np.testing.assert_allclose(gc, gd, rtol=1e-8)
    np.testing.assert_allclose(gf, gd, rtol=1e-8)


@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.Checkpointed(), sl.ForwardMode()],
                         ids=["direct", "checkpointed", "forward"])
@pytest.mark.parametrize("kw", [dict(solver=sl.RK4(), dt=0.01),
                                dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-10)],
                         ids=["fixed", "adaptive"])
def test_gradient_through_a_closed_over_parameter(adjoint, kw):
    """d/dk of y(1) for y' = -k y closed over (not passed in args): -exp(-k)."""

    def final(k):
        return sl.solve(lambda t, y, a: -k * y, jnp.array([1.0]), 0.0, 1.0, adjoint=adjoint,
                        **kw).ys[-1, 0]

    np.testing.assert_allclose(float(jax.grad(final)(2.0)), -np.exp(-2.0), rtol=1e-7)


SYMPLECTIC = [sl.VelocityVerlet(), sl.Yoshida4(), sl.PEFRL()]
SAVES = {"t1": sl.SaveAt(t1=True), "ts": sl.SaveAt(ts=jnp.linspace(0.0, 10.0, 6)),
         "steps": sl.SaveAt(steps=True)}


@pytest.mark.parametrize("solver", SYMPLECTIC, ids=lambda s: type(s).__name__)
@pytest.mark.parametrize("save", list(SAVES))
def test_reversible_agrees_with_direct_and_checkpointed(solver, save):
    grad = jax.grad(kepler_loss, argnums=(0, 1))
    gd = grad(Q0, 1.0, sl.Direct(), solver, SAVES[save])
    gr = grad(Q0, 1.0, sl.Reversible(), solver, SAVES[save])
    gc = grad(Q0, 1.0, sl.Checkpointed(), solver, SAVES[save])
    gf = grad(Q0, 1.0, sl.ForwardMode(), solver, SAVES[save])
    for a, b, c, d in zip(gd, gr, gc, gf, strict=True):
        scale = np.max(np.abs(np.asarray(a)))
        for other in (b, c, d):
            assert np.max(np.abs(np.asarray(other) - np.asarray(a))) <= 1e-8 * scale


@pytest.mark.parametrize("adjoint", [sl.Reversible(), sl.Direct(), sl.Checkpointed(),
                                     sl.ForwardMode()], ids=lambda a: type(a).__name__)
def test_symplectic_gradients_match_finite_differences(adjoint):
    solver, save = sl.VelocityVerlet(), SAVES["ts"]
    g_q, g_mu = jax.grad(kepler_loss, argnums=(0, 1))(Q0, 1.0, adjoint, solver, save)
    fd_q = central_differences(lambda q: kepler_loss(q, 1.0, None, solver, save), Q0, 1e-6)
    fd_mu = central_differences(
        lambda m: kepler_loss(Q0, m[0], None, solver, save), jnp.array([1.0]), 1e-6)
    np.testing.assert_allclose(np.asarray(g_q), fd_q, rtol=1e-6)
    np.testing.assert_allclose(float(g_mu), fd_mu[0], rtol=1e-6)


@pytest.mark.parametrize("solver", [sl.Yoshida4(), sl.PEFRL()], ids=lambda s: type(s).__name__)
def test_fourth_order_symplectic_gradients_match_finite_differences(solver):
    """Yoshida4 and PEFRL: Reversible against central differences (the test above shows
    Direct, Checkpointed and ForwardMode agree with Reversible to 1e-8)."""
    save = SAVES["ts"]
    g_q, g_mu = jax.grad(kepler_loss, argnums=(0, 1))(Q0, 1.0, sl.Reversible(), solver, save)
    fd_q = central_differences(lambda q: kepler_loss(q, 1.0, None, solver, save), Q0, 1e-6)
    fd_mu = central_differences(
        lambda m: kepler_loss(Q0, m[0], None, solver, save), jnp.array([1.0]), 1e-6)
    np.testing.assert_allclose(np.asarray(g_q), fd_q, rtol=1e-6)
    np.testing.assert_allclose(float(g_mu), fd_mu[0], rtol=1e-6)


def test_reversible_under_vmap_matches_direct():
    q0s = Q0 + 0.01 * jnp.arange(3.0)[:, None]

    def ensemble(q0s, adjoint):
        return jnp.sum(jax.vmap(lambda q: kepler_loss(q, 1.0, adjoint, sl.VelocityVerlet(),
                                                      SAVES["t1"]))(q0s))

    gd = jax.grad(ensemble)(q0s, sl.Direct())
    gr = jax.grad(ensemble)(q0s, sl.Reversible())
    np.testing.assert_allclose(np.asarray(gr), np.asarray(gd), rtol=1e-8)


def test_adjoint_errors():
    with pytest.raises(ValueError, match="time-symmetric.*SemiImplicitEuler"):
        sl.solve(kepler, (Q0, PQ0), 0.0, 1.0, solver=sl.SemiImplicitEuler(), dt=0.1,
                 adjoint=sl.Reversible())
    with pytest.raises(ValueError, match="time-symmetric.*RK4"):
        sl.solve(lotka_volterra, Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.1, adjoint=sl.Reversible())
    with pytest.raises(TypeError, match="adjoint must be"):
        sl.solve(lotka_volterra, Y0, 0.0, 1.0, solver=sl.RK4(), dt=0.1, adjoint="direct")
    with pytest.raises(ValueError, match="steps_per_segment"):
        sl.Checkpointed(0)


TIME_CASES = {"fixed": dict(solver=sl.RK4(), dt=0.01),
              "adaptive": dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-10)}


def time_loss(times, adjoint, kw):
    """Saves at t = 0.5, 1 and t1; depends on t0, t1 and (fixed step) the grid."""
    t0, t1 = times[0], times[1]
    sol = sl.solve(lotka_volterra, Y0, t0, t1, args=tuple(P0), adjoint=adjoint,
                   saveat=sl.SaveAt(ts=jnp.stack([0.5, 1.0, t1])), **kw)
    return jnp.sum(sol.ys ** 2)


@pytest.mark.parametrize("case", list(TIME_CASES))
def test_forward_mode_differentiates_the_times(case):
    """d/dt0 and d/dt1 (including a save time at t1): ForwardMode pushes tangents for the
    times it is asked about, equal to Direct and to central differences."""
    kw, times = TIME_CASES[case], jnp.array([0.0, 2.0])
    gf = np.asarray(jax.grad(time_loss)(times, sl.ForwardMode(), kw))
    gd = np.asarray(jax.grad(time_loss)(times, sl.Direct(), kw))
    fd = central_differences(lambda x: time_loss(x, sl.Direct(), kw), times, 1e-6)
    assert np.all(np.abs(gd) > 1e-3)
    np.testing.assert_allclose(gf, gd, rtol=1e-10)
    np.testing.assert_allclose(gf, fd, rtol=1e-6)


def test_forward_mode_gradient_with_respect_to_dt():
    def final(dt, adjoint):
        return jnp.sum(sl.solve(lotka_volterra, Y0, 0.0, 1.0, solver=sl.RK4(), dt=dt,
                                args=tuple(P0), adjoint=adjoint).ys)

    gf = float(jax.grad(final)(0.03, sl.ForwardMode()))
    gd = float(jax.grad(final)(0.03, sl.Direct()))
    np.testing.assert_allclose(gf, gd, rtol=1e-10)
    # 34 steps (the last one short) for every dt within 0.03 +- h: the discrete map is smooth.
    # (measured: the difference quotient converges as h^2 to 1e-7 relative at h = 1e-6)
    fd = central_differences(lambda d: final(d[0], sl.Direct()), jnp.array([0.03]), 1e-6)[0]
    assert abs(fd) > 1e-6
    np.testing.assert_allclose(gd, fd, rtol=1e-6)


def test_reversible_refuses_time_gradients():
    """Reversible treats the time grid as constant: asking for d/dt1 raises instead of
    returning a silent zero; gradients with respect to y0 and args still work."""
    def final(t1, q):
        sol = sl.solve(kepler, (q, PQ0), 0.0, t1, solver=sl.VelocityVerlet(), dt=0.01,
                       adjoint=sl.Reversible())
        return jnp.sum(sol.ys[0] ** 2)

    with pytest.raises(ValueError, match="Reversible.*times"):
        jax.grad(final)(2.0, Q0)
    g = np.asarray(jax.grad(final, argnums=1)(2.0, Q0))
    np.testing.assert_allclose(g, central_differences(lambda q: final(2.0, q), Q0, 1e-6),
                               rtol=1e-6)
