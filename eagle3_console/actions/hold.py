"""clean's hold on a stage's outputs, for as long as it moves files.

A run claims its output folders with their lock files (claims.py); clean,
while it moves or deletes, holds the same lock files naming itself
(`"action": "clean"`). So a run of the stage started meanwhile is refused
(runs.launch checks the hold in the transaction that creates the run, and
the run's supervisor cannot claim a folder clean holds), and a run of another
workspace into the same output is refused as it is while a run lives.

Data flow: actions/clean.py execute_clean -> holding() -> <output>/.eagle3-lock
-> runs.launch (claims.held_by_action) and supervise (Claim).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil

from eagle3_console.runs import claims
from eagle3_console.kernel.refused import Refused
from eagle3_console.kernel.workspace import Workspace

ACTION = "clean"


def mine(owner: claims.Owner) -> bool:
    """Whether a lock's owner is this process's own hold."""
    return owner.action == ACTION and any(pid == os.getpid() for pid, _t in owner.pids)


@contextmanager
def holding(ws: Workspace, registry: str, stage: str, run_id: int, roots: list[Path]) -> Iterator[None]:
    """Every existing root's lock file taken and naming this clean; Refused
    when another process holds one."""
    held: dict[Path, int] = {}
    me = psutil.Process()
    content = json.dumps({"workspace": str(ws.root), "registry": registry, "run": run_id, "stage": stage,
                          "host": claims.host(), "pids": [[me.pid, me.create_time()]], "action": ACTION,
                          "since": time.time()}).encode()
    try:
        for root in roots:
            if not root.is_dir() or root.is_symlink():
                continue            # nothing to move there (a symlinked output is never followed)
            held[root] = _take(root / claims.LOCK_NAME, content)
        yield
    finally:
        for root, fd in held.items():
            try:
                os.unlink(root / claims.LOCK_NAME)        # still held: no one else's lock is unlinked
            except OSError:
                pass
            os.close(fd)


def _take(lock: Path, content: bytes) -> int:
    for _attempt in range(40):
        try:
            fd = claims.open_lock(lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            raise Refused(f"cannot hold {lock} while clean moves files: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            time.sleep(0.05)        # a probe (live_owner) holds it for an instant
            continue
        try:
            same = os.stat(lock, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if not same:                # unlinked by a releaser between our open and our flock
            os.close(fd)
            continue
        owner = claims.Owner.parse(claims.read_lock(fd), lock)
        if owner and owner.pids_alive():
            os.close(fd)
            raise Refused(f"output {lock.parent} is owned by {owner.describe()}, which is live: clean never "
                          f"touches an output another run is writing")
        os.ftruncate(fd, 0)
        os.pwrite(fd, content, 0)
        return fd
    owner = claims.live_owner(lock.parent)
    raise Refused(f"output {lock.parent} is held by {owner.describe() if owner else 'another process'}; "
                  f"clean again once it has ended")
