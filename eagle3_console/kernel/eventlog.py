"""The audit log as `events` shows it: repeated identical refusals folded.

A cron `watch --once` refused the same restart for the same reason every pass
adds one identical record; read newest first, a run of them is one line with
its count and the time of the first. Each pass is another process, so its
actor (`user@pidN`) differs: the user counts, not the pid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from eagle3_console.kernel.registry import Event


@dataclass
class Folded:
    event: Event          # the newest of the run
    repeats: int = 1
    first_time: float | None = None

    def as_json(self) -> dict:
        return dict(self.event.__dict__, repeats=self.repeats, first_time=self.first_time or self.event.time)


_PID = re.compile(r"@pid\d+$")


def _key(e: Event) -> tuple:
    return (_PID.sub("", e.actor or ""), e.action, e.stage, e.run_id, e.outcome, e.detail, repr(e.targets))


def fold(events: list[Event], limit: int) -> list[Folded]:
    """Consecutive identical refusals (newest first) as one entry, at most `limit` entries."""
    out: list[Folded] = []
    for e in events:
        last = out[-1] if out else None
        if last is not None and e.outcome.startswith("refused") and _key(e) == _key(last.event):
            last.repeats += 1
            last.first_time = e.time
            continue
        if len(out) == limit:
            break
        out.append(Folded(e))
    return out
