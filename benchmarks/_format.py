"""Helpers shared by the benchmark scripts: number formatting for the printed tables, the
simlib commit a run measured, optional peers, and writing the results. (Timing lives in
``_timing.py``.)"""

from __future__ import annotations

import importlib
from types import ModuleType


def optional_import(name: str) -> tuple[ModuleType | None, str]:
    """``(module, "")``, or ``(None, "Type: message")`` where importing the peer ``name``
    fails in any way (the scripts skip that peer and report why)."""
    try:
        return importlib.import_module(name), ""
    except Exception as err:  # noqa: BLE001 - any import failure means "skip the peer"
        return None, f"{type(err).__name__}: {err}"


def fmt_s(x) -> str:
    """A duration in seconds as ``1.23 s``, ``4.5 ms`` or ``67 us`` (``-`` for None)."""
    if x is None:
        return "-"
    if x >= 1.0:
        return f"{x:.2f} s"
    if x >= 1e-3:
        return f"{x * 1e3:.1f} ms"
    return f"{x * 1e6:.0f} us"


def fmt_r(x, digits: int = 2) -> str:
    """A ratio as ``1.23x`` (``-`` for None)."""
    return "-" if x is None else f"{x:.{digits}f}x"


def finish(results: dict, text: str, json_path) -> int:
    """Print the report ``text`` and the wall time, then write ``results`` (with the report)
    as JSON to ``json_path``; the exit status of a benchmark's ``main``."""
    import json
    from pathlib import Path

    print()
    print(text)
    print(f"\ntotal wall time {results['wall_s']:.0f} s")
    results["report"] = text
    path = Path(json_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"results written to {path}")
    return 0


def simlib_commit(root) -> str | None:
    """The short HEAD of the git checkout at ``root``, with ``+dirty`` if ``simlib/`` has
    uncommitted edits there; ``None`` outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "simlib"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - not a git checkout, or no git
        return None
    return head + ("+dirty" if dirty else "")
