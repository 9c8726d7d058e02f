"""Tests for simlib.systems against references outside simlib (numpy, scipy)."""

import jax

jax.config.update("jax_enable_x64", True)

import dataclasses  # noqa: E402
import math  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

from simlib import systems  # noqa: E402
from simlib.systems import (  # noqa: E402
    PROBLEMS,
    Problem,
    damped_driven_pendulum,
    double_pendulum,
    double_pendulum_energy,
    get_problem,
    harmonic_oscillator,
    harmonic_oscillator_energy,
    harmonic_oscillator_exact,
    kepler,
    kepler_angular_momentum,
    kepler_elements,
    kepler_energy,
    kepler_exact,
    lorenz,
    lotka_volterra,
    lotka_volterra_invariant,
    solve_kepler_equation,
    van_der_pol,
)

RTOL_IVP = 1e-12
EXACT_TOL = 1e-9
INVARIANT_RTOL = 1e-9

# --------------------------------------------------------------------------- #
# Plain numpy reference implementations                                        #
# --------------------------------------------------------------------------- #


def np_harmonic(t, q, p, k, m):
    return p / m, -k * q


def np_pendulum(t, y, g, L, gamma, A, Omega):
    theta, omega = y
    return np.array([omega, -g / L * np.sin(theta) - gamma * omega + A * np.cos(Omega * t)])


def np_lotka_volterra(t, y, alpha, beta, gamma, delta):
    x, z = y
    return np.array([alpha * x - beta * x * z, -gamma * z + delta * x * z])


def np_lorenz(t, y, sigma, rho, beta):
    x, z1, z2 = y
    return np.array([sigma * (z1 - x), x * (rho - z2) - z1, x * z1 - beta * z2])


def np_van_der_pol(t, y, mu):
    x, v = y
    return np.array([v, mu * (1 - x**2) * v - x])


def np_kepler_flat(t, y, mu):
    q, p = y[:2], y[2:]
    return np.concatenate([p, -mu * q / np.linalg.norm(q) ** 3])


def np_double_pendulum(t, y, m1, m2, L1, L2, g):
    """Euler-Lagrange equations solved as a 2x2 linear system with numpy."""
    th1, th2, w1, w2 = y
    d = th1 - th2
    M = np.array(
        [
            [(m1 + m2) * L1**2, m2 * L1 * L2 * np.cos(d)],
            [m2 * L1 * L2 * np.cos(d), m2 * L2**2],
        ]
    )
    r = np.array(
        [
            -m2 * L1 * L2 * w2**2 * np.sin(d) - (m1 + m2) * g * L1 * np.sin(th1),
            m2 * L1 * L2 * w1**2 * np.sin(d) - m2 * g * L2 * np.sin(th2),
        ]
    )
    acc = np.linalg.solve(M, r)
    return np.array([w1, w2, acc[0], acc[1]])


def np_double_pendulum_textbook(y, m1, m2, L1, L2, g):
    """The widely quoted closed form of the accelerations (a second reference)."""
    th1, th2, w1, w2 = y
    d = th1 - th2
    den = 2 * m1 + m2 - m2 * np.cos(2 * th1 - 2 * th2)
    a1 = (
        -g * (2 * m1 + m2) * np.sin(th1)
        - m2 * g * np.sin(th1 - 2 * th2)
        - 2 * np.sin(d) * m2 * (w2**2 * L2 + w1**2 * L1 * np.cos(d))
    ) / (L1 * den)
    a2 = (
        2
        * np.sin(d)
        * (w1**2 * L1 * (m1 + m2) + g * (m1 + m2) * np.cos(th1) + w2**2 * L2 * m2 * np.cos(d))
    ) / (L2 * den)
    return np.array([a1, a2])


def np_kepler_energy(q, p, mu):
    return 0.5 * np.dot(p, p) - mu / np.linalg.norm(q)


DEFAULTS = {
    "harmonic_oscillator": (1.0, 1.0),
    "damped_driven_pendulum": (9.81, 1.0, 0.5, 1.2, 2.0 / 3.0),
    "lotka_volterra": (1.5, 1.0, 3.0, 1.0),
    "lorenz": (10.0, 28.0, 8.0 / 3.0),
    "van_der_pol": (1.0,),
    "kepler": (1.0,),
    "double_pendulum": (1.0, 1.0, 1.0, 1.0, 9.81),
}


def _perturbed(args, rng):
    return tuple(float(a) * rng.uniform(0.5, 1.5) for a in args)


