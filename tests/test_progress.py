"""Progress bars (simlib/progress.py): they never change a result, never break jit, vmap or
grad, and write plain lines (no carriage returns) when standard error is not a terminal."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import progress


def decay(t, y, a):
    return -a * y


Y0 = jnp.array([1.0, 2.0])


def _same(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(
        np.asarray(x).dtype == np.asarray(y).dtype and np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(la, lb, strict=True))


class _Captured:
    def __init__(self, capsys):
        self.capsys, self.text = capsys, ""

    def getvalue(self):
        self.text += self.capsys.readouterr().err
        return self.text


@pytest.fixture
def plain(monkeypatch, capsys):
    """Plain lines (pytest's captured stderr is not a terminal), every report printed."""
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)
    return _Captured(capsys)


CASES = {
    "fixed": dict(solver=sl.RK4(), dt=1e-3),
    "fixed-steps": dict(solver=sl.RK4(), dt=0.01, saveat=sl.SaveAt(steps=True)),
    "fixed-ts-checkpointed": dict(solver=sl.RK4(), dt=0.01, saveat=sl.SaveAt(ts=jnp.linspace(
        0.0, 2.0, 7)), adjoint=sl.Checkpointed()),
    "adaptive": dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12, max_steps=1600),
    "adaptive-ts": dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12, max_steps=1600,
                        saveat=sl.SaveAt(ts=jnp.linspace(0.0, 2.0, 7))),
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "adaptive-ts"
                                  else n for n in CASES])
def test_solve_progress_is_bit_identical_and_reports(name, plain):
    kw = CASES[name]
    quiet = sl.solve(decay, Y0, 0.0, 2.0, args=1.5, **kw)
    shown = sl.solve(decay, Y0, 0.0, 2.0, args=1.5, progress=True, **kw)
    assert _same(quiet, shown)
    # and right: y = y0 exp(-1.5 t)
    np.testing.assert_allclose(np.asarray(shown.ys[-1]), np.asarray(Y0) * np.exp(-3.0),
                               rtol=1e-8)
    text = plain.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert lines[-1].startswith("solve: 100%") and lines[-1].endswith("(done)")
    if name == "fixed":  # 2000 steps, reported every 20 from inside the loop
        assert len(lines) >= 100


def test_solve_progress_under_jit_vmap_grad(plain):
    kw = dict(solver=sl.RK4(), dt=0.01)

    def final(a, y0=Y0, progress_on=True):
        return sl.solve(decay, y0, 0.0, 1.0, args=a, progress=progress_on, **kw).ys[-1, 0]

    a = jnp.asarray(0.7)
    ref = float(final(a, progress_on=False))
    assert float(jax.jit(final)(a)) == ref
    ys = jax.vmap(lambda y: final(a, y0=y))(jnp.stack([Y0, 2 * Y0]))
    assert float(ys[0]) == ref and float(ys[1]) == float(final(a, y0=2 * Y0, progress_on=False))
    g = jax.grad(final)(a)
    assert float(g) == float(jax.grad(lambda a: final(a, progress_on=False))(a))
    np.testing.assert_allclose(float(g), -np.exp(-0.7), rtol=1e-8)  # d/da exp(-a) at t = 1
    assert plain.getvalue() == ""  # traced calls carry no callback


def test_plain_lines_are_throttled():
    stream = io.StringIO()
    bar = progress.bar(True, 1000, "run", stream=stream)  # StringIO: not a terminal
    for _ in range(1000):
        bar.update(1)
    bar.close()
    assert stream.getvalue() == ""  # under PLAIN_INTERVAL seconds: nothing at all


def test_plain_line_format(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_INTERVAL", 0.0)
    stream = io.StringIO()
    with progress.bar(True, 10, "fit", stream=stream) as bar:
        bar.update(4)
        bar.set_postfix_str("loss=0.5")
        bar.update(6)
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("fit:  40% (4/10 step)")
    assert lines[-1].startswith("fit: 100% (10/10 step)") and "loss=0.5" in lines[-1]
    assert "\r" not in stream.getvalue()


def test_progress_off_writes_nothing(plain):
    sl.solve(decay, Y0, 0.0, 1.0, args=1.0, solver=sl.RK4(), dt=0.01, progress=False)
    with progress.bar(False, 10, "x") as bar:
        bar.update(10)
    assert plain.getvalue() == ""


def test_fit_progress_is_bit_identical(plain):
    ts = jnp.linspace(0.0, 1.0, 5)
    data = 2.0 * jnp.exp(-0.8 * ts)

    def loss(p):
        return jnp.mean((p["y0"] * jnp.exp(-p["k"] * ts) - data) ** 2)

    kw = dict(steps=60, chunk=20)
    quiet = sl.fit(loss, {"k": 0.3, "y0": 1.0}, progress=False, **kw)
    shown = sl.fit(loss, {"k": 0.3, "y0": 1.0}, progress=True, **kw)
    assert _same(quiet.params, shown.params) and np.array_equal(quiet.history, shown.history)
    assert "fit:" in plain.getvalue() and "loss=" in plain.getvalue()


@pytest.mark.parametrize("brownian", [pytest.param("tree", marks=pytest.mark.slow), "steps"])
def test_sde_solve_progress_is_bit_identical_and_reports(brownian, plain):
    """An SDE (GBM, Euler-Maruyama) with progress=True: the same bits as without, and right:
    the ensemble mean of 2,000 paths against E X_T = x0 exp(mu T) (5 standard errors)."""
    kw = dict(solver=sl.EulerMaruyama(), dt=2 ** -8, diffusion=lambda t, y, a: 0.3 * y,
              key=jax.random.key(2), args=0.5, brownian=brownian)
    y0 = jnp.ones(2000)
    quiet = sl.solve(lambda t, y, a: a * y, y0, 0.0, 1.0, **kw)
    shown = sl.solve(lambda t, y, a: a * y, y0, 0.0, 1.0, progress=True, **kw)
    assert _same(quiet, shown)
    x = np.asarray(shown.ys[-1])
    sd = np.exp(0.5) * np.sqrt(np.expm1(0.09))
    assert abs(x.mean() - np.exp(0.5)) < 5 * sd / np.sqrt(x.size)
    lines = plain.getvalue().splitlines()
    assert lines[-1].startswith("solve: 100%") and lines[-1].endswith("(done)")
    assert len(lines) >= 50


def test_solve_ensemble_progress_counts_finished_members(plain):
    """solve_ensemble(progress=True): the same bits as without, right against the closed
    form y0 exp(-k t1), and a bar that counts members up to all of them."""
    t1 = jnp.where(jnp.arange(8) == 5, 8.0, 1.0)
    kw = dict(solver=sl.Tsit5(), rtol=1e-10, atol=1e-12, args=0.5, chunk_steps=8,
              min_bucket=1)
    quiet = sl.solve_ensemble(decay, jnp.ones((8, 1)), 0.0, t1, **kw)
    shown = sl.solve_ensemble(decay, jnp.ones((8, 1)), 0.0, t1, progress=True, **kw)
    assert _same(quiet, shown)
    np.testing.assert_allclose(np.asarray(shown.ys[:, -1, 0]), np.exp(-0.5 * np.asarray(t1)),
                               rtol=1e-8)
    lines = plain.getvalue().splitlines()
    assert lines[-1].startswith("solve_ensemble: 100%") and lines[-1].endswith("(done)")
    assert "8/8 member" in lines[-1] and any("7/8 member" in ln for ln in lines)
