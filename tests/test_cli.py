"""The `simlib` command and the examples' shared conventions (simlib/cli.py, examples/).

Cheap by design: every bad option (an output that cannot be written and a checkpoint that
cannot be resumed included) is rejected by the example's parser before any JAX work, so
the examples' ``main(argv)`` run in this process; two subprocesses check the console entry
point itself (``list``, ``info``). The examples run end to end, as subprocesses with tiny
settings, only in the slow set: every one with ``--quiet`` (the summary line only),
``kepler``'s summary, and ``lj_fluid``'s checkpoint, resume and refusals.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simlib import cli
from simlib import particles as sp

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
    ("fit_lj", ["--cells", "3"], "--cells"),            # a traceback: the box < 2 (r_cut + skin)
    ("fit_lj", ["--sigma", "0.5"], "--cells"),          # the same: the box scales with sigma
    ("lorenz", ["--seed", "4294967296"], "--seed"),     # silently the same key as --seed 0
    ("nbody", ["--seed", str(2**64)], "--seed"),        # an OverflowError traceback
    ("lj_fluid", ["--resume"], "--resume"),
    ("lj_fluid", ["--resume", "--resume-if-exists", "--checkpoint", "c.npz"],
     "--resume-if-exists"),
    ("lj_fluid", ["--checkpoint", "c.h5"], "--checkpoint"),
    ("lj_fluid", ["--pairs", "cuda"], "--pairs"),
    ("lj_fluid", ["--n-cells", "4", "--pairs", "cells"], "--pairs"),   # box < 3 cells a side
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
    assert err.endswith("error: argument --rtol: must be in (0, 1), got -1\n"), err


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
    # Every output is opened before the work: a path that passes the folder check but cannot
    # be created (a name too long for the file system; /proc, even for root) is one line.
    long_name = "x" * 300
    outputs = {"--plot": ".png", "--out": ".npz", "--checkpoint": ".npz"}
    for option, suffix in outputs.items():
        if option not in options:
            continue
        err = one_line_error(capsys, examples[name].main,
                             [option, str(Path("new", "sub", long_name + suffix))])
        assert f"argument {option}: cannot write" in err, err
        if Path("/proc/self").is_dir():
            err = one_line_error(capsys, examples[name].main, [option, "/proc/x" + suffix])
            assert f"argument {option}" in err and "cannot write" in err, err
    assert not list(tmp_path.iterdir())  # the folders tried are removed again


def test_examples_print_through_the_quiet_printer():
    """stdout goes through ``cli.printer(quiet)`` or ``cli.summary``, so --quiet leaves the
    summary line only: no example calls ``print`` without ``file=`` (stderr)."""
    for name in EXAMPLES:
        tree = ast.parse((ROOT / "examples" / f"{name}.py").read_text())
        bare = [node.lineno for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"
                and not any(k.arg == "file" for k in node.keywords)]
        assert not bare, f"examples/{name}.py prints to stdout at lines {bare}"
        saves = [node.lineno for node in ast.walk(tree)
                 if isinstance(node, ast.Call)
                 and getattr(node.func, "attr", None) in ("save_result", "save_figure")
                 and not any(k.arg == "quiet" for k in node.keywords)]
        assert not saves, f"examples/{name}.py: 'wrote PATH' under --quiet at lines {saves}"


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
    assert cli.seed("0") == 0 and cli.seed(str(2**32 - 1)) == 2**32 - 1
    bad = [(cli.seed, "-1", r"in \[0, 4294967295\]"), (cli.seed, str(2**32), "4294967295"),
           (cli.positive_float, "0", "must be positive"), (cli.positive_float, "inf", "finite"),
           (cli.nonnegative_float, "-1e-300", ">= 0"), (cli.positive_int, "0", "at least 1"),
           (cli.positive_int, "1.5", "an integer"), (cli.nonnegative_int, "-2", ">= 0"),
           (cli.probability, "1.01", "[0, 1]"), (cli.finite_float, "nan", "finite")]
    for check, text, message in bad:
        if check is not cli.seed:
            message = message.replace("[", r"\[")
        with pytest.raises(argparse.ArgumentTypeError, match=message):
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
    # each a whole sentence: a summary wrapped over two docstring lines is not cut
    cut = [line for line in proc.stdout.splitlines() if not line.endswith(".")]
    assert not cut, cut
    kramers = next(line for line in proc.stdout.splitlines() if line.startswith("kramers"))
    assert kramers.endswith("its escape-time distribution against Kramers' rate."), kramers


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


def _hide(monkeypatch, module: str) -> None:
    """Make ``import module`` fail as it does when the package is not installed."""
    for name in [m for m in sys.modules if m.startswith(f"{module}.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("name, argv, module", [
    ("robertson_bayes", [], "numpyro"),
    ("robertson_bayes", ["--sampler", "blackjax"], "blackjax"),
    ("sir_boarding_school", [], "numpyro"),
    ("sir_boarding_school", ["--sampler", "blackjax"], "arviz"),
])
def test_a_missing_bayes_extra_is_one_line_and_exit_1(examples, capsys, monkeypatch, name,
                                                       argv, module):
    """Issue 41: a raw ModuleNotFoundError traceback, after the data were read."""
    _hide(monkeypatch, module)
    with pytest.raises(SystemExit) as stop:
        examples[name].main([*argv, "--chains", "1", "--warmup", "1", "--samples", "1"])
    assert stop.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.endswith(f": error: needs {module}: pip install 'simlib[bayes]'\n"), err


def test_simlib_run_without_numpyro_says_how_to_install_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    code = ("import sys; sys.modules['numpyro'] = None; from simlib import cli; "
            "sys.exit(cli.main(['run', 'robertson_bayes']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ("simlib run robertson_bayes: error: needs numpyro: "
                           "pip install 'simlib[bayes]'\n")


# --------------------------------------------------------------------------------------
# outputs: opened before the work, and never lost at the end


def test_an_output_that_fails_at_the_end_is_written_elsewhere(capsys, tmp_path):
    """A place that stops being writable during the run (here: its folder is a file) loses
    nothing: the result and the figure go to a temporary folder, each named in one line on
    stderr, the run carries on to its summary and exits with status 1."""
    from matplotlib.figure import Figure

    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])

    @cli.script
    def main(argv):
        cli.save_result(blocked / "r.npz", dict(seed=3), ys=np.arange(3.0))
        cli.save_figure(fig, blocked / "f.png")
        cli.summary("demo")

    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 1
    out, err = capsys.readouterr()
    assert out == "demo\n"
    lines = err.splitlines()
    assert len(lines) == 2 and "Traceback" not in err, err
    rescued = {}
    for line, name, what in zip(lines, ("r.npz", "f.png"), ("the result", "the figure"),
                                strict=True):
        assert f"error: cannot write {blocked / name} (" in line, line
        rescued[name] = Path(line.rsplit(f"{what} is in ", 1)[1].removesuffix(" instead"))
        assert rescued[name].name == name and rescued[name].is_file(), line
    assert np.array_equal(np.load(rescued["r.npz"])["ys"], np.arange(3.0))


def test_save_result_writes_atomically_and_quietly(capsys, tmp_path):
    path = tmp_path / "r.npz"
    cli.save_result(path, dict(seed=1), quiet=True, ys=np.ones(2))
    assert capsys.readouterr().out == ""
    assert [p.name for p in tmp_path.iterdir()] == ["r.npz"]  # no temporary file left


def test_outputs_get_the_mode_open_would_give(tmp_path):
    """Issue 41: results and figures are 0666 less the umask, as ``open(path, "w")``
    makes them, not the 0600 of the temporary file they are renamed from."""
    from matplotlib.figure import Figure

    fig = Figure()
    fig.add_subplot().plot([0, 1], [1, 0])
    old = os.umask(0o022)
    try:
        for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
            os.umask(umask)
            folder = tmp_path / oct(umask)
            written = [cli.save_result(folder / "r.npz", dict(seed=1), quiet=True,
                                       ys=np.ones(2)),
                       cli.save_figure(fig, folder / "f.png", quiet=True)]
            for path in written:
                assert path.stat().st_mode & 0o777 == mode, (path, oct(path.stat().st_mode))
    finally:
        os.umask(old)


def test_validate_opens_its_report_before_running(capsys, tmp_path):
    status = cli.main(["validate", "--output", str(tmp_path / "new" / ("x" * 300 + ".md"))])
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --output: cannot write" in err, err
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------
# lj_fluid --resume: the checkpoint is checked before the equilibration that leads to it

TINY_LJ = ["--n-cells", "3", "--r-cut", "2.0", "--skin", "0.2", "--equil-steps", "20",
           "--steps", "40", "--save-every", "10"]


def _write_header(path: Path, metadata: dict | None) -> None:
    """A checkpoint's header as simulate() writes it (the arrays are not read here)."""
    from simlib.particles._checkpoint import FORMAT

    signature = dict(n_steps=40, save_every=10, **({"metadata": metadata} if metadata else {}))
    header = dict(format=FORMAT, signature=signature, done=2, code=0)
    np.savez(path, __checkpoint__=np.asarray(json.dumps(header)))


