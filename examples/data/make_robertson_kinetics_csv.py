"""Regenerate ``robertson_kinetics.csv``: noisy concentrations of Robertson's stiff kinetics.

    A -> B (k1),   B + B -> C + B (k2),   B + C -> A + C (k3)
    y1' = -k1 y1 + k3 y2 y3,   y2' = k1 y1 - k2 y2^2 - k3 y2 y3,   y3' = k2 y2^2

(H. H. Robertson, "The solution of a set of reaction rate equations", in J. Walsh (ed.),
*Numerical Analysis: an Introduction*, Academic Press, 1966; Hairer and Wanner, *Solving
ODEs II*, IV.1), with (k1, k2, k3) = (0.04, 3e7, 1e4) from (y1, y2, y3)(0) = (1, 0, 0),
solved by scipy's ``solve_ivp`` (Radau, rtol = 1e-10, atol = 1e-16) at 16 log-spaced times
from 1e-3 to 1e3. Each concentration is multiplied by exp(0.05 z), z standard normal from
``numpy.random.default_rng(2026)`` (5 % lognormal measurement noise). Written with 8
significant digits, columns ``t,y1,y2,y3`` with a header line. simlib is not used, so the
file is an independent test of the inference in ``examples/robertson_bayes.py``::

    python examples/data/make_robertson_kinetics_csv.py     # rewrites the CSV next to this file
"""

from pathlib import Path

import numpy as np
from scipy.integrate import solve_ivp

RATES = (0.04, 3e7, 1e4)
Y0 = (1.0, 0.0, 0.0)
TIMES = np.logspace(-3, 3, 16)
NOISE, SEED = 0.05, 2026


def rhs(t, y, k1, k2, k3):
    return [-k1 * y[0] + k3 * y[1] * y[2], k1 * y[0] - k2 * y[1] ** 2 - k3 * y[1] * y[2],
            k2 * y[1] ** 2]


def main() -> None:
    sol = solve_ivp(rhs, (0.0, TIMES[-1]), Y0, method="Radau", t_eval=TIMES, args=RATES,
                    rtol=1e-10, atol=1e-16)
    assert sol.success, sol.message
    rng = np.random.default_rng(SEED)
    obs = sol.y.T * np.exp(NOISE * rng.standard_normal(sol.y.T.shape))
    path = Path(__file__).with_name("robertson_kinetics.csv")
    with path.open("w", encoding="utf-8") as f:
        f.write("t,y1,y2,y3\n")
        for t, row in zip(TIMES, obs, strict=True):
            f.write(",".join(f"{v:.8g}" for v in (t, *row)) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
