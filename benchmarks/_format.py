"""Number formatting shared by the benchmark scripts' printed tables."""

from __future__ import annotations


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
