"""Progress of long runs: one host-side bar for ``solve``, ``simulate`` and ``fit``.

What the bar is told, and when:

* ``simulate`` and ``fit`` already run compiled chunks from a host loop (a ``lax.scan`` of
  ``chunk`` steps per jitted call); the loop updates the bar between chunks. Nothing runs
  inside the compiled code, so results are those of a run without a bar, bit for bit.
* ``solve`` is one compiled loop (a ``lax.scan`` for fixed steps, a ``while_loop`` for
  adaptive ones, wrapped by the gradient strategy). Cutting it into host chunks would
  change what the strategies differentiate and, with events or ``SaveAt(ts=...)``, the
  bookkeeping that the loop carries. Instead, an eager ``solve(..., progress=True)``
  compiles a variant whose loop is nested, an outer loop over chunks (1/100 of a
  fixed-step run; ``max_steps // 100`` attempts of an adaptive one, clamped to 64..4096),
  with a :func:`jax.debug.callback` between chunks that reads the step count or the time
  only. The same steps run in the same order, so the state's arithmetic is unchanged
  (tests/test_progress.py checks bit-identity). A callback in a ``lax.cond`` at every
  step was measured first and rejected, its conditional costing more than a trivial scan
  body (docs/benchmarks.md, "Design measurements"). The nested loops' cost is in
  docs/files.md.
  Under ``jit``, ``vmap`` or ``grad`` (any traced call) ``progress`` is ignored, so a
  traced program never carries a callback (a batched callback would fire once per member,
  and a recomputed segment once more per backward pass).

Where it goes: a tqdm bar when standard error is a terminal (or in a notebook); otherwise
(a log file, a pipe, CI) one plain line at most every :data:`PLAIN_INTERVAL` seconds, and a
closing line if any was printed, instead of carriage-return frames.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["PLAIN_INTERVAL", "bar"]

PLAIN_INTERVAL = 5.0
"""Seconds between two plain progress lines when standard error is not a terminal."""


def _interactive(stream) -> bool:
    if "ipykernel" in sys.modules:  # a notebook: tqdm.auto draws a widget
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except (ValueError, OSError):  # a closed stream
        return False


def _format(x: float) -> str:
    if float(x).is_integer():
        return f"{int(x):d}"
    return f"{x:.4g}"


class _PlainBar:
    """The bar's interface (``update``, ``set``, ``set_postfix_str``, ``close``) writing a
    plain line at most every ``interval`` seconds."""

    def __init__(self, total: float, desc: str, unit: str, stream, interval: float):
        self.total, self.desc, self.unit = total, desc, unit
        self.stream, self.interval = stream, interval
        self.n = 0.0
        self.postfix = ""
        self.start = self.last = time.monotonic()
        self.printed = False

    def _line(self, now: float, closing: bool = False) -> str:
        elapsed = now - self.start
        head = f"{self.desc}: "
        if self.total:
            frac = min(max(self.n / self.total, 0.0), 1.0)
            head += f"{100 * frac:3.0f}% ({_format(self.n)}/{_format(self.total)} {self.unit})"
            if not closing and 0 < frac < 1:
                head += f", {elapsed:.0f} s elapsed, ~{elapsed * (1 - frac) / frac:.0f} s left"
            else:
                head += f", {elapsed:.1f} s"
        else:
            head += f"{_format(self.n)} {self.unit}, {elapsed:.1f} s"
        if self.postfix:
            head += f", {self.postfix}"
        return head + (" (done)" if closing else "")

    def _maybe_print(self):
        now = time.monotonic()
        if now - self.last >= self.interval:
            self.last = now
            self.printed = True
            print(self._line(now), file=self.stream, flush=True)

    def update(self, n: float = 1):
        self.n += n
        self._maybe_print()

    def set(self, n: float):
        self.n = n
        self._maybe_print()

    def set_postfix_str(self, s: str, refresh: bool = True):
        self.postfix = s

    def close(self):
        if self.printed:
            print(self._line(time.monotonic(), closing=True), file=self.stream, flush=True)
            self.printed = False


class _TqdmBar:
    """tqdm with ``set`` (an absolute position, for reports from inside a compiled loop)."""

    def __init__(self, total, desc, unit, stream, leave):
        from tqdm.auto import tqdm

        self._bar = tqdm(total=total, desc=desc, unit=unit, file=stream, leave=leave,
                         dynamic_ncols=True)

    def update(self, n=1):
        self._bar.update(n)

    def set(self, n):
        self._bar.update(n - self._bar.n)

    def set_postfix_str(self, s, refresh=True):
        self._bar.set_postfix_str(s, refresh=refresh)

    def close(self):
        self._bar.close()


class _NoBar:
    def update(self, n=1):
        pass

    def set(self, n):
        pass

    def set_postfix_str(self, s, refresh=True):
        pass

    def close(self):
        pass


def bar(progress: bool, total: float, desc: str, unit: str = "step", *, leave: bool = True,
        stream: TextIO | None = None) -> Any:
    """A progress bar for ``total`` units: tqdm on a terminal, plain lines otherwise, a
    do-nothing bar when ``progress`` is false. Use it as a context manager or call
    ``close()``; ``update(n)`` advances it, ``set(n)`` moves it to ``n``."""
    if not progress:
        return _Bar(_NoBar())
    stream = sys.stderr if stream is None else stream
    if _interactive(stream):
        return _Bar(_TqdmBar(total, desc, unit, stream, leave))
    return _Bar(_PlainBar(total, desc, unit, stream, PLAIN_INTERVAL))


class _Bar:
    """The bar handed out by :func:`bar` (a context manager that closes it)."""

    def __init__(self, impl):
        self._impl = impl

    def update(self, n: float = 1):
        self._impl.update(n)

    def set(self, n: float):
        self._impl.set(n)

    def set_postfix_str(self, s: str):
        self._impl.set_postfix_str(s)

    def close(self):
        self._impl.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- reports from inside a compiled loop (solve) ---------------------------------------

_ACTIVE: dict[str, _Bar] = {}


class active:
    """``with active("solve", bar):`` routes :func:`report` calls named ``"solve"`` to
    ``bar`` while the block runs (the caller blocks on the result inside it)."""

    def __init__(self, name: str, the_bar: _Bar):
        self.name, self.bar = name, the_bar

    def __enter__(self):
        self._previous = _ACTIVE.get(self.name)
        _ACTIVE[self.name] = self.bar
        return self.bar

    def __exit__(self, *exc):
        if self._previous is None:
            _ACTIVE.pop(self.name, None)
        else:
            _ACTIVE[self.name] = self._previous
        return False


def _deliver(name: str, value) -> None:
    the_bar = _ACTIVE.get(name)
    if the_bar is not None:
        the_bar.set(float(value))


def tick(name: str, value) -> None:
    """Inside traced code: move the bar registered under ``name`` (see :class:`active`) to
    ``value`` (one host callback, reading ``value`` only)."""
    import functools

    import jax

    jax.debug.callback(functools.partial(_deliver, name), value)


def report(name: str, value, when) -> None:
    """Inside traced code: when ``when`` (a traced bool) holds, move the bar registered
    under ``name`` (see :class:`active`) to ``value``. Adds a ``lax.cond`` and, when it
    fires, one host callback; reads its arguments only."""
    from jax import lax

    lax.cond(when, lambda v: tick(name, v), lambda v: None, value)
