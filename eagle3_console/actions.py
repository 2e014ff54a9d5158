"""Guarded actions: each builds a plan (a dry run listing exactly what it will
touch), then executes it only when asked. The CLI and the TUI call the same code.

Data flow: registry + monitor.procs / monitor.gpus -> plan -> (confirm) ->
execute -> events table. Nothing outside a run's recorded processes is ever
signalled; nothing outside a stage's output root is ever moved or deleted.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import psutil

from eagle3_console import config as cfg
from eagle3_console import runs
from eagle3_console.monitor.procs import ProcessTable, ProcInfo, RunRef
from eagle3_console.registry import Registry, Run
from eagle3_console.workspace import Workspace
from ops.extract.spec import partial_files as sample_partials

GIB = 2**30
TMP_SUFFIXES = (".tmp", ".partial", ".incomplete")


def _human(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _sample_gpus(nvml: Any) -> Any:
    if nvml is None:
        from eagle3_console.monitor.gpus import Nvml
        nvml = Nvml()
    return nvml, nvml.sample()


# ---------------------------------------------------------------- kill workers
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

    def lines(self) -> list[str]:
        if self.refusal:
            return [f"refused: {self.refusal}"]
        held = {}
        for h in self.gpu_holds:
            held.setdefault(h.pid, []).append(f"GPU {h.gpu} {_human(h.used_bytes)}")
        out = [f"kill {len(self.procs)} process(es) of stage {self.stage} (runs {', '.join(map(str, self.run_ids))}): "
               f"SIGTERM, then SIGKILL after {self.grace_s:g} s"]
        for p in self.procs:
            gpu = "; ".join(held.get(p.pid, [])) or "no GPU memory"
            out.append(f"  pid {p.pid:>7}  [{p.how}]  {gpu:<24}  {' '.join(p.cmdline)[:70] or p.name}")
        total = sum(h.used_bytes or 0 for h in self.gpu_holds)
        if self.gpus_unavailable:
            out.append(f"GPU memory: not visible ({self.gpus_unavailable})")
        else:
            out.append(f"then wait until NVML shows the {_human(total)} they hold released")
        return out


@dataclass
class KillResult:
    signalled: list[int]
    sigkilled: list[int]
    still_alive: list[int]
    still_holding: dict[int, tuple[int, int | None]]   # pid -> (gpu, bytes)
    freed_bytes: int
    waited_s: float

    @property
    def ok(self) -> bool:
        return not self.still_alive and not self.still_holding

    def lines(self) -> list[str]:
        out = [f"signalled {len(self.signalled)}, SIGKILL needed for {len(self.sigkilled)}"]
        if self.still_alive:
            out.append(f"still alive: {self.still_alive}")
        for pid, (gpu, used) in self.still_holding.items():
            out.append(f"pid {pid} still holds {_human(used)} on GPU {gpu}")
        if self.ok:
            out.append(f"all processes gone; GPU memory released ({_human(self.freed_bytes)}) after {self.waited_s:.1f} s")
        return out


def _stage_refs(reg: Registry, stage: str) -> list[RunRef]:
    """The stage's live or lost runs (a lost run's workers may still run)."""
    runs.reconcile(reg)
    return [RunRef.from_run(r) for r in reg.runs(stage, limit=20)
            if r.status in ("pending", "running", "lost") or runs.stage_alive(r)]


def plan_kill(ws: Workspace, stage: str, grace_s: float = 10.0, nvml: Any = None) -> KillPlan:
    with Registry(ws.db_path) as reg:
        refs = _stage_refs(reg, stage)
        # Finished runs whose orphaned workers outlived them: tie by pgid/session/env too.
        for r in reg.runs(stage, limit=5):
            if r.status in ("failed", "killed", "succeeded") and r.pgid:
                refs.append(RunRef.from_run(r))
    table = ProcessTable.snapshot()
    procs = table.owners(tuple(refs)).values() if refs else []
    procs = sorted(procs, key=lambda p: (p.how != "leader", p.pid))
    _, report = _sample_gpus(nvml)
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
    return plan


def _trusted(p: ProcInfo) -> psutil.Process | None:
    try:
        proc = psutil.Process(p.pid)
        if abs(proc.create_time() - p.create_time) > 0.01:
            return None    # pid reused since the plan: never signal it
        return proc
    except psutil.NoSuchProcess:
        return None


def execute_kill(ws: Workspace, plan: KillPlan, progress: Callable[[str], None] | None = None,
                 nvml: Any = None, release_timeout_s: float = 60.0) -> KillResult:
    if plan.refusal:
        raise runs.Refused(plan.refusal)
    say = progress or (lambda _m: None)
    with Registry(ws.db_path) as reg:
        for rid in plan.run_ids:
            reg.update(rid, stop_requested=1)
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
    _gone, alive = psutil.wait_procs([proc for _p, proc in live], timeout=plan.grace_s)
    sigkilled = []
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
            sigkilled.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    if sigkilled:
        say(f"SIGKILL sent to {sigkilled}")
    _gone, alive = psutil.wait_procs(alive, timeout=5)
    t0 = time.time()
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
    waited = time.time() - t0
    freed = sum(h.used_bytes or 0 for h in plan.gpu_holds if h.pid not in still_holding)
    result = KillResult(signalled=[p.pid for p, _ in live], sigkilled=sigkilled,
                        still_alive=[p.pid for p in alive], still_holding=still_holding,
                        freed_bytes=freed, waited_s=waited)
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        for rid in plan.run_ids:
            r = reg.get(rid)
            if r.live and not runs.stage_alive(r) and not runs.process_alive(r.supervisor_pid, r.supervisor_create_time):
                reg.finish(rid, "killed", ended=time.time(), reason="kill-workers")
        reg.record("kill-workers", "ok" if result.ok else "incomplete", stage=plan.stage,
                   run_id=plan.run_ids[-1] if plan.run_ids else None,
                   targets=[{"pid": p.pid, "how": p.how} for p in plan.procs],
                   detail="; ".join(result.lines()))
    say("; ".join(result.lines()))
    return result


# ---------------------------------------------------------------- clean
@dataclass
class CleanPlan:
    stage: str
    roots: list[Path]
    files: list[tuple[Path, int]]          # (path, bytes)
    purge: bool
    trash: Path
    why: str = ""
    refusal: str | None = None
    skipped: list[str] = field(default_factory=list)   # what was not taken, and why

    @property
    def total_bytes(self) -> int:
        return sum(size for _p, size in self.files)

    def lines(self, limit: int = 40) -> list[str]:
        if self.refusal:
            return [f"refused: {self.refusal}"]
        verb = "DELETE" if self.purge else f"move to {self.trash}"
        out = [f"{verb}: {len(self.files)} partial file(s), {_human(self.total_bytes)} "
               f"under {', '.join(map(str, self.roots))} ({self.why})"]
        for path, size in self.files[:limit]:
            out.append(f"  {_human(size):>10}  {path}")
        if len(self.files) > limit:
            out.append(f"  ... and {len(self.files) - limit} more")
        for s in self.skipped[:10]:
            out.append(f"  kept: {s}")
        return out


@dataclass
class CleanResult:
    moved: int
    bytes: int
    destination: str | None
    failed: list[str]

    def lines(self) -> list[str]:
        where = f" to {self.destination}" if self.destination else " (deleted)"
        out = [f"cleaned {self.moved} file(s), {_human(self.bytes)}{where}"]
        out += [f"failed: {f}" for f in self.failed]
        return out


def _inside_without_symlinks(root: Path, path: Path) -> bool:
    """True when `path` lies under `root` and no component from root to it is a symlink."""
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    cur = root
    if root.is_symlink():
        return False
    for part in rel.parts:
        cur = cur / part
        try:
            if stat.S_ISLNK(os.lstat(cur).st_mode):
                return False
        except FileNotFoundError:
            return False
    return True


def _size(path: Path) -> int:
    """A file's bytes, or a directory's (train/export leave .tmp-<pid> checkpoint
    directories): its regular files summed, symlinks not followed."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for dirpath, _dirs, names in os.walk(path):
        for name in names:
            try:
                sub = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(sub.st_mode):
                total += sub.st_size
    return total


