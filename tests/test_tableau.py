"""Butcher's order conditions for every shipped Runge-Kutta tableau.

A rooted tree ``t`` is written as the sorted tuple of its subtrees (the leaf is
``()``).  For a stage matrix ``A`` the stage weights are

    Phi_i(leaf) = 1,   Phi_i([t_1, ..., t_m]) = prod_k sum_j A_ij Phi_j(t_k),

and a weight vector ``w`` has order ``p`` iff ``gamma(t) * w @ Phi(t) == 1`` for
every tree with at most ``p`` nodes (Hairer, Norsett and Wanner, *Solving ODEs
I*, 1993, Sec. II.2).  Dense output of order ``p`` asks for
``gamma(t) * w(theta) @ Phi(t) == theta**|t|`` for all those trees.

Residuals are checked in these normalised units against ``TOL`` (round-off of
the double-precision coefficients is ~1e-14 there); a method must also *fail*
the conditions one order higher by far more than round-off, so that the
declared orders are exact.
"""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest

from simlib._solver._rk_tableaus import ALL_TABLEAUS, DOPRI8
from simlib._solver._tableau import ButcherTableau

TOL = 1e-12
# A condition that should fail must miss by at least this much.
FAIL_MARGIN = 1e-6
THETAS = (0.1, 0.3, 0.5, 0.7, 0.9)

Tree = tuple


def _canonical(tree: Tree) -> Tree:
    return tuple(sorted(_canonical(sub) for sub in tree))


def _grafts(tree: Tree):
    """All trees obtained from ``tree`` by attaching one new leaf to a node."""
    yield (*tree, ())
    for k, sub in enumerate(tree):
        for grown in _grafts(sub):
            yield tree[:k] + (grown,) + tree[k + 1 :]


@cache
def trees_of_order(n: int) -> tuple[Tree, ...]:
    """All rooted trees with ``n`` nodes, each once."""
    if n == 1:
        return ((),)
    grown = {_canonical(g) for t in trees_of_order(n - 1) for g in _grafts(t)}
    return tuple(sorted(grown))


def n_nodes(tree: Tree) -> int:
    return 1 + sum(n_nodes(sub) for sub in tree)


def density(tree: Tree) -> int:
    g = n_nodes(tree)
    for sub in tree:
        g *= density(sub)
    return g


def stage_weights(tree: Tree, A: np.ndarray, memo: dict) -> np.ndarray:
    if tree not in memo:
        phi = np.ones(A.shape[0])
        for sub in tree:
            phi = phi * (A @ stage_weights(sub, A, memo))
        memo[tree] = phi
    return memo[tree]


def extended_a(tab: ButcherTableau) -> np.ndarray:
    """Stage matrix over the method's stages followed by its dense-output extras."""
    s = tab.stages
    n = s + len(tab.a_extra)
    A = np.zeros((n, n))
    for i, row in enumerate(tab.a):
        A[i, :i] = row
    for j, row in enumerate(tab.a_extra):
        A[s + j, : s + j] = row
    return A


def padded(w, n: int) -> np.ndarray:
    out = np.zeros(n)
    out[: len(w)] = w
    return out


def residuals(w: np.ndarray, A: np.ndarray, order: int, theta: float = 1.0) -> list[float]:
    """``|gamma(t) * w @ Phi(t) - theta**|t||`` for every tree with ``order`` nodes."""
    memo: dict = {}
    return [
        abs(density(t) * (w @ stage_weights(t, A, memo)) - theta**order)
        for t in trees_of_order(order)
    ]


def assert_order(w: np.ndarray, A: np.ndarray, order: int, theta: float = 1.0) -> None:
    for n in range(1, order + 1):
        worst = max(residuals(w, A, n, theta))
        assert worst <= TOL, f"order {n} condition violated by {worst:.3e} (theta={theta})"
    worst = max(residuals(w, A, order + 1, theta))
    assert worst > FAIL_MARGIN, (
        f"conditions of order {order + 1} also hold (worst residual {worst:.3e}, "
        f"theta={theta}); the declared order is too low"
    )


def dense_weights(tab: ButcherTableau, theta: float) -> np.ndarray:
    coef = np.array(tab.dense)
    return coef @ theta ** np.arange(1, coef.shape[1] + 1)


def dense_slopes(tab: ButcherTableau, theta: float) -> np.ndarray:
    coef = np.array(tab.dense)
    m = np.arange(1, coef.shape[1] + 1)
    return coef @ (m * theta ** (m - 1))


IDS = [t.name for t in ALL_TABLEAUS]
DENSE = [t for t in ALL_TABLEAUS if t.dense is not None]


