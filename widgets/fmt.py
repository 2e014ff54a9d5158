"""Formatting of snapshot values for the panes: bytes, durations, rates,
timestamps. Pure functions; every widget formats through here so that a value
reads the same in every pane."""

from __future__ import annotations

import signal as _signal
from datetime import datetime

DASH = "-"


def nbytes(n: int | float | None) -> str:
    """Bytes in binary units, 3 significant digits (df -h style): 923G, 27.0G, 912M."""
    if n is None:
        return DASH
    n = float(n)
    for unit in ("B", "K", "M", "G", "T", "P"):
        if abs(n) < 1024 or unit == "P":
            if unit == "B":
                return f"{int(n)}B"
            return f"{n:.1f}{unit}" if abs(n) < 100 else f"{n:.0f}{unit}"
        n /= 1024
    return DASH  # unreachable


def gib(n: int | None) -> str:
    return DASH if n is None else f"{n / 2**30:.1f}"


def duration(s: float | None, coarse: bool = False) -> str:
    """Seconds as 45s, 12m05s (coarse: 12m), 2h03m, 3d04h."""
    if s is None or s < 0:
        return DASH
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" if coarse else f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


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
