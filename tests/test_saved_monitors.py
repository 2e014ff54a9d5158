"""The monitors' cache (observe/savedmonitors.py) leaves no temp file behind when a signal ends the
process mid-write: a loaded `.ci/run` found `monitors.json.<pid>.<tid>.tmp` of a watch that SIGTERM
(raised as kernel.interrupts.Signalled) ended between its write and its rename
(test_faults.py::test_parallel_status_calls_never_crash_and_watch_survives)."""

from __future__ import annotations

import os
import signal

import pytest

from eagle3_console.kernel.interrupts import Signalled
from eagle3_console.observe.savedmonitors import SavedMonitors


def test_a_signal_between_write_and_rename_leaves_no_temp_file(tmp_path, monkeypatch):
    saved = SavedMonitors(tmp_path / "cache")
    assert saved._write(tmp_path / "cache" / "monitors.json", {"version": 1})      # the plain path works

    def signalled(_src, _dst):
        raise Signalled(signal.SIGTERM)

    monkeypatch.setattr(os, "replace", signalled)
    with pytest.raises(Signalled):
        saved._write(tmp_path / "cache" / "monitors.json", {"version": 2})
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["monitors.json"]


def test_an_unwritable_cache_is_no_failure_and_leaves_nothing(tmp_path, monkeypatch):
    saved = SavedMonitors(tmp_path / "cache")

    def full(_src, _dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    assert saved._write(tmp_path / "cache" / "monitors.json", {"version": 1}) is False
    assert list((tmp_path / "cache").iterdir()) == []
