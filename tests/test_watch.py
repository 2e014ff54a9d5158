"""watch: the lock (exit 75), restart with backoff up to max, halve the batch after an OOM."""

from __future__ import annotations

import subprocess
import time

from tests.conftest import EXPORT_PIPELINE, PY, stage_cmd


def pipe(restart: str = "") -> str:
    return f"""
[stages.extract]
argv = {stage_cmd("shards.py", "--output", "out/hs", "--n", "30", "--rows", "10", "--crash-at", "{batch}")}
params = {{ batch = 8 }}
outputs = ["out/hs"]
expected_samples = 30
batch_param = "batch"
{restart}

[stages.flaky]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01", "--exit", "3")}
restart = {{ max = 2, backoff_s = 0 }}
"""


def test_lock_held_exits_75(ws):
    ws.write(pipe())
    (ws.root / ".eagle3").mkdir()
    holder = subprocess.Popen([PY, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(ws.root / '.eagle3' / 'watch.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(30)\n")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        proc = ws.cli("watch", "--once", "--no-gpus")
        assert proc.returncode == 75 and "another watch" in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    assert ws.cli("watch", "--once", "--no-gpus").returncode == 0


def test_oom_restart_halves_batch_until_it_fits(ws):
    """The stage 'OOMs' at sample index == batch; halving moves the crash point
    until batch < done samples already on disk... and the resumed run completes."""
    ws.write(pipe())
    ws.cli("run", "extract", check=0)
    ws.wait_status("extract", ("failed",))
    proc = ws.cli("watch", "--once", "--no-gpus")
    assert "batch 8 -> 4" in proc.stdout, proc.stdout
    r = ws.latest("extract")
    assert r.params["batch"] == 4 and r.restart_of == 1 and "after OOM" in r.reason
    final = ws.wait_status("extract", ("succeeded", "failed"))
    # Sample 4..7 exist already (written before), so the crash at index 4 is skipped and the run completes.
    assert final.status == "succeeded", open(final.log_path).read()
    with ws.registry() as reg:
        assert any(e.action == "watch-restart" for e in reg.events("extract"))
    assert ws.cli("watch", "--once", "--no-gpus").returncode == 0


def test_restart_policy_stops_at_max(ws):
    ws.write(pipe())
    ws.cli("run", "flaky", check=0)
    for _ in range(4):
        ws.wait_status("flaky", ("failed",))
        ws.cli("watch", "--once", "--no-gpus")
        time.sleep(0.2)
    with ws.registry() as reg:
        runs = reg.runs("flaky")
    assert len(runs) == 3, [(r.id, r.status, r.restart_of) for r in runs]   # the first + max 2 restarts
    ws.wait_status("flaky", ("failed",))
    proc = ws.cli("watch", "--once", "--no-gpus")
    assert proc.returncode == 2


def test_backoff_is_respected(ws):
    ws.write(pipe().replace("backoff_s = 0", "backoff_s = 120"))
    ws.cli("run", "flaky", check=0)
    ws.wait_status("flaky", ("failed",))
    proc = ws.cli("watch", "--once", "--no-gpus")
    assert "backoff" in proc.stdout and proc.returncode == 2
    with ws.registry() as reg:
        assert len(reg.runs("flaky")) == 1


def test_a_refused_restart_is_reported_and_the_other_stages_still_restart(ws):
    # The last run's params name one the op no longer takes: restart refuses (stage_params).
    ws.write(EXPORT_PIPELINE + 'restart = { max = 2, backoff_s = 0 }\n'
             + "[stages.flaky]" + pipe().split("[stages.flaky]", 1)[1])
    ws.record_finished_run("export", {"checkpoint": "out/ckpt", "output": "out/export", "old_knob": 1},
                           ended_ago_s=5)
    ws.cli("run", "flaky", check=0)
    ws.wait_status("flaky", ("failed",))
    proc = ws.cli("watch", "--once", "--no-gpus")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "export: not restarted: op 'export' has no param(s) ['old_knob']" in proc.stdout, proc.stdout
    assert "flaky: run" in proc.stdout and "restarted as run" in proc.stdout
    with ws.registry() as reg:
        assert any(e.outcome == "refused: params" and e.detail.startswith("op 'export' has no param(s)")
                   for e in reg.events("export"))


def test_until_done_waits_out_a_restart_backoff(ws):
    """A failed stage with restarts left, in its backoff: --until-done said
    "pipeline settled" and exited, so the restart never came (seen with a pipeline
    file whose extract stage had restart = { max = 2, backoff_s = 5 })."""
    ws.write("""
[stages.flaky]
argv = ["python", "-c", "import pathlib, sys; p = pathlib.Path('tries'); n = len(p.read_text()) if p.exists() else 0; p.write_text('x' * (n + 1)); sys.exit(0 if n >= 1 else 3)"]
restart = { max = 2, backoff_s = 5 }
""")
    # The backoff long enough that a pass lands inside it on a busy machine too (1.5 s: a loaded
    # run's passes took longer, and none saw the backoff).
    proc = ws.cli("watch", "--advance", "--until-done", "--interval", "0.2", "--no-gpus", timeout=60)
    assert "backoff" in proc.stdout, proc.stdout
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    r = ws.latest("flaky")
    assert r.status == "succeeded" and r.restart_of is not None, proc.stdout