def test_tree_counts():
    # OEIS A000081: number of rooted trees with n nodes.
    assert [len(trees_of_order(n)) for n in range(1, 10)] == [1, 1, 2, 4, 9, 20, 48, 115, 286]
    assert all(n_nodes(t) == n for n in range(1, 10) for t in trees_of_order(n))
    # gamma of the tall tree is n!, of the bushy tree n.
    tall = ((((),),),)
    assert density(tall) == 24 and density(((), (), ())) == 4


def test_names_unique_and_metadata():
    assert len({t.name for t in ALL_TABLEAUS}) == len(ALL_TABLEAUS)
    for tab in ALL_TABLEAUS:
        assert tab.reference
        assert (tab.b_error is None) == (tab.error_order is None), tab.name
        assert (tab.dense is None) == (tab.dense_order is None), tab.name
        if tab.fsal:
            assert tab.c[-1] == 1.0 and tab.b[-1] == 0.0, tab.name
            assert tuple(tab.a[-1]) == tuple(tab.b[:-1]), tab.name


@pytest.mark.parametrize("tab", ALL_TABLEAUS, ids=IDS)
def test_order_conditions(tab):
    A = extended_a(tab)
    assert_order(padded(tab.b, len(A)), A, tab.order)


@pytest.mark.parametrize("tab", [t for t in ALL_TABLEAUS if t.adaptive], ids=lambda t: t.name)
def test_embedded_order_conditions(tab):
    A = extended_a(tab)
    b = padded(tab.b, len(A))
    if tab is DOPRI8:
        # DOP853 carries two embedded solutions of orders 5 and 3; their
        # combination is what makes the estimate behave like order 7.
        assert tab.error_order == 7
        assert_order(b - padded(tab.b_error, len(A)), A, 5)
        assert_order(b - padded(tab.b_error3, len(A)), A, 3)
    else:
        assert tab.b_error3 is None
        assert_order(b - padded(tab.b_error, len(A)), A, tab.error_order)


@pytest.mark.parametrize("theta", THETAS)
@pytest.mark.parametrize("tab", DENSE, ids=[t.name for t in DENSE])
def test_dense_output_order_conditions(tab, theta):
    A = extended_a(tab)
    assert_order(dense_weights(tab, theta), A, tab.dense_order, theta)


@pytest.mark.parametrize("tab", DENSE, ids=[t.name for t in DENSE])
def test_dense_output_endpoints(tab):
    n = tab.stages + len(tab.a_extra)
    assert all(len(row) == len(tab.dense[0]) for row in tab.dense)
    assert len(tab.dense[0]) >= tab.dense_order
    # theta = 0: no increment; theta = 1: exactly the step's weights.
    np.testing.assert_array_equal(dense_weights(tab, 0.0), np.zeros(n))
    np.testing.assert_allclose(dense_weights(tab, 1.0), padded(tab.b, n), rtol=0, atol=TOL)
    # The interpolant's slope is f_old at theta = 0 and f_new (the FSAL stage)
    # at theta = 1, so the dense output is C^1 across steps.
    np.testing.assert_allclose(dense_slopes(tab, 0.0), padded([1.0], n), rtol=0, atol=TOL)
    if tab.fsal:
        f_new = np.zeros(n)
        f_new[tab.stages - 1] = 1.0
        np.testing.assert_allclose(dense_slopes(tab, 1.0), f_new, rtol=0, atol=TOL)


def test_dopri8_layout():
    assert DOPRI8.stages == 13 and len(DOPRI8.a_extra) == 3 and len(DOPRI8.dense) == 16
    assert DOPRI8.b_error[-1] == 0.0 and DOPRI8.b_error3[-1] == 0.0
    assert [len(row) for row in DOPRI8.a_extra] == [13, 14, 15]


def _good_kwargs():
    return dict(
        name="Broken",
        reference="test",
        order=2,
        a=((), (1 / 2,)),
        b=(0.0, 1.0),
        c=(0.0, 1 / 2),
    )


def test_valid_small_tableau_constructs():
    ButcherTableau(**_good_kwargs())


def test_row_sum_mismatch_raises_naming_row():
    kwargs = _good_kwargs() | {"a": ((), (0.4,))}
    with pytest.raises(ValueError, match=r"Broken: row 1 of a sums to"):
        ButcherTableau(**kwargs)


@pytest.mark.parametrize("tab", [t for t in ALL_TABLEAUS if t.stages >= 4], ids=lambda t: t.name)
def test_perturbed_shipped_row_raises_naming_row(tab):
    a = [list(row) for row in tab.a]
    a[3][0] += 1e-6
    with pytest.raises(ValueError, match=rf"{tab.name}: row 3 of a sums to"):
        dataclasses.replace(tab, a=tuple(tuple(row) for row in a))


def test_weights_not_summing_to_one_raise():
    kwargs = _good_kwargs() | {"b": (0.1, 1.0)}
    with pytest.raises(ValueError, match=r"Broken: weights b sum to"):
        ButcherTableau(**kwargs)
