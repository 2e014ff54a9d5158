"""The byte formatters (binary; decimal, as a disk's label says) and the one duration formatter, for every program
here: the console's panes, `status`, plans and alerts (eagle3_console imports
them from here) and the ops' own log lines. A figure reads the same wherever
it is printed ("909.5 TiB" in the table and in the alert next to it).

No imports: ops import nothing of ours but ops, and the console's cron path
stays light.
"""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human_bytes(n: int | float | None, missing: str = "-", compact: bool = False) -> str:
    """Binary units, one decimal: 5 B, 4.9 KiB, 6.6 GiB, 909.5 TiB. compact
    (narrow panes, df -h style): the same figure without the space and "iB":
    5B, 4.9K, 6.6G, 909.5T. `missing` for an unknown amount."""
    if n is None:
        return missing
    n = float(n)
    for unit in _UNITS:
        if abs(n) < 1024 or unit == _UNITS[-1]:
            break
        n /= 1024
    if unit == "B":
        return f"{int(n)}B" if compact else f"{int(n)} B"
    return f"{n:.1f}{unit[0]}" if compact else f"{n:.1f} {unit}"


def human_duration(s: float | None, missing: str = "-", coarse: bool = False) -> str:
    """Seconds as 45s, 12m05s (coarse: 12m), 2h03m, 3d04h; `missing` when unknown or negative."""
    if s is None or s < 0:
        return missing
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" if coarse else f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def si_bytes(n: int) -> str:
    """Decimal units (what `df -H` and a disk's label say): 2.35 TB next to 2.1 TiB."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(value) < 1000 or unit == "PB":
            break
        value /= 1000
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}" if value < 100 else f"{value:.0f} {unit}"
