"""``fit()``: minimise a scalar loss of a parameter pytree with any optax optimiser.

The optimiser runs on unconstrained values (see ``_transforms.py``) in compiled chunks:
one jitted call runs ``chunk`` steps as a ``lax.scan``; between chunks the host updates
the progress bar and checks the stopping rule. Standard errors come from the
Gauss-Newton approximation of the Hessian at the optimum.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import optax.tree_utils as otu
from jax import lax
from jax.flatten_util import ravel_pytree

from .. import _programs as programs
from .. import _summary
from ..progress import bar as progress_bar
from ._checks import as_float_tree, check_positive_int
from ._transforms import leaf_names, make_maps

PyTree = Any

__all__ = ["FitResult", "GaussNewton", "fit", "gauss_newton_covariance"]

DEFAULT_CHUNK = 50


@dataclass(frozen=True)
class GaussNewton:
    r"""Gauss-Newton uncertainty of least-squares parameters.

    Attributes:
        covariance: ``(p, p)`` covariance of the flattened physical parameters,
            :math:`s^2 (J^T J)^{-1}` (or :math:`(J^T J)^{-1}` with ``absolute_sigma``).
        stderr: Standard errors, a pytree shaped like the parameters.
        correlation: ``(p, p)`` correlation matrix.
        s2: Residual variance estimate :math:`s^2 = \sum r^2 / (n - p)`.
        dof: Degrees of freedom ``n - p``.
        jacobian: ``(n, p)`` Jacobian of the residuals with respect to the flattened
            physical parameters (order of ``jax.flatten_util.ravel_pytree``).
        names: Names of the ``p`` flattened parameters, e.g. ``params['y0s'][3, 1]``.
    """

    covariance: np.ndarray
    stderr: PyTree
    correlation: np.ndarray
    s2: float
    dof: int
    jacobian: np.ndarray
    names: list[str]


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` found.

    Attributes:
        params: Fitted parameters in physical units, with the structure of ``params0``.
        loss: ``loss(params)`` at the returned parameters.
        history: Loss after ``k`` steps for ``k = 0 .. n_steps`` (numpy, length
            ``n_steps + 1``; ``history[0]`` is ``loss(params0)``, ``history[-1] == loss``).
        grad_norm: Euclidean norm of the loss gradient with respect to the *unconstrained*
            parameters (the optimiser's variables) at the returned parameters.
        n_steps: Optimiser steps taken.
        converged: True when the ``tol`` stopping rule was met (always False if ``tol`` is
            None).
        message: Why the run stopped.
        stderr: Standard errors, a pytree like ``params`` (when ``stderr=True``).
        correlation: ``(p, p)`` parameter correlation matrix, flattened in the order of
            ``jax.flatten_util.ravel_pytree(params)`` (when ``stderr=True``).
        covariance: ``(p, p)`` covariance matrix in the same order (when ``stderr=True``).
        gauss_newton: The full :class:`GaussNewton` record (when ``stderr=True``).
        compile_time: Seconds spent tracing and compiling the optimisation loop (once per
            call).
        run_time: Seconds spent running the compiled loop, host work between chunks
            included, compilation and standard errors excluded.
        steps_per_second: Optimiser steps per second of run time, ``n_steps / run_time``
            (``nan`` when ``run_time`` is 0).
    """

    params: PyTree
    loss: float
    history: np.ndarray
    grad_norm: float
    n_steps: int
    converged: bool
    message: str
    stderr: PyTree | None = None
    correlation: np.ndarray | None = None
    covariance: np.ndarray | None = None
    gauss_newton: GaussNewton | None = field(default=None, repr=False)
    compile_time: float = 0.0
    run_time: float = 0.0
    steps_per_second: float = field(init=False)

    def __post_init__(self) -> None:
        rate = self.n_steps / self.run_time if self.run_time > 0 else math.nan
        object.__setattr__(self, "steps_per_second", rate)

    def __repr__(self) -> str:
        start = _summary.number(self.history[0]) if np.size(self.history) else "?"
        timing = (f"{self.compile_time:.3g} s, run_time={self.run_time:.3g} s, "
                  f"steps_per_second={self.steps_per_second:.3g}")
        return _summary.block("FitResult", [
            ("converged", self.converged),
            ("n_steps", self.n_steps),
            ("message", repr(self.message)),
            ("loss", f"{_summary.number(self.loss)} (from {start})"),
            ("grad_norm", _summary.number(self.grad_norm)),
            ("params", _params_summary(self.params, self.stderr)),
            ("compile_time", timing),
        ])


