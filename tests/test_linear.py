"""Linear systems y' = A y against the matrix exponential, for hypothesis-drawn A.

``A = -(M M^T) - eps I + (S - S^T)``: its symmetric part is at most ``-eps`` in the
sense of quadratic forms, so the 2-norm logarithmic norm of ``A`` is ``<= -eps < 0``
and ``||exp(A t)||_2 <= 1`` for ``t >= 0`` (the flow is a contraction).  Then the
global error is at most the sum of the local errors (each is propagated by a
contraction), which gives the bounds used below.  ``A`` enters through ``args`` so
one compilation serves all examples of a shape.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy.linalg import expm

import simlib as sl

T = 2.0
RTOL, ATOL = 1e-10, 1e-12
DT = 0.01
N_STEPS = round(T / DT)

unit = st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False)


def linear(t, y, A):
    return A @ y


@st.composite
def stable_systems(draw, n):
    M = draw(arrays(np.float64, (n, n), elements=unit))
    S = draw(arrays(np.float64, (n, n), elements=st.floats(-2.0, 2.0, allow_subnormal=False)))
    eps = draw(st.floats(0.1, 1.0))
    A = -(M @ M.T) - eps * np.eye(n) + (S - S.T)
    v = draw(arrays(np.float64, (n,), elements=unit))
    assume(np.linalg.norm(v) > 0.1)
    return A, v / np.linalg.norm(v)  # |y0| = 1


def test_matrices_are_contractive():
    """The premise of the bounds: the symmetric part of A is negative definite."""
    rng = np.random.default_rng(0)
    for n in (2, 3, 4):
        M, S = rng.uniform(-1, 1, (n, n)), rng.uniform(-2, 2, (n, n))
        A = -(M @ M.T) - 0.1 * np.eye(n) + (S - S.T)
        assert np.linalg.eigvalsh((A + A.T) / 2).max() <= -0.1 + 1e-12
        assert np.linalg.norm(expm(A * 0.7), 2) <= 1.0


@pytest.mark.parametrize("n", [2, 3, 4])
@settings(max_examples=12)
@given(data=st.data())
def test_tsit5_matches_expm(n, data):
    A, y0 = data.draw(stable_systems(n))
    sol = sl.solve(linear, jnp.asarray(y0), 0.0, T, solver=sl.Tsit5(), rtol=RTOL, atol=ATOL,
                   args=jnp.asarray(A))
    exact = expm(A * T) @ y0
    err = np.linalg.norm(np.asarray(sol.ys[0]) - exact)
    # Each accepted step keeps its local error below ~ (rtol |y| + atol) sqrt(n) in the
    # 2-norm (RMS-norm control, |y| <= |y0| = 1); the contraction adds them up at most.
    n_acc = int(sol.stats["num_accepted"])
    bound = n_acc * (RTOL + ATOL) * math.sqrt(n)
    assert bound <= 1e-7  # a few hundred steps: the error is well inside 1e-7 |y0|
    assert err <= bound, (err, bound, n_acc)


def _rk4_stability_matrix(hA):
    return sum(np.linalg.matrix_power(hA, k) / math.factorial(k) for k in range(5))


@pytest.mark.parametrize("n", [2, 3, 4])
@settings(max_examples=12)
@given(data=st.data())
def test_rk4_within_truncation_bound(n, data):
    A, y0 = data.draw(stable_systems(n))
    sol = sl.solve(linear, jnp.asarray(y0), 0.0, T, solver=sl.RK4(), dt=DT, args=jnp.asarray(A))
    y = np.asarray(sol.ys[0])
    # On y' = A y one RK4 step is multiplication by R(hA) = sum_{k<=4} (hA)^k / k!.
    R = _rk4_stability_matrix(DT * A)
    E = expm(DT * A)
    # y_N - y(T) = sum_k E^(N-1-k) (R - E) R^k y0, with ||E^j|| <= 1 and
    # ||R^k|| <= (1 + delta)^k, delta = ||R - E||: a rigorous truncation-error bound.
    delta = np.linalg.norm(R - E, 2)
    bound = N_STEPS * delta * (1 + delta) ** N_STEPS
    exact = expm(A * T) @ y0
    assert np.linalg.norm(y - exact) <= bound + 1e-13, (np.linalg.norm(y - exact), bound)
    # And it is exactly that polynomial: agreement up to round-off of N_STEPS steps.
    discrete = np.linalg.matrix_power(R, N_STEPS) @ y0
    assert np.linalg.norm(y - discrete) <= 1e-12
