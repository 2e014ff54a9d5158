"""Helpers shared by the console's tests (test_tui*.py): pipelines of real
test stages, an app wired to a fake NVML (the one boundary that cannot exist
here), waiting on the running app, and a registry seeded with fixed times for
reproducible screenshots. No tests here."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

from eagle3_console.tui.app import ConsoleApp, Frozen
from eagle3_console.monitor.gpus import Nvml
from eagle3_console.kernel.registry import Registry
from eagle3_console.observe.snapshot import Collector
from eagle3_console.kernel.workspace import Workspace
from tests import fake_pynvml
from tests.conftest import stage_cmd

GiB = 2**30


def pipeline(ws_root: Path) -> str:
    """Stages of tests/stages/: a long sleeper, a quick one, a shard writer that
    crashes with an OOM traceback at sample {crash}, and one that leaves an
    orphaned worker behind."""
    return f"""
[stages.slow]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 60 }}

[stages.quick]
argv = {stage_cmd("progress.py", "--n", "3", "--sleep", "0.01")}

[stages.extract]
argv = {stage_cmd("shards.py", "--output", "{output}", "--n", "20", "--rows", "10", "--crash-at", "{crash_at}",
                  "--sleep", "{sleep}", "--linger", "{linger}")}
params = {{ output = "out/hs", crash_at = 12, sleep = 0.0, linger = 0.0 }}
outputs = ["out/hs"]
expected_samples = 20
batch_param = "crash_at"

[stages.orphans]
argv = {stage_cmd("orphan.py", "--pidfile", str(ws_root / "worker.pid"), "--exit", "1")}
"""


def make_app(ws_root: Path, gpus: int | list = 2, readonly: bool = False, **kw: Any) -> ConsoleApp:
    fake = fake_pynvml.FakeNvml(gpus=gpus)
    nvml = Nvml(module=fake)
    ws = Workspace.at(ws_root)
    app = ConsoleApp(ws, readonly=readonly, nvml=nvml, collector=Collector(ws, nvml=nvml), **kw)
    app.fake_nvml = fake
    return app


async def wait_until(pilot, pred: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await pilot.pause(0.05)
    raise AssertionError(f"condition not met within {timeout} s")


def stage_of(app: ConsoleApp, name: str):
    return app.main_screen.snapshot.stage(name) if app.main_screen.snapshot else None


async def select(pilot, app: ConsoleApp, stage: str) -> None:
    await wait_until(pilot, lambda: stage_of(app, stage))
    from eagle3_console.tui.panes.stages import StageTable
    app.query_one(StageTable).select(stage)
    await wait_until(pilot, lambda: app.main_screen.selected == stage)


def run(coro) -> Any:
    return asyncio.run(coro)


# ---------------------------------------------------------------- fixed screens
FROZEN_NOW = 1_767_225_600.0 + 3 * 3600 + 25 * 60   # 2026-01-01 03:25:00 UTC
OOM_LOG = """\
[eagle3-console] run 1 stage extract: ['python', '-m', 'ops.extract', '--batch-size', '2000']
Loading safetensors checkpoint shards:  86% Completed | 55/64 [19:20<01:45, 27.0s/it]
Loading safetensors checkpoint shards: 100% Completed | 64/64 [22:31<00:00, 21.1s/it]
progress: samples 0/1000 tokens 0 errors 0 tok/s 0.0
Traceback (most recent call last):
  File "ops/extract/__main__.py", line 88, in main
RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of 94.97 GiB of which 3.12 GiB is free.'
[eagle3-console] run 1 failed (exit code 1) after 1374.2 s
"""


def seed_runs(ws_root: Path) -> None:
    """A registry with fixed times: prepare succeeded, extract failed with an
    OOM (its log as in the scenario), the rest never ran."""
    ws = Workspace.at(ws_root)
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        def finished(stage: str, status: str, started: float, ended: float, code: int, log: str) -> None:
            r = reg.create_run(stage, ["python", "-m", f"ops.{stage}"], {}, {}, str(ws_root),
                               lambda rid: ws.log_path(rid, stage))
            Path(r.log_path).write_text(log)
            reg.update(r.id, status="running", started=started, pid=None)
            reg.finish(r.id, status, ended=ended, exit_code=code)
        finished("prepare", "succeeded", FROZEN_NOW - 3600, FROZEN_NOW - 3480, 0,
                 "progress: samples 1000/1000 tokens 502983 errors 0 tok/s 4190.0\n")
        finished("extract", "failed", FROZEN_NOW - 1500, FROZEN_NOW - 126, 1, OOM_LOG)


def seeded_pipeline() -> str:
    # argv stages without outputs: no disk entry, whose free space would vary by machine.
    return f"""
[stages.prepare]
argv = {stage_cmd("progress.py", "--n", "3")}

[stages.extract]
argv = {stage_cmd("progress.py", "--n", "3", "--batch", "{batch_size}")}
params = {{ batch_size = 2000 }}
depends_on = ["prepare"]
batch_param = "batch_size"

[stages.train]
argv = {stage_cmd("progress.py", "--n", "3")}
depends_on = ["extract"]
"""


def busy_gpus(n: int) -> list:
    """n GPUs as after the scenario's OOM: ~91 GiB of 94.97 held on each, one GPU idle."""
    out = []
    for i in range(n):
        held = 0 if i == n - 1 else (91 * GiB + i * 97 * 2**20)
        out.append(fake_pynvml.FakeGpu(mem_used=held, util=0 if i == n - 1 else 97 - i,
                                       temp=38 + 3 * i % 20, power_mw=(90 + 40 * i % 300) * 1000))
    return out


def frozen() -> Frozen:
    return Frozen(time=FROZEN_NOW, host="gpu-node-01", workspace="/srv/eagle3/kimi-k2.5")


def rendered(static) -> str:
    """The plain text a Static shows (its Rich renderable printed without colour)."""
    import io

    from rich.console import Console
    content = static.content
    if isinstance(content, str):
        return content
    console = Console(width=max(static.content_size.width, 60), file=io.StringIO(), color_system=None,
                      legacy_windows=False)
    with console.capture() as cap:
        console.print(content)
    return cap.get().replace("\u00a0", " ")     # no-break spaces read as spaces


def pane_text(app, pane_id: str) -> str:
    from textual.widgets import Static
    return "\n".join(rendered(s) for s in app.query_one(f"#{pane_id}").query(Static))
