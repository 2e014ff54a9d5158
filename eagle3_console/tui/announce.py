"""Which critical alerts become a notification, as a function of two snapshots.

The header always shows the worst alert; a notification is for what appeared
while the operator was watching. Alerts present when the console opened are
the header's alone (previous is None). A stage whose cause (an OOM, an NCCL
error) was announced moments ago gets no second notice when it then exits:
the failure is that cause's consequence. A cause seen long before does not
hide a later failure, so how long each alert has been present is carried from
one call to the next (`first_seen`, keyed by (code, stage), in snapshot time).

No Textual here: the console calls it for each new snapshot, the tests call it
with hand-built ones.
"""

from __future__ import annotations

from eagle3_console.kernel.model import CRITICAL, Alert, Snapshot

# An OOM (or NCCL error) seen this long before a stage's exit still explains it.
CAUSE_WINDOW_S = 120.0
# Alerts that follow a cause rather than being one.
AFTERMATH = ("stage_failed", "leftover_workers")
# What an operator can do about a critical alert, from the console.
NEXT_STEP = {
    "oom": "select it, then k: kill its workers, c: clean the partial output, r: restart with a halved batch",
    "orphan_gpu_memory": "select the stage, then k: kill the workers that still hold GPU memory",
    "leftover_workers": "select it, then k: kill them (they may hold GPU memory and files; clean refuses while they live)",
    "stage_failed": "select it to read its log; r: restart",
    "lost": "its supervisor is gone: k kills what is left of it, r restarts",
}

Key = tuple[str, str | None]


def critical_keys(snap: Snapshot) -> set[Key]:
    return {(a.code, a.stage) for a in snap.alerts if a.level == CRITICAL}


def announce(previous: Snapshot | None, current: Snapshot,
             first_seen: dict[Key, float] | None = None) -> tuple[list[Alert], dict[Key, float]]:
    """The critical alerts of `current` to notify (one per stage at most) and
    the first-seen times to pass to the next call."""
    now = current.time
    seen = critical_keys(current)
    first = {k: t for k, t in (first_seen or {}).items() if k in seen}
    for key in seen:
        first.setdefault(key, now)
    if previous is None:
        return [], first
    before = critical_keys(previous)
    window = CAUSE_WINDOW_S      # read at call time: tests scale "long after" down
    explained = {a.stage for a in current.alerts if a.level == CRITICAL and a.code not in AFTERMATH
                 and now - first[(a.code, a.stage)] <= window}
    new: dict[str | None, Alert] = {}
    for a in current.alerts:
        if a.level != CRITICAL or (a.code, a.stage) in before:
            continue
        if a.code == "stage_failed" and a.stage in explained:
            continue
        new.setdefault(a.stage, a)
    return list(new.values()), first


def notice_text(alert: Alert, readonly: bool) -> str:
    hint = "" if readonly else NEXT_STEP.get(alert.code, "")
    return alert.message + (f"\n{hint}" if hint else "")
