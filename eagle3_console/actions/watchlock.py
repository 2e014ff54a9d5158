"""The one-watch-at-a-time lock of a workspace: an flock on the state folder
itself, released by the kernel when the holder dies.

An flock on a file path holds only while the path names the locked inode:
once `.eagle3/watch.lock` is deleted, a second watch creates a new file and
locks it beside the first. The state folder cannot be unlinked while it holds
the registry, so the lock is taken there.
`watch.lock` is still locked second (and holds the holder's pid for the
refusal's message): a holder of the file alone, such as an older console, is
still seen. Writing the pid is best effort: on a full filesystem the folder's
lock alone excludes the others.
"""

from __future__ import annotations

import errno
import fcntl
import os

from eagle3_console.kernel.registry import StateError
from eagle3_console.kernel.workspace import Workspace


class LockHeld(Exception):
    pass


class WatchLock:
    def __init__(self, ws: Workspace):
        ws.ensure_state()
        self.dir = ws.state_dir
        self.path = ws.watch_lock_path
        self.fds: list[int] = []

    def __enter__(self) -> "WatchLock":
        try:
            self._lock(os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                    raise
                return self     # no room for the pid file: the folder's lock holds alone
            self._lock(fd)
            self._write_pid(fd)
        except LockHeld:
            self.__exit__()
            raise
        except OSError as exc:
            self.__exit__()
            raise StateError(f"{self.path}: cannot take the watch lock: {exc.strerror}") from None
        return self

    def _lock(self, fd: int) -> None:
        self.fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(f"another watch holds {self.path} (pid {self._holder()})") from None

    def _holder(self) -> str:
        try:
            with open(self.path, "rb") as fh:
                return fh.read(64).decode(errors="replace").strip() or "?"
        except OSError:
            return "?"

    @staticmethod
    def _write_pid(fd: int) -> None:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise

    def __exit__(self, *exc: object) -> None:
        while self.fds:
            os.close(self.fds.pop())
