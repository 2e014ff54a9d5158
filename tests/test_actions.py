"""Guarded actions with real processes and files: kill-workers, clean, restart."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from eagle3_console.monitor.procs import process_alive
from tests.conftest import EXPORT_PIPELINE, PY, stage_cmd, wait_for


def pipe(tmp) -> str:
    return f"""
[stages.orphan]
argv = {stage_cmd("orphan.py", "--pidfile", str(tmp / "child.pid"), "--exit", "1")}

[stages.slow]
argv = {stage_cmd("sleeper.py", "--seconds", "60")}

[stages.extract]
argv = {stage_cmd("shards.py", "--output", "out/hs", "--n", "30", "--rows", "10", "--crash-at", "{crash}")}
params = {{ crash = 12 }}
outputs = ["out/hs"]
expected_samples = 30
batch_param = "crash"

[stages.custom]
argv = ["python", "-c", "import pathlib; p = pathlib.Path('out/custom'); p.mkdir(parents=True, exist_ok=True); (p / 'new.bin').write_bytes(b'x' * 100); (p / 'w.tmp').write_bytes(b'y'); raise SystemExit(2)"]
outputs = ["out/custom"]
"""


def test_kill_workers_plans_then_kills_orphan_and_never_a_stranger(ws, tmp_path):
    ws.write(pipe(tmp_path))
    stranger = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        ws.cli("run", "orphan", check=0)
        ws.wait_status("orphan", ("failed",))
        child = int(wait_for(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text()))
        assert psutil.pid_exists(child)
        dry = ws.cli("kill-workers", "orphan")
        assert dry.returncode == 0 and f"pid {child:>7}" in dry.stdout and "dry run" in dry.stdout
        assert psutil.pid_exists(child)          # a plan touches nothing
        proc = ws.cli("kill-workers", "orphan", "--yes", "--grace", "2")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # No driver here: the release is not claimed, it is said to be unchecked.
        assert "GPU memory not checked (NVML unavailable here)" in proc.stdout and "released" not in proc.stdout
        wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)
        assert stranger.poll() is None
        with ws.registry() as reg:
            ev = [e for e in reg.events("orphan") if e.action == "kill-workers"]
        assert ev and ev[0].targets[0]["pid"] == child
    finally:
        stranger.kill()
    again = ws.cli("kill-workers", "orphan")
    assert again.returncode == 0 and "nothing to do" in again.stdout and "no live process" in again.stdout


def test_clean_refused_while_alive_then_moves_partials_to_trash(ws, tmp_path):
    ws.write(pipe(tmp_path))
    ws.cli("run", "slow", check=0)
    assert ws.cli("clean", "slow").returncode == 2
    ws.cli("stop", "slow", "--grace", "1", check=0)

    ws.cli("run", "extract", check=0)
    ws.wait_status("extract", ("failed",))
    hs = ws.root / "out" / "hs"
    complete = sorted(hs.rglob("data_*.safetensors"))
    plan = ws.cli("clean", "extract")
    assert plan.returncode == 0 and "2 partial file(s)" in plan.stdout, plan.stdout
    assert "data_12.safetensors.tmp" in plan.stdout and "data_13.safetensors" in plan.stdout
    proc = ws.cli("clean", "extract", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not list(hs.rglob("*.tmp")) and not (hs / "rows_10-20" / "data_13.safetensors").exists()
    kept = sorted(hs.rglob("data_*.safetensors"))
    assert len(kept) == len(complete) - 1 == 12        # whole samples are kept for the resume
    trash = list((ws.root / ".eagle3" / "trash").rglob("data_13.safetensors"))
    assert len(trash) == 1


def test_clean_never_touches_a_succeeded_run_nor_follows_symlinks(ws, tmp_path):
    ws.write(pipe(tmp_path).replace("crash = 12", "crash = -1"))
    ws.cli("run", "extract", check=0)
    ws.wait_status("extract", ("succeeded",))
    proc = ws.cli("clean", "extract", "--yes")
    assert proc.returncode == 2 and "succeeded" in proc.stdout
    assert len(list((ws.root / "out" / "hs").rglob("data_*.safetensors"))) == 30

    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.tmp").write_text("mine")
    ws.cli("run", "custom", check=0)
    ws.wait_status("custom", ("failed",))
    os.symlink(outside, ws.root / "out" / "custom" / "link")
    proc = ws.cli("clean", "custom", "--yes", "--purge")
    assert proc.returncode == 0, proc.stdout
    assert (outside / "keep.tmp").read_text() == "mine"
    assert not (ws.root / "out" / "custom" / "new.bin").exists()
    assert (ws.root / "out" / "custom" / "link").is_symlink()


def test_restart_refused_while_alive_then_with_kill(ws, tmp_path):
    ws.write(pipe(tmp_path))
    ws.cli("run", "slow", check=0)
    first = ws.latest("slow")
    proc = ws.cli("restart", "slow", "--yes")
    assert proc.returncode == 2 and "still alive" in proc.stdout
    proc = ws.cli("restart", "slow", "--kill", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not process_alive(first.pid, first.create_time)
    new = ws.latest("slow")
    assert new.id != first.id and new.restart_of == first.id and new.status == "running"
    ws.cli("stop", "slow", "--grace", "1", check=0)


def test_restart_after_oom_offers_and_applies_halved_batch(ws, tmp_path):
    ws.write(pipe(tmp_path))
    ws.cli("run", "extract", check=0)
    ws.wait_status("extract", ("failed",))
    dry = ws.cli("restart", "extract")
    assert "suggested: --set crash=6" in dry.stdout and "argv:" in dry.stdout
    proc = ws.cli("restart", "extract", "--halve-batch", "--yes")
    assert proc.returncode == 0 and "crash: 12 -> 6" in proc.stdout
    r = ws.latest("extract")
    assert r.params["crash"] == 6 and r.argv[-1] == "6" and r.restart_of is not None


def test_clean_purges_a_half_written_checkpoint_directory_but_not_through_its_links(ws, tmp_path):
    # export/train leave <format>.tmp-<pid> / step_<N>.tmp-<pid> directories, not files.
    from eagle3_console import actions
    from eagle3_console.kernel.workspace import Workspace
    ws.write(EXPORT_PIPELINE)
    w = Workspace(ws.root)
    ws.record_finished_run("export", {"checkpoint": "out/ckpt", "output": "out/export"})
    half = ws.root / "out" / "export" / "sglang.tmp-123"
    half.mkdir(parents=True)
    (half / "model.safetensors").write_bytes(b"x" * 5000)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.bin").write_bytes(b"mine")
    os.symlink(outside, half / "link")
    done = ws.root / "out" / "export" / "speculators"
    done.mkdir()
    plan = actions.plan_clean(w, "export", purge=True)
    assert plan.refusal is None and plan.files == [(half, 5000)]
    result = actions.execute_clean(w, plan)
    assert result.failed == [] and result.moved == 1 and result.bytes == 5000
    assert not half.exists() and done.is_dir()
    assert (outside / "keep.bin").read_bytes() == b"mine"


def test_restart_refused_while_workers_of_the_failed_run_live(ws, tmp_path):
    ws.write(pipe(tmp_path))
    ws.cli("run", "orphan", check=0)
    ws.wait_status("orphan", ("failed",))
    child = int(wait_for(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text()))
    proc = ws.cli("restart", "orphan", "--yes")
    assert proc.returncode == 2 and f"worker(s) [{child}]" in proc.stdout
    proc = ws.cli("restart", "orphan", "--kill", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ws.latest("orphan").restart_of is not None
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)
    ws.wait_status("orphan", ("failed",))
    ws.cli("kill-workers", "orphan", "--yes", "--grace", "1")


def test_two_cleans_in_the_same_second_keep_both_trash_folders(ws, tmp_path):
    from eagle3_console.actions import execute_clean, plan_clean
    from eagle3_console.kernel.workspace import Workspace

    ws.write(pipe(tmp_path))
    w = Workspace.at(ws.root)
    ws.cli("run", "custom", check=0)
    ws.wait_status("custom", ("failed",))
    first = plan_clean(w, "custom")
    assert first.trash.name.endswith(f"-custom-run{ws.latest('custom').id}")
    done = execute_clean(w, first)
    (ws.root / "out" / "custom" / "new.bin").write_bytes(b"z" * 7)   # the same name, new bytes
    second = plan_clean(w, "custom")
    second.trash = first.trash                                       # as within one second
    again = execute_clean(w, second)
    assert again.destination != done.destination and again.destination.endswith("-2")
    assert (first.trash / "out" / "custom" / "new.bin").read_bytes() == b"x" * 100
    assert (second.trash / "out" / "custom" / "new.bin").read_bytes() == b"z" * 7


def test_a_failed_stage_whose_worker_lives_on_says_so_until_it_is_killed(ws, tmp_path, monkeypatch):
    import json

    from eagle3_console.observe import snapshot
    ws.write(pipe(tmp_path))
    ws.cli("run", "orphan", check=0)
    ws.wait_status("orphan", ("failed",))
    child = int(wait_for(lambda: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text()))
    # The run's end recorded as now: the first look is inside the grace however long a loaded
    # machine took to get here (a later end keeps the worker the run's: it started before).
    failed = ws.latest("orphan")
    with ws.registry() as reg:
        reg.update(failed.id, ended=time.time())
    # Not at once (workers may still be tearing down): after LEFTOVER_GRACE_S.
    snap = json.loads(ws.call("status", "--json", "--no-gpus", check=2).stdout)
    assert not [a for a in snap["alerts"] if a["code"] == "leftover_workers"]
    # Then the grace injected as over (status runs in this process), not waited for (10 s).
    monkeypatch.setattr(snapshot, "LEFTOVER_GRACE_S", 0.0)

    def leftover():
        s = json.loads(ws.call("status", "--json", "--no-gpus", check=2).stdout)
        return [a for a in s["alerts"] if a["code"] == "leftover_workers"]
    [alert] = wait_for(leftover, timeout=30, poll=1)
    assert alert["level"] == "critical" and alert["stage"] == "orphan" and f"pid {child}" in alert["message"]
    ws.cli("kill-workers", "orphan", "--yes", "--grace", "2", check=0)
    snap = json.loads(ws.call("status", "--json", "--no-gpus", check=2).stdout)
    assert not [a for a in snap["alerts"] if a["code"] == "leftover_workers"]


def test_an_exited_but_unreaped_worker_counts_as_gone():
    # A worker whose parent has not called wait() yet is a zombie: it runs nothing.
    # (psutil.wait_procs counts it as running, and kill-workers would SIGKILL it and
    # report SIGKILL as needed.)
    import sys

    from eagle3_console.actions.kill import _wait_gone
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                               "child = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
                               "print(child.pid, flush=True); time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        child = psutil.Process(int(parent.stdout.readline()))
        wait_for(lambda: child.status() == psutil.STATUS_ZOMBIE, timeout=10)
        # Gone at the first look: _wait_gone never sleeps for it (no wall clock to race).
        slept = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("eagle3_console.actions.kill.time.sleep", slept.append)
            assert _wait_gone([child], timeout=5) == []
        assert slept == []
    finally:
        parent.kill()
        parent.wait()
