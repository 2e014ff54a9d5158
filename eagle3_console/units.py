"""Byte amounts in words, for the headless side (plans, alerts, refusals, `status`).

The TUI's compact df-style figures are widgets/fmt.py's; these are the
sentence forms ("6.6 GiB") that go into messages and the events table.
"""

from __future__ import annotations

GIB = 2**30


def human_bytes(n: int | float | None, missing: str = "-") -> str:
    """5 B, 4.9 KiB, 6.6 GiB, 1.2 TiB; `missing` for an unknown amount."""
    if n is None:
        return missing
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return missing  # unreachable


def gib(n: int | None) -> str:
    """Always in GiB ("923.0 GiB"), for disk and GPU-memory sentences; "?" when unknown."""
    return "?" if n is None else f"{n / GIB:.1f} GiB"
