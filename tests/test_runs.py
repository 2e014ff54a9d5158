"""Runs survive their launcher, a hung-up terminal and a killed console;
a vanished supervisor shows as lost; refusals and stop work. Real processes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from eagle3_console.monitor.procs import process_alive
from tests.conftest import PY, stage_cmd, wait_for


def pipeline(extra: str = "", until: Path | None = None) -> str:
    """`until`: slow also ends as soon as this file exists (the test says when)."""
    gate = ("--until", str(until)) if until else ()
    return f"""
[stages.slow]
argv = {stage_cmd("sleeper.py", *gate, "--seconds", "{seconds}")}
params = {{ seconds = 3.0 }}

[stages.quick]
argv = {stage_cmd("progress.py", "--n", "5", "--sleep", "0.01")}
depends_on = ["slow"]

[stages.fails]
argv = {stage_cmd("progress.py", "--n", "3", "--sleep", "0.01", "--exit", "4")}
{extra}
"""


def test_run_outlives_the_cli_and_is_recorded(ws):
    # The stage lives until `go` (after the checks of its process), not a fixed 1.5 s.
    go = ws.root / "go"
    ws.write(pipeline(until=go))
    proc = ws.cli("run", "slow", "--set", "seconds=60", check=0)
    assert "run 1 of slow: running" in proc.stdout
    run = ws.latest("slow")
    assert run.argv[-1] == "60" and run.pid and run.pgid == run.pid
    assert os.getpgid(run.pid) == run.pid and os.getsid(run.pid) != os.getsid(0)
    go.touch()
    done = ws.wait_status("slow", ("succeeded",), timeout=30)
    assert done.exit_code == 0 and done.ended >= done.started
    log = open(done.log_path).read()
    assert "sleeping" in log and "done" in log and "succeeded" in log


def test_run_survives_sighup_of_its_terminal_session(ws):
    """Launch from a shell in its own session (a stand-in for an SSH/tmux
    terminal), then SIGHUP that whole session as a dropped terminal does."""
    go = ws.root / "go"         # the stage lives until the test has seen it alive
    ws.write(pipeline(until=go))
    # A terminal's shell dies of SIGHUP: reset what this test process may have
    # inherited (under nohup, SIGHUP is ignored and would make this test moot).
    shell = subprocess.Popen(
        ["bash", "-c", f"{PY} -m eagle3_console.cli -w {ws.root} run slow --set seconds=60; sleep 30"],
        start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    run = wait_for(lambda: (r := ws.latest("slow")) and r.status == "running" and r)
    os.killpg(shell.pid, signal.SIGHUP)
    shell.wait(timeout=10)
    assert process_alive(run.pid, run.create_time)
    go.touch()
    done = ws.wait_status("slow", ("succeeded",), timeout=30)
    assert done.exit_code == 0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_run_survives_kill_of_tmux_session(ws):
    go = ws.root / "go"         # the stage lives until the test has seen it alive
    ws.write(pipeline(until=go))
    name = f"e3test{os.getpid()}"
    sock = str(ws.root / "tmux.sock")
    subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", name,
                    f"{PY} -m eagle3_console.cli -w {ws.root} run slow --set seconds=60; sleep 60"], check=True)
    try:
        run = wait_for(lambda: (r := ws.latest("slow")) and r.status == "running" and r)
    finally:
        subprocess.run(["tmux", "-S", sock, "kill-server"], check=False)
    assert process_alive(run.pid, run.create_time)
    go.touch()
    assert ws.wait_status("slow", ("succeeded",), timeout=30).exit_code == 0


def test_run_survives_console_killed_with_sigkill(ws):
    """A long-lived console process (here: `logs -f`) launched the run; kill -9 it."""
    go = ws.root / "go"         # the stage lives until the test has seen it alive
    ws.write(pipeline(until=go))
    console = subprocess.Popen(
        ["bash", "-c", f"{PY} -m eagle3_console.cli -w {ws.root} run slow --set seconds=60 && "
                       f"exec {PY} -m eagle3_console.cli -w {ws.root} logs slow -f"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = wait_for(lambda: (r := ws.latest("slow")) and r.status == "running" and r)
    time.sleep(0.3)
    console.kill()
    console.wait()
    assert process_alive(run.pid, run.create_time)
    go.touch()
    assert ws.wait_status("slow", ("succeeded",), timeout=30).exit_code == 0


def test_supervisor_killed_shows_lost_and_stage_still_watched(ws):
    ws.write(pipeline())
    ws.cli("run", "slow", "--set", "seconds=30", check=0)
    run = ws.latest("slow")
    os.kill(run.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not process_alive(run.supervisor_pid, run.supervisor_create_time))
    proc = ws.call("runs", "slow")
    assert "lost" in proc.stdout
    lost = ws.latest("slow")
    assert lost.status == "lost" and process_alive(lost.pid, lost.create_time)
    # The stage still lives: a second run is refused, stop still reaches it.
    again = ws.cli("run", "slow")
    assert again.returncode == 2 and "already has a live run" in again.stderr
    status = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    alert = next(a for a in status["alerts"] if a["code"] == "lost")
    assert alert["level"] == "critical" and "still watched" in alert["message"]
    ws.cli("stop", "slow", "--grace", "2", check=0)
    wait_for(lambda: not process_alive(lost.pid, lost.create_time))
    # Stopped: nothing of it runs any more, and saying "still watched" at CRITICAL would be false;
    # the operator ended it, so it is killed (issue 19 item 23: a lost run is CRITICAL).
    proc = ws.call("status", "--json", "--no-gpus")
    assert not [a for a in json.loads(proc.stdout)["alerts"] if a["code"] == "lost"] and proc.returncode == 0
    assert ws.latest("slow").status == "killed"


def test_failed_exit_code_recorded(ws):
    ws.write(pipeline())
    ws.cli("run", "fails", check=0)
    r = ws.wait_status("fails", ("failed",))
    assert r.exit_code == 4 and r.signal is None


def test_refuses_unmet_dependency_unless_forced(ws):
    ws.write(pipeline())
    proc = ws.cli("run", "quick")
    assert proc.returncode == 2 and "depends on 'slow'" in proc.stderr and "never ran" in proc.stderr
    ws.cli("run", "quick", "--force", check=0)
    assert ws.wait_status("quick", ("succeeded",)).exit_code == 0


def test_refuses_second_live_run(ws):
    ws.write(pipeline())
    ws.cli("run", "slow", "--set", "seconds=20", check=0)
    proc = ws.cli("run", "slow", "--force")
    assert proc.returncode == 2 and "already has a live run" in proc.stderr
    ws.cli("stop", "slow", "--grace", "2", check=0)


def test_stop_escalates_to_sigkill_after_grace(ws):
    ws.write(pipeline().replace('"--seconds", "{seconds}"', '"--seconds", "{seconds}", "--ignore-term"'))
    ws.cli("run", "slow", "--set", "seconds=60", check=0)
    run = ws.latest("slow")
    t0 = time.time()
    proc = ws.cli("stop", "slow", "--grace", "1", check=0)
    assert "killed" in proc.stdout
    r = ws.latest("slow")
    assert r.status == "killed" and r.signal == signal.SIGKILL
    assert not process_alive(run.pid, run.create_time)
    with ws.registry() as reg:
        ev = reg.events("slow")
    assert any(e.action == "stop" and "SIGKILL" in e.outcome for e in ev)
    assert time.time() - t0 >= 1


def test_a_stage_that_exits_0_on_stop_is_recorded_killed_not_succeeded(ws):
    # Its work is unfinished: `succeeded` would let a dependent stage start on it.
    ws.write(pipeline().replace('"--seconds", "{seconds}"', '"--seconds", "{seconds}", "--term-exit", "0"'))
    ws.cli("run", "slow", "--set", "seconds=60", check=0)
    ws.wait_status("slow", ("running",))
    wait_for(lambda: "sleeping" in open(ws.latest("slow").log_path).read())
    ws.cli("stop", "slow", "--grace", "5", check=0)
    r = ws.latest("slow")
    assert r.status == "killed" and r.exit_code == 0 and "stopped" in r.reason, (r.status, r.reason)
    assert "caught SIGTERM" in open(r.log_path).read()
    proc = ws.cli("run", "quick")
    assert proc.returncode == 2 and "depends on 'slow'" in proc.stderr


def test_unknown_stage_and_bad_set(ws):
    ws.write(pipeline())
    assert ws.cli("run", "nosuch").returncode == 3
    assert ws.cli("run", "slow", "--set", "oops").returncode == 3


def test_unknown_stage_or_run_is_bad_input_for_every_command(ws):
    # README: bad input exits 3 with a clear error, never a traceback (exit 1).
    ws.write(pipeline())
    for cmd in ("stop", "kill-workers", "clean", "restart", "logs"):
        proc = ws.cli(cmd, "nosuch")
        assert proc.returncode == 3 and "stages.nosuch: no such stage" in proc.stderr, (cmd, proc.stderr)
        assert "Traceback" not in proc.stderr
    proc = ws.cli("logs", "slow", "--run", "99")
    assert proc.returncode == 3 and "no run 99" in proc.stderr, proc.stderr


def test_stop_of_a_pending_run_keeps_its_stage_from_starting(ws):
    # `stop` lands while the supervisor is still starting (no pid to signal yet).
    import threading

    from eagle3_console import runs
    from eagle3_console.kernel.workspace import Workspace
    marker = ws.root / "started"
    w = Workspace(ws.root)
    w.ensure_state()
    argv = [PY, "-c", f"open('{marker}', 'w').write('1'); import time; time.sleep(20)"]
    with ws.registry() as reg:
        run = reg.create_run("late", argv, {}, {}, str(ws.root), lambda rid: w.log_path(rid, "late"))
    stopped = {}
    t = threading.Thread(target=lambda: stopped.update(run=runs.stop(w, "late", grace_s=1)))
    t.start()
    try:
        wait_for(lambda: ws.latest("late").stop_requested)
        from eagle3_console.runs.handoff import Handoff
        subprocess.run([PY, "-m", "eagle3_console.runs.supervise", str(ws.root), str(run.id),
                        Handoff([], False).to_arg()], check=True,
                       start_new_session=True, cwd=str(ws.root))
        t.join(30)
        assert stopped["run"].status == "killed"
        # The supervisor logs this line before it records the end: it never started the stage.
        assert "stopped before it started" in open(run.log_path).read()
        assert not marker.exists() and ws.latest("late").pid is None
    finally:
        r = ws.latest("late")
        if r.pgid and runs.stage_alive(r):
            os.killpg(r.pgid, signal.SIGKILL)


def test_set_output_into_another_stages_output_is_refused_with_exit_3(ws):
    # The pipeline file's separate-roots rule also holds for what --set gives.
    ws.write(pipeline() + """