def _elliptic_state(rng, e_max=0.9):
    """A random bound state: random a, e, orientation, anomaly and sense of rotation."""
    mu = rng.uniform(0.5, 2.0)
    a = rng.uniform(0.5, 3.0)
    e = rng.uniform(0.0, e_max)
    omega = rng.uniform(-np.pi, np.pi)
    nu = rng.uniform(-np.pi, np.pi)
    sense = rng.choice([-1.0, 1.0])
    return _state_from_elements(mu, a, e, omega, nu, sense), mu


def _state_from_elements(mu, a, e, omega, nu, sense=1.0):
    ph = a * (1 - e**2)
    r = ph / (1 + e * np.cos(nu))
    q_pf = np.array([r * np.cos(nu), sense * r * np.sin(nu)])
    v_pf = np.sqrt(mu / ph) * np.array([-np.sin(nu), sense * (e + np.cos(nu))])
    R = np.array([[np.cos(omega), -np.sin(omega)], [np.sin(omega), np.cos(omega)]])
    return R @ q_pf, R @ v_pf


def _relative_drift(values):
    values = np.asarray(values)
    return np.max(np.abs(values - values[0])) / max(abs(values[0]), 1e-300)


# --------------------------------------------------------------------------- #
# Vector fields against numpy                                                  #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", range(5))
def test_harmonic_oscillator_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    args = _perturbed(DEFAULTS["harmonic_oscillator"], rng)
    q, p = rng.normal(size=3), rng.normal(size=3)
    t = rng.uniform(0, 10)
    dq, dp = harmonic_oscillator(t, (jnp.asarray(q), jnp.asarray(p)), args)
    ref_dq, ref_dp = np_harmonic(t, q, p, *args)
    np.testing.assert_allclose(dq, ref_dq, rtol=1e-13)
    np.testing.assert_allclose(dp, ref_dp, rtol=1e-13)


@pytest.mark.parametrize(
    ("fn", "ref", "dim", "scale"),
    [
        (damped_driven_pendulum, np_pendulum, 2, 3.0),
        (lotka_volterra, np_lotka_volterra, 2, None),
        (lorenz, np_lorenz, 3, 20.0),
        (van_der_pol, np_van_der_pol, 2, 3.0),
        (double_pendulum, np_double_pendulum, 4, 4.0),
    ],
    ids=lambda v: getattr(v, "__name__", None),
)
@pytest.mark.parametrize("seed", range(5))
def test_array_vector_fields_match_numpy(fn, ref, dim, scale, seed):
    rng = np.random.default_rng(seed)
    args = _perturbed(DEFAULTS[fn.__name__], rng)
    if scale is None:  # populations must be positive
        y = rng.uniform(0.1, 10.0, size=dim)
    else:
        y = rng.uniform(-scale, scale, size=dim)
    t = rng.uniform(0, 10)
    np.testing.assert_allclose(fn(t, jnp.asarray(y), args), ref(t, y, *args), rtol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_kepler_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.5, 2.0)
    q, p = rng.normal(size=2), rng.normal(size=2)
    dq, dp = kepler(0.0, (jnp.asarray(q), jnp.asarray(p)), (mu,))
    ref = np_kepler_flat(0.0, np.concatenate([q, p]), mu)
    np.testing.assert_allclose(np.concatenate([dq, dp]), ref, rtol=1e-13)


@pytest.mark.parametrize("seed", range(5))
def test_double_pendulum_matches_textbook_form(seed):
    rng = np.random.default_rng(seed)
    args = _perturbed(DEFAULTS["double_pendulum"], rng)
    y = rng.uniform(-4, 4, size=4)
    np.testing.assert_allclose(
        double_pendulum(0.0, jnp.asarray(y), args)[2:],
        np_double_pendulum_textbook(y, *args),
        rtol=1e-11,
        atol=1e-12,
    )


def test_double_pendulum_satisfies_euler_lagrange():
    """d/dt dL/dw - dL/dth = 0, with L written out and differentiated by jax."""
    m1, m2, L1, L2, g = 1.3, 0.7, 0.9, 1.4, 9.81

    def lagrangian(th, w):
        return (
            0.5 * (m1 + m2) * L1**2 * w[0] ** 2
            + 0.5 * m2 * L2**2 * w[1] ** 2
            + m2 * L1 * L2 * w[0] * w[1] * jnp.cos(th[0] - th[1])
            + (m1 + m2) * g * L1 * jnp.cos(th[0])
            + m2 * g * L2 * jnp.cos(th[1])
        )

    @jax.jit
    def euler_lagrange(th, w, acc):
        mass = jax.hessian(lagrangian, argnums=1)(th, w)
        mixed = jax.jacfwd(jax.grad(lagrangian, argnums=1), argnums=0)(th, w)
        dl_dth = jax.grad(lagrangian, argnums=0)(th, w)
        return mass @ acc + mixed @ w - dl_dth

    rng = np.random.default_rng(0)
    for _ in range(5):
        y = jnp.asarray(rng.uniform(-3, 3, size=4))
        th, w = y[:2], y[2:]
        acc = double_pendulum(0.0, y, (m1, m2, L1, L2, g))[2:]
        residual = euler_lagrange(th, w, acc)
        np.testing.assert_allclose(residual, 0.0, atol=1e-11)