def _params_summary(params: PyTree, stderr: PyTree | None) -> str:
    """``{['alpha']: 1.02 ± 0.01, ['w']: float64[3,3]}``: scalars (and arrays of at most 4
    values) as numbers, with standard errors when known; larger arrays as shapes."""
    paths, treedef = jax.tree_util.tree_flatten_with_path(params)
    errs = [None] * len(paths)
    if stderr is not None and jax.tree_util.tree_structure(stderr) == treedef:
        errs = jax.tree_util.tree_leaves(stderr)

    def one(x, err):
        arr = _summary.concrete(x)
        if arr is None or arr.size > 4 or not np.issubdtype(arr.dtype, np.number):
            return _summary.shape(x)
        e = None if err is None else np.broadcast_to(np.asarray(err), arr.shape).ravel()
        vals = [_summary.number(v) + ("" if e is None else f" ± {float(e[i]):.2g}")
                for i, v in enumerate(arr.ravel())]
        return vals[0] if arr.ndim == 0 else "[" + ", ".join(vals) + "]"

    items = [(jax.tree_util.keystr(p), one(x, e)) for (p, x), e in zip(paths, errs, strict=True)]
    if len(items) == 1 and not items[0][0]:
        return items[0][1]
    return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"


# --------------------------------------------------------------------------------------
# argument checks


def _strong(tree: PyTree) -> PyTree:
    """Drop weak types, so that the chunk function's outputs match its inputs exactly."""
    return jax.tree_util.tree_map(lambda x: jnp.array(x, dtype=jnp.result_type(x)), tree)


def _check_loss(loss: Callable, params: PyTree, name: str = "loss") -> None:
    if not callable(loss):
        raise TypeError(f"{name} must be callable as {name}(params), got {loss!r}")
    try:
        out = jax.eval_shape(loss, params)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling {name}(params0) failed: {type(err).__name__}: {err}") from err
    leaves = jax.tree_util.tree_leaves(out)
    if len(leaves) != 1 or leaves[0].shape != ():
        shape = leaves[0].shape if len(leaves) == 1 else f"a pytree {out}"
        raise ValueError(f"{name} must return a scalar, got {shape}")
    if not jnp.issubdtype(leaves[0].dtype, jnp.floating):
        raise TypeError(f"{name} must return a real floating scalar, got dtype {leaves[0].dtype}")


# --------------------------------------------------------------------------------------
# the optimisation loop


