"""Regenerate ``lotka_volterra.csv``: noisy observations of a Lotka-Volterra system.

    x' = alpha x - beta x y,   y' = -gamma y + delta x y

with (alpha, beta, gamma, delta) = (1.5, 1, 3, 1) from (x, y)(0) = (10, 5), solved by scipy's
``solve_ivp`` (DOP853, rtol = atol = 1e-12) at 41 equally spaced times in [0, 10]; each
value is multiplied by (1 + 0.01 z), z standard normal from ``numpy.random.default_rng(2026)``
(1 % multiplicative noise, the default ``--noise`` of ``fit_lotka_volterra.py``). Written
with 8 significant digits, columns ``t,x,y`` with a header line. simlib is not used, so
the file is an independent test of the fit::

    python examples/data/make_lotka_volterra_csv.py     # rewrites the CSV next to this file
    python examples/fit_lotka_volterra.py --data examples/data/lotka_volterra.csv
"""

from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

RATES = (1.5, 1.0, 3.0, 1.0)
Y0 = (10.0, 5.0)
TIMES = np.linspace(0.0, 10.0, 41)
NOISE, SEED = 0.01, 2026


def rhs(t, y, a, b, c, d):
    return [a * y[0] - b * y[0] * y[1], -c * y[1] + d * y[0] * y[1]]


def main() -> None:
    sol = solve_ivp(rhs, (0.0, TIMES[-1]), Y0, method="DOP853", t_eval=TIMES, args=RATES,
                    rtol=1e-12, atol=1e-12)
    clean = sol.y.T
    noisy = clean * (1.0 + NOISE * np.random.default_rng(SEED).standard_normal(clean.shape))
    path = Path(__file__).with_name("lotka_volterra.csv")
    rows = ["t,x,y"] + [f"{t:.8g},{x:.8g},{y:.8g}" for t, (x, y) in zip(TIMES, noisy,
                                                                       strict=True)]
    path.write_text("\n".join(rows) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
