"""The detached supervisor of one run: `python -m eagle3_console.runs.supervise ROOT RUN_ID HANDOFF`.

Data flow: runs.launch starts this in a new session; it starts the stage in
its own process group, logs to .eagle3/logs/, and records pid, pgid,
create_time and the exit in the registry. It daemonizes (double fork) so that
neither the console nor cron is ever the parent of a stage, and it ignores
SIGHUP so a dropped SSH session or a killed tmux leaves the run alone.
The end survives a full `.eagle3` (exitrecord.py). What it needs of the
stage beyond the run's record (the outputs it claims, a slurm stage's options)
comes from its launch as a Handoff: it never reads the pipeline file, which
may have changed since the launch.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil

from eagle3_console.runs.claims import Claim
from eagle3_console.runs.handoff import Handoff
from eagle3_console.kernel.endclock import mark_end, stamp
from eagle3_console.kernel.exitrecord import ExitRecord
from eagle3_console.kernel.registry import Registry, RunStatus
from eagle3_console.kernel.slurmparams import SLURM
from eagle3_console.kernel.workspace import ENV_REGISTRY, ENV_RUN_ID, ENV_STAGE, ENV_WORKSPACE, Workspace


# How long the supervisor retries the registry with a full disk; after that the
# exit record waits for the next reader (runs.reconcile).
RECORD_RETRY_S = 60.0


def _daemonize() -> None:
    # First child returns to the launcher at once (it waits on it); the
    # grandchild is adopted by init/subreaper and is no session leader, so it
    # can never get a controlling terminal back.
    if os.fork() > 0:
        os._exit(0)
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)


def supervise(ws: Workspace, run_id: int, handoff: Handoff) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # Nobody waits on a supervisor's writes: it bears a busy state.db as long as it records an end.
    reg = Registry(ws.db_path, busy_wait_s=RECORD_RETRY_S)
    me = psutil.Process()
    reg.update(run_id, supervisor_pid=me.pid, supervisor_create_time=me.create_time())
    run = reg.get(run_id)
    log = open(run.log_path, "ab", buffering=0)
    log.write(f"[eagle3-console] run {run_id} stage {run.stage}: {run.argv}\n".encode())
    if run.stop_requested:
        # Stopped while pending (runs.stop found no pid to signal): never start it.
        log.write(b"[eagle3-console] stopped before it started\n")
        reg.finish(run_id, RunStatus.KILLED, ended=time.time(), reason="stopped before it started")
        return 0
    # Reserved while there is room: the end is recorded there if state.db cannot take it.
    record = ExitRecord(run.log_path)
    problem = record.reserve()
    if problem:
        _say(log, f"[eagle3-console] cannot reserve the exit record ({problem}); the end goes to state.db only\n")
    # The outputs' lock files (claims.py): a second writer, from another workspace, is refused.
    claim = Claim.for_run(ws, run, reg, handoff.outputs, handoff.manifest)
    claim.set_pids((me.pid, me.create_time()))
    conflicts = claim.refresh()
    for note in claim.notes:
        log.write(f"[eagle3-console] {note}\n".encode())
    if conflicts:
        claim.release(succeeded=False)
        log.write(f"[eagle3-console] not started: {'; '.join(conflicts)}\n".encode())
        record_end(reg, record, run_id, RunStatus.FAILED, dict(ended=time.time(), reason=f"not started: {conflicts[0]}"),
                   log, "")
        return 1
    env = dict(os.environ)
    env.update(run.env)
    env[ENV_RUN_ID] = str(run_id)
    env[ENV_WORKSPACE] = str(ws.root)
    env[ENV_REGISTRY] = reg.registry_id
    env[ENV_STAGE] = run.stage
    env.setdefault("PYTHONUNBUFFERED", "1")
    if run.launcher == SLURM:
        from eagle3_console.runs.slurm.supervise import supervise_job
        return supervise_job(ws, reg, run, log, record, claim, env, record_end, handoff.slurm)
    try:
        proc = subprocess.Popen(run.argv, cwd=run.cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, process_group=0)
    except OSError as exc:
        claim.release(succeeded=False)
        record_end(reg, record, run_id, RunStatus.FAILED, dict(ended=time.time(), exit_code=127, reason=f"cannot start: {exc}"),
                   log, f"[eagle3-console] cannot start {run.argv[0]!r}: {exc}\n")
        return 127

    def forward(signum: int, _frame: object) -> None:
        # A stop aimed at the supervisor reaches the whole stage group, even when
        # the registry cannot take the flag (a full disk): the signal comes first.
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
        try:
            reg.update(run_id, stop_requested=1)
        except sqlite3.Error:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = None
    started = time.time()
    reg.update(run_id, status=RunStatus.RUNNING, pid=proc.pid, pgid=proc.pid, sid=os.getsid(0),
               create_time=create_time, started=started)
    claim.set_pids((me.pid, me.create_time()), (proc.pid, create_time))
    code = claim.wait(proc, log)
    ended = time.time()
    try:
        stop_requested = reg.get(run_id).stop_requested
    except sqlite3.Error:
        stop_requested = 0
    claim.release(succeeded=code == 0 and not stop_requested)
    if code < 0:
        sig = -code
        status = RunStatus.KILLED if stop_requested else RunStatus.FAILED
        values = dict(ended=ended, signal=sig,
                      reason="stopped" if stop_requested else f"killed by signal {signal.Signals(sig).name}")
        what = f"signal {signal.Signals(sig).name}"
    else:
        # A stage that catches the stop's SIGTERM and exits 0 did not finish its
        # work: succeeded would let the next stage start on a partial output.
        status = RunStatus.KILLED if stop_requested else (RunStatus.SUCCEEDED if code == 0 else RunStatus.FAILED)
        values = dict(ended=ended, exit_code=code)
        if stop_requested:
            values["reason"] = f"stopped (it exited {code} after the stop signal)"
        what = f"exit code {code}"
    record_end(reg, record, run_id, status, values, log,
               f"[eagle3-console] run {run_id} {status} ({what}) after {ended - (started or ended):.1f} s\n")
    log.close()
    reg.close()
    return 0


def _say(log, line: str) -> None:
    try:
        log.write(line.encode())
    except OSError:
        pass        # the log's disk is full too: the exit record holds what matters


def record_end(reg: Registry, record: ExitRecord, run_id: int, status: str, values: dict, log, line: str,
               retry_s: float = RECORD_RETRY_S) -> bool:
    """The run's end: into the reserved exit record first (it survives a full
    disk), the log's last line (so `logs -f` prints it before the status
    line), then the registry, retried while the disk is full; True once the
    registry holds it. Never raises: a supervisor that died here left the
    run `lost` though its stage had finished."""
    when = stamp()
    record.write(dict(values, status=status, boottime=when))
    _say(log, line)
    delay, deadline, error = 0.2, time.monotonic() + retry_s, None
    # One loop: either the registry takes it (True) or the retries run out (False).
    while True:
        try:
            reg.finish(run_id, status, **values)
            mark_end(reg, run_id, when)
            record.remove()
            return True
        except sqlite3.Error as exc:
            if error is None:
                # From now on a reader may apply the record (it does not while the
                # supervisor lives and has not failed: that is the normal path).
                record.write(dict(values, status=status, boottime=when, error=f"state.db: {exc}"))
                _say(log, f"[eagle3-console] could not record the end in {reg.path}: {exc}; it is in "
                          f"{record.path} (retrying for {retry_s:g} s; a status that can write state.db applies it too)\n")
            error = exc
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m eagle3_console.runs.supervise WORKSPACE RUN_ID HANDOFF_JSON", file=sys.stderr)
        return 2
    ws, run_id, handoff = Workspace(Path(args[0])), int(args[1]), Handoff.from_arg(args[2])
    _daemonize()
    return supervise(ws, run_id, handoff)


if __name__ == "__main__":
    sys.exit(main())
