"""Validation suite for simlib: accuracy, convergence, energy, work-precision, gradients,
particles.

Heavier than the unit tests. Run it from the repository root with

    python -m validation            # full run, about 15 minutes on 2 cores
    python -m validation --quick    # reduced run, about three minutes

It writes ``validation/report.md`` and the figures under ``validation/figures/``.
The suite switches JAX to float64 itself (``jax.config.update`` in
:mod:`validation.common`); simlib never does.
"""
