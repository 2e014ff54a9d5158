"""Fault injection, issue 19: the CLI's input checks and exit codes, played end
to end with the real CLI (in subprocesses where a process is tested, its reads and
refusals in this process) (items 10, 11, 15, 18, 21, 22, 23;
the supervisor, stop, logs -f, backoff and exporter items are in
tests/test_faults_supervise.py). Each test failed on the main branch it was
written against."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import extract_pipeline, stage_cmd, wait_for

SLEEPER = f"""
[stages.sleeper]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 30.0 }}
"""


def _one_clear_line(proc, *words: str) -> None:
    assert "Traceback" not in proc.stderr and "rror" in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


# ------------------------------------------------------------------ 10. numeric options
@pytest.mark.parametrize("args, option", [
    (("exporter", "--port", "70000"), "--port"),
    (("exporter", "--port", "-1"), "--port"),
    (("exporter", "--interval", "nan"), "--interval"),
    (("exporter", "--interval", "inf"), "--interval"),
    (("exporter", "--interval", "-1"), "--interval"),
    (("exporter", "--interval", "0"), "--interval"),
    (("watch", "--once", "--interval", "-1"), "--interval"),
    (("watch", "--interval", "nan"), "--interval"),
    (("watch", "--interval", "1e300"), "--interval"),
    (("stop", "sleeper", "--grace", "nan"), "--grace"),
    (("stop", "sleeper", "--grace", "-3"), "--grace"),
    (("kill-workers", "sleeper", "--grace", "inf"), "--grace"),
    (("kill-workers", "sleeper", "--wait", "-1"), "--wait"),
    (("runs", "-n", "-1"), "-n"),
    (("runs", "-n", "99999999999999999999999"), "-n"),
    (("logs", "sleeper", "-n", "-5"), "-n"),
    (("logs", "sleeper", "--run", "0"), "--run"),
])
def test_every_numeric_option_is_checked_at_parse_exit_3(ws, args, option):
    """Before: --port 70000 an OverflowError traceback (exit 1); --interval nan
    accepted (a busy sampler), inf killed the sampler thread; watch
    --interval -1 / nan a ValueError traceback; -n -1 silently accepted."""
    ws.write(SLEEPER)
    proc = ws.call(*args, timeout=20)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    _one_clear_line(proc, option)
    assert "Traceback" not in proc.stderr


def test_watch_and_exporter_still_take_a_fractional_interval(ws):
    ws.write(SLEEPER)
    ws.cli("watch", "--once", "--no-gpus", "--interval", "0.05", check=0)


# ------------------------------------------------------------------ 22. usage errors are bad input
@pytest.mark.parametrize("args", [("run", "-rf"), ("run",), ("status", "--jsn"), ("no-such-command",),
                                  ("exporter", "--port", "abc")])
def test_click_usage_errors_exit_3_not_2(ws, args):
    """Before: exit 2, which the README's table calls CRITICAL (a stage failed)."""
    ws.write(SLEEPER)
    proc = ws.call(*args)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "Error" in proc.stderr and "Traceback" not in proc.stderr


def test_help_is_still_exit_0(ws):
    ws.write(SLEEPER)
    assert "Usage" in ws.call("run", "--help", check=0).stdout


