"""One byte formatter and one duration formatter (ops/units.py), so a figure
reads the same in the table and in the alert next to it."""

from __future__ import annotations

import io

from rich.console import Console

from eagle3_console.observe import alerts
from eagle3_console.kernel.model import DiskUsage, Snapshot
from eagle3_console.observe.report import print_status
from ops.units import human_bytes, human_duration
from eagle3_console.tui.panes import fmt

PB = 10**15


def test_bytes_scale_to_the_largest_unit_below_1024():
    assert [human_bytes(n) for n in (5, 5000, 7 * 2**30 - 400 * 2**20, PB, 3 * 2**50)] == [
        "5 B", "4.9 KiB", "6.6 GiB", "909.5 TiB", "3.0 PiB"]
    assert human_bytes(None) == "-" and human_bytes(None, "?") == "?"
    # The panes' narrow form is the same figure.
    assert human_bytes(PB, compact=True) == fmt.nbytes(PB) == "909.5T"
    assert fmt.nbytes(None) == "-" and fmt.nbytes(512) == "512B"


def test_durations_read_alike_in_status_and_the_panes():
    for s, want in ((45, "45s"), (725, "12m05s"), (7380, "2h03m"), (273600, "3d04h")):
        assert human_duration(s) == fmt.duration(s) == want
    assert fmt.duration(725, coarse=True) == "12m" and human_duration(None) == "-" == human_duration(-1)


def test_a_forced_oversized_stage_warns_in_the_units_of_its_disk_table():
    """It said "931322.6 GiB more" next to a table saying 909.5 TiB."""
    disk = DiskUsage(stage="extract", path="/data/hs", written_bytes=0, estimate_bytes=PB, projected_bytes=PB,
                     free_bytes=2 * 2**40, total_bytes=4 * 2**40, fits=False)
    snap = Snapshot(workspace="/w", host="h", time=0.0, disk=[disk])
    alert = next(a for a in alerts.derive(snap) if a.code == "disk_short")
    assert alert.message == "extract: output projected to need 909.5 TiB more but 2.0 TiB is free at /data/hs"
    snap.alerts = [alert]
    out = io.StringIO()
    print_status(Console(file=out, width=200, color_system=None), snap)
    assert "909.5 TiB" in out.getvalue() and "GiB" not in out.getvalue()
