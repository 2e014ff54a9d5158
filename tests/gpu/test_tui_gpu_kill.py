"""The seed scenario's recovery through the console, on a real GPU: a stage
(tests/stages/gpu_hog.py) takes GPU memory, leaves a worker holding more,
prints an out-of-memory traceback and exits 1. Driven as an operator would,
in ConsoleApp (App.run_test) with the real NVML:

  the GPU pane's data ties the worker's pid to the run    (app.main_screen.snapshot.gpus)
  `c` before the kill: refused, the worker is alive
  `k`, confirm: the dialog waits until NVML shows the memory released
  pynvml, asked directly: the pid is gone, memory back near the baseline
  `c`: the partial file is offered, the stage name typed, it goes to the trash
  `r`: offers the halved batch (gib 4 -> 2) and shows the argv it would run

Run on a machine with CUDA and NVML: `pytest -s tests/gpu/test_tui_gpu_kill.py`
(the figures are printed; with OUT set they are also written to
$OUT/tui_gpu_kill.json). Elsewhere it skips and says why.

Seen on one H200 (2026-11-29, torch 2.11.0+cu130, textual 8.2.8 from wheels;
benchmarks/tui_gpu_kill_h200.json): baseline 0.601 GiB used, 5.205 GiB with
the orphaned worker (pid tied to run 1 through its pgid, 4.6 GiB), the kill
dialog reported the memory released 1.3 s after confirming, NVML then showed
0.601 GiB and no such pid; 2 passed in 22.7 s. Imports only
textual, torch (in the stage, never here: a CUDA context in this process
would itself hold GPU memory), pynvml, psutil and the project."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.tui.app import ConsoleApp
from eagle3_console.kernel.workspace import Workspace
from tests.conftest import STAGES
from tests.test_tui import confirm, open_dialog, plan_text, progress_text
from tests.test_tui_helpers import run, select, stage_of, wait_until
from textual.widgets import Input
from eagle3_console.tui.dialogs import ActionDialog

GiB = 1 << 30
LEADER_GIB = 1
WORKER_GIB = 4            # the stage's batch_param: halved to 2 by the restart
TOLERANCE = 512 << 20     # "back near the baseline": the CUDA context of a process comes and goes


def _torch_cuda() -> str | None:
    """Why the stage cannot use CUDA here, or None. Asked in a subprocess so
    that this process never creates a CUDA context of its own."""
    p = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        return "torch is not importable: " + (p.stderr.strip().splitlines() or ["?"])[-1]
    if p.stdout.strip() != "True":
        return "torch.cuda.is_available() is False"
    return None


def _nvml_pids_and_used(pynvml) -> tuple[dict[int, int], set[int]]:
    """Used bytes per GPU index and every compute pid, straight from pynvml."""
    used, pids = {}, set()
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        used[i] = pynvml.nvmlDeviceGetMemoryInfo(h).used
        pids |= {p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)}
    return used, pids


def _workspace(root: Path) -> None:
    (root / "eagle3.toml").write_text(f"""
