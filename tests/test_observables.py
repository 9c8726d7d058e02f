"""Analysis observables: the multiple-origin MSD, block averages and the peak position,
against independent numpy computations and closed forms."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from simlib import particles as sp


def _walk(frames=40, n=30, box=2.0, seed=3):
    """Gaussian random walkers (numpy), unwrapped and wrapped into a periodic box."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.normal(0.0, 0.15, (frames, n, 3)), axis=0) + rng.uniform(0, box, (n, 3))
    return x, np.mod(x, box), box


def _numpy_msd(x, spacing):
    """Plain loops: for each lag, every origin t0 = 0, s, 2s, ... with t0 + lag in range."""
    f = len(x)
    out = np.zeros(f)
    for lag in range(f):
        sq = [np.mean(np.sum((x[t0 + lag] - x[t0]) ** 2, axis=-1))
              for t0 in range(0, f, spacing) if t0 + lag < f]
        out[lag] = np.mean(sq)
    return out


@pytest.mark.parametrize("spacing", [1, 3, 7])
def test_msd_with_time_origins_matches_numpy_loops_across_the_boundary(spacing):
    x, wrapped, box = _walk()
    assert np.any(np.abs(x - wrapped) > 0)            # walkers crossed the box
    msd = jax.jit(sp.mean_square_displacement, static_argnames="origins")(
        wrapped, sp.periodic(box), origins=spacing)
    np.testing.assert_allclose(msd, _numpy_msd(x, spacing), rtol=1e-12, atol=1e-14)


def test_msd_origins_mechanism_first_origin_and_last_lag():
    """origins=None is the first frame only; the last lag has only the origin at frame 0, so
    every spacing gives the single-origin value there; spacing >= n_frames is one origin."""
    x, wrapped, box = _walk(frames=12)
    space = sp.periodic(box)
    one = np.asarray(sp.mean_square_displacement(wrapped, space))
    first = np.mean(np.sum((x - x[:1]) ** 2, axis=-1), axis=-1)
    np.testing.assert_allclose(one, first, rtol=1e-12, atol=1e-14)
    for s in (1, 2, 5):
        many = np.asarray(sp.mean_square_displacement(wrapped, space, origins=s))
        assert np.isclose(many[-1], first[-1], rtol=1e-12)
        assert many[0] == 0.0
    np.testing.assert_allclose(sp.mean_square_displacement(wrapped, space, origins=12), one,
                               rtol=1e-12)


def test_msd_refuses_bad_origins():
    _, wrapped, box = _walk(frames=5)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="origins"):
            sp.mean_square_displacement(wrapped, sp.periodic(box), origins=bad)
    with pytest.raises(ValueError, match="n_frames"):
        sp.mean_square_displacement(wrapped[0], origins=1)


def test_block_average_matches_numpy_blocks():
    x = np.random.default_rng(0).normal(size=103)
    mean, err = sp.block_average(x, 4)
    blocks = [x[0:26].mean(), x[26:52].mean(), x[52:78].mean(), x[78:103].mean()]
    assert mean == pytest.approx(x.mean(), rel=1e-14)
    assert err == pytest.approx(np.std(blocks, ddof=1) / 2.0, rel=1e-12)
    est = [1.0, 2.0, 4.0]                             # independent estimates
    assert sp.block_average(est) == pytest.approx((7 / 3, np.std(est, ddof=1) / np.sqrt(3)))


def test_block_average_of_a_correlated_series_matches_the_closed_form():
    """AR(1) series x_t = phi x_{t-1} + e_t (numpy): the standard error of the mean tends to
    sigma_e / (1 - phi) / sqrt(n) for long series. 20 blocks of 10,000 samples (correlation
    time about 19) estimate it within 3 x their own relative error sqrt(1 / (2 * 19)), where
    the naive independent-sample error is 4.4 times too small."""
    rng = np.random.default_rng(5)
    phi, n = 0.9, 200_000
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0] / np.sqrt(1 - phi**2)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    exact = 1.0 / (1 - phi) / np.sqrt(n)
    _, err = sp.block_average(x, 20)
    assert abs(err / exact - 1) < 3 * np.sqrt(1 / 38), err / exact
    naive = x.std(ddof=1) / np.sqrt(n)
    assert err / naive > 3.5


def test_block_average_refuses_bad_blocks():
    with pytest.raises(ValueError, match="n_blocks"):
        sp.block_average(np.ones(5), 1)
    with pytest.raises(ValueError, match="n_blocks"):
        sp.block_average(np.ones(5), 6)
    with pytest.raises(ValueError, match="1-D"):
        sp.block_average(np.ones((5, 2)), 2)


def test_peak_position_is_exact_for_a_parabola_and_close_for_a_gaussian():
    r = np.linspace(0.0, 2.0, 41)
    assert sp.peak_position(r, 3.0 - 5.0 * (r - 0.8371) ** 2) == pytest.approx(0.8371,
                                                                              abs=1e-12)
    g = np.exp(-((r - 1.2345) ** 2) / (2 * 0.2**2))
    # error of the parabola through three points of a Gaussian: well below a bin (0.05)
    assert sp.peak_position(r, g) == pytest.approx(1.2345, abs=2e-3)
    with pytest.raises(ValueError, match="equal length"):
        sp.peak_position(r, g[:-1])
