"""Events (simlib/_events.py): crossings located on the dense output, terminal events,
state-changing events, capacity overflow, fixed-step runs, vmap and gradients.

Every figure is checked against something outside simlib: closed forms (a falling and
bouncing ball, a harmonic oscillator, a decaying dose, the Kepler period) and central
finite differences. The measured errors are quoted next to each bound.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl

G = 9.81


def ball(t, y, g):
    """Height and velocity under gravity ``g``."""
    return jnp.stack([y[1], -g + 0.0 * y[0]])


def height(t, y, g):
    return y[0]


def bounce(t, y, g):
    """The floor reverses the velocity with restitution 0.8."""
    return jnp.stack([y[0], -0.8 * y[1]])


def bounce_times(h0: float, e: float, n: int, g: float = G) -> np.ndarray:
    """Closed form: first impact at sqrt(2 h0/g) with speed v = g t_1; after the k-th
    bounce the ball leaves with e^k v and flies 2 e^k v / g."""
    t = [math.sqrt(2 * h0 / g)]
    v = g * t[0]
    for k in range(1, n):
        t.append(t[-1] + 2 * e**k * v / g)
    return np.array(t)


# -- crossings against closed forms ----------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12),
                                dict(solver=sl.RK4(), dt=0.05)], ids=["tsit5", "rk4-fixed"])
def test_bouncing_ball_bounce_times_match_closed_form(kw):
    ev = sl.Event(height, terminal=False, direction=-1, apply=bounce, capacity=6)
    # Bounces accumulate at t = 4.06 (Zeno); stop well before, after five bounces.
    sol = sl.solve(ball, jnp.array([1.0, 0.0]), 0.0, 3.0, args=G, events=ev, **kw)
    rec = sol.events[0]
    assert int(rec.count) == 6
    ref = bounce_times(1.0, 0.8, 6)
    # measured: 2e-15 (Tsit5 and RK4 are exact on a parabola; round-off only)
    np.testing.assert_allclose(np.asarray(rec.ts), ref, rtol=0, atol=1e-12)
    # the recorded state is the one before apply: on the floor, falling at e^(k-1) v
    v = G * ref[0]
    np.testing.assert_allclose(np.asarray(rec.ys[:, 1]), -v * 0.8 ** np.arange(6), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(rec.ys[:, 0]), 0.0, atol=1e-12)
    assert float(sol.ts[-1]) == 3.0 and int(sol.result) == 0


def kepler(t, y, mu):
    r3 = jnp.sum(y[:2] ** 2) ** 1.5
    return jnp.concatenate([y[2:], -mu * y[:2] / r3])


def radial_velocity(t, y, mu):
    """r . v: rises through zero at periapsis, falls through zero at apoapsis."""
    return jnp.dot(y[:2], y[2:])


def test_kepler_periapsis_passages_match_the_period():
    e, a, mu = 0.6, 1.0, 1.0
    period = 2 * math.pi * math.sqrt(a**3 / mu)
    y0 = jnp.array([a * (1 - e), 0.0, 0.0, math.sqrt(mu * (1 + e) / (a * (1 - e)))])
    peri = sl.Event(radial_velocity, terminal=False, direction=+1, capacity=4)
    apo = sl.Event(radial_velocity, terminal=False, direction=-1, capacity=4)
    sol = sl.solve(kepler, y0, 0.0, 3.25 * period, solver=sl.Dopri8(), rtol=1e-11,
                   atol=1e-13, args=mu, events=[peri, apo])
    p, q = sol.events
    assert int(p.count) == 3 and int(q.count) == 3  # t = 0 is on the zero: not a crossing
    # measured: relative 1.9e-11 and 1.5e-11 (the orbit is integrated to rtol 1e-11)
    np.testing.assert_allclose(np.asarray(p.ts[:3]), period * np.arange(1, 4), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(q.ts[:3]), period * (np.arange(3) + 0.5),
                               rtol=1e-9)
    # at periapsis the state is back at y0
    np.testing.assert_allclose(np.asarray(p.ys[:3]), np.tile(np.asarray(y0), (3, 1)),
                               atol=1e-7)


def oscillator(t, y, w):
    return jnp.stack([y[1], -(w**2) * y[0]])


def position(t, y, w):
    return y[0]


@pytest.mark.parametrize(("kw", "tol"), [
    (dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12), 1e-9),  # measured 1.9e-12
    (dict(solver=sl.Bosh3(), rtol=1e-7, atol=1e-9), 1e-6),  # Hermite dense; measured 3.3e-9
    # Rosenbrock23 (order 2) drifts in phase: its own solution lags by 2.3e-5 / w at
    # t = 9.4 (2,831 steps); the located crossings carry that lag and add nothing
    # measurable to it (measured 2.32e-5)
    (dict(solver=sl.Rosenbrock23(), rtol=1e-7, atol=1e-9), 3e-5),
    # fixed step: RK4's phase error (w h)^5 / 120 per step predicts 2e-7 by t = 9.4
    (dict(solver=sl.RK4(), dt=0.02), 3e-7),
], ids=["tsit5", "bosh3", "rosenbrock23", "rk4-fixed"])
def test_oscillator_zero_crossings_at_k_pi_over_omega(kw, tol):
    w = 2.0
    ev = sl.Event(position, terminal=False, direction=0, capacity=8)
    sol = sl.solve(oscillator, jnp.array([0.0, 1.0]), 0.0, 10.0, args=w, events=ev, **kw)
    rec = sol.events[0]
    assert int(rec.count) == 6  # k pi / 2 for k = 1..6 (t = 0 excluded)
    np.testing.assert_allclose(np.asarray(rec.ts[:6]), np.arange(1, 7) * math.pi / w,
                               rtol=0, atol=tol)
    assert np.all(np.isinf(np.asarray(rec.ts[6:])))


def test_fixed_step_symplectic_solver_uses_hermite_interpolant():
    """VelocityVerlet has no dense output: the crossing is located on the cubic Hermite
    through (y, f) at the step's ends."""
    w = 2.0
    ev = sl.Event(lambda t, y, w: y[0][0], terminal=False, capacity=8)
    sol = sl.solve(lambda t, y, w: (y[1], -(w**2) * y[0]), (jnp.array([0.0]), jnp.array([1.0])),
                   0.0, 10.0, solver=sl.VelocityVerlet(), dt=0.005, args=w, events=ev)
    rec = sol.events[0]
    assert int(rec.count) == 6
    # Verlet's phase error ~ t (w h)^2 / 24 = 4e-5 at t = 9.4 dominates; measured 3.9e-5
    np.testing.assert_allclose(np.asarray(rec.ts[:6]), np.arange(1, 7) * math.pi / w,
                               rtol=0, atol=1e-4)


