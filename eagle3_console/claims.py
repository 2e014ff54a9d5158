"""Who writes an output, and what a complete run left in it.

Two workspaces may name one output (/shared/out). The supervisor of every run
claims each of its output folders once it exists: `<output>/.eagle3-lock`,
flock()ed while the supervisor lives, names the workspace, registry, run, stage
and host, and the pids (supervisor, then the stage's leader) with their create
times. clean refuses an output that another live run owns, and runs.launch
refuses to start a second writer into it. Live means: the flock is held, or
(on this host) one of the named pids runs with its create time (the stage may
outlive a killed supervisor; a pid reused since does not count).

For a custom stage that counts no samples (no op record says which of its files
are complete), the supervisor also records the files under its outputs, by size
and mtime as found: at the run's start, and after the run succeeded. clean's
partial files are those that no such record vouches for; compared for equality,
so no clock (a file server's or a run's) decides.

Data flow: supervise.py -> Claim (lock files, .eagle3/vouched/*.json) ->
actions/clean.py (live_owner, vouched_files) and runs.launch (owned_elsewhere).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3_console.fstree import Root
from eagle3_console.registry import RunStatus
from eagle3_console.workspace import Workspace
from ops.common import CLAIM_FILE

if TYPE_CHECKING:  # status --json reads claims and must not pay for subprocess (threading)
    import subprocess

LOCK_NAME = CLAIM_FILE
VOUCHED_DIR = "vouched"
POLL_S = 0.5        # how often a supervisor looks for an output its stage has just created (or swapped)


def host() -> str:
    return os.uname().nodename


@dataclass
class Owner:
    workspace: str
    registry: str
    run: int
    stage: str
    host: str
    pids: list[tuple[int, float]]
    lock: Path

    def describe(self) -> str:
        pid = f", pid {self.pids[-1][0]}" if self.pids else ""
        return (f"run {self.run} of stage {self.stage!r} in workspace {self.workspace} "
                f"(host {self.host}{pid}; {self.lock})")

    @classmethod
    def parse(cls, text: str, lock: Path) -> "Owner | None":
        try:
            d = json.loads(text)
            return cls(str(d["workspace"]), str(d.get("registry", "")), int(d["run"]), str(d.get("stage", "?")),
                       str(d.get("host", "")), [(int(p), float(t)) for p, t in d.get("pids", [])], lock)
        except (ValueError, KeyError, TypeError):
            return None

    def pids_alive(self) -> bool:
        if self.host != host():
            return False        # pids of another machine cannot be checked here: the flock says
        from eagle3_console.monitor.procs import process_alive
        return any(process_alive(pid, ct) for pid, ct in self.pids)


def _flock_held(fd: int) -> bool:
    """Whether another open file description holds the lock (a shared probe, let go at once)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _read(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 1 << 16).decode("utf-8", "replace")


def live_owner(output: str | os.PathLike) -> Owner | None:
    """The live run that owns `output` (its lock file), or None."""
    lock = Path(output) / LOCK_NAME
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        owner = Owner.parse(_read(fd), lock)
        if _flock_held(fd):
            return owner or Owner("(unreadable lock)", "", 0, "?", "?", [], lock)
        return owner if owner and owner.pids_alive() else None
    finally:
        os.close(fd)


def owned_elsewhere(outputs: list[str], registry: str, stage: str) -> str | None:
    """Why a run of `stage` may not write these outputs now, or None."""
    for out in outputs:
        owner = live_owner(out)
        if owner and not (owner.registry == registry and owner.stage == stage):
            return (f"output {out} is owned by {owner.describe()}; two writers would mix their files: "
                    f"stop that run, or give this stage another output")
    return None


# ---------------------------------------------------------------- what runs vouch for
def manifest_path(ws: Workspace, registry: str, run_id: int, kind: str) -> Path:
    return ws.state_dir / VOUCHED_DIR / f"{registry}-{run_id:06d}-{kind}.json"


def record_files(outputs: list[str]) -> dict[str, dict[str, list[int]]]:
    """{output: {relative path: [size, mtime_ns]}} of the regular files found,
    links not followed, the lock file left out."""
    found: dict[str, dict[str, list[int]]] = {}
    for out in outputs:
        try:
            with Root(out) as root:
                found[out] = {"/".join(e.rel): [e.size, e.mtime_ns] for e in root.walk()
                              if e.rel != (LOCK_NAME,)}
        except OSError:
            found[out] = {}
    return found


def write_manifest(path: Path, run_id: int, stage: str, outputs: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"run": run_id, "stage": stage, "time": time.time(),
                               "roots": record_files(outputs)}))
    os.replace(tmp, path)


