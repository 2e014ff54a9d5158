"""kill-workers: every process of a stage's runs and every GPU process tied to them,
SIGTERM then SIGKILL, then NVML polled until their memory is back.

Data flow: registry + monitor.procs (which pids) + monitor.gpus (which memory)
-> KillPlan -> (confirm) -> execute_kill -> events. A pid is signalled only
while its create time still matches the plan's: nothing else is ever touched.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import psutil

from eagle3_console import runs
from eagle3_console.kernel.model import GpuReport
from eagle3_console.monitor.procs import ProcessTable, ProcInfo, RunRef
from eagle3_console.kernel.registry import EXITED, MAY_BE_ALIVE, Registry
from eagle3_console.runs.stopper import end_run_record
from eagle3_console.kernel.units import human_bytes
from eagle3_console.kernel.workspace import Workspace


@dataclass
class GpuHold:
    pid: int
    gpu: int
    used_bytes: int | None


@dataclass
class KillPlan:
    stage: str
    run_ids: list[int]
    procs: list[ProcInfo]
    gpu_holds: list[GpuHold]
    gpus_unavailable: str | None
    grace_s: float
    refusal: str | None = None
    nothing_to_do: bool = False     # the refusal is "there is nothing to kill" (exit 0), not "unsafe" (2)
    jobs: list[str] = field(default_factory=list)   # Slurm jobs of the stage's live runs (launcher slurm)

    def lines(self) -> list[str]:
        if self.refusal:
            return [f"{'nothing to do' if self.nothing_to_do else 'refused'}: {self.refusal}"]
        if self.jobs:
            return [f"scancel --signal=KILL --full job(s) {', '.join(self.jobs)} of stage {self.stage} "
                    f"(runs {', '.join(map(str, self.run_ids))}), then check that Slurm says they ended"]
        held = {}
        for h in self.gpu_holds:
            held.setdefault(h.pid, []).append(f"GPU {h.gpu} {human_bytes(h.used_bytes, '?')}")
        out = [f"kill {len(self.procs)} process(es) of stage {self.stage} (runs {', '.join(map(str, self.run_ids))}): "
               f"SIGTERM, then SIGKILL after {self.grace_s:g} s"]
        for p in self.procs:
            gpu = "; ".join(held.get(p.pid, [])) or ("GPU memory unknown" if self.gpus_unavailable else
                                                      "no GPU memory")
            out.append(f"  pid {p.pid:>7}  [{p.how}]  {gpu:<24}  {' '.join(p.cmdline)[:70] or p.name}")
        total = sum(h.used_bytes or 0 for h in self.gpu_holds)
        if self.gpus_unavailable:
            out.append(f"GPU memory: not visible ({self.gpus_unavailable})")
        else:
            out.append(f"then wait until NVML shows the {human_bytes(total, '?')} they hold released")
        return out


@dataclass
class KillResult:
    signalled: list[int]
    sigkilled: list[int]
    still_alive: list[int]
    still_holding: dict[int, tuple[int, int | None]]   # pid -> (gpu, bytes)
    freed_bytes: int
    waited_s: float
    held_gpu_memory: bool = False           # the plan saw GPU memory held by these processes
    gpu_unchecked: str | None = None        # why the release could not be checked (no NVML, a GPU unreadable)

    @property
    def ok(self) -> bool:
        return not self.still_alive and not self.still_holding

    def lines(self) -> list[str]:
        out = [f"signalled {len(self.signalled)}, SIGKILL needed for {len(self.sigkilled)}"]
        if self.still_alive:
            out.append(f"still alive: {self.still_alive}")
        for pid, (gpu, used) in self.still_holding.items():
            out.append(f"pid {pid} still holds {human_bytes(used, '?')} on GPU {gpu}")
        if self.ok:
            if self.gpu_unchecked:
                gpu = f"GPU memory not checked ({self.gpu_unchecked})"
            elif self.held_gpu_memory:
                gpu = f"GPU memory released ({human_bytes(self.freed_bytes, '?')})"
            else:
                gpu = "they held no GPU memory"
            out.append(f"all processes gone; {gpu} after {self.waited_s:.1f} s")
        return out


def _sample_gpus(nvml: Any) -> GpuReport:
    if nvml is None:
        from eagle3_console.monitor.gpus import Nvml
        nvml = Nvml()
    return nvml.sample()


def _stage_refs(reg: Registry, stage: str) -> list[RunRef]:
    """The stage's live or lost runs (a lost run's workers may still run)."""
    runs.reconcile(reg)
    return [RunRef.from_run(r) for r in reg.runs(stage, limit=20)
            if r.status in MAY_BE_ALIVE or runs.stage_alive(r)]


def plan_kill(ws: Workspace, stage: str, grace_s: float = 10.0, nvml: Any = None) -> KillPlan:
    with Registry(ws.db_path) as reg:
        refs = _stage_refs(reg, stage)
        from eagle3_console.runs.slurm.control import live_job_runs
        job_runs = live_job_runs(reg, stage)
        if job_runs:        # its processes are on the job's nodes: Slurm kills them
            return KillPlan(stage=stage, run_ids=[r.id for r in job_runs], procs=[], gpu_holds=[],
                            gpus_unavailable=None, grace_s=grace_s, jobs=[r.job_id or "(submitting)" for r in job_runs])
        # Finished runs whose orphaned workers outlived them: tie by pgid/session/env too.
        for r in reg.runs(stage, limit=5):
            if r.status in EXITED and r.pgid:
                refs.append(RunRef.from_run(r))
    table = ProcessTable.snapshot()
    procs = table.owners(tuple(refs)).values() if refs else []
    procs = sorted(procs, key=lambda p: (p.how != "leader", p.pid))
    report = _sample_gpus(nvml)
    holds = []
    if report.available:
        pids = {p.pid for p in procs}
        for gpu in report.gpus:
            for gp in gpu.processes:
                if gp.pid in pids:
                    holds.append(GpuHold(gp.pid, gpu.index, gp.used_bytes))
    plan = KillPlan(stage=stage, run_ids=sorted({p.run_id for p in procs}), procs=list(procs),
                    gpu_holds=holds, gpus_unavailable=None if report.available else report.reason, grace_s=grace_s)
    if not procs:
        plan.refusal = f"stage {stage!r} has no live process"
        plan.nothing_to_do = True
    return plan


def _trusted(p: ProcInfo) -> psutil.Process | None:
    try:
        proc = psutil.Process(p.pid)
        if abs(proc.create_time() - p.create_time) > 0.01:
            return None    # pid reused since the plan: never signal it
        return proc
    except psutil.NoSuchProcess:
        return None


def _exited(proc: psutil.Process) -> bool:
    try:
        # is_running() is False for a pid reused by another process too.
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return True


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """The processes still running after up to `timeout` s. psutil.wait_procs
    counts a zombie as running: an orphan that exited on SIGTERM but whose
    reaper has not called wait() yet would then be SIGKILLed and reported as
    needing it."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if not _exited(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if not _exited(p)]
    return alive