[stages.keeper]
argv = ["python", "-c", "pass"]
outputs = ["out/keep"]

[stages.prep]
op = "prepare"
params = { input = "in.jsonl", output = "out/prep", tokenizer = "tok" }
""")
    for output in ("out/keep/sub", "out/x/../keep/sub"):
        proc = ws.cli("run", "prep", "--force", "--set", f"output={output}")
        assert proc.returncode == 3, (proc.stdout, proc.stderr)
        assert "overlaps stage 'keeper'" in proc.stderr and "out/keep" in proc.stderr
    with ws.registry() as reg:
        assert reg.latest("prep") is None
    # restart plans the same refusal before any kill is planned (a kill then a refusal would
    # leave the stage dead and not restarted).
    from eagle3_console.actions import plan_restart
    from eagle3_console.kernel.workspace import Workspace
    plan = plan_restart(Workspace.at(ws.root), "prep", None, overrides={"output": "out/keep/sub"}, kill=True)
    assert plan.refusal and "overlaps stage 'keeper'" in plan.refusal and plan.kill is None


def test_a_set_of_the_wrong_type_is_refused_before_anything_starts(ws):
    # bench's argparse would refuse `abc` only inside the run, and restart would carry it on.
    ws.write(pipeline() + """
[stages.bench]
op = "bench"
params = { drafter = "runs/export", output = "runs/bench" }
""")
    proc = ws.cli("run", "bench", "--force", "--set", "num_prompts=abc")
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "stages.bench: param num_prompts: expected an integer (default 8), got 'abc'" in proc.stderr
    with ws.registry() as reg:
        assert reg.latest("bench") is None
    # The same mistake in the pipeline file names the file and the key; a quoted
    # number is fine (the argv carries text), as is an int for a float.
    ws.write(pipeline() + """
