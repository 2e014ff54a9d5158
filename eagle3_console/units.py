"""Byte amounts and durations in words: the one formatter of each lives in
ops/units.py (ops may not import eagle3_console; the console may import ops),
so a stage's log, the panes, `status`, plans and alerts print a figure alike.
"""

from __future__ import annotations

from ops.units import human_bytes, human_duration

__all__ = ["gib", "human_bytes", "human_duration"]


def gib(n: int | None) -> str:
    """The former always-GiB sentence form ("931322.6 GiB" next to a table's
    909.5 TiB): now human_bytes itself, kept for the callers not moved yet."""
    return human_bytes(n, "?")
