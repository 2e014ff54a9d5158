"""Stages as jobs of a real one-node Slurm (tests/slurm_cluster.py): submitted
by the supervisor, followed through scontrol, ended from outside (scancel, a
node set down, a time limit) and each end shown right in the run, status and
the audit log; stop and kill-workers through scancel; a job that outlives its
supervisor. Real slurmctld, slurmd, munged, sbatch, srun; no doubles."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from eagle3_console.monitor.procs import process_alive
from tests.conftest import stage_cmd, wait_for

pytestmark = pytest.mark.usefixtures("slurm", "time_limited_job")


def pipeline(seconds: float = 60, slurm: str = "", *extra: str) -> str:
    return f"""
[stages.job]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}", *extra)}
params = {{ seconds = {seconds} }}
launcher = "slurm"
slurm = {{ {slurm} }}
"""


@pytest.fixture(scope="module")
def time_limited_job(slurm, tmp_path_factory):
    """A job with a limit of one minute (Slurm's smallest), started with the module in a
    workspace of its own: (ws, run). It sleeps 300 s, so only the limit ends it."""
    from tests.conftest import WS
    ws = WS(tmp_path_factory.mktemp("time-limit"))
    run = running_job(ws, slurm='time_limit = "1"')
    yield ws, run
    if ws.latest("job").live:           # the test failed before the limit ended it
        ws.cli("stop", "job")


def status_json(ws) -> tuple[int, dict]:
    proc = ws.call("status", "--json", "--no-gpus")
    return proc.returncode, json.loads(proc.stdout)


def stage_of(snap: dict, name: str = "job") -> dict:
    return next(s for s in snap["stages"] if s["name"] == name)


def running_job(ws, seconds: float = 300, slurm: str = "", *extra: str):
    ws.write(pipeline(seconds, slurm, *extra))
    ws.cli("run", "job", check=0)
    run = ws.wait_status("job", ("running",), timeout=60)
    assert run.job_id and run.launcher == "slurm"
    wait_for(lambda: "sleeping" in open(run.log_path).read(), timeout=30)
    return run


def test_a_slurm_stage_runs_as_a_job_and_its_end_is_recorded(ws, slurm, tmp_path):
    out = tmp_path / "out"
    ws.write(f"""
[stages.write]
argv = {stage_cmd("writer.py", "--output", str(out), "--n", "3")}
outputs = ["{out}"]
launcher = "slurm"
slurm = {{ time_limit = "5", extra_args = ["--cpus-per-task=1"] }}
""")
    started = ws.cli("run", "write", check=0)
    assert "run 1 of write: pending, slurm job " in started.stdout, started.stdout
    run = ws.wait_status("write", ("succeeded", "failed", "lost"), timeout=60)
    assert run.status == "succeeded", (run, open(run.log_path).read())
    assert run.job_id and run.job_state == "COMPLETED" and run.job_nodes == "e3node" and run.exit_code == 0
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".bin") == ["f0.bin", "f1.bin", "f2.bin"]
    # The batch script is the argv shlex-quoted; sbatch got the slurm params as words.
    log = open(run.log_path).read()
    assert f"submitted as job {run.job_id}" in log and "'--time=5'" in log and "'--cpus-per-task=1'" in log
    assert "--time=5" in slurm.job(run.job_id) or "TimeLimit=00:05:00" in slurm.job(run.job_id)
    assert not (out / ".eagle3-lock").exists()            # the claim was held, then let go
    code, snap = status_json(ws)
    st = stage_of(snap, "write")
    assert code == 0 and st["status"] == "succeeded"
    assert st["job"]["id"] == run.job_id and st["job"]["state"] == "COMPLETED" and st["job"]["nodes"] == "e3node"
    # The job's environment is the run's.
    assert run.argv[0] == "srun"


def test_a_job_cancelled_outside_the_console_is_killed_with_a_warning(ws, slurm):
    run = running_job(ws)
    slurm.run("scancel", run.job_id)
    run = ws.wait_status("job", ("killed", "failed", "lost"), timeout=60)
    assert run.status == "killed" and run.job_state == "CANCELLED"
    assert "not by the console" in run.reason
    code, snap = status_json(ws)
    codes = {a["code"]: a for a in snap["alerts"]}
    assert code == 1 and codes["job_cancelled"]["level"] == "warning", snap["alerts"]


def test_stop_is_scancel_and_waits_until_the_job_has_left(ws, slurm):
    run = running_job(ws)
    proc = ws.cli("stop", "job", check=0)
    assert "killed" in proc.stdout
    run = ws.latest("job")
    assert run.status == "killed" and run.job_state == "CANCELLED" and "stopped" in run.reason
    assert "JobState=CANCELLED" in slurm.job(run.job_id)
    events = json.loads(ws.call("events", "--json", check=0).stdout)
    stop = next(e for e in events if e["action"] == "stop")
    assert stop["targets"] == [run.job_id] and stop["outcome"].startswith("scancel")
    code, snap = status_json(ws)
    assert code == 0 and not [a for a in snap["alerts"] if a["code"] == "job_cancelled"]
    # A second stop has nothing to do (exit 0).
    assert "nothing to do" in ws.cli("stop", "job", check=0).stdout


def test_kill_workers_is_scancel_signal_kill_then_checked(ws, slurm):
    run = running_job(ws)
    plan = ws.cli("kill-workers", "job", check=0)
    assert f"scancel --signal=KILL --full job(s) {run.job_id}" in plan.stdout
    assert ws.latest("job").status == "running"                    # a plan only, without --yes
    ws.cli("kill-workers", "job", "--yes", check=0)
    run = ws.latest("job")
    assert run.status == "killed" and run.job_state == "CANCELLED"
    assert "JobState=CANCELLED" in slurm.job(run.job_id)


def test_a_job_outlives_its_supervisor_and_its_end_is_still_recorded(ws, slurm, tmp_path):
    # The job ends when the test says (the file `go`), not after a fixed 6 s that a loaded
    # machine could spend before the first look.
    go = tmp_path / "go"
    run = running_job(ws, 300, "", "--until", str(go))
    os.kill(run.supervisor_pid, signal.SIGKILL)
    wait_for(lambda: not process_alive(run.supervisor_pid, run.supervisor_create_time))
    code, snap = status_json(ws)
    assert stage_of(snap)["status"] == "running" and stage_of(snap)["job"]["state"] == "RUNNING"
    refused = ws.cli("run", "job")
    assert refused.returncode == 2 and "live run" in refused.stderr       # one live run per stage still
    go.write_text("")
    wait_for(lambda: "JobState=COMPLETED" in slurm.job(run.job_id), timeout=60, poll=0.5)
    code, snap = status_json(ws)
    assert stage_of(snap)["status"] == "succeeded", snap
    assert ws.latest("job").job_state == "COMPLETED"


def test_a_job_unknown_to_slurm_with_no_exit_record_is_lost(ws, slurm):
    run = running_job(ws)
    os.kill(run.supervisor_pid, signal.SIGKILL)
    slurm.run("scancel", run.job_id)
    # The cancelled batch script may still leave its own exit record (its trap on SIGTERM):
    # once the job has left, none is left here, as the test's case says.
    wait_for(lambda: run.job_id not in slurm.run("squeue", "-h", "-o", "%i").stdout.split(), timeout=60, poll=0.2)
    Path(run.log_path.replace(".log", ".job-exit")).unlink(missing_ok=True)
    with ws.registry() as reg:          # as after the controller forgot it (MinJobAge): an id it never had
        reg.update(run.id, job_id="999999")
    code, snap = status_json(ws)
    st = stage_of(snap)
    assert st["status"] == "lost" and "unknown to Slurm" in st["job"]["said"]
    assert code == 2


def test_the_batch_scripts_exit_record_ends_a_run_slurm_has_forgotten(ws, slurm, tmp_path):
    # The job ends when the test says (the file `go`), after its supervisor is gone: a 3 s job
    # could end first, and its supervisor would then record it and take the exit record.
    go = tmp_path / "go"
    run = running_job(ws, 300, "", "--until", str(go))
    try:
        os.kill(run.supervisor_pid, signal.SIGKILL)
        wait_for(lambda: not process_alive(run.supervisor_pid, run.supervisor_create_time))
    finally:
        go.write_text("")
    exit_file = run.log_path.replace(".log", ".job-exit")
    wait_for(lambda: os.path.exists(exit_file), timeout=60, poll=0.2)
    assert json.loads(open(exit_file).read())["exit_code"] == 0
    with ws.registry() as reg:
        reg.update(run.id, job_id="999998")
    code, snap = status_json(ws)
    assert stage_of(snap)["status"] == "succeeded" and "batch script recorded" in stage_of(snap)["job"]["said"]



def test_an_out_of_memory_job_is_the_oom_that_watch_restarts_with_the_batch_halved(ws, slurm):
    """OUT_OF_MEMORY needs cgroup memory enforcement, which this test Slurm has not: the run is
    recorded as its supervisor records that state (jobs.end_of on scontrol's JobState), and the
    restart that follows is a real job."""
    from eagle3_console.runs.slurm.jobs import JobView, end_of
    ws.write(f"""
[stages.job]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 8 }}
batch_param = "seconds"
launcher = "slurm"
""")
    run = ws.record_finished_run("job", {"seconds": 8})
    status, values = end_of(JobView("41", "OUT_OF_MEMORY", "OutOfMemory", "e3node", 0, 9), False, time.time())
    with ws.registry() as reg:
        reg.update(run.id, launcher="slurm", job_id="41", status=status, **values)
    code, snap = status_json(ws)
    codes = {a["code"] for a in snap["alerts"]}
    assert {"oom", "job_oom"} <= codes and code == 2, snap["alerts"]
    proc = ws.cli("watch", "--once", "--no-gpus", check=None)
    assert "with seconds 8 -> 4" in proc.stdout, proc.stdout + proc.stderr
    new = ws.wait_status("job", ("succeeded", "failed"), timeout=60)
    assert new.restart_of == run.id and new.params["seconds"] == 4 and new.job_id and new.status == "succeeded"


def test_a_queued_job_shows_pending_with_slurms_reason_everywhere_and_stops(ws, slurm):
    from tests.test_tui_helpers import make_app, pane_text, run, select, wait_until
    ws.write(pipeline(60, 'extra_args = ["--begin=now+3600"]'))      # held in the queue for an hour
    ws.cli("run", "job", check=0)
    wait_for(lambda: (r := ws.latest("job")).job_id and r.job_reason == "BeginTime", timeout=30, poll=0.2)
    code, snap = status_json(ws)
    st = stage_of(snap)
    assert st["status"] == "pending" and st["job"]["state"] == "PENDING" and st["job"]["reason"] == "BeginTime"
    assert f"job: slurm job {st['job']['id']} PENDING (BeginTime)" in ws.call("status", "--no-gpus").stdout
    from eagle3_console.observe.exporter import families
    from eagle3_console.observe.snapshot import Collector
    from eagle3_console.kernel.workspace import Workspace
    fams = {f.name: f for f in families(Collector(Workspace.at(ws.root), gpus=False).collect())}
    sample = fams["eagle3_stage_job"].samples[0]
    assert sample.labels == {"stage": "job", "job_id": st["job"]["id"], "state": "PENDING", "reason": "BeginTime",
                             "nodes": ""}

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#stages")
            # The row exists once the first snapshot is shown.
            await wait_until(pilot, lambda: any(k.value == "job" for k in table.rows)
                             and "pending (BeginTime)" in str(table.get_row("job")[1]))
            await select(pilot, app, "job")
            await wait_until(pilot, lambda: f"slurm job {st['job']['id']} PENDING (BeginTime)"
                             in pane_text(app, "progress"))
    run(main())
    ws.cli("stop", "job", check=0)
    stopped = ws.latest("job")
    assert stopped.status == "killed" and stopped.job_state == "CANCELLED"


def test_a_jobs_output_is_claimed_while_it_runs(ws, slurm, tmp_path):
    from tests.conftest import WS
    out = tmp_path / "shared-out"
    ws.write(f"""
