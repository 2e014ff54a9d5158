"""Fault battery 4 (issue 37), the Slurm items, on a real one-node Slurm
(tests/slurm_cluster.py): sbatch refusing the job (M3), the controller down
while a job runs (Q38) and a stop refused meanwhile (Q39). Real slurmctld,
slurmd, munged, sbatch, scancel; the controller is killed and started again
by the test (and started again whatever happens, for the tests after it).
Each test failed on the main branch it was written against (961f033)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import PY, wait_for
from tests.procs import alive
from tests.slurm_cluster import Cluster, _daemon, why_not


@pytest.fixture
def own_slurm(tmp_path_factory):
    """A one-node Slurm of this test's own: it kills and restarts the controller, which the
    session's cluster (shared by the other Slurm tests) must never see."""
    why = why_not()
    if why:
        pytest.skip(why)
    cluster = Cluster(tmp_path_factory.mktemp("own-slurm"))
    old = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        cluster.stop()
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old

# A job that prints a line, then waits for a file (the node is this machine) and exits 0.
WAITER = r"""
import os, sys, time
print("job up", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("job done", flush=True)
"""


def _status(ws) -> tuple[int, dict, str]:
    js = ws.call("status", "--json", "--no-gpus")
    text = ws.call("status", "--no-gpus")
    return js.returncode, json.loads(js.stdout), text.stdout


def _stage(snap: dict, name: str) -> dict:
    return next(s for s in snap["stages"] if s["name"] == name)


@pytest.mark.usefixtures("slurm")
def test_a_job_sbatch_refuses_fails_the_run_with_its_cause_everywhere(ws):
    """Before: `run` exited 0 ('failed, slurm job (being submitted)'), status said
    `job: being submitted` for the failed run and its CRITICAL alert had no cause."""
    ws.write('[stages.j]\nargv = ["true"]\nlauncher = "slurm"\nslurm = { partition = "nosuchpart" }\n')
    run = ws.cli("run", "j")
    said = run.stdout + run.stderr
    assert run.returncode == 2, said
    assert "sbatch refused the job: " in said and "being submitted" not in said, said
    r = ws.latest("j")
    assert r.status == "failed" and r.reason.startswith("sbatch refused the job: "), r
    code, snap, text = _status(ws)
    assert code == 2
    assert "j: job: not submitted (sbatch refused the job: " in text, text
    assert "being submitted" not in text, text
    alert = next(a for a in _stage(snap, "j")["alerts"] if a["code"] == "stage_failed")
    assert alert["line"] and "sbatch refused the job: " in alert["line"], alert
    # The readable status puts it under the alert.
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("CRITICAL") and "j failed" in ln)
    assert "sbatch refused the job" in lines[at + 1], lines[at:at + 2]


def _controller_pid(slurm) -> int | None:
    try:
        return int((slurm.root / "slurmctld.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int | None) -> bool:
    return pid is not None and alive(pid)


def _start_controller(slurm) -> None:
    if not _alive(_controller_pid(slurm)):
        slurm.run(_daemon("slurmctld"), "-f", str(slurm.conf))
    wait_for(lambda: slurm.run("scontrol", "ping", check=False).returncode == 0, timeout=60, poll=0.5)


def test_controller_down_warns_and_a_refused_stop_leaves_no_stop_behind(ws, own_slurm, tmp_path):
    """Q38 before: with slurmctld down, status said OK / RUNNING, no alert.
    Q39 before: a stop refused meanwhile left its request behind: the job that
    then ran to completion was recorded killed ('stopped (the job completed after the stop)')."""
    slurm = own_slurm
    script, finish = tmp_path / "waiter.py", tmp_path / "finish"
    script.write_text(WAITER)
    ws.write(f'[stages.j]\nargv = ["{PY}", "{script}", "{finish}"]\nlauncher = "slurm"\n'
             f'slurm = {{ partition = "e3part" }}\n')
    try:
        ws.cli("run", "j", check=0)
        run = ws.wait_status("j", ("running",), timeout=60)
        wait_for(lambda: "job up" in Path(run.log_path).read_text(), timeout=60)
        code, snap, _text = _status(ws)
        assert code == 0 and not _stage(snap, "j")["alerts"], snap
        pid = _controller_pid(slurm)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not _alive(pid), timeout=30)

        def warned():
            c, s, t = _status(ws)
            found = [a for a in _stage(s, "j")["alerts"] if a["code"] == "slurm_unreachable"]
            return (c, s, t, found[0]) if found else None
        code, snap, text, alert = wait_for(warned, timeout=90, poll=1)
        assert code == 1 and snap["health"] == "warning", (code, snap["health"])
        assert alert["level"] == "warning" and "does not answer" in alert["message"], alert
        assert "last seen" in alert["message"], alert
        assert "Slurm did not answer" in text and "WARNING" in text, text

        stop = ws.cli("stop", "j", "--grace", "2", timeout=180)
        assert stop.returncode == 2 and "Slurm did not answer" in stop.stderr, (stop.stdout, stop.stderr)
        assert ws.latest("j").stop_requested == 0, "the refused stop left its request behind"
        stops = [e for e in json.loads(ws.cli("events", "--json").stdout) if e["action"] == "stop"]
        assert stops and "withdrawn" in (stops[0]["detail"] or ""), stops

        _start_controller(slurm)
        finish.write_text("")
        done = ws.wait_status("j", ("succeeded", "failed", "killed", "lost"), timeout=120)
        assert done.status == "succeeded", done
        code, snap, _text = _status(ws)
        assert not any(a["code"] == "slurm_unreachable" for a in snap["alerts"]), snap["alerts"]
    finally:
        _start_controller(slurm)
        finish.write_text("")
        r = ws.latest("j")
        if r is not None and r.job_id:
            slurm.run("scancel", r.job_id, check=False)
