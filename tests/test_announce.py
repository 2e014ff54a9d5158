"""Which critical alerts become notifications: announce() over hand-built
snapshots (no console, no Textual)."""

from __future__ import annotations

from eagle3_console.tui import announce
from eagle3_console.kernel.model import CRITICAL, WARNING, Alert, Snapshot


def snap(t: float, *alerts: Alert) -> Snapshot:
    return Snapshot(workspace="/w", host="h", time=t, alerts=list(alerts))


OOM = Alert(CRITICAL, "oom", "extract: out of memory", "extract")
FAILED = Alert(CRITICAL, "stage_failed", "extract failed (exit code 1)", "extract")
LOST = Alert(CRITICAL, "lost", "train: supervisor gone", "train")


def test_alerts_present_at_opening_are_the_headers_alone():
    new, seen = announce.announce(None, snap(0, OOM, FAILED))
    assert new == [] and set(seen) == {("oom", "extract"), ("stage_failed", "extract")}


def test_a_new_critical_alert_is_announced_once():
    _, seen = announce.announce(None, snap(0))
    new, seen = announce.announce(snap(0), snap(1, OOM, Alert(WARNING, "errors", "x", "extract")), seen)
    assert new == [OOM]
    new, seen = announce.announce(snap(1, OOM), snap(2, OOM), seen)
    assert new == []


def test_a_failure_right_after_its_oom_is_its_consequence_not_a_second_notice():
    _, seen = announce.announce(snap(0), snap(1, OOM))
    new, _ = announce.announce(snap(1, OOM), snap(5, OOM, FAILED), seen)
    assert new == []


def test_a_failure_long_after_its_oom_gets_its_own_notice():
    _, seen = announce.announce(snap(0), snap(1, OOM))
    new, _ = announce.announce(snap(1, OOM), snap(1 + announce.CAUSE_WINDOW_S + 1, OOM, FAILED), seen)
    assert new == [FAILED]


def test_one_notice_per_stage_and_each_stage_its_own():
    new, _ = announce.announce(snap(0), snap(1, OOM, FAILED, LOST))
    assert new == [OOM, LOST]


def test_a_cleared_alert_that_comes_back_is_new_again():
    _, seen = announce.announce(snap(0), snap(1, LOST))
    _, seen = announce.announce(snap(1, LOST), snap(2), seen)
    assert seen == {}
    new, _ = announce.announce(snap(2), snap(3, LOST), seen)
    assert new == [LOST]


def test_the_notice_says_what_to_do_unless_read_only():
    assert "k: kill its workers" in announce.notice_text(OOM, readonly=False)
    assert announce.notice_text(OOM, readonly=True) == OOM.message