def _open_files_under(roots: list[Path]) -> list[str]:
    """Processes (any) holding files open under the roots: a writer is alive."""
    hits = []
    prefixes = [str(r) + os.sep for r in roots]
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            for f in proc.open_files():
                if any(f.path.startswith(p) for p in prefixes):
                    hits.append(f"pid {proc.pid} ({proc.info['name']}) has {f.path} open")
                    break
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return hits


def _candidates(stage: cfg.Stage, run: Run, roots: list[Path]) -> tuple[list[Path], str]:
    expects_samples = stage.expected_samples is not None
    if stage.spec:
        found: list[Path] = []
        for root in roots:
            found += stage.spec.partial_files(root)
        return found, "temp files and truncated or unreadable samples"
    if expects_samples:
        # A custom stage writing the hidden-state layout: whole samples are resume points.
        found = []
        for root in roots:
            found += sample_partials(root)
        return found, "temp files and truncated or unreadable samples"
    found = []
    since = (run.started or run.created) - 1.0
    for root in roots:
        if not root.is_dir():
            continue
        for dirpath, _dirs, names in os.walk(root):
            for name in names:
                p = Path(dirpath) / name
                try:
                    st = os.lstat(p)
                except FileNotFoundError:
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                if name.endswith(TMP_SUFFIXES) or st.st_mtime >= since:
                    found.append(p)
    return found, f"temp files and files written since run {run.id} started"


