"""Cross-checks of the SDE solver against the particle engine, and the Kramers example's CLI.

* The same Langevin equation ``dx = v dt``, ``dv = (-k x / m - gamma v) dt +
  sqrt(2 gamma kT / m) dW`` (independent harmonic oscillators) through the particle engine's
  BAOAB integrator (``sp.Langevin``) and through ``sl.solve(..., diffusion=)``: both reach the
  equipartition temperature ``kT`` (exact, the reference outside both) and agree with each
  other within their statistical errors (``kT sqrt(2 / N)`` for ``N`` independent degrees of
  freedom, each sampled once at the end of a run ten relaxation times long).
* ``examples/kramers.py`` rejects bad values with exit status 2 and one line naming the
  option, before any work; a tiny run writes its result and figure.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import particles as sp

ROOT = Path(__file__).resolve().parent.parent
KT, GAMMA, K_SPRING, MASS = 1.5, 1.0, 1.0, 2.0
N_PART, DIM = 1000, 3  # 3000 independent degrees of freedom: SE of a temperature 2.6 %
T_END, DT = 12.0, 0.02  # energy relaxes as e^{-gamma t}: 6e-6 of the start left at T_END
SEGMENTS = 4
Z_MAX = 4.0


def _harmonic(positions, params, neighbors=None):
    return 0.5 * params["k"] * jnp.sum(positions**2)


def _temperatures(x, v):
    """Kinetic ``m <v^2>`` and configurational ``k <x^2>`` temperature, with standard errors
    (Gaussian: ``kT sqrt(2 / N)``)."""
    x, v = np.asarray(x).ravel(), np.asarray(v).ravel()
    n = x.size
    t_kin, t_conf = MASS * np.mean(v**2), K_SPRING * np.mean(x**2)
    return (t_kin, t_kin * math.sqrt(2.0 / n)), (t_conf, t_conf * math.sqrt(2.0 / n))


@pytest.fixture(scope="module")
def particle_engine():
    """BAOAB from rest (x = v = 0): the final frame's temperatures."""
    zeros = jnp.zeros((N_PART, DIM))
    traj = sp.simulate(_harmonic, sp.State(zeros, zeros, MASS), dict(k=K_SPRING),
                       space=sp.free(), dt=DT, n_steps=int(round(T_END / DT)),
                       integrator=sp.Langevin(KT, GAMMA), key=jax.random.key(1))
    return _temperatures(traj.final.positions, traj.final.velocities)


def _langevin_drift(t, y, args):
    x, v = y
    k, m, gamma, _ = args
    return (v, -k * x / m - gamma * v)


def _langevin_diffusion(t, y, args):
    x, v = y
    _, m, gamma, kT = args
    return (jnp.zeros_like(x), jnp.sqrt(2.0 * gamma * kT / m) * jnp.ones_like(v))


def _general_solver(solver, dt, key):
    """The same equation through ``sl.solve`` (diagonal noise on the ``(x, v)`` pytree), in
    ``SEGMENTS`` consecutive solves with keys folded from ``key`` (one Brownian path)."""
    args = tuple(jnp.float64(a) for a in (K_SPRING, MASS, GAMMA, KT))
    span = T_END / SEGMENTS

    @jax.jit
    def segment(y, key):
        sol = sl.solve(_langevin_drift, y, 0.0, span, solver=solver, dt=dt,
                       diffusion=_langevin_diffusion, key=key, args=args,
                       saveat=sl.SaveAt(t1=True))
        return jax.tree_util.tree_map(lambda a: a[-1], sol.ys)

    y = (jnp.zeros((N_PART, DIM)), jnp.zeros((N_PART, DIM)))
    for i in range(SEGMENTS):
        y = segment(y, jax.random.fold_in(key, i))
    return _temperatures(*y)


@pytest.fixture(scope="module")
def general_sra1():
    return _general_solver(sl.SRA1(), DT, jax.random.key(2))


def _z(a, b):
    return (a[0] - b[0]) / math.hypot(a[1], b[1])


def test_both_engines_reach_the_equipartition_temperature(particle_engine, general_sra1):
    for name, temps in (("particles BAOAB", particle_engine), ("solve SRA1", general_sra1)):
        for kind, (t, se) in zip(("kinetic", "configurational"), temps, strict=True):
            z = (t - KT) / se
            assert abs(z) < Z_MAX, f"{name} {kind} temperature {t:.4f} vs kT {KT} (z = {z:.2f})"