@pytest.mark.parametrize("case, message", [
    ("missing", "argument --resume: no checkpoint at"),
    ("garbage", "argument --resume: the checkpoint {path} cannot be read (truncated or corrupt?)"),
    ("other npz", "argument --resume: {path} is not a simulate() checkpoint"),
    ("no settings", "argument --resume: the checkpoint {path} was not written by this example"),
    ("other seed", "argument --resume: the checkpoint {path} was written with --seed 0, this "
                   "run has --seed 1"),
    ("other kT", "argument --resume: the checkpoint {path} was written with --kT 0.722, this "
                 "run has --kT 1.0"),
])
def test_resume_checks_the_checkpoint_before_any_work(examples, capsys, tmp_path, case,
                                                      message):
    """One line, exit 2, and nothing printed before it: no lattice, no equilibration."""
    lj = examples["lj_fluid"]
    path = tmp_path / "lj.ckpt.npz"
    argv = [*TINY_LJ, "--checkpoint", str(path), "--resume"]
    if case == "garbage":
        path.write_bytes(b"PK\x03\x04 truncated")
    elif case == "other npz":
        np.savez(path, positions=np.zeros((4, 3)))
    elif case == "no settings":
        _write_header(path, None)
    elif case in ("other seed", "other kT"):
        _, written = lj.parse([*TINY_LJ, "--checkpoint", str(path)])  # seed 0, kT 0.722
        _write_header(path, lj.settings(written))
        argv += ["--seed", "1"] if case == "other seed" else ["--kT", "1.0"]
    with pytest.raises(SystemExit) as stop:
        lj.main(argv)
    assert stop.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, (out, err)
    assert message.format(path=path) in err, err


