"""Waiting for a state database that another process holds busy, bounded and said.

SQLite's own busy timeout waits in silence, as long as it is set: an operator
cannot tell a busy registry from a hung command. Here every statement of the registry's connection waits at most WAIT_S in all, in
steps of STEP_S; after the first step the wait is announced once (through
`notice`, which the command line sets to its stderr) with the processes that
have the database open, as far as this user may see them, and at the end it
raises sqlite3.OperationalError saying how long and whom it waited for, which
every caller already handles (the CLI: one line, exit 3; the supervisor: its
own retries).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Callable

STEP_S = 0.5
WAIT_S = 10.0

# Set by the command line: a line for the operator while a statement waits.
notice: Callable[[str], None] | None = None


# The WAL write lock: an exclusive POSIX lock on byte 120 of `<db>-shm`
# (SQLite's wal.c: WALINDEX_LOCK_OFFSET = 2 headers of 48 bytes + the 24-byte
# checkpoint info; WAL_WRITE_LOCK is lock 0), which /proc/locks lists with its pid.
WAL_WRITE_LOCK_BYTE = 120


def writer(db_path: Path) -> int | None:
    """The pid that holds the database's write transaction, where /proc/locks says it."""
    try:
        st = os.stat(f"{db_path}-shm")
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    for line in lines:
        f = line.split()
        # "1: POSIX  ADVISORY  WRITE 4242 08:01:1234 120 120"
        if len(f) < 8 or f[1] != "POSIX" or f[3] != "WRITE":
            continue
        try:
            major, minor, inode = f[5].split(":")
            if (int(inode) == st.st_ino and int(major, 16) == os.major(st.st_dev)
                    and int(minor, 16) == os.minor(st.st_dev) and int(f[6]) <= WAL_WRITE_LOCK_BYTE <= int(f[7])):
                return int(f[4])
        except ValueError:
            continue
    return None


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(fh.read(400).replace(b"\0", b" ").decode(errors="replace").split())[:100]
    except OSError:
        return "?"


def holders(db_path: Path) -> list[str]:
    """Who keeps the database busy: the write lock's holder where the kernel
    says, else `pid N (command)` of each other process with it open."""
    pid = writer(db_path)
    if pid is not None:
        return [f"pid {pid} ({_command(pid)})"]
    names = {str(db_path), f"{db_path}-wal"}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            opened = any(os.readlink(fd.path) in names for fd in os.scandir(f"/proc/{entry.name}/fd"))
        except OSError:
            continue        # gone, or another user's
        if opened:
            found.append(f"pid {entry.name} ({_command(int(entry.name))})")
    return found


def _whom(who: list[str]) -> str:
    if not who:
        return "another process"
    return who[0] if len(who) == 1 else "one of " + ", ".join(who)


def _busy(exc: sqlite3.OperationalError) -> bool:
    return "locked" in str(exc) or "busy" in str(exc)


class PatientConnection:
    """A sqlite3 connection whose statements wait for a busy database as said above."""

    def __init__(self, conn: sqlite3.Connection, db_path: Path, wait_s: float = WAIT_S):
        self._conn, self._path, self._wait_s = conn, db_path, wait_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._conn, name, value)

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self._patiently(self._conn.execute, *args)

    def executescript(self, script: str) -> sqlite3.Cursor:
        return self._patiently(self._conn.executescript, script)

    def _patiently(self, call: Callable[..., sqlite3.Cursor], *args: Any) -> sqlite3.Cursor:
        began = time.monotonic()
        said = False
        while True:
            try:
                return call(*args)
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
                waited = time.monotonic() - began
                if waited >= self._wait_s:
                    who = holders(self._path)
                    raise sqlite3.OperationalError(
                        f"busy for {waited:.0f} s: a write transaction held by {_whom(who)}; "
                        "try again once it ends") from None
                time.sleep(0.05)     # a busy answer that did not wait (SQLite gives some at once)
                if not said and notice is not None:
                    who = holders(self._path)
                    notice(f"state database {self._path} is busy: a write transaction held by {_whom(who)}; "
                           f"waiting up to {self._wait_s:g} s")
                    said = True
