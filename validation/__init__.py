"""Validation suite for simlib: accuracy, convergence, energy, work-precision, gradients.

Heavier than the unit tests. Run it from the repository root with

    python -m validation            # full run, a few minutes on 2 cores
    python -m validation --quick    # reduced run, under about two minutes

It writes ``validation/report.md`` and the figures under ``validation/figures/``.
The suite switches JAX to float64 itself (``jax.config.update`` in
:mod:`validation.common`); simlib never does.
"""
