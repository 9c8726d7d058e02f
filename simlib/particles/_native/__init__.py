"""Optional native CPU kernels of the particle engine, compiled on first use and called
through ``jax.ffi``: direct-sum gravity, the cell-list neighbour build, Lennard-Jones
forces, the real-space Ewald sum over a neighbour list and PME's charge spreading and
force gathering (the C++ sources next to this file).

Building, caching, the environment variables (``SIMLIB_NATIVE``, ``SIMLIB_CACHE``,
``CXX``) and the fallback to the pure-JAX kernels are those of every simlib native library:
see :mod:`simlib._native`. The pure-JAX kernels give the same results and are the reference
the tests compare the native ones with.

The kernels never index memory from position values without range reduction (see the
comments in ``neighbors.cc``): non-finite or huge positions give non-finite results or
empty neighbour rows, never a crash; detecting such a state is the caller's job.
"""

from __future__ import annotations

from pathlib import Path

from ..._native import NativeLibrary, disabled  # noqa: F401 - disabled: used by the CLI

_LIBRARY = NativeLibrary(
    Path(__file__).parent,
    sources=("gravity.cc", "neighbors.cc", "lj.cc", "ewald.cc", "pme.cc"),
    targets=("simlib_gravity_f32", "simlib_gravity_f64", "simlib_neighbors_f32",
             "simlib_neighbors_f64", "simlib_lj_f32", "simlib_lj_f64", "simlib_lj_diag_f32",
             "simlib_lj_diag_f64", "simlib_ewald_f32",
             "simlib_ewald_f64", "simlib_ewald_lj_f32", "simlib_ewald_lj_f64",
             "simlib_pme_spread_f32", "simlib_pme_spread_f64",
             "simlib_pme_gather_f32", "simlib_pme_gather_f64"),
    library="libsimlib_native.so",
)


def native_library() -> NativeLibrary:
    """The particle kernels' library (not loaded until :meth:`NativeLibrary.load`)."""
    return _LIBRARY


def load():
    """The loaded particle library with its FFI targets registered, or ``None`` (decided
    once per process; :func:`unavailable_reason` says why)."""
    return _LIBRARY.load()


def unavailable_reason() -> str | None:
    """Why :func:`load` returned ``None`` (``None`` if it loaded or was not tried yet)."""
    return _LIBRARY.unavailable_reason()


def library_path() -> Path:
    """Where :func:`load` looks for (and builds) the library on this machine."""
    return _LIBRARY.library_path()


def _plan():
    return _LIBRARY._plan()
