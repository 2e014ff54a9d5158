"""The detached supervisor of one run: `python -m eagle3_console.supervise ROOT RUN_ID`.

Data flow: runs.launch starts this in a new session; it starts the stage in
its own process group, logs to .eagle3/logs/, and records pid, pgid,
create_time and the exit in the registry. It daemonizes (double fork) so that
neither the console nor cron is ever the parent of a stage, and it ignores
SIGHUP so a dropped SSH session or a killed tmux leaves the run alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from eagle3_console.claims import Claim
from eagle3_console.registry import Registry
from eagle3_console.workspace import ENV_REGISTRY, ENV_RUN_ID, ENV_STAGE, ENV_WORKSPACE, Workspace


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


def supervise(ws: Workspace, run_id: int) -> int:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    reg = Registry(ws.db_path)
    me = psutil.Process()
    reg.update(run_id, supervisor_pid=me.pid, supervisor_create_time=me.create_time())
    run = reg.get(run_id)
    log = open(run.log_path, "ab", buffering=0)
    log.write(f"[eagle3-console] run {run_id} stage {run.stage}: {run.argv}\n".encode())
    if run.stop_requested:
        # Stopped while pending (runs.stop found no pid to signal): never start it.
        log.write(b"[eagle3-console] stopped before it started\n")
        reg.finish(run_id, "killed", ended=time.time(), reason="stopped before it started")
        return 0
    env = dict(os.environ)
    env.update(run.env)
    env[ENV_RUN_ID] = str(run_id)
    env[ENV_WORKSPACE] = str(ws.root)
    env[ENV_REGISTRY] = reg.registry_id
    env[ENV_STAGE] = run.stage
    env.setdefault("PYTHONUNBUFFERED", "1")
    # The outputs' lock files (claims.py): a second writer, from another workspace, is refused.
    claim = Claim.for_run(ws, run, reg)
    claim.set_pids((me.pid, me.create_time()))
    conflicts = claim.refresh()
    for note in claim.notes:
        log.write(f"[eagle3-console] {note}\n".encode())
    if conflicts:
        claim.release(succeeded=False)
        log.write(f"[eagle3-console] not started: {'; '.join(conflicts)}\n".encode())
        reg.finish(run_id, "failed", ended=time.time(), reason=f"not started: {conflicts[0]}")
        return 1
    try:
        proc = subprocess.Popen(run.argv, cwd=run.cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, process_group=0)
    except OSError as exc:
        log.write(f"[eagle3-console] cannot start {run.argv[0]!r}: {exc}\n".encode())
        claim.release(succeeded=False)
        reg.finish(run_id, "failed", ended=time.time(), exit_code=127, reason=f"cannot start: {exc}")
        return 127

    def forward(signum: int, _frame: object) -> None:
        # A stop aimed at the supervisor reaches the whole stage group.
        reg.update(run_id, stop_requested=1)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = None
    reg.update(run_id, status="running", pid=proc.pid, pgid=proc.pid, sid=os.getsid(0),
               create_time=create_time, started=time.time())
    claim.set_pids((me.pid, me.create_time()), (proc.pid, create_time))
    code = claim.wait(proc, log)
    ended = time.time()
    stop_requested = reg.get(run_id).stop_requested
    claim.release(succeeded=code == 0 and not stop_requested)
    if code < 0:
        sig = -code
        status = "killed" if stop_requested else "failed"
        reg.finish(run_id, status, ended=ended, signal=sig,
                   reason="stopped" if stop_requested else f"killed by signal {signal.Signals(sig).name}")
        what = f"signal {signal.Signals(sig).name}"
    else:
        # A stage that catches the stop's SIGTERM and exits 0 did not finish its
        # work: succeeded would let the next stage start on a partial output.
        status = "killed" if stop_requested else ("succeeded" if code == 0 else "failed")
        extra = {"reason": f"stopped (it exited {code} after the stop signal)"} if stop_requested else {}
        reg.finish(run_id, status, ended=ended, exit_code=code, **extra)
        what = f"exit code {code}"
    log.write(f"[eagle3-console] run {run_id} {status} ({what}) after {ended - (reg.get(run_id).started or ended):.1f} s\n".encode())
    log.close()
    reg.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m eagle3_console.supervise WORKSPACE RUN_ID", file=sys.stderr)
        return 2
    ws, run_id = Workspace(Path(args[0])), int(args[1])
    _daemonize()
    return supervise(ws, run_id)


if __name__ == "__main__":
    sys.exit(main())
