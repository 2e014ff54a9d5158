"""Liveness of runs: whether a run's stage still runs, and reconcile(), which
marks a run whose supervisor vanished as `lost` (or gives it the exit its
supervisor wrote to the exit record, exitrecord.py).

Data flow: registry + process table -> (this) -> registry. snapshot.collect,
runs (before a launch), the stopper and the actions call reconcile() first.
"""

from __future__ import annotations

import dataclasses
import time

from eagle3_console.kernel import exitrecord
from eagle3_console.kernel.endclock import mark_end
from eagle3_console.monitor.procs import ProcessTable, RunRef, process_alive
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.kernel.slurmparams import SLURM

PENDING_GRACE_S = 30.0


def reconcile(reg: Registry) -> list[Run]:
    """Mark runs whose supervisor is gone as lost; returns the ones it changed."""
    changed = []
    now = time.time()
    for run in reg.live_runs():
        if apply_exit_record(reg, run):
            changed.append(run)
            continue
        if run.supervisor_pid is None:
            if now - run.created > PENDING_GRACE_S:
                if reg.finish(run.id, RunStatus.LOST, reason="supervisor never started"):
                    changed.append(run)
            continue
        if not process_alive(run.supervisor_pid, run.supervisor_create_time):
            if run.launcher == SLURM and run.job_id:
                # The job lives on without its supervisor: Slurm says how it is or how it ended.
                from eagle3_console.runs.slurm.control import reconcile_job
                if reconcile_job(reg, run):
                    changed.append(run)
                continue
            # The supervisor may have recorded the exit between our read and now.
            # ended = when the loss was noticed: watch's backoff counts from it.
            if reg.finish(run.id, RunStatus.LOST, ended=now, reason="supervisor gone without recording an exit"):
                mark_end(reg, run.id)
                reg.record("lost", "supervisor gone", stage=run.stage, run_id=run.id, actor="reconcile")
                changed.append(run)
    return changed


def apply_exit_record(reg: Registry, run: Run) -> bool:
    """A live run whose supervisor wrote its exit to the exit record (the
    registry was full, exitrecord.py) gets that exit; True when it did."""
    rec = exitrecord.read(run.log_path)
    if rec is None or _forged(run):
        return False
    if not rec.get("error") and process_alive(run.supervisor_pid, run.supervisor_create_time):
        return False    # it is writing the registry itself (or retrying while the disk is full)
    how = (f"the supervisor could not write {rec['error']}" if rec.get("error")
           else "the supervisor ended before it wrote state.db")
    values = {k: rec[k] for k in ("ended", "exit_code", "signal", "reason") if rec.get(k) is not None}
    values["reason"] = "; ".join(filter(None, [values.get("reason"),
                                               f"recorded from {exitrecord.path_for(run.log_path).name}: {how}"]))
    done = reg.finish(run.id, rec["status"], **values)
    if done:
        mark_end(reg, run.id, rec.get("boottime") if isinstance(rec.get("boottime"), dict) else None)
        reg.record("exit-record", rec["status"], stage=run.stage, run_id=run.id, actor="reconcile",
                   detail=rec.get("error"))
    try:
        exitrecord.path_for(run.log_path).unlink()
    except OSError:
        pass
    return done


def as_recorded(run: Run | None) -> Run | None:
    """A live run as its exit record has it, where its supervisor wrote its end
    there and the registry does not hold it yet (another process holds
    state.db busy, or it is full): what status shows, without waiting for
    the registry. The registry itself gets it from the supervisor, or from
    apply_exit_record."""
    if run is None or not run.live:
        return run
    rec = exitrecord.read(run.log_path)
    if rec is None or _forged(run):
        return run
    values = {k: rec[k] for k in ("ended", "exit_code", "signal") if rec.get(k) is not None}
    why = f"from {exitrecord.path_for(run.log_path).name}: state.db does not hold it yet"
    return dataclasses.replace(run, status=rec["status"], reason="; ".join(filter(None, [rec.get("reason"), why])),
                               **values)


def _forged(run: Run) -> bool:
    """A filled exit record while the run's stage still runs: its supervisor writes
    one only after it reaped the stage, so this one is not the supervisor's (a
    stray write, a forgery by anyone who can write the workspace): never
    believed. The supervisor overwrites it with the real end. A job's stage runs
    on its nodes: no local process to check, and its record is believed as before."""
    return stage_alive(run)


def stage_alive(run: Run) -> bool:
    """Whether the stage's leader process still runs (pid trusted with its create_time)."""
    return run.pid is not None and process_alive(run.pid, run.create_time)


def leftover_workers(run: Run, table: ProcessTable | None = None) -> list[int]:
    """Live processes tied to `run` (its group, session, tree or environment), its
    supervisor left out: after the run's end, the workers that outlived it."""
    table = table or ProcessTable.snapshot()
    return sorted(table.owners((RunRef.from_run(run),)))