# --------------------------------------------------------------------------- #
# Defaults                                                                     #
# --------------------------------------------------------------------------- #

_ARRAY_FIELDS = {
    "damped_driven_pendulum": (damped_driven_pendulum, 2),
    "lotka_volterra": (lotka_volterra, 2),
    "lorenz": (lorenz, 3),
    "van_der_pol": (van_der_pol, 2),
    "double_pendulum": (double_pendulum, 4),
}


@pytest.mark.parametrize("name", sorted(_ARRAY_FIELDS))
def test_default_args_array_fields(name):
    fn, dim = _ARRAY_FIELDS[name]
    y = jnp.asarray(np.random.default_rng(1).uniform(0.5, 2.0, size=dim))
    expected = fn(0.7, y, DEFAULTS[name])
    np.testing.assert_array_equal(fn(0.7, y, None), expected)
    np.testing.assert_array_equal(fn(0.7, y), expected)


def test_default_args_tuple_fields_and_functions():
    rng = np.random.default_rng(2)
    qp = (jnp.asarray(rng.normal(size=2)), jnp.asarray(rng.normal(size=2)))
    pairs = [
        (lambda a: harmonic_oscillator(0.0, qp, a), DEFAULTS["harmonic_oscillator"]),
        (lambda a: harmonic_oscillator_energy(qp, a), DEFAULTS["harmonic_oscillator"]),
        (lambda a: harmonic_oscillator_exact(1.3, qp, a), DEFAULTS["harmonic_oscillator"]),
        (lambda a: kepler(0.0, qp, a), DEFAULTS["kepler"]),
        (lambda a: kepler_energy(qp, a), DEFAULTS["kepler"]),
        (
            lambda a: kepler_exact(1.3, (jnp.array([1.0, 0.0]), jnp.array([0.0, 1.1])), a),
            DEFAULTS["kepler"],
        ),
        (
            lambda a: lotka_volterra_invariant(jnp.array([2.0, 3.0]), a),
            DEFAULTS["lotka_volterra"],
        ),
        (
            lambda a: double_pendulum_energy(jnp.array([0.1, 0.2, 0.3, 0.4]), a),
            DEFAULTS["double_pendulum"],
        ),
    ]
    for fn, defaults in pairs:
        got = jax.tree_util.tree_leaves(fn(None))
        want = jax.tree_util.tree_leaves(fn(defaults))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_default_args_constants():
    assert systems.HARMONIC_OSCILLATOR_DEFAULT_ARGS == DEFAULTS["harmonic_oscillator"]
    assert systems.DAMPED_DRIVEN_PENDULUM_DEFAULT_ARGS == DEFAULTS["damped_driven_pendulum"]
    assert systems.LOTKA_VOLTERRA_DEFAULT_ARGS == DEFAULTS["lotka_volterra"]
    assert systems.LORENZ_DEFAULT_ARGS == DEFAULTS["lorenz"]
    assert systems.VAN_DER_POL_DEFAULT_ARGS == DEFAULTS["van_der_pol"]
    assert systems.KEPLER_DEFAULT_ARGS == DEFAULTS["kepler"]
    assert systems.DOUBLE_PENDULUM_DEFAULT_ARGS == DEFAULTS["double_pendulum"]


# --------------------------------------------------------------------------- #
# Closed-form solutions against scipy                                          #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", range(3))
def test_harmonic_oscillator_exact_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    k, m = _perturbed(DEFAULTS["harmonic_oscillator"], rng)
    q0, p0 = rng.normal(size=3), rng.normal(size=3)
    ts = np.linspace(0.0, 20.0, 41)

    def rhs(t, y):
        dq, dp = np_harmonic(t, y[:3], y[3:], k, m)
        return np.concatenate([dq, dp])

    sol = solve_ivp(
        rhs,
        (0.0, ts[-1]),
        np.concatenate([q0, p0]),
        method="DOP853",
        t_eval=ts,
        rtol=RTOL_IVP,
        atol=RTOL_IVP,
    )
    assert sol.success
    q, p = harmonic_oscillator_exact(jnp.asarray(ts), (jnp.asarray(q0), jnp.asarray(p0)), (k, m))
    assert q.shape == p.shape == (ts.size, 3)
    np.testing.assert_allclose(q, sol.y[:3].T, atol=EXACT_TOL, rtol=0)
    np.testing.assert_allclose(p, sol.y[3:].T, atol=EXACT_TOL, rtol=0)


