"""Validation suite for simlib: accuracy, convergence, energy, work-precision, gradients,
particles, stiff problems, stochastic differential equations, PDEs by the method of lines,
constant pressure (NPT) against the Lennard-Jones equation of state and LAMMPS.

Heavier than the unit tests. Run it from the repository root with

    python -m validation            # full run, about 15 minutes on 2 cores
    python -m validation --quick    # fast subset run by CI, 1-2 minutes on 2 cores

The full run writes ``validation/report.md`` and the figures under ``validation/figures/``;
``--quick`` writes to a temporary folder unless ``--output`` is given. The exit status is
non-zero when any check failed (each part records every check, passing or not, in
``Section.checks`` and the failed ones in ``Section.failures``; the report's "Checks"
table lists them all, the last line printed the failed ones).
The suite switches JAX to float64 itself (``jax.config.update`` in
:mod:`validation.common`); simlib never does.
"""
