"""stop, kill-workers and reconcile for a run that is a Slurm job.

- stop: scancel (Slurm's SIGTERM to every step, SIGKILL after the cluster's
  KillWait), then wait until the controller says the job has ended; a job
  still there after the grace gets `scancel --signal=KILL --full`; the run is
  `killed` once its end is recorded (by its supervisor, else here).
- kill-workers: `scancel --signal=KILL --full` at once, then the same check.
- reconcile (the supervisor is gone, e.g. the login node rebooted): the job
  is asked once; a live job keeps the run live (its state noted), an ended one
  gives the run its end, and one the controller no longer knows is judged by
  the batch script's exit record, else the run is lost.

Data flow: registry (the run) -> scontrol / scancel -> registry, events.
"""

from __future__ import annotations

import time

from eagle3_console.kernel.refused import NothingToDo, Refused
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.runs.slurm import jobs
from eagle3_console.runs.slurm.supervise import POLL_S, finish_values, note, unanswered
from eagle3_console.kernel.slurmparams import SLURM_UNANSWERED

AFTER_KILL_S = 30.0
RECONCILE_TIMEOUT_S = 3.0    # status and the TUI reconcile: a hung controller costs them this much at most          # a node's slurmd reports the steps' end in a few seconds; a dead node takes longer


def _wait_ended(job_id: str, seconds: float) -> jobs.JobView:
    deadline = time.monotonic() + seconds
    while True:
        view = jobs.query(job_id)
        if not view.live or time.monotonic() >= deadline:
            return view
        time.sleep(0.5)


def _wait_recorded(reg: Registry, run: Run, seconds: float) -> Run:
    """The run once its supervisor (which polls every POLL_S) recorded the end; else recorded here."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and reg.get(run.id).live:
        time.sleep(0.1)
    current = reg.get(run.id)
    if current.live:
        reconcile_job(reg, current, supervisor_gone=True)
    return reg.get(run.id)


def wait_submitted(reg: Registry, run: Run, seconds: float = 30.0) -> Run:
    deadline = time.monotonic() + seconds
    while run.live and not run.job_id and time.monotonic() < deadline:
        time.sleep(0.1)
        run = reg.get(run.id)
    return run


def stop_job(reg: Registry, run: Run, grace_s: float) -> Run:
    if not run.live:
        raise NothingToDo(f"stage {run.stage!r} has no live run to stop")
    before = run.stop_requested
    reg.update(run.id, stop_requested=1)
    run = wait_submitted(reg, run)           # a supervisor still submitting sees stop_requested and cancels
    if not run.job_id:
        return _wait_recorded(reg, run, 5.0)
    took = False                              # whether scancel took the job: then the stop stands
    try:
        problem = jobs.cancel(run.job_id)
        took = problem is None
        view = _wait_ended(run.job_id, grace_s + 5.0)
        forced = view.live
        if forced:
            again = jobs.cancel(run.job_id, signal="KILL")
            took = took or again is None
            problem = again or problem
            view = _wait_ended(run.job_id, AFTER_KILL_S)
    except jobs.SlurmUnreachable as exc:
        # A refused stop leaves no request behind: the job that runs on and completes is
        # its own success, not "stopped". Unless scancel took it before the controller went
        # quiet: then the job was cancelled, and the stop stands.
        if not took:
            reg.update(run.id, stop_requested=before)
        left = "the stop stands (scancel took the job)" if took else \
            "the stop request is withdrawn (scancel did not reach the controller)"
        reg.record("stop", f"Slurm did not answer: {exc}", stage=run.stage, run_id=run.id, targets=[run.job_id],
                   detail=left)
        raise Refused(f"run {run.id} of {run.stage!r}: job {run.job_id}: Slurm did not answer ({exc}); "
                      f"the job may still run; {left}") from None
    if view.live:
        if not took:
            reg.update(run.id, stop_requested=before)     # refused, and nothing took: no request left behind
        reg.record("stop", f"job still {view.state} after scancel", stage=run.stage, run_id=run.id,
                   targets=[run.job_id], detail=problem)
        raise Refused(f"run {run.id} of {run.stage!r}: job {run.job_id} is still {view.state} after scancel "
                      f"and scancel --signal=KILL ({problem or 'no error from scancel'})")
    done = _wait_recorded(reg, run, POLL_S * 3 + 5.0)
    outcome = "scancel, then --signal=KILL after the grace" if forced else "scancel"
    reg.record("stop", outcome, stage=run.stage, run_id=run.id, targets=[run.job_id],
               detail=f"job {run.job_id} {view.state or 'gone'}")
    return done


def live_job_runs(reg: Registry, stage: str) -> list[Run]:
    return [r for r in reg.runs(stage, limit=5) if r.launcher == "slurm" and r.live]


def kill_jobs(reg: Registry, found: list[Run]) -> tuple[list[str], list[str]]:
    """scancel --signal=KILL --full each run's job; (job ids killed, ids still live after AFTER_KILL_S)."""
    killed, left = [], []
    for run in found:
        reg.update(run.id, stop_requested=1)
        run = wait_submitted(reg, run)
        if not run.job_id:
            continue
        jobs.cancel(run.job_id, signal="KILL")
        killed.append(run.job_id)
    for run in found:
        run = reg.get(run.id)
        if run.job_id and _wait_ended(run.job_id, AFTER_KILL_S).live:
            left.append(run.job_id)
        else:
            _wait_recorded(reg, run, POLL_S * 3 + 5.0)
    return killed, left


def reconcile_job(reg: Registry, run: Run, supervisor_gone: bool = True) -> bool:
    """A live slurm run whose supervisor is gone: its job's word; True when the run's end was recorded now."""
    if not run.job_id:
        return False            # never submitted: liveness's own rule (supervisor gone -> lost) applies
    try:
        view = jobs.query(run.job_id, timeout=RECONCILE_TIMEOUT_S)
    except jobs.SlurmUnreachable as exc:
        # No word from Slurm is no proof of anything: the run stays as last seen, and says so.
        if not (run.job_reason or "").startswith(SLURM_UNANSWERED):
            unanswered(reg, run.id, time.time(), exc)
        return False
    if view.live:
        note(reg, run.id, view)
        return False
    status, values = finish_values(run, view, bool(run.stop_requested))
    if not reg.finish(run.id, status, **values):
        return False
    reg.record("lost" if status == RunStatus.LOST else "job-end", str(status), stage=run.stage, run_id=run.id,
               actor="reconcile", detail=values.get("reason"))
    return True
