"""When a run ended on a clock that the wall clock's steps do not move.

`watch`'s backoff counted from the run's recorded end (wall clock): with the
clock stepped back a day, `backoff_s = 5` said "86402 s left" and the restart
waited a day. The end is also kept as CLOCK_BOOTTIME (monotonic, system wide,
counting suspend) with the boot it belongs to, in the registry's meta table
(one row a run end, no schema change); the backoff uses it while the machine
has not rebooted, and otherwise falls back to the wall clock, capped at the
backoff's own size (policy.decide).
"""

from __future__ import annotations

import json
import sqlite3
import time

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    try:
        with open(_BOOT_ID) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def _key(run_id: int) -> str:
    return f"ended_boottime:{run_id}"


def stamp() -> dict | None:
    """Now on the boot clock, with the boot it counts from."""
    boot = boot_id()
    return None if boot is None else {"boot": boot, "t": time.clock_gettime(time.CLOCK_BOOTTIME)}


def mark_end(reg, run_id: int, when: dict | None = None) -> None:
    """Record `when` (a stamp(); default now) as run `run_id`'s end; best effort."""
    when = when or stamp()
    if when is None:
        return
    value = json.dumps(when)
    try:
        reg.conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (_key(run_id), value))
    except sqlite3.Error:
        pass


def seconds_since_end(reg, run_id: int) -> float | None:
    """Seconds since run `run_id` ended, by the boot clock; None when unknown
    (an end recorded before this, or on another boot)."""
    try:
        row = reg.conn.execute("SELECT value FROM meta WHERE key = ?", (_key(run_id),)).fetchone()
        value = json.loads(row[0]) if row else None
    except (sqlite3.Error, ValueError):
        return None
    if not isinstance(value, dict) or value.get("boot") != boot_id() or not isinstance(value.get("t"), (int, float)):
        return None
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - value["t"])
