"""Fault injection, issue 28: the run registry under a busy state.db and the
end of a run racing its record, with real supervisors, signals and a second
process holding a real SQLite write transaction (items 14, 26). Each test
failed on the main branch it was written against."""

from __future__ import annotations

import json
import os
import signal
import subprocess

from eagle3_console.monitor.procs import process_alive
from tests.conftest import PY, stage_cmd, wait_for

SLOW = f"""
[stages.slow]
argv = {stage_cmd("sleeper.py", "--seconds", "60")}

[stages.short]
argv = {stage_cmd("sleeper.py", "--seconds", "1")}
"""


def _env() -> dict:
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    return e


# ------------------------------------------------------------------ 14. kill-workers returns once the end is recorded
def test_restart_kill_is_not_refused_when_the_supervisor_is_slow_to_record(ws):
    """The race of test_actions.py::test_restart_refused_while_alive_then_with_kill
    under load, held open: the supervisor stopped (kill -STOP) while the stage is
    killed, so it cannot record the end until continued. Before: kill-workers
    returned at once and the launch refused "already has a live run" (exit 2)."""
    ws.write(SLOW)
    ws.cli("run", "slow", check=0)
    first = ws.wait_status("slow", ("running",))
    os.kill(first.supervisor_pid, signal.SIGSTOP)
    try:
        proc = ws.cli("restart", "slow", "--kill", "--yes")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        assert not process_alive(first.pid, first.create_time)
        with ws.registry() as reg:
            ended = reg.get(first.id)
        assert ended.status == "killed" and ended.ended is not None, ended
        new = ws.latest("slow")
        assert new.id != first.id and new.restart_of == first.id and new.status == "running"
    finally:
        if process_alive(first.supervisor_pid, first.supervisor_create_time):
            os.kill(first.supervisor_pid, signal.SIGCONT)
        ws.cli("stop", "slow", "--grace", "1")


def test_kill_workers_returns_with_the_end_recorded(ws):
    """Repeated, unloaded (this one passes on main too, where the supervisor
    is quick: the test above holds the window open): each time kill-workers
    returns, the registry already says the run ended, in the supervisor's own
    record, not one guessed beside it."""
    ws.write(SLOW)
    for _ in range(3):
        ws.cli("run", "slow", check=0)
        run = ws.wait_status("slow", ("running",))
        proc = ws.cli("kill-workers", "slow", "--yes", "--grace", "2", "--wait", "1")
        assert proc.returncode == 0, (proc.stdout, proc.stderr)
        with ws.registry() as reg:
            after = reg.get(run.id)
        assert not after.live and after.status == "killed", after
        assert after.reason == "stopped", after.reason      # written by the supervisor that reaped it


# ------------------------------------------------------------------ 26. another process holds state.db busy
HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


def _hold(ws, seconds: float) -> subprocess.Popen:
    holder = subprocess.Popen([PY, "-c", HOLDER, str(ws.root / ".eagle3" / "state.db"), str(seconds)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_status_reads_the_exit_record_while_the_registry_is_busy(ws):
    """Before: a short run that exited 0 under a 30 s write transaction held by
    another process showed "running", health OK, until the holder let go."""
    # The stage ends when the file `go` exists, only once the hold is taken: ended before it,
    # the supervisor would record it in state.db and delete the exit record this test reads.
    go = ws.root / "go"
    ws.write(f"""
[stages.short]
argv = {stage_cmd("sleeper.py", "--seconds", "120", "--until", str(go))}
""")
    ws.cli("run", "short", check=0)
    run = ws.wait_status("short", ("running",))
    holder = _hold(ws, 60)
    try:
        go.touch()
        from eagle3_console.kernel import exitrecord
        wait_for(lambda: exitrecord.read(run.log_path), timeout=30)      # the supervisor saw the end
        proc = ws.call("status", "--json", "--no-gpus", timeout=60)
        snap = json.loads(proc.stdout)
        short = next(s for s in snap["stages"] if s["name"] == "short")
        assert short["status"] == "succeeded" and short["exit_code"] == 0, short
        assert proc.returncode == 0, (proc.returncode, proc.stderr)
    finally:
        holder.kill()
        holder.wait()
    done = ws.wait_status("short", ("succeeded",), timeout=90)      # the supervisor's own record, once free
    assert done.exit_code == 0


def test_a_busy_registry_is_said_with_its_holder_and_bounded(ws):
    """Before: `run` and `stop` blocked 25-28 s without a word, then "database is locked"."""
    ws.write(SLOW)
    ws.cli("run", "slow", check=0)
    ws.wait_status("slow", ("running",))
    holder = _hold(ws, 120)
    try:
        cmds = [subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), *args], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=_env(), cwd=str(ws.root))
                for args in (("run", "short"), ("stop", "slow", "--grace", "1"))]
        results = [p.communicate(timeout=90) + (p.returncode,) for p in cmds]
        for _out, err, rc in results:
            assert rc == 3, (rc, err)
            assert "Traceback" not in err, err
            lines = err.strip().splitlines()
            assert lines[0].startswith(f"state database {ws.root / '.eagle3' / 'state.db'} is busy: "
                                       f"a write transaction held by pid {holder.pid} "), lines
            assert "waiting up to 10 s" in lines[0]
            assert lines[-1].startswith("error: state database ") and f"held by pid {holder.pid}" in lines[-1], lines
    finally:
        holder.kill()
        holder.wait()
    assert ws.latest("short") is None
    ws.cli("stop", "slow", "--grace", "1", check=0)       # free again: the registry answers at once
    assert ws.latest("slow").status == "killed"
