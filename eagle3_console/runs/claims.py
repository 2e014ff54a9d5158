"""Who writes an output.

Two workspaces may name one output (/shared/out). The supervisor of every run
claims each of its output folders once it exists: `<output>/.eagle3-lock`,
flock()ed while the supervisor lives, names the workspace, registry, run, stage
and host, and the pids (supervisor, then the stage's leader) with their create
times. A claim covers the folders under and over it (a run writing /sh/out
owns /sh/out/sub, and a clean of /sh would move its files): clean refuses an
output that another live run's claim overlaps, and runs.launch refuses to
start a second writer into it. Live means: the flock is held, or (on this
host) one of the named pids runs with its create time (the stage may outlive
a killed supervisor; a pid reused since does not count). clean, while it moves
files, holds the same lock files as an action (actions/hold.py). Anything but
a regular file at a lock's name (a folder, a FIFO) is NotALock: one line, never
a hang.

What a succeeded run vouches for (the files of a custom stage) is vouch.py's.

Data flow: supervise.py -> Claim (lock files) -> actions/clean.py
(live_owner_around) and runs.launch (owned_elsewhere, held_by_action).
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from eagle3_console.runs.vouch import manifest_path, record_present, write_manifest
from eagle3_console.kernel.workspace import Workspace
from ops.common import CLAIM_FILE

if TYPE_CHECKING:  # status --json reads claims and must not pay for subprocess (threading)
    import subprocess

LOCK_NAME = CLAIM_FILE
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
    action: str = ""        # "clean": an action holding the output, not a run

    def describe(self) -> str:
        pid = f", pid {self.pids[-1][0]}" if self.pids else ""
        what = f"{self.action} of" if self.action else f"run {self.run} of"
        return (f"{what} stage {self.stage!r} in workspace {self.workspace} "
                f"(host {self.host}{pid}; {self.lock})")

    @classmethod
    def parse(cls, text: str, lock: Path) -> "Owner | None":
        try:
            d = json.loads(text)
            return cls(str(d["workspace"]), str(d.get("registry", "")), int(d["run"]), str(d.get("stage", "?")),
                       str(d.get("host", "")), [(int(p), float(t)) for p, t in d.get("pids", [])], lock,
                       str(d.get("action") or ""))
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


def read_lock(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 1 << 16).decode("utf-8", "replace")


class NotALock(OSError):
    """Something other than a regular file where a lock file belongs (a folder, a FIFO)."""

    def __init__(self, lock: Path, what: str):
        fix = f"rmdir {lock}" if what == "folder" else f"rm {lock}"
        super().__init__(f"{lock} is a {what}, not a lock file (the console writes a regular file there): "
                         f"remove it ({fix}) once no run of any workspace writes {lock.parent}")
        self.lock = lock


def open_lock(lock: Path, flags: int) -> int:
    """The lock file's fd, never blocking: a FIFO would hang a read, a folder fail it."""
    try:
        fd = os.open(lock, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except IsADirectoryError:
        raise NotALock(lock, "folder") from None
    except OSError as exc:
        if exc.errno == 6:          # ENXIO: a socket, or a FIFO opened for writing with no reader
            raise NotALock(lock, "socket or FIFO") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotALock(lock, "folder" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "special file")
    return fd


def live_owner(output: str | os.PathLike) -> Owner | None:
    """The live run (or clean) that owns `output` (its lock file), or None.
    Raises NotALock where something else sits at the lock's name."""
    return _owner_at(Path(output) / LOCK_NAME)


def locks_around(output: str | os.PathLike) -> Iterator[Path]:
    """Every lock file that claims a folder overlapping `output`: its own, its
    parents' (a run writing /sh/out owns /sh/out/sub) and those of the folders
    under it (a clean of /sh would move what it writes); links not followed."""
    out = Path(os.path.normpath(os.path.abspath(output)))
    yield out / LOCK_NAME
    for parent in out.parents:
        yield parent / LOCK_NAME
    for dirpath, dirs, files in os.walk(out):
        if dirpath != str(out) and (LOCK_NAME in files or LOCK_NAME in dirs):
            yield Path(dirpath) / LOCK_NAME
        if LOCK_NAME in dirs:
            dirs.remove(LOCK_NAME)


def live_owner_around(output: str | os.PathLike, skip: Any = None) -> Owner | None:
    """The first live owner of a folder overlapping `output` for which
    `skip(owner)` is not true (see locks_around)."""
    for lock in locks_around(output):
        owner = _owner_at(lock)
        if owner and not (skip and skip(owner)):
            return owner
    return None


def _owner_at(lock: Path) -> Owner | None:
    try:
        fd = open_lock(lock, os.O_RDONLY)
    except NotALock:
        raise
    except OSError:
        return None
    try:
        owner = Owner.parse(read_lock(fd), lock)
        if _flock_held(fd):
            return owner or Owner("(unreadable lock)", "", 0, "?", "?", [], lock)
        return owner if owner and owner.pids_alive() else None
    finally:
        os.close(fd)


def owned_elsewhere(outputs: list[str], registry: str, stage: str) -> str | None:
    """Why a run of `stage` may not write these outputs now, or None."""
    for out in outputs:
        try:
            owner = live_owner_around(out, skip=lambda o: o.registry == registry and o.stage == stage
                                      and not o.action)
        except NotALock as exc:
            return str(exc)
        if owner and owner.action:
            return _moving(out, owner)
        if owner:
            where = "" if owner.lock.parent == Path(os.path.normpath(os.path.abspath(out))) else \
                f" (it overlaps {owner.lock.parent})"
            return (f"output {out}{where} is owned by {owner.describe()}; two writers would mix their files: "
                    f"stop that run, or give this stage another output")
    return None


def held_by_action(outputs: list[str]) -> str | None:
    """Why a run may not start now because an action (clean) holds one of its
    outputs, or None: only the outputs' own lock files, cheap enough to ask
    inside the transaction that creates the run."""
    for out in outputs:
        try:
            owner = live_owner(out)
        except NotALock as exc:
            return str(exc)
        if owner and owner.action:
            return _moving(out, owner)
    return None


def _moving(out: str, owner: Owner) -> str:
    return f"output {out}: {owner.describe()} is moving files there; run again once it has ended"


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
    def for_run(cls, ws: Workspace, run: Any, reg: Any, outputs: list[str], vouch: bool) -> "Claim":
        """The run's outputs and whether its files are vouched for by manifest, as its
        launch resolved them (the supervisor's Handoff: never the pipeline file again)."""
        claim = cls(ws, run, reg.registry_id, outputs, vouch, reg.stage_history(run.stage))
        if vouch:
            claim._manifest("start")        # the state this run begins from (vouch.Vouch)
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
            why = self._overlapped(out) or self._claim(out)
            if why:
                conflicts.append(why)
                self.outputs.remove(out)      # not ours: never asked again
        return conflicts

    def _overlapped(self, out: str) -> str | None:
        """A live claim of a folder above or under `out` (not this run's)."""
        for lock in list(locks_around(out))[1:]:
            try:
                owner = _owner_at(lock)
            except NotALock:
                continue            # not a claim: the folder's own lock is the one that must be a file
            if owner and not (owner.registry == self.registry and owner.run == self.run.id):
                return f"output {out} overlaps {lock.parent}, owned by {owner.describe()}"
        return None

    def _claim(self, out: str) -> str | None:
        lock = Path(out) / LOCK_NAME
        for _attempt in range(40):
            try:
                fd = open_lock(lock, os.O_RDWR | os.O_CREAT)
            except NotALock as exc:
                return str(exc)
            except OSError as exc:
                self.notes.append(f"{lock}: not claimed: {exc.strerror}")
                self.outputs.remove(out)
                return None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = Owner.parse(read_lock(fd), lock)
                os.close(fd)
                if owner and owner.registry == self.registry and owner.run == self.run.id and not owner.action:
                    return None
                if owner and owner.action:
                    return f"output {out}: {owner.describe()} is moving files there"
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
            owner = Owner.parse(read_lock(fd), lock)
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
        if succeeded:
            try:
                record_present(self.ws, self.registry, self.run.id, self.outputs)
            except OSError as exc:
                self.notes.append(f"record of the outputs present not written: {exc.strerror}")
            if self.vouch:
                self._manifest("end")
            # Only the latest succeeded run's records and the starts after it are read: the older ones go.
            for rid, _status in self.history:
                if rid < self.run.id:
                    for kind in ("end", "start", "outputs"):
                        manifest_path(self.ws, self.registry, rid, kind).unlink(missing_ok=True)
        for out, fd in self.held.items():
            try:
                os.unlink(Path(out) / LOCK_NAME)
            except OSError:
                pass
            os.close(fd)
        self.held = {}