@pytest.mark.slow  # a run of 864 atoms over cells, compiled
def test_lj_fluid_runs_over_cells(examples, capsys):
    """``--pairs cells``: the run goes over a cell list (on the CPU the pure-JAX cell pass)
    and reports the cells' builds; its energy is conserved as over the list."""
    lj = examples["lj_fluid"]
    lj.main(["--n-cells", "6", "--equil-steps", "20", "--steps", "40", "--save-every", "10",
             "--pairs", "cells"])
    out = capsys.readouterr().out
    assert "cells: grid (3, 3, 3)" in out and "  cells: " in out and "rebuilds" in out
    drift = float(out.split("max |E(t) - E(0)| / N = ")[1].split(",")[0])
    assert drift < 1e-3


def test_resume_if_exists_reads_the_checkpoint_it_finds(examples, tmp_path):
    """--resume-if-exists is --resume when the file is there: a bad one is refused too."""
    lj = examples["lj_fluid"]
    path = tmp_path / "lj.ckpt.npz"
    _write_header(path, None)
    with pytest.raises(SystemExit) as stop:
        lj.main([*TINY_LJ, "--checkpoint", str(path), "--resume-if-exists"])
    assert stop.value.code == 2
    _, written = lj.parse([*TINY_LJ, "--checkpoint", str(path)])
    _write_header(path, lj.settings(written))
    _, resumed = lj.parse([*TINY_LJ, "--checkpoint", str(path), "--resume-if-exists"])
    assert resumed.resumed_at == 20  # 2 frames of 10 steps