def _make_chunk(objective: Callable, optimizer: optax.GradientTransformationExtraArgs,
                chunk: int, from_state: bool) -> Callable:
    """``run(u, state, value, grad, have, remaining, gtol)``: up to ``min(chunk, remaining)``
    optimiser steps as one ``lax.scan`` of ``chunk + 1`` iterations.

    Iteration ``k`` takes the loss and gradient at the current parameters (computed, or
    the carried ``(value, grad)`` when ``have`` says they belong to ``u``: the final
    evaluation of the previous chunk, so that chunks do not evaluate their start twice)
    and, if ``k < remaining``, the gradient norm exceeds ``gtol`` and both are finite,
    applies one update; the first iteration that does not update is the final
    evaluation, and the later ones do nothing. So the loss after the last update comes
    from the same evaluation code as every step (one traced copy of the gradient).

    Returns ``(u, state, value, grad, values, grad_norms, n_done)``: ``(value, grad)`` at
    the returned ``u``; ``values[k]`` and ``grad_norms[k]`` at the parameters after ``k``
    updates of this chunk, for ``k = 0 .. n_done`` (NaN beyond); the number of updates
    ``n_done``.
    """
    if from_state:
        value_and_grad = optax.value_and_grad_from_state(objective)
    else:
        plain = jax.value_and_grad(objective)

        def value_and_grad(u, state):
            del state
            return plain(u)

    def run(u, state, value, grad, have, remaining, gtol):
        value_dtype = value.dtype
        nan = jnp.full((), jnp.nan, value_dtype)

        def evaluate(carry, i):
            u, state, value, grad, have, _ = carry
            value, grad = lax.cond(have, lambda: (value, grad),
                                   lambda: value_and_grad(u, state=state))
            value = value.astype(value_dtype)
            gnorm = otu.tree_norm(grad).astype(value_dtype)
            go = (i < remaining) & (gnorm > gtol) & jnp.isfinite(value) & jnp.isfinite(gnorm)

            def update(_):
                updates, new_state = optimizer.update(grad, state, u, value=value, grad=grad,
                                                      value_fn=objective)
                return optax.apply_updates(u, updates), new_state

            u, state = lax.cond(go, update, lambda _: (u, state), None)
            return (u, state, value, grad, ~go, ~go), (value, gnorm, go)

        def skip(carry, i):
            del i
            return carry, (nan, nan, jnp.zeros((), bool))

        def body(carry, i):
            return lax.cond(carry[5], skip, evaluate, carry, i)

        init = (u, state, value, grad, have, jnp.zeros((), bool))
        (u, state, value, grad, _, _), (values, gnorms, took) = lax.scan(
            body, init, jnp.arange(chunk + 1))
        return u, state, value, grad, values, gnorms, jnp.sum(took)

    return run


