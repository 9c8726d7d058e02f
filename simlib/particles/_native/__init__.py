"""Optional native CPU kernels, compiled on first use and called through ``jax.ffi``.

The C++ sources sit next to this file. On first use they are compiled with the system's
C++ compiler (``$CXX`` or ``g++``) into a per-user cache (``$SIMLIB_CACHE`` or
``~/.cache/simlib``), keyed by a hash of the source, the compiler flags and the jaxlib
version, then loaded with ``ctypes`` and registered as XLA FFI targets for the CPU.
If anything fails (no compiler, no OpenMP), :func:`load` returns ``None`` once, with a
warning, and simlib uses its pure-JAX kernels, which are also the reference the tests
compare the native ones with. Set ``SIMLIB_NATIVE=0`` to skip the native kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import jax
import jaxlib

_SOURCES = ("gravity.cc", "neighbors.cc")
_TARGETS = ("simlib_gravity_f32", "simlib_gravity_f64", "simlib_neighbors_f32",
            "simlib_neighbors_f64")
# Not -ffast-math: linking with it (or -Ofast, -funsafe-math-optimizations) pulls in
# crtfastmath.o, which turns on flush-to-zero for the whole process when the library loads.
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math",
          "-fno-signed-zeros", "-fassociative-math", "-freciprocal-math", "-std=c++17",
          "-shared", "-fPIC")
_lock = threading.Lock()
_state: dict = {}


def _cache_dir() -> Path:
    root = os.environ.get("SIMLIB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "simlib")
    return Path(root) / "native"


def _compile(here: Path) -> Path:
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not compiler:
        raise RuntimeError("no C++ compiler found (set CXX)")
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((here / name).read_bytes())
    digest.update(" ".join((compiler,) + _FLAGS + (jaxlib.__version__,)).encode())
    out_dir = _cache_dir() / digest.hexdigest()[:16]
    lib = out_dir / "libsimlib_native.so"
    if lib.exists():
        return lib
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_lib = Path(tmp) / lib.name
        cmd = [compiler, *_FLAGS, f"-I{jax.ffi.include_dir()}",
               *[str(here / s) for s in _SOURCES], "-o", str(tmp_lib)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
        os.replace(tmp_lib, lib)          # atomic: concurrent builders never see half a file
    return lib


def load():
    """The loaded native library with its FFI targets registered, or ``None``."""
    with _lock:
        if "lib" in _state:
            return _state["lib"]
        _state["lib"] = None
        if os.environ.get("SIMLIB_NATIVE", "1") == "0":
            return None
        try:
            lib = ctypes.cdll.LoadLibrary(str(_compile(Path(__file__).parent)))
            for name in _TARGETS:
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, name)),
                                            platform="cpu")
        except Exception as err:  # noqa: BLE001 - any failure means: use the JAX kernels
            warnings.warn(f"simlib: native kernels unavailable, using pure JAX ({err})",
                          RuntimeWarning, stacklevel=3)
            return None
        _state["lib"] = lib
        return lib
