"""The ``simlib`` command, and the conventions every example CLI shares.

The command (``simlib`` after ``pip install``, or ``python -m simlib.cli``)::

    simlib list                     # the examples, with one line each
    simlib run NAME [options]       # run examples/NAME.py; options go to the example
    simlib info                     # versions, devices, float64, native kernels
    simlib validate [--quick]       # the validation suite (needs a clone of the repository)
    simlib bench [--quick] [NAME]   # the benchmarks against the installed peers (a clone too)

The helpers below give every example the same behaviour (docs/cli.md): ``--help`` shows
every default; a bad value exits with status 2 and one line naming the option, before any
work; a failed solve prints the :class:`~simlib.SolverError` message in one line and exits
with status 1; ``--out PATH`` is the result file (``.npz``, or ``.h5`` with h5py),
``--plot PATH`` the figure (PNG, PDF or SVG by extension), and nothing is written unless
asked; a one-line summary ends every run (what ran, compile and run time, the error or the
fit result).
"""

from __future__ import annotations

import argparse
import ast
import functools
import logging
import math
import os
import runpy
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "ExampleParser",
    "add_md_options",
    "add_output_options",
    "check_md_frames",
    "checkpoint_path",
    "finite_float",
    "main",
    "nonnegative_float",
    "nonnegative_int",
    "one_of",
    "positive_float",
    "positive_int",
    "printer",
    "probability",
    "pyplot",
    "save_figure",
    "save_result",
    "script",
    "seed",
    "solve_failed",
    "summary",
    "timed",
]

RESULT_SUFFIXES = (".npz", ".h5", ".hdf5")
_prog: str | None = None  # "simlib run NAME" while `simlib run` runs an example
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
SEED_MAX = 2**32 - 1  # jax.random.key keeps 32 bits: 2**32 would be the same key as 0
_unwritten: list[Path] = []  # outputs written elsewhere in this run (the run exits 1)


# --------------------------------------------------------------------------------------
# argument types: argparse turns ArgumentTypeError into "argument --x: <message>"


def _number(kind: type, text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text}")
    return value


def _checked(value: Any, ok: bool, text: str, requirement: str) -> Any:
    """``value`` if ``ok``, else the argparse error "<requirement>, got <text>"."""
    if not ok:
        raise argparse.ArgumentTypeError(f"{requirement}, got {text}")
    return value


def finite_float(text: str) -> float:
    """A finite float (no nan, no inf)."""
    return _number(float, text)


def positive_float(text: str) -> float:
    """A finite float > 0."""
    value = _number(float, text)
    return _checked(value, value > 0, text, "must be positive")


def tolerance(text: str) -> float:
    """A relative tolerance: a float in (0, 1)."""
    value = _number(float, text)
    return _checked(value, 0.0 < value < 1.0, text, "must be in (0, 1)")


def nonnegative_float(text: str) -> float:
    """A finite float >= 0."""
    value = _number(float, text)
    return _checked(value, value >= 0, text, "must be >= 0")


def probability(text: str) -> float:
    """A float in [0, 1]."""
    value = _number(float, text)
    return _checked(value, 0.0 <= value <= 1.0, text, "must be in [0, 1]")


def positive_int(text: str) -> int:
    """An integer >= 1."""
    value = _number(int, text)
    return _checked(value, value >= 1, text, "must be at least 1")


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    value = _number(int, text)
    return _checked(value, value >= 0, text, "must be >= 0")


def seed(text: str) -> int:
    """A PRNG seed: an integer in [0, 2**32 - 1] (``jax.random.key`` keeps 32 bits, so a
    larger one would silently be the same key as a smaller one, or overflow)."""
    value = _number(int, text)
    return _checked(value, 0 <= value <= SEED_MAX, text, f"must be in [0, {SEED_MAX}]")


