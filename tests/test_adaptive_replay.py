"""The adaptive forward pass exists twice: the ``while_loop`` that ``solve`` runs and the
bounded ``scan`` that its reverse-mode derivative replays (simlib/_adaptive.py). The
gradient is that of the forward computation only if the replay takes the very same
attempts, so both are run here on a stiff-ish, a chaotic and a rejection-heavy problem
and their accepted times and states, step counts and final states are compared bitwise.

Chaos amplifies any difference of one ulp to O(1) by t = 20 on Lorenz, so equality there
is a sharp test; the rejection-heavy case checks that rejected attempts leave the carry
(step size, PI controller memory, FSAL stage) exactly as the while loop does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl
from simlib import _adaptive
from simlib.systems import lorenz, van_der_pol


def square_wave(t, y, args):
    """y' = -y + sign(sin 5t): the field jumps 16 times on [0, 10], and at each jump the
    controller rejects attempt after attempt while it shrinks the step onto it."""
    return -y + jnp.sign(jnp.sin(5.0 * t))


# name: (f, solver, y0, t1, dt0 (None: automatic), rtol, atol, args, max_steps)
CASES = {
    "van_der_pol_mu20": (van_der_pol, sl.Tsit5(), [2.0, 0.0], 40.0, None, 1e-6, 1e-6,
                         (20.0,), 6000),
    "lorenz_t20": (lorenz, sl.Tsit5(), [1.0, 1.0, 1.0], 20.0, None, 1e-8, 1e-8, None, 6000),
    # jumps in the field and a far too large first step: about half the attempts rejected
    "square_wave_rejections": (square_wave, sl.Dopri5(), [0.0], 10.0, 2.0, 1e-8, 1e-8, None,
                               6000),
}


def _both(f, solver, y0, t1, dt0, rtol, atol, args, max_steps, adjoint):
    inputs = dict(y0=jnp.asarray(y0), t0=jnp.asarray(0.0), t1=jnp.asarray(t1),
                  dt0=None if dt0 is None else jnp.asarray(dt0), rtol=jnp.asarray(rtol),
                  atol=jnp.asarray(atol), ts=None, args=args)

    @jax.jit
    def run(inputs):
        fwd = _adaptive._adaptive_forward(f, solver, "steps", 0, max_steps, **inputs)
        rep = _adaptive._adaptive_replay(f, solver, "steps", 0, max_steps, adjoint, **inputs)
        return fwd, rep

    return run(inputs)


@pytest.mark.parametrize("adjoint", [sl.Direct(), sl.Checkpointed()],
                         ids=["direct", "checkpointed"])
@pytest.mark.parametrize("name", list(CASES))
def test_replay_takes_the_same_steps_bitwise(name, adjoint):
    f, solver, y0, t1, dt0, rtol, atol, args, max_steps = CASES[name]
    (c_f, _, (ts_f, ys_f)), (c_r, _, (ts_r, ys_r)) = _both(
        f, solver, y0, t1, dt0, rtol, atol, args, max_steps, adjoint)
    assert int(c_f.result) == 0 and float(c_f.t) == t1
    n_acc, n_att = int(c_f.n_accepted), int(c_f.n_steps)
    assert n_att < max_steps
    if name == "square_wave_rejections":
        assert n_att - n_acc >= 300, (n_att, n_acc)
    assert (int(c_r.n_accepted), int(c_r.n_steps)) == (n_acc, n_att)
    # every accepted time and state, then the final carry, to 0 ulp
    np.testing.assert_array_equal(np.asarray(ts_r)[:n_acc], np.asarray(ts_f)[:n_acc])
    np.testing.assert_array_equal(np.asarray(ys_r)[:n_acc], np.asarray(ys_f)[:n_acc])
    for a, b in zip(jax.tree_util.tree_leaves(c_r), jax.tree_util.tree_leaves(c_f),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
