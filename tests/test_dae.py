"""Differential-algebraic equations M y' = f (issue 24): mass matrices, consistent
initialisation, and the references outside simlib they are checked against (scipy's
Radau on Robertson's ODE form, closed forms from scipy.linalg.expm, finite differences
of closed forms, a conserved pendulum length)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg
from scipy.integrate import solve_ivp

import simlib as sl

# --------------------------------------------------------------------------- the circuit
# Two capacitors (nodes 1, 2) joined through R1, R2 to node 3, which has no capacitor and
# is tied to a DC source Vs through R3: C1 v1' = (v3 - v1)/R1, C2 v2' = (v3 - v2)/R2,
# 0 = (v1 - v3)/R1 + (v2 - v3)/R2 + (Vs - v3)/R3 (Kirchhoff at node 3, algebraic).
PARAMS = np.array([1.0, 2.0, 0.5, 1e-1, 3e-1, 5.0])  # R1, R2, R3, C1, C2, Vs
T1 = 0.7
X0 = np.array([1.0, -0.5])


def circuit(t, y, p):
    r1, r2, r3, c1, c2, vs = p
    v1, v2, v3 = y[0], y[1], y[2]
    return jnp.stack([(v3 - v1) / r1, (v3 - v2) / r2,
                      (v1 - v3) / r1 + (v2 - v3) / r2 + (vs - v3) / r3])


def circuit_mass(p):
    return jnp.stack([p[3], p[4], 0.0 * p[3]])


def node3(x, p):
    r1, r2, r3, *_ = p
    vs = p[5]
    return (x[0] / r1 + x[1] / r2 + vs / r3) / (1 / r1 + 1 / r2 + 1 / r3)


def circuit_exact(t, p, x0=X0):
    """The node voltages at ``t`` from ``expm``: eliminating ``v3`` leaves
    ``x' = A x + b``, solved with the augmented matrix ``[[A, b], [0, 0]]``."""
    r1, r2, r3, c1, c2, vs = (float(v) for v in p)
    g = 1 / r1 + 1 / r2 + 1 / r3
    w = np.array([1 / r1, 1 / r2]) / g  # v3 = w . x + vs / (r3 g)
    d = np.array([1 / (r1 * c1), 1 / (r2 * c2)])
    a = d[:, None] * (w[None, :] - np.eye(2))
    b = d * vs / (r3 * g)
    aug = np.zeros((3, 3))
    aug[:2, :2], aug[:2, 2] = a, b
    z = scipy.linalg.expm(aug * t) @ np.array([*x0, 1.0])
    x = z[:2]
    return np.array([x[0], x[1], node3(x, p)])


def consistent_y0(p=PARAMS, x0=X0):
    return jnp.array([x0[0], x0[1], node3(x0, p)])


def test_circuit_rodas5p_matches_the_matrix_exponential_and_recovers_node3():
    """Default suite: Rodas5P (the recommended method) from an inconsistent v3, fixed by
    initialize='consistent', against the expm closed form at saved times, the algebraic
    component included, and its dense output between steps."""
    p = jnp.asarray(PARAMS)
    ts = np.linspace(0.0, T1, 8)
    y0 = jnp.array([X0[0], X0[1], 123.0])  # v3 far off Kirchhoff's law
    sol = sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-9, atol=1e-12,
                   args=p, mass_matrix=circuit_mass(p), initialize="consistent",
                   saveat=sl.SaveAt(ts=ts))
    exact = np.stack([circuit_exact(t, PARAMS) for t in ts])
    np.testing.assert_allclose(np.asarray(sol.ys[0]), exact[0], rtol=1e-13)  # v3 recovered
    assert np.max(np.abs(np.asarray(sol.ys) - exact) / (1e-12 / 1e-9 + np.abs(exact))) < 10e-9
    # the inconsistent start without initialize= is refused, naming the residual
    with pytest.raises(ValueError, match="y0 is inconsistent: the residual"):
        sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-9, args=p,
                 mass_matrix=circuit_mass(p))