def one_of(names: Sequence[str], what: str | None = None) -> Callable[[str], str]:
    """The type of an option that names one of ``names`` (``--solver``,
    ``--linear-solver``): any other value is the one-line error
    ``'X' is not <what>; choose from A, B`` (``'X' is not one of A, B`` without ``what``)."""
    names = tuple(names)
    listed = ", ".join(names)

    def choice(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not {what}; choose from {listed}" if what is not None
                else f"{text!r} is not one of {listed}")
        return text

    choice.__name__ = "choice"
    return choice


def _path_with_suffix(suffixes: tuple[str, ...] | None, what: str) -> Callable[[str], Path]:
    """An argument type for an output file: its extension and folder checked at once
    (no side effects); :meth:`ExampleParser.parse_args` then tries to create it."""

    def check(text: str) -> Path:
        path = Path(text)
        if suffixes is not None and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(
                f"{what} must end in {', '.join(suffixes)}, got {text!r}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text!r} is a directory")
        parent = next((p for p in path.absolute().parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK):
            raise argparse.ArgumentTypeError(f"cannot write {text!r} (folder not writable)")
        if suffixes == RESULT_SUFFIXES and path.suffix.lower() != ".npz":
            try:
                import h5py  # noqa: F401
            except ImportError:
                raise argparse.ArgumentTypeError(
                    f"{text!r}: .h5 files need h5py (pip install h5py); or use .npz") from None
        return path

    check.__name__ = what.replace(" ", "_")
    check.is_output = True  # created and removed again by ExampleParser.parse_args
    return check


result_path = _path_with_suffix(RESULT_SUFFIXES, "the result file")
figure_path = _path_with_suffix(FIGURE_SUFFIXES, "the figure")
checkpoint_path = _path_with_suffix((".npz",), "the checkpoint")
checkpoint_path.__doc__ = ("The type of a ``--checkpoint PATH`` option: a ``.npz`` file that "
                           "can be written (tried before any work).")
output_path = _path_with_suffix(None, "the output")


def _check_writable(path: Path) -> str | None:
    """Why ``path`` cannot be written, or ``None``: a temporary file beside it (and any
    missing folders above it) is created and removed again, as the final write will do."""
    from ._files import check_writable

    try:
        check_writable(path)
    except OSError as err:
        return err.strerror or str(err)
    return None


# --------------------------------------------------------------------------------------
# the parser


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every default, and keeps the description's line breaks."""


class ExampleParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` with the examples' conventions.

    ``--help`` shows every default; an error prints one line,
    ``prog: error: argument --rtol: must be positive, got -1``, and exits with status 2.
    ``description`` is usually the example's ``__doc__``.
    """

    def __init__(self, description: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        if _prog is not None:
            kwargs.setdefault("prog", _prog)
        super().__init__(description=description, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args: Sequence[str] | None = None,
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        """argparse's, then every output file (an option whose type is an output path:
        ``--out``, ``--plot``, ``--checkpoint``) is tried before any work: a temporary file
        beside it is created and removed, so a place that cannot be written ends the run
        now, in one line, rather than after the work."""
        ns = super().parse_args(args, namespace)
        for action in self._actions:
            value = getattr(ns, action.dest, None)
            if getattr(action.type, "is_output", False) and value is not None:
                why = _check_writable(Path(value))
                if why is not None:
                    self.error(f"argument {'/'.join(action.option_strings)}: cannot write "
                               f"{str(value)!r}: {why}")
        if getattr(ns, "distributed", False):
            # before any JAX work: jax.distributed must start before the backend does
            from ._distributed import init_distributed

            try:
                info = init_distributed()
            except Exception as err:  # noqa: BLE001 - reported in one line
                self.exit(1, f"{self.prog}: error: --distributed: {_one_line(err)}\n")
            print(f"{self.prog}: process {info.process_id} of {info.num_processes}",
                  file=sys.stderr)
        return ns


def add_output_options(parser: argparse.ArgumentParser, *, out: bool = True,
                       plot: bool = True, quiet: bool = True,
                       x64: bool | None = None) -> None:
    """Add the shared ``--out``, ``--plot``, ``--quiet`` and (when ``x64`` is not None)
    ``--x64``/``--no-x64`` options, ``x64`` being the default."""
    if out:
        parser.add_argument("--out", type=result_path, default=None, metavar="PATH",
                            help="write the trajectory/result to PATH (.npz, or .h5 with "
                            "h5py); nothing is written without it")
    if plot:
        parser.add_argument("--plot", type=figure_path, default=None, metavar="PATH",
                            help="write the figure to PATH (.png, .pdf or .svg); nothing "
                            "is written without it")
    if quiet:
        parser.add_argument("--quiet", action="store_true",
                            help="no progress bars or intermediate lines: the summary only")
    if x64 is not None:
        parser.add_argument("--x64", action=argparse.BooleanOptionalAction, default=x64,
                            help="compute in float64 (--no-x64: float32)")
    parser.add_argument("--distributed", action="store_true",
                        help="start JAX's multi-process runtime first (sl.init_distributed: "
                        "SLURM, Open MPI or SIMLIB_COORDINATOR/SIMLIB_NUM_PROCESSES/"
                        "SIMLIB_PROCESS_ID; docs/ensembles.md)")


def add_md_options(parser: argparse.ArgumentParser, *, temperature: float,
                   equil_steps: int, equil_help: str, steps: int, r_cut: float,
                   r_cut_help: str) -> None:
    """Add the options of a thermostatted molecular-dynamics example (units nm, ps, K):
    ``--temperature``, ``--thermostat`` (``bussi`` or ``nose-hoover``), ``--tau``,
    ``--equil-steps``, ``--steps``, ``--dt``, ``--r-cut``, ``--skin``, ``--tolerance`` (PME),
    ``--save-every`` and ``--seed``, with the defaults given here. Check the frames with
    :func:`check_md_frames` after parsing."""
    parser.add_argument("--temperature", type=positive_float, default=temperature,
                        help="temperature in K")
    parser.add_argument("--thermostat", choices=("bussi", "nose-hoover"), default="bussi",
                        help="the production thermostat")
    parser.add_argument("--tau", type=positive_float, default=0.5,
                        help="production thermostat time constant in ps (weak coupling)")
    parser.add_argument("--equil-steps", type=nonnegative_int, default=equil_steps,
                        help=equil_help)
    parser.add_argument("--steps", type=positive_int, default=steps, help="production steps")
    parser.add_argument("--dt", type=positive_float, default=0.002, help="time step in ps")
    parser.add_argument("--r-cut", type=positive_float, default=r_cut, help=r_cut_help)
    parser.add_argument("--skin", type=nonnegative_float, default=0.1,
                        help="neighbour-list skin, nm")
    parser.add_argument("--tolerance", type=positive_float, default=5e-4,
                        help="PME relative force tolerance (sets alpha and the grid)")
    parser.add_argument("--save-every", type=positive_int, default=10,
                        help="steps between saved frames")
    parser.add_argument("--seed", type=seed, default=0, help="PRNG seed")


def check_md_frames(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The parser's error (exit 2, naming the option) unless ``--save-every`` divides
    ``--equil-steps`` and ``--steps`` and the production saves at least 8 frames."""
    if args.equil_steps % args.save_every or args.steps % args.save_every:
        parser.error(f"argument --save-every: must divide --equil-steps and --steps, got "
                     f"{args.save_every}")
    if args.steps // args.save_every < 8:
        parser.error(f"argument --steps: needs at least 8 saved frames (--save-every "
                     f"{args.save_every}), got {args.steps}")


# --------------------------------------------------------------------------------------
# running, timing, writing


def _one_line(err: BaseException) -> str:
    """The error's message on one line."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def script(main_fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate an example's ``main(argv)``: a failed solve becomes one line on stderr and
    exit status 1 (``SystemExit(1)``), Ctrl-C exit status 130, instead of a traceback; a
    run whose output had to be written elsewhere (:func:`save_result`) exits with 1; the
    compiled programs are kept for the next run
    (:func:`simlib.keep_compiled_programs`, in ``$SIMLIB_CACHE``)."""

    @functools.wraps(main_fn)
    def wrapped(argv: Sequence[str] | None = None):
        import jax

        from simlib import SolverError

        from ._programs import keep_compiled_programs

        prog = _program()
        keep_compiled_programs()
        # a SolverError raised in a callback under jit is logged by JAX with its traceback
        # before it is re-raised: the one-line message below is enough
        callback_logs = [logging.getLogger(n) for n in ("jax._src.debugging",
                                                          "jax._src.callback")]
        levels = [log.level for log in callback_logs]
        for log in callback_logs:
            log.setLevel(logging.CRITICAL)
        _unwritten.clear()
        try:
            status = main_fn(argv)
            if _unwritten:  # the run finished, but an output went elsewhere: say it failed
                raise SystemExit(1)
            return status
        except SolverError as err:
            print(f"{prog}: error: {_one_line(err)}", file=sys.stderr)
            raise SystemExit(1) from None
        except jax.errors.JaxRuntimeError as err:
            carried = SolverError.from_exception(err)
            if carried is None:
                raise
            print(f"{prog}: error: {_one_line(carried)}", file=sys.stderr)
            raise SystemExit(1) from None
        except KeyboardInterrupt:
            print(f"{prog}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        finally:
            for log, level in zip(callback_logs, levels, strict=True):
                log.setLevel(level)

    return wrapped


def timed(fn: Callable[..., Any], *args: Any, **static: Any) -> tuple[Any, float, float]:
    """``(result, compile_s, run_s)`` of ``jax.jit(fn, static_argnames=...)(*args)``.

    Compile time is ``lower(...).compile()``, or the load of the program kept from an
    earlier run (:func:`simlib.keep_compiled_programs`); run time is one call of the
    compiled function, to ``block_until_ready``.
    """
    import jax

    from ._programs import compiled as kept_or_compiled

    start = time.perf_counter()
    compiled = kept_or_compiled(jax.jit(fn, static_argnames=tuple(static)), *args, **static)
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    return out, compile_s, time.perf_counter() - start


def printer(quiet: bool) -> Callable[..., None]:
    """``print``, or a function that prints nothing when ``quiet``."""
    return (lambda *args, **kwargs: None) if quiet else print


def summary(what: str, *, compile_s: float | None = None, run_s: float | None = None,
            result: str = "") -> str:
    """Print and return the run's one-line summary: ``what | compile s | run s | result``."""
    parts = [what]
    if compile_s is not None:
        parts.append(f"compile {compile_s:.2f} s")
    if run_s is not None:
        parts.append(f"run {run_s:.3g} s")
    if result:
        parts.append(result)
    line = " | ".join(parts)
    print(line, flush=True)
    return line


def _program() -> str:
    return _prog or (Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "example")


def _write(path: Path, save: Callable[[Path], Any], what: str, quiet: bool) -> Path:
    """``save(path)``; if that fails (a folder made read-only during the run, a full disk),
    ``save`` into a new temporary folder instead, say so in one line on stderr and return
    that path: a finished run is never lost to its output. :func:`script` then exits 1."""
    try:
        save(path)
    except OSError as err:
        why = f"{_program()}: error: cannot write {path} ({err.strerror or err})"
        _unwritten.append(path)
        try:
            elsewhere = Path(tempfile.mkdtemp(prefix="simlib-unwritten-")) / path.name
            save(elsewhere)
        except OSError as again:
            print(f"{why}, nor {what} in a temporary folder ({again.strerror or again})",
                  file=sys.stderr, flush=True)
            return path
        print(f"{why}; {what} is in {elsewhere} instead", file=sys.stderr, flush=True)
        return elsewhere
    if not quiet:
        print(f"wrote {path}")
    return path


def save_result(path: str | os.PathLike, meta: dict | None = None, *, trajectory: Any = None,
                box: Any = None, quiet: bool = False, **arrays: Any) -> Path:
    """Write an example's result to ``path``, with ``meta`` (scalar metadata).

    ``.npz``: the named ``arrays`` (numpy.savez), metadata as ``meta_*`` entries.
    ``.h5``: with ``trajectory`` (a particle trajectory) an H5MD file written by
    :func:`simlib.io.save` (readable by MDAnalysis and OVITO; ``box``: the periodic space);
    otherwise the arrays as HDF5 datasets, metadata as attributes. Parent folders are
    created, and the file is written to a temporary file beside it, then renamed (with the
    mode ``open(path, "w")`` would give: 0666 less the umask). Prints
    ``wrote PATH`` unless ``quiet``. If ``path`` cannot be written, the result goes to a
    temporary folder instead, named in an error line (and :func:`script` exits 1).
    Returns the path written.
    """
    import numpy as np

    from ._files import atomic_write

    path = Path(path)
    meta = dict(meta or {})
    if trajectory is not None and path.suffix.lower() in (".h5", ".h5md"):
        from . import io

        return _write(path, lambda p: io.save(p, trajectory, metadata=meta, box=box),
                      "the result", quiet)
    data = {k: np.asarray(v) for k, v in arrays.items()}

    def write(tmp):
        if path.suffix.lower() == ".npz":
            with open(tmp, "wb") as fh:
                np.savez(fh, **data, **{f"meta_{k}": np.asarray(v) for k, v in meta.items()})
        else:
            import h5py

            with h5py.File(tmp, "w") as f:
                for k, v in data.items():
                    f.create_dataset(k, data=v)
                for k, v in meta.items():
                    f.attrs[k] = v

    return _write(path, lambda p: atomic_write(p, write), "the result", quiet)


def pyplot() -> Any:
    """``matplotlib.pyplot`` with the non-interactive Agg backend (figures go to files
    through :func:`save_figure`; no display is needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def solve_failed(result: Any, hint: str = "") -> int:
    """Report a solve run with ``throw=False`` that did not succeed: print
    ``prog: error: the solve failed: NAME`` (``NAME`` of :class:`simlib.Result`, then
    `` (hint)`` if given) to stderr in one line, as :func:`script` does for a
    ``SolverError``, and return 1, the exit status of a failed run."""
    from simlib import Result

    note = f" ({hint})" if hint else ""
    print(f"{_program()}: error: the solve failed: {Result(int(result)).name}{note}",
          file=sys.stderr)
    return 1


def save_figure(fig: Any, path: str | os.PathLike, dpi: int = 120, *,
                quiet: bool = False) -> Path:
    """Save a matplotlib figure (format from the extension), creating parent folders;
    written and renamed like :func:`save_result`, with the same fallback if ``path``
    cannot be written. Prints ``wrote PATH`` unless ``quiet``."""
    from ._files import atomic_write

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    return _write(path, lambda p: atomic_write(p, lambda tmp: fig.savefig(tmp, dpi=dpi,
                                                                          format=fmt)),
                  "the figure", quiet)


# --------------------------------------------------------------------------------------
# the `simlib` command


def _package_dir() -> Path:
    return Path(__file__).resolve().parent


def examples_dir() -> Path | None:
    """The examples: shipped inside the package (``simlib/examples``, a non-editable
    install), else ``examples/`` of the clone this simlib was imported from."""
    for candidate in (_package_dir() / "examples", _package_dir().parent / "examples"):
        if candidate.is_dir() and any(candidate.glob("*.py")):
            return candidate
    return None


def _clone_root() -> Path | None:
    """The repository clone (with validation/ and benchmarks/): the folder above this
    simlib package, else the current directory or one of its parents."""
    for candidate in (_package_dir().parent, Path.cwd(), *Path.cwd().parents):
        if (candidate / "validation" / "run.py").is_file() and (candidate / "simlib").is_dir():
            return candidate
    return None


def list_examples() -> dict[str, str]:
    """``{name: its summary}`` for every example, read without importing: the docstring's
    first paragraph on one line (a summary wrapped over two lines is not cut)."""
    found = examples_dir()
    if found is None:
        return {}
    out = {}
    for path in sorted(found.glob("*.py")):
        if path.name.startswith("_"):
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        except SyntaxError:
            doc = ""
        out[path.stem] = " ".join(doc.strip().split("\n\n")[0].split())
    return out


def _cmd_list(argv: list[str]) -> int:
    _command_parser("list", "List the examples that `simlib run NAME` runs.").parse_args(argv)
    examples = list_examples()
    if not examples:
        print("simlib list: no examples found (neither shipped with the package nor in a "
              "clone)", file=sys.stderr)
        return 1
    width = max(map(len, examples))
    for name, line in examples.items():
        print(f"{name:{width}s}  {line}")
    return 0


def _cmd_run(argv: list[str]) -> int:
    examples = list_examples()
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: simlib run NAME [options]   (simlib run NAME --help: its options)\n")
        print("examples: " + ", ".join(examples))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    name = name[:-3] if name.endswith(".py") else name
    if name not in examples:
        print(f"simlib run: error: unknown example {name!r}; choose from "
              f"{', '.join(examples)}", file=sys.stderr)
        return 2
    global _prog
    path = examples_dir() / f"{name}.py"
    saved = sys.argv[:]
    sys.argv = [str(path), *rest]
    _prog = f"simlib run {name}"
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:
        code = stop.code
        if code is None or isinstance(code, int):
            return code or 0
        print(code, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved
        _prog = None
    return 0


def _command_parser(name: str, description: str) -> ExampleParser:
    return ExampleParser(prog=f"simlib {name}", description=description)


def info() -> dict[str, str]:
    """What ``simlib info`` prints: versions, devices, float64, native kernels."""
    import platform

    import jax
    import jaxlib

    import simlib
    from simlib.particles import _native

    rows = {
        "simlib": f"{getattr(simlib, '__version__', _version())} ({_package_dir()})",
        "python": f"{platform.python_version()} ({sys.executable})",
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
    }
    from importlib.metadata import PackageNotFoundError, version

    for lib in ("numpy", "scipy", "optax", "matplotlib", "h5py", "diffrax"):
        try:  # the installed distribution's version: nothing is imported
            rows[lib] = version(lib)
        except PackageNotFoundError:
            rows[lib] = "not installed"
    devices = jax.devices()
    rows["backend"] = jax.default_backend()
    rows["devices"] = ", ".join(f"{d.platform}:{d.id} {d.device_kind}" for d in devices)
    rows["cpu cores"] = str(os.cpu_count())
    x64 = bool(jax.config.jax_enable_x64)
    rows["float64"] = ("on" if x64 else "off") + (
        " (JAX_ENABLE_X64 or jax.config; simlib never turns it on itself; the examples "
        "turn it on where they need it)")
    rows["examples"] = str(examples_dir() or "not found")
    root = _clone_root()
    rows["validation, benchmarks"] = str(root) if root else "not found (need a clone)"
    if _native.disabled():
        rows["native kernels"] = "off: disabled by SIMLIB_NATIVE"
    elif jax.default_backend() != "cpu":
        rows["native kernels"] = "not used: they are CPU kernels"
    else:
        try:
            lib = _native.library_path()
        except RuntimeError as err:
            rows["native kernels"] = f"unavailable: {err}"
        else:
            if not lib.exists():
                rows["native kernels"] = (f"not built yet: compiled on first use into {lib} "
                                          "(`simlib info --native` builds them now)")
            else:
                rows["native kernels"] = _native_loaded(lib)
    rows["failure check"] = _failure_check(build=False)
    return rows


def _failure_check(build: bool) -> str:
    """How a failing solve inside a user's ``jit`` raises: the native custom call (its
    programs can be kept in JAX's compilation cache) or the Python host callback."""
    import jax

    from simlib import _errors
    from simlib._native import disabled

    if disabled():
        return "host callback (SIMLIB_NATIVE=0; throw=True programs are not cached)"
    if jax.default_backend() != "cpu":
        return "host callback (the native check is a CPU kernel)"
    library = _errors.native_library()
    try:
        path = library.library_path()
    except RuntimeError as err:
        return f"host callback (no compiler: {err})"
    if not (build or path.exists()):
        return (f"native, not built yet: built on first use into {path} "
                "(`simlib info --native` builds it now)")
    why = _why_not_loaded(library.load, library.unavailable_reason)
    return f"host callback (not loaded: {why})" if why else f"native custom call, cacheable: {path}"


def _native_loaded(lib: Path) -> str:
    from simlib.particles import _native

    why = _why_not_loaded(_native.load, _native.unavailable_reason)
    return f"not loaded: {why}" if why else f"loaded: {lib}"


def _why_not_loaded(load: Callable[[], Any], reason: Callable[[], str | None]) -> str | None:
    """Load a native library without its warning: ``None`` if it loaded, else why not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        handle = load()
    return None if handle is not None else reason()


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("simlib")
    except Exception:  # noqa: BLE001 - not installed: running from a clone
        return "unknown (not installed; running from a clone)"


def _cmd_info(argv: list[str]) -> int:
    parser = _command_parser("info", "Versions, devices, float64, native kernels.")
    parser.add_argument("--native", action="store_true",
                        help="build and load the native CPU kernels if they are not yet")
    opts = parser.parse_args(argv)
    rows = info()
    if opts.native and rows["native kernels"].startswith("not built"):
        from simlib.particles import _native

        rows["native kernels"] = _native_loaded(_native.library_path())
    if opts.native:
        rows["failure check"] = _failure_check(build=True)
    width = max(map(len, rows))
    for key, value in rows.items():
        print(f"{key:{width}s}  {value}")
    return 0


def _need_clone(command: str, folder: str) -> int:
    print(f"simlib {command}: error: {folder}/ is not installed with the package; it needs a "
          "clone of the repository: git clone <simlib repository> && cd simlib && "
          f"pip install -e '.[test]' && simlib {command}", file=sys.stderr)
    return 2


def _cmd_validate(argv: list[str]) -> int:
    parser = _command_parser(
        "validate", "Run the validation suite (validation/ of a clone): a table of every "
        "part and failed check, the report and figures; exit status 1 if a check failed.")
    parser.add_argument("--quick", action="store_true",
                        help="the fast CI subset; report in a temporary folder unless --output")
    parser.add_argument("--parts", default=None, help="comma-separated parts (default: all, "
                        "or the quick subset with --quick)")
    parser.add_argument("--output", type=output_path, default=None, metavar="PATH",
                        help="report path (figures next to it); default validation/report.md, "
                        "or a temporary folder with --quick")
    opts = parser.parse_args(argv)
    root = _clone_root()
    if root is None:
        return _need_clone("validate", "validation")
    sys.path.insert(0, str(root))
    from validation import run as vrun

    sections: dict[str, Any] = {}

    class _Recorder:
        def __init__(self, name, module):
            self.name, self.module = name, module

        def run(self, **kwargs):
            section = self.module.run(**kwargs)
            sections[self.name] = section
            return section

    original = dict(vrun.PARTS)
    vrun.PARTS.update({k: _Recorder(k, m) for k, m in original.items()})
    forwarded = (["--quick"] if opts.quick else []) + (
        ["--parts", opts.parts] if opts.parts else []) + (
        ["--output", str(opts.output)] if opts.output else [])
    try:
        status = vrun.main(forwarded)
    finally:
        vrun.PARTS.clear()
        vrun.PARTS.update(original)
    from validation import common as vcommon

    checks = [c for section in sections.values() for c in section.checks]
    print()
    print(f"checks ({len(checks)}, {sum(not c.passed for c in checks)} failed): measured "
          "value and its bound ('allowed'); tol units = error / (atol + rtol |ref|)")
    print(vcommon.checks_text(checks))
    print()
    print(f"{'part':16s} {'seconds':>8s} {'checks':>7s} {'failed':>7s}  status")
    for name, section in sections.items():
        bad = len(section.failures)
        print(f"{name:16s} {section.seconds:8.1f} {len(section.checks):7d} {bad:7d}  "
              f"{'FAIL' if bad else 'ok'}")
        for failure in section.failures:
            print(f"    {failure}")
    return int(status or 0)


BENCHMARKS = {  # name: what it compares (the scripts print their own ratio tables)
    "ode": "ensemble ODE solves: simlib vs diffrax and scipy",
    "stiff": "stiff solvers: simlib vs diffrax and scipy",
    "gradients": "gradients through solves: simlib vs diffrax",
    "fit": "parameter fitting: simlib vs diffrax and scipy",
    "bayes": "NUTS (numpyro) on the boarding-school SIR: simlib vs diffrax inside",
    "particles": "particle engine: simlib vs jax-md, LAMMPS, REBOUND",
}


def _cmd_bench(argv: list[str]) -> int:
    parser = _command_parser(
        "bench", "Run the benchmarks (benchmarks/ of a clone) against whichever peers are "
        "installed; each prints its ratios. Results JSON go to a temporary folder.")
    parser.add_argument("--quick", action="store_true", help="the scripts' quick settings")
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"benchmarks to run (default all): {', '.join(BENCHMARKS)}")
    opts = parser.parse_args(argv)
    unknown = [n for n in opts.names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"argument NAME: unknown benchmark {unknown[0]!r}; choose from "
                     f"{', '.join(BENCHMARKS)}")
    root = _clone_root()
    if root is None:
        return _need_clone("bench", "benchmarks")
    names = opts.names or list(BENCHMARKS)
    results = Path(tempfile.mkdtemp(prefix="simlib-bench-"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(root), *filter(None, [os.environ.get("PYTHONPATH")])])}
    status = 0
    for name in names:
        cmd = [sys.executable, str(root / "benchmarks" / f"{name}.py"),
               *(["--quick"] if opts.quick else []), "--json", str(results / f"{name}.json")]
        print(f"[bench] {name}: {BENCHMARKS[name]}\n[bench] $ {' '.join(cmd)}", flush=True)
        rc = subprocess.run(cmd, cwd=root, env=env).returncode
        print(f"[bench] {name}: exit status {rc}", flush=True)
        status = status or rc
    print(f"[bench] results in {results}")
    return status


COMMANDS = {
    "list": (_cmd_list, "list the examples"),
    "run": (_cmd_run, "run an example: simlib run NAME [its options]"),
    "info": (_cmd_info, "versions, devices, float64, native kernels"),
    "validate": (_cmd_validate, "run the validation suite (needs a clone)"),
    "bench": (_cmd_bench, "run the benchmarks against installed peers (needs a clone)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``simlib`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: simlib {" + ",".join(COMMANDS) + "} ...\n\n" + "\n".join(
        f"  {name:9s} {text}" for name, (_, text) in COMMANDS.items())
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"simlib {_version()}")
        return 0
    if argv[0] not in COMMANDS:
        print(f"simlib: error: unknown command {argv[0]!r}; choose from "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]][0](argv[1:])
    except SystemExit as stop:  # a sub-parser's --help or error
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)


if __name__ == "__main__":
    # run the imported module's main, not this __main__ copy's: the examples import
    # simlib.cli, and `simlib run` sets the program name there
    from simlib import cli as _cli

    sys.exit(_cli.main())