# --------------------------------------------------------------------------------------
# end to end, as subprocesses (slow): --quiet, kepler's summary, lj_fluid's resume

TINY = {  # settings that finish in seconds
    "akzo_nobel": ["--t1", "10", "--rtol", "1e-4"],
    "bouncing_ball": ["--bounces", "2"],
    "circuit": ["--n", "4", "--rtol", "1e-6"],
    "fit_lj": ["--frames", "1", "--steps", "2"],
    "fit_lorenz_shooting": ["--t1", "2", "--steps", "2", "--single-steps", "2"],
    "fit_lotka_volterra": ["--steps", "2", "--points", "10", "--no-scipy"],
    "fit_pendulum": ["--steps", "2"],
    "gravity": ["--steps", "100"],
    "heat": ["--n", "10", "--rtol", "1e-6"],
    "kepler": ["--orbits", "20", "--steps-per-orbit", "50"],
    "kramers": ["--n", "10", "--steps", "100"],
    "lj_fluid": TINY_LJ,
    "lorenz": ["--members", "2", "--t1", "1"],
    "molten_salt": ["--n-cells", "3", "--r-cut", "0.75", "--equil-steps", "40", "--steps", "80"],
    "nbody": ["--n", "8", "--steps", "20"],
    "neural_ode": ["--steps", "2", "--width", "2", "--t-train", "0.5", "--t-end", "1",
                   "--dt", "0.25", "--every", "1"],
    "pendulum": ["--n", "2", "--transient", "1", "--periods", "2"],
    "projectile": ["--steps", "2"],
    "robertson": ["--t1", "1"],
    "robertson_bayes": ["--chains", "2", "--warmup", "5", "--samples", "5"],
    "sir_boarding_school": ["--chains", "2", "--warmup", "10", "--samples", "10"],
    "turing": ["--n", "8", "--length", "16", "--t1", "5", "--rtol", "1e-4"],
    "water": ["--n-molecules", "125", "--r-cut", "0.6", "--equil-steps", "40", "--steps", "80"],
}


def test_every_example_has_tiny_settings():
    assert sorted(TINY) == EXAMPLES


def _run(name: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "simlib.cli", "run", name, *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=cwd)


_quiet_runs: dict[str, subprocess.CompletedProcess] = {}


def quiet_run(name: str, tmp: Path) -> subprocess.CompletedProcess:
    """``simlib run NAME --quiet`` with its tiny settings and every output, once per session."""
    if name not in _quiet_runs:
        _quiet_runs[name] = _run(name, *TINY[name], "--quiet", "--out", str(tmp / "r.npz"),
                                 "--plot", str(tmp / "f.png"))
    return _quiet_runs[name]


