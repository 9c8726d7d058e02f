"""Raise XLA:CPU's small-loop limit, so that small systems' loops run as one function.

XLA:CPU compiles a ``while`` loop whose body and condition access fewer than
``xla_cpu_small_while_loop_byte_threshold`` bytes per iteration (1,024 by default, counted
by ``HloCostAnalysis``) into one function; every other loop runs kernel by kernel, one
dispatch per operation per iteration. The option can only be given through the
``XLA_FLAGS`` environment variable, which XLA reads once, when JAX starts its CPU backend
(``jax.jit(..., compiler_options=...)`` rejects it). The measurements are in
docs/benchmarks.md ("Design measurements") and benchmarks/README.md (``gradients.py`` (g),
``cpu_loops.py``).
"""

from __future__ import annotations

import operator
import os

__all__ = ["fast_cpu_loops", "DEFAULT_THRESHOLD_BYTES"]

_OPTION = "xla_cpu_small_while_loop_byte_threshold"
_FLAG = "--xla_backend_extra_options"
_XLA_DEFAULT = 1024
# Chosen with benchmarks/cpu_loops.py: the largest limit tried under which no large state's
# loop is compiled whole (benchmarks/README.md, cpu_loops.py).
DEFAULT_THRESHOLD_BYTES = 1024 * 1024


def fast_cpu_loops(threshold_bytes: int | None = None) -> None:
    """Let XLA:CPU compile loops of small systems into one function. Call it first.

    Sets XLA:CPU's ``xla_cpu_small_while_loop_byte_threshold`` to ``threshold_bytes``
    (default ``DEFAULT_THRESHOLD_BYTES``, 1 MiB) by adding
    ``--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold=N`` to the
    ``XLA_FLAGS`` environment variable. Flags already there are kept; an existing
    ``--xla_backend_extra_options=`` value gets the option merged into it, and a larger
    threshold already set is kept. Nothing else is changed, and simlib never calls this
    on import.

    A loop whose body accesses fewer bytes per iteration than the threshold is compiled
    into one function instead of running one kernel (one dispatch) per operation per
    iteration. Gradients of small systems and small ensembles gain the most. The cost is
    parallelism: a loop compiled into one function runs on one core, where a loop run
    kernel by kernel may split each large kernel over the cores. The 1 MiB default keeps
    the large states of the benchmarks (10,000-member ensembles, 32,000-atom and 4,096-body
    particle systems) above the limit, so their code is unchanged. The measured gains and
    the cost of a higher limit: docs/benchmarks.md, "Design measurements".

    XLA reads ``XLA_FLAGS`` once, when JAX starts its CPU backend (the first array,
    ``jit`` or ``jax.devices()``), so call this before JAX runs anything: first thing in
    your script, before any ``jax.numpy`` call. Importing ``jax`` and ``simlib`` first is
    fine. Or set the variable before Python starts.

    Only XLA:CPU reads this option: on a GPU or TPU it changes nothing, and when JAX has
    already started with a GPU or TPU as its default backend the call returns silently.

    Args:
        threshold_bytes: the loop-size limit in bytes, an integer of at least 1,024 (XLA's
            default); ``None`` for ``DEFAULT_THRESHOLD_BYTES``.

    Raises:
        ValueError: ``threshold_bytes`` is not an integer >= 1,024.
        RuntimeError: JAX's CPU backend has already started without this limit, so the
            flag could no longer take effect.

    Example::

        import simlib as sl
        sl.fast_cpu_loops()  # before any JAX computation
    """
    n = _check_threshold(threshold_bytes)
    flags = os.environ.get("XLA_FLAGS", "")
    current = _threshold_in(flags)
    if _cpu_backend_started():
        if current is not None and current >= n:
            return  # already in effect (it was in XLA_FLAGS before JAX started)
        if not _default_backend_is_cpu():
            return  # the option only concerns XLA:CPU
        raise RuntimeError(
            "fast_cpu_loops() was called after JAX had started its CPU backend, which reads "
            "XLA_FLAGS only once, so the small-loop limit can no longer change in this "
            "process. Call simlib.fast_cpu_loops() first thing, before any JAX computation "
            "(importing jax and simlib first is fine), or set XLA_FLAGS before starting "
            f"Python: XLA_FLAGS='{_FLAG}={_OPTION}={n}'."
        )
    if current is not None and current >= n:
        return
    os.environ["XLA_FLAGS"] = _with_threshold(flags, n)


def _check_threshold(threshold_bytes: int | None) -> int:
    if threshold_bytes is None:
        return DEFAULT_THRESHOLD_BYTES
    if isinstance(threshold_bytes, bool):
        raise ValueError(f"threshold_bytes must be an integer, got {threshold_bytes!r}.")
    try:
        n = operator.index(threshold_bytes)
    except TypeError:
        raise ValueError(
            f"threshold_bytes must be an integer number of bytes, got {threshold_bytes!r}."
        ) from None
    if not _XLA_DEFAULT <= n < 2**63:
        raise ValueError(
            f"threshold_bytes must be at least {_XLA_DEFAULT} (XLA's default) and below "
            f"2**63, got {n}. To lower the limit, set XLA_FLAGS yourself."
        )
    return n


def _options_in(token: str) -> dict[str, str] | None:
    """The ``key=value`` options of one ``--xla_backend_extra_options=...`` token, else None.

    XLA splits the value at commas; an option without ``=`` has the empty value.
    """
    for prefix in (_FLAG + "=", _FLAG[1:] + "="):
        if token.startswith(prefix):
            options = {}
            for part in token[len(prefix):].split(","):
                if part:
                    key, _, value = part.partition("=")
                    options[key] = value
            return options
    return None


def _threshold_in(flags: str) -> int | None:
    """The threshold ``XLA_FLAGS`` sets (the last one wins, as in XLA), or None."""
    value = None
    for token in flags.split():
        options = _options_in(token)
        if options is not None and _OPTION in options:
            value = options[_OPTION]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _with_threshold(flags: str, n: int) -> str:
    """``flags`` with the threshold set to ``n``: merged into the last extra-options token
    (options of later tokens override earlier ones in XLA), else appended."""
    tokens = flags.split()
    for i in range(len(tokens) - 1, -1, -1):
        options = _options_in(tokens[i])
        if options is not None:
            options[_OPTION] = str(n)
            tokens[i] = _FLAG + "=" + ",".join(
                f"{k}={v}" if v else k for k, v in options.items())
            return " ".join(tokens)
    return " ".join([*tokens, f"{_FLAG}={_OPTION}={n}"])


def _cpu_backend_started() -> bool:
    """Whether JAX has initialised its backends (after which XLA_FLAGS is never re-read)."""
    try:
        from jax._src import xla_bridge
    except ImportError:  # pragma: no cover - jax always has it in the supported versions
        return False
    started = getattr(xla_bridge, "backends_are_initialized", None)
    if started is not None:
        return bool(started())
    return bool(getattr(xla_bridge, "_backends", None))  # pragma: no cover


def _default_backend_is_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"