def _kepler_scipy(q0, p0, mu, ts):
    sol = solve_ivp(
        np_kepler_flat,
        (0.0, ts[-1]),
        np.concatenate([q0, p0]),
        method="DOP853",
        t_eval=ts,
        rtol=RTOL_IVP,
        atol=RTOL_IVP,
        args=(mu,),
    )
    assert sol.success
    return sol.y[:2].T, sol.y[2:].T


def test_kepler_exact_matches_scipy_standard_problem():
    problem = get_problem("kepler")
    q0, p0 = problem.y0
    ts = np.linspace(problem.t0, problem.t1, 101)
    q_ref, p_ref = _kepler_scipy(q0, p0, *problem.args, ts)
    q, p = kepler_exact(jnp.asarray(ts), (jnp.asarray(q0), jnp.asarray(p0)), problem.args)
    assert q.shape == p.shape == (ts.size, 2)
    np.testing.assert_allclose(q, q_ref, atol=EXACT_TOL, rtol=0)
    np.testing.assert_allclose(p, p_ref, atol=EXACT_TOL, rtol=0)


@pytest.mark.parametrize("seed", range(8))
def test_kepler_exact_matches_scipy_random_orbits(seed):
    rng = np.random.default_rng(100 + seed)
    (q0, p0), mu = _elliptic_state(rng, e_max=0.8)
    period = 2 * np.pi * np.sqrt(kepler_elements((q0, p0), (mu,)).a ** 3 / mu)
    ts = np.linspace(0.0, 2.0 * float(period), 61)
    q_ref, p_ref = _kepler_scipy(q0, p0, mu, ts)
    q, p = kepler_exact(jnp.asarray(ts), (jnp.asarray(q0), jnp.asarray(p0)), (mu,))
    # Scale-free comparison: positions relative to a, velocities relative to the
    # periapsis speed.
    scale_q = np.max(np.linalg.norm(q_ref, axis=1))
    scale_p = np.max(np.linalg.norm(p_ref, axis=1))
    np.testing.assert_allclose(q / scale_q, q_ref / scale_q, atol=EXACT_TOL, rtol=0)
    np.testing.assert_allclose(p / scale_p, p_ref / scale_p, atol=EXACT_TOL, rtol=0)


def test_kepler_exact_circular_orbit_and_gradient():
    r, mu = 2.0, 1.5
    v = np.sqrt(mu / r)
    y0 = (jnp.array([0.0, r]), jnp.array([-v, 0.0]))
    ts = np.linspace(0.0, 10.0, 11)
    q, p = kepler_exact(jnp.asarray(ts), y0, (mu,))
    angle = np.pi / 2 + v / r * ts
    np.testing.assert_allclose(q, r * np.stack([np.cos(angle), np.sin(angle)], -1), atol=1e-12)
    np.testing.assert_allclose(p, v * np.stack([-np.sin(angle), np.cos(angle)], -1), atol=1e-12)

    def loss(q0):
        return jnp.sum(kepler_exact(3.0, (q0, y0[1]), (mu,))[0])

    assert np.all(np.isfinite(jax.jit(jax.grad(loss))(y0[0])))


def test_kepler_exact_scalar_time_jit_and_periodicity():
    (q0, p0), mu = _elliptic_state(np.random.default_rng(7), e_max=0.7)
    y0 = (jnp.asarray(q0), jnp.asarray(p0))
    el = kepler_elements(y0, (mu,))
    period = 2 * np.pi / float(el.n)
    q_s, p_s = kepler_exact(1.234, y0, (mu,))
    assert q_s.shape == p_s.shape == (2,)
    q_j, _ = jax.jit(kepler_exact)(1.234, y0, (mu,))
    np.testing.assert_allclose(q_j, q_s, rtol=1e-13, atol=1e-14)
    q_far, p_far = kepler_exact(1.234 + 1000 * period, y0, (mu,))
    np.testing.assert_allclose(q_far, q_s, atol=1e-9)
    np.testing.assert_allclose(p_far, p_s, atol=1e-9)
    q_back, _ = kepler_exact(0.0, y0, (mu,))
    np.testing.assert_allclose(q_back, q0, atol=1e-13)


def test_kepler_exact_gradient_matches_finite_differences():
    problem = get_problem("kepler")
    q0, p0 = (jnp.asarray(x) for x in problem.y0)

    def final_x(mu):
        return kepler_exact(2.5, (q0, p0), (mu,))[0][0]

    grad = jax.grad(final_x)(1.0)
    h = 1e-6
    fd = (final_x(1.0 + h) - final_x(1.0 - h)) / (2 * h)
    np.testing.assert_allclose(grad, fd, rtol=1e-6)


