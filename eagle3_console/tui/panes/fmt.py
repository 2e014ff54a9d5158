"""Formatting of snapshot values for the panes: bytes, durations, rates,
timestamps. Pure functions; every widget formats through here so that a value
reads the same in every pane. Bytes and durations are ops/units.py's (the one
formatter of each, shared with `status`, plans, alerts and the ops' logs)."""

from __future__ import annotations

import signal as _signal
from datetime import datetime

from eagle3_console.kernel.units import human_bytes, human_duration

DASH = "-"


def nbytes(n: int | float | None) -> str:
    """Bytes in a narrow pane: human_bytes' figure, compact (923.0G, 27.0G, 912.0M)."""
    return human_bytes(n, DASH, compact=True)


def gib(n: int | None) -> str:
    """A figure in GiB without its unit, for "used/total GiB" (the GPU pane):
    both sides in one unit, which human_bytes, picking one per figure, is not."""
    return DASH if n is None else f"{n / 2**30:.1f}"


def duration(s: float | None, coarse: bool = False) -> str:
    """Seconds as 45s, 12m05s (coarse: 12m), 2h03m, 3d04h: human_duration's."""
    return human_duration(s, DASH, coarse=coarse)


def clock(t: float | None, now: float | None = None) -> str:
    """A wall-clock time; the date is shown only when it is not today's."""
    if t is None:
        return DASH
    when = datetime.fromtimestamp(t)
    if now is not None and datetime.fromtimestamp(now).date() == when.date():
        return when.strftime("%H:%M:%S")
    return when.strftime("%m-%d %H:%M")


def rate(r: float | None, unit: str = "/s") -> str:
    if r is None:
        return DASH
    if r >= 1000:
        return f"{r / 1000:.1f}k{unit}"
    if r >= 10:
        return f"{r:.0f}{unit}"
    return f"{r:.2f}{unit}" if r < 1 else f"{r:.1f}{unit}"


def pct(f: float | None) -> str:
    """A 0..1 fraction as a percentage."""
    return DASH if f is None else f"{100 * f:.0f}%"


def done_pct(f: float | None) -> str:
    """Progress as a percentage, rounded down: 398 of 400 is 99 %, not 100 %."""
    return DASH if f is None else f"{int(100 * f + 1e-9)}%"


def count(n: int | None) -> str:
    return DASH if n is None else f"{n:,}"


def exit_text(exit_code: int | None, sig: int | None) -> str:
    if sig:
        try:
            return _signal.Signals(sig).name
        except ValueError:
            return f"signal {sig}"
    return DASH if exit_code is None else str(exit_code)


def path_tail(path: str, width: int | None) -> str:
    """A path cut at the front to fit `width`: the end names the output."""
    if width is None or len(path) <= width:
        return path
    return "…" + path[len(path) - max(width - 1, 1):]