def fit(
    loss: Callable[[PyTree], jax.Array],
    params0: PyTree,
    *,
    optimizer: optax.GradientTransformation | None = None,
    steps: int = 1000,
    tol: float | None = None,
    transforms: PyTree = None,
    progress: bool = True,
    chunk: int | None = None,
    residuals: Callable[[PyTree], jax.Array] | None = None,
    stderr: bool = False,
) -> FitResult:
    r"""Minimise ``loss(params)`` over a pytree of parameters with an optax optimiser.

    With transforms :math:`x = T(u)` (``Positive``, ``Bounded``, ``Identity``) the optimiser
    iterates on the unconstrained :math:`u`,

    .. math:: u_{k+1} = u_k + \mathrm{update}\big(\nabla_u L(T(u_k)), \ldots\big),

    starting from :math:`u_0 = T^{-1}(\texttt{params0})`; the result is reported in
    physical values :math:`x = T(u)`. Steps run compiled, ``chunk`` at a time (a
    ``lax.scan`` in one jitted function that is compiled once and serves every chunk,
    the last one included); each chunk passes its final loss and gradient to the next,
    so each point is evaluated once. ``FitResult.compile_time``, ``run_time`` and
    ``steps_per_second`` say where the time went.

    Stopping rule (checked after every chunk, only when ``tol`` is given): with
    :math:`L_j` the loss after chunk ``j`` and :math:`L_{j-1}` the loss before it, stop
    and report ``converged=True`` when

    .. math:: |L_j - L_{j-1}| \le \mathrm{tol}\cdot\max(1, |L_j|)
              \quad\text{or}\quad \|\nabla_u L\| \le \mathrm{tol},

    the gradient taken with respect to the unconstrained parameters. If the loss becomes
    non-finite, the run stops at the last step with a finite loss (``converged=False``).

    Standard errors (``stderr=True``) need ``residuals(params)``, the weighted residual
    vector :math:`r` whose least-squares minimiser is ``loss``'s minimiser, i.e.
    ``loss = c * sum(r**2)`` for some constant ``c > 0`` (``0.5 * sum`` and ``mean`` both
    qualify; :func:`mse_loss` and :func:`trajectory_residuals` are such a pair). With
    :math:`J = \partial r / \partial x` taken with respect to the flattened *physical*
    parameters at the optimum, :math:`n` residuals and :math:`p` parameters,

    .. math:: s^2 = \frac{\sum_i r_i^2}{n - p}, \qquad
              \mathrm{Cov}(\hat x) \approx s^2 (J^T J)^{-1}

    (see :func:`gauss_newton_covariance`).

    Args:
        loss: ``loss(params) -> scalar``, written in JAX (it is traced and differentiated).
        params0: Initial parameters, any pytree of floats or arrays, in physical values.
        optimizer: An optax ``GradientTransformation``; default ``optax.adam(1e-2)``.
            Line-search methods such as ``optax.lbfgs()`` are supported: their stored value
            and gradient are reused (``optax.value_and_grad_from_state``) and ``value``,
            ``grad`` and ``value_fn`` are passed to ``update``.
        steps: Maximum number of optimiser steps (positive).
        tol: Stopping tolerance, see above; ``None`` runs all ``steps``.
        transforms: ``None`` (no constraints) or a pytree matching ``params0`` (or a prefix
            of it) with ``Positive()``, ``Bounded(lo, hi)``, ``Identity()`` or ``None``
            leaves; a transform at an inner node applies to every leaf below it.
        progress: Show a progress bar with the current loss (``simlib.progress``: tqdm on a
            terminal, a plain line every few seconds otherwise).
        chunk: Optimiser steps per compiled call; default ``min(steps, 50)``.
        residuals: ``residuals(params) -> r`` (physical params), for standard errors.
        stderr: Compute ``stderr``, ``correlation`` and ``covariance`` at the optimum.

    Returns:
        A :class:`FitResult`.

    Raises:
        ValueError: a bad ``steps``, ``chunk`` or ``tol``, a ``params0`` value outside its
            transform's domain, a ``transforms`` tree that does not match ``params0``, a
            ``loss`` that does not return a scalar, or a non-finite ``loss(params0)``.
        TypeError: a ``loss`` that cannot be called on ``params0``, or an ``optimizer``
            that is not an optax transformation.

    Example:
        >>> import jax.numpy as jnp
        >>> from simlib.fit import fit, Positive
        >>> res = fit(lambda p: (jnp.log(p["k"]) - 1.0) ** 2, {"k": 1.0},
        ...           transforms={"k": Positive()}, steps=500, progress=False)
        >>> round(float(res.params["k"]), 3)  # e
        2.718

    References:
        D. P. Kingma and J. Ba, "Adam: a method for stochastic optimization", ICLR 2015.
        J. Nocedal and S. J. Wright, *Numerical Optimization*, 2nd ed., Springer, 2006
        (L-BFGS: Section 7.2; Gauss-Newton: Section 10.3).
    """
    steps, chunk, tol, optimizer = _check_settings(steps, chunk, tol, optimizer, stderr,
                                                   residuals)
    params0 = as_float_tree(params0)
    to_physical, to_unconstrained = make_maps(transforms, params0)
    if not callable(loss):
        raise TypeError(f"loss must be callable as loss(params), got {loss!r}")
    u0 = _strong(to_unconstrained(params0))
    for name, leaf in zip(leaf_names(params0), jax.tree_util.tree_leaves(u0), strict=True):
        if not np.all(np.isfinite(np.asarray(leaf))):
            raise ValueError(f"{name} maps to a non-finite unconstrained value; move it away "
                             "from its bounds")

    def objective(u):
        return jnp.asarray(loss(to_physical(u))).reshape(())

    start = time.perf_counter()
    loop = _compile(objective, optimizer, u0, chunk, tol, lambda: _check_loss(loss, params0))
    compile_time = time.perf_counter() - start

    bar = progress_bar(progress, steps, "fit", "step", leave=False)
    t_start = time.perf_counter()
    try:
        out = _optimise(loop, steps, chunk, tol, bar)
    finally:
        bar.close()
    jax.block_until_ready(out.u)
    run_time = time.perf_counter() - t_start

    params = to_physical(out.u)
    hist = np.concatenate(out.history + [np.array([out.loss])]) if out.history \
        else np.array([out.loss])
    gn = None
    if stderr:
        gn = gauss_newton_covariance(residuals, params)
    return FitResult(
        params=params,
        loss=out.loss,
        history=hist,
        grad_norm=out.grad_norm,
        n_steps=out.done,
        converged=out.converged,
        message=out.message,
        stderr=None if gn is None else gn.stderr,
        correlation=None if gn is None else gn.correlation,
        covariance=None if gn is None else gn.covariance,
        gauss_newton=gn,
        compile_time=compile_time,
        run_time=run_time,
    )


