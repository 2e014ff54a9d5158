"""Alerts derived from a Snapshot: what needs an operator, at which level.

Data flow: snapshot.py collects stages, disks and GPUs, then derive() turns
them into Alerts (stage failures and their causes from the parsed logs, disk
projections, GPU loss and memory no process explains). The TUI's header and
notifications and `status`'s exit code read them; nothing here samples.
"""

from __future__ import annotations

import re

from eagle3_console.kernel.model import (CRITICAL, WARNING, Alert, GpuInfo, LogState, ServeStatus, Snapshot,
                                  StageStatus, oom_finding)
from eagle3_console.kernel.registry import MAY_BE_ALIVE, RunStatus
from eagle3_console.kernel.slurmparams import SLURM_UNANSWERED
from eagle3_console.kernel.units import human_bytes

LOW_FREE_FRACTION = 0.05


def derive(snap: Snapshot) -> list[Alert]:
    alerts: list[Alert] = []
    for st in snap.stages:
        a: list[Alert] = []
        log = st.log
        findings = log.findings if log else {}
        if st.status == RunStatus.FAILED:
            why = f"exit code {st.exit_code}" if st.signal is None else f"signal {st.signal}"
            # The program's own last word: its exception, else its one-line
            # error (under torchrun, the rank's, not the launcher's report).
            said = [f for f in (findings.get("traceback"), findings.get("program_error")) if f is not None]
            last = max(said, key=lambda f: f.at_offset) if said else None
            detail = last.line if last else last_program_line(log)
            if st.job is not None and st.job.id is None and (st.job.reason or st.job.said):
                detail = st.job.reason or st.job.said      # no job ran: why sbatch did not take it
            a.append(Alert(CRITICAL, "stage_failed", f"{st.name} failed ({why})", st.name, detail))
        if st.job is not None:
            a.extend(job_alerts(st))
        if st.status == RunStatus.LOST and st.alive:
            a.append(Alert(CRITICAL, "lost", f"{st.name}: supervisor of run {st.run_id} is gone; "
                                             f"the stage's processes are still watched", st.name))
        elif st.status == RunStatus.LOST and st.done:
            # Its outputs vouch for it (the op's record, complete): dependents may go on.
            a.append(Alert(WARNING, "lost", f"{st.name}: run {st.run_id} lost: its supervisor and its processes "
                                            f"are gone; how it ended was not recorded, its outputs are complete",
                           st.name))
        elif st.status == RunStatus.LOST:
            # Died unrecorded (a stop of it records "killed"): CRITICAL, as README's
            # exit-code table says; the policies treat it as failed.
            a.append(Alert(CRITICAL, "lost", f"{st.name}: run {st.run_id} lost: its supervisor and its processes "
                                             f"are gone; how it ended was not recorded", st.name))
        if st.removed:
            a.append(Alert(WARNING, "stage_removed",
                           f"{st.name}: removed from the pipeline file while run {st.run_id} lives; it runs on "
                           f"(`stop {st.name}` or `kill-workers {st.name}` end it)", st.name))
        if st.vanished:
            a.append(Alert(CRITICAL, "output_vanished",
                           f"{st.name}: output {', '.join(st.vanished)} of succeeded run {st.run_id} is gone (moved or "
                           f"deleted since); its dependents are refused until {st.name} runs again", st.name))
        oom = oom_finding(st)
        if oom is not None:
            a.append(Alert(CRITICAL, "oom", f"{st.name}: out of memory", st.name, oom.line))
        if "killed" in findings and st.status != RunStatus.KILLED:
            a.append(Alert(CRITICAL, "worker_killed", f"{st.name}: a worker was killed", st.name,
                           findings["killed"].line))
        if "nccl" in findings:
            a.append(Alert(CRITICAL, "nccl", f"{st.name}: NCCL error", st.name, findings["nccl"].line))
        if "server_died" in findings:
            a.append(Alert(CRITICAL, "server_died", f"{st.name}: a process of the SGLang server died", st.name,
                           findings["server_died"].line))
        elif st.serve is not None and st.serve.state == ServeStatus.UNHEALTHY:
            a.append(Alert(CRITICAL, "server_unhealthy", f"{st.name}: SGLang server unhealthy at {st.serve.url}",
                           st.name, st.serve.reason))
        if "traceback" in findings and st.status in (RunStatus.RUNNING, RunStatus.LOST):
            a.append(Alert(WARNING, "traceback", f"{st.name}: a Python traceback in the log", st.name,
                           findings["traceback"].line))
        if log and log.errors:
            a.append(Alert(WARNING, "errors", f"{st.name}: errors: {log.errors}", st.name,
                           findings.get("errors").line if findings.get("errors") else None))
        st.alerts = a
        alerts.extend(a)
    for d in snap.disk:
        if d.fits is False:
            need = (d.projected_bytes or d.estimate_bytes or 0) - d.written_bytes
            # An upper bound (no token count yet) is said as one: the exact figure may well fit.
            said = ("estimated to need at most {} (upper bound)" if d.final_kind == "upper_bound"
                    else "projected to need {} more")
            alerts.append(Alert(WARNING, "disk_short",
                                f"{d.stage}: output {said.format(human_bytes(need, '?'))} but "
                                f"{human_bytes(d.free_bytes, '?')} is free at {d.path}", d.stage))
        elif d.free_bytes is not None and d.total_bytes and d.free_bytes < LOW_FREE_FRACTION * d.total_bytes:
            alerts.append(Alert(WARNING, "disk_low", f"{d.stage}: only {human_bytes(d.free_bytes, '?')} free at {d.path}",
                                d.stage))
    for stage_alert in alerts:
        st = snap.stage(stage_alert.stage) if stage_alert.stage else None
        if st is not None and stage_alert not in st.alerts:
            st.alerts.append(stage_alert)
    for h in snap.hosts:
        if h.state != "ok":
            alerts.append(Alert(WARNING, "host_unreachable", f"host {h.url}: {h.state.replace('_', ' ')} ({h.reason})"))
    g = snap.gpus
    if g.available:
        hidden = unaccounted_gpu_memory(g.gpus)
        if hidden:
            alerts.append(hidden)
        finished = {s.run_id for s in snap.stages if s.status not in MAY_BE_ALIVE}
        for gpu in g.gpus:
            if gpu.error or gpu.lost:
                lost = gpu.lost
                alerts.append(Alert(CRITICAL if lost else WARNING, "gpu_lost" if lost else "gpu_degraded",
                                    f"GPU {gpu.index}: {gpu.error}"))
            for p in gpu.processes:
                if p.run_id is not None and p.run_id in finished:
                    alerts.append(Alert(WARNING, "orphan_gpu_memory",
                                        f"GPU {gpu.index}: pid {p.pid} of finished run {p.run_id} ({p.stage}) "
                                        f"still holds {human_bytes(p.used_bytes, '?')}", p.stage))
    return alerts