[stages.write]
argv = {stage_cmd("writer.py", "--output", str(out), "--n", "200", "--every", "0.2")}
outputs = ["{out}"]
launcher = "slurm"
""")
    ws.cli("run", "write", check=0)
    wait_for(lambda: (out / ".eagle3-lock").exists(), timeout=60, poll=0.2)
    other = WS(tmp_path / "other")
    other.root.mkdir()
    other.write(f"""
[stages.write]
argv = {stage_cmd("writer.py", "--output", str(out), "--n", "1")}
outputs = ["{out}"]
""")
    refused = other.cli("run", "write")
    assert refused.returncode == 2 and "is owned by run 1 of stage 'write'" in refused.stderr, refused
    ws.cli("stop", "write", check=0)
    assert not (out / ".eagle3-lock").exists()


def test_racing_launches_of_a_slurm_stage_submit_one_job(ws, slurm):
    import concurrent.futures
    ws.write(pipeline(30))
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        procs = list(pool.map(lambda _i: ws.cli("run", "job"), range(4)))
    assert sorted(p.returncode for p in procs) == [0, 2, 2, 2], [(p.returncode, p.stderr) for p in procs]
    run = ws.wait_status("job", ("running",), timeout=60)
    queued = [line.split() for line in slurm.run("squeue", "-h", "-o", "%j %Z").stdout.splitlines()]
    assert [name for name, workdir in queued if workdir == str(ws.root)] == [f"eagle3-job-r{run.id}"], queued
    with ws.registry() as reg:
        assert len(reg.runs("job")) == 1
    ws.cli("stop", "job", check=0)


# Slurm's smallest time limit is a minute, and its controller looks at the limits every 30 s: the
# job that hits it starts with the module (time_limited_job) and runs beside the tests before this
# one, which then waits only for what is left of its minute. The node set down ends every job on
# the node, so that test comes last.
def test_a_time_limit_hit_fails_the_run_with_timeout(time_limited_job):
    ws, run = time_limited_job
    run = ws.wait_status("job", ("failed", "killed", "lost"), timeout=150)
    assert run.status == "failed" and run.job_state == "TIMEOUT", run
    assert "time limit hit" in run.reason and "00:01:00" in run.reason
    code, snap = status_json(ws)
    assert code == 2 and any(a["code"] == "job_timeout" for a in snap["alerts"]), snap["alerts"]
    assert "DUE TO TIME LIMIT" in open(run.log_path).read()         # the job's own output is the log


def test_a_node_set_down_fails_the_run_with_node_fail(ws, slurm):
    run = running_job(ws)
    try:
        slurm.run("scontrol", "update", "nodename=e3node", "state=down", "reason=eagle3-test")
        run = ws.wait_status("job", ("failed", "killed", "lost"), timeout=60)
    finally:
        if slurm.node_state() not in ("idle", "mix", "alloc"):
            slurm.run("scontrol", "update", "nodename=e3node", "state=resume", check=False)
        slurm.wait_idle()
    assert run.status == "failed" and run.job_state == "NODE_FAIL", run
    assert "node failure" in run.reason and "e3node" in run.reason
    code, snap = status_json(ws)
    alert = next(a for a in snap["alerts"] if a["code"] == "node_fail")
    assert code == 2 and alert["level"] == "critical" and "NODE_FAIL" in alert["message"]
