"""Explicit Runge-Kutta steppers driven by a Butcher tableau.

Each method is nothing but its tableau (see ``_rk_tableaus.py`` for the
coefficients and the papers they come from). The stepper evaluates the stages

    k_i = f(t + c_i h, y + h sum_{j<i} a_ij k_j),    y_1 = y + h sum_i b_i k_i,

reuses the last stage as the next step's first when the method is FSAL, and
forms the embedded error estimate ``h sum_i e_i k_i`` (Hairer, Norsett and
Wanner, *Solving ODEs I*, 2nd ed., 1993, II.4).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from ._base import (
    AbstractSolver,
    PyTree,
    VectorField,
    axpy,
    error_scale,
    linear_combination,
    register_static,
    rms_error_ratio,
    sum_squares,
    tree_size,
)
from ._rk_tableaus import BOSH3, DOPRI5, DOPRI8, EULER, HEUN, MIDPOINT, RK4, TSIT5
from ._tableau import ButcherTableau


class ExplicitRungeKutta(AbstractSolver):
    """An explicit Runge-Kutta method given by ``tableau``.

    A subclass provides only the class attribute ``tableau`` (a :class:`ButcherTableau`);
    order, adaptivity (when the tableau has ``b_error``), FSAL reuse, the error norm and
    dense output (the tableau's ``dense`` weights, or cubic Hermite) all follow from it::

        class SSPRK3(sl.ExplicitRungeKutta):
            tableau = sl.ButcherTableau(name="SSPRK3", reference="Shu & Osher 1988",
                                        order=3, a=((), (1.0,), (0.25, 0.25)),
                                        b=(1 / 6, 1 / 6, 2 / 3), c=(0.0, 1.0, 0.5))

    See docs/extending.md.
    """

    tableau: ClassVar[ButcherTableau]

    @property
    def order(self) -> int:  # type: ignore[override]
        return self.tableau.order

    @property
    def adaptive(self) -> bool:  # type: ignore[override]
        return self.tableau.adaptive

    @property
    def error_order(self) -> int | None:
        return self.tableau.error_order

    @property
    def reference(self) -> str:  # type: ignore[override]
        return self.tableau.reference

    @property
    def fevals_per_step(self) -> int:  # type: ignore[override]
        return self.tableau.stages - (1 if self.tableau.fsal else 0)

    @property
    def init_fevals(self) -> int:  # type: ignore[override]
        return 1 if self.tableau.fsal else 0

    def init(self, f: VectorField, t, y: PyTree, args, f0: PyTree = None) -> PyTree:
        """The FSAL stage ``f(t, y)`` for a FSAL tableau, else ``None``."""
        if not self.tableau.fsal:
            return None
        return f(t, y, args) if f0 is None else f0

    def step(self, f: VectorField, t, y: PyTree, h, args, state: PyTree):
        """One step of size ``h``. Returns ``(y1, e.k, stages, fsal_stage)``: the error
        information is the unscaled ``sum_i e_i k_i`` (``error_ratio`` multiplies by
        ``|h|``), the dense-output data the stages."""
        tab = self.tableau
        k1 = state if tab.fsal else f(t, y, args)
        ks = [k1]
        y1 = None
        for i in range(1, tab.stages):
            yi = axpy(y, h, list(zip(tab.a[i], ks, strict=True)))
            ks.append(f(t + tab.c[i] * h, yi, args))
            y1 = yi
        if not tab.fsal:
            y1 = axpy(y, h, list(zip(tab.b, ks, strict=True)))
        err = None
        if tab.b_error is not None:
            err = linear_combination(list(zip(tab.b_error, ks, strict=True)))
            if tab.b_error3 is not None:
                err = (err, linear_combination(list(zip(tab.b_error3, ks, strict=True))))
        return y1, err, ks, (ks[-1] if tab.fsal else None)

    def error_ratio(self, y: PyTree, y1: PyTree, err: PyTree, h, rtol, atol,
                    norm: Callable[[PyTree], jax.Array] | None = None) -> jax.Array:
        """Scaled local error; the step is accepted when this is at most one.

        The RMS norm (or ``norm``) of ``h e.k / (atol + rtol max(|y|, |y1|))`` (Hairer et
        al. II.4); for DOP853 the combined 5th/3rd-order estimate of Hairer et al. II.10,
        ``|h| E5^2 / sqrt(E5^2 + 0.01 E3^2)`` of the two estimates' norms.
        """
        absh = jnp.abs(h)
        if self.tableau.b_error3 is None:
            return rms_error_ratio(y, y1, err, rtol, atol, absh, norm=norm)
        scale = error_scale(y, y1, rtol, atol)
        if norm is not None:
            e5, e3 = (jnp.square(norm(jax.tree_util.tree_map(lambda e, s: e / s, part, scale)))
                      for part in err)
            denom = e5 + 0.01 * e3
            safe = jnp.where(denom > 0, denom, 1.0)
            return jnp.where(denom > 0, absh * e5 / jnp.sqrt(safe), 0.0)
        n = tree_size(y)
        err5, err3 = err
        e5 = sum_squares(jax.tree_util.tree_map(lambda e, s: e / s, err5, scale))
        e3 = sum_squares(jax.tree_util.tree_map(lambda e, s: e / s, err3, scale))
        denom = e5 + 0.01 * e3
        safe = jnp.where(denom > 0, denom, 1.0)
        return jnp.where(denom > 0, absh * e5 / jnp.sqrt(safe * n), 0.0)

    def interpolate(self, f: VectorField, args, t, y: PyTree, h, y1: PyTree, ks, theta):
        """Dense output ``y(t + theta h)`` for ``theta`` in [0, 1] from a completed step."""
        tab = self.tableau
        if tab.dense is None:
            f1 = ks[-1] if tab.fsal else f(t + h, y1, args)
            return hermite(y, y1, ks[0], f1, h, theta)
        ks = list(ks)
        for row, c in zip(tab.a_extra, tab.c_extra, strict=True):
            yi = axpy(y, h, list(zip(row, ks, strict=True)))
            ks.append(f(t + c * h, yi, args))
        dense = np.asarray(tab.dense)
        powers = theta ** jnp.arange(1, dense.shape[1] + 1, dtype=jnp.result_type(theta))
        weights = jnp.asarray(dense, dtype=powers.dtype) @ powers

        def leaf(y_leaf, *k_leaves):
            w = weights.astype(y_leaf.dtype)
            acc = sum(w[i] * k for i, k in enumerate(k_leaves) if np.any(dense[i] != 0))
            return y_leaf + jnp.asarray(h, y_leaf.dtype) * acc

        return jax.tree_util.tree_map(leaf, y, *ks)


def hermite(y0: PyTree, y1: PyTree, f0: PyTree, f1: PyTree, h, theta) -> PyTree:
    """Cubic Hermite interpolation on ``[t, t + h]`` (Hairer et al. II.6, eq. 6.7)."""

    def leaf(a, b, fa, fb):
        th = jnp.asarray(theta, a.dtype)
        hh = jnp.asarray(h, a.dtype)
        return (
            (1 - th) * a
            + th * b
            + th * (th - 1) * ((1 - 2 * th) * (b - a) + (th - 1) * hh * fa + th * hh * fb)
        )

    return jax.tree_util.tree_map(leaf, y0, y1, f0, f1)


def _method(tab: ButcherTableau, doc: str):
    cls = type(tab.name, (ExplicitRungeKutta,), {"tableau": tab, "__doc__": doc})
    cls.__module__ = "simlib"
    return register_static(cls)


Euler = _method(EULER, "Forward Euler, order 1 (Euler 1768). Fixed step only.")
Midpoint = _method(MIDPOINT, "Explicit midpoint rule, order 2 (Runge 1895). Fixed step only.")
Heun = _method(
    HEUN,
    "Heun's method (explicit trapezoidal), order 2, with an embedded Euler error "
    "estimate so it may also run adaptively (Heun 1900).",
)
RK4 = _method(RK4, "The classical fourth-order Runge-Kutta method (Kutta 1901). Fixed step only.")
Bosh3 = _method(
    BOSH3,
    "Bogacki-Shampine 3(2) pair, FSAL, cubic Hermite dense output "
    "(Bogacki and Shampine, Appl. Math. Lett. 2, 1989).",
)
Tsit5 = _method(
    TSIT5,
    "Tsitouras 5(4) pair, FSAL, with its order-4 dense output "
    "(Tsitouras, Comput. Math. Appl. 62, 2011). The recommended default.",
)
Dopri5 = _method(
    DOPRI5,
    "Dormand-Prince 5(4) pair, FSAL, with Shampine's order-4 dense output "
    "(Dormand and Prince, J. Comput. Appl. Math. 6, 1980).",
)
Dopri8 = _method(
    DOPRI8,
    "DOP853: Dormand-Prince 8(5,3) with Hairer's combined error estimate and "
    "order-7 dense output (Hairer, Norsett and Wanner 1993, II.10).",
)