# A job's end that the stage's exit code does not tell (jobs.py's states).
JOB_END_CODES = {"TIMEOUT": "job_timeout", "NODE_FAIL": "node_fail", "OUT_OF_MEMORY": "job_oom",
                 "PREEMPTED": "job_preempted", "BOOT_FAIL": "node_fail", "DEADLINE": "job_timeout"}


def job_alerts(st: StageStatus) -> list[Alert]:
    job = st.job
    if st.status in MAY_BE_ALIVE and (job.reason or "").startswith(SLURM_UNANSWERED):
        return [Alert(WARNING, "slurm_unreachable", f"{st.name}: the Slurm controller does not answer; job {job.id} "
                                                    f"{job.state or 'unknown'} is its last seen state", st.name,
                      job.reason)]
    if st.status == RunStatus.FAILED and job.state in JOB_END_CODES:
        return [Alert(CRITICAL, JOB_END_CODES[job.state], f"{st.name}: {job.said or job.state}", st.name)]
    if st.status == RunStatus.KILLED and job.state == "CANCELLED" and not job.stop_requested:
        return [Alert(WARNING, "job_cancelled", f"{st.name}: {job.said}", st.name)]
    return []


def leftover_workers(stage: str, run, pids: list[int]) -> Alert:
    """Processes of a failed or killed run still alive (found by snapshot's
    process-table walk): they hold GPU memory and files, and clean waits."""
    shown = ", ".join(map(str, pids[:6])) + (f" and {len(pids) - 6} more" if len(pids) > 6 else "")
    return Alert(CRITICAL, "leftover_workers",
                 f"{stage}: run {run.id} {run.status}, but {len(pids)} process(es) of it still run (pid {shown})",
                 stage)


