"""The adaptive replay runs only the chunks of attempts that the solve made (issue 24).

The reverse pass of an adaptive solve replays its attempts in chunks sized for
``max_steps``. A ``lax.scan`` of ``lax.cond(live, chunk, skip)`` over all of them stored,
for every skipped chunk, zero residuals the size of a run one's: the transistor
amplifier's gradient (380 attempts, ``max_steps=200_000``) held 13 KB of temporaries per
attempt of budget and took 1,060x its forward solve. These tests read the compiled
gradient's temporaries (``memory_analysis()``) and check the gradient against a closed form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl

N = 16  # states: a step's residuals (stages, Jacobian) are many times its records


def decay(t, y, args):
    return -args[0] * y


def loss(p, max_steps):
    y0 = jnp.linspace(1.0, 2.0, N)
    sol = sl.solve(decay, y0, 0.0, 1.0, solver=sl.Tsit5(), rtol=1e-6, atol=1e-9,
                   args=(p,), max_steps=max_steps, adjoint=sl.Direct(),
                   saveat=sl.SaveAt(ts=jnp.array([0.5, 1.0])))
    return jnp.sum(sol.ys)


def temp_bytes(max_steps: int) -> int:
    grad = jax.jit(jax.grad(lambda p: loss(p, max_steps)))
    return grad.lower(jnp.float64(0.7)).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_replay_memory_does_not_hold_residuals_of_skipped_chunks():
    """Sixteen times the attempt budget: the gradient's temporaries grow by the records of
    the extra attempts (t, y, h, accepted, new t, new y: 2 N + 4 numbers each, kept for
    the save times and their cotangent), not by their residuals. Measured per extra
    attempt: 1,887 bytes with the scan of conds (this test failed there), 331 bytes with
    the chunks that run (a record is 2 N + 4 = 36 numbers, 288 bytes)."""
    small, big = temp_bytes(1024), temp_bytes(16 * 1024)
    per_attempt = (big - small) / (15 * 1024)
    record = (2 * N + 4) * 8
    assert per_attempt < 3 * record, (small, big, per_attempt)


@pytest.mark.slow
def test_replay_gradient_matches_closed_form():
    """``sum_i y0_i (exp(-0.5 p) + exp(-p))``: its derivative in ``p``, through the replay
    (a few dozen attempts out of 16,384)."""
    p = 0.7
    y0 = np.linspace(1.0, 2.0, N)
    exact = -y0.sum() * (0.5 * np.exp(-0.5 * p) + np.exp(-p))
    g = jax.grad(lambda q: loss(q, 16 * 1024))(jnp.float64(p))
    np.testing.assert_allclose(float(g), exact, rtol=1e-5)