def read_manifest(path: Path) -> dict[str, dict[str, list[int]]] | None:
    try:
        roots = json.loads(path.read_text())["roots"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return roots if isinstance(roots, dict) else None


def records_files(stage: Any) -> bool:
    """The stages whose files no op record or sample check vouches for."""
    return stage.spec is None and stage.expected_samples is None


class Claim:
    """The outputs one supervisor claims for its run: lock fds held until release."""

    def __init__(self, ws: Workspace, run: Any, registry: str, outputs: list[str], vouch: bool,
                 history: list[tuple[int, str]] | None = None):
        self.ws, self.run, self.registry, self.vouch = ws, run, registry, vouch
        self.history = history or []        # (id, status) of the stage's runs, as at the start
        self.outputs = outputs
        self.held: dict[str, int] = {}
        self.pids: list[tuple[int, float]] = []
        self.notes: list[str] = []

    @classmethod
    def for_run(cls, ws: Workspace, run: Any, reg: Any) -> "Claim":
        """The run's outputs as its stage names them now; none when the pipeline
        file no longer loads (the run goes on; only the claim is lost)."""
        registry = reg.registry_id
        try:
            from eagle3_console import config as cfg
            from eagle3_console.outputs import output_paths
            stage = cfg.load(ws.config_path).stage(run.stage)
            outputs = output_paths(ws, stage, run.params)
            vouch = records_files(stage)
        except Exception as exc:      # noqa: BLE001 - never stop a run for its bookkeeping
            claim = cls(ws, run, registry, [], False)
            claim.notes.append(f"outputs not claimed: {exc}")
            return claim
        claim = cls(ws, run, registry, outputs, vouch, reg.stage_history(run.stage) if vouch else [])
        # Only the stage's first record of "what was there before" is ever read (clean's _vouched).
        if vouch and not any(manifest_path(ws, registry, rid, "start").exists()
                             for rid, _s in claim.history if rid != run.id):
            claim._manifest("start")
        return claim

    def _manifest(self, kind: str) -> None:
        try:
            write_manifest(manifest_path(self.ws, self.registry, self.run.id, kind), self.run.id,
                           self.run.stage, self.outputs)
        except OSError as exc:
            self.notes.append(f"record of the output's files not written: {exc.strerror}")

    def _content(self) -> bytes:
        return json.dumps({"workspace": str(self.ws.root), "registry": self.registry, "run": self.run.id,
                           "stage": self.run.stage, "host": host(), "pids": self.pids,
                           "since": time.time()}).encode()

    @property
    def pending(self) -> list[str]:
        return [o for o in self.outputs if o not in self.held]

    def refresh(self) -> list[str]:
        """Claim every output folder that exists now and is not claimed yet (or
        no longer: a stage that swaps its output folder in, as export does,
        takes our lock away with the old one); returns the conflicts (an
        output another live run owns)."""
        for out, fd in list(self.held.items()):
            try:
                st = os.stat(Path(out) / LOCK_NAME, follow_symlinks=False)
                here = os.fstat(fd)
                still = (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)
            except OSError:
                still = False
            if not still:
                os.close(fd)
                del self.held[out]
        conflicts = []
        for out in self.pending:
            if not os.path.isdir(out):
                continue
            why = self._claim(out)
            if why:
                conflicts.append(why)
                self.outputs.remove(out)      # not ours: never asked again
        return conflicts

    def _claim(self, out: str) -> str | None:
        lock = Path(out) / LOCK_NAME
        for _attempt in range(40):
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                self.notes.append(f"{lock}: not claimed: {exc.strerror}")
                self.outputs.remove(out)
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = Owner.parse(_read(fd), lock)
                os.close(fd)
                if owner and owner.registry == self.registry and owner.run == self.run.id:
                    return None
                time.sleep(0.05)            # a clean's probe holds it for an instant
                continue
            # Held: make sure it is still the file at that name (not unlinked by a releaser).
            try:
                same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except OSError:
                same = False
            if not same:
                os.close(fd)
                continue
            owner = Owner.parse(_read(fd), lock)
            if owner and not (owner.registry == self.registry and owner.run == self.run.id) and owner.pids_alive():
                os.close(fd)
                return f"output {out} is owned by {owner.describe()}"
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._content(), 0)
            self.held[out] = fd
            return None
        owner = live_owner(out)
        return f"output {out} is owned by {owner.describe() if owner else 'another process holding ' + str(lock)}"

    def set_pids(self, *pids: tuple[int | None, float | None]) -> None:
        self.pids = [(p, t) for p, t in pids if p and t]
        for fd in self.held.values():
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._content(), 0)

    def wait(self, proc: "subprocess.Popen", log: Any = None) -> int:
        """proc.wait(), claiming outputs as the stage creates them."""
        import subprocess  # only the supervisor waits; see the TYPE_CHECKING import
        while self.outputs:
            try:
                return proc.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                for why in self.refresh():
                    if log is not None:
                        log.write(f"[eagle3-console] {why}; not claimed\n".encode())
        return proc.wait()

    def release(self, succeeded: bool) -> None:
        """Before the end is recorded: a succeeded run's record of its files, and
        its locks removed (still held, so no one else's lock is unlinked)."""
        if succeeded and self.vouch:
            self._manifest("end")
            # Only the latest succeeded run's record is read: the older ones go.
            for rid, status in self.history:
                if status == RunStatus.SUCCEEDED and rid != self.run.id:
                    manifest_path(self.ws, self.registry, rid, "end").unlink(missing_ok=True)
        for out, fd in self.held.items():
            try:
                os.unlink(Path(out) / LOCK_NAME)
            except OSError:
                pass
            os.close(fd)
        self.held = {}