def test_explicit_solvers_and_bad_mass_matrices_are_refused():
    p = jnp.asarray(PARAMS)
    y0 = consistent_y0()
    for solver in (sl.Tsit5(), sl.Dopri5(), sl.ImplicitMidpoint()):
        with pytest.raises(ValueError, match="mass_matrix"):
            sl.solve(circuit, y0, 0.0, T1, solver=solver, dt=0.1, args=p,
                     mass_matrix=circuit_mass(p))
    with pytest.raises(ValueError, match=r"mass_matrix must be an \(3,\) diagonal"):
        sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6, args=p,
                 mass_matrix=jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="mass_matrix must be finite"):
        sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6, args=p,
                 mass_matrix=jnp.array([1.0, jnp.nan, 0.0]))
    with pytest.raises(ValueError, match="initialize must be one of"):
        sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6, args=p,
                 mass_matrix=circuit_mass(p), initialize="yes")
    with pytest.raises(ValueError, match="applies to a DAE"):
        sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6, args=p,
                 initialize="consistent")


@pytest.mark.slow
@pytest.mark.parametrize("solver,bound", [
    (sl.Rodas5(), 10), (sl.Rosenbrock23(), 60), (sl.BDF(), 10), (sl.Kvaerno5(), 20),
    (sl.Kvaerno3(), 10)], ids=["Rodas5", "Rosenbrock23", "BDF", "Kvaerno5", "Kvaerno3"])
def test_circuit_every_solver_matches_the_matrix_exponential(solver, bound):
    """At the saved times (dense output), in units of rtol. Rosenbrock23 measured 44 (on
    the ODE form of the same circuit, v3 eliminated by hand: 40) and Kvaerno5 15 (ODE
    form: 8.5; 0.2 at t1, a step end: its cubic Hermite dense output dominates)."""
    p = jnp.asarray(PARAMS)
    ts = np.linspace(0.0, T1, 8)
    rtol, atol = 1e-8, 1e-10
    sol = sl.solve(circuit, consistent_y0(), 0.0, T1, solver=solver, rtol=rtol, atol=atol,
                   args=p, mass_matrix=circuit_mass(p), saveat=sl.SaveAt(ts=ts),
                   max_steps=20000)
    exact = np.stack([circuit_exact(t, PARAMS) for t in ts])
    err = np.abs(np.asarray(sol.ys) - exact) / (atol / rtol + np.abs(exact))
    assert err.max() < bound * rtol, (type(solver).__name__, err.max() / rtol)


@pytest.mark.slow
def test_circuit_with_a_dense_singular_mass_matrix():
    """The same circuit in rotated variables ``y = P w`` with the equations mixed by
    ``L``: ``(L M P) w' = L f(P w)``, a dense singular mass matrix; initialisation by the
    SVD projectors."""
    rng = np.random.default_rng(0)
    P = np.linalg.qr(rng.normal(size=(3, 3)))[0]
    L = rng.normal(size=(3, 3)) + 3 * np.eye(3)
    p = jnp.asarray(PARAMS)
    md = L @ np.diag(np.asarray(circuit_mass(p))) @ P

    def fw(t, w, a):
        return jnp.asarray(L) @ circuit(t, jnp.asarray(P) @ w, a)

    y0 = np.asarray(consistent_y0()).copy()
    y0[2] += 3.0
    w0 = P.T @ y0
    for solver in (sl.Rodas5P(), sl.BDF(), sl.Kvaerno5()):
        sol = sl.solve(fw, jnp.asarray(w0), 0.0, T1, solver=solver, rtol=1e-8, atol=1e-10,
                       args=p, mass_matrix=jnp.asarray(md), initialize="consistent")
        y1 = P @ np.asarray(sol.ys[-1])
        # the start's differential part (V_r^T w0) is kept; the exact solution from it
        exact = circuit_exact(T1, PARAMS, x0=_x0_keeping(P, md, w0))
        np.testing.assert_allclose(y1, exact, rtol=1e-7, atol=1e-9)


