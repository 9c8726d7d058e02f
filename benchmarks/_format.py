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
