"""Test configuration: float64 on for the tests only (simlib itself never flips it), and
JAX's persistent compilation cache, so that a program compiled once is loaded from disk by
every later module, job and run.

The cache lives in ``$SIMLIB_TEST_COMPILATION_CACHE`` (CI points the default and slow jobs
at one folder), else ``.pytest_cache/jax`` in the clone; ``off`` turns it off. JAX keys each
entry on the program's HLO, the compile options and the versions, so an edited solver
compiles anew and never reuses a stale entry.
"""

import gc
import os
from pathlib import Path

import jax
import pytest
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)

_CACHE = os.environ.get("SIMLIB_TEST_COMPILATION_CACHE",
                        str(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"))
if _CACHE.strip().lower() not in ("", "0", "off", "no", "false"):
    jax.config.update("jax_compilation_cache_dir", _CACHE)
    # every program, however quick to compile: a test suite compiles thousands of small ones
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)

settings.register_profile(
    "simlib",
    deadline=None,
    derandomize=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("simlib")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """Drop JAX's compiled programs after each test module.

    XLA:CPU maps a few memory regions per compiled executable; one process that runs the
    whole slow job (thousands of executables) reached Linux's `vm.max_map_count` (65530)
    and segfaulted inside `backend_compile` (CI, 2026-12-05). Fixtures that share
    compilation are module- or function-scoped, so nothing shared is lost.
    """
    yield
    jax.clear_caches()
    gc.collect()


def _memory_maps() -> int:
    try:
        with open("/proc/self/maps") as maps:
            return sum(1 for _ in maps)
    except OSError:  # not Linux
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs_when_maps_run_high():
    """The same within a module whose tests compile many programs (the adjoint table
    reached 31,000 maps in one module): clear once the process holds over 30,000 maps."""
    yield
    if _memory_maps() > 30_000:
        jax.clear_caches()
        gc.collect()


def _listed_slow_tests() -> set[str]:
    """The node ids in tests/slow_in_default.txt: the default tests moved to the slow job
    (``python -m pytest tests -m slow``, CI's second step), why each, and when."""
    lines = (Path(__file__).with_name("slow_in_default.txt").read_text().splitlines())
    return {line.split("#", 1)[0].strip() for line in lines} - {""}


SLOW_IN_DEFAULT = _listed_slow_tests()


def pytest_collection_modifyitems(config, items):
    import pytest

    names = {item.nodeid.split("tests/", 1)[-1]: item for item in items}
    # a renamed test must not silently fall back into the default suite
    full_run = all(arg.rstrip("/").endswith("tests") for arg in config.args)
    missing = SLOW_IN_DEFAULT - set(names)
    if full_run and missing and not config.getoption("keyword"):
        raise pytest.UsageError(f"SLOW_IN_DEFAULT names unknown tests: {sorted(missing)}")
    for name in SLOW_IN_DEFAULT & set(names):
        names[name].add_marker(pytest.mark.slow)