def plan_clean(ws: Workspace, stage_name: str, purge: bool = False) -> CleanPlan:
    pipe = cfg.load(ws.config_path)
    stage = pipe.stage(stage_name)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    trash = ws.trash_dir / f"{stamp}-{stage_name}"
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        run = reg.latest(stage_name)
    params = run.params if run else stage.params
    roots = [Path(p) for p in runs.output_paths(ws, stage, params)]
    plan = CleanPlan(stage=stage_name, roots=roots, files=[], purge=purge, trash=trash)
    if run is None:
        plan.refusal = f"stage {stage_name!r} never ran: nothing it wrote is partial"
        return plan
    if run.status == "succeeded":
        plan.refusal = (f"run {run.id} of {stage_name!r} succeeded: its outputs are complete and are never cleaned")
        return plan
    if run.live:
        plan.refusal = f"run {run.id} of {stage_name!r} is {run.status}: stop it first"
        return plan
    if not roots:
        plan.refusal = f"stage {stage_name!r} declares no outputs"
        return plan
    with Registry(ws.db_path) as reg:
        refs = [RunRef.from_run(r) for r in reg.runs(stage_name, limit=5)]
    alive = ProcessTable.snapshot().owners(tuple(refs))
    if alive:
        plan.refusal = (f"process(es) of stage {stage_name!r} still alive: "
                        f"{sorted(alive)}; run `kill-workers {stage_name}` first")
        return plan
    writers = _open_files_under(roots)
    if writers:
        plan.refusal = "a writer is still alive: " + "; ".join(writers[:3])
        return plan
    found, plan.why = _candidates(stage, run, roots)
    for path in sorted(set(found)):
        root = next((r for r in roots if r == path or r in path.parents), None)
        if root is None or not _inside_without_symlinks(root, path):
            plan.skipped.append(f"{path} (outside the output root or through a symlink)")
            continue
        try:
            plan.files.append((path, _size(path)))
        except FileNotFoundError:
            continue
    if not plan.files:
        plan.refusal = f"no partial files under {', '.join(map(str, roots))}"
    return plan


def execute_clean(ws: Workspace, plan: CleanPlan) -> CleanResult:
    if plan.refusal:
        raise runs.Refused(plan.refusal)
    # Conditions may have changed since the plan was shown: check again.
    fresh = plan_clean(ws, plan.stage, plan.purge)
    if fresh.refusal:
        raise runs.Refused(fresh.refusal)
    allowed = {p for p, _s in fresh.files}
    moved, total, failed = 0, 0, []
    if not plan.purge:
        plan.trash.mkdir(parents=True, exist_ok=True)
        trash_dev = os.stat(plan.trash).st_dev
    for path, size in plan.files:
        if path not in allowed:
            failed.append(f"{path}: no longer partial, kept")
            continue
        try:
            if plan.purge:
                # rmtree never follows a symlink inside the directory (fd-based on Linux).
                if stat.S_ISDIR(os.lstat(path).st_mode):
                    shutil.rmtree(path)
                else:
                    os.unlink(path)
            else:
                if os.lstat(path).st_dev != trash_dev:
                    failed.append(f"{path}: on another filesystem than the trash; kept (use --purge)")
                    continue
                rel = path.relative_to(ws.root) if ws.root in path.parents else Path(*path.parts[1:])
                dest = plan.trash / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, dest)
            moved += 1
            total += size
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
    result = CleanResult(moved, total, None if plan.purge else str(plan.trash), failed)
    with Registry(ws.db_path) as reg:
        reg.record("clean", "ok" if not failed else "partial", stage=plan.stage,
                   targets=[str(p) for p, _s in plan.files[:1000]], detail="; ".join(result.lines()))
    return result