def test_kepler_elements_standard_problem():
    el = kepler_elements(get_problem("kepler").y0)
    np.testing.assert_allclose(el.a, 1.0, rtol=1e-14)
    np.testing.assert_allclose(el.e, 0.6, rtol=1e-14)
    np.testing.assert_allclose(el.e_vec, [0.6, 0.0], atol=1e-14)
    np.testing.assert_allclose([el.n, el.E0, el.M0, el.omega], [1.0, 0.0, 0.0, 0.0], atol=1e-14)
    assert float(el.h) > 0


@pytest.mark.parametrize("seed", range(5))
def test_kepler_elements_random(seed):
    rng = np.random.default_rng(200 + seed)
    mu, a, e = rng.uniform(0.5, 2.0), rng.uniform(0.5, 3.0), rng.uniform(0.05, 0.9)
    omega, nu = rng.uniform(-np.pi, np.pi, size=2)
    el = kepler_elements(_state_from_elements(mu, a, e, omega, nu), (mu,))
    np.testing.assert_allclose([el.a, el.e], [a, e], rtol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(el.e_vec), e, rtol=1e-12)
    np.testing.assert_allclose(np.cos(el.omega - omega), 1.0, atol=1e-12)
    np.testing.assert_allclose(el.n, np.sqrt(mu / a**3), rtol=1e-12)
    # Mean anomaly from the true anomaly (textbook conversion).
    E = 2 * np.arctan2(np.sqrt(1 - e) * np.sin(nu / 2), np.sqrt(1 + e) * np.cos(nu / 2))
    np.testing.assert_allclose(np.cos(el.M0 - (E - e * np.sin(E))), 1.0, atol=1e-12)


def test_solve_kepler_equation_residual():
    M = np.linspace(-20.0, 20.0, 2001)
    for e in (0.0, 0.3, 0.6, 0.9, 0.99):
        E = np.asarray(solve_kepler_equation(jnp.asarray(M), e))
        np.testing.assert_allclose(E - e * np.sin(E), M, atol=1e-12)


# --------------------------------------------------------------------------- #
# Conserved quantities along scipy trajectories                                #
# --------------------------------------------------------------------------- #


def test_harmonic_energy_conserved_along_scipy():
    k, m = 2.0, 0.5
    q0, p0 = np.array([1.0, -0.3]), np.array([0.2, 0.7])

    def rhs(t, y):
        return np.concatenate(np_harmonic(t, y[:2], y[2:], k, m))

    sol = solve_ivp(
        rhs, (0, 30), np.concatenate([q0, p0]), method="DOP853", rtol=RTOL_IVP, atol=RTOL_IVP
    )
    energies = [harmonic_oscillator_energy((y[:2], y[2:]), (k, m)) for y in sol.y.T]
    assert _relative_drift(energies) < INVARIANT_RTOL


def test_lotka_volterra_invariant_conserved_along_scipy():
    problem = get_problem("lotka_volterra")
    sol = solve_ivp(
        np_lotka_volterra,
        (problem.t0, problem.t1),
        problem.y0,
        method="DOP853",
        rtol=RTOL_IVP,
        atol=RTOL_IVP,
        args=problem.args,
    )
    assert sol.success
    values = lotka_volterra_invariant(jnp.asarray(sol.y.T), problem.args)  # batched
    assert values.shape == (sol.t.size,)
    assert _relative_drift(values) < INVARIANT_RTOL


def test_kepler_invariants_conserved_along_scipy():
    problem = get_problem("kepler")
    q0, p0 = problem.y0
    ts = np.linspace(problem.t0, problem.t1, 200)
    q, p = _kepler_scipy(q0, p0, *problem.args, ts)
    energy = kepler_energy((jnp.asarray(q), jnp.asarray(p)), problem.args)
    ang = kepler_angular_momentum((jnp.asarray(q), jnp.asarray(p)), problem.args)
    assert energy.shape == ang.shape == (ts.size,)
    np.testing.assert_allclose(energy[0], np_kepler_energy(q0, p0, 1.0), rtol=1e-15)
    np.testing.assert_allclose(energy[0], -0.5, rtol=1e-14)  # -mu / (2a) with a = 1
    assert _relative_drift(energy) < INVARIANT_RTOL
    assert _relative_drift(ang) < INVARIANT_RTOL


def test_double_pendulum_energy_conserved_along_scipy():
    problem = get_problem("double_pendulum")
    sol = solve_ivp(
        np_double_pendulum,
        (problem.t0, problem.t1),
        problem.y0,
        method="DOP853",
        rtol=RTOL_IVP,
        atol=RTOL_IVP,
        args=problem.args,
    )
    assert sol.success
    energies = double_pendulum_energy(jnp.asarray(sol.y.T), problem.args)
    # E(0) = -m2 g L2 cos(0)... both rods horizontal: E = 0, so use an absolute scale.
    scale = problem.args[4] * (problem.args[0] + 2 * problem.args[1])
    assert np.max(np.abs(energies - energies[0])) / scale < INVARIANT_RTOL


