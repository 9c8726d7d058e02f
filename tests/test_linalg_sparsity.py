"""Sparsity detection from the vector field's jaxpr, and column colouring: against the
true pattern (closed forms for stencils) and against jacfwd's non-zeros."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp

from simlib._linalg._coloring import CompressedPattern, color_columns
from simlib._linalg._sparsity import jacobian_sparsity

M = 12


def _periodic_1d(n, offsets):
    i = np.arange(n)
    p = np.zeros((n, n), bool)
    for o in offsets:
        p[i, (i + o) % n] = True
    return p


def _neumann_1d(n):
    p = _periodic_1d(n, (-1, 0, 1))
    p[0, -1] = p[-1, 0] = False
    return p


def _grid_2d(r, c, periodic):
    p = np.zeros((r * c, r * c), bool)
    for i in range(r):
        for j in range(c):
            for di, dj in ((0, 0), (1, 0), (-1, 0), (0, 1), (0, -1)):
                a, b = i + di, j + dj
                if periodic:
                    a, b = a % r, b % c
                elif not (0 <= a < r and 0 <= b < c):
                    continue
                p[i * c + j, a * c + b] = True
    return p


def lap_roll(t, u):
    return jnp.roll(u, 1) + jnp.roll(u, -1) - 2 * u


def lap_neumann_concat(t, u):
    up = jnp.concatenate([u[1:2], u, u[-2:-1]])
    return up[2:] + up[:-2] - 2 * u


def lap_neumann_at(t, u):
    d = jnp.zeros_like(u).at[1:-1].set(u[2:] + u[:-2] - 2 * u[1:-1])
    return d.at[0].set(2 * (u[1] - u[0])).at[-1].set(2 * (u[-2] - u[-1]))


def lap_conv(t, u):
    return jnp.convolve(u, jnp.array([1.0, -2.0, 1.0]), mode="same")


def lap_pad_wrap(t, u):
    p = jnp.pad(u, 1, mode="wrap")
    return p[2:] + p[:-2] - 2 * u


def lap2d_roll(t, v):
    u = v.reshape(6, 7)
    return (jnp.roll(u, 1, 0) + jnp.roll(u, -1, 0) + jnp.roll(u, 1, 1) + jnp.roll(u, -1, 1)
            - 4 * u).ravel()


def lap2d_conv(t, v):
    k = jnp.array([[0, 1.0, 0], [1, -4, 1], [0, 1, 0]])
    return jax.scipy.signal.convolve2d(v.reshape(6, 7), k, mode="same").ravel()


def brusselator_2d(t, v, n=6):
    u, w = v.reshape(2, n, n)

    def lap(a):
        return (jnp.roll(a, 1, 0) + jnp.roll(a, -1, 0) + jnp.roll(a, 1, 1)
                + jnp.roll(a, -1, 1) - 4 * a)

    return jnp.stack([1 + u * u * w - 4.4 * u + 0.1 * lap(u),
                      3.4 * u - u * u * w + 0.1 * lap(w)]).ravel()


def _brusselator_pattern(n=6):
    g = _grid_2d(n, n, True)
    eye = np.eye(n * n, dtype=bool)
    return np.block([[g, eye], [eye, g]])


CASES = [
    ("roll", lap_roll, M, _periodic_1d(M, (-1, 0, 1))),
    ("neumann-concat", lap_neumann_concat, M, _neumann_1d(M)),
    ("neumann-at-set", lap_neumann_at, M, _neumann_1d(M)),
    ("convolve", lap_conv, M, _neumann_1d(M)),
    ("pad-wrap", lap_pad_wrap, M, _periodic_1d(M, (-1, 0, 1))),
    ("2d-roll", lap2d_roll, 42, _grid_2d(6, 7, True)),
    ("2d-convolve", lap2d_conv, 42, _grid_2d(6, 7, False)),
    ("brusselator-2d", brusselator_2d, 72, _brusselator_pattern()),
]
QUICK = ("neumann-at-set", "brusselator-2d")


@pytest.mark.parametrize("name,g,n,true", [
    pytest.param(*c, id=c[0], marks=[] if c[0] in QUICK else [pytest.mark.slow]) for c in CASES])
def test_detected_pattern_is_the_true_one(name, g, n, true):
    v = jnp.asarray(np.random.default_rng(0).uniform(0.5, 2.0, n))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every primitive here has a rule
        detected = jacobian_sparsity(g, 0.0, v).toarray()
    np.testing.assert_array_equal(detected, true)
    jac = np.asarray(jax.jacfwd(lambda w: g(0.0, w))(v))
    assert np.all(detected >= (jac != 0))


def where_on_y(t, u):
    return jnp.where(u > 0, u * jnp.roll(u, 1), jnp.sin(jnp.roll(u, -1)))


def test_a_state_dependent_where_gives_a_correct_jacobian_in_both_branches():
    """The union of the branches: coloured JVPs on it equal jacfwd whatever the signs."""
    n = M
    detected = jacobian_sparsity(where_on_y, 0.0, jnp.ones(n))
    np.testing.assert_array_equal(detected.toarray(), _periodic_1d(n, (-1, 0, 1)))
    pat = CompressedPattern(detected)
    rng = np.random.default_rng(1)
    for _ in range(3):
        v = jnp.asarray(rng.normal(size=n))
        vals = pat.jacobian(lambda w, v=v: jax.jvp(lambda x: where_on_y(0.0, x), (v,), (w,))[1],
                            v.dtype)
        np.testing.assert_array_equal(pat.matrix(np.asarray(vals)).toarray(),
                                      np.asarray(jax.jacfwd(lambda x: where_on_y(0.0, x))(v)))


@pytest.mark.slow
def test_loops_scatter_add_reductions_and_matmul():
    n = M
    a = np.diag(np.ones(n - 1), 1) + np.eye(n)
    cases = [
        (lambda t, u: jnp.asarray(a) @ u, a != 0),
        (lambda t, u: jnp.zeros_like(u).at[jnp.array([0, 3, 3, 5])].add(u[:4] * u[1:5]),
         None),
        (lambda t, u: jnp.cumsum(u), np.tril(np.ones((n, n), bool))),
        (lambda t, u: jax.lax.fori_loop(0, 2, lambda i, x: x + jnp.roll(x, 1), u),
         _periodic_1d(n, (0, -1, -2))),
        (lambda t, u: jax.lax.cond(u[0] > 0, lambda x: jnp.roll(x, 1), lambda x: 2 * x, u),
         _periodic_1d(n, (-1, 0))),
        (lambda t, u: jax.nn.relu(u) + jax.nn.softplus(jnp.roll(u, 2)), _periodic_1d(n, (0, -2))),
    ]
    rng = np.random.default_rng(2)
    for g, true in cases:
        detected = jacobian_sparsity(g, 0.0, jnp.ones(n)).toarray()
        union = np.zeros((n, n), bool)
        for _ in range(4):
            v = jnp.asarray(rng.normal(size=n))
            union |= np.asarray(jax.jacfwd(lambda x, g=g: g(0.0, x))(v)) != 0
        assert np.all(detected >= union)
        np.testing.assert_array_equal(detected, union if true is None else true)


def test_state_dependent_indexing_is_conservative_with_a_warning():
    def g(t, u):
        return u * u[jnp.argmax(u)]

    with pytest.warns(RuntimeWarning, match="dynamic_slice"):
        detected = jacobian_sparsity(g, 0.0, jnp.ones(M)).toarray()
    assert detected.all()  # every output may depend on every component


def test_coloring_is_valid_and_near_optimal_on_stencils():
    # tridiagonal: exactly 3 colours (the optimum: a row has 3 non-zeros)
    tri = sp.csr_matrix(_neumann_1d(30))
    assert color_columns(tri).max() + 1 == 3
    # 2-D Brusselator pattern: a valid colouring, between the lower bound (6 non-zeros in a
    # row) and the optimum 10 of a 5-point stencil with two coupled species (5 per species;
    # a species' colours must differ from the other's at the 5 neighbours) plus slack for a
    # periodic grid not divisible by 5
    p = sp.csr_matrix(_brusselator_pattern(8))
    colors = color_columns(p)
    for row in p:
        cols = row.indices
        assert len(set(colors[cols].tolist())) == cols.size
    assert 6 <= colors.max() + 1 <= 12
