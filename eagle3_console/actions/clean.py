"""clean: partial outputs of a failed or killed run, moved to .eagle3/trash/ or deleted.

Data flow: config + registry + the op's spec (what counts as partial) ->
CleanPlan -> (confirm) -> execute_clean (re-plans first) -> events. Never a
succeeded run's files, never outside the output root, never through a symlink,
never while a process of the run lives or a writer holds a file open there.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import psutil

from eagle3_console import config as cfg
from eagle3_console import runs
from eagle3_console.monitor.procs import ProcessTable, RunRef
from eagle3_console.registry import Registry, Run
from eagle3_console.units import human_bytes
from eagle3_console.workspace import Workspace
from ops.extract.spec import partial_files as sample_partials

TMP_SUFFIXES = (".tmp", ".partial", ".incomplete")


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
    nothing_to_do: bool = False     # the refusal is "nothing partial" (exit 0), not "unsafe" (2)

    @property
    def total_bytes(self) -> int:
        return sum(size for _p, size in self.files)

    def lines(self, limit: int = 40) -> list[str]:
        if self.refusal:
            head = [f"{'nothing to do' if self.nothing_to_do else 'refused'}: {self.refusal}"]
            return head + [f"  kept: {s}" for s in self.skipped[:10]]
        verb = "DELETE" if self.purge else f"move to {self.trash}"
        out = [f"{verb}: {len(self.files)} partial file(s), {human_bytes(self.total_bytes, '?')} "
               f"under {', '.join(map(str, self.roots))} ({self.why})"]
        for path, size in self.files[:limit]:
            out.append(f"  {human_bytes(size, '?'):>10}  {path}")
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
        out = [f"cleaned {self.moved} file(s), {human_bytes(self.bytes, '?')}{where}"]
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
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        run = reg.latest(stage_name)
    trash = ws.trash_dir / (f"{stamp}-{stage_name}" + (f"-run{run.id}" if run else ""))
    params = run.params if run else stage.params
    try:
        roots = [Path(p) for p in runs.output_paths(ws, stage, params)]
    except runs.Refused as exc:
        return CleanPlan(stage=stage_name, roots=[], files=[], purge=purge, trash=trash, refusal=str(exc))
    plan = CleanPlan(stage=stage_name, roots=roots, files=[], purge=purge, trash=trash)
    if run is None:
        plan.refusal = f"stage {stage_name!r} never ran: nothing it wrote is partial"
        plan.nothing_to_do = True
        return plan
    if run.status == "succeeded":
        # A complete output is never cleaned, except the samples a verify stage's
        # report names as bad (still unchanged since): resume rewrites those.
        bad, report = _verify_reported(ws, pipe, roots)
        if bad:
            plan.files = [(b.path, b.size) for b in bad]
            plan.why = (f"run {run.id} succeeded, but verify's report {report} names these as bad; "
                        f"`run {stage_name}` again rewrites them")
            return plan
        plan.refusal = (f"run {run.id} of {stage_name!r} succeeded: its outputs are complete and are never cleaned; "
                        f"to redo the stage, move {', '.join(map(str, roots)) or 'its output'} aside yourself and run it again")
        return plan
    if run.live:
        plan.refusal = f"run {run.id} of {stage_name!r} is {run.status}: stop it first"
        return plan
    if not roots:
        plan.refusal = f"stage {stage_name!r} declares no outputs"
        return plan
    # An output that is a symlink is never followed: what it points to may be
    # anyone's. Say which, rather than "no partial files".
    links = [r for r in roots if r.is_symlink()]
    for r in links:
        plan.skipped.append(f"{r} (a symlink to {os.readlink(r)}; clean never follows it)")
    roots = plan.roots = [r for r in roots if r not in links]
    if not roots:
        plan.refusal = (f"the output {', '.join(map(str, links))} of {stage_name!r} is a symlink; clean never follows "
                        f"one: clean the folder it points to yourself")
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
        plan.nothing_to_do = True
    return plan


def _verify_reported(ws: Workspace, pipe: cfg.Pipeline, roots: list[Path]) -> tuple[list, Path | None]:
    """The bad files that a verify stage of this pipeline reported under one of
    `roots` (ops.verify.reported: only files inside the root, unchanged since)."""
    from ops.verify.reported import ReportError, reported_bad_files
    for other in pipe.stages.values():
        if other.op != "verify" or not other.params.get("input") or not other.params.get("report"):
            continue
        data = ws.resolve(str(other.params["input"]))
        if data not in roots:
            continue
        report = ws.resolve(str(other.params["report"]))
        try:
            bad = reported_bad_files(report, data)
        except ReportError:
            continue
        if bad:
            return bad, report
    return [], None


def _fresh_dir(path: Path) -> Path:
    """`path`, or `path-2`, `path-3`... : a trash folder of its own, so that a
    second clean in the same second never renames onto the first one's files."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 1000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise runs.Refused(f"{path}: 999 trash folders of that name already exist")


def _trash_destination(trash: Path, root: Path, path: Path) -> Path:
    """Where `path` (normalised, see Workspace.resolve) goes in this clean's trash
    folder: its place under the workspace, or under `outside/` its absolute
    path for an output on another disk; never onto a file already there."""
    path = Path(os.path.normpath(path))
    rel = path.relative_to(root) if root in path.parents else Path("outside", *path.parts[1:])
    dest = Path(os.path.normpath(trash / rel))
    if trash not in dest.parents:
        raise OSError(0, f"trash destination {dest} would leave {trash}")
    n = 1
    candidate = dest
    while os.path.lexists(candidate):
        n += 1
        candidate = dest.with_name(f"{dest.name}.{n}")
    return candidate


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
        plan.trash = _fresh_dir(plan.trash)
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
                dest = _trash_destination(plan.trash, ws.root, path)
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