# --------------------------------------------------------------------------- #
# Energy functions against the vector fields                                   #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("seed", range(3))
def test_harmonic_oscillator_is_hamiltonian(seed):
    rng = np.random.default_rng(seed)
    args = _perturbed(DEFAULTS["harmonic_oscillator"], rng)
    q, p = jnp.asarray(rng.normal(size=3)), jnp.asarray(rng.normal(size=3))
    dH_dq, dH_dp = jax.grad(harmonic_oscillator_energy)((q, p), args)
    dq, dp = harmonic_oscillator(0.0, (q, p), args)
    np.testing.assert_allclose(dq, dH_dp, rtol=1e-14)
    np.testing.assert_allclose(dp, -dH_dq, rtol=1e-14)


@pytest.mark.parametrize("seed", range(3))
def test_kepler_is_hamiltonian(seed):
    rng = np.random.default_rng(seed)
    mu = rng.uniform(0.5, 2.0)
    q, p = jnp.asarray(rng.normal(size=2)), jnp.asarray(rng.normal(size=2))
    dH_dq, dH_dp = jax.grad(kepler_energy)((q, p), (mu,))
    dq, dp = kepler(0.0, (q, p), (mu,))
    np.testing.assert_allclose(dq, dH_dp, rtol=1e-14)
    np.testing.assert_allclose(dp, -dH_dq, rtol=1e-13)
    # Angular momentum is a first integral: {h, H} = grad h . f = 0.
    dh_dq, dh_dp = jax.grad(kepler_angular_momentum)((q, p), (mu,))
    np.testing.assert_allclose(jnp.dot(dh_dq, dq) + jnp.dot(dh_dp, dp), 0.0, atol=1e-13)


@pytest.mark.parametrize(
    ("fn", "invariant", "low", "high"),
    [
        (lotka_volterra, lotka_volterra_invariant, 0.1, 10.0),
        (double_pendulum, double_pendulum_energy, -4.0, 4.0),
    ],
    ids=["lotka_volterra", "double_pendulum"],
)
@pytest.mark.parametrize("seed", range(3))
def test_invariant_gradient_orthogonal_to_field(fn, invariant, low, high, seed):
    rng = np.random.default_rng(seed)
    args = _perturbed(DEFAULTS[fn.__name__], rng)
    y = jnp.asarray(rng.uniform(low, high, size=4 if fn is double_pendulum else 2))
    grad = jax.grad(invariant)(y, args)
    f = fn(0.0, y, args)
    np.testing.assert_allclose(
        jnp.dot(grad, f), 0.0, atol=1e-10 * float(jnp.linalg.norm(grad) * jnp.linalg.norm(f))
    )


def test_lotka_volterra_invariant_minimal_at_equilibrium():
    alpha, beta, gamma, delta = DEFAULTS["lotka_volterra"]
    eq = jnp.array([gamma / delta, alpha / beta])
    np.testing.assert_allclose(jax.grad(lotka_volterra_invariant)(eq), 0.0, atol=1e-14)
    np.testing.assert_allclose(lotka_volterra(0.0, eq), 0.0, atol=1e-14)


# --------------------------------------------------------------------------- #
# Transformations and precision                                                #
# --------------------------------------------------------------------------- #


def _as(dtype, y0):
    return jax.tree_util.tree_map(lambda x: jnp.asarray(x, dtype=dtype), y0)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_vector_fields_keep_dtype(problem, dtype):
    y0 = _as(dtype, problem.y0)
    t = jnp.asarray(0.3, dtype=dtype)
    for args in (problem.args, None):
        out = problem.vector_field(t, y0, args)
        for leaf_out, leaf_in in zip(
            jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(y0), strict=True
        ):
            assert leaf_out.dtype == dtype
            assert leaf_out.shape == leaf_in.shape
    if problem.energy is not None:
        assert problem.energy(y0, problem.args).dtype == dtype
    if problem.exact is not None:
        ts = jnp.linspace(0.0, 1.0, 3, dtype=dtype)
        for leaf in jax.tree_util.tree_leaves(problem.exact(ts, y0, problem.args)):
            assert leaf.dtype == dtype


