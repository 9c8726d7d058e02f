"""simlib.plot: each function draws what it is given, with labelled axes, log scales where
they belong and legends; checked on the Agg backend against numpy and closed forms (the
harmonic oscillator's energy, a synthetic error of exact order, a simple cubic lattice's
neighbour shells, percentiles of a known ensemble).
"""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import simlib as sl  # noqa: E402
from simlib import particles as sp  # noqa: E402
from simlib import plot  # noqa: E402
from simlib.fit import FitResult  # noqa: E402

PAGE = Path(__file__).resolve().parent.parent / "docs" / "plotting.md"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def oscillator(t, y, args):
    return {"q": y["p"], "p": -y["q"]}


def run_oscillator(q0):
    return sl.solve(oscillator, {"q": q0, "p": jnp.zeros_like(q0)}, 0.0, 6.0, solver=sl.RK4(),
                    dt=0.1, saveat=sl.SaveAt(ts=jnp.linspace(0.0, 6.0, 31)))


@pytest.fixture(scope="module")
def sol():
    return run_oscillator(jnp.array([1.0, 0.5]))


@pytest.fixture(scope="module")
def ensemble():
    return jax.vmap(run_oscillator)(jnp.array([[1.0, 0.5], [2.0, 0.1], [0.5, 0.2]]))


def lines(ax):
    return [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]


def test_trajectory_draws_each_component_with_units(sol, ensemble):
    fig, ax = plot.trajectory(sol, t_unit="s", y_unit="m")
    assert fig is ax.figure
    assert ax.get_xlabel() == "t [s]" and ax.get_ylabel() == "state [m]"
    assert [ln.get_label() for ln in lines(ax)] == ["p[0]", "p[1]", "q[0]", "q[1]"]
    q0 = lines(ax)[2]
    np.testing.assert_allclose(q0.get_xdata(), np.linspace(0, 6, 31))
    np.testing.assert_allclose(q0.get_ydata(), np.cos(np.linspace(0, 6, 31)), atol=1e-5)
    assert ax.get_legend() is not None
    # A chosen component into a given axes; a batch draws every member.
    fig2, ax2 = plt.subplots()
    out = plot.trajectory(ensemble, components=["q[0]"], ax=ax2)
    assert out == (fig2, ax2) and len(ax2.get_lines()) == 3
    with pytest.raises(ValueError, match="no component named 'x'"):
        plot.trajectory(sol, components="x")
    with pytest.raises(ValueError, match="25 components; choose"):
        plot.trajectory((np.arange(3.0), np.zeros((3, 25))))


def test_phase_portrait_by_name_index_and_function(sol, ensemble):
    _, ax = plot.phase_portrait(sol, "q[0]", "p[0]", x_unit="m", y_unit="kg m/s")
    assert ax.get_xlabel() == "q[0] [m]" and ax.get_ylabel() == "p[0] [kg m/s]"
    curve = ax.get_lines()[0]
    ts = np.linspace(0, 6, 31)
    np.testing.assert_allclose(curve.get_xdata(), np.cos(ts), atol=1e-5)
    np.testing.assert_allclose(curve.get_ydata(), -np.sin(ts), atol=1e-5)
    _, ax = plot.phase_portrait(ensemble, lambda ys: ys["q"][..., 1],
                                lambda ys: ys["p"][..., 1], x_label="q1", y_label="p1")
    assert ax.get_xlabel() == "q1"
    assert len(ax.get_lines()) == 6  # three members, each a curve and a start marker


