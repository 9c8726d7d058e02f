"""The eager-versus-traced harness: a check must refuse a bad value however it arrives.

A validation that only runs on concrete values lets the traced case (save times passed into
a jitted loss, tolerances vmapped over experiments) return a wrong number with a success
code. Each case below is a function of array arguments that must be refused

- ``eager``: called as it is, with concrete arguments;
- ``jit``: under ``jax.jit``, every argument a tracer;
- ``vmap``: under ``jax.vmap`` over two members, each of them bad;

with an error whose message matches ``match``: a ``ValueError``/``TypeError`` raised while
tracing, or a :class:`simlib.SolverError` raised by the in-graph check (recovered through
:func:`simlib.raise_solver_errors`). :func:`failure_code` checks the ``throw=False`` side:
a failure code, never ``SUCCESSFUL``, in every mode.

Usage::

    @pytest.mark.parametrize("mode", MODES)
    def test_unsorted_save_times(mode):
        def run(ts):
            return sl.solve(f, y0, 0.0, 1.0, solver=sl.Tsit5(), dt=0.1,
                            saveat=sl.SaveAt(ts=ts)).ys
        refuse(mode, run, (jnp.array([0.5, 0.2]),), match="ordered")
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import simlib as sl

MODES = ("eager", "jit", "vmap")
REFUSALS = (ValueError, TypeError, sl.SolverError)


def _stack(args, n: int = 2):
    return jax.tree_util.tree_map(lambda x: jnp.stack([jnp.asarray(x)] * n), args)


def call(mode: str, fn, args: tuple):
    """``fn(*args)`` in ``mode`` (``vmap``: over two copies of every argument), waited for."""
    if mode == "eager":
        out = fn(*args)
    elif mode == "jit":
        out = jax.jit(fn)(*args)
    elif mode == "vmap":
        out = jax.vmap(fn)(*_stack(args))
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return jax.block_until_ready(out)


def refuse(mode: str, fn, args: tuple, *, match: str, errors=REFUSALS):
    """Assert that ``fn(*args)`` in ``mode`` raises one of ``errors`` matching ``match``
    (a regular expression searched in the message), and return the error."""
    with pytest.raises(errors) as info, sl.raise_solver_errors():
        out = call(mode, fn, args)
        # reached only when nothing was raised: show what came back instead
        pytest.fail(f"{mode}: no error; returned {jax.tree_util.tree_map(np.asarray, out)}")
    message = str(info.value)
    assert re.search(match, message), f"{mode}: message {message!r} does not match {match!r}"
    return info.value


def failure_code(mode: str, fn, args: tuple) -> np.ndarray:
    """The result codes of ``fn(*args)`` in ``mode``, where ``fn`` returns a result code
    (``sol.result`` of a ``throw=False`` run). A refusal at trace time counts as failing;
    ``SUCCESSFUL`` in any member fails the test."""
    try:
        code = np.asarray(call(mode, fn, args))
    except REFUSALS:
        return np.array(-1)
    assert np.all(code != int(sl.Result.SUCCESSFUL)), f"{mode}: reported success: {code}"
    return code