[stages.hog]
argv = ["python", "{STAGES / 'gpu_hog.py'}", "--leader-gib", "{LEADER_GIB}", "--worker-gib", "{{gib}}", "--hold-s", "3"]
params = {{ gib = {WORKER_GIB} }}
batch_param = "gib"
outputs = ["out/hog"]
""")


def _workers_from_log(log_path: str) -> list[int]:
    try:
        m = re.search(r"workers \[([\d, ]*)\]", Path(log_path).read_text())
    except FileNotFoundError:
        return []
    return [int(x) for x in m.group(1).split(",") if x.strip()] if m else []


def test_kill_clean_restart_from_the_console_on_a_real_gpu(nvml, tmp_path, capsys):
    why = _torch_cuda()
    if why:
        pytest.skip(why)
    import pynvml        # nvml (the fixture) has initialised the library: this is the same process
    report = nvml.sample()
    need = (LEADER_GIB + WORKER_GIB + 1) * GiB
    if not any(g.mem_total and g.mem_used is not None and g.mem_total - g.mem_used >= need for g in report.gpus):
        pytest.skip(f"no GPU has {need // GiB} GiB free: "
                    + ", ".join(f"GPU {g.index}: {g.error or (g.mem_total or 0) - (g.mem_used or 0)} B free"
                                for g in report.gpus))
    baseline, _ = _nvml_pids_and_used(pynvml)
    _workspace(tmp_path)
    ws = Workspace.at(tmp_path)
    r = runs.launch(ws, cfg.load(ws.config_path), "hog")
    figures: dict = {"baseline_used_gib": {i: round(b / GiB, 3) for i, b in baseline.items()}, "run": r.id}
    workers: list[int] = []

    async def main():
        app = ConsoleApp(ws, nvml=nvml, refresh_s=0.5, kill_release_timeout_s=60.0)
        async with app.run_test(size=(160, 48)) as pilot:
            def worker_on_gpu():
                s = app.main_screen.snapshot
                st = s and s.stage("hog")
                if not st or st.status != "failed":
                    return None
                workers[:] = _workers_from_log(r.log_path)
                return [(g.index, p) for g in s.gpus.gpus for p in g.processes
                        if p.pid in workers and p.run_id == r.id and p.stage == "hog"]
            found = await wait_until(pilot, worker_on_gpu, timeout=180)
            gpu_index, proc = found[0]
            figures["worker"] = {"pid": proc.pid, "gpu": gpu_index, "how": proc.how,
                                 "used_gib": round((proc.used_bytes or 0) / GiB, 3)}
            used_after_oom, _ = _nvml_pids_and_used(pynvml)
            figures["used_after_oom_gib"] = round(used_after_oom[gpu_index] / GiB, 3)
            assert used_after_oom[gpu_index] - baseline[gpu_index] >= (WORKER_GIB - 0.5) * GiB
            assert stage_of(app, "hog").status == "failed"
            await select(pilot, app, "hog")

            # A partial output, as an OOM'd writer leaves one (the hog stage itself writes nothing).
            partial = tmp_path / "out" / "hog" / "part-00001.tmp"
            partial.parent.mkdir(parents=True)
            partial.write_bytes(b"x" * 4096)

            # Clean while the worker lives: refused, and the dialog says why.
            dialog = await open_dialog(pilot, app, "c")
            text = plan_text(dialog)
            assert "REFUSED" in text and "still alive" in text and str(proc.pid) in text, text
            assert not dialog.query_one("#confirm").display
            figures["clean_before_kill"] = text.strip().splitlines()[0]
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))

            # Kill: the plan names the pid and its GPU memory; confirm; wait for the release.
            dialog = await open_dialog(pilot, app, "k")
            text = plan_text(dialog)
            assert str(proc.pid) in text and f"GPU {gpu_index}" in text, text
            await confirm(pilot, dialog)
            t0 = time.monotonic()
            await wait_until(pilot, lambda: dialog.state == "done", timeout=120)
            figures["kill_dialog_s"] = round(time.monotonic() - t0, 2)
            progress = progress_text(dialog)
            figures["kill_dialog"] = progress.strip().splitlines()
            assert dialog.outcome_ok, progress
            assert "GPU memory released" in progress, progress
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))

            # NVML, asked directly: the worker is gone and its memory is back.
            used_after_kill, pids = _nvml_pids_and_used(pynvml)
            figures["used_after_kill_gib"] = round(used_after_kill[gpu_index] / GiB, 3)
            assert proc.pid not in pids
            assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                           for p in workers)
            assert used_after_kill[gpu_index] - baseline[gpu_index] <= TOLERANCE, figures
            # ...and the console's own data says so on a later pass.
            passes = app.main_screen.passes
            await wait_until(pilot, lambda: app.main_screen.passes >= passes + 2)
            assert not [p for g in app.main_screen.snapshot.gpus.gpus for p in g.processes if p.pid == proc.pid]

            # Clean now: offered, the partial file listed, the stage name typed, moved to the trash.
            dialog = await open_dialog(pilot, app, "c")
            text = plan_text(dialog)
            assert "REFUSED" not in text and "part-00001.tmp" in text, text
            figures["clean_plan"] = text.strip().splitlines()
            dialog.query_one("#typed", Input).focus()
            await pilot.press(*"hog")
            await pilot.press("enter")
            await wait_until(pilot, lambda: dialog.state == "done", timeout=60)
            assert dialog.outcome_ok, progress_text(dialog)
            assert not partial.exists()
            assert any(p.name == partial.name for p in ws.trash_dir.rglob("*"))
            await pilot.press("escape")
            await wait_until(pilot, lambda: not isinstance(app.screen, ActionDialog))

            # Restart: the halved batch first, with the argv that would run; cancelled here.
            dialog = await open_dialog(pilot, app, "r")
            labels = [o.label for o in dialog.spec.options]
            assert dialog.option.key == "halved", labels
            assert f"gib {WORKER_GIB} -> {WORKER_GIB // 2} (halved after the OOM)" in labels[0]
            text = plan_text(dialog)
            assert f"--worker-gib {WORKER_GIB // 2}" in text and "argv:" in text, text
            figures["restart_options"] = labels
            figures["restart_argv"] = next(ln for ln in text.splitlines() if ln.startswith("argv:"))
            await pilot.press("escape")
    try:
        run(main())
    finally:
        # Whatever happened above, no GPU worker of this test outlives it.
        for pid in workers:
            try:
                p = psutil.Process(pid)
                if "worker holds" in " ".join(p.cmdline()):
                    p.kill()
            except psutil.Error:
                pass
        try:
            runs.stop(ws, "hog", grace_s=2)
        except runs.Refused:
            pass
    summary = json.dumps(figures, indent=2, default=str)
    with capsys.disabled():
        print("\nTUI kill on a real GPU:\n" + summary)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "tui_gpu_kill.json").write_text(summary)