def test_particle_engine_and_general_solver_agree(particle_engine, general_sra1):
    for i, kind in enumerate(("kinetic", "configurational")):
        z = _z(particle_engine[i], general_sra1[i])
        assert abs(z) < Z_MAX, (f"{kind} temperature: particles {particle_engine[i][0]:.4f}, "
                                f"solve {general_sra1[i][0]:.4f} (z = {z:.2f})")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["EulerMaruyama", "StochasticHeun"])
def test_other_methods_agree_with_the_particle_engine(particle_engine, method):
    temps = _general_solver(getattr(sl, method)(), DT / 4, jax.random.key(3))
    for i, kind in enumerate(("kinetic", "configurational")):
        z = _z(particle_engine[i], temps[i])
        assert abs(z) < Z_MAX, f"{method} {kind} temperature {temps[i][0]:.4f} (z = {z:.2f})"


def test_a_wrong_diffusion_is_detected(particle_engine):
    """The check has power: the engines' statistics reject sqrt(gamma kT / m) (a missing 2)."""
    (t_kin, se), _ = particle_engine
    assert abs(t_kin / 2 - KT) / se > 10  # half the temperature is 19 standard errors off


# --------------------------------------------------------------------------------------
# examples/kramers.py


@pytest.fixture(scope="module")
def kramers():
    spec = importlib.util.spec_from_file_location("kramers_example", ROOT / "examples" /
                                                  "kramers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv, option", [
    (["--n", "0"], "--n"),
    (["--n", "ten"], "--n"),
    (["--dt", "-0.01"], "--dt"),
    (["--dt", "nan"], "--dt"),
    (["--dt", "1"], "--dt"),
    (["--barrier", "0"], "--barrier"),
    (["--barrier", "inf"], "--barrier"),
    (["--steps", "-5"], "--steps"),
    (["--steps", "2.5"], "--steps"),
    (["--seed", "-1"], "--seed"),
    (["--method", "RK4"], "--method"),
    (["--brownian", "fast"], "--brownian"),
    (["--out", "result.png"], "--out"),
    (["--plot", "figure.txt"], "--plot"),
])
def test_kramers_bad_values_exit_2_in_one_line(kramers, monkeypatch, capsys, argv, option):
    def no_work(opts):
        raise AssertionError("the example started work before checking its arguments")

    monkeypatch.setattr(kramers, "run", no_work)
    with pytest.raises(SystemExit) as exc:
        kramers.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err, err


def test_kramers_help_shows_the_defaults(kramers, capsys):
    with pytest.raises(SystemExit) as exc:
        kramers.main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for text in ("default: 1000", "default: 5.0", "default: 0.01", "default: SRA1"):
        assert text in out


def test_kramers_tiny_run_writes_result_and_figure(kramers, tmp_path, capsys):
    out, fig = tmp_path / "k.npz", tmp_path / "k.png"
    kramers.main(["--n", "64", "--barrier", "2", "--steps", "2048", "--quiet",
                  "--out", str(out), "--plot", str(fig)])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("kramers: 64 paths"), lines
    assert all(line.startswith("wrote ") for line in lines[:-1]), lines
    data = np.load(out)
    assert data["escape_times"].shape == (64,)
    assert fig.stat().st_size > 10_000
    # at dU/kT = 2 the mean escape time (about 8) is far below the horizon (20.48)
    assert np.isfinite(data["escape_times"]).mean() > 0.8


def test_kramers_step_noise_rate_matches_the_exact_mean_first_passage_time(kramers):
    """brownian="steps": 512 paths at dU/kT = 2 (escape in ~8 time units, horizon 40.96);
    the censored rate estimate against the exact MFPT rate (scipy quadrature) within 4
    standard errors."""
    opts = kramers.build_parser().parse_args(["--n", "512", "--barrier", "2", "--steps",
                                              "4096", "--brownian", "steps", "--quiet"])
    res = kramers.run(opts)
    assert res["events"] > 400
    assert abs(res["rate"] - res["k_exact"]) < 4 * res["se"], (res["rate"], res["k_exact"])


def test_kramers_solver_error_is_one_line_exit_1(kramers, monkeypatch, capsys):
    def failing(opts):
        raise sl.SolverError("non-finite state in segment 0\nsecond line",
                             sl.Result.NONFINITE_STATE)

    monkeypatch.setattr(kramers, "run", failing)
    with pytest.raises(SystemExit) as exc:
        kramers.main(["--n", "4"])
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("error: non-finite state in segment 0"), err
