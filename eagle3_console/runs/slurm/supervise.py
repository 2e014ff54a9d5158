"""The supervisor's part for a slurm run: submit the job, follow it, record its end.

Called by eagle3_console.runs.supervise once the run's claims and exit record are
in place, so the guarantees of a local run hold for a job: one live run per
stage (the registry), the outputs' lock files (held here, on the login node,
while the job lives), the end in the exit record before state.db. A SIGTERM
to the supervisor (a stop) cancels the job. The job's state, reason and
nodes are written to the run as they change: status --json, the exporter and
the TUI read them from there, never from the controller. While the controller
does not answer, the run's job_reason says so (status warns: the state shown
is the last one seen).
"""

from __future__ import annotations

import signal
import sqlite3
import time

from eagle3_console.kernel.registry import Registry, RunStatus
from eagle3_console.kernel.slurmparams import JOB_NOT_SUBMITTED, SLURM_UNANSWERED, SlurmParams
from eagle3_console.runs.slurm import jobs, script

POLL_S = 2.0


def _say(log, line: str) -> None:
    try:
        log.write(f"[eagle3-console] {line}\n".encode())
    except OSError:
        pass


def supervise_job(ws, reg: Registry, run, log, record, claim, env: dict[str, str], record_end,
                  slurm: dict | None) -> int:
    """`slurm`: the stage's options as its launch handed them (supervise.Handoff)."""
    try:
        if slurm is None:
            raise ValueError(f"run {run.id}: its launch handed no slurm options")
        options = SlurmParams(**slurm)
        batch = script.write_script(run, run.argv)
        argv = script.sbatch_argv(options, run, batch)
    except (ValueError, OSError) as exc:
        claim.release(succeeded=False)
        why = f"cannot write the job: {exc}"
        record_end(reg, record, run.id, RunStatus.FAILED, dict(ended=time.time(), exit_code=2, reason=why,
                   job_state=JOB_NOT_SUBMITTED, job_reason=why), log, f"[eagle3-console] {why}\n")
        return 2
    _say(log, f"sbatch: {argv}")
    try:
        out = jobs.run_tool(argv, timeout=120, env=env, cwd=run.cwd)
        why = None if out.returncode == 0 else (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
    except jobs.SlurmUnreachable as exc:
        why = str(exc)
    job_id = None if why else out.stdout.strip().split(";")[0]
    if not job_id:
        claim.release(succeeded=False)
        why = f"sbatch refused the job: {why or 'sbatch printed no job id'}"
        # Its cause where status, the alert and `run` read the job: no job ever ran, none is "being submitted".
        record_end(reg, record, run.id, RunStatus.FAILED, dict(ended=time.time(), exit_code=2, reason=why,
                   job_state=JOB_NOT_SUBMITTED, job_reason=why), log, f"[eagle3-console] {why}\n")
        return 2
    reg.update(run.id, job_id=job_id, job_state="PENDING")
    _say(log, f"run {run.id}: submitted as job {job_id}")
    # A stop asked while the job was being submitted had no job to cancel: this one cancels it.
    # Later stops (stop, kill-workers) scancel the job themselves; a stop refused while the
    # controller was down withdraws its request, and no scancel of this one is left in flight
    # to cancel the job once the controller is back.
    try:
        early = bool(reg.get(run.id).stop_requested)
    except sqlite3.Error:
        early = False
    stopping = {"asked": False}

    def on_stop(_signum: int, _frame: object) -> None:
        stopping["asked"] = True

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    view, cancelled, seen, since, failed_cancel = jobs.JobView(job_id, "PENDING"), False, None, None, None
    while True:
        for conflict in claim.refresh():
            _say(log, f"{conflict}; not claimed")
        if (stopping["asked"] or early) and not cancelled:
            # Done only once scancel took it; tried again each poll until then.
            try:
                problem = jobs.cancel(job_id)
            except jobs.SlurmUnreachable as exc:
                problem = str(exc)
            cancelled = problem is None
            if problem != failed_cancel:
                _say(log, f"stop: scancel {job_id}: {problem or 'sent'}")
            failed_cancel = problem
        try:
            view = jobs.query(job_id)
        except jobs.SlurmUnreachable as exc:
            if seen != str(exc):
                _say(log, f"Slurm did not answer ({exc}); asking again")
            seen = str(exc)
            since = since or time.time()
            unanswered(reg, run.id, since, exc)
            time.sleep(POLL_S)
            continue
        seen = since = None
        if view.state is None or view.terminal:
            break
        note(reg, run.id, view)
        time.sleep(POLL_S)
    try:
        asked = cancelled or bool(reg.get(run.id).stop_requested) or stopping["asked"]
    except sqlite3.Error:
        asked = cancelled or stopping["asked"]
    status, values = finish_values(run, view, asked)
    claim.release(succeeded=status == RunStatus.SUCCEEDED)
    state = view.state or "unknown to Slurm"
    record_end(reg, record, run.id, status, values, log,
               f"[eagle3-console] run {run.id} {status} (job {job_id} {state}: {values.get('reason') or 'exit 0'})\n")
    return 0


def finish_values(run, view: jobs.JobView, stop_requested: bool) -> tuple[str, dict]:
    """The run's end for a job that ended (terminal) or that the controller no longer knows."""
    now = time.time()
    if view.state is not None:
        return jobs.end_of(view, stop_requested, now)
    rec = script.read_exit(run.log_path)
    if rec is not None:
        return jobs.end_from_record(view.job_id, rec, stop_requested, now)
    return RunStatus.LOST, dict(ended=now, reason=f"job {view.job_id} is unknown to Slurm and left no exit record "
                                                  f"({script.exit_path(run.log_path).name})")


def unanswered(reg: Registry, run_id: int, since: float, exc: Exception) -> None:
    """The controller does not answer: said on the run (its job_reason) until it does
    (note() writes Slurm's own reason again), so status warns that the job's state is
    only the last one seen."""
    try:
        reg.conn.execute("UPDATE runs SET job_reason = ? WHERE id = ?",
                         (f"{SLURM_UNANSWERED} since {time.strftime('%H:%M:%S', time.localtime(since))} ({exc})",
                          run_id))
    except sqlite3.Error:
        pass


def note(reg: Registry, run_id: int, view: jobs.JobView) -> None:
    """A live job's state on its run (and `running` once Slurm runs it: started = when that was seen)."""
    reg.conn.execute("UPDATE runs SET job_state = ?, job_reason = ?, job_nodes = ? WHERE id = ?",
                     (view.state, view.reason, view.nodes, run_id))
    if view.state not in ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"):
        reg.conn.execute("UPDATE runs SET status = ?, started = ? WHERE id = ? AND status = ?",
                         (str(RunStatus.RUNNING), view.start or time.time(), run_id, str(RunStatus.PENDING)))
