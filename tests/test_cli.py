"""The `simlib` command and the examples' shared conventions (simlib/cli.py, examples/).

Cheap by design: every bad option is rejected by the example's parser before any JAX work,
so the examples' ``main(argv)`` run in this process; two subprocesses check the console
entry point itself (``list``, ``info``). Running the examples end to end is left to their
own tests and to ``simlib run NAME`` by hand (docs/cli.md).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simlib import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))

# (example, bad arguments, the option the one-line error must name)
BAD = [
    ("lorenz", ["--rtol", "-1"], "--rtol"),              # a reported traceback
    ("fit_lotka_volterra", ["--steps", "-3"], "--steps"),  # a reported traceback
    ("fit_lj", ["--steps", "-1"], "--steps"),            # a reported traceback after 15 s
    ("lorenz", ["--t1", "nan"], "--t1"),
    ("kepler", ["--eccentricity", "1"], "--eccentricity"),
    ("pendulum", ["--a-min", "1.2", "--a-max", "1.0"], "--a-max"),
    ("pendulum", ["--n", "0"], "--n"),
    ("nbody", ["--n", "1"], "--n"),
    ("nbody", ["--dt", "inf"], "--dt"),
    ("gravity", ["--save-every", "7"], "--save-every"),
    ("lj_fluid", ["--n-cells", "1"], "--r-cut"),
    ("robertson", ["--solver", "Tsit5"], "--solver"),
    ("bouncing_ball", ["--restitution", "1.5"], "--restitution"),
    ("projectile", ["--dt", "0"], "--dt"),
    ("fit_pendulum", ["--points", "2"], "--points"),
    ("fit_lorenz_shooting", ["--segment", "0.33"], "--segment"),
    ("neural_ode", ["--t-end", "1"], "--t-end"),
    ("fit_lotka_volterra", ["--optimizer", "newton"], "--optimizer"),
    ("fit_lotka_volterra", ["--noise", "abc"], "--noise"),
]


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"_example_{name}", ROOT / "examples"
                                                  / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def examples():
    return {name: load(name) for name in EXAMPLES}


def one_line_error(capsys, main, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err   # one line, no traceback
    assert ": error: " in err and "Traceback" not in err
    return err


@pytest.mark.parametrize("name, argv, option", BAD, ids=[f"{n}{a}" for n, a, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_option(examples, capsys, name, argv, option):
    err = one_line_error(capsys, examples[name].main, argv)
    assert f"argument {option}" in err, err


def test_the_reported_message_reads_like_argparse(examples, capsys):
    err = one_line_error(capsys, examples["lorenz"].main, ["--rtol", "-1"])
    assert err.endswith("error: argument --rtol: must be positive, got -1\n"), err


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_example_follows_the_conventions(examples, capsys, monkeypatch, tmp_path, name):
    """--help shows every default; --plot and --out check their extension; --quiet exists."""
    if "from simlib import cli" not in (ROOT / "examples" / f"{name}.py").read_text():
        pytest.skip(f"examples/{name}.py does not use simlib.cli yet (docs/cli.md)")
    parsers = []
    original = cli.ExampleParser.parse_args

    def spy(self, *args, **kwargs):
        parsers.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cli.ExampleParser, "parse_args", spy)
    with pytest.raises(SystemExit) as stop:
        examples[name].main(["--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    (parser,) = parsers
    assert issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    options = {s for a in parser._actions for s in a.option_strings}
    assert {"--plot", "--out", "--quiet"} <= options, name
    for action in parser._actions:
        assert action.help, (name, action.option_strings)  # so the formatter adds its default
    assert text.count("(default:") >= len(parser._actions) - 1  # all but --help
    monkeypatch.chdir(tmp_path)
    assert "argument --plot" in one_line_error(capsys, examples[name].main,
                                               ["--plot", "figure.txt"])
    assert "argument --out" in one_line_error(capsys, examples[name].main, ["--out", "r.csv"])
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("content, message", [
    ("", "the file is empty"),
    ("time,prey,predators\n0,1,2\n", "line 1 must be the header t,x,y"),
    ("t,x,y\n0,1,2\n1,abc,3\n2,1,1\n", "line 3: expected three finite numbers"),
    ("t,x,y\n0,1,2\n1,2\n2,1,1\n", "line 3: expected three finite numbers"),
    ("t,x,y\n0,1,2\n1,-2,3\n2,1,1\n", "line 3: populations must be positive"),
    ("t,x,y\n0,1,2\n1,1,3\n1,1,1\n", "line 4: times must increase"),
    ("t,x,y\n0,1,2\n1,1,3\n", "need at least 3 observations"),
])
def test_a_malformed_csv_is_one_line(examples, capsys, tmp_path, content, message):
    path = tmp_path / "obs.csv"
    path.write_text(content)
    err = one_line_error(capsys, examples["fit_lotka_volterra"].main, ["--data", str(path)])
    assert "argument --data" in err and message in err, err


def test_the_shipped_csv_parses():
    import csv

    with (ROOT / "examples" / "data" / "lotka_volterra.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["t", "x", "y"] and len(rows) == 42
    _, t, obs = load("fit_lotka_volterra").read_csv(
        str(ROOT / "examples" / "data" / "lotka_volterra.csv"))
    assert t.shape == (41,) and obs.shape == (41, 2) and np.all(np.diff(t) > 0)


def test_argument_types():
    ok = {cli.positive_float: "2.5", cli.nonnegative_float: "0", cli.positive_int: "3",
          cli.nonnegative_int: "0", cli.probability: "1", cli.finite_float: "-4"}
    for check, text in ok.items():
        assert check(text) == float(text)
    bad = [(cli.positive_float, "0", "must be positive"), (cli.positive_float, "inf", "finite"),
           (cli.nonnegative_float, "-1e-300", ">= 0"), (cli.positive_int, "0", "at least 1"),
           (cli.positive_int, "1.5", "an integer"), (cli.nonnegative_int, "-2", ">= 0"),
           (cli.probability, "1.01", "[0, 1]"), (cli.finite_float, "nan", "finite")]
    for check, text, message in bad:
        with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[")):
            check(text)


def test_save_result_round_trips(tmp_path):
    a = np.arange(6.0).reshape(2, 3)
    path = cli.save_result(tmp_path / "sub" / "r.npz", dict(seed=3, solver="Tsit5"), ys=a)
    z = np.load(path)
    np.testing.assert_array_equal(z["ys"], a)
    assert int(z["meta_seed"]) == 3 and str(z["meta_solver"]) == "Tsit5"
    h5py = pytest.importorskip("h5py")
    path = cli.save_result(tmp_path / "r.h5", dict(seed=3), ys=a)
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["ys"][()], a)
        assert f.attrs["seed"] == 3


def test_summary_is_one_line(capsys):
    line = cli.summary("demo: 3 members", compile_s=1.234, run_s=0.0456, result="err 1e-9")
    assert capsys.readouterr().out == line + "\n"
    assert line == "demo: 3 members | compile 1.23 s | run 0.0456 s | err 1e-9"


def test_run_and_list_in_process(capsys):
    assert cli.main(["run", "no_such_example"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lorenz" in err and "pendulum" in err
    # an example through `simlib run` (this one calls no fast_cpu_loops, which must come
    # before JAX starts): its errors carry the command's name
    assert cli.main(["run", "gravity", "--save-every", "7"]) == 2
    assert capsys.readouterr().err.startswith("simlib run gravity: error: argument --save")
    assert cli.main(["nope"]) == 2
    assert cli.main(["bench", "nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    assert set(cli.list_examples()) == set(EXAMPLES)
    assert {"lorenz", "pendulum", "kepler", "nbody", "lj_fluid", "fit_lotka_volterra",
            "robertson"} <= set(EXAMPLES)


def _simlib(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "simlib.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120, cwd=ROOT)


def test_console_entry_point_lists_the_examples():
    proc = _simlib("list")
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == EXAMPLES
    assert all(len(line.split(None, 1)) == 2 for line in proc.stdout.splitlines())


def test_info_reports_versions_devices_float64_and_native_kernels():
    import jax
    import jaxlib

    proc = _simlib("info")
    assert proc.returncode == 0, proc.stderr
    rows = dict(line.split(None, 1) if not line.startswith("native kernels") else
                ("native kernels", line[len("native kernels"):].strip())
                for line in proc.stdout.splitlines() if line.strip())
    assert rows["jax"].strip() == jax.__version__ and rows["jaxlib"].strip() == jaxlib.__version__
    assert rows["float64"].startswith("off")  # simlib never turns it on by itself
    assert "cpu" in rows["devices"]
    assert rows["native kernels"].split(":")[0] in (
        "loaded", "not loaded", "not built yet", "off", "unavailable")


def test_a_failed_solve_is_one_line_and_exit_1(capsys):
    """Eager, and under jit, where the SolverError arrives wrapped in JAX's runtime error."""
    import jax
    import jax.numpy as jnp

    import simlib as sl

    def decay(t, y, args):
        return -y

    def solve(y0):
        return sl.solve(decay, y0, 0.0, 10.0, solver=sl.Tsit5(), rtol=1e-8, atol=1e-8,
                        max_steps=2).ys

    for run in (solve, jax.jit(solve)):
        main = cli.script(lambda argv, run=run: run(jnp.ones(2)))
        with pytest.raises(SystemExit) as stop:
            main([])
        assert stop.value.code == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert "error: solve: the step budget max_steps=2 was exhausted" in err, err
