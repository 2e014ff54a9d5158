"""Curves in the progress pane (issue 12, s2): train's loss and per-step
accuracies over steps with the simulated acceptance length below, from a real
metrics.jsonl read by the collector; screenshots at 80x24 (sparklines) and
160x48 (the loss as a chart), and with NO_COLOR; an extraction's tok/s.

The workspace is test_tui_snapshots.py's (fixed clock, host and path), with
train an op stage whose metrics.jsonl lies in its output (no run recorded:
a recorded run would add a disk row whose free space varies by machine; no
[target].hidden_size either, or train's estimate would add one before any run). The
disk pane names the selected stage's output folder: the workspace sits at a
fixed path (WS_DIR, emptied first) so that the screen is the same each run.

Update after an intended change: pytest tests/test_tui_curves.py --snapshot-update
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from eagle3_console.tui.app import ConsoleApp
from eagle3_console.kernel.model import Curves
from eagle3_console.monitor.gpus import Nvml
from eagle3_console.observe.snapshot import Collector
from eagle3_console.kernel.workspace import Workspace
from tests import fake_pynvml
from tests.conftest import exclusive
from tests.test_tui_helpers import busy_gpus, frozen, seed_runs, seeded_pipeline, select, wait_until
from eagle3_console.tui.panes.body import Body

K = 4


def records(n: int = 60) -> list[dict]:
    out = []
    for i in range(1, n + 1):
        step = 10 * i
        acc = [round(min(0.97, (0.9 - 0.12 * k) * (1 - math.exp(-i / 12)) + 0.02 * math.sin(i + k)), 4)
               for k in range(K)]
        rec = {"step": step, "total": 600, "loss": round(6.0 * math.exp(-i / 15) + 1.2 + 0.1 * math.sin(i), 4),
               "acc": acc, "tok_s": 41000.0, "lr": 1e-4}
        if i > 5:       # the first windows as an older writer wrote them: computed from acc
            from ops.drafter.metrics import simulated_acceptance_length
            rec["simulated_acceptance_length"] = round(simulated_acceptance_length(acc), 4)
        out.append(rec)
    return out


def pipeline() -> str:
    train_argv = seeded_pipeline().split("[stages.train]")[0]
    return """
[target]
path = "assets/target"
num_layers = 8
dtype = "float32"
vocab_size = 512
""" + train_argv + f"""
[stages.train]
op = "train"
depends_on = ["extract"]
params = {{ data = "data/hs", vocab = "data/vocab", output = "runs/train", ttt_steps = {K} }}
"""


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


WS_DIR = Path(tempfile.gettempdir()) / "eagle3-tui-curves"


@pytest.fixture
def curves_dir():
    """WS_DIR, one test at a time on this machine (xdist workers, other runs): its
    path is on the screen, so it is fixed, and a second test would empty it."""
    with exclusive(WS_DIR.with_name(WS_DIR.name + ".lock")):
        yield WS_DIR


def console(_tmp_path) -> ConsoleApp:
    shutil.rmtree(WS_DIR, ignore_errors=True)
    WS_DIR.mkdir(parents=True)
    tmp_path = WS_DIR
    (tmp_path / "eagle3.toml").write_text(pipeline())
    seed_runs(tmp_path)
    out = tmp_path / "runs" / "train"
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records()))
    nvml = Nvml(module=fake_pynvml.FakeNvml(gpus=busy_gpus(8)))
    ws = Workspace.at(tmp_path)
    return ConsoleApp(ws, nvml=nvml, collector=Collector(ws, nvml=nvml), refresh_s=3600, frozen=frozen())


def on_train(app: ConsoleApp):
    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.main_screen.passes >= 1)
        await select(pilot, app, "train")
        await pilot.pause()
        await wait_until(pilot, lambda: not any(b.pending_fit for b in app.query(Body)))
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_train_curves(snap_compare, curves_dir, tmp_path, size):
    app = console(tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=on_train(app))


def test_train_curves_no_color_80x24(snap_compare, curves_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    app = console(tmp_path)
    assert snap_compare(app, terminal_size=(80, 24), run_before=on_train(app))


def _text(curves: Curves, tall: bool, width: int) -> list[str]:
    import io

    from rich.console import Console

    from eagle3_console.tui.panes.curves import CurvesView
    console = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    with console.capture() as cap:
        console.print(CurvesView(curves, tall))
    return cap.get().splitlines()


def test_the_lines_say_the_latest_values_and_fit_the_width():
    from eagle3_console.monitor.metrics import MetricsReader  # noqa: F401 - the reader fills these
    from eagle3_console.tui.panes.curves import sparkline

    c = Curves(steps=[10, 20, 30], loss=[3.0, 2.0, 1.0], acc=[[0.2, 0.5, 0.8], [0.1, 0.2, 0.4], [0.0, 0.1, 0.2]],
               sim_al=[1.2, 1.6, 2.2])
    short = _text(c, tall=False, width=46)
    assert short[0].startswith("loss") and short[0].endswith(" 1") and "█" in short[0] and "▁" in short[0]
    assert [line.split()[0] for line in short] == ["loss", "acc@1", "acc@3", "sim"]
    assert short[1].endswith("0.80") and short[2].endswith("0.20") and short[3].endswith("2.20")
    assert all(len(line) <= 46 for line in short)
    tall = _text(c, tall=True, width=80)
    assert [line.split()[0] for line in tall[5:]] == ["acc@1", "acc@2", "acc@3", "sim"]
    assert tall[1].split()[0] == "3" and tall[4].split()[0] == "1"       # the chart's range
    # Accuracies on a fixed 0..1 scale: 0.5 throughout is mid-height, not a full bar.
    assert sparkline([0.5, 0.5], 2, 0.0, 1.0) == "▅▅" or sparkline([0.5, 0.5], 2, 0.0, 1.0) == "▄▄"
    # A short run spans the width it has, a point repeated per column.
    assert sparkline([1.0, 2.0], 10) == "▁" * 5 + "█" * 5
    # An extraction's tok/s.
    ext = Curves(tok_s=[1000.0, 3000.0, 2000.0], tok_s_times=[0.0, 1.0, 2.0])
    line = _text(ext, tall=False, width=40)
    assert len(line) == 1 and line[0].startswith("tok/s") and line[0].endswith("2.0k tok/s")