# ---------------------------------------------------------------- restart
@dataclass
class RestartPlan:
    stage: str
    last: Run | None
    params: dict[str, Any]
    argv: list[str]
    kill: KillPlan | None
    oom_line: str | None = None
    halved: tuple[str, Any, Any] | None = None     # (param, old, new) applied
    suggestion: tuple[str, Any, Any] | None = None  # offered after an OOM, not applied
    refusal: str | None = None
    force: bool = False

    def lines(self) -> list[str]:
        if self.refusal:
            return [f"refused: {self.refusal}"]
        out = []
        if self.kill:
            out += self.kill.lines()
        if self.last:
            out.append(f"restart {self.stage} (last run {self.last.id}: {self.last.status})")
        else:
            out.append(f"start {self.stage}")
        if self.oom_line:
            out.append(f"out of memory seen: {self.oom_line.strip()[:120]}")
        if self.halved:
            out.append(f"{self.halved[0]}: {self.halved[1]} -> {self.halved[2]} (halved after the OOM)")
        elif self.suggestion:
            out.append(f"suggested: --set {self.suggestion[0]}={self.suggestion[2]} (halved after the OOM)")
        out.append("argv: " + " ".join(self.argv))
        return out


def halve(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"cannot halve {value!r}: not a number")
    return max(1, int(value) // 2) if isinstance(value, int) else max(1.0, value / 2)


def oom_line(run: Run | None) -> str | None:
    if run is None:
        return None
    from eagle3_console.monitor.logs import scan_for_oom
    return scan_for_oom(Path(run.log_path))


def plan_restart(ws: Workspace, stage_name: str, overrides: dict[str, Any] | None = None,
                 kill: bool = False, halve_batch: bool = False, force: bool = False, nvml: Any = None) -> RestartPlan:
    pipe = cfg.load(ws.config_path)
    stage = pipe.stage(stage_name)
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        last = reg.latest(stage_name)
    params = runs.stage_params(stage, overrides, base=last.params if last else None)
    plan = RestartPlan(stage=stage_name, last=last, params=params, argv=[], kill=None, force=force)
    if last and last.status in ("failed", "killed", "lost"):
        plan.oom_line = oom_line(last)
    if plan.oom_line and stage.batch_param and stage.batch_param in params \
            and stage.batch_param not in (overrides or {}):
        try:
            new = halve(params[stage.batch_param])
            if halve_batch:
                plan.halved = (stage.batch_param, params[stage.batch_param], new)
                params[stage.batch_param] = new
            else:
                plan.suggestion = (stage.batch_param, params[stage.batch_param], new)
        except ValueError as exc:
            plan.suggestion = None
            plan.oom_line += f" (cannot halve: {exc})"
    try:
        plan.argv = stage.command(params, pipe.target)
    except (KeyError, ValueError) as exc:
        plan.refusal = str(exc.args[0])
        return plan
    alive = bool(last) and (last.live or runs.stage_alive(last))
    # Workers that outlived a failed run still hold their GPU memory: a restart next to them OOMs again.
    leftovers = sorted(ProcessTable.snapshot().owners((RunRef.from_run(last),))) if last and not alive else []
    if alive or leftovers:
        if not kill:
            what = (f"run {last.id} of {stage_name!r} is still alive" if alive else
                    f"worker(s) {leftovers} of run {last.id} of {stage_name!r} are still alive")
            plan.refusal = f"{what}; stop it or restart with --kill"
            return plan
        plan.kill = plan_kill(ws, stage_name, nvml=nvml)
    return plan


def execute_restart(ws: Workspace, plan: RestartPlan, progress: Callable[[str], None] | None = None,
                    nvml: Any = None) -> Run:
    if plan.refusal:
        raise runs.Refused(plan.refusal)
    if plan.kill and not plan.kill.refusal:
        result = execute_kill(ws, plan.kill, progress=progress, nvml=nvml)
        if result.still_alive:
            raise runs.Refused(f"processes still alive after kill: {result.still_alive}")
    pipe = cfg.load(ws.config_path)
    reason = "restart" + (f", {plan.halved[0]} {plan.halved[1]} -> {plan.halved[2]} after OOM" if plan.halved else "")
    return runs.launch(ws, pipe, plan.stage, base_params=plan.params, force=plan.force,
                       restart_of=plan.last.id if plan.last else None, reason=reason)
