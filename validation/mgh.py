"""The Moré-Garbow-Hillstrom test problems for nonlinear least squares.

J. J. Moré, B. S. Garbow and K. E. Hillstrom, "Testing unconstrained optimization
software", ACM Trans. Math. Software 7, 17-41 (1981), problems 1-35: residuals
:math:`f_i(x)`, :math:`i = 1..m`, the standard starting point :math:`x_0` and the minima of
:math:`f = \\sum_i f_i^2` that the paper reports (``minima``: the global one first, then the
other local minima it lists). Written in ``jax.numpy`` from the paper's formulas; each
``residuals(x)`` returns the ``(m,)`` vector.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np


@dataclass(frozen=True)
class Problem:
    number: int
    name: str
    n: int
    m: int
    residuals: Callable
    x0: np.ndarray
    minima: tuple[float, ...]

    @property
    def label(self) -> str:
        return f"{self.number} {self.name} (n={self.n}, m={self.m})"


def _rosenbrock(x):
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0]])


def _freudenstein_roth(x):
    return jnp.stack([-13 + x[0] + ((5 - x[1]) * x[1] - 2) * x[1],
                      -29 + x[0] + ((x[1] + 1) * x[1] - 14) * x[1]])


def _powell_badly_scaled(x):
    return jnp.stack([1e4 * x[0] * x[1] - 1, jnp.exp(-x[0]) + jnp.exp(-x[1]) - 1.0001])


def _brown_badly_scaled(x):
    return jnp.stack([x[0] - 1e6, x[1] - 2e-6, x[0] * x[1] - 2])


def _beale(x):
    y = jnp.array([1.5, 2.25, 2.625])
    i = jnp.arange(1, 4)
    return y - x[0] * (1 - x[1] ** i)


def _jennrich_sampson(x):
    i = jnp.arange(1, 11)
    return 2 + 2 * i - (jnp.exp(i * x[0]) + jnp.exp(i * x[1]))


def _helical_valley(x):
    theta = jnp.arctan(x[1] / x[0]) / (2 * jnp.pi) + jnp.where(x[0] < 0, 0.5, 0.0)
    return jnp.stack([10 * (x[2] - 10 * theta), 10 * (jnp.sqrt(x[0] ** 2 + x[1] ** 2) - 1),
                      x[2]])


_BARD_Y = jnp.array([0.14, 0.18, 0.22, 0.25, 0.29, 0.32, 0.35, 0.39, 0.37, 0.58, 0.73, 0.96,
                     1.34, 2.10, 4.39])


def _bard(x):
    u = jnp.arange(1.0, 16.0)
    v = 16 - u
    w = jnp.minimum(u, v)
    return _BARD_Y - (x[0] + u / (v * x[1] + w * x[2]))


_GAUSSIAN_Y = jnp.array([0.0009, 0.0044, 0.0175, 0.0540, 0.1295, 0.2420, 0.3521, 0.3989,
                         0.3521, 0.2420, 0.1295, 0.0540, 0.0175, 0.0044, 0.0009])


def _gaussian(x):
    t = (8 - jnp.arange(1.0, 16.0)) / 2
    return x[0] * jnp.exp(-x[1] * (t - x[2]) ** 2 / 2) - _GAUSSIAN_Y


_MEYER_Y = jnp.array([34780.0, 28610, 23650, 19630, 16370, 13720, 11540, 9744, 8261, 7030,
                      6005, 5147, 4427, 3820, 3307, 2872])


def _meyer(x):
    t = 45 + 5 * jnp.arange(1.0, 17.0)
    return x[0] * jnp.exp(x[1] / (t + x[2])) - _MEYER_Y


def _gulf(x, m=10):
    t = jnp.arange(1.0, m + 1) / 100
    y = 25 + (-50 * jnp.log(t)) ** (2 / 3)
    return jnp.exp(-jnp.abs(y - x[1]) ** x[2] / x[0]) - t


def _box_3d(x, m=10):
    t = 0.1 * jnp.arange(1.0, m + 1)
    return (jnp.exp(-t * x[0]) - jnp.exp(-t * x[1])
            - x[2] * (jnp.exp(-t) - jnp.exp(-10 * t)))


def _powell_singular(x):
    return jnp.stack([x[0] + 10 * x[1], jnp.sqrt(5.0) * (x[2] - x[3]), (x[1] - 2 * x[2]) ** 2,
                      jnp.sqrt(10.0) * (x[0] - x[3]) ** 2])


def _wood(x):
    return jnp.stack([10 * (x[1] - x[0] ** 2), 1 - x[0], jnp.sqrt(90.0) * (x[3] - x[2] ** 2),
                      1 - x[2], jnp.sqrt(10.0) * (x[1] + x[3] - 2),
                      (x[1] - x[3]) / jnp.sqrt(10.0)])


_KO_Y = jnp.array([0.1957, 0.1947, 0.1735, 0.1600, 0.0844, 0.0627, 0.0456, 0.0342, 0.0323,
                   0.0235, 0.0246])
_KO_U = jnp.array([4.0, 2.0, 1.0, 0.5, 0.25, 0.167, 0.125, 0.1, 0.0833, 0.0714, 0.0625])


def _kowalik_osborne(x):
    u = _KO_U
    return _KO_Y - x[0] * (u**2 + u * x[1]) / (u**2 + u * x[2] + x[3])


def _brown_dennis(x, m=20):
    t = jnp.arange(1.0, m + 1) / 5
    return (x[0] + t * x[1] - jnp.exp(t)) ** 2 + (x[2] + x[3] * jnp.sin(t) - jnp.cos(t)) ** 2


_OSBORNE1_Y = jnp.array([
    0.844, 0.908, 0.932, 0.936, 0.925, 0.908, 0.881, 0.850, 0.818, 0.784, 0.751, 0.718,
    0.685, 0.658, 0.628, 0.603, 0.580, 0.558, 0.538, 0.522, 0.506, 0.490, 0.478, 0.467,
    0.457, 0.448, 0.438, 0.431, 0.424, 0.420, 0.414, 0.411, 0.406])


def _osborne1(x):
    t = 10 * jnp.arange(33.0)
    return _OSBORNE1_Y - (x[0] + x[1] * jnp.exp(-t * x[3]) + x[2] * jnp.exp(-t * x[4]))


def _biggs_exp6(x, m=13):
    t = 0.1 * jnp.arange(1.0, m + 1)
    y = jnp.exp(-t) - 5 * jnp.exp(-10 * t) + 3 * jnp.exp(-4 * t)
    return (x[2] * jnp.exp(-t * x[0]) - x[3] * jnp.exp(-t * x[1])
            + x[5] * jnp.exp(-t * x[4]) - y)


_OSBORNE2_Y = jnp.array([
    1.366, 1.191, 1.112, 1.013, 0.991, 0.885, 0.831, 0.847, 0.786, 0.725, 0.746, 0.679,
    0.608, 0.655, 0.616, 0.606, 0.602, 0.626, 0.651, 0.724, 0.649, 0.649, 0.694, 0.644,
    0.624, 0.661, 0.612, 0.558, 0.533, 0.495, 0.500, 0.423, 0.395, 0.375, 0.372, 0.391,
    0.396, 0.405, 0.428, 0.429, 0.523, 0.562, 0.607, 0.653, 0.672, 0.708, 0.633, 0.668,
    0.645, 0.632, 0.591, 0.559, 0.597, 0.625, 0.739, 0.710, 0.729, 0.720, 0.636, 0.581,
    0.428, 0.292, 0.162, 0.098, 0.054])


def _osborne2(x):
    t = jnp.arange(65.0) / 10
    return _OSBORNE2_Y - (x[0] * jnp.exp(-t * x[4])
                          + x[1] * jnp.exp(-(t - x[8]) ** 2 * x[5])
                          + x[2] * jnp.exp(-(t - x[9]) ** 2 * x[6])
                          + x[3] * jnp.exp(-(t - x[10]) ** 2 * x[7]))


def _watson(x):
    n = x.shape[0]
    t = jnp.arange(1.0, 30.0)[:, None] / 29
    j = jnp.arange(1.0, n + 1)
    s1 = jnp.sum((j[1:] - 1) * x[1:] * t ** (j[1:] - 2), axis=1)
    s2 = jnp.sum(x * t ** (j - 1), axis=1)
    return jnp.concatenate([s1 - s2**2 - 1, jnp.stack([x[0], x[1] - x[0] ** 2 - 1])])


def _extended_rosenbrock(x):
    odd, even = x[0::2], x[1::2]
    return jnp.stack([10 * (even - odd**2), 1 - odd], axis=1).ravel()


def _extended_powell(x):
    a, b, c, d = x[0::4], x[1::4], x[2::4], x[3::4]
    return jnp.stack([a + 10 * b, jnp.sqrt(5.0) * (c - d), (b - 2 * c) ** 2,
                      jnp.sqrt(10.0) * (a - d) ** 2], axis=1).ravel()


def _penalty1(x):
    return jnp.concatenate([jnp.sqrt(1e-5) * (x - 1), jnp.sum(x**2)[None] - 0.25])


def _penalty2(x):
    n = x.shape[0]
    a = jnp.sqrt(1e-5)
    i = jnp.arange(2.0, n + 1)
    y = jnp.exp(i / 10) + jnp.exp((i - 1) / 10)
    mid = a * (jnp.exp(x[1:] / 10) + jnp.exp(x[:-1] / 10) - y)
    tail = a * (jnp.exp(x[1:] / 10) - jnp.exp(-0.1))
    last = jnp.sum((n - jnp.arange(n)) * x**2) - 1
    return jnp.concatenate([(x[0] - 0.2)[None], mid, tail, last[None]])


def _variably_dimensioned(x):
    j = jnp.arange(1.0, x.shape[0] + 1)
    s = jnp.sum(j * (x - 1))
    return jnp.concatenate([x - 1, jnp.stack([s, s**2])])


def _trigonometric(x):
    n = x.shape[0]
    i = jnp.arange(1.0, n + 1)
    return n - jnp.sum(jnp.cos(x)) + i * (1 - jnp.cos(x)) - jnp.sin(x)


def _brown_almost_linear(x):
    n = x.shape[0]
    return jnp.concatenate([x[:-1] + jnp.sum(x) - (n + 1), (jnp.prod(x) - 1)[None]])


def _grid(n):
    h = 1 / (n + 1)
    return h, h * jnp.arange(1.0, n + 1)


def _discrete_boundary_value(x):
    h, t = _grid(x.shape[0])
    padded = jnp.concatenate([jnp.zeros(1), x, jnp.zeros(1)])
    return 2 * x - padded[:-2] - padded[2:] + h**2 * (x + t + 1) ** 3 / 2


def _discrete_integral_equation(x):
    n = x.shape[0]
    h, t = _grid(n)
    g = (x + t + 1) ** 3
    lower = jnp.tril(jnp.ones((n, n)))          # j <= i
    left = lower @ (t * g)
    right = (1 - lower) @ ((1 - t) * g)          # j > i
    return x + h * ((1 - t) * left + t * right) / 2


def _broyden_tridiagonal(x):
    padded = jnp.concatenate([jnp.zeros(1), x, jnp.zeros(1)])
    return (3 - 2 * x) * x - padded[:-2] - 2 * padded[2:] + 1


def _broyden_banded(x, ml=5, mu=1):
    n = x.shape[0]
    i = jnp.arange(n)[:, None]
    j = jnp.arange(n)[None, :]
    band = (j != i) & (j >= i - ml) & (j <= i + mu)
    return x * (2 + 5 * x**2) + 1 - band.astype(x.dtype) @ (x * (1 + x))


def _linear_full_rank(x, m=10):
    n = x.shape[0]
    s = jnp.sum(x)
    head = x - 2 * s / m - 1
    return jnp.concatenate([head, jnp.full((m - n,), -2 * s / m - 1)])


def _linear_rank1(x, m=10):
    j = jnp.arange(1.0, x.shape[0] + 1)
    return jnp.arange(1.0, m + 1) * jnp.sum(j * x) - 1


def _linear_rank1_zero(x, m=10):
    n = x.shape[0]
    j = jnp.arange(2.0, n)
    s = jnp.sum(j * x[1:-1])
    inner = (jnp.arange(2.0, m) - 1) * s - 1
    return jnp.concatenate([-jnp.ones(1), inner, -jnp.ones(1)])


def _chebyquad(x):
    n = x.shape[0]
    m = n
    z = 2 * x - 1
    # T_0 .. T_m at z by the three-term recurrence
    ts = [jnp.ones_like(z), z]
    for _ in range(2, m + 1):
        ts.append(2 * z * ts[-1] - ts[-2])
    i = np.arange(1, m + 1)
    y = np.array([-1.0 / (k * k - 1) if k % 2 == 0 else 0.0 for k in i])
    return jnp.stack([jnp.mean(ts[k]) for k in range(1, m + 1)]) - y


def _x(*values) -> np.ndarray:
    return np.array(values, dtype=float)


def problems() -> list[Problem]:
    """The 47 cases: problems 1-19 at their fixed sizes and 20-35 at the sizes listed."""
    P = Problem
    out = [
        P(1, "Rosenbrock", 2, 2, _rosenbrock, _x(-1.2, 1), (0.0,)),
        P(2, "Freudenstein and Roth", 2, 2, _freudenstein_roth, _x(0.5, -2), (0.0, 48.9842)),
        P(3, "Powell badly scaled", 2, 2, _powell_badly_scaled, _x(0, 1), (0.0,)),
        P(4, "Brown badly scaled", 2, 3, _brown_badly_scaled, _x(1, 1), (0.0,)),
        P(5, "Beale", 2, 3, _beale, _x(1, 1), (0.0,)),
        P(6, "Jennrich and Sampson", 2, 10, _jennrich_sampson, _x(0.3, 0.4), (124.362,)),
        P(7, "Helical valley", 3, 3, _helical_valley, _x(-1, 0, 0), (0.0,)),
        P(8, "Bard", 3, 15, _bard, _x(1, 1, 1), (8.21487e-3, 17.4286)),
        P(9, "Gaussian", 3, 15, _gaussian, _x(0.4, 1, 0), (1.12793e-8,)),
        P(10, "Meyer", 3, 16, _meyer, _x(0.02, 4000, 250), (87.9458,)),
        P(11, "Gulf research and development", 3, 10, _gulf, _x(5, 2.5, 0.15), (0.0,)),
        P(12, "Box three-dimensional", 3, 10, _box_3d, _x(0, 10, 20), (0.0,)),
        P(13, "Powell singular", 4, 4, _powell_singular, _x(3, -1, 0, 1), (0.0,)),
        P(14, "Wood", 4, 6, _wood, _x(-3, -1, -3, -1), (0.0,)),
        P(15, "Kowalik and Osborne", 4, 11, _kowalik_osborne, _x(0.25, 0.39, 0.415, 0.39),
          (3.07505e-4, 1.02734e-3)),
        P(16, "Brown and Dennis", 4, 20, _brown_dennis, _x(25, 5, -5, -1), (85822.2,)),
        P(17, "Osborne 1", 5, 33, _osborne1, _x(0.5, 1.5, -1, 0.01, 0.02), (5.46489e-5,)),
        P(18, "Biggs EXP6", 6, 13, _biggs_exp6, _x(1, 2, 1, 1, 1, 1), (0.0, 5.65565e-3)),
        P(19, "Osborne 2", 11, 65, _osborne2,
          _x(1.3, 0.65, 0.65, 0.7, 0.6, 3, 5, 7, 2, 4.5, 5.5), (4.01377e-2,)),
    ]
    for n, fmin in ((6, 2.28767e-3), (9, 1.39976e-6), (12, 4.72238e-10)):
        out.append(P(20, "Watson", n, 31, _watson, np.zeros(n), (fmin,)))
    out.append(P(21, "Extended Rosenbrock", 10, 10, _extended_rosenbrock,
                 np.tile([-1.2, 1.0], 5), (0.0,)))
    out.append(P(22, "Extended Powell singular", 12, 12, _extended_powell,
                 np.tile([3.0, -1.0, 0.0, 1.0], 3), (0.0,)))
    for n, fmin in ((4, 2.24997e-5), (10, 7.08765e-5)):
        out.append(P(23, "Penalty I", n, n + 1, _penalty1, np.arange(1.0, n + 1), (fmin,)))
    for n, fmin in ((4, 9.37629e-6), (10, 2.93660e-4)):
        out.append(P(24, "Penalty II", n, 2 * n, _penalty2, np.full(n, 0.5), (fmin,)))
    n = 10
    out += [
        P(25, "Variably dimensioned", n, n + 2, _variably_dimensioned,
          1 - np.arange(1.0, n + 1) / n, (0.0,)),
        P(26, "Trigonometric", n, n, _trigonometric, np.full(n, 1 / n), (0.0,)),
        P(27, "Brown almost-linear", n, n, _brown_almost_linear, np.full(n, 0.5), (0.0, 1.0)),
    ]
    t = np.arange(1.0, n + 1) / (n + 1)
    out += [
        P(28, "Discrete boundary value", n, n, _discrete_boundary_value, t * (t - 1), (0.0,)),
        P(29, "Discrete integral equation", n, n, _discrete_integral_equation, t * (t - 1),
          (0.0,)),
        P(30, "Broyden tridiagonal", n, n, _broyden_tridiagonal, np.full(n, -1.0), (0.0,)),
        P(31, "Broyden banded", n, n, _broyden_banded, np.full(n, -1.0), (0.0,)),
    ]
    n, m = 5, 10
    out += [
        P(32, "Linear, full rank", n, m, _linear_full_rank, np.ones(n), (float(m - n),)),
        P(33, "Linear, rank 1", n, m, _linear_rank1, np.ones(n),
          (m * (m - 1) / (2 * (2 * m + 1)),)),
        P(34, "Linear, rank 1 with zero columns and rows", n, m, _linear_rank1_zero,
          np.ones(n), ((m * m + 3 * m - 6) / (2 * (2 * m - 3)),)),
    ]
    cheby = {8: 3.51687e-3, 10: 6.50395e-3}
    for n in range(2, 11):
        out.append(P(35, "Chebyquad", n, n, _chebyquad, np.arange(1.0, n + 1) / (n + 1),
                     (cheby.get(n, 0.0),)))
    return out
