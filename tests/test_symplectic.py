"""Symplectic splittings: bounded energy error without drift, and time reversibility.

Runs of N = 20000 steps.  "No drift" means the largest energy error over the
second half of a run is at most 1.5 times that over the first half; a method with
a secular energy error (RK4, whose error grows linearly in time) has a ratio near
2.  The size of the bounded error must scale as dt^order.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl

N = 20_000


def harmonic(t, y, args):
    q, p = y
    return p, -q


def harmonic_flat(t, y, args):
    return jnp.stack([y[1], -y[0]])


def kepler(t, y, args):
    q, p = y
    return p, -q / jnp.sum(q**2) ** 1.5


def kepler_flat(t, y, args):
    q, p = y[:2], y[2:]
    return jnp.concatenate([p, -q / jnp.sum(q**2) ** 1.5])


ECC = 0.5
# Start at perihelion of an orbit with semi-major axis 1: period 2 pi, energy -1/2.
KEPLER_Q0 = np.array([1.0 - ECC, 0.0])
KEPLER_P0 = np.array([0.0, math.sqrt((1.0 + ECC) / (1.0 - ECC))])
HO_Q0, HO_P0 = np.array([1.0]), np.array([0.0])


def energy_harmonic(q, p):
    return 0.5 * (np.sum(q**2, axis=-1) + np.sum(p**2, axis=-1))


def energy_kepler(q, p):
    return 0.5 * np.sum(p**2, axis=-1) - 1.0 / np.linalg.norm(q, axis=-1)


PROBLEMS = {
    "harmonic": (harmonic, harmonic_flat, HO_Q0, HO_P0, energy_harmonic, (0.1, 0.05)),
    "kepler": (kepler, kepler_flat, KEPLER_Q0, KEPLER_P0, energy_kepler, (0.02, 0.01)),
}


def _energy_errors(problem, solver, dt):
    f, f_flat, q0, p0, energy, _ = PROBLEMS[problem]
    e0 = energy(q0, p0)
    t1 = N * dt
    if solver.symplectic:
        sol = sl.solve(f, (jnp.asarray(q0), jnp.asarray(p0)), 0.0, t1, solver=solver, dt=dt,
                       saveat=sl.SaveAt(steps=True))
        q, p = (np.asarray(x) for x in sol.ys)
    else:
        y0 = jnp.concatenate([jnp.asarray(q0), jnp.asarray(p0)])
        sol = sl.solve(f_flat, y0, 0.0, t1, solver=solver, dt=dt, saveat=sl.SaveAt(steps=True))
        ys = np.asarray(sol.ys)
        q, p = ys[:, : q0.size], ys[:, q0.size:]
    assert q.shape[0] == N
    return energy(q, p) - e0


@pytest.fixture(scope="module")
def energy_errors():
    out = {}
    for problem, spec in PROBLEMS.items():
        for dt in spec[-1]:
            for solver in (sl.VelocityVerlet(), sl.Yoshida4(), sl.RK4()):
                out[problem, type(solver).__name__, dt] = _energy_errors(problem, solver, dt)
    return out


def _halves(err):
    a = np.abs(err)
    return a[: N // 2].max(), a[N // 2:].max()


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("solver", ["VelocityVerlet", "Yoshida4"])
def test_energy_error_has_no_drift(energy_errors, problem, solver):
    for dt in PROBLEMS[problem][-1]:
        first, second = _halves(energy_errors[problem, solver, dt])
        assert second <= 1.5 * first, (dt, first, second)


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
@pytest.mark.parametrize("solver, order", [("VelocityVerlet", 2), ("Yoshida4", 4)])
def test_energy_error_scales_as_dt_to_the_order(energy_errors, problem, solver, order):
    dt_big, dt_small = PROBLEMS[problem][-1]
    big = np.abs(energy_errors[problem, solver, dt_big]).max()
    small = np.abs(energy_errors[problem, solver, dt_small]).max()
    measured = math.log(big / small) / math.log(dt_big / dt_small)
    assert abs(measured - order) < 0.2, measured


def test_verlet_energy_error_on_harmonic_oscillator_is_the_modified_energy_bound(
    energy_errors,
):
    """Velocity Verlet conserves H~ = (p^2 + (1 - h^2/4) q^2) / 2 exactly on q'' = -q, so
    H - H0 = h^2 (q^2 - q0^2) / 8 and |H - H0| <= h^2/8 max(q0^2, 2 H~ / (1 - h^2/4) - q0^2).
    """
    for dt in PROBLEMS["harmonic"][-1]:
        err = np.abs(energy_errors["harmonic", "VelocityVerlet", dt])
        q0, p0 = HO_Q0[0], HO_P0[0]
        h_mod = 0.5 * (p0**2 + (1 - dt**2 / 4) * q0**2)
        bound = dt**2 / 8 * max(q0**2, 2 * h_mod / (1 - dt**2 / 4) - q0**2)
        assert err.max() <= bound * (1 + 1e-9) + 1e-14
        assert err.max() >= 0.9 * bound  # the bound is attained: q passes through 0


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_rk4_drifts_where_verlet_does_not(energy_errors, problem):
    for dt in PROBLEMS[problem][-1]:
        rk_first, rk_second = _halves(energy_errors[problem, "RK4", dt])
        vv_first, vv_second = _halves(energy_errors[problem, "VelocityVerlet", dt])
        assert rk_second > 1.5 * rk_first  # RK4's energy error grows ...
        # ... by far more over the run than Verlet's, whose error merely oscillates.
        assert rk_second - rk_first > 100 * abs(vv_second - vv_first)
        # The drift is secular: RK4 loses energy steadily on these problems (means over
        # the first, middle and last tenth of the run, each many periods long).
        tenths = energy_errors[problem, "RK4", dt].reshape(10, -1).mean(axis=1)
        assert tenths[9] < tenths[5] < tenths[0] < 0


@pytest.mark.parametrize("problem", sorted(PROBLEMS))
def test_velocity_verlet_is_time_reversible(problem):
    f, _, q0, p0, _, (dt, _) = PROBLEMS[problem]
    steps = 1000
    t1 = steps * dt
    fwd = sl.solve(f, (jnp.asarray(q0), jnp.asarray(p0)), 0.0, t1, solver=sl.VelocityVerlet(),
                   dt=dt)
    q1, p1 = fwd.ys[0][-1], fwd.ys[1][-1]
    assert np.abs(np.asarray(q1) - q0).max() > 1e-3  # it did move
    back = sl.solve(f, (q1, -p1), 0.0, t1, solver=sl.VelocityVerlet(), dt=dt)
    np.testing.assert_allclose(np.asarray(back.ys[0][-1]), q0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(back.ys[1][-1]), -p0, rtol=0, atol=1e-12)
    # Integrating backwards in time (t1 -> 0) with the same state also returns.
    rev = sl.solve(f, (q1, p1), t1, 0.0, solver=sl.VelocityVerlet(), dt=dt)
    np.testing.assert_allclose(np.asarray(rev.ys[0][-1]), q0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(rev.ys[1][-1]), p0, rtol=0, atol=1e-12)
