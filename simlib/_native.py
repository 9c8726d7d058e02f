"""Optional native CPU kernels, compiled on first use and called through ``jax.ffi``.

One :class:`NativeLibrary` per group of C++ sources (the particle kernels in
``simlib/particles/_native``, the linear algebra in ``simlib/_linalg/native``). On first
use in a process, :meth:`NativeLibrary.load` compiles the sources with the system's C++
compiler into a per-user cache, loads the library with ``ctypes`` and registers its XLA FFI
targets for the CPU. If anything fails, it returns ``None`` (once per process, with a
``RuntimeWarning`` naming the reason) and simlib uses its pure-JAX kernels, which give the
same results and are the reference the tests compare the native ones with.

Environment variables:
    ``SIMLIB_NATIVE``: ``0`` (or ``false``/``no``/``off``) skips the native kernels.
    ``SIMLIB_CACHE``: the cache root (default ``$XDG_CACHE_HOME/simlib`` or
        ``~/.cache/simlib``); libraries go to ``<root>/native/<key>/<library name>``.
    ``CXX``: the compiler command, split like a shell would (``shlex``), so a wrapper or
        flags work: ``CXX="ccache g++"``, ``CXX="g++-13 -O2"``. Default: ``g++``, else ``c++``.
    ``SIMLIB_REQUIRE_NATIVE``: read by the test suite only: with ``1`` the native tests
        fail instead of skipping when the library cannot be loaded (set it in CI).

Cache key (one build per distinct key, shared safely between machines): a hash of the
sources, the compiler command, the compiler flags, the jaxlib version (its FFI ABI) and
the CPU target. Kernels are built with ``-march=native``, so a library built on one CPU can
die with an illegal instruction (uncatchable) on an older one that shares the home
directory. The CPU target is therefore what the compiler itself resolves ``-march=native``
to on this machine: ``$CXX -march=native -E -v -x c++ /dev/null`` prints the expanded
target options (GCC: ``-march=znver3 -mavx2 -mno-avx512f ... -mtune=znver3``; Clang:
``-target-cpu znver3 -target-feature +avx2 ...``), plus the compiler version. It costs one
compiler start per process, only when the native kernels are first needed,
and it is exact: two machines share a build only if the compiler would have generated the
same instructions on both. If the compiler cannot resolve ``-march=native`` (an unknown
compiler or CPU), the kernels are built without it, for the compiler's portable baseline,
under a separate key.

Failure handling: a cached library that fails to load (truncated, corrupt, missing
symbols) is deleted and rebuilt once; if the rebuild fails too, or the compiler is missing
or fails, the pure-JAX kernels are used with a warning. Builds go to a temporary file that
is renamed into place, so concurrent processes never load half a file. Compiling needs the
compiler and OpenMP on the machine that first uses the kernels; without them, or on other
platforms than the CPU, the pure-JAX kernels run.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jaxlib

# Not -ffast-math: linking with it (or -Ofast, -funsafe-math-optimizations) pulls in
# crtfastmath.o, which turns on flush-to-zero for the whole process when the library loads.
# Not -ffinite-math-only either: the kernels' std::isfinite/isnan guards must stay.
_FLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-freciprocal-math", "-std=c++17", "-shared", "-fPIC")
_COMPILE_TIMEOUT_S = 900

#: Each library's maker, ``(module, function)``: a process that loads a stored program
#: calling a library loads the library first (``simlib._programs``).
MAKERS = {"libsimlib_failure.so": ("simlib._errors", "native_library"),
          "libsimlib_linalg.so": ("simlib._linalg._kernels", "native_library"),
          "libsimlib_native.so": ("simlib.particles._native", "native_library")}
_loaded: set[str] = set()


def loaded_libraries() -> list[str]:
    """The file names of the native libraries loaded in this process (their FFI targets
    registered)."""
    return sorted(_loaded)


def load_by_name(name: str) -> bool:
    """Load the library ``name`` (a key of :data:`MAKERS`); whether it loaded."""
    if name not in MAKERS:
        return False
    import importlib

    module, function = MAKERS[name]
    return getattr(importlib.import_module(module), function)().load() is not None


def cache_root() -> Path:
    """simlib's cache folder: ``$SIMLIB_CACHE``, else ``$XDG_CACHE_HOME/simlib`` or
    ``~/.cache/simlib`` (native libraries in ``native/``, the examples' compiled programs
    in ``jax/``)."""
    return Path(os.environ.get("SIMLIB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "simlib"))


def _cache_dir() -> Path:
    return cache_root() / "native"


def _compiler() -> list[str]:
    """The compiler command (``$CXX`` split like a shell, else ``g++`` or ``c++``)."""
    cxx = os.environ.get("CXX")
    if cxx is not None and cxx.strip():
        try:
            command = shlex.split(cxx)
        except ValueError as err:
            raise RuntimeError(f"cannot parse CXX={cxx!r}: {err}") from None
        if shutil.which(command[0]) is None:
            raise RuntimeError(f"C++ compiler not found: CXX={cxx!r} names {command[0]!r}, "
                               "which is not an executable on PATH")
        return command
    found = shutil.which("g++") or shutil.which("c++")
    if found is None:
        raise RuntimeError("no C++ compiler found: neither g++ nor c++ is on PATH (set CXX)")
    return [found]


_TARGET_ARGS = ("-target-cpu", "-target-feature", "-tune-cpu", "-triple", "--param")


def _cpu_target(compiler: list[str]) -> tuple[tuple[str, ...], str]:
    """The flags that select this CPU's instruction set, and what they resolve to.

    Returns ``(("-march=native",), resolved options)`` where the compiler reports how it
    expands ``-march=native`` on this machine, else ``((), "portable ...")``.
    """
    cmd = [*compiler, "-march=native", "-E", "-v", "-x", "c++", os.devnull, "-o", os.devnull]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return (), f"portable (target query failed: {err})"
    version = next((line for line in run.stderr.splitlines() if " version " in line), "")
    resolved: list[str] = []
    for line in run.stderr.splitlines():
        if "cc1" not in line:                # GCC's cc1plus line, Clang's "-cc1" line
            continue
        try:
            tokens = shlex.split(line)
        except ValueError:
            tokens = line.split()
        for prev, tok in zip(["", *tokens], tokens, strict=False):
            if tok.startswith(("-m", "-target-")) or prev in _TARGET_ARGS:
                resolved.append(tok)
    native = run.returncode == 0 and (
        any(t.startswith("-march=") and t != "-march=native" for t in resolved)
        or "-target-cpu" in resolved)
    if not native:
        return (), f"portable ({version}; -march=native not resolved, exit {run.returncode})"
    return ("-march=native",), " ".join([version, *resolved])


def disabled() -> bool:
    """Whether ``SIMLIB_NATIVE`` turns the native kernels off (0, false, no or off)."""
    return os.environ.get("SIMLIB_NATIVE", "1").strip().lower() in ("0", "false", "no", "off")


class NativeLibrary:
    """A group of C++ sources built into one shared library, with its FFI targets.

    Args:
        directory: Where the sources are.
        sources: Their file names.
        targets: The XLA FFI handler symbols to register for the CPU.
        library: The library's file name in the cache.
    """

    def __init__(self, directory: Path, sources: tuple[str, ...], targets: tuple[str, ...],
                 library: str):
        self.directory = Path(directory)
        self.sources = tuple(sources)
        self.targets = tuple(targets)
        self.library = library
        self._lock = threading.Lock()
        self._state: dict = {}

    def _plan(self) -> tuple[list[str], tuple[str, ...], Path, str]:
        """``(compiler, flags, library path, description)`` of the build for this machine."""
        compiler = _compiler()
        target_flags, target = _cpu_target(compiler)
        flags = (*target_flags, *_FLAGS)
        digest = hashlib.sha256()
        for name in self.sources:
            digest.update((self.directory / name).read_bytes())
        for part in (shlex.join(compiler), *flags, jaxlib.__version__, target):
            digest.update(part.encode() + b"\0")
        lib = _cache_dir() / digest.hexdigest()[:16] / self.library
        return compiler, flags, lib, target

    def library_path(self) -> Path:
        """Where :meth:`load` looks for (and builds) the library on this machine.

        Raises:
            RuntimeError: No usable compiler (the key depends on it).
        """
        return self._plan()[2]

    def _build(self, compiler: list[str], flags: tuple[str, ...], lib: Path, target: str
               ) -> None:
        here = self.directory
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            tmp_lib = Path(tmp) / lib.name
            cmd = [*compiler, *flags, f"-I{jax.ffi.include_dir()}",
                   *[str(here / s) for s in self.sources], "-o", str(tmp_lib)]
            # once per machine (the build is cached): say so, not a silent first call
            print(f"simlib: building the native library {self.library} (once; cached in "
                  f"{lib.parent.parent})", file=sys.stderr, flush=True)
            try:
                run = subprocess.run(cmd, capture_output=True, text=True,
                                     timeout=_COMPILE_TIMEOUT_S, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError) as err:
                raise RuntimeError(f"compiling failed: {shlex.join(cmd)}: {err}") from None
            if run.returncode != 0 or not tmp_lib.is_file():
                raise RuntimeError(f"compiling failed (exit {run.returncode}): "
                                   f"{shlex.join(cmd)}\n{run.stderr[-2000:]}")
            (Path(tmp) / "build.txt").write_text(f"{shlex.join(cmd)}\ntarget: {target}\n")
            os.replace(Path(tmp) / "build.txt", lib.parent / "build.txt")
            os.replace(tmp_lib, lib)          # atomic: concurrent builders never see half a file

    def _open(self, lib: Path):
        """The loaded library and its FFI handler symbols (raises if unusable)."""
        handle = ctypes.CDLL(str(lib))
        return handle, [getattr(handle, name) for name in self.targets]

    def _load_or_build(self):
        compiler, flags, lib, target = self._plan()
        if lib.exists():
            try:
                return self._open(lib)
            except (OSError, AttributeError) as err:
                warnings.warn(f"simlib: cached native library {lib} does not load ({err}); "
                              "deleting and rebuilding it", RuntimeWarning, stacklevel=4)
                lib.unlink(missing_ok=True)
        self._build(compiler, flags, lib, target)
        try:
            return self._open(lib)
        except (OSError, AttributeError) as err:
            lib.unlink(missing_ok=True)
            raise RuntimeError(f"the freshly built {lib} does not load: {err}") from None

    def load(self):
        """The loaded native library with its FFI targets registered, or ``None``.

        Decided once per process; :meth:`unavailable_reason` says why it is ``None``.
        """
        with self._lock:
            state = self._state
            if "lib" in state:
                return state["lib"]
            state["lib"] = None
            if disabled():
                state["reason"] = "disabled by SIMLIB_NATIVE"
                return None
            try:
                handle, symbols = self._load_or_build()
                for name, symbol in zip(self.targets, symbols, strict=True):
                    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol),
                                                platform="cpu")
            except Exception as err:  # noqa: BLE001 - any failure means: use the JAX kernels
                state["reason"] = str(err)
                warnings.warn(f"simlib: native kernels unavailable, using pure JAX ({err})",
                              RuntimeWarning, stacklevel=3)
                return None
            state["lib"] = handle
            state["reason"] = None
            _loaded.add(self.library)
            return handle

    def unavailable_reason(self) -> str | None:
        """Why :meth:`load` returned ``None`` (``None`` if it loaded or was not tried yet)."""
        return self._state.get("reason")