# ------------------------------------------------------------------ 11. deep nesting
def test_600_deep_nested_array_in_params_is_one_line_exit_3(ws):
    """Before: a RecursionError traceback of 3,000 lines, exit 1."""
    deep = "[" * 600 + "]" * 600
    ws.write(f"""
[stages.s]
argv = ["python", "-c", "pass"]
params = {{ x = {deep} }}
""")
    for args in (("status", "--no-gpus"), ("status", "--json", "--no-gpus"), ("run", "s")):
        proc = ws.call(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and "eagle3.toml" in proc.stderr and "nested" in proc.stderr


def test_nesting_that_tomllib_parses_but_is_absurd_is_refused_with_its_key(ws):
    deep = "[" * 200 + "1" + "]" * 200
    ws.write(f"""
[stages.s]
argv = ["python", "-c", "pass"]
params = {{ x = {deep} }}
""")
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3 and "stages.s.params.x" in proc.stderr and "nested" in proc.stderr, proc.stderr


def test_a_deep_set_value_is_one_line_exit_3(ws):
    ws.write(SLEEPER)
    proc = ws.call("run", "sleeper", "--set", "seconds=" + "[" * 600 + "]" * 600)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "--set" in proc.stderr, proc.stderr[-300:]
    assert ws.latest("sleeper") is None


# ------------------------------------------------------------------ 21. BOM
def test_a_pipeline_file_with_a_utf8_bom_is_accepted(ws):
    """Before: "Invalid statement (line 1, column 1)", exit 3."""
    (ws.root / "eagle3.toml").write_bytes(b"\xef\xbb\xbf" + SLEEPER.encode())
    proc = ws.call("status", "--json", "--no-gpus")
    assert proc.returncode == 0, proc.stderr
    assert [s["name"] for s in json.loads(proc.stdout)["stages"]] == ["sleeper"]


# ------------------------------------------------------------------ 15. halving at 1, a batch of 0
OOM_STAGE = """
[stages.oom]
argv = ["python", "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB'); sys.exit(1)", "{bs}"]
params = { bs = 1 }
batch_param = "bs"
"""


def test_halve_batch_at_1_is_refused_saying_it_cannot_halve(ws):
    """Before: "bs: 1 -> 1 (halved)" and the same failing run started again."""
    ws.write(OOM_STAGE)
    ws.cli("run", "oom", check=0)
    failed = ws.wait_status("oom", ("failed",))
    proc = ws.cli("restart", "oom", "--halve-batch", "--yes")
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "cannot halve bs" in proc.stdout + proc.stderr and "below 1" in proc.stdout + proc.stderr
    assert "1 -> 1" not in proc.stdout
    assert ws.latest("oom").id == failed.id


def test_halve_batch_above_1_still_halves(ws):
    ws.write(OOM_STAGE.replace("bs = 1", "bs = 3"))
    ws.cli("run", "oom", check=0)
    ws.wait_status("oom", ("failed",))
    proc = ws.cli("restart", "oom", "--halve-batch", "--yes", check=0)
    assert "bs: 3 -> 1 (halved after the OOM)" in proc.stdout
    assert ws.latest("oom").params["bs"] == 1


@pytest.mark.parametrize("value", ["0", "-4", "0.5", "nan"])
def test_a_batch_param_below_1_is_refused_exit_3(ws, value):
    """Before: `--set bs=0` accepted; then "0 -> 1 (halved)"."""
    ws.write(OOM_STAGE.replace("bs = 1", "bs = 2.0" if value in ("0.5", "nan") else "bs = 2"))
    for args in (("run", "oom", "--set", f"bs={value}"), ("restart", "oom", "--set", f"bs={value}", "--yes")):
        proc = ws.call(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stderr)
        assert "bs" in proc.stderr and "at least 1" in proc.stderr and "Traceback" not in proc.stderr
    assert ws.latest("oom") is None


# ------------------------------------------------------------------ 18. a finished run's log gone
@pytest.mark.parametrize("how", ["deleted", "rotated"])
def test_logs_of_a_run_whose_log_is_gone_says_so_exit_2(ws, how):
    """Before: `logs STAGE` exit 0, printing nothing."""
    ws.write(SLEEPER)
    ws.cli("run", "sleeper", "--set", "seconds=0.1", check=0)
    run = ws.wait_status("sleeper", ("succeeded",))
    log = ws.root / ".eagle3" / "logs" / os.path.basename(run.log_path)
    if how == "deleted":
        log.unlink()
    else:
        log.rename(log.with_name(log.name + ".1"))
    for args in (("logs", "sleeper"), ("logs", "sleeper", "-f"), ("logs", "sleeper", "--run", str(run.id))):
        proc = ws.cli(*args, timeout=20)
        assert proc.returncode == 2, (args, proc.returncode, proc.stdout, proc.stderr)
        assert f"the log of run {run.id} (sleeper) is gone: {log}" in proc.stderr
        if how == "rotated":
            assert log.name + ".1" in proc.stderr


# ------------------------------------------------------------------ 23. lost: CRITICAL, as README says
def test_a_lost_run_whose_processes_are_gone_is_critical_exit_2(ws):
    """Before: exit 1 (WARNING); README's table: a lost stage is CRITICAL (2)."""
    from eagle3_console.monitor.procs import process_alive
    ws.write(SLEEPER)
    ws.cli("run", "sleeper", check=0)
    run = ws.wait_status("sleeper", ("running",))
    os.kill(run.supervisor_pid, signal.SIGKILL)
    os.killpg(run.pgid, signal.SIGKILL)
    wait_for(lambda: not process_alive(run.pid, run.create_time)
             and not process_alive(run.supervisor_pid, run.supervisor_create_time))
    proc = ws.call("status", "--json", "--no-gpus")
    snap = json.loads(proc.stdout)
    assert snap["stages"][0]["status"] == "lost"
    alert = next(a for a in snap["alerts"] if a["code"] == "lost")
    assert alert["level"] == "critical" and proc.returncode == 2, (alert, proc.returncode)
    assert ws.call("status", "--no-gpus").returncode == 2
    assert ws.cli("watch", "--once", "--no-gpus").returncode == 2


def test_stopping_a_lost_run_records_it_killed_not_lost(ws):
    """The operator ended it: that is "killed" (exit 0 from status), not a loss still to be looked into."""
    from eagle3_console.monitor.procs import process_alive
    ws.write(SLEEPER)
    ws.cli("run", "sleeper", check=0)
    run = ws.wait_status("sleeper", ("running",))
    os.kill(run.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not process_alive(run.supervisor_pid, run.supervisor_create_time))
    assert ws.call("status", "--json", "--no-gpus").returncode == 2     # lost, its stage still running
    proc = ws.cli("stop", "sleeper", "--grace", "5", check=0)
    assert f"run {run.id} of sleeper: killed" in proc.stdout
    r = ws.latest("sleeper")
    assert r.status == "killed" and "supervisor was lost" in r.reason
    assert ws.call("status", "--json", "--no-gpus").returncode == 0


SHARE_PIPELINE = extract_pipeline(', engine = "sglang", mem_fraction_static = 0.9', 'batch_param = "mem_fraction_static"\n')


def test_halve_batch_halves_a_memory_share(ws):
    """Issue 22's fault: SGLang's mem_fraction_static too large leaves a forward's
    activations no memory. Declared as the batch_param, it was refused before
    ("0.9, and a batch cannot be halved below 1"): the share is halved."""
    from eagle3_console.actions import plan_restart
    from eagle3_console.kernel.workspace import Workspace
    ws.write(SHARE_PIPELINE)
    (ws.root / "models" / "target").mkdir(parents=True)      # run refuses a target that is not there
    run = ws.record_finished_run("extract", {"input": "data/prepared", "output": "data/hs", "engine": "sglang",
                                             "mem_fraction_static": 0.9})
    Path(run.log_path).write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    plan = plan_restart(Workspace.at(ws.root), "extract", ws.seen("extract"), halve_batch=True, ignore_disk=True)
    assert plan.refusal is None, plan.refusal
    assert plan.halved == ("mem_fraction_static", 0.9, 0.45), plan
    assert plan.argv[plan.argv.index("--mem-fraction-static") + 1] == "0.45"
    assert "mem_fraction_static: 0.9 -> 0.45 (halved after the OOM)" in plan.lines()


def test_watch_policy_halves_a_memory_share_after_an_oom(ws):
    """The same share through watch's restart policy: before, "not halvable"
    (the policy's own check wanted > 1) and no restart at all."""
    ws.write(SHARE_PIPELINE)
    (ws.root / "models" / "target").mkdir(parents=True)      # run refuses a target that is not there
    params = {"input": "data/prepared", "output": "data/hs", "engine": "sglang", "mem_fraction_static": 0.9}
    (ws.root / "data" / "prepared").mkdir(parents=True)     # the input the restart is checked for
    run = ws.record_finished_run("extract", params)
    Path(run.log_path).write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    proc = ws.cli("watch", "--once", "--no-gpus", check=0)
    assert "with mem_fraction_static 0.9 -> 0.45" in proc.stdout, (proc.stdout, proc.stderr)
    new = ws.latest("extract")
    assert new.id != run.id and new.restart_of == run.id and new.params["mem_fraction_static"] == 0.45


def test_halve_batch_halves_an_op_stages_default_batch(ws):
    """An extract stage whose pipeline leaves token_budget at its default
    (16384, its Param's): the OOM'd run's restart with --halve-batch halved
    nothing before and started the same failing budget again."""
    from eagle3_console.actions import plan_restart
    from eagle3_console.kernel.workspace import Workspace
    from ops.extract.spec import SPEC
    ws.write(extract_pipeline(""))
    (ws.root / "models" / "target").mkdir(parents=True)      # run refuses a target that is not there
    run = ws.record_finished_run("extract", {"input": "data/prepared", "output": "data/hs"})
    Path(run.log_path).write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    default = SPEC.params["token_budget"]
    plan = plan_restart(Workspace.at(ws.root), "extract", ws.seen("extract"), halve_batch=True, ignore_disk=True)
    assert plan.oom_line and plan.refusal is None, plan
    assert plan.halved == ("token_budget", default, default // 2), plan
    assert plan.params["token_budget"] == default // 2
    i = plan.argv.index("--token-budget")
    assert plan.argv[i + 1] == str(default // 2)


def test_restart_and_watch_decide_out_of_memory_alike(ws):
    """Out of memory is decided once, by the snapshot: an OOM line 20 MiB before a
    log's end lies outside what the snapshot scans for signatures (16 MiB), so
    status raises no oom alert and watch halves nothing, and restart --halve-batch
    must not halve on a deeper read of its own (before, it read 64 MiB and halved)."""
    ws.write(extract_pipeline(""))
    (ws.root / "models" / "target").mkdir(parents=True)      # run refuses a target that is not there
    run = ws.record_finished_run("extract", {"input": "data/prepared", "output": "data/hs"})
    with open(run.log_path, "w") as log:
        log.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
        log.write(("step ok, nothing to see here\n" * 1000) * 720)      # ~20 MiB after it
    status = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    assert not any(a["code"] == "oom" for a in status["alerts"]), status["alerts"]
    proc = ws.cli("restart", "extract", "--halve-batch", "--ignore-disk")
    assert "halved after the OOM" not in proc.stdout, proc.stdout
    assert "did not run out of memory" in proc.stdout + proc.stderr, (proc.stdout, proc.stderr)