def _x0_keeping(P, md, w0):
    """The consistent circuit start whose differential part ``V_r^T w`` equals ``w0``'s:
    solve ``V_r^T P^T y = V_r^T w0`` with ``y`` consistent (``y3 = node3``), by least
    squares over ``x`` in numpy."""
    _, s, vt = np.linalg.svd(md)
    vr = vt[s > 1e-12 * s.max()]
    w3 = np.array([1 / PARAMS[0], 1 / PARAMS[1]]) / (1 / PARAMS[0] + 1 / PARAMS[1]
                                                     + 1 / PARAMS[2])
    c3 = PARAMS[5] / PARAMS[2] / (1 / PARAMS[0] + 1 / PARAMS[1] + 1 / PARAMS[2])
    e = np.array([[1, 0], [0, 1], [w3[0], w3[1]]])  # y = E x + (0, 0, c3)
    a = vr @ P.T @ e
    rhs = vr @ w0 - vr @ P.T @ np.array([0, 0, c3])
    return np.linalg.solve(a, rhs)


@pytest.mark.slow
def test_banded_and_sparse_linear_solvers_take_the_mass_matrix():
    """A circuit chain (a ladder of n RC sections, every other node without capacitor):
    dense LU vs banded and sparse LU with a diagonal and a banded M, against expm."""
    n = 12
    caps = np.where(np.arange(n) % 2 == 0, 1.0, 0.0)  # odd nodes algebraic

    def ladder(t, v, a):
        left = jnp.concatenate([jnp.array([1.0]), v[:-1]])  # node 0 tied to a 1 V source
        right = jnp.concatenate([v[1:], v[-1:]])
        return (left - v) + (right - v) - 0.1 * v

    # closed form: eliminate the algebraic nodes (linear), expm of the reduced system
    A = np.zeros((n, n))
    b = np.zeros(n)
    for i in range(n):
        A[i, i] -= 2.1
        if i > 0:
            A[i, i - 1] += 1
        else:
            b[i] += 1
        if i < n - 1:
            A[i, i + 1] += 1
        else:
            A[i, i] += 1
    d, a = caps > 0, caps == 0
    Add, Ada, Aad, Aaa = A[np.ix_(d, d)], A[np.ix_(d, a)], A[np.ix_(a, d)], A[np.ix_(a, a)]
    red = Add - Ada @ np.linalg.solve(Aaa, Aad)
    bred = b[d] - Ada @ np.linalg.solve(Aaa, b[a])
    nd = int(d.sum())
    aug = np.zeros((nd + 1, nd + 1))
    aug[:nd, :nd], aug[:nd, nd] = red, bred
    x0 = np.linspace(0.0, 1.0, nd)
    xt = (scipy.linalg.expm(aug * 2.0) @ np.array([*x0, 1.0]))[:nd]
    exact = np.zeros(n)
    exact[d] = xt
    exact[a] = -np.linalg.solve(Aaa, Aad @ xt + b[a])
    y0 = np.zeros(n)
    y0[d] = x0
    for kw in ({}, {"jac_bandwidth": (1, 1)}, {"linear_solver": "sparse"}):
        for mass in (jnp.asarray(caps), jnp.diag(jnp.asarray(caps))):
            sol = sl.solve(ladder, jnp.asarray(y0), 0.0, 2.0, solver=sl.Rodas5P(),
                           rtol=1e-9, atol=1e-11, mass_matrix=mass, initialize="consistent",
                           **kw)
            np.testing.assert_allclose(np.asarray(sol.ys[-1]), exact, rtol=1e-7, atol=1e-9)
    # a mass matrix outside the band is refused, naming it
    wide = np.diag(caps) + np.diag(np.ones(n - 3), 3)
    with pytest.raises(ValueError, match="mass_matrix must be zero outside the Jacobian's band"):
        sl.solve(ladder, jnp.asarray(y0), 0.0, 2.0, solver=sl.Rodas5P(), rtol=1e-6,
                 mass_matrix=jnp.asarray(wide), jac_bandwidth=(1, 1), initialize="none")


# --------------------------------------------------------------------------- Robertson

def robertson_dae(t, y, a):
    y1, y2, y3 = y[0], y[1], y[2]
    return jnp.stack([-0.04 * y1 + 1e4 * y2 * y3,
                      0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2**2,
                      y1 + y2 + y3 - 1.0])


