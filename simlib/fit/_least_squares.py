r"""``least_squares()``: Moré's trust-region Levenberg-Marquardt, compiled as one loop.

For residuals :math:`r(u) \in \mathbb R^m` of unconstrained parameters :math:`u` (see
``_transforms.py``), each trial step :math:`p` minimises the linear model in a scaled
trust region,

.. math:: \min_p \|r + Jp\|  \quad\text{subject to}\quad \|Dp\| \le \Delta,

whose solution is :math:`(J^T J + \lambda D^2)\,p = -J^T r` with :math:`\lambda = 0` when
the Gauss-Newton step fits in the region, and otherwise :math:`\lambda > 0` chosen so that
:math:`\|Dp\|` is within 10 % of :math:`\Delta` (Moré's safeguarded Newton iteration on
:math:`\phi(\lambda) = \|Dp(\lambda)\| - \Delta`). :math:`D` holds the largest column norms of
:math:`J` seen so far; :math:`\Delta` grows or shrinks with the ratio of the actual to the
predicted reduction, and the run stops on MINPACK's tests (relative reduction below
``ftol``, region below ``xtol`` relative to :math:`\|Du\|`, or the cosine between
:math:`r` and every column of :math:`J` below ``gtol``). Reference: J. J. Moré, "The
Levenberg-Marquardt algorithm: implementation and theory", in *Numerical Analysis*,
Lecture Notes in Mathematics 630, Springer (1978), pp. 105-116. The linear algebra here
uses the singular value decomposition of :math:`JD^{-1}` (once per Jacobian) in place of
MINPACK's pivoted QR factorisation, which makes :math:`\phi` and :math:`\phi'` closed forms.
The Jacobian is forward mode (``jax.jacfwd``) for few parameters, reverse mode otherwise;
the whole loop is one ``lax.while_loop`` under ``jit``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.flatten_util import ravel_pytree

from .. import _programs as programs
from ._checks import as_float_tree, check_positive_int
from ._fit import FitResult, gauss_newton_covariance
from ._transforms import make_maps

PyTree = Any

# Status codes of the loop (what ``FitResult.message`` says for each).
_MAX_STEPS, _GTOL, _FTOL, _XTOL, _NONFINITE, _STALLED, _ZERO = 0, 1, 2, 3, 4, 5, 6
_CONVERGED = (_GTOL, _FTOL, _XTOL, _ZERO)


def least_squares(
    residuals: Callable[[PyTree], jax.Array],
    params0: PyTree,
    *,
    steps: int = 100,
    tol: float = 1e-10,
    ftol: float | None = None,
    xtol: float | None = None,
    gtol: float | None = None,
    factor: float = 1.0,
    transforms: PyTree = None,
    jacobian: str = "auto",
    stderr: bool = False,
    damping: None = None,
) -> FitResult:
    r"""Minimise :math:`\tfrac12\|r(x)\|^2` over a parameter pytree with Levenberg-Marquardt.

    The least-squares counterpart of :func:`fit` (and of ``scipy.optimize.least_squares``
    with ``method="lm"``, MINPACK): Moré's trust-region Levenberg-Marquardt with the scaling
    :math:`D` from the Jacobian's column norms. For trajectory misfits it converges in a
    handful of iterations, each one a residual Jacobian (forward mode through
    :func:`simlib.solve`).

    Args:
        residuals: ``residuals(params)`` returning the residual array (any shape; flattened),
            e.g. :func:`trajectory_residuals` of a solve.
        params0: Initial parameters (a pytree of floats, physical values).
        steps: Maximum trial steps (residual evaluations; accepted or rejected).
        tol: The default of ``ftol``, ``xtol`` and ``gtol``.
        ftol: Stop when both the actual and the predicted relative reduction of
            :math:`\|r\|^2` in a step are at most ``ftol``.
        xtol: Stop when the trust region :math:`\Delta` is at most ``xtol`` :math:`\|Du\|`.
        gtol: Stop when the cosine of the angle between :math:`r` and every column of
            :math:`J` is at most ``gtol`` (MINPACK's scaled gradient test). Tolerances below
            machine epsilon act as epsilon.
        factor: The first trust region is ``factor`` :math:`\|Du_0\|` (``factor`` when that
            is 0), MINPACK's ``factor``. MINPACK's default is 100; simlib's is 1, a first
            step within the scale of the start, which keeps an ODE fit away from the
            parameters where its solve blows up, and solved one more of the
            Moré-Garbow-Hillstrom problems (docs/fitting.md).
        transforms: :class:`Positive`/:class:`Bounded`/:class:`Identity` per leaf (as in
            :func:`fit`); the iteration runs on unconstrained values.
        jacobian: ``"auto"`` (forward mode when there are fewer parameters than residuals),
            ``"fwd"`` or ``"rev"`` (needed through custom VJPs: adaptive solves and the
            ``Checkpointed``/``Reversible``/``ForwardMode`` adjoints).
        stderr: Also compute Gauss-Newton standard errors at the optimum.
        damping: Removed (the Marquardt damping of earlier versions); passing it raises a
            ``TypeError`` that names ``factor`` instead.

    Returns:
        A :class:`FitResult`; ``loss`` and ``history`` are the mean of the squared
        residuals (about 1 at the noise level for residuals divided by the noise).
        ``converged`` is True only at a stationary point: when the ``ftol`` or ``xtol``
        test stops the run where the residual is neither zero nor orthogonal to the
        Jacobian's columns (cosine above :math:`\sqrt{\mathrm{gtol}}`) and the Gauss-Newton
        step is not negligible, the message says the iteration stalled and ``converged``
        is False.

    Example:
        >>> import jax.numpy as jnp
        >>> from simlib.fit import Positive, least_squares
        >>> ts = jnp.linspace(0.0, 2.0, 9)
        >>> obs = 3.0 * jnp.exp(-1.5 * ts)           # y = a exp(-k t), a = 3, k = 1.5
        >>> res = least_squares(lambda p: p["a"] * jnp.exp(-p["k"] * ts) - obs,
        ...                     {"a": 1.0, "k": 1.0}, transforms=Positive())
        >>> round(float(res.params["a"]), 6), round(float(res.params["k"]), 6)
        (3.0, 1.5)
    """
    steps, tols, factor = _check_settings(steps, tol, ftol, xtol, gtol, factor, jacobian,
                                          residuals, damping)
    params0 = as_float_tree(params0)
    to_physical, to_unconstrained = make_maps(transforms, params0)
    u0, unravel = ravel_pytree(to_unconstrained(params0))

    def flat_res(u):
        return jnp.ravel(jnp.asarray(residuals(to_physical(unravel(u)))))

    settings = (tols["ftol"], tols["xtol"], tols["gtol"], factor)
    start = time.perf_counter()
    key = programs.key(_lm_loop, flat_res, jacobian, steps, dynamic=(u0, *settings))
    kept = programs.load(key)  # built before: no trace, no compile (simlib._programs)
    if kept is None:
        try:
            n = int(jax.eval_shape(flat_res, u0).shape[0])
        except Exception as err:  # noqa: BLE001 - re-raised with context
            raise TypeError(f"calling residuals(params0) failed: {type(err).__name__}: "
                            f"{err}") from err
        compiled = programs.build(key, _lower(flat_res, jacobian, u0.shape[0] <= n, steps,
                                              u0, settings), {"n": n})
    else:
        compiled, n = kept[0], kept[1]["n"]
    compile_time = time.perf_counter() - start
    start = time.perf_counter()
    out = jax.block_until_ready(compiled(u0, *settings))
    run_time = time.perf_counter() - start
    k, code = int(out["k"]), int(out["code"])
    history = np.asarray(out["history"])[: k + 1]
    params = to_physical(unravel(out["u"]))
    result = dict(params=params, loss=float(out["cost"]) / n, history=history / n,
                  grad_norm=float(out["grad_inf"]), n_steps=k, converged=code in _CONVERGED,
                  message=_message(code, out, steps), compile_time=compile_time,
                  run_time=run_time)
    if stderr:
        gn = gauss_newton_covariance(residuals, params, jacobian=jacobian)
        result.update(stderr=gn.stderr, correlation=gn.correlation, covariance=gn.covariance,
                      gauss_newton=gn)
    return FitResult(**result)


def _check_settings(steps: Any, tol: Any, ftol: Any, xtol: Any, gtol: Any, factor: Any,
                    jacobian: Any, residuals: Any, damping: Any
                    ) -> tuple[int, dict[str, float], float]:
    """:func:`least_squares`'s settings checked: ``(steps, tolerances by name, factor)``."""
    if damping is not None:
        raise TypeError("least_squares: damping= (Marquardt's initial lambda) was removed with "
                        "the trust-region algorithm; the first trust region is factor= "
                        "(default 1, MINPACK's factor), and the damping follows from it")
    steps = check_positive_int(steps, "steps")
    tols = {name: _positive_number(tol if value is None else value, name)
            for name, value in (("tol", tol), ("ftol", ftol), ("xtol", xtol), ("gtol", gtol))}
    factor = _positive_number(factor, "factor")
    if jacobian not in ("auto", "fwd", "rev"):
        raise ValueError(f"jacobian must be 'auto', 'fwd' or 'rev', got {jacobian!r}")
    if not callable(residuals):
        raise TypeError(f"residuals must be callable as residuals(params), got {residuals!r}")
    return steps, tols, factor


def _lower(flat_res: Callable, jacobian: str, few_params: bool, steps: int,
           u0: jax.Array, settings: tuple) -> Any:
    """The lowered Levenberg-Marquardt loop; ``jacobian="auto"`` takes forward mode for
    ``few_params`` and falls back to reverse mode through a custom VJP."""
    mode = jacobian if jacobian != "auto" else ("fwd" if few_params else "rev")
    run = jax.jit(_lm_loop(flat_res, mode, steps))
    try:
        lowered = run.lower(u0, *settings)
    except TypeError as err:
        if jacobian != "auto" or "custom_vjp" not in str(err):
            raise
        lowered = jax.jit(_lm_loop(flat_res, "rev", steps)).lower(u0, *settings)
    return lowered


def _message(code: int, out: dict, steps: int) -> str:
    """What ``FitResult.message`` says for the loop's status ``code``."""
    messages = {
        _GTOL: "converged: the residual is orthogonal to the Jacobian's columns (gtol)",
        _FTOL: "converged: relative reduction below ftol at a stationary point",
        _XTOL: "converged: trust region below xtol at a stationary point",
        _ZERO: "converged: the residuals are zero",
        _STALLED: "not converged: the iteration stalled (ftol/xtol met) away from a "
                  f"stationary point (scaled gradient {float(out['gnorm']):.1e})",
        _MAX_STEPS: f"not converged: stopped after steps={steps} trial steps",
        _NONFINITE: "the residuals or their Jacobian are not finite",
    }
    return messages[code]


def _positive_number(value: Any, name: str) -> float:
    """``value`` as a positive finite float, or a ValueError naming ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not (math.isfinite(number) and number > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return number


def _linearise(flat_res: Callable, jac_fn: Callable, u: jax.Array, scale: jax.Array | None):
    """Residual, Jacobian and the SVD of :math:`JD^{-1}` at ``u``, with ``D`` updated."""
    r = flat_res(u)
    J = jac_fn(u)
    colnorm = jnp.linalg.norm(J, axis=0)
    if scale is None:   # MINPACK mode 1: D = column norms (1 for a zero column) ...
        scale = jnp.where(colnorm > 0, colnorm, 1.0)
    else:               # ... and afterwards never smaller than before
        scale = jnp.maximum(scale, colnorm)
    U, s, Vt = jnp.linalg.svd(J / scale, full_matrices=False)
    fnorm = jnp.linalg.norm(r)
    Jtr = J.T @ r
    cosine = jnp.abs(Jtr) / jnp.where(colnorm > 0, colnorm * fnorm, 1.0)
    gnorm = jnp.where(fnorm > 0, jnp.max(jnp.where(colnorm > 0, cosine, 0.0)), 0.0)
    finite = jnp.all(jnp.isfinite(r)) & jnp.all(jnp.isfinite(J)) & jnp.all(jnp.isfinite(s))
    return dict(r=r, fnorm=fnorm, scale=scale, s=s, Vt=Vt, c=U.T @ r, gnorm=gnorm,
                grad_inf=jnp.max(jnp.abs(Jtr)), finite=finite)


def _gauss_newton(s: jax.Array, c: jax.Array, m: int, n: int) -> jax.Array:
    """Scaled Gauss-Newton step :math:`-(JD^{-1})^+ r` in the right singular basis."""
    keep = s > s[0] * jnp.finfo(s.dtype).eps * max(m, n)
    return jnp.where(keep, -c / jnp.where(keep, s, 1.0), 0.0)


def _lm_parameter(s, c, delta, par0, m: int, n: int):
    r"""Moré's :math:`\lambda` for the region :math:`\|Dp\| \le \Delta` (his Algorithm 5.5).

    With :math:`JD^{-1} = U\,\mathrm{diag}(s)\,V^T` and :math:`c = U^T r`, the scaled step is
    :math:`w_i(\lambda) = -s_i c_i / (s_i^2 + \lambda)` (in the basis :math:`V`), so
    :math:`\phi(\lambda) = \|w(\lambda)\| - \Delta` and
    :math:`\phi'(\lambda) = -\sum_i s_i^2 c_i^2 / (s_i^2 + \lambda)^3 / \|w\|`. Returns
    :math:`\lambda = 0` with the Gauss-Newton step when :math:`\phi(0) \le 0.1\Delta`, else
    the safeguarded Newton iterate with :math:`|\phi| \le 0.1 \Delta` (at most 10 iterations).
    """
    w_gn = _gauss_newton(s, c, m, n)
    gn_norm = jnp.linalg.norm(w_gn)
    phi0 = gn_norm - delta
    full_rank = (s.shape[0] == n) & jnp.all(s > s[0] * jnp.finfo(s.dtype).eps * max(m, n))
    tiny = jnp.finfo(s.dtype).tiny

    def step(par):
        den = s * s + par
        w = jnp.where(den > 0, -s * c / jnp.where(den > 0, den, 1.0), 0.0)
        norm = jnp.linalg.norm(w)
        dphi = -jnp.sum(jnp.where(den > 0, (s * c) ** 2 / jnp.where(den > 0, den, 1.0) ** 3,
                                  0.0)) / jnp.maximum(norm, tiny)
        return w, norm - delta, dphi

    # bounds: l_0 = -phi(0)/phi'(0) (0 if J is rank deficient), u_0 = ||(JD^-1)^T r|| / Delta
    dphi0 = -jnp.sum(jnp.where(w_gn != 0, w_gn**2 / jnp.where(s > 0, s * s, 1.0), 0.0)) \
        / jnp.maximum(gn_norm, tiny)
    lower = jnp.where(full_rank & (dphi0 < 0), -phi0 / jnp.where(dphi0 < 0, dphi0, -1.0), 0.0)
    upper = jnp.linalg.norm(s * c) / delta
    par = jnp.clip(par0, lower, upper)
    par = jnp.where(par == 0, upper * delta / jnp.maximum(gn_norm, tiny), par)

    def cond(st):
        return (~st["done"]) & (st["it"] < 10)

    def body(st):
        par, lower, upper = st["par"], st["lower"], st["upper"]
        par = jnp.where((par <= lower) | (par >= upper),
                        jnp.maximum(0.001 * upper, jnp.sqrt(lower * upper)), par)
        par = jnp.maximum(par, tiny)
        w, phi, dphi = step(par)
        done = (jnp.abs(phi) <= 0.1 * delta) | (st["it"] == 9)
        newton = phi / jnp.where(dphi < 0, dphi, -1.0)
        upper = jnp.where(phi < 0, par, upper)
        lower = jnp.maximum(lower, par - newton)
        next_par = par - (phi + delta) / delta * newton
        return dict(par=jnp.where(done, par, next_par), lower=lower, upper=upper, w=w,
                    done=done, it=st["it"] + 1)

    st = lax.cond(
        phi0 <= 0.1 * delta,
        lambda: dict(par=jnp.zeros_like(par), lower=lower, upper=upper, w=w_gn,
                     done=jnp.array(True), it=jnp.int32(0)),
        lambda: lax.while_loop(cond, body, dict(par=par, lower=lower, upper=upper,
                                                w=jnp.zeros_like(w_gn),
                                                done=jnp.array(False), it=jnp.int32(0))))
    return st["par"], st["w"]


def _lm_loop(flat_res: Callable, mode: str, steps: int) -> Callable:
    """The compiled loop: one trial step per iteration, a new Jacobian after each success."""
    jac_fn = jax.jacfwd(flat_res) if mode == "fwd" else jax.jacrev(flat_res)

    def run(u0, ftol, xtol, gtol, factor):
        n = u0.shape[0]
        lin = _linearise(flat_res, jac_fn, u0, None)
        m = lin["r"].shape[0]
        dtype = lin["fnorm"].dtype
        eps = jnp.finfo(dtype).eps
        ftol, xtol, gtol = (jnp.maximum(jnp.asarray(t, dtype), eps) for t in (ftol, xtol, gtol))
        xnorm = jnp.linalg.norm(lin["scale"] * u0)
        delta = jnp.where(xnorm > 0, factor * xnorm, factor)
        history = jnp.full((steps + 1,), jnp.nan, dtype).at[0].set(lin["fnorm"] ** 2)

        def status(lin, actred, prered, ratio, delta, xnorm, checked):
            """MINPACK's tests, with ftol/xtol success only at a stationary point."""
            w_gn = _gauss_newton(lin["s"], lin["c"], m, n)
            stationary = ((lin["gnorm"] <= jnp.sqrt(gtol))
                          | (jnp.linalg.norm(w_gn) <= jnp.sqrt(xtol) * xnorm))
            ftol_met = checked & (jnp.abs(actred) <= ftol) & (prered <= ftol) & (ratio <= 2)
            xtol_met = checked & (delta <= xtol * xnorm)
            return jnp.select(
                [~lin["finite"], lin["fnorm"] == 0, lin["gnorm"] <= gtol,
                 (ftol_met | xtol_met) & ~stationary, ftol_met, xtol_met],
                [_NONFINITE, _ZERO, _GTOL, _STALLED, _FTOL, _XTOL], _MAX_STEPS)

        def cond(c):
            return (c["k"] < steps) & (c["code"] == _MAX_STEPS)

        def body(c):
            lin, delta, par = c["lin"], c["delta"], c["par"]
            par, w = _lm_parameter(lin["s"], lin["c"], delta, par, m, n)
            z = lin["Vt"].T @ w
            p = z / lin["scale"]
            pnorm = jnp.linalg.norm(w)
            delta = jnp.where(c["first"], jnp.minimum(delta, pnorm), delta)
            u_new = c["u"] + p
            r_new = flat_res(u_new)
            fnorm = lin["fnorm"]
            fnorm1 = jnp.linalg.norm(r_new)
            fnorm1 = jnp.where(jnp.isfinite(fnorm1), fnorm1, jnp.inf)
            # actual and predicted relative reductions of ||r||^2 (Moré §4)
            actred = jnp.where(0.1 * fnorm1 < fnorm, 1 - (fnorm1 / fnorm) ** 2, -1.0)
            t1 = jnp.linalg.norm(lin["s"] * w) / fnorm
            t2 = jnp.sqrt(par) * pnorm / fnorm
            prered = t1**2 + t2**2 / 0.5
            dirder = -(t1**2 + t2**2)
            ratio = jnp.where(prered != 0, actred / jnp.where(prered != 0, prered, 1.0), 0.0)
            # trust-region update
            den = dirder + 0.5 * actred
            temp = jnp.where(actred >= 0, 0.5, 0.5 * dirder / jnp.where(den != 0, den, -1.0))
            temp = jnp.where((0.1 * fnorm1 >= fnorm) | (temp < 0.1), 0.1, temp)
            shrink = ratio <= 0.25
            grow = ~shrink & ((par == 0) | (ratio >= 0.75))
            delta = jnp.where(shrink, temp * jnp.minimum(delta, pnorm / 0.1),
                              jnp.where(grow, pnorm / 0.5, delta))
            par = jnp.where(shrink, par / temp, jnp.where(grow, 0.5 * par, par))
            accept = ratio >= 1e-4
            u = jnp.where(accept, u_new, c["u"])
            lin = lax.cond(accept, lambda: _linearise(flat_res, jac_fn, u, lin["scale"]),
                           lambda: lin)
            xnorm = jnp.linalg.norm(lin["scale"] * u)
            k = c["k"] + 1
            code = status(lin, actred, prered, ratio, delta, xnorm, True)
            return dict(u=u, lin=lin, delta=delta, par=par, first=c["first"] & ~accept,
                        k=k, code=code, history=c["history"].at[k].set(lin["fnorm"] ** 2))

        zero = jnp.zeros((), dtype)
        init = dict(u=u0, lin=lin, delta=delta, par=zero, first=jnp.array(True), k=jnp.int32(0),
                    code=status(lin, zero, zero, zero, delta, xnorm, False), history=history)
        c = lax.while_loop(cond, body, init)
        lin = c["lin"]
        return dict(u=c["u"], cost=lin["fnorm"] ** 2, history=c["history"],
                    grad_inf=lin["grad_inf"], gnorm=lin["gnorm"], k=c["k"], code=c["code"],
                    )

    return run