def _check_settings(steps: Any, chunk: Any, tol: Any, optimizer: Any, stderr: bool,
                    residuals: Any) -> tuple[int, int, float | None,
                                             optax.GradientTransformation]:
    """:func:`fit`'s settings checked: ``(steps, chunk, tol, optimizer)`` with the
    defaults filled in (``chunk`` at most ``steps``, ``optax.adam(1e-2)``)."""
    steps = check_positive_int(steps, "steps")
    chunk = min(steps, DEFAULT_CHUNK) if chunk is None else check_positive_int(chunk, "chunk")
    chunk = min(chunk, steps)
    if tol is not None:
        if isinstance(tol, bool) or not isinstance(tol, int | float | np.floating | np.integer) \
                or not (math.isfinite(float(tol)) and float(tol) >= 0):
            raise ValueError(f"tol must be a non-negative finite number or None, got {tol!r}")
        tol = float(tol)
    if optimizer is None:
        optimizer = optax.adam(1e-2)
    if not isinstance(optimizer, optax.GradientTransformation):
        raise TypeError(
            f"optimizer must be an optax GradientTransformation such as optax.adam(1e-2), "
            f"got {optimizer!r}"
        )
    if stderr and residuals is None:
        raise ValueError("stderr=True needs residuals: a function residuals(params) returning "
                         "the weighted residual vector (see trajectory_residuals)")
    if residuals is not None and not callable(residuals):
        raise TypeError(f"residuals must be callable as residuals(params), got {residuals!r}")
    return steps, chunk, tol, optimizer


@dataclass
class _Loop:
    """The compiled chunk function and the state it starts from."""

    compiled: Callable   # see _make_chunk
    u: PyTree            # unconstrained parameters
    state: PyTree        # optimiser state
    carried: tuple       # (value, grad, have) passed from one chunk to the next
    gtol: jax.Array      # gradient-norm tolerance inside the chunk (-1: none)


def _compile(objective: Callable, optimizer: optax.GradientTransformation, u0: PyTree,
             chunk: int, tol: float | None, check: Callable[[], None]) -> _Loop:
    """Initialise the optimiser and compile the chunk function once, for every chunk;
    ``check()`` (the loss's checks) runs before a compilation. A chunk function built
    before, in this process or a kept one, is loaded instead (``simlib._programs``)."""
    opt = optax.with_extra_args_support(optimizer)
    state0 = _strong(opt.init(u0))
    try:
        from_state = otu.tree_get(state0, "value") is not None and \
            otu.tree_get(state0, "grad") is not None
    except KeyError:  # several "value" fields: fall back to computing value and grad
        from_state = False
    key = programs.key(_make_chunk, objective, opt, chunk, from_state, dynamic=(u0, state0))
    kept = programs.load(key)
    if kept is None:
        check()
        value_dtype = jax.eval_shape(objective, u0).dtype
    else:
        value_dtype = np.dtype(kept[1]["value_dtype"])
    gtol = jnp.asarray(-1.0 if tol is None else tol, value_dtype)
    value0 = jnp.zeros((), value_dtype)
    grad0 = jax.tree_util.tree_map(jnp.zeros_like, u0)
    have0 = jnp.zeros((), bool)
    if kept is None:
        lowered = jax.jit(_make_chunk(objective, opt, chunk, from_state)).lower(
            u0, state0, value0, grad0, have0, jnp.asarray(chunk, jnp.int32), gtol)
        compiled = programs.build(key, lowered, {"value_dtype": np.dtype(value_dtype).str})
    else:
        compiled = kept[0]
    return _Loop(compiled, u0, state0, (value0, grad0, have0), gtol)


@dataclass
class _Outcome:
    """Where :func:`_optimise` stopped."""

    u: PyTree
    history: list[np.ndarray]   # losses before each update, chunk by chunk
    done: int                   # updates taken
    converged: bool
    message: str
    loss: float                 # loss at u
    grad_norm: float            # gradient norm at u