@pytest.fixture(scope="module")
def robertson_reference():
    def fo(t, y):
        y1, y2, y3 = y
        return [-0.04 * y1 + 1e4 * y2 * y3, 0.04 * y1 - 1e4 * y2 * y3 - 3e7 * y2**2,
                3e7 * y2**2]

    ts = np.logspace(-6, 11, 18)
    ref = solve_ivp(fo, (0, 1e11), [1.0, 0.0, 0.0], method="Radau", rtol=1e-12,
                    atol=1e-22, t_eval=ts)
    return ts, ref.y.T


@pytest.mark.slow
@pytest.mark.parametrize("solver,bound", [
    (sl.Rodas5P(), 10), (sl.Rodas5(), 10), (sl.BDF(), 10), (sl.Kvaerno5(), 15),
    (sl.Rosenbrock23(), 40)], ids=["Rodas5P", "Rodas5", "BDF", "Kvaerno5", "Rosenbrock23"])
def test_robertson_dae_to_1e11_matches_scipy_radau_on_the_ode(solver, bound,
                                                              robertson_reference):
    """Robertson with its third equation replaced by y1 + y2 + y3 = 1 (M = diag(1, 1, 0)),
    rtol 1e-6, against scipy's Radau on the ODE form at rtol 1e-12; errors in units of
    rtol relative to |y| + atol/rtol. Measured maxima: Rodas5P 0.23, Rodas5 0.12, BDF 6.7,
    Kvaerno5 10.9, Rosenbrock23 27.7 (its order-2 solution, order-3 estimate)."""
    ts, ref = robertson_reference
    rtol, atol = 1e-6, 1e-12
    sol = sl.solve(robertson_dae, jnp.array([1.0, 0.0, 0.0]), 0.0, 1e11, solver=solver,
                   rtol=rtol, atol=atol, mass_matrix=jnp.array([1.0, 1.0, 0.0]),
                   saveat=sl.SaveAt(ts=ts), max_steps=100_000)
    err = np.abs(np.asarray(sol.ys) - ref) / (atol / rtol + np.abs(ref))
    assert err.max() < bound * rtol, err.max() / rtol


# --------------------------------------------------------------------------- transforms

@pytest.mark.slow
def test_vmap_ensemble_jit_traced_mass_and_float32():
    """An ensemble over R3 under jit with a traced mass matrix (C1 varies too), each
    member against expm; float32 against expm at float32 tolerances; a NaN in a traced
    M is INVALID_MASS_MATRIX, not a silent result."""
    base = np.asarray(PARAMS)
    r3s = np.array([0.3, 0.5, 1.0, 2.0])

    def one(r3):
        p = jnp.asarray(base).at[2].set(r3).at[3].set(0.05 + 0.1 * r3)
        y0 = jnp.array([X0[0], X0[1], 0.0])
        return sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-8, atol=1e-10,
                        args=p, mass_matrix=circuit_mass(p), initialize="consistent",
                        throw=False)

    sols = jax.jit(jax.vmap(one))(jnp.asarray(r3s))
    assert np.all(np.asarray(sols.result) == 0)
    for i, r3 in enumerate(r3s):
        p = base.copy()
        p[2], p[3] = r3, 0.05 + 0.1 * r3
        np.testing.assert_allclose(np.asarray(sols.ys[i, -1]), circuit_exact(T1, p),
                                   rtol=1e-7)
    bad = jax.jit(lambda m: sl.solve(circuit, consistent_y0(), 0.0, T1, solver=sl.Rodas5P(),
                                     rtol=1e-6, args=jnp.asarray(PARAMS), mass_matrix=m,
                                     throw=False).result)
    assert int(bad(jnp.array([0.1, jnp.nan, 0.0]))) == sl.Result.INVALID_MASS_MATRIX
    # inconsistent traced start: the Result code, not a jump
    inc = jax.jit(lambda y: sl.solve(circuit, y, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6,
                                     args=jnp.asarray(PARAMS),
                                     mass_matrix=circuit_mass(jnp.asarray(PARAMS)),
                                     throw=False))
    out = inc(jnp.array([1.0, -0.5, 9.0]))
    assert int(out.result) == sl.Result.INCONSISTENT_INITIAL_CONDITIONS
    assert np.all(np.isnan(np.asarray(out.ys)))
    thrown = jax.jit(lambda y: sl.solve(circuit, y, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-6,
                                        args=jnp.asarray(PARAMS),
                                        mass_matrix=circuit_mass(jnp.asarray(PARAMS))).ys)
    with pytest.raises(sl.SolverError, match="y0 is inconsistent: the residual") as err, \
            sl.raise_solver_errors():
        thrown(jnp.array([1.0, -0.5, 9.0])).block_until_ready()  # dispatch is asynchronous
    assert err.value.result == sl.Result.INCONSISTENT_INITIAL_CONDITIONS
    p32 = jnp.asarray(PARAMS, jnp.float32)
    for solver in (sl.Rodas5P(), sl.BDF(), sl.Kvaerno5()):
        sol = sl.solve(circuit, consistent_y0().astype(jnp.float32), 0.0, T1, solver=solver,
                       rtol=1e-4, atol=1e-6, args=p32, mass_matrix=circuit_mass(p32))
        assert sol.ys.dtype == jnp.float32
        np.testing.assert_allclose(np.asarray(sol.ys[-1]), circuit_exact(T1, PARAMS),
                                   rtol=1e-3)


