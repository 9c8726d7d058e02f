"""The worked examples of docs/extending.md run as written and are right.

The page's ``python`` code blocks are executed in order in one namespace (so the page cannot
drift from what is tested), then each extension is checked against something outside
simlib: the SSPRK3 solver against the closed form of y' = cos(t) y and its measured order,
the Yukawa potential's forces against central differences of its energy and its energy
against a numpy pair sum, the semi-implicit Euler integrator against a numpy loop of the
same scheme and its order against the exact motion of a spring.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import particles as sp

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "extending.md"


@pytest.fixture(scope="module")
def page():
    """The namespace after running every ``python`` block of the guide."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) == 3, "docs/extending.md should have three python examples"
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, str(GUIDE), "exec"), ns)  # noqa: S102 - our own docs
    return ns


# -- the solver ----------------------------------------------------------------------------


def test_ssprk3_matches_closed_form_and_has_order_three(page):
    errors = np.asarray(page["errors"])  # the page's errors at n = 20, 40, 80 steps
    orders = np.log2(errors[:-1] / errors[1:])
    np.testing.assert_allclose(orders, 3.0, atol=0.1)
    # Independently of the page's loop: a fine run against exp(sin t) at every save time.
    ts = np.linspace(0.0, 2.0, 11)
    sol = sl.solve(page["f"], jnp.array([1.0]), 0.0, 2.0, solver=page["SSPRK3"](),
                   dt=1e-3, saveat=sl.SaveAt(ts=ts))
    np.testing.assert_allclose(np.asarray(sol.ys[:, 0]), np.exp(np.sin(ts)), rtol=1e-9)
    assert page["SSPRK3"]().order == 3 and not page["SSPRK3"]().adaptive


def test_ssprk3_one_step_is_the_shu_osher_form(page):
    """One step of the tableau equals the Shu-Osher convex-combination form, written out."""
    def f(t, y):
        return np.cos(t) * y + t

    t, y, h = 0.3, 1.7, 0.1
    u1 = y + h * f(t, y)
    u2 = 0.75 * y + 0.25 * (u1 + h * f(t + h, u1))
    want = y / 3 + 2 / 3 * (u2 + h * f(t + h / 2, u2))
    sol = sl.solve(lambda t, y, a: jnp.cos(t) * y + t, jnp.array([y]), t, t + h,
                   solver=page["SSPRK3"](), dt=h)
    np.testing.assert_allclose(float(sol.ys[-1, 0]), want, rtol=1e-14)


# -- the pair potential --------------------------------------------------------------------


def test_yukawa_forces_match_finite_differences(page):
    energy, x, params = page["energy"], page["positions"], page["params"]
    forces = np.asarray(page["forces"])
    h = 1e-5
    rng = np.random.default_rng(0)
    for i, k in zip(rng.integers(0, x.shape[0], 6), rng.integers(0, 3, 6), strict=True):
        e = jnp.zeros_like(x).at[i, k].set(h)
        fd = -(float(energy(x + e, params)) - float(energy(x - e, params))) / (2 * h)
        np.testing.assert_allclose(forces[i, k], fd, rtol=1e-6, atol=1e-8)


def test_yukawa_energy_matches_numpy_pair_sum(page):
    x, box, params = np.asarray(page["positions"]), float(page["box"]), page["params"]
    a, kappa, r_cut = params["A"], params["kappa"], 2.5
    d = x[:, None, :] - x[None, :, :]
    d -= box * np.round(d / box)
    r = np.sqrt(np.sum(d * d, axis=-1))
    iu = np.triu_indices(len(x), 1)
    r = r[iu][r[iu] < r_cut]
    want = np.sum(a * np.exp(-kappa * r) / r - a * np.exp(-kappa * r_cut) / r_cut)
    np.testing.assert_allclose(float(page["u"]), want, rtol=1e-12)


# -- the integrator ------------------------------------------------------------------------


def _numpy_symplectic_euler(x, v, k, r0, m, dt, n):
    for _ in range(n):
        d = x[1] - x[0]
        r = np.linalg.norm(d)
        f1 = -k * (r - r0) * d / r
        v = v + dt * np.stack([-f1, f1]) / m
        x = x + dt * v
    return x


def test_semi_implicit_euler_matches_numpy_loop(page):
    got = np.asarray(page["traj"].positions[-1])
    want = _numpy_symplectic_euler(np.array([[0.0, 0, 0], [1.2, 0, 0]]), np.zeros((2, 3)),
                                   1.0, 1.0, 1.0, 1e-3, 2000)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


def test_semi_implicit_euler_is_first_order(page):
    integrator, spring = page["SemiImplicitEuler"](), page["spring"]
    x0 = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])
    t1 = 2.0
    exact = 1 + 0.2 * np.cos(np.sqrt(2.0) * t1)
    errs = []
    for n in (500, 1000, 2000):
        traj = sp.simulate(spring, sp.State(x0, jnp.zeros_like(x0), 1.0),
                           dict(k=1.0, r0=1.0), space=sp.free(), dt=t1 / n, n_steps=n,
                           integrator=integrator)
        sep = float(traj.positions[-1, 1, 0] - traj.positions[-1, 0, 0])
        errs.append(abs(sep - exact))
    orders = np.log2(np.asarray(errs[:-1]) / np.asarray(errs[1:]))
    np.testing.assert_allclose(orders, 1.0, atol=0.1)


def test_custom_integrator_is_differentiable(page):
    """Gradients flow through the user's step: d(separation)/dk against central differences."""
    integrator, spring = page["SemiImplicitEuler"](), page["spring"]
    x0 = jnp.array([[0.0, 0.0, 0.0], [1.2, 0.0, 0.0]])

    def sep(k):
        traj = sp.simulate(spring, sp.State(x0, jnp.zeros_like(x0), 1.0), dict(k=k, r0=1.0),
                           space=sp.free(), dt=1e-2, n_steps=100, integrator=integrator)
        return traj.positions[-1, 1, 0] - traj.positions[-1, 0, 0]

    h = 1e-6
    fd = (float(sep(1.0 + h)) - float(sep(1.0 - h))) / (2 * h)
    np.testing.assert_allclose(float(jax.grad(sep)(1.0)), fd, rtol=1e-6)