def test_energy_error_of_solution_trajectory_and_arrays(sol):
    energy = lambda y: 0.5 * jnp.sum(y["q"] ** 2 + y["p"] ** 2)  # noqa: E731
    _, ax = plot.energy_error(sol, energy, label="RK4", t_unit="s")
    assert ax.get_yscale() == "log"
    assert ax.get_ylabel() == "|E(t) - E(0)| / |E(0)|" and ax.get_xlabel() == "t [s]"
    # Against the energy computed here from the saved states.
    q, p = np.asarray(sol.ys["q"]), np.asarray(sol.ys["p"])
    e = 0.5 * np.sum(q * q + p * p, axis=1)
    want = np.abs(e - e[0]) / e[0]
    got = lines(ax)[0].get_ydata()
    assert np.isnan(got[0])  # zero at t = 0: not drawn on a log axis
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-12)
    # RK4 damps the oscillator exactly: |R(ih)|^2 = 1 - h^6/72 + h^8/576 per step.
    h = 0.1
    np.testing.assert_allclose(got[-1], 1 - (1 - h**6 / 72 + h**8 / 576) ** 60, rtol=1e-8)
    _, ax = plot.energy_error(np.arange(3.0), np.array([2.0, 2.0, 1.0]), relative=False,
                              quantity="H")
    assert ax.get_ylabel() == "|H(t) - H(0)|"
    np.testing.assert_array_equal(ax.get_lines()[0].get_ydata(), [np.nan, np.nan, 1.0])
    with pytest.raises(TypeError, match="function of one saved state"):
        plot.energy_error(sol)
    with pytest.raises(ValueError, match="pass relative=False"):
        plot.energy_error(np.arange(2.0), np.array([0.0, 1.0]))


def test_convergence_slope_against_exact_order():
    dts = np.array([0.2, 0.1, 0.05, 0.025, 0.0125])
    errors = 3.0 * dts**3
    assert plot.fitted_order(dts, errors) == pytest.approx(3.0, abs=1e-12)
    floor = np.where(dts < 0.03, 1e-15, 2.0 * dts**3)  # the two smallest steps at round-off
    _, ax = plot.convergence(dts, {"exact": errors, "floored": floor},
                             order={"exact": 3, "floored": 3}, floor=1e-14, dt_unit="s")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "dt [s]" and ax.get_ylabel() == "error"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["exact (slope 3.00)", "floored (slope 3.00)"]
    notes = [t.get_text() for t in ax.texts]
    assert notes == ["order 3", "order 3"]
    # Each series: the data, the fitted line, the reference slope (dashed).
    assert len(ax.get_lines()) == 6
    ref = ax.get_lines()[2]
    x, y = ref.get_xdata(), ref.get_ydata()
    assert ref.get_linestyle() == "--"
    np.testing.assert_allclose(np.diff(np.log(y)) / np.diff(np.log(x)), 3.0)
    # A single series with a fit window: the two smallest steps left out.
    _, ax = plot.convergence(dts, floor, label="Euler", fit=slice(2, None))
    assert ax.get_legend().get_texts()[0].get_text() == "Euler (slope 3.00)"


def test_work_precision_axes():
    res = {"A": ([1e2, 1e3], [1e-3, 1e-7]), "B": ([2e2, 2e3], [1e-4, 1e-9])}
    _, ax = plot.work_precision(res, cost="fevals")
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlabel() == "function evaluations"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A", "B"]
    _, ax = plot.work_precision(res, error_label="max error at t1")
    assert ax.get_xlabel() == "wall time [s]" and ax.get_ylabel() == "max error at t1"


def test_fit_history_and_data_vs_model(sol):
    res = FitResult(params={"a": 1.0}, loss=0.01, history=np.array([1.0, 0.1, 0.01]),
                    grad_norm=1e-9, n_steps=2, converged=True, message="ok")
    _, ax = plot.fit_history({"adam": res, "raw": np.array([2.0, 1.0, 0.0])})
    assert ax.get_yscale() == "log" and ax.get_xlabel() == "step" and ax.get_ylabel() == "loss"
    assert [ln.get_label() for ln in lines(ax)] == ["adam", "raw"]
    np.testing.assert_array_equal(lines(ax)[1].get_ydata(), [2.0, 1.0, np.nan])
    ts = np.linspace(0, 6, 7)
    data = np.stack([np.cos(ts), -np.sin(ts)], axis=1)
    model = (sol.ts, jnp.stack([sol.ys["q"][:, 0], sol.ys["p"][:, 0]], axis=1))
    _, ax = plot.data_vs_model(ts, data, model, labels=["q", "p"], t_unit="s")
    assert [ln.get_label() for ln in lines(ax)] == ["q model", "q data", "p model", "p data"]
    assert lines(ax)[0].get_color() == lines(ax)[1].get_color()
    with pytest.raises(ValueError, match="3 components, the model 2"):
        plot.data_vs_model(ts, np.zeros((7, 3)), model)


