"""The Bari test set's index-1 DAEs (chemical Akzo Nobel, transistor amplifier) against
their published reference solutions (Mazzia and Magherini, *Test Set for IVP Solvers*,
release 2.4: ``chemakzo.f``, ``transamp.f``).

Default tests check the definitions against the Fortran's own data (consistent initial
values, ``y'(0)``, the mass matrix) and an independent numpy transcription; the solves
(every DAE solver at rtol 1e-4, 1e-6, 1e-8, and SUNDIALS IDA as a cross-check) are slow.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import systems
from simlib.systems import AKZO_NOBEL, TRANSISTOR_AMPLIFIER, scd
from validation import dae_reference
from validation.dae import ATOL_PER_RTOL, SKIPPED, simlib_run

SOLVERS = ("Rodas5P", "Rodas5", "Rosenbrock23", "BDF", "Kvaerno5")


def test_reference_values_are_the_published_ones():
    # chemakzo.f / transamp.f, subroutine solut (spot checks of first and last digits)
    assert AKZO_NOBEL.reference[0] == 0.1150794920661702
    assert AKZO_NOBEL.reference[5] == 0.4873531310307455e-2
    assert TRANSISTOR_AMPLIFIER.reference[0] == -0.5562145012262709e-2
    assert TRANSISTOR_AMPLIFIER.reference[7] == 0.1236995868091548e1
    assert (AKZO_NOBEL.t1, TRANSISTOR_AMPLIFIER.t1) == (180.0, 0.2)
    assert not AKZO_NOBEL.reference.flags.writeable


def test_akzo_nobel_initial_values_are_consistent():
    y0 = AKZO_NOBEL.y0
    np.testing.assert_allclose(y0[:5], [0.444, 0.00123, 0.0, 0.007, 0.0])
    f = dae_reference.akzo_nobel_np(y0, AKZO_NOBEL.args)  # = simlib's (test below)
    assert abs(f[5]) < 1e-16  # the algebraic equation Ks y1 y4 - y6 = 0
    np.testing.assert_array_equal(systems.akzo_nobel_mass_matrix(),
                                  np.diag([1.0, 1, 1, 1, 1, 0]))


def test_transistor_amplifier_initial_values_are_consistent():
    # transamp.f's y(0) and y'(0) satisfy M y'(0) = f(0, y(0)) to the Fortran's 8 digits
    y0 = TRANSISTOR_AMPLIFIER.y0
    np.testing.assert_array_equal(y0, [0.0, 3.0, 3.0, 6.0, 3.0, 3.0, 6.0, 0.0])
    # numpy transcriptions: equal to simlib's (test below)
    m = dae_reference.transistor_amplifier_mass_np(TRANSISTOR_AMPLIFIER.args)
    assert np.linalg.matrix_rank(m) == 5
    yp0 = systems.transistor_amplifier_initial_derivative()
    np.testing.assert_array_equal(yp0, dae_reference.transistor_amplifier_yp0(
        TRANSISTOR_AMPLIFIER.args))
    f = dae_reference.transistor_amplifier_np(0.0, y0, TRANSISTOR_AMPLIFIER.args)
    np.testing.assert_allclose(m @ yp0, f, rtol=0, atol=1e-12)


@pytest.mark.parametrize("problem", [AKZO_NOBEL, TRANSISTOR_AMPLIFIER], ids=lambda p: p.name)
def test_vector_field_matches_numpy_transcription(problem):
    rng = np.random.default_rng(0)
    field = jax.jit(problem.vector_field)  # one compilation, not one per eager op
    for _ in range(3):
        y = np.abs(problem.y0 * (1 + 0.2 * rng.standard_normal(problem.y0.size))) + 0.01
        t = float(rng.uniform(problem.t0, problem.t1))
        got = np.asarray(field(t, jnp.asarray(y), problem.args))
        if problem is AKZO_NOBEL:
            want = dae_reference.akzo_nobel_np(y, problem.args)
        else:
            want = dae_reference.transistor_amplifier_np(t, y, problem.args)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-300)
    if problem is TRANSISTOR_AMPLIFIER:
        np.testing.assert_allclose(np.asarray(jax.jit(problem.mass_matrix)(problem.args)),
                                   dae_reference.transistor_amplifier_mass_np(problem.args),
                                   rtol=0, atol=0)


def test_scd_is_the_test_sets_definition():
    ref = np.array([2.0, -0.5])
    np.testing.assert_allclose(scd([2.002, -0.5005], ref), [3.0, 3.0])
    assert scd(ref, ref)[0] == np.inf


@pytest.mark.slow
@pytest.mark.parametrize("rtol", [1e-4, 1e-6, 1e-8])
@pytest.mark.parametrize("problem", ["akzo_nobel", "transistor_amplifier"])
@pytest.mark.parametrize("solver", SOLVERS)
def test_scd_at_least_digits_of_rtol_minus_one(solver, problem, rtol):
    if (solver, problem, rtol) in SKIPPED:
        pytest.skip(SKIPPED[(solver, problem, rtol)])
    rec = simlib_run(solver, problem, rtol)
    assert rec["result"] == 0
    target = -np.log10(rtol) - 1.0
    assert rec["min_scd"] >= target, (rec["scd"], ATOL_PER_RTOL[problem])


@pytest.mark.slow
def test_consistent_initialisation_recovers_the_algebraic_component():
    # y6 = Ks y1 y4 from a wrong guess, then the published solution at t = 180
    y0 = jnp.asarray(AKZO_NOBEL.y0).at[5].set(0.0)
    sol = sl.solve(systems.akzo_nobel, y0, 0.0, 180.0, solver=sl.Rodas5P(), rtol=1e-7,
                   atol=1e-9, mass_matrix=jnp.asarray(systems.akzo_nobel_mass_matrix()),
                   initialize="consistent", saveat=sl.SaveAt(ts=jnp.array([0.0, 180.0])))
    np.testing.assert_allclose(float(sol.ys[0, 5]), 115.83 * 0.444 * 0.007, rtol=1e-12)
    assert np.min(scd(np.asarray(sol.ys[-1]), AKZO_NOBEL.reference)) >= 6.0


@pytest.mark.slow
@pytest.mark.skipif(not dae_reference.available(), reason="scikit-sundae not installed")
def test_ida_reproduces_the_published_solutions():
    # the definitions (numpy transcription) solved by SUNDIALS IDA
    run = dae_reference.ida_solve(AKZO_NOBEL, 1e-10, 1e-12)
    assert np.min(scd(run.y1, AKZO_NOBEL.reference)) >= 9.0
    run = dae_reference.ida_solve(TRANSISTOR_AMPLIFIER, 1e-6, 1e-8)
    assert np.min(scd(run.y1, TRANSISTOR_AMPLIFIER.reference)) >= 4.5
