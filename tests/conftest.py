"""Test configuration: float64 on for the tests only (simlib itself never flips it)."""

import jax
from hypothesis import HealthCheck, settings

jax.config.update("jax_enable_x64", True)

settings.register_profile(
    "simlib",
    deadline=None,
    derandomize=True,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("simlib")
