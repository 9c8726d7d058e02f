"""simulate's compiled chunks in tests: count their calls, or send this process a real
SIGINT while one runs (the checkpoint tests)."""

from __future__ import annotations

import contextlib
import os
import signal

from simlib.particles import _simulate


def wrap_chunk(monkeypatch, name: str, sigint_at: int | None = None) -> list:
    """Wrap ``_simulate.<name>`` (a compiled piece of an eager run, read at each call) so
    that every call is counted in the list returned, and the ``sigint_at``-th call first
    sends this process a real SIGINT (``monkeypatch.undo()`` puts the piece back)."""
    calls: list = []
    inner = getattr(_simulate, name)

    def wrapped(*args, **kw):
        calls.append(1)
        if len(calls) == sigint_at:
            os.kill(os.getpid(), signal.SIGINT)
        return inner(*args, **kw)

    monkeypatch.setattr(_simulate, name, wrapped)
    return calls


@contextlib.contextmanager
def default_sigint():
    """Run the block with SIGINT's default handler, then put back the one found: simulate
    takes over SIGINT only from its default handler, and pytest run as a shell's background
    job or under nohup starts with SIGINT ignored ("DID NOT RAISE")."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