def _optimise(loop: _Loop, steps: int, chunk: int, tol: float | None, bar: Any) -> _Outcome:
    """Run chunks until ``steps`` updates, the ``tol`` rule or a non-finite loss."""
    u, state, carried = loop.u, loop.state, loop.carried
    history: list[np.ndarray] = []
    done = 0
    message = f"ran all {steps} steps" + ("" if tol is not None else " (no tol given)")
    loss_prev = None
    loss_now = grad_now = math.nan
    while done < steps:
        n = min(chunk, steps - done)
        out = loop.compiled(u, state, *carried, jnp.asarray(n, jnp.int32), loop.gtol)
        u_new, state_new, value_new, grad_new, values, gnorms, n_done = out
        n_done = int(n_done)  # waits for the chunk
        trail = np.asarray(values)[: n_done + 1]  # losses after 0 .. n_done updates
        g_trail = np.asarray(gnorms)[: n_done + 1]
        if loss_prev is None:
            if not np.isfinite(trail[0]):
                raise ValueError(f"loss(params0) is not finite: {trail[0]!r}")
            loss_prev = float(trail[0])
        if not (np.all(np.isfinite(trail)) and np.all(np.isfinite(g_trail))):
            # rerun the chunk up to the last step whose loss and gradient are finite
            bad = int(np.argmin(np.isfinite(trail) & np.isfinite(g_trail)))
            good = max(bad - 1, 0)
            u, state, *_, values, gnorms, _ = loop.compiled(
                u, state, *carried, jnp.asarray(good, jnp.int32), loop.gtol)
            history.append(np.asarray(values)[:good])
            done += good
            message = (f"the loss became non-finite at step {done + 1}; returning the "
                       f"parameters after step {done}")
            bar.update(good)
            return _Outcome(u, history, done, False, message, float(values[good]),
                            float(gnorms[good]))
        history.append(trail[:-1])
        u, state, done = u_new, state_new, done + n_done
        carried = (value_new, grad_new, jnp.ones((), bool))
        loss_now, grad_now = float(trail[-1]), float(g_trail[-1])
        bar.update(n_done)
        bar.set_postfix_str(f"loss={loss_now:.6g}, grad={grad_now:.2g}")
        reason = _tol_met(tol, n_done < n, loss_now, loss_prev, grad_now, done)
        if reason is not None:
            return _Outcome(u, history, done, True, reason, loss_now, grad_now)
        loss_prev = loss_now
    return _Outcome(u, history, done, False, message, loss_now, grad_now)


def _tol_met(tol: float | None, stopped: bool, loss_now: float, loss_prev: float,
             grad_now: float, done: int) -> str | None:
    """The stopping rule of :func:`fit` after a chunk: why it is met, or None."""
    if tol is None:
        return None
    if stopped or grad_now <= tol:
        return f"gradient norm {grad_now:.3g} <= tol after {done} steps"
    if abs(loss_now - loss_prev) <= tol * max(1.0, abs(loss_now)):
        return (f"loss change {abs(loss_now - loss_prev):.3g} over the last "
                f"chunk <= tol * max(1, |loss|) after {done} steps")
    return None


# --------------------------------------------------------------------------------------
# Gauss-Newton standard errors


def _jacobian(flat_res: Callable, theta: jax.Array, n: int, mode: str) -> jax.Array:
    p = theta.shape[0]
    if mode == "auto":
        mode = "fwd" if p <= n else "rev"
        if mode == "fwd":
            try:
                return jax.jit(jax.jacfwd(flat_res))(theta)
            except TypeError as err:  # a custom_vjp (adaptive solve, Checkpointed, ...)
                if "custom_vjp" not in str(err):
                    raise
                mode = "rev"
    jac = jax.jacfwd(flat_res) if mode == "fwd" else jax.jacrev(flat_res)
    return jax.jit(jac)(theta)


