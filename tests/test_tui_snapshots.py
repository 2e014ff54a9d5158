"""Screenshots of the console (pytest-textual-snapshot) at 80x24 and 160x48,
with 8 and 16 GPUs from the fake NVML and with NVML unavailable, in colour
and with NO_COLOR. The workspace is real (a pipeline file and a registry
seeded with fixed times: prepare succeeded, extract failed with the
scenario's OOM); the clock, host and workspace path shown are frozen, and the
app samples once (refresh far in the future) so each screen is reproducible.

Update after an intended change: pytest tests/test_tui_snapshots.py --snapshot-update
"""

from __future__ import annotations

import time

import pytest

from eagle3_console.tui.app import ConsoleApp
from eagle3_console.monitor.gpus import Nvml
from eagle3_console.observe.snapshot import Collector
from eagle3_console.kernel.workspace import Workspace
from tests import fake_pynvml
from eagle3_console.tui.panes.body import Body
from tests.test_tui_helpers import busy_gpus, frozen, seed_runs, seeded_pipeline, wait_until


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    # Start times are shown in local time: pin the zone.
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def console(tmp_path, gpus: int | None) -> ConsoleApp:
    (tmp_path / "eagle3.toml").write_text(seeded_pipeline())
    seed_runs(tmp_path)
    if gpus is None:
        fake = fake_pynvml.FakeNvml(init_error=fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    else:
        fake = fake_pynvml.FakeNvml(gpus=busy_gpus(gpus))
    nvml = Nvml(module=fake)
    ws = Workspace.at(tmp_path)
    return ConsoleApp(ws, nvml=nvml, collector=Collector(ws, nvml=nvml), refresh_s=3600, frozen=frozen())


def first_pass(app: ConsoleApp):
    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.main_screen.passes >= 1)
        await pilot.pause()
        # Panes check their height after a repaint; let those settle.
        await wait_until(pilot, lambda: not any(b.pending_fit for b in app.query(Body)))
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_eight_gpus(snap_compare, tmp_path, size):
    app = console(tmp_path, 8)
    assert snap_compare(app, terminal_size=size, run_before=first_pass(app))


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_nvml_unavailable(snap_compare, tmp_path, size):
    app = console(tmp_path, None)
    assert snap_compare(app, terminal_size=size, run_before=first_pass(app))


def test_sixteen_gpus_160x48(snap_compare, tmp_path):
    app = console(tmp_path, 16)
    assert snap_compare(app, terminal_size=(160, 48), run_before=first_pass(app))


def test_no_color_80x24(snap_compare, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = console(tmp_path, 8)
    assert snap_compare(app, terminal_size=(80, 24), run_before=first_pass(app))