@pytest.mark.slow
def test_terminal_event_on_the_algebraic_node_voltage():
    """A terminal event on v3 (algebraic) crossing a level, located on Rodas5P's dense
    output, against the crossing of the expm closed form (scipy's brentq)."""
    from scipy.optimize import brentq

    p = jnp.asarray(PARAMS)
    y0 = consistent_y0()
    level = 0.5 * (float(y0[2]) + circuit_exact(T1, PARAMS)[2])
    event = sl.Event(lambda t, y, a: y[2] - level, terminal=True)
    sol = sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-10, atol=1e-12, args=p,
                   mass_matrix=circuit_mass(p), events=event)
    crossing = brentq(lambda t: circuit_exact(t, PARAMS)[2] - level, 1e-9, T1, xtol=1e-15)
    assert float(sol.events[0].ts[0]) == pytest.approx(crossing, rel=1e-8)
    np.testing.assert_allclose(np.asarray(sol.events[0].ys[0]), circuit_exact(crossing, PARAMS),
                               rtol=1e-8)


@pytest.mark.slow
@pytest.mark.parametrize("adjoint", [None, sl.Direct()], ids=["default", "Direct"])
def test_gradients_match_finite_differences_of_the_closed_form(adjoint):
    """d v3(T1) / d(R1, R3, C1) and d/d(v1(0), v2(0)) (v3(0) follows by consistent
    initialisation) against central differences of the expm closed form."""
    def loss(theta):
        p = jnp.asarray(PARAMS).at[jnp.array([0, 2, 3])].set(theta[:3])
        y0 = jnp.stack([theta[3], theta[4], 0.0 * theta[3]])
        sol = sl.solve(circuit, y0, 0.0, T1, solver=sl.Rodas5P(), rtol=1e-10, atol=1e-12,
                       args=p, mass_matrix=circuit_mass(p), initialize="consistent",
                       adjoint=adjoint)
        return sol.ys[-1, 2] + 0.5 * sol.ys[-1, 0]

    def exact(theta):
        p = PARAMS.copy()
        p[[0, 2, 3]] = theta[:3]
        y = circuit_exact(T1, p, x0=theta[3:])
        return y[2] + 0.5 * y[0]

    theta = np.array([PARAMS[0], PARAMS[2], PARAMS[3], X0[0], X0[1]])
    grad = np.asarray(jax.grad(loss)(jnp.asarray(theta)))
    eps = 1e-6
    fd = np.array([(exact(theta + eps * e) - exact(theta - eps * e)) / (2 * eps)
                   for e in np.eye(theta.size)])
    np.testing.assert_allclose(grad, fd, rtol=2e-6, atol=1e-8)


# --------------------------------------------------------------------------- pendulum

G = 9.81


def pendulum_index3(t, y, a):
    x, z, u, v, lam = y[0], y[1], y[2], y[3], y[4]
    return jnp.stack([u, v, -lam * x, -lam * z - G, x**2 + z**2 - 1.0])


