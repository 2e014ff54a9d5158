"""Byte amounts and durations in words: the one formatter of each lives in
ops/units.py (ops may not import eagle3_console; the console may import ops),
so a stage's log, the panes, `status`, plans and alerts print a figure alike.
"""

from __future__ import annotations

from ops.units import human_bytes, human_duration, si_bytes

__all__ = ["human_bytes", "human_duration", "si_bytes"]
