"""Slurm's word on a job (`scontrol show job -o`) and what it means for the run.

The console asks the controller, never a database: accounting (sacct) is
optional on a cluster and off on the test's. A job that the controller has
forgotten (MinJobAge after its end) is judged by the exit record its batch
script left (script.py); neither: the run is lost.

Job states (man squeue, JOB STATE CODES) as run statuses:
COMPLETED -> succeeded; FAILED (ExitCode a:b) -> failed with exit code a
(signal b); CANCELLED -> killed (by `stop`, or by a scancel outside the
console: said in the reason); TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED,
BOOT_FAIL, DEADLINE -> failed with the state in the reason (OUT_OF_MEMORY
also counts as the run's out-of-memory finding, alerts.oom_finding).
Everything else (PENDING, CONFIGURING, RUNNING, COMPLETING, SUSPENDED, ...)
is a live job.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass

from eagle3_console.kernel.registry import RunStatus

QUERY_TIMEOUT_S = 10.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
            "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT"}
FAILED_BECAUSE = {"TIMEOUT": "time limit hit", "NODE_FAIL": "node failure", "OUT_OF_MEMORY": "out of memory",
                  "PREEMPTED": "preempted", "BOOT_FAIL": "node boot failure", "DEADLINE": "deadline passed"}
_FIELD = {key: re.compile(rf"(?:^|\s){key}=(\S*)") for key in
          ("JobState", "Reason", "NodeList", "ExitCode", "TimeLimit", "StartTime", "EndTime")}


class SlurmUnreachable(Exception):
    """The controller did not answer (down, slow, munge broken): nothing may be concluded."""


@dataclass
class JobView:
    job_id: str
    state: str | None = None          # None: unknown to the controller
    reason: str | None = None         # Slurm's Reason (why pending, why it ended); None for "None"
    nodes: str | None = None          # NodeList once allocated
    exit_code: int | None = None
    signal: int | None = None
    time_limit: str | None = None
    start: float | None = None        # StartTime / EndTime (the controller's clock), once known
    end: float | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def live(self) -> bool:
        return self.state is not None and not self.terminal


def run_tool(argv: list[str], timeout: float = QUERY_TIMEOUT_S, env: dict[str, str] | None = None,
             cwd: str | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise SlurmUnreachable(f"{argv[0]} gave no answer within {timeout:g} s") from None
    except OSError as exc:
        raise SlurmUnreachable(f"{argv[0]}: {exc.strerror}") from None


def parse(job_id: str, line: str) -> JobView:
    got = {key: (m.group(1) if (m := rx.search(line)) else None) for key, rx in _FIELD.items()}
    view = JobView(job_id, state=(got["JobState"] or None), time_limit=got["TimeLimit"],
                   start=_when(got["StartTime"]), end=_when(got["EndTime"]))
    view.reason = None if got["Reason"] in (None, "None", "(null)") else got["Reason"]
    view.nodes = None if got["NodeList"] in (None, "", "(null)") else got["NodeList"]
    if got["ExitCode"] and ":" in got["ExitCode"]:
        code, sig = got["ExitCode"].split(":", 1)
        view.exit_code, view.signal = int(code), (int(sig) or None)
    return view


def _when(text: str | None) -> float | None:
    """scontrol's local time (2026-12-03T12:48:52); None for Unknown/None or a time to come."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def query(job_id: str, timeout: float = QUERY_TIMEOUT_S) -> JobView:
    """The job as the controller sees it now; SlurmUnreachable when it does not say."""
    out = run_tool(["scontrol", "show", "job", "-o", str(job_id)], timeout=timeout)
    if out.returncode != 0:
        if "Invalid job id" in out.stderr:
            return JobView(job_id)
        raise SlurmUnreachable(f"scontrol show job {job_id}: {out.stderr.strip() or f'exit {out.returncode}'}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("JobId=")]
    return parse(job_id, lines[0]) if lines else JobView(job_id)


def cancel(job_id: str, signal: str | None = None) -> str | None:
    """scancel the job (with --signal=SIG --full: every step and the batch shell); the error, or None."""
    argv = ["scancel"] + ([f"--signal={signal}", "--full"] if signal else []) + [str(job_id)]
    out = run_tool(argv)
    return None if out.returncode == 0 else (out.stderr.strip() or f"scancel exit {out.returncode}")


def end_of(view: JobView, stop_requested: bool, ended: float) -> tuple[str, dict]:
    """The run's status and recorded values for a job in a terminal state."""
    values: dict = dict(ended=view.end or ended, job_state=view.state, job_reason=view.reason)
    if view.start:
        values["started"] = view.start
    if view.nodes:
        values["job_nodes"] = view.nodes
    state = view.state
    if state == "COMPLETED":
        values["exit_code"] = 0
        if stop_requested:
            values["reason"] = "stopped (the job completed after the stop)"
            return RunStatus.KILLED, values
        return RunStatus.SUCCEEDED, values
    if state == "CANCELLED":
        values["signal"] = view.signal
        values["reason"] = (f"stopped: job {view.job_id} cancelled" if stop_requested else
                            f"job {view.job_id} cancelled in Slurm, not by the console (scancel outside it)")
        return RunStatus.KILLED, values
    values["exit_code"], values["signal"] = view.exit_code, view.signal
    if state == "FAILED":
        values["reason"] = f"job {view.job_id} FAILED ({view.reason or 'non-zero exit'})"
    else:
        why = FAILED_BECAUSE.get(state or "", state)
        limit = f" (TimeLimit {view.time_limit})" if state == "TIMEOUT" and view.time_limit else ""
        on = f" on {view.nodes}" if view.nodes and state == "NODE_FAIL" else ""
        values["reason"] = f"job {view.job_id} {state}: {why}{limit}{on}"
    if values["exit_code"] is None and values["signal"] is None:
        values["exit_code"] = 1
    return RunStatus.FAILED, values


def end_from_record(job_id: str, record: dict, stop_requested: bool, ended: float) -> tuple[str, dict]:
    """The run's end from the batch script's own exit record (the controller forgot the job)."""
    code = record.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else 1
    values = dict(ended=record.get("time") if isinstance(record.get("time"), (int, float)) else ended,
                  exit_code=code, reason=f"job {job_id}: ended as its batch script recorded (Slurm no longer knows it)")
    if stop_requested:
        return RunStatus.KILLED, values
    return (RunStatus.SUCCEEDED if code == 0 else RunStatus.FAILED), values
