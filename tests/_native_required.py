"""The marker for tests of the optional native CPU kernels (tests/test_native.py and the
PME kernels' tests)."""

import functools
import os

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