def execute_kill(ws: Workspace, plan: KillPlan, progress: Callable[[str], None] | None = None,
                 nvml: Any = None, release_timeout_s: float = 60.0) -> KillResult:
    if plan.refusal:
        raise runs.Refused(plan.refusal)
    say = progress or (lambda _m: None)
    if plan.jobs:
        return _kill_jobs(ws, plan, say)
    with Registry(ws.db_path) as reg:
        for rid in plan.run_ids:
            reg.update(rid, stop_requested=1)
    t0 = time.time()
    live = [(p, proc) for p in plan.procs if (proc := _trusted(p)) is not None]
    denied: list[int] = []
    for p, proc in live:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            denied.append(p.pid)     # another user's process: reported as still alive below
    say(f"SIGTERM sent to {len(live)} process(es); waiting up to {plan.grace_s:g} s")
    alive = _wait_gone([proc for _p, proc in live], timeout=plan.grace_s)
    sigkilled = []
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
            sigkilled.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    if sigkilled:
        say(f"SIGKILL sent to {sigkilled}")
    alive = _wait_gone(alive, timeout=5)
    still_holding: dict[int, tuple[int, int | None]] = {}
    if plan.gpu_holds:
        say("waiting for GPU memory to be released")
        if nvml is None:
            from eagle3_console.monitor.gpus import Nvml
            nvml = Nvml()
        release = nvml.wait_memory_released([h.pid for h in plan.gpu_holds], timeout_s=release_timeout_s)
        still_holding = {pid: where[0] for pid, where in release.held.items() if where}
        for gpu, why in release.unreadable.items():
            say(f"GPU {gpu}: cannot tell whether memory came back ({why})")
        unreadable = "; ".join(f"GPU {g}: {why}" for g, why in release.unreadable.items()) or None
    else:
        unreadable = None
    waited = time.time() - t0
    freed = sum(h.used_bytes or 0 for h in plan.gpu_holds if h.pid not in still_holding)
    result = KillResult(signalled=[p.pid for p, _ in live], sigkilled=sigkilled,
                        still_alive=[p.pid for p in alive], still_holding=still_holding,
                        freed_bytes=freed, waited_s=waited, held_gpu_memory=bool(plan.gpu_holds),
                        gpu_unchecked="NVML unavailable here" if plan.gpus_unavailable else unreadable)
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        for rid in plan.run_ids:
            end_run_record(reg, rid, "kill-workers", still_alive=bool(result.still_alive))
        reg.record("kill-workers", "ok" if result.ok else "incomplete", stage=plan.stage,
                   run_id=plan.run_ids[-1] if plan.run_ids else None,
                   targets=[{"pid": p.pid, "how": p.how} for p in plan.procs],
                   detail="; ".join(result.lines()))
    say("; ".join(result.lines()))
    return result


def _kill_jobs(ws: Workspace, plan: KillPlan, say: Callable[[str], None]) -> KillResult:
    from eagle3_console.runs.slurm.control import kill_jobs
    t0 = time.time()
    with Registry(ws.db_path) as reg:
        killed, left = kill_jobs(reg, [reg.get(rid) for rid in plan.run_ids])
        result = KillResult(signalled=[], sigkilled=[], still_alive=[], still_holding={}, freed_bytes=0,
                            waited_s=time.time() - t0, gpu_unchecked="the job's GPUs are on its nodes")
        outcome = "ok" if not left else f"job(s) still live: {', '.join(left)}"
        reg.record("kill-workers", outcome, stage=plan.stage, run_id=plan.run_ids[-1], targets=killed,
                   detail=f"scancel --signal=KILL --full {' '.join(killed)}")
    say(f"scancel --signal=KILL sent to job(s) {', '.join(killed) or 'none'}; " +
        (f"still live: {', '.join(left)}" if left else "Slurm says they ended"))
    if left:
        result.still_alive = [int(j) for j in left if j.isdigit()]
    return result