def pendulum_index1(t, y, a):
    """The length constraint C = (x^2 + z^2 - 1)/2 differentiated twice, with Baumgarte's
    stabilisation C'' + 2 alpha C' + beta^2 C = 0 (alpha = beta = a)."""
    x, z, u, v, lam = y[0], y[1], y[2], y[3], y[4]
    c = 0.5 * (x**2 + z**2 - 1.0)
    dc = x * u + z * v
    ddc = u**2 + v**2 - lam * (x**2 + z**2) - G * z
    return jnp.stack([u, v, -lam * x, -lam * z - G, ddc + 2 * a * dc + a**2 * c])


def test_cartesian_pendulum_index3_is_refused():
    """Default suite: index 3 is named in the error (eager; initialize='consistent' in the
    slow set)."""
    m = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    y0 = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="not index 1"):
        sl.solve(pendulum_index3, y0, 0.0, 1.0, solver=sl.Rodas5P(), rtol=1e-6, mass_matrix=m)


@pytest.mark.slow
@pytest.mark.parametrize("solver", [sl.Rodas5P(), sl.BDF(), sl.Kvaerno5()],
                         ids=lambda s: type(s).__name__)
def test_cartesian_pendulum_index3_forced_never_succeeds(solver):
    """A run forced past the check (initialize='none') ends with a failure code (the
    step size collapses or Newton fails), never SUCCESSFUL; under jit with the default
    check, INCONSISTENT_INITIAL_CONDITIONS."""
    m = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    y0 = jnp.array([1.0, 0.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="not index 1"):
        sl.solve(pendulum_index3, y0, 0.0, 1.0, solver=solver, rtol=1e-6, mass_matrix=m,
                 initialize="consistent")
    sol = sl.solve(pendulum_index3, y0, 0.0, 1.0, solver=solver, rtol=1e-6,
                   mass_matrix=m, initialize="none", throw=False, max_steps=500)
    assert int(sol.result) != sl.Result.SUCCESSFUL
    res = jax.jit(lambda y: sl.solve(pendulum_index3, y, 0.0, 1.0, solver=solver, rtol=1e-6,
                                     mass_matrix=m, throw=False).result)(y0)
    assert int(res) == sl.Result.INCONSISTENT_INITIAL_CONDITIONS


@pytest.mark.slow
def test_index1_pendulum_keeps_its_length_and_energy():
    """The index-1 form with Baumgarte stabilisation from a horizontal start at rest: the
    consistent lambda (0 there: u = v = z = 0) is computed from a wrong one; over t in
    [0, 10] (about 5 swings) the length stays within 1e-6 of 1 and the energy within
    1e-5 of its initial 0."""
    m = jnp.array([1.0, 1.0, 1.0, 1.0, 0.0])
    y0 = jnp.array([1.0, 0.0, 0.0, 0.0, 7.0])  # lambda wrong on purpose
    ts = np.linspace(0.0, 10.0, 201)
    for solver in (sl.Rodas5P(), sl.BDF()):
        sol = sl.solve(pendulum_index1, y0, 0.0, 10.0, solver=solver, rtol=1e-8, atol=1e-10,
                       args=5.0, mass_matrix=m, initialize="consistent",
                       saveat=sl.SaveAt(ts=ts), max_steps=50_000)
        ys = np.asarray(sol.ys)
        assert ys[0, 4] == pytest.approx(0.0, abs=1e-12)  # u^2 + v^2 - G z = 0 at rest
        length = np.hypot(ys[:, 0], ys[:, 1])
        energy = 0.5 * (ys[:, 2] ** 2 + ys[:, 3] ** 2) + G * ys[:, 1]
        assert np.max(np.abs(length - 1.0)) < 1e-6, type(solver).__name__
        assert np.max(np.abs(energy)) < 1e-5, type(solver).__name__


# --------------------------------------------------------------------------- orders

def order_dae(t, y, a):
    """x' = z, 0 = z - cos(t) (1 + x - sin t)^2: exact x = sin t, z = cos t; the algebraic
    equation is nonlinear in x, so errors in x feed z."""
    x, z = y[0], y[1]
    return jnp.stack([z, z - jnp.cos(t) * (1.0 + x - jnp.sin(t)) ** 2])


@pytest.mark.slow
def test_measured_orders_on_a_dae_with_a_closed_form():
    """Fixed-step errors at t = 1 for h = 1/10 .. 1/80 of the differential x and the
    algebraic z against sin and cos; orders from successive halvings. Measured (x; z):
    Rodas5P 5.10 5.04 5.02; 5.33 5.15 5.07. Rodas5 7.8 4.9 4.2; 6.7 6.9 10 (errors from
    2e-9 down to round-off: erratic). Rosenbrock23 2.04 2.02 2.01; 2.14 2.07 2.03.
    Kvaerno5 (Newton tightened: newton_rtol 1e-12, 50 iterations; with the fixed-step
    defaults its stage Newton fails at h >= 0.05 here) 5.01 5.01 5.01; 5.01 5.01 5.00.
    BackwardEuler 1.11 1.05 1.03; 1.09 1.05 1.02. No order reduction shows on the
    algebraic component of this index-1 problem. Asserted on the middle halving, 0.3
    below the measured value."""
    m = jnp.array([1.0, 0.0])
    y0 = jnp.array([0.0, 1.0])
    exact = np.array([np.sin(1.0), np.cos(1.0)])
    hs = np.array([0.1, 0.05, 0.025, 0.0125])
    expected = {"Rodas5P": (5.04, 5.15), "Rodas5": (4.92, 6.9), "Rosenbrock23": (2.02, 2.07),
                "Kvaerno5": (5.01, 5.01), "BackwardEuler": (1.05, 1.05)}
    for solver in (sl.Rodas5P(), sl.Rodas5(), sl.Rosenbrock23(),
                   sl.Kvaerno5(newton_rtol=1e-12, max_newton_iters=50), sl.BackwardEuler()):
        errs = []
        for h in hs:
            sol = sl.solve(order_dae, y0, 0.0, 1.0, solver=solver, dt=float(h), mass_matrix=m)
            errs.append(np.abs(np.asarray(sol.ys[-1]) - exact))
        errs = np.array(errs)
        orders = np.log2(errs[:-1] / errs[1:])
        name = type(solver).__name__
        print(name, "orders x:", orders[:, 0], "z:", orders[:, 1])
        lo_x, lo_z = expected[name]
        assert orders[1, 0] > lo_x - 0.3 and orders[1, 1] > lo_z - 0.3, (name, orders)


# ------------------------------------------------- gradients: the step sequence is frozen
FROZEN = sl.PIDController(differentiate_steps=False)


@pytest.mark.slow
def test_frozen_step_sizes_carry_no_derivative():
    """``PIDController(differentiate_steps=False)`` freezes the adaptive step sequence for
    derivatives (Bock's internal numerical differentiation): ``rtol`` moves only the
    steps, so the derivative with respect to it is exactly zero with Rodas5P (no Newton
    tolerance), with either adjoint (the default); ``differentiate_steps=True``
    differentiates the steps (nonzero)."""
    p = jnp.asarray(PARAMS)

    def final(rtol, adjoint, controller):
        sol = sl.solve(circuit, consistent_y0(), 0.0, T1, solver=sl.Rodas5P(), rtol=rtol,
                       atol=1e-9, args=p, mass_matrix=circuit_mass(p), adjoint=adjoint,
                       controller=controller)
        return jnp.sum(sol.ys[-1])

    for adjoint in (sl.ForwardMode(), sl.Direct()):
        assert float(jax.grad(final)(1e-6, adjoint, FROZEN)) == 0.0
    for adjoint in (sl.ForwardMode(), sl.Direct()):
        assert float(jax.grad(final)(1e-6, adjoint, None)) == 0.0      # the default
    live = sl.PIDController(differentiate_steps=True)
    assert float(jax.grad(final)(1e-6, sl.Direct(), live)) != 0.0


def test_frozen_steps_match_a_closed_form_the_default_misses():
    """``y' = -p sinh(y)`` from ``y0 = 3`` (first step 2, which overflows and is rejected;
    tests/test_nonfinite_attempts.py's problem): ``tanh(y/2) = tanh(y0/2) e^(-p t)``, so
    ``dy(t)/dy0 = sinh(y(t)) / sinh(y0)``. With frozen steps the gradient of
    ``y(0.5) + y(2)`` at rtol 1e-8 matches the closed form to 1e-6; differentiating the
    step sizes (``differentiate_steps=True``, the default until 2026-12-06) gives 1.4e-4
    off, as do central differences of the same solve."""
    def loss(x, controller):
        sol = sl.solve(lambda t, y, a: -a[0] * jnp.sinh(y), x[:1], 0.0, 2.0,
                       solver=sl.Tsit5(), dt=2.0, rtol=1e-8, atol=1e-8, args=(x[1],),
                       adjoint=sl.Direct(), saveat=sl.SaveAt(ts=jnp.array([0.5, 2.0])),
                       controller=controller, max_steps=256)
        return jnp.sum(sol.ys[:, 0])

    y0, p = 3.0, 1.5
    y = [2 * np.arctanh(np.tanh(y0 / 2) * np.exp(-p * t)) for t in (0.5, 2.0)]
    exact_dy0 = sum(np.sinh(v) / np.sinh(y0) for v in y)
    g = np.asarray(jax.grad(loss)(jnp.array([y0, p]), FROZEN))
    np.testing.assert_allclose(g[0], exact_dy0, rtol=1e-6)
    g = np.asarray(jax.grad(loss)(jnp.array([y0, p]), None))         # the default freezes
    np.testing.assert_allclose(g[0], exact_dy0, rtol=1e-6)
    live = np.asarray(jax.grad(loss)(jnp.array([y0, p]), sl.PIDController(
        differentiate_steps=True)))
    assert abs(live[0] / exact_dy0 - 1) > 1e-5                        # measured 1.4e-4
    with pytest.raises(TypeError, match="differentiate_steps"):
        sl.PIDController(differentiate_steps=1)


@pytest.mark.slow
def test_amplifier_gradient_matches_converged_central_differences():
    """The transistor amplifier's d/dR of ``mean U8(t_i)^2`` on ``[0, 0.05]`` (Rodas5P,
    rtol 1e-8, consistent start, frozen steps) against central differences at two
    relative steps, which agree with each other to 1e-4 (converged). ``r1`` enters an
    algebraic equation, ``r3`` a differential one. On [0, 0.2], differentiating the steps
    (the default controller) gave 3.3e-4, -2.3e-4 (r0, r1) where the differences give
    -6.0e-4, 5.3e-5 (docs/dae.md)."""
    from simlib.systems import TRANSISTOR_AMPLIFIER as prob

    t1 = 0.05
    ts = jnp.linspace(t1 / 25, t1, 25)
    head, tail = jnp.asarray(prob.args[:4]), jnp.asarray(prob.args[8:])
    mass = prob.mass_matrix(prob.args)

    def loss(r):  # r: r0..r3
        args = (*head, *r, *tail)
        sol = sl.solve(prob.vector_field, jnp.asarray(prob.y0), 0.0, t1, solver=sl.Rodas5P(),
                       rtol=1e-8, atol=1e-11, args=args, mass_matrix=mass,
                       saveat=sl.SaveAt(ts=ts), adjoint=sl.ForwardMode(), controller=FROZEN,
                       initialize="consistent", max_steps=100_000)
        return jnp.mean(sol.ys[:, 7] ** 2)

    r = jnp.asarray(prob.args[4:8])
    g = np.asarray(jax.jit(jax.grad(loss))(r))
    f = jax.jit(loss)
    fds = []
    for rel in (1e-3, 1e-4):
        h = rel * r
        fds.append(np.array([(float(f(r.at[i].add(h[i]))) - float(f(r.at[i].add(-h[i]))))
                             / (2 * float(h[i])) for i in range(4)]))
    scale = np.abs(fds[1]).max()
    np.testing.assert_allclose(fds[0], fds[1], atol=1e-4 * scale)  # converged
    np.testing.assert_allclose(g, fds[1], atol=2e-4 * scale)
    assert np.all(np.abs(fds[1]) > 1e-3 * scale)