def test_float32_kepler_exact_accuracy():
    problem = get_problem("kepler")
    ts = np.linspace(problem.t0, problem.t1, 21)
    q32, p32 = kepler_exact(
        jnp.asarray(ts, jnp.float32), _as(jnp.float32, problem.y0), problem.args
    )
    q64, p64 = kepler_exact(jnp.asarray(ts), _as(jnp.float64, problem.y0), problem.args)
    np.testing.assert_allclose(q32, q64, atol=1e-5)
    np.testing.assert_allclose(p32, p64, atol=1e-5)


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_jit_vmap_grad(problem):
    y0 = _as(jnp.float64, problem.y0)
    f = problem.vector_field
    eager = f(problem.t0, y0, problem.args)
    jitted = jax.jit(f)(problem.t0, y0, problem.args)
    for a, b in zip(
        jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-14)

    # vmap over a batch of slightly perturbed states.
    batch = jax.tree_util.tree_map(
        lambda x: x[None] * (1.0 + 0.01 * jnp.arange(4.0))[(...,) + (None,) * x.ndim], y0
    )
    out = jax.vmap(f, in_axes=(None, 0, None))(problem.t0, batch, problem.args)
    for i in range(4):
        single = f(problem.t0, jax.tree_util.tree_map(lambda x, i=i: x[i], batch), problem.args)
        for a, b in zip(
            jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(single), strict=True
        ):
            np.testing.assert_allclose(a[i], b, rtol=1e-13, atol=1e-14)

    # Gradients with respect to the parameters and the state are finite.
    def loss(args, y):
        return sum(jnp.sum(leaf**2) for leaf in jax.tree_util.tree_leaves(f(0.5, y, args)))

    g_args, g_y = jax.grad(loss, argnums=(0, 1))(problem.args, y0)
    for leaf in jax.tree_util.tree_leaves((g_args, g_y)):
        assert np.all(np.isfinite(leaf))


def test_vector_field_grad_wrt_args_matches_finite_differences():
    y = jnp.array([1.0, -2.0, 20.0])

    def loss(rho):
        return jnp.sum(lorenz(0.0, y, (10.0, rho, 8.0 / 3.0)) ** 2)

    h = 1e-5
    fd = (loss(28.0 + h) - loss(28.0 - h)) / (2 * h)
    np.testing.assert_allclose(jax.grad(loss)(28.0), fd, rtol=1e-8)


# --------------------------------------------------------------------------- #
# Problems                                                                     #
# --------------------------------------------------------------------------- #

_NAMES = [
    "harmonic_oscillator",
    "damped_driven_pendulum",
    "lotka_volterra",
    "lorenz",
    "van_der_pol",
    "kepler",
    "double_pendulum",
]


def test_problem_registry():
    assert sorted(p.name for p in PROBLEMS) == sorted(_NAMES)
    for name in _NAMES:
        problem = get_problem(name)
        assert isinstance(problem, Problem)
        assert problem.name == name
        assert problem.vector_field is getattr(systems, name)
        assert problem.t1 > problem.t0
        assert isinstance(problem.args, tuple)
        assert all(type(a) is float for a in problem.args)
        assert problem.args == DEFAULTS[name]
        assert problem.description
        leaves = problem.y0 if isinstance(problem.y0, tuple) else (problem.y0,)
        for leaf in leaves:
            assert isinstance(leaf, np.ndarray) and leaf.dtype == np.float64
            assert not leaf.flags.writeable
    assert get_problem("kepler").energy is kepler_energy
    assert get_problem("kepler").exact is kepler_exact
    assert get_problem("harmonic_oscillator").exact is harmonic_oscillator_exact
    assert get_problem("lorenz").energy is None and get_problem("lorenz").exact is None


def test_problem_is_frozen():
    problem = get_problem("lorenz")
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.t1 = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        problem.y0[0] = 2.0


def test_problem_validation():
    with pytest.raises(ValueError, match="t1 > t0"):
        Problem("x", lorenz, np.ones(3), 1.0, 0.0, (10.0, 28.0, 8 / 3), "bad span")
    p = Problem("x", lorenz, [1, 2, 3], 0, 1, (10, 28, 3), "converted")
    assert p.y0.dtype == np.float64 and p.args == (10.0, 28.0, 3.0) and p.t1 == 1.0


