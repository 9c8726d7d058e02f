"""The marker for tests of the optional native CPU kernels (tests/test_native.py and the
PME kernels' tests)."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest

from simlib.particles import _native

REQUIRE_NATIVE = os.environ.get("SIMLIB_REQUIRE_NATIVE", "0") == "1"


def native(test):
    """Run ``test`` only where the native kernels load: skip elsewhere, but fail under
    ``SIMLIB_REQUIRE_NATIVE=1`` (CI), so a broken build cannot pass as "skipped"."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if _native.load() is None:
            message = f"native kernels unavailable: {_native.unavailable_reason()}"
            if REQUIRE_NATIVE:
                pytest.fail(message + " (SIMLIB_REQUIRE_NATIVE=1)")
            pytest.skip(message)
        return test(*args, **kwargs)

    return wrapper


def with_and_without_native(script: str, tmp_path) -> tuple:
    """Run ``script`` (``python -c``, writing an ``.npz`` to ``sys.argv[1]`` with a boolean
    ``native``) under ``SIMLIB_NATIVE=1`` and ``=0``; check that the first used the native
    kernels and the second did not, and return the two files' contents."""
    out = {}
    for flag in ("1", "0"):
        path = tmp_path / f"native{flag}.npz"
        run = subprocess.run([sys.executable, "-c", script, str(path)],
                             env=dict(os.environ, SIMLIB_NATIVE=flag), capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-2000:]
        out[flag] = np.load(path)
    assert bool(out["1"]["native"]) and not bool(out["0"]["native"])
    return out["1"], out["0"]


def same_bits_on_one_and_two_threads(script: str, tmp_path) -> None:
    """Run ``script`` (``python -c``, writing an ``.npy`` to ``sys.argv[1]``) with one and
    with two OpenMP threads, and check that the two files hold the same bits."""
    out = {}
    for threads in ("1", "2"):
        path = tmp_path / f"threads{threads}.npy"
        run = subprocess.run([sys.executable, "-c", script, str(path)],
                             env=dict(os.environ, OMP_NUM_THREADS=threads),
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        out[threads] = np.load(path)
    np.testing.assert_array_equal(out["1"], out["2"])