def test_dose_added_at_threshold():
    """c' = -k c; when c falls to 1 a dose of 2 is added: crossings every ln(3)/k."""
    k = 0.7
    dose = sl.Event(lambda t, c, k: c[0] - 1.0, terminal=False, direction=-1,
                    apply=lambda t, c, k: c + 2.0, capacity=8)
    sol = sl.solve(lambda t, c, k: -k * c, jnp.array([4.0]), 0.0, 10.0, solver=sl.Dopri5(),
                   rtol=1e-10, atol=1e-12, args=k, events=dose,
                   saveat=sl.SaveAt(ts=jnp.array([5.0, 10.0])))
    first = math.log(4.0) / k
    ref = first + math.log(3.0) / k * np.arange(8)
    ref = ref[ref < 10.0]
    rec = sol.events[0]
    assert int(rec.count) == len(ref)
    np.testing.assert_allclose(np.asarray(rec.ts[:len(ref)]), ref, rtol=1e-9)
    last = ref[ref < 5.0][-1]
    np.testing.assert_allclose(float(sol.ys[0, 0]), 3.0 * math.exp(-k * (5.0 - last)),
                               rtol=1e-9)


# -- terminal events -------------------------------------------------------------------------


def test_terminal_event_under_vmap_stops_members_at_their_own_times():
    ts = jnp.linspace(0.0, 1.0, 5)
    hit = sl.Event(height, direction=-1)

    @jax.jit
    @jax.vmap
    def run(h0):
        return sl.solve(ball, jnp.stack([h0, 0.0]), 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-10,
                        atol=1e-12, args=G, events=hit, saveat=sl.SaveAt(ts=ts))

    h0 = np.array([0.5, 1.0, 2.0, 8.0])  # the last one does not land before t = 1
    sol = run(jnp.asarray(h0))
    t_hit = np.sqrt(2 * h0 / G)
    landed = t_hit < 1.0
    np.testing.assert_allclose(np.asarray(sol.stats["t_final"])[landed], t_hit[landed],
                               rtol=1e-12)
    assert float(sol.stats["t_final"][-1]) == 1.0
    np.testing.assert_array_equal(np.asarray(sol.events[0].count), landed.astype(int))
    np.testing.assert_array_equal(np.asarray(sol.result), 0)
    # saved values after a member's event are nan; before it, the free fall
    ys = np.asarray(sol.ys[..., 0])
    after = np.asarray(ts)[None, :] > t_hit[:, None]
    assert np.all(np.isnan(ys[after]))
    free = h0[:, None] - 0.5 * G * np.asarray(ts)[None, :] ** 2
    np.testing.assert_allclose(ys[~after], free[~after], rtol=1e-12, atol=1e-12)


