"""clean: partial outputs of a failed or killed run, moved to .eagle3/trash/ or deleted.

Data flow: config + registry + the op's spec (what counts as partial) ->
CleanPlan -> (confirm) -> execute_clean (re-plans first) -> events. Never a
succeeded run's files, never outside the output root, never through a symlink,
never while a process of the run lives, a writer holds a file open there, or
another live run (of any workspace) owns the output (claims.py).

Every file is reached from the output root's opened directory without
following a link, and moved or deleted relative to its parent's fd after its
(st_dev, st_ino) and its parents' are checked against the listing (fstree.py):
a folder swapped for a symlink while clean runs leads nowhere. Cleans of one
workspace take turns (.eagle3/clean.lock): the later ones re-plan, find
nothing left, and say so (exit 0).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator

import psutil

from eagle3_console.runs import claims
from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.runs import vouch
from eagle3_console.actions import hold
from eagle3_console.kernel.fstree import Changed, Dest, Entry, Root, ident
from eagle3_console.monitor.procs import ProcessTable, RunRef
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.kernel.units import human_bytes
from eagle3_console.kernel.workspace import Workspace

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
    # What the walk saw of each file: (its output root, the entry with its identity and its parents').
    entries: dict[Path, tuple[Path, Entry]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(size for _p, size in self.files)

    def lines(self, limit: int = 40) -> list[str]:
        if self.refusal:
            head = [f"{'nothing to do' if self.nothing_to_do else 'refused'}: {self.refusal}"]
            return head + [f"  kept: {s}" for s in self.skipped[:10]]
        # What and how much first, where second: a narrow dialog cuts a long line's end.
        verb = "DELETE them" if self.purge else f"move them to {self.trash}"
        out = [f"{len(self.files)} partial file(s), {human_bytes(self.total_bytes, '?')} "
               f"under {', '.join(map(str, self.roots))} ({self.why}): {verb}"]
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


def _admit(plan: CleanPlan, root: Root, entry: Entry) -> None:
    path = root.path_of(entry.rel)
    if path not in plan.entries:
        plan.files.append((path, root.size(entry)))
        plan.entries[path] = (root.path, entry)


def _admit_paths(plan: CleanPlan, root: Root, paths: list[Path], real_root: bool = False) -> None:
    """Paths an op (or verify's report) named under `root`, each looked up again
    from the root's fd: kept only when reached without a link and still the
    file the path string showed (the op judged that one)."""
    base = Path(os.path.realpath(root.path)) if real_root else root.path
    for path in sorted(set(paths)):
        rel = Path(os.path.relpath(os.path.normpath(path), base)).parts
        # A link verify judged is removed itself (its target is never reached).
        entry = root.lookup(rel, links=real_root) if rel and ".." not in rel else None
        try:
            seen = os.lstat(path)
        except OSError:
            continue
        if entry is None or ident(seen) != entry.ident:
            plan.skipped.append(f"{path} (outside the output root or through a symlink)")
            continue
        _admit(plan, root, entry)


def _open_files_under(roots: list[Path]) -> list[str]:
    """Processes (any) holding files open under the roots: a writer is alive."""
    hits = []
    prefixes = [str(r) + os.sep for r in roots]
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            for f in proc.open_files():
                if any(f.path.startswith(p) for p in prefixes) and os.path.basename(f.path) != claims.LOCK_NAME:
                    hits.append(f"pid {proc.pid} ({proc.info['name']}) has {f.path} open")
                    break
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return hits


def _collect(plan: CleanPlan, stage: cfg.Stage, run: Run, roots: list[Path], vouched: vouch.Vouch | None) -> str:
    """Fill the plan with the partial files under `roots`; returns what "partial" meant."""
    why = vouched.why if vouched else ""
    since = (run.started or run.created) - 1.0
    # The op's own rule; a custom stage writing the hidden-state layout: whole samples are resume points.
    rule = stage.spec.partial_rule(stage.expected_samples)
    for root_path in roots:
        try:
            root = Root(root_path)
        except OSError:
            continue            # absent (nothing written), or no longer a folder
        with root:
            if rule is not None:
                _admit_paths(plan, root, rule(root_path))
                why = "temp files and truncated or unreadable samples"
                continue
            for e in root.walk():
                if e.rel == (claims.LOCK_NAME,):
                    continue
                if e.rel[-1].endswith(TMP_SUFFIXES):
                    _admit(plan, root, e)
                elif vouched is not None:
                    if not vouched.keeps(str(root_path), "/".join(e.rel), [e.size, e.mtime_ns]):
                        _admit(plan, root, e)
                elif e.mtime_ns / 1e9 >= since:
                    _admit(plan, root, e)
    if rule is not None:
        return "temp files and truncated or unreadable samples"
    return why or f"temp files and files written since run {run.id} started (by the clock: no run recorded its files)"


def plan_clean(ws: Workspace, stage_name: str, purge: bool = False, pipe: cfg.Pipeline | None = None) -> CleanPlan:
    """`pipe`: the pipeline file as the caller read it (the re-plan at execution reads it again)."""
    pipe = pipe or cfg.load(ws.config_path)
    stage = pipe.stage(stage_name)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        run, registry = reg.latest(stage_name), reg.registry_id
        vouched = vouch.load_vouch(ws, reg.stage_history(stage_name), registry) \
            if vouch.records_files(stage) else None
    trash = ws.trash_dir / (f"{stamp}-{stage_name}" + (f"-run{run.id}" if run else ""))
    params = run.params if run else stage.params
    try:
        roots = [Path(p) for p in runs.output_paths(ws, stage, params)]
        if vouched is not None and vouched.roots is not None:
            roots = [Path(p) for p in vouched.roots]      # what the run wrote, whatever eagle3.toml names now
    except runs.Refused as exc:
        return CleanPlan(stage=stage_name, roots=[], files=[], purge=purge, trash=trash, refusal=str(exc))
    plan = CleanPlan(stage=stage_name, roots=roots, files=[], purge=purge, trash=trash)
    if run is None:
        plan.refusal = f"stage {stage_name!r} never ran: nothing it wrote is partial"
        plan.nothing_to_do = True
        return plan
    if run.status == RunStatus.SUCCEEDED:
        # A complete output is never cleaned, except the samples a verify stage's
        # report names as bad (still unchanged since): resume rewrites those.
        bad, report, data = _reported_bad(ws, pipe, roots)
        if bad and not _owned(plan, [data], registry):
            try:
                with Root(data) as root:
                    _admit_paths(plan, root, [b.path for b in bad], real_root=True)
            except OSError as exc:
                plan.refusal = f"{data}: {exc.strerror}"
                return plan
            plan.why = (f"run {run.id} succeeded, but verify's report {report} names these as bad; "
                        f"`run {stage_name}` again rewrites them")
            if not plan.files:
                plan.refusal = f"the bad files verify's report {report} names are gone or changed since"
                plan.nothing_to_do = True
        if bad:
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
    if _owned(plan, roots, registry):
        return plan
    writers = _open_files_under(roots)
    if writers:
        plan.refusal = "a writer is still alive: " + "; ".join(writers[:3])
        return plan
    plan.why = _collect(plan, stage, run, roots, vouched)
    plan.files.sort()       # by path: the plan reads (and moves) in the order an operator checks it
    if not plan.files:
        plan.refusal = f"no partial files under {', '.join(map(str, roots))}"
        plan.nothing_to_do = True
    return plan


def _owned(plan: CleanPlan, roots: list[Path], registry: str) -> bool:
    """Refuse an output another live run owns (its lock file: claims.py), e.g.
    a run of another workspace writing the same /shared/out."""
    for root in roots:
        try:
            # Another clean of this workspace: its turn comes first, and the re-plan after it says what is left.
            owner = claims.live_owner_around(root, skip=lambda o: hold.mine(o) or (
                o.action == hold.ACTION and o.registry == registry))
        except claims.NotALock as exc:
            plan.refusal = str(exc)
            return True
        if owner:
            where = "" if owner.lock.parent == Path(os.path.normpath(os.path.abspath(root))) else \
                f" (it overlaps {owner.lock.parent})"
            plan.refusal = (f"output {root}{where} is owned by {owner.describe()}, which is live: clean never "
                            f"touches an output another run is writing")
            return True
    return False


def _reported_bad(ws: Workspace, pipe: cfg.Pipeline, roots: list[Path]) -> tuple[list, Path | None, Path | None]:
    """The bad files that a judging stage of this pipeline (its spec's bad_files:
    verify's report) names under one of `roots` (only files inside the root,
    unchanged since), the report and that root. The report's relative paths are
    the judging run's, which ran in the workspace: they resolve there, wherever
    clean is called from."""
    for other in pipe.stages.values():
        judge = other.spec.bad_files
        if judge is None or not other.params.get(judge.output_param) or not other.params.get(judge.report_param):
            continue
        data = ws.resolve(str(other.params[judge.output_param]))
        if data not in roots:
            continue
        report = ws.resolve(str(other.params[judge.report_param]))
        bad = judge.read(report, data, ws.root)
        if bad:
            return bad, report, data
    return [], None, None


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


def _trash_rel(ws_root: Path, path: Path) -> tuple[str, ...]:
    """Where `path` (normalised, see Workspace.resolve) goes in this clean's trash
    folder: its place under the workspace, or under `outside/` its absolute
    path for an output on another disk (Dest never renames onto a file there)."""
    path = Path(os.path.normpath(path))
    rel = path.relative_to(ws_root).parts if ws_root in path.parents else ("outside", *path.parts[1:])
    if not rel or ".." in rel:
        raise OSError(0, f"no place in the trash for {path}")
    return rel


@contextmanager
def _turn(ws: Workspace) -> Iterator[None]:
    """One clean of a workspace at a time: the next one re-plans after it."""
    fd = os.open(ws.state_dir / "clean.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def execute_clean(ws: Workspace, plan: CleanPlan) -> CleanResult:
    if plan.refusal:
        raise runs.Refused(plan.refusal)
    with _turn(ws), ExitStack() as held:
        # The stage is held before the check below and for as long as files move:
        # taken in a write transaction, so a launch (which checks the hold in its
        # own) either created its run before (the check sees it live) or is refused.
        with Registry(ws.db_path) as reg, reg.immediate():
            latest = reg.latest(plan.stage)
            held.enter_context(hold.holding(ws, reg.registry_id, plan.stage, latest.id if latest else 0,
                                            plan.roots))
        # Conditions may have changed since the plan was shown: check again.
        fresh = plan_clean(ws, plan.stage, plan.purge)
        if fresh.refusal:
            # Nothing partial left (a parallel clean took it): what was asked for holds.
            raise (runs.NothingToDo if fresh.nothing_to_do else runs.Refused)(fresh.refusal)
        result = _execute(ws, plan, fresh)
    with Registry(ws.db_path) as reg:
        reg.record("clean", "ok" if not result.failed else "partial", stage=plan.stage,
                   targets=[str(p) for p, _s in plan.files[:1000]], detail="; ".join(result.lines()))
    return result


def _execute(ws: Workspace, plan: CleanPlan, fresh: CleanPlan) -> CleanResult:
    moved, total, failed = 0, 0, []
    dest = None
    if not plan.purge:
        plan.trash = _fresh_dir(plan.trash)
        dest = Dest(plan.trash)
    opened: dict[Path, Root] = {}
    try:
        for path, size in plan.files:
            now = fresh.entries.get(path)
            seen = plan.entries.get(path, now)
            if now is None:
                failed.append(f"{path}: no longer partial, kept")
                continue
            root_path, entry = now
            if seen[1].ident != entry.ident:
                failed.append(f"{path}: another file since the plan, kept")
                continue
            try:
                root = opened.get(root_path) or opened.setdefault(root_path, Root(root_path))
                if dest is None:
                    root.remove(entry)
                elif entry.dev != dest.dev:
                    failed.append(f"{path}: on another filesystem than the trash; kept (use --purge)")
                    continue
                else:
                    root.move(entry, dest, _trash_rel(ws.root, path))
                moved += 1
                total += size
            except Changed as exc:
                failed.append(f"{path}: {exc.strerror}; kept")
            except OSError as exc:
                failed.append(f"{path}: {exc.strerror or exc}")
    finally:
        for root in opened.values():
            root.close()
        if dest is not None:
            dest.close()
    return CleanResult(moved, total, None if plan.purge else str(plan.trash), failed)
