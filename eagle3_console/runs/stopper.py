"""`stop STAGE`: SIGTERM the run's process group, SIGKILL after the grace, and
say "killed" only once no member of the group is left.

Before, stop watched the group's leader alone: a worker of the group that
ignores SIGTERM ran on after its leader exited, and with the supervisor held
by `kill -STOP` (so nobody reaped the leader, a zombie) stop said "killed",
exit 0, over a live group. Now every pass reads the process table (the
members tied to the run, monitor/procs.py: trusted by the leader's
create_time, never a reused group id), a stopped supervisor is continued so
it can reap its stage and record the exit, a stopped member gets SIGCONT
after SIGTERM (a stopped process acts on SIGTERM only once continued), and a
member that outlives SIGKILL is named in a refusal (exit 2).

Data flow: registry (the run) -> monitor.procs (its group) -> signals ->
registry (the exit, when the supervisor could not record it) -> events.
"""

from __future__ import annotations

import os
import signal
import time

import psutil

from eagle3_console.runs.liveness import reconcile, stage_alive
from eagle3_console.monitor.procs import LEADER, PGID, TREE, ProcessTable, RunRef, process_alive, run_processes
from eagle3_console.refused import NothingToDo, Refused
from eagle3_console.registry import Registry, Run, RunStatus
from eagle3_console.slurmparams import SLURM
from eagle3_console.workspace import Workspace

POLL_S = 0.1
AFTER_KILL_S = 5.0       # SIGKILL is not refused; a process in uninterruptible sleep takes a while
# How long a live supervisor gets to record the end of the stage it reaped
# (it retries a busy or full state.db for a minute; the console waits this long).
RECORD_WAIT_S = 15.0


def group_members(run: Run) -> list[int]:
    """Live (not zombie) processes of the run's process group, as the process table ties them to it."""
    if run.pgid is None:
        return []
    procs = run_processes(RunRef.from_run(run), ProcessTable.snapshot())
    return [p.pid for p in procs if p.pgid == run.pgid and p.how in (LEADER, TREE, PGID)]


def _signal_group(run: Run, sig: int) -> bool:
    try:
        os.killpg(run.pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def continue_supervisor(run: Run) -> bool:
    """SIGCONT a supervisor that is stopped (kill -STOP, ^Z): stopped, it never
    reaps the stage or records its exit. True when it was stopped."""
    if not process_alive(run.supervisor_pid, run.supervisor_create_time):
        return False
    try:
        if psutil.Process(run.supervisor_pid).status() not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            return False
        os.kill(run.supervisor_pid, signal.SIGCONT)
        return True
    except (psutil.Error, OSError):
        return False


def end_run_record(reg: Registry, run_id: int, reason: str, still_alive: bool = False) -> Run:
    """The one ending of a run's record, for stop and kill-workers alike, once
    they signalled its processes: its supervisor records the end (a stopped one
    is continued first, so that it can), and this returns only once the record
    says the run ended. Where no supervisor is left to write it, or it did not
    within RECORD_WAIT_S, the run is recorded killed here, with `reason`,
    unless its stage still lives (`still_alive`: a member outlived SIGKILL).
    Whatever starts the stage next (`restart --kill`) then finds no live run
    where it killed one."""
    run = reg.get(run_id)
    if not run.live:
        return run
    continue_supervisor(run)
    deadline = time.monotonic() + RECORD_WAIT_S
    while run.live and process_alive(run.supervisor_pid, run.supervisor_create_time) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
        run = reg.get(run_id)
    if run.live and not still_alive and not stage_alive(run):
        reg.finish(run_id, RunStatus.KILLED, ended=time.time(), reason=reason)
        run = reg.get(run_id)
    return run


def _wait_gone(run: Run, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = group_members(run)
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = group_members(run)
    return left


def stop(ws: Workspace, stage_name: str, grace_s: float = 10.0) -> Run:
    with Registry(ws.db_path) as reg:
        reconcile(reg)
        run = reg.latest(stage_name)
        if run is not None and run.launcher == SLURM:
            from eagle3_console.runs.slurm.control import stop_job
            return stop_job(reg, run, grace_s)
        if run is None or not (run.live or stage_alive(run) or group_members(run)):
            raise NothingToDo(f"stage {stage_name!r} has no live run to stop")
        was_lost = run.status == RunStatus.LOST
        reg.update(run.id, stop_requested=1)
        # A pending run has no pid yet: its supervisor either sees stop_requested and
        # never starts the stage, or records the pid we then signal.
        deadline = time.monotonic() + 10
        while run.status == RunStatus.PENDING and time.monotonic() < deadline:
            time.sleep(0.05)
            run = reg.get(run.id)
        resumed = continue_supervisor(run)
        members = group_members(run)
        sent = bool(members) and _signal_group(run, signal.SIGTERM)
        if sent:
            _signal_group(run, signal.SIGCONT)
        left = _wait_gone(run, grace_s) if sent else members
        killed = False
        if left:
            killed = _signal_group(run, signal.SIGKILL)
            left = _wait_gone(run, AFTER_KILL_S)
        end_run_record(reg, run.id, "stopped (supervisor did not record)", still_alive=bool(left))
        now = time.time()
        if was_lost and not left:
            # Its supervisor is gone, so nobody else records it: the operator ended
            # it, which is "killed", not a loss still to be looked into.
            reg.update(run.id, status=RunStatus.KILLED, ended=now, reason="stopped after its supervisor was lost")
        outcome = "SIGKILL after grace" if killed else ("SIGTERM" if sent else "nothing to signal")
        if resumed:
            outcome += ", supervisor was stopped: SIGCONT"
        if left:
            outcome += f"; still alive: {left}"
        reg.record("stop", outcome, stage=stage_name, run_id=run.id, targets=[run.pgid])
        if left:
            raise Refused(f"run {run.id} of {stage_name!r}: {len(left)} process(es) of its group "
                          f"{run.pgid} still alive after SIGKILL: pid {', '.join(map(str, left))}")
        return reg.get(run.id)