def test_fixed_step_terminal_event_and_steps_output():
    hit = sl.Event(height, direction=-1)
    sol = sl.solve(ball, jnp.array([1.0, 0.0]), 0.0, 1.0, solver=sl.RK4(), dt=0.1, args=G,
                   events=hit, saveat=sl.SaveAt(steps=True))
    t_hit = math.sqrt(2 / G)
    assert abs(float(sol.stats["t_final"]) - t_hit) < 1e-14
    ts = np.asarray(sol.ts)
    np.testing.assert_allclose(ts[:5], [0.1, 0.2, 0.3, 0.4, t_hit], rtol=1e-14)
    assert np.all(np.isinf(ts[5:]))


def test_fixed_step_bounces_under_vmap_differ_per_member():
    ev = sl.Event(height, terminal=False, direction=-1, apply=bounce, capacity=5)
    h0 = np.array([0.5, 1.0, 3.0])
    sol = jax.vmap(lambda h: sl.solve(ball, jnp.stack([h, 0.0]), 0.0, 2.0, solver=sl.RK4(),
                                      dt=0.05, args=G, events=ev))(jnp.asarray(h0))
    np.testing.assert_array_equal(np.asarray(sol.result), 0)
    ts = np.asarray(sol.events[0].ts)
    for m, h in enumerate(h0):
        ref = bounce_times(h, 0.8, 5)
        ref = ref[ref < 2.0]
        assert int(sol.events[0].count[m]) == len(ref)
        np.testing.assert_allclose(ts[m, :len(ref)], ref, rtol=0, atol=1e-12)  # 4e-16
        assert np.all(np.isinf(ts[m, len(ref):]))


# -- capacity --------------------------------------------------------------------------------


def test_capacity_overflow_is_reported_never_silent():
    ev = sl.Event(position, terminal=False, capacity=3)
    kw = dict(solver=sl.Tsit5(), rtol=1e-8, atol=1e-10, args=2.0, events=ev)
    sol = sl.solve(oscillator, jnp.array([0.0, 1.0]), 0.0, 10.0, throw=False, **kw)
    assert int(sol.result) == sl.Result.EVENT_CAPACITY_EXCEEDED == 8
    assert int(sol.events[0].count) == 6  # counted, the first three recorded
    np.testing.assert_allclose(np.asarray(sol.events[0].ts), np.arange(1, 4) * math.pi / 2,
                               atol=1e-7)
    with pytest.raises(sl.SolverError, match="capacity") as info:
        sl.solve(oscillator, jnp.array([0.0, 1.0]), 0.0, 10.0, **kw)
    assert info.value.result == sl.Result.EVENT_CAPACITY_EXCEEDED


# -- gradients -------------------------------------------------------------------------------


def _central(fn, x, eps):
    x = np.asarray(x, float)
    out = []
    for i in range(x.size):
        e = np.zeros_like(x)
        e.flat[i] = eps
        out.append((fn(jnp.asarray(x + e)) - fn(jnp.asarray(x - e))) / (2 * eps))
    return np.array(out)


@pytest.mark.slow  # about 10 s of compilation each
@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.ForwardMode()], ids=["direct", "forward"])
def test_event_time_gradient_matches_finite_differences(adjoint):
    """t* of a pendulum reaching theta = 0 from theta0, w.r.t. the length and y0 (no
    closed form for the time; central differences of the solve, and the closed form of
    dt*/dp = -(dg/dp)/(dg/dt) is what the implementation uses, not what it is checked
    against)."""
    hit = sl.Event(lambda t, y, p: y[0], direction=-1)

    def pendulum(t, y, p):
        return jnp.stack([y[1], -9.81 / p[0] * jnp.sin(y[0]) - p[1] * y[1]])

    def t_hit(p, y0):
        sol = sl.solve(pendulum, y0, 0.0, 5.0, solver=sl.Tsit5(), rtol=1e-11, atol=1e-12,
                       args=p, events=hit, adjoint=adjoint, max_steps=256)
        return sol.stats["t_final"]

    p = jnp.array([1.3, 0.2])
    y0 = jnp.array([1.0, 0.3])
    gp, gy = jax.jit(jax.grad(t_hit, argnums=(0, 1)))(p, y0)
    fd_p = _central(lambda q: float(t_hit(q, y0)), p, 1e-5)
    fd_y = _central(lambda z: float(t_hit(p, z)), y0, 1e-5)
    # measured: relative differences 1e-10 (Direct, ForwardMode and Checkpointed alike)
    np.testing.assert_allclose(np.asarray(gp), fd_p, rtol=1e-8)
    np.testing.assert_allclose(np.asarray(gy), fd_y, rtol=1e-8)


