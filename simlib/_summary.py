"""Short readable summaries of results (the ``__repr__`` of ``Solution``, ``Trajectory`` and
``FitResult``): status codes by name, statistics as plain numbers, arrays as shapes.

Every helper accepts traced values (a summary printed inside ``jit`` shows ``traced``) and
batched ones (an ensemble from ``vmap`` shows counts per status and ranges of statistics).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import numpy as np

from ._errors import Result


def concrete(x) -> np.ndarray | None:
    """``x`` as a numpy array, or ``None`` when it has no values: traced, abstract
    (``jax.ShapeDtypeStruct`` from ``eval_shape``) or not an array at all."""
    if isinstance(x, jax.core.Tracer | jax.ShapeDtypeStruct):
        return None
    try:
        arr = np.asarray(x)
    except Exception:  # noqa: BLE001 - anything that is not array-like is not shown
        return None
    return None if arr.dtype == object else arr


def no_values(x) -> str:
    """What to print for an array without values."""
    return "abstract" if isinstance(x, jax.ShapeDtypeStruct) else "traced"


def number(x: float) -> str:
    """A float with 6 significant digits, integers without a decimal point."""
    x = float(x)
    if np.isfinite(x) and x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def shape(x) -> str:
    """``float64[11,2]`` (JAX's notation for an abstract array)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return type(x).__name__
    return f"{dtype}[{','.join(str(n) for n in np.shape(x))}]"


def tree_shapes(tree) -> str:
    """Shapes of a pytree's leaves: ``float64[11,2]`` for a bare array, else
    ``{'q': float64[11,3], 'p': float64[11,3]}`` with the leaves' key paths."""
    if tree is None:
        return "None"
    paths = jax.tree_util.tree_flatten_with_path(tree)[0]
    if len(paths) == 1 and not paths[0][0]:
        return shape(paths[0][1])
    return "{" + ", ".join(f"{jax.tree_util.keystr(p)}: {shape(x)}" for p, x in paths) + "}"


def status_counts(result) -> dict[Result, int] | None:
    """``{Result: count}`` over a (possibly batched) status array; ``None`` when traced."""
    codes = concrete(result)
    if codes is None:
        return None
    counts = Counter(int(c) for c in codes.ravel())
    return {_as_result(c): n for c, n in sorted(counts.items())}


def _as_result(code: int):
    try:
        return Result(code)
    except ValueError:
        return code


def status(result) -> str:
    """``SUCCESSFUL``; ``{SUCCESSFUL: 98, MAX_STEPS_REACHED: 2}`` when batched; ``traced``."""
    counts = status_counts(result)
    if counts is None:
        return no_values(result)
    if np.ndim(result) == 0:
        return str(next(iter(counts)))
    return "{" + ", ".join(f"{c}: {n}" for c, n in counts.items()) + "}"


def value(x) -> str:
    """A number, or ``min..max`` over a batch, or ``traced``; non-arrays as ``repr``."""
    arr = concrete(x)
    if arr is None:
        return no_values(x) if isinstance(x, jax.core.Tracer | jax.ShapeDtypeStruct) else repr(x)
    if arr.size == 0:
        return repr(x)
    if not np.issubdtype(arr.dtype, np.number) and arr.dtype != bool:
        return repr(x)
    if arr.size == 1:
        return number(arr.ravel()[0])
    finite = arr[np.isfinite(arr)] if np.issubdtype(arr.dtype, np.floating) else arr
    if finite.size == 0:
        return f"{number(arr.ravel()[0])} (all {arr.size})"
    lo, hi = finite.min(), finite.max()
    text = number(lo) if lo == hi else f"{number(lo)}..{number(hi)}"
    if finite.size < arr.size:
        text += f" ({arr.size - finite.size} non-finite)"
    return text


def span(ts) -> str:
    """Where a time array lies: `` in [0, 10]``, `` at 1``; empty when traced or empty."""
    arr = concrete(ts)
    if arr is None or arr.size == 0 or not np.issubdtype(arr.dtype, np.number):
        return ""
    finite = arr[np.isfinite(arr)]
    if finite.size == 0:
        return ""
    lo, hi = finite.min(), finite.max()
    text = f" at {number(lo)}" if lo == hi else f" in [{number(lo)}, {number(hi)}]"
    if finite.size < arr.size:  # SaveAt(steps=True): unused rows are inf
        text += f" ({finite.size} finite)"
    return text


def stats(d: dict, skip: tuple = (), order: tuple = ()) -> str:
    """``{num_steps=7, t_final=1}`` from a dict of scalars (or batches of them); the keys
    in ``order`` first."""
    keys = [k for k in order if k in d] + [k for k in d if k not in order and k not in skip]
    if keys and all(isinstance(d[k], jax.core.Tracer | jax.ShapeDtypeStruct) for k in keys):
        return "{" + ", ".join(keys) + f"}} ({no_values(d[keys[0]])})"
    parts = [f"{k}={value(d[k])}" for k in keys]
    return "{" + ", ".join(parts) + "}"


def block(name: str, fields: list[tuple[str, Any]]) -> str:
    """``Name(a=1,\\n     b=2)``: one field a line, aligned after the opening bracket."""
    pad = " " * (len(name) + 1)
    body = f",\n{pad}".join(f"{k}={v}" for k, v in fields)
    return f"{name}({body})"


def counts_or_raise(result, owner: str) -> dict:
    counts = status_counts(result)
    if counts is None:
        raise TypeError(f"{owner}.result is traced; read statuses by name outside jit/vmap/grad "
                        f"(inside, compare: {owner.lower()}.result == simlib.Result.SUCCESSFUL)")
    return counts


def single_status(result, owner: str) -> Result:
    counts = counts_or_raise(result, owner)
    if np.ndim(result) != 0:
        raise ValueError(f"{owner}.status: this {owner} is batched, shape {np.shape(result)}; "
                         f"use .status_counts, or simlib.Result(int(...)) of one member")
    return next(iter(counts))


def result_fields(result) -> list[tuple[str, Any]]:
    """The first fields of a result's :func:`block`: ``batch`` (its shape, when batched)
    and ``result`` (:func:`status`)."""
    fields: list[tuple[str, Any]] = []
    batch = np.shape(result)
    if batch:
        fields.append(("batch", batch))
    fields.append(("result", status(result)))
    return fields


def status_properties(owner: str) -> tuple[property, property]:
    """``status`` and ``status_counts``, the two properties by which a result type
    (``Solution``, ``Trajectory``) names its ``result`` code (:func:`single_status`,
    :func:`counts_or_raise`)."""

    def status_(self) -> Result:
        return single_status(self.result, owner)

    def status_counts_(self) -> dict:
        return counts_or_raise(self.result, owner)

    status_.__doc__ = (f"``result`` as a :class:`~simlib.Result` member, e.g. "
                       f"``Result.SUCCESSFUL`` (eager, unbatched; see :attr:`status_counts` "
                       f"for a batched {owner}).")
    status_counts_.__doc__ = (f"``{{Result: number of members}}`` of a batched (``vmap``) "
                              f"{owner}, or of one.")
    return property(status_), property(status_counts_)