@pytest.mark.parametrize("bad", ["", "Lorenz", "kepler2", "pendulum"])
def test_get_problem_unknown_name(bad):
    with pytest.raises(ValueError) as info:
        get_problem(bad)
    message = str(info.value)
    assert repr(bad) in message
    for name in _NAMES:
        assert name in message


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: p.name)
def test_problems_are_well_behaved_under_scipy(problem):
    """Each set-up integrates cleanly with scipy and its invariant/exact solution agree."""
    field = jax.jit(problem.vector_field)
    if isinstance(problem.y0, tuple):
        sizes = [y.size for y in problem.y0]
        flat0 = np.concatenate(problem.y0)

        def unflatten(y):
            return tuple(np.split(y, np.cumsum(sizes)[:-1], axis=-1))

        def rhs(t, y):
            out = field(t, _as(jnp.float64, unflatten(y)), problem.args)
            return np.concatenate([np.asarray(o) for o in out])
    else:
        flat0 = problem.y0

        def unflatten(y):
            return y

        def rhs(t, y):
            return np.asarray(field(t, jnp.asarray(y), problem.args))

    ts = np.linspace(problem.t0, problem.t1, 25)
    sol = solve_ivp(
        rhs, (problem.t0, problem.t1), flat0, method="DOP853", t_eval=ts, rtol=1e-10, atol=1e-10
    )
    assert sol.success
    assert np.all(np.isfinite(sol.y))
    assert np.max(np.abs(sol.y)) < 1e3
    if problem.exact is not None:
        exact = problem.exact(jnp.asarray(ts), _as(jnp.float64, problem.y0), problem.args)
        got = np.concatenate([np.asarray(e) for e in jax.tree_util.tree_leaves(exact)], -1)
        np.testing.assert_allclose(got, sol.y.T, atol=1e-7)
    if problem.energy is not None:
        energy = jax.jit(jax.vmap(problem.energy, in_axes=(0, None)))
        values = np.asarray(energy(_as(jnp.float64, unflatten(sol.y.T)), problem.args))
        assert np.max(np.abs(values - values[0])) < 1e-7 * max(1.0, abs(values[0]))


def test_kepler_problem_is_eccentric_and_starts_at_perihelion():
    problem = get_problem("kepler")
    el = kepler_elements(problem.y0, problem.args)
    assert 0.5 <= float(el.e) <= 0.6
    np.testing.assert_allclose(el.M0, 0.0, atol=1e-14)
    n_orbits = (problem.t1 - problem.t0) * float(el.n) / (2 * math.pi)
    assert 1.0 <= n_orbits <= 5.0


# -- stochastic models: closed forms checked against independent computations -------------


def test_ornstein_uhlenbeck_moments_solve_their_moment_equations():
    """The mean and variance satisfy m' = -theta (m - mu), v' = -2 theta v + sigma^2
    (scipy's solve_ivp from m(0) = x0, v(0) = 0); drift and diffusion match the formulas."""
    args = (1.7, 0.4, 0.9)
    theta, mu, sigma = args
    ts = np.linspace(0.0, 3.0, 13)
    ref = solve_ivp(lambda t, z: [-theta * (z[0] - mu), -2 * theta * z[1] + sigma ** 2],
                    (0.0, 3.0), [2.0, 0.0], t_eval=ts, rtol=1e-12, atol=1e-14)
    m, v = systems.ornstein_uhlenbeck_moments(2.0, ts, args)
    np.testing.assert_allclose(np.asarray(m), ref.y[0], rtol=1e-10)
    np.testing.assert_allclose(np.asarray(v), ref.y[1], rtol=1e-9, atol=1e-14)
    x = np.array([-1.0, 0.5, 3.0])
    np.testing.assert_allclose(np.asarray(systems.ornstein_uhlenbeck_drift(0.0, x, args)),
                               -theta * (x - mu))
    np.testing.assert_array_equal(
        np.asarray(systems.ornstein_uhlenbeck_diffusion(0.0, x, args)), np.full(3, sigma))
    m0, v0 = systems.ornstein_uhlenbeck_moments(0.0, 1e6, None)  # stationary N(0, 1/2)
    assert float(m0) == 0.0 and abs(float(v0) - 0.5) < 1e-15


def test_geometric_brownian_motion_exact_has_the_closed_form_moments():
    """E and Var of the exact solution over W_t ~ N(0, t) by Gauss-Hermite quadrature
    (numpy) against geometric_brownian_motion_moments; the Stratonovich solution's mean is
    x0 exp((mu + sigma^2/2) t)."""
    args, x0, t = (0.3, 0.5), 2.0, 1.5
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)
    w = nodes * math.sqrt(t)
    p = weights / weights.sum()
    x = np.asarray(systems.geometric_brownian_motion_exact(x0, t, w, args))
    m, v = systems.geometric_brownian_motion_moments(x0, t, args)
    np.testing.assert_allclose(p @ x, float(m), rtol=1e-12)
    np.testing.assert_allclose(p @ (x - p @ x) ** 2, float(v), rtol=1e-10)
    xs = np.asarray(systems.geometric_brownian_motion_exact(x0, t, w, args,
                                                            stratonovich=True))
    np.testing.assert_allclose(p @ xs, x0 * math.exp((0.3 + 0.125) * t), rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(systems.geometric_brownian_motion_diffusion(0.0, np.array([2.0]), args)),
        [1.0])