# What a GPU holds with nothing running: the driver's context and reserve
# (0.6 GiB on an H200). More than this, unexplained, is worth a look.
UNACCOUNTED_GPU_BYTES = 2 * 2**30


def unaccounted_gpu_memory(gpus: list[GpuInfo]) -> Alert | None:
    """GPU memory that no process visible here explains: NVML lists no process
    for it (a container that does not see the host's processes, a process
    still being torn down) or lists pids this machine's pid namespace does not
    have. kill-workers cannot reach such memory, so say so once, for all GPUs."""
    parts, total = [], 0
    for gpu in gpus:
        if gpu.mem_used is None or gpu.error or "compute processes" in gpu.unsupported:
            continue        # no process list to hold the memory against
        listed = sum(p.used_bytes or 0 for p in gpu.processes)
        foreign = [p for p in gpu.processes if not p.visible]
        extra = gpu.mem_used - listed if not gpu.processes or all(p.used_bytes is not None for p in gpu.processes) \
            else 0
        held = extra + sum(p.used_bytes or 0 for p in foreign)
        if held < UNACCOUNTED_GPU_BYTES:
            continue
        total += held
        pids = ", ".join(f"pid {p.pid}" for p in foreign)
        parts.append(f"GPU {gpu.index} {human_bytes(held, '?')}" + (f" ({pids} not visible here)" if pids else ""))
    if not parts:
        return None
    return Alert(WARNING, "gpu_memory_unaccounted",
                 f"{human_bytes(total, '?')} of GPU memory held by no process visible here: " + "; ".join(parts[:4])
                 + (f"; and {len(parts) - 4} more GPU(s)" if len(parts) > 4 else "")
                 + " (another container or pid namespace, or a process still exiting)")


def orphan_workers(stage: str, pids: list[int]) -> Alert:
    """Processes a run of this workspace started, recorded in no run of the current
    registry (its state database was deleted or replaced): they block a new run."""
    shown = ", ".join(map(str, pids[:8])) + (f" and {len(pids) - 8} more" if len(pids) > 8 else "")
    return Alert(CRITICAL, "orphan_workers",
                 f"{stage}: process(es) {shown} of a run of an earlier registry still alive "
                 f"(its state database was replaced); a new run is refused until they end", stage)


# torchrun's report that a rank failed (torch/distributed/elastic/multiprocessing/
# errors/__init__.py: a traceback ending in ChildFailedError, a `====` banner and a
# table of the failure's fields; api.py's `E1203 ... failed (exitcode: N)` logger
# line before it) names the rank, never why: the rank's own words come before it.
_LAUNCHER_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ \S*torch/distributed/")
_RULE = re.compile(r"^[\s=*-]+$")


def _before_launcher_report(lines: list[str]) -> list[str]:
    for i in range(len(lines) - 1, -1, -1):
        if "ChildFailedError" in lines[i]:
            for j in range(i, -1, -1):
                if "Traceback (most recent call last)" in lines[j]:
                    return lines[:j]
            return lines[:i]
    return lines


def last_program_line(log: LogState | None) -> str | None:
    """The program's last words (an op's `error: ...`), skipping the supervisor's own lines
    and a launcher's report of the failure (torchrun's banner, its table, its logger)."""
    for line in reversed(_before_launcher_report(list(log.tail if log else []))):
        if line.strip() and not line.startswith("[eagle3-console]") and not _RULE.match(line) \
                and not _LAUNCHER_LOG.match(line):
            return line
    return None