@pytest.mark.slow
def test_event_time_gradient_of_falling_ball_matches_closed_form():
    hit = sl.Event(height, direction=-1)

    def t_hit(g, y0):
        return sl.solve(ball, y0, 0.0, 5.0, solver=sl.Tsit5(), rtol=1e-10, atol=1e-12,
                        args=g, events=hit, max_steps=64).events[0].ts[0]

    def exact(g, y0):  # h + v t - g t^2 / 2 = 0
        return (y0[1] + jnp.sqrt(y0[1] ** 2 + 2 * g * y0[0])) / g

    y0 = jnp.array([1.0, 0.5])
    got = jax.jit(jax.grad(t_hit, argnums=(0, 1)))(G, y0)
    ref = jax.grad(exact, argnums=(0, 1))(G, y0)  # derivative of the closed form
    np.testing.assert_allclose(float(got[0]), float(ref[0]), rtol=1e-10)
    np.testing.assert_allclose(np.asarray(got[1]), np.asarray(ref[1]), rtol=1e-10)


@pytest.mark.parametrize("kw", [
    dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12),
    pytest.param(dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12, adjoint=sl.ForwardMode()),
                 marks=pytest.mark.slow),
    pytest.param(dict(solver=sl.RK4(), dt=0.05), marks=pytest.mark.slow),
], ids=["adaptive", "adaptive-forward", "fixed"])
def test_state_after_apply_gradient_matches_finite_differences(kw):
    """The state at t = 1.2, after one bounce at t* ~ 0.5, w.r.t. y0 and g: reverse mode
    through the event time, the apply and the restart, against central differences and
    the closed form."""
    ev = sl.Event(height, terminal=False, direction=-1, apply=bounce, capacity=2)

    def y_at(y0, g):
        sol = sl.solve(ball, y0, 0.0, 1.2, args=g, events=ev, max_steps=64, **kw)
        return sol.ys[-1]

    def exact(y0, g):
        h, v = y0
        t1 = (v + jnp.sqrt(v**2 + 2 * g * h)) / g
        up = 0.8 * (g * t1 - v)
        s = 1.2 - t1
        return jnp.stack([up * s - g * s**2 / 2, up - g * s])

    y0 = jnp.array([1.0, 0.5])
    np.testing.assert_allclose(np.asarray(y_at(y0, G)), np.asarray(exact(y0, G)), rtol=1e-10)
    jac = jax.jit(jax.jacrev(y_at, argnums=(0, 1)))(y0, G)
    ref = jax.jacrev(exact, argnums=(0, 1))(y0, G)
    fd = _central(lambda z: np.asarray(y_at(z, G)), y0, 1e-6).T
    np.testing.assert_allclose(np.asarray(jac[0]), np.asarray(ref[0]), rtol=1e-9)
    np.testing.assert_allclose(np.asarray(jac[1]), np.asarray(ref[1]), rtol=1e-9)
    # measured: 3.6e-14 against the closed form, 3.6e-9 (adaptive) and 2.9e-10 (fixed)
    # against central differences with step 1e-6
    np.testing.assert_allclose(np.asarray(jac[0]), fd, rtol=1e-7)


# -- arguments -------------------------------------------------------------------------------


def test_bad_arguments_raise_naming_them():
    with pytest.raises(TypeError, match="cond"):
        sl.Event(3.0)
    with pytest.raises(ValueError, match="direction"):
        sl.Event(height, direction=2)
    with pytest.raises(ValueError, match="capacity"):
        sl.Event(height, capacity=0)
    with pytest.raises(ValueError, match="terminal"):
        sl.Event(height, terminal="yes")
    with pytest.raises(TypeError, match="apply"):
        sl.Event(height, apply=1)
    kw = dict(solver=sl.Tsit5(), rtol=1e-6, args=G)
    y0 = jnp.array([1.0, 0.0])
    with pytest.raises(TypeError, match=r"events\[0\]"):
        sl.solve(ball, y0, 0.0, 1.0, events=[height], **kw)
    with pytest.raises(ValueError, match="real scalar"):
        sl.solve(ball, y0, 0.0, 1.0, events=sl.Event(lambda t, y, a: y), **kw)
    with pytest.raises(ValueError, match="apply must return"):
        sl.solve(ball, y0, 0.0, 1.0, events=sl.Event(height, apply=lambda t, y, a: y[0]), **kw)
    with pytest.raises(ValueError, match="Reversible"):
        sl.solve(lambda t, y, a: (y[1], -y[0]), (jnp.ones(1), jnp.zeros(1)), 0.0, 1.0,
                 solver=sl.VelocityVerlet(), dt=0.1, adjoint=sl.Reversible(),
                 events=sl.Event(lambda t, y, a: y[0][0]))


