"""Butcher tableaus: explicit Runge-Kutta methods as data.

An explicit ``s``-stage Runge-Kutta method advances ``y' = f(t, y)`` by

    k_i = f(t + c_i h, y + h * sum_{j<i} a_ij k_j),   i = 1..s
    y_1 = y + h * sum_i b_i k_i

and, when it has an embedded pair, estimates the local error by
``h * sum_i e_i k_i`` with ``e = b - b_hat``.  Dense output evaluates
``y(t + theta h) = y + h * sum_i b_i(theta) k_i`` with polynomial weights
``b_i(theta) = sum_{m=1}^{p} dense[i][m-1] * theta**m`` (Hairer, Norsett and
Wanner, *Solving Ordinary Differential Equations I*, 2nd ed., 1993, II.6).
Some methods (DOP853) need extra stages for dense output; they are given by
``a_extra``/``c_extra`` rows over all earlier stages and evaluated only when
interpolating.

Every tableau is checked on construction: rows of ``a`` sum to ``c`` and the
weights ``b`` sum to one (the first order condition).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_CHECK_TOL = 1e-12


@dataclass(frozen=True)
class ButcherTableau:
    """An explicit Runge-Kutta method as data (a frozen dataclass; build one, do not
    subclass it). Give it to a subclass of :class:`ExplicitRungeKutta` as its ``tableau``
    class attribute (docs/extending.md). Construction checks that the rows of ``a`` sum to
    ``c``, ``b`` sums to one, error weights sum to zero, an FSAL tableau's last row is
    ``b`` and dense weights reproduce ``b`` at ``theta = 1``; order conditions beyond the
    first are not checked (tests/test_tableau.py does it for the built-in methods).

    Attributes:
        name: Method name, e.g. ``"Tsit5"``.
        reference: The paper the coefficients come from.
        order: Order of the propagated solution ``b``.
        a: Strictly lower-triangular stage matrix, as ``s`` rows; row ``i`` has
            ``i`` entries (row 0 is empty).
        b: Weights of the propagated solution, length ``s``.
        c: Nodes, length ``s``.
        b_error: ``b - b_hat`` of the embedded method, or ``None``.
        error_order: Order of the embedded method ``b_hat`` (the local error
            estimate then behaves like ``h**(error_order + 1)``).
        b_error3: Second error-weight vector, for DOP853's combined 5(3)
            estimate (Hairer et al. 1993, II.10); ``None`` otherwise.
        fsal: First stage of the next step equals the last stage of this one
            (``c[-1] == 1`` and ``a[-1] == b``).
        dense: ``(s + n_extra)`` rows of polynomial coefficients in ``theta``
            (lowest power ``theta**1`` first), or ``None`` for Hermite cubic.
        dense_order: Order of the dense output.
        a_extra: Extra stages for dense output; row ``j`` has ``s + j`` entries.
        c_extra: Nodes of the extra stages.
    """

    name: str
    reference: str
    order: int
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    c: tuple[float, ...]
    b_error: tuple[float, ...] | None = None
    error_order: int | None = None
    b_error3: tuple[float, ...] | None = None
    fsal: bool = False
    dense: tuple[tuple[float, ...], ...] | None = None
    dense_order: int | None = None
    a_extra: tuple[tuple[float, ...], ...] = field(default_factory=tuple)
    c_extra: tuple[float, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        s = len(self.b)
        if len(self.c) != s or len(self.a) != s:
            raise ValueError(
                f"{self.name}: tableau sizes differ: len(a)={len(self.a)}, "
                f"len(b)={s}, len(c)={len(self.c)}"
            )
        for i, row in enumerate(self.a):
            if len(row) != i:
                raise ValueError(f"{self.name}: row {i} of a has {len(row)} entries, expected {i}")
            if abs(sum(row) - self.c[i]) > _CHECK_TOL:
                raise ValueError(
                    f"{self.name}: row {i} of a sums to {sum(row)!r}, but c[{i}] = {self.c[i]!r}"
                )
        if abs(sum(self.b) - 1.0) > _CHECK_TOL:
            raise ValueError(f"{self.name}: weights b sum to {sum(self.b)!r}, not 1")
        for e in (self.b_error, self.b_error3):
            if e is not None:
                if len(e) != s:
                    raise ValueError(f"{self.name}: error weights have length {len(e)}, not {s}")
                if abs(sum(e)) > _CHECK_TOL:
                    raise ValueError(f"{self.name}: error weights sum to {sum(e)!r}, not 0")
        if self.fsal:
            if self.c[-1] != 1.0 or any(
                abs(x - y) > _CHECK_TOL for x, y in zip(self.a[-1], self.b[:-1], strict=True)
            ):
                raise ValueError(f"{self.name}: marked FSAL but the last row of a is not b")
        if len(self.a_extra) != len(self.c_extra):
            raise ValueError(f"{self.name}: a_extra and c_extra differ in length")
        for j, row in enumerate(self.a_extra):
            if len(row) != s + j:
                raise ValueError(f"{self.name}: extra row {j} has {len(row)} entries, not {s + j}")
            if abs(sum(row) - self.c_extra[j]) > _CHECK_TOL:
                raise ValueError(f"{self.name}: extra row {j} does not sum to c_extra[{j}]")
        if self.dense is not None:
            if len(self.dense) != s + len(self.a_extra):
                raise ValueError(f"{self.name}: dense has {len(self.dense)} rows")
            # b_i(1) must reproduce the step's own weights.
            at_one = [sum(row) for row in self.dense]
            want = list(self.b) + [0.0] * len(self.a_extra)
            if max(abs(x - y) for x, y in zip(at_one, want, strict=True)) > 1e-10:
                raise ValueError(f"{self.name}: dense output at theta=1 is not the step's b")

    @property
    def stages(self) -> int:
        """Number of stages ``s`` (without dense-output extras)."""
        return len(self.b)

    @property
    def adaptive(self) -> bool:
        """Whether the method carries an embedded error estimate."""
        return self.b_error is not None

    def a_matrix(self) -> np.ndarray:
        """The full ``(s, s)`` stage matrix ``a``."""
        s = self.stages
        out = np.zeros((s, s))
        for i, row in enumerate(self.a):
            out[i, :i] = row
        return out