def gauss_newton_covariance(
    residuals: Callable[[PyTree], jax.Array],
    params: PyTree,
    *,
    absolute_sigma: bool = False,
    jacobian: str = "auto",
) -> GaussNewton:
    r"""Covariance of least-squares parameters from the Gauss-Newton approximation.

    For residuals :math:`r(x) \in \mathbb R^n` minimised over :math:`p` parameters at
    :math:`\hat x`, with :math:`J = \partial r / \partial x` at :math:`\hat x`,

    .. math:: s^2 = \frac{r^T r}{n - p}, \qquad \mathrm{Cov}(\hat x) = s^2 (J^T J)^{-1},

    the same estimate as ``scipy.optimize.curve_fit`` (``absolute_sigma=False``). With
    ``absolute_sigma=True`` the residuals are taken to be already divided by the true
    noise standard deviations and :math:`\mathrm{Cov} = (J^T J)^{-1}`. The inverse is
    computed from the singular values of ``J``; a warning is raised when ``J`` is
    numerically rank deficient (some parameter combination is not identifiable).

    Args:
        residuals: ``residuals(params)`` returning the residual array (flattened).
        params: The optimum, a pytree of physical values.
        absolute_sigma: Skip the ``s^2`` factor (see above).
        jacobian: ``"auto"`` (forward mode when ``p <= n``, falling back to reverse mode
            when the residuals go through a custom VJP, which has no forward mode:
            adaptive solves and the ``Checkpointed``, ``Reversible`` and ``ForwardMode``
            adjoints), ``"fwd"`` or ``"rev"``.

    Returns:
        A :class:`GaussNewton` record.

    References:
        G. A. F. Seber and C. J. Wild, *Nonlinear Regression*, Wiley, 1989, Section 2.1.
        J. Nocedal and S. J. Wright, *Numerical Optimization*, 2nd ed., Springer, 2006,
        Section 10.3.
    """
    if jacobian not in ("auto", "fwd", "rev"):
        raise ValueError(f"jacobian must be 'auto', 'fwd' or 'rev', got {jacobian!r}")
    params = as_float_tree(params, root="params")
    theta, unravel = ravel_pytree(params)

    def flat_res(th):
        return jnp.ravel(jnp.asarray(residuals(unravel(th))))

    try:
        r_shape = jax.eval_shape(flat_res, theta)
    except Exception as err:  # noqa: BLE001 - re-raised with context
        raise TypeError(f"calling residuals(params) failed: {type(err).__name__}: {err}") from err
    n, p = int(r_shape.shape[0]), int(theta.shape[0])
    if n <= p:
        raise ValueError(f"residuals returns {n} values but there are {p} parameters; standard "
                         "errors need more residuals than parameters (n > p)")
    r = np.asarray(jax.jit(flat_res)(theta), dtype=np.float64)
    J = np.asarray(_jacobian(flat_res, theta, n, jacobian), dtype=np.float64)
    if not (np.all(np.isfinite(r)) and np.all(np.isfinite(J))):
        raise ValueError("residuals or their Jacobian are not finite at params")
    dof = n - p
    s2 = 1.0 if absolute_sigma else float(r @ r) / dof
    _, sv, vt = np.linalg.svd(J, full_matrices=False)
    cutoff = np.finfo(np.float64).eps * max(n, p) * sv[0]
    if sv[-1] <= cutoff:
        warnings.warn(
            "the residual Jacobian is numerically rank deficient (condition number "
            f"{sv[0] / max(sv[-1], 1e-300):.3g}): some parameter combination is not "
            "identifiable from these residuals; the covariance uses a pseudo-inverse",
            RuntimeWarning, stacklevel=2,
        )
        inv_sv2 = np.where(sv > cutoff, 1.0 / np.maximum(sv, cutoff) ** 2, 0.0)
    else:
        inv_sv2 = 1.0 / sv**2
    cov = s2 * (vt.T * inv_sv2) @ vt
    se = np.sqrt(np.diag(cov))
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = cov / np.outer(se, se)
    se_tree = jax.tree_util.tree_map(np.asarray, unravel(jnp.asarray(se, theta.dtype)))
    return GaussNewton(covariance=cov, stderr=se_tree, correlation=corr, s2=s2, dof=dof,
                       jacobian=J, names=_flat_names(params))


def _flat_names(params: PyTree) -> list[str]:
    names = []
    for name, leaf in zip(leaf_names(params, root="params"), jax.tree_util.tree_leaves(params),
                          strict=True):
        shape = np.shape(leaf)
        if shape == ():
            names.append(name)
        else:
            names.extend(f"{name}[{', '.join(map(str, idx))}]" for idx in np.ndindex(shape))
    return names