def test_adaptive_replay_reproduces_the_event_handling_bitwise():
    """The reverse-mode replay (a bounded scan) takes the very attempts of the forward
    while loop, so the gradient is that of the computation that ran: with bounces (apply
    and restart) the two agree bit for bit, event records included."""
    from simlib import _adaptive
    from simlib._events import EventSet

    ev = sl.Event(height, terminal=False, direction=-1, apply=bounce, capacity=4)
    y0 = jnp.array([1.0, 0.3])

    @jax.jit
    def both(y0):
        events = EventSet.convert((ev,), jnp.asarray(0.0), y0, G)
        inputs = dict(y0=y0, t0=jnp.asarray(0.0), t1=jnp.asarray(2.5), dt0=None,
                      rtol=jnp.asarray(1e-8), atol=jnp.asarray(1e-10), ts=None, args=G,
                      events=events)
        fwd = _adaptive._adaptive_forward(ball, sl.Dopri5(), "steps", 0, 64, **inputs)
        rep = _adaptive._adaptive_replay(ball, sl.Dopri5(), "steps", 0, 64, sl.Direct(),
                                         **inputs)
        return fwd, rep

    (c_f, _, steps_f, ev_f), (c_r, _, steps_r, ev_r) = both(y0)
    assert int(ev_f.counts[0]) == 4
    for a, b in zip(jax.tree_util.tree_leaves((c_f, steps_f, ev_f)),
                    jax.tree_util.tree_leaves((c_r, steps_r, ev_r)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(np.asarray(ev_f.ts[0][:4]),
                               bounce_times_v(1.0, 0.3, 0.8, 4), rtol=1e-9)


def bounce_times_v(h0, v0, e, n, g=G):
    t = [(v0 + math.sqrt(v0**2 + 2 * g * h0)) / g]
    u = g * t[0] - v0
    for k in range(1, n):
        t.append(t[-1] + 2 * e**k * u / g)
    return np.array(t)


def test_adaptive_events_need_dense_output():
    class NoDense(sl.AbstractSolver):
        order, adaptive, fevals_per_step = 1, True, 1

        def step(self, f, t, y, h, args, state):
            k = f(t, y, args)
            return y + h * k, h * k, None, None

    with pytest.raises(ValueError, match="dense output"):
        sl.solve(ball, jnp.array([1.0, 0.0]), 0.0, 1.0, solver=NoDense(), rtol=1e-6, args=G,
                 events=sl.Event(height))


def test_events_none_keeps_the_solution_layout():
    sol = sl.solve(ball, jnp.array([1.0, 0.0]), 0.0, 0.1, solver=sl.Tsit5(), rtol=1e-6,
                   args=G, events=None)
    assert sol.events == () and "events" not in sol.stats
    ts, ys, stats, result = sol  # the four positional fields
    assert ts.shape == (1,)


# -- the docs page runs ----------------------------------------------------------------------


def test_docs_events_page_runs():
    page = Path(__file__).resolve().parent.parent / "docs" / "events.md"
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks
    ns: dict = {}
    for block in blocks:
        exec(compile(block, str(page), "exec"), ns)  # noqa: S102 - our own docs


def test_bouncing_ball_example_runs_and_checks_its_arguments(capsys, tmp_path, monkeypatch):
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "examples" / "bouncing_ball.py"
    spec = importlib.util.spec_from_file_location("bouncing_ball", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.chdir(tmp_path)
    mod.main(["--bounces", "4", "--velocity", "0.3"])
    out = capsys.readouterr().out
    assert "4 bounces" in out
    err = float(re.search(r"max \|error\| = (\S+) s", out).group(1))
    assert err < 1e-11  # against the closed form printed beside it; measured 3e-14
    with pytest.raises(SystemExit):
        mod.main(["--restitution", "1.5"])
    assert not list(tmp_path.iterdir())  # writes nothing (in the working directory) by default
