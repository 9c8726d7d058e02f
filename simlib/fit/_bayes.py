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

Non-finite *data* are another matter: no parameter can fit them, so every proposal would
be ``-inf`` and the sampler would report only that it found no valid initial point. The
data are therefore checked where they arrive: the arrays ``fn`` reads from its closure,
its module's globals or a ``functools.partial``, and the keyword arguments of ``logp``.
"""

from __future__ import annotations

import dis
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .._errors import failures_reported
from .._solution import Solution
from .._util import is_tracer

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


def _data_leaves(name: str, value: Any) -> Iterator[tuple[str, Any]]:
    """``(name[path], leaf)`` of the floating (or complex) array leaves of ``value``."""
    for path, leaf in jax.tree_util.tree_flatten_with_path(value)[0]:
        if (isinstance(leaf, np.ndarray | np.generic | jax.Array)
                and jnp.issubdtype(leaf.dtype, jnp.inexact)):
            yield name + jax.tree_util.keystr(path), leaf


def _check_finite(name: str, value: Any) -> None:
    """Raise ``ValueError`` when the concrete array ``value`` holds nan or inf."""
    value = np.asarray(value)
    bad = ~np.isfinite(value)
    count = int(np.count_nonzero(bad))
    if count:
        first = np.unravel_index(int(np.argmax(bad)), value.shape)
        at = f"{name}[{', '.join(map(str, first))}]" if value.ndim else name
        raise ValueError(
            f"log_density: {name} holds {count} non-finite "
            f"{'entry' if count == 1 else 'entries'} (nan or inf) of {value.size}, the "
            f"first {at} = {value[first]}; the log density would be -inf at every "
            "parameter (a sampler then finds no valid initial point): remove those "
            "entries, or replace them and mask them out")


def _closed_over(fn: Callable) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of what ``fn`` reads from outside: a ``functools.partial``'s
    arguments, its closure's variables and the module globals its code loads."""
    while isinstance(fn, functools.partial):
        try:
            names = list(inspect.signature(fn.func).parameters)
        except (TypeError, ValueError):
            names = []
        for i, arg in enumerate(fn.args):
            yield (names[i] if i < len(names) else f"argument {i}"), arg
        yield from fn.keywords.items()
        fn = fn.func
    try:
        fn = inspect.unwrap(fn)
    except ValueError:  # a cycle of __wrapped__
        return
    code = getattr(fn, "__code__", None)
    if code is None:
        return
    for name, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or (),
                          strict=False):
        try:
            yield name, cell.cell_contents
        except ValueError:  # a variable not assigned yet
            pass
    codes, seen = [code], set()
    while codes:  # the function's code and the lambdas and functions defined in it
        c = codes.pop()
        codes += [k for k in c.co_consts if inspect.iscode(k)]
        for ins in dis.get_instructions(c):
            if (ins.opname == "LOAD_GLOBAL" and ins.argval not in seen
                    and ins.argval in fn.__globals__):
                seen.add(ins.argval)
                yield ins.argval, fn.__globals__[ins.argval]


def _data_finite(data: dict[str, Any]) -> jax.Array | None:
    """Check the data given to ``logp``: concrete arrays raise at once; for traced ones,
    whether they are all finite, in the graph (``None`` when none is traced)."""
    finite = None
    for name, value in data.items():
        for leaf_name, leaf in _data_leaves(name, value):
            if is_tracer(leaf):
                ok = jnp.all(jnp.isfinite(leaf))
                finite = ok if finite is None else finite & ok
            else:
                _check_finite(leaf_name, leaf)
    return finite


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

    The data must be finite: NaN or inf in an observation makes every proposal ``-inf``,
    and the sampler says only that it found no valid initial point. Concrete floating
    arrays that ``fn`` reads from its closure, its module's globals or a
    ``functools.partial`` raise ``ValueError`` here, naming the variable, the count of
    non-finite entries and the first one's index. Data may also be given to ``logp`` as
    keywords (``logp(*params, **data)`` is ``fn(*params, **data)``, guarded): concrete
    ones are refused the same way; traced ones (a ``jax.jit`` taking them, a ``jax.vmap``
    over data sets) are checked in the graph, and where they are not finite ``logp`` is
    NaN (gradient zero), not the ``-inf`` of a rejected proposal. Traced values that ``fn``
    closes over cannot be told from parameters and are not checked. A closed-over array
    that holds an infinity on purpose (a bound) is refused too: give it as a Python float
    or compute it inside ``fn``.

    Args:
        fn: ``fn(*params, **data) -> (value, solutions)``, written in JAX.

    Returns:
        ``logp(*params, **data) -> value``, a real scalar (``-inf`` on failure, NaN for
        traced non-finite data).

    Raises:
        ValueError: an array ``fn`` reads from outside, or data given to ``logp``, holds
            nan or inf.

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
    for name, value in _closed_over(fn):
        for leaf_name, leaf in _data_leaves(name, value):
            if not is_tracer(leaf):  # a traced one may be a parameter of the model
                _check_finite(leaf_name, leaf)

    def value_and_ok(*params, **data):
        out = fn(*params, **data)
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
    def logp(*params, **data):
        finite = _data_finite(data)
        with failures_reported():
            # values fn closes over (and the data) become explicit inputs of the custom VJP
            converted, consts = jax.closure_convert(
                functools.partial(value_and_ok, **data), *params)
        value = _guarded(converted, *params, *consts)
        return value if finite is None else jnp.where(finite, value, jnp.nan)

    return logp