@pytest.mark.slow
@pytest.mark.parametrize("name", EXAMPLES)
def test_quiet_prints_the_summary_only(name, tmp_path):
    proc = quiet_run(name, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith(f"{name}: "), proc.stdout
    assert proc.stderr == "", proc.stderr


@pytest.mark.slow
def test_kepler_summary_shows_rk4_drift_and_the_symplectic_bound(tmp_path):
    """The summary gives each method's largest energy error over the first and the second
    half: RK4's doubles (linear growth), the symplectic methods' stay put (a bound)."""
    proc = quiet_run("kepler", tmp_path)
    assert proc.returncode == 0, proc.stderr
    halves = {m: (float(a), float(b)) for m, a, b in
              re.findall(r"(\w+) ([\d.e+-]+) / ([\d.e+-]+)", proc.stdout)}
    assert set(halves) == {"VelocityVerlet", "Yoshida4", "PEFRL", "RK4"}, proc.stdout
    first, second = halves.pop("RK4")
    assert 1.8 < second / first < 2.2, proc.stdout
    for first, second in halves.values():
        assert 0.9 < second / first < 1.1, proc.stdout


@pytest.mark.slow
def test_lj_fluid_resume_end_to_end(tmp_path):
    """--resume-if-exists with no file yet starts the run and says so; --resume with the same
    options continues it (bit-identical, the speed counted over the steps it ran: none here);
    other options are refused before any work, a start state that differs after the
    equilibration, each in one line with exit status 2."""
    ckpt = tmp_path / "ck" / "lj.ckpt.npz"
    first = _run("lj_fluid", *TINY_LJ, "--quiet", "--checkpoint", str(ckpt),
                 "--resume-if-exists", "--out", str(tmp_path / "r1.npz"))
    assert first.returncode == 0, first.stderr
    assert first.stderr == f"simlib run lj_fluid: no checkpoint at {ckpt}: starting the run " \
        "from step 0 (--resume-if-exists)\n", first.stderr
    assert sp.checkpoint_info(ckpt)["finished"]
    again = _run("lj_fluid", *TINY_LJ, "--quiet", "--checkpoint", str(ckpt), "--resume",
                 "--out", str(tmp_path / "r2.npz"))
    assert again.returncode == 0, again.stderr
    assert "(0 run now, resumed at step 40)" in again.stdout, again.stdout
    r1, r2 = np.load(tmp_path / "r1.npz"), np.load(tmp_path / "r2.npz")
    for key in ("positions", "velocities", "total_energy", "pressure"):
        assert np.array_equal(r1[key], r2[key]), key

    other = _run("lj_fluid", *TINY_LJ, "--checkpoint", str(ckpt), "--resume", "--gamma", "2")
    assert other.returncode == 2 and other.stdout == "", other.stdout
    assert other.stderr.count("\n") == 1 and "was written with --gamma 1.0, this run has " \
        "--gamma 2.0" in other.stderr, other.stderr

    # the same options, but a start state that differs (as another JAX version could make)
    with np.load(ckpt) as data:
        arrays = dict(data)
    header = json.loads(str(arrays["__checkpoint__"]))
    header["signature"]["start_state"] = "0" * 32
    arrays["__checkpoint__"] = np.asarray(json.dumps(header))
    np.savez(ckpt, **arrays)
    changed = _run("lj_fluid", *TINY_LJ, "--quiet", "--checkpoint", str(ckpt), "--resume")
    assert changed.returncode == 2, changed.stderr
    assert changed.stderr.count("\n") == 1 and f"argument --resume: the checkpoint {ckpt} " \
        "started from another state than the equilibration made now" in changed.stderr, \
        changed.stderr


@pytest.mark.slow
def test_turing_with_the_fft_preconditioner_finds_the_wavenumber_of_the_sparse_lu(tmp_path):
    """``--linear-solver fft`` (NewtonKrylov with pde.diffusion_preconditioner) runs from the
    command line and grows the pattern the sparse LU grows: the same dominant wavenumber."""
    def dominant(*extra):
        proc = _run("turing", *TINY["turing"], "--quiet", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split("dominant k ")[1].split(" ")[0]

    assert dominant("--linear-solver", "fft") == dominant("--linear-solver", "sparse")