[stages.bench]
op = "bench"
params = { drafter = "runs/export", output = "runs/bench", num_prompts = "eight" }
""")
    proc = ws.call("status")
    assert proc.returncode == 3 and "stages.bench.params.num_prompts: expected an integer" in proc.stderr, proc.stderr
    ws.write(pipeline() + """
[stages.bench]
op = "bench"
params = { drafter = "runs/export", output = "runs/bench", num_prompts = "8" }
""")
    assert ws.call("status").returncode == 0
    from ops.spec import value_type_error
    assert value_type_error(1e-4, 3) is None and value_type_error(1e-4, ".001") is None
    assert value_type_error(8, 8.0) is not None and value_type_error(False, "true") is not None


def test_a_custom_stage_takes_only_its_declared_params(ws):
    ws.write(pipeline())
    proc = ws.cli("run", "slow", "--set", "nosuch=1")
    assert proc.returncode == 3 and "stages.slow: no param(s) ['nosuch']; it takes ['seconds']" in proc.stderr
    with ws.registry() as reg:
        assert reg.latest("slow") is None


def test_logs_of_a_recorded_run_survive_a_broken_pipeline_file(ws):
    ws.write(pipeline())
    ws.cli("run", "quick", "--force", check=0)
    ws.wait_status("quick", ("succeeded",))
    (ws.root / "eagle3.toml").write_text("[stages.quick\n")        # broken since
    proc = ws.cli("logs", "quick", "-n", "3")
    assert proc.returncode == 0 and "succeeded" in proc.stdout, (proc.stdout, proc.stderr)


def test_a_launch_past_the_disk_check_passes_force_to_an_op_that_checks_again(ws):
    # extract repeats the disk preflight itself; a `run --ignore-disk` past the console's check
    # that did not reach it would be refused again at once ("pass --force"). `--force` alone
    # overrides the dependencies only (issue 20).
    ws.write("""
[target]
path = "models/target"
hidden_size = 7168
dtype = "bfloat16"
""" + pipeline() + """
[stages.extract]
op = "extract"
params = { input = "data/prep", output = "data/hs", tokens = 1000000000000000 }
""")
    (ws.root / "data" / "prep").mkdir(parents=True)  # the input exists: only the disk refuses
    (ws.root / "models" / "target").mkdir(parents=True)      # an empty target folder (run refuses none)
    ws.call("run", "extract", check=2)                 # the console's own disk check
    ws.call("run", "extract", "--force", check=2)
    ws.cli("run", "extract", "--ignore-disk", check=0)
    run = ws.wait_status("extract", ("failed", "succeeded"))
    assert "--force" in run.argv
    # Past its own disk check too: it fails on what is missing here (the target's files), not on the disk.
    log = Path(run.log_path).read_text()
    assert run.status == "failed" and "pass --force" not in log, log[-2000:]
    assert "extract: error: target models/target" in log, log[-2000:]
    assert "force" not in run.params                  # a later restart is forced only when asked
