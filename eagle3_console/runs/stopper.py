"""`stop STAGE`: SIGTERM the run's process group, SIGKILL after the grace, and
say "killed" only once no member of the group is left.

The group's leader alone proves nothing: a worker of the group that ignores
SIGTERM runs on after its leader exits, and a supervisor held by `kill -STOP`
reaps nobody (the leader stays a zombie). So every pass reads the process
table (the members tied to the run, monitor/procs.py: trusted by the
leader's create_time, never a reused group id), a stopped supervisor is
continued so it can reap its stage and record the exit, a stopped member
gets SIGCONT after SIGTERM (a stopped process acts on SIGTERM only once
continued), and a member that outlives SIGKILL is named in a refusal (exit 2).

A worker outside the group (a session of its own, ignoring SIGTERM) never
gets the group's signals: once the group is gone, stop looks for the run's
processes everywhere (group, session, tree, environment) and names any left
in a refusal that points at `kill-workers` (exit 2), at once; `run` refuses
to start beside them (startcheck.check_can_start), as `restart` does. A stop
ended by SIGINT, SIGTERM or SIGHUP is recorded `interrupted: SIG...` with
what it had sent and what still runs, and said (exit 128 + N).

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
from eagle3_console.kernel.interrupts import Interrupted, Signalled, held_off, signals_raise, signum_of
from eagle3_console.kernel.refused import NothingToDo, Refused
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.kernel.slurmparams import SLURM
from eagle3_console.kernel.workspace import Workspace

POLL_S = 0.1
AFTER_KILL_S = 5.0       # SIGKILL is not refused; a process in uninterruptible sleep takes a while
# How long a live supervisor gets to record the end of the stage it reaped
# (it retries a busy or full state.db for a minute; the console waits this long).
RECORD_WAIT_S = 15.0
# A process tied to the run outside its group that exits with its parent is gone by then.
SURVIVOR_SETTLE_S = 1.0


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


def survivors(run: Run, exclude: list[int] = ()) -> list[int]:
    """Processes tied to the run outside its process group (a worker that made a
    session of its own): the group's signals never reach them. Given a moment
    to go on their own (one that exits with its parent), no more."""
    deadline = time.monotonic() + SURVIVOR_SETTLE_S
    while True:
        left = [pid for pid in sorted(ProcessTable.snapshot().owners((RunRef.from_run(run),)))
                if pid not in exclude]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(POLL_S)


class Survivors(Refused):
    """The stop ended the run's group, and workers of it outside the group live on (exit 2):
    `run` is the run as recorded, `pids` the survivors."""

    def __init__(self, message: str, run: Run, pids: list[int]):
        super().__init__(message, kind="survivors")
        self.run = run
        self.pids = pids


def _survivors_refusal(run: Run, stage_name: str, pids: list[int], status: str) -> Survivors:
    return Survivors(f"run {run.id} of {stage_name!r} is {status}, but {len(pids)} worker(s) of it survived outside "
                     f"its process group (a session of their own; stop signals the group): pid "
                     f"{', '.join(map(str, pids))}; they hold its GPU memory and may write its outputs: "
                     f"`kill-workers {stage_name}` ends them", run, pids)


def stop(ws: Workspace, stage_name: str, grace_s: float = 10.0) -> Run:
    with Registry(ws.db_path) as reg:
        reconcile(reg)
        run = reg.latest(stage_name)
        if run is not None and run.launcher == SLURM:
            from eagle3_console.runs.slurm.control import stop_job
            return stop_job(reg, run, grace_s)
        if run is None or not (run.live or stage_alive(run) or group_members(run)):
            left = survivors(run) if run is not None and run.pgid is not None else []
            if left:
                raise _survivors_refusal(run, stage_name, left, run.status)
            raise NothingToDo(f"stage {stage_name!r} has no live run to stop")
        progress = {"sent": None, "killed": False}
        try:
            with signals_raise():
                return _stop(reg, run, stage_name, grace_s, progress)
        except (KeyboardInterrupt, Signalled) as exc:
            raise _interrupted(reg, run, stage_name, progress, signum_of(exc)) from None


def _interrupted(reg: Registry, run: Run, stage_name: str, progress: dict, signum: int) -> Interrupted:
    """A stop ended part-way by a signal: recorded and said. The SIGTERM it sent
    cannot be taken back, so the stop request stays where it went out (what the
    stage does after it is not trusted as finished work: exit 0 reads `killed`);
    before anything was signalled it is withdrawn, as if the stop never ran."""
    with held_off():
        name = signal.Signals(signum).name
        current = reg.get(run.id)
        alive = group_members(current) if current.pgid is not None else []
        if progress["sent"] is None:
            if current.live:
                reg.update(run.id, stop_requested=0)
            how = "nothing was signalled yet; the stop request is withdrawn"
        elif progress["killed"]:
            how = "SIGKILL was sent"
        else:
            how = f"SIGTERM sent to group {current.pgid}, SIGKILL was not sent"
        state = (f"still alive: {len(alive)} process(es) of the group ({', '.join(map(str, alive[:10]))})"
                 if alive else "no process of its group is left")
        reg.record("stop", f"interrupted: {name}", stage=stage_name, run_id=run.id, targets=[current.pgid],
                   detail=f"{how}; {state}")
        tail = (f"; run {run.id} goes on (what it does after the SIGTERM counts as stopped); `stop {stage_name}` "
                f"again ends it" if alive and progress["sent"] is not None else
                f"; run {run.id} goes on" if alive else "")
        said = (f"stop {stage_name}: interrupted by {name}: {how}; {state}{tail} "
                f"(recorded in the audit log: `events --stage {stage_name}`)")
    return Interrupted(said, signum)


def _stop(reg: Registry, run: Run, stage_name: str, grace_s: float, progress: dict) -> Run:
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
    progress["sent"] = False
    sent = bool(members) and _signal_group(run, signal.SIGTERM)
    progress["sent"] = sent
    if sent:
        _signal_group(run, signal.SIGCONT)
    left = _wait_gone(run, grace_s) if sent else members
    killed = False
    if left:
        killed = _signal_group(run, signal.SIGKILL)
        progress["killed"] = killed
        left = _wait_gone(run, AFTER_KILL_S)
    end_run_record(reg, run.id, "stopped (supervisor did not record)", still_alive=bool(left))
    now = time.time()
    if was_lost and not left:
        # Its supervisor is gone, so nobody else records it: the operator ended
        # it, which is "killed", not a loss still to be looked into.
        reg.update(run.id, status=RunStatus.KILLED, ended=now, reason="stopped after its supervisor was lost")
    outside = survivors(reg.get(run.id), exclude=left)
    outcome = "SIGKILL after grace" if killed else ("SIGTERM" if sent else "nothing to signal")
    if resumed:
        outcome += ", supervisor was stopped: SIGCONT"
    if left:
        outcome += f"; still alive: {left}"
    if outside:
        outcome += f"; outside its group, still alive: {outside}"
    reg.record("stop", outcome, stage=stage_name, run_id=run.id, targets=[run.pgid])
    if left:
        raise Refused(f"run {run.id} of {stage_name!r}: {len(left)} process(es) of its group "
                      f"{run.pgid} still alive after SIGKILL: pid {', '.join(map(str, left))}"
                      + (f"; outside it: pid {', '.join(map(str, outside))}" if outside else ""))
    done = reg.get(run.id)
    if outside:
        raise _survivors_refusal(done, stage_name, outside, done.status)
    return done
