"""``log_density()``: a log density through ``simlib.solve`` that a gradient-based sampler
(numpyro's NUTS, blackjax) can always evaluate.

A Hamiltonian sampler proposes absurd parameters during warm-up: rates that make the
state blow up, stiffness that exhausts the step budget. A log density built on such a
solve must neither raise (that kills the whole run) nor return NaN values or gradients
(a NaN gradient at a rejected point still poisons the trajectory, and ``jnp.where``
does not stop it: the cotangent of the untaken branch is zero, but zero times the NaN
Jacobian of the failed solve is NaN). :func:`log_density` wraps the user's function so
that a failed solve, or a non-finite value, gives exactly ``-inf`` with gradient zero,
whatever the failed solve computed; a successful one is passed through untouched.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .._errors import failures_reported
from .._solution import Solution

__all__ = ["log_density"]


def _all_succeeded(solutions: Any) -> jax.Array:
    """True when every :class:`~simlib.Solution` (or ``Result`` array) in ``solutions``
    reports success; batched results (a ``vmap`` inside the function) must all succeed."""
    leaves = jax.tree_util.tree_leaves(
        solutions, is_leaf=lambda x: isinstance(x, Solution))
    if not leaves:
        raise TypeError(
            "log_density: the function must return (value, solutions), where solutions is "
            "the Solution of each solve inside it (or their .result arrays); got no "
            "solution")
    ok = jnp.bool_(True)
    for leaf in leaves:
        result = leaf.result if isinstance(leaf, Solution) else leaf
        result = jnp.asarray(result)
        if not jnp.issubdtype(result.dtype, jnp.integer):
            raise TypeError(
                "log_density: the second output must hold Solutions or their integer "
                f".result arrays, got an array of dtype {result.dtype}")
        ok = ok & jnp.all(result == 0)
    return ok


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _guarded(value_and_ok: Callable, *inputs: Any) -> jax.Array:
    value, ok = value_and_ok(*inputs)
    return jnp.where(ok, value, -jnp.inf)


def _guarded_fwd(value_and_ok: Callable, *inputs: Any):
    value, vjp, ok = jax.vjp(value_and_ok, *inputs, has_aux=True)
    return jnp.where(ok, value, -jnp.inf), (vjp, ok)


def _guarded_bwd(value_and_ok: Callable, residuals, cotangent):
    del value_and_ok
    vjp, ok = residuals
    grads = vjp(cotangent)
    # a select, not a product: whatever NaN the failed solve's derivatives hold is dropped
    return jax.tree_util.tree_map(lambda g: jnp.where(ok, g, jnp.zeros_like(g)), grads)


_guarded.defvjp(_guarded_fwd, _guarded_bwd)


def log_density(fn: Callable[..., tuple[jax.Array, Any]]) -> Callable[..., jax.Array]:
    r"""Make ``fn`` safe to use as (part of) a log density inside a sampler.

    ``fn(*params)`` computes a log density (usually a log-likelihood) through one or more
    :func:`simlib.solve` calls and returns ``(value, solutions)``: the real scalar value and
    the :class:`~simlib.Solution` of each solve (a Solution, a ``Result`` array, or any
    pytree of them). The returned function ``logp(*params)`` is

    .. math::

        \log p(\theta) = \begin{cases} \text{value}(\theta) & \text{every solve succeeded
        and the value is finite} \\ -\infty & \text{otherwise} \end{cases}

    and its gradient (``jax.grad``, ``jax.value_and_grad``, as the samplers take it) is the
    gradient of ``value`` where the solves succeeded and exactly zero where they did not
    (no NaN from the failed solve reaches the sampler). A Hamiltonian sampler rejects a
    ``-inf`` proposal as a divergence and goes on.

    While ``fn`` is traced, every solve inside it reports a failure in
    ``Solution.result`` instead of raising (as with ``throw=False``, which is therefore
    not needed). Failures that are caught: the step budget (``max_steps``), a non-finite
    state, a step size too small, an implicit solver's Newton iteration failing; any
    non-finite value (e.g. the log of a negative predicted count) as well. Under
    ``jax.vmap`` (vectorised chains) each member is judged on its own.

    ``params`` are any pytrees of arrays; values that ``fn`` closes over (other parameters
    of the model, say) are differentiated as well. The guard is a ``jax.custom_vjp``:
    reverse mode (what NUTS and HMC use) goes through it, forward mode (``jax.jvp``,
    ``jax.hessian``) does not. The gradients through the solves themselves are simlib's
    defaults (forward mode for up to 8 differentiated components; see
    ``docs/gradients.md``). See ``docs/bayes.md``.

    Args:
        fn: ``fn(*params) -> (value, solutions)``, written in JAX.

    Returns:
        ``logp(*params) -> value``, a real scalar (``-inf`` on failure).

    Example:
        >>> import jax, jax.numpy as jnp, simlib as sl
        >>> def log_lik(k):
        ...     sol = sl.solve(lambda t, y, k: -k * y, jnp.array([1.0]), 0.0, 1.0,
        ...                    solver=sl.Tsit5(), rtol=1e-6, atol=1e-6, args=k, max_steps=64)
        ...     return -0.5 * ((sol.ys[-1, 0] - 0.5) / 0.01) ** 2, sol
        >>> logp = sl.log_density(log_lik)
        >>> float(logp(1e4)), float(jax.grad(logp)(1e4))   # step budget exhausted
        (-inf, 0.0)
    """
    if not callable(fn):
        raise TypeError(f"log_density: fn must be callable as fn(*params), got {fn!r}")

    def value_and_ok(*params):
        out = fn(*params)
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                "log_density: the function must return a pair (value, solutions), the "
                "value and the Solution of each solve inside it; got "
                f"{type(out).__name__}")
        value, solutions = out
        value = jnp.asarray(value)
        if value.shape != () or not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(
                "log_density: the value must be a real scalar, got shape "
                f"{value.shape} and dtype {value.dtype}")
        return value, _all_succeeded(solutions) & jnp.isfinite(value)

    @functools.wraps(fn)
    def logp(*params):
        with failures_reported():
            # values fn closes over become explicit inputs of the custom VJP
            converted, consts = jax.closure_convert(value_and_ok, *params)
        return _guarded(converted, *params, *consts)

    return logp