def test_radial_distribution_of_a_simple_cubic_lattice():
    """Spacing 1 in a box of 4: the neighbour shells lie at 1, sqrt 2, sqrt 3 and 2."""
    grid = np.arange(4.0)
    x = np.stack(np.meshgrid(grid, grid, grid, indexing="ij"), -1).reshape(-1, 3) + 0.5
    space = sp.periodic(4.0)
    _, ax = plot.radial_distribution(jnp.asarray(x), space=space, r_max=1.9, n_bins=38,
                                     r_unit="nm", label="sc")
    assert ax.get_xlabel() == "r [nm]" and ax.get_ylabel() == "g(r)"
    r, g = ax.get_lines()[0].get_xdata(), ax.get_lines()[0].get_ydata()
    width = 1.9 / 38
    occupied = r[g > 0]
    shells = np.array([1.0, np.sqrt(2), np.sqrt(3)])
    assert len(occupied) == 3
    np.testing.assert_array_less(np.abs(occupied - shells), width / 2 + 1e-12)
    assert ax.get_lines()[1].get_ydata()[0] == 1.0  # the ideal-gas line
    with pytest.raises(TypeError, match="space= and r_max="):
        plot.radial_distribution(jnp.asarray(x))


def test_ensemble_fan_bands_are_the_percentiles(ensemble):
    t = np.linspace(0.0, 1.0, 5)
    z = np.random.default_rng(0).standard_normal(101)
    values = z[:, None] * t[None, :]
    _, ax = plot.ensemble_fan(t, values, percentiles=(10, 25), y_label="x", y_unit="m")
    assert ax.get_ylabel() == "x [m]"
    median = lines(ax)[-1]
    np.testing.assert_allclose(median.get_ydata(), np.median(z) * t)
    bands = ax.collections
    assert [b.get_label() for b in bands] == ["10-90%", "25-75%"]
    # The outer band's upper edge at t = 1 is the 90th percentile of z.
    verts = bands[0].get_paths()[0].vertices
    at_one = verts[np.isclose(verts[:, 0], 1.0)][:, 1]
    np.testing.assert_allclose(sorted(set(np.round(at_one, 12))),
                               np.round(np.percentile(z, [10, 90]), 12))
    _, ax = plot.ensemble_fan(ensemble, component="q[0]", members=2)
    assert ax.get_ylabel() == "q[0]"
    assert len(ax.get_lines()) == 3  # two members and the median
    with pytest.raises(ValueError, match="must be batched"):
        plot.ensemble_fan(run_oscillator(jnp.array([1.0, 0.5])))


def test_import_simlib_does_not_load_matplotlib():
    code = ("import sys, simlib; assert 'matplotlib' not in sys.modules; "
            "simlib.plot; assert 'matplotlib' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow  # ~10 s: nine examples, each compiling its own solve
def test_plotting_page_runs():
    """The python blocks of docs/plotting.md run in order and each returns (fig, ax)."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) >= 9
    ns: dict = {}
    with contextlib.redirect_stdout(io.StringIO()):
        for block in blocks:
            exec(compile(block, str(PAGE), "exec"), ns)  # noqa: S102 - our own docs
    assert len(plt.get_fignums()) >= 9
