"""A run's exit, recorded where a full disk cannot stop it: `<log>.exit`.

The supervisor records a run's end in state.db. With `.eagle3` full, that
write fails (SQLite: "database or disk is full") and the supervisor died
with it, leaving a run whose log says done to show as `lost`. So the
supervisor reserves this small file when the run starts, writing real bytes
(not a sparse hole: overwriting blocks already allocated needs no new ones,
on tmpfs and on ext4/xfs alike), and overwrites it in place with the exit
before it tries the database. A reader (runs.reconcile) that finds a live
run with a filled record finishes the run from it, so the exit reaches the
registry as soon as anything can write there again. The file is removed once
the registry holds the exit.

What it cannot do: a disk already full when the run starts leaves no room
to reserve (the supervisor then says so in the log, if it can, and the end
is recorded the old way only); while `.eagle3` stays full, no reader can
write the registry either, and status says the state database is unusable
(exit 3) until space is freed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3_console.kernel.registry import EXITED

SIZE = 1024
SUFFIX = ".exit"


def path_for(log_path: str | os.PathLike) -> Path:
    return Path(log_path).with_suffix(SUFFIX)


class ExitRecord:
    def __init__(self, log_path: str | os.PathLike) -> None:
        self.path = path_for(log_path)
        self.fd: int | None = None

    def reserve(self) -> str | None:
        """Allocate the file now, while there is room; the error, or None."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            return f"{self.path}: {exc.strerror}"
        try:
            os.write(fd, b" " * (SIZE - 1) + b"\n")
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            self.remove()
            return f"{self.path}: {exc.strerror}"
        self.fd = fd
        return None

    def write(self, values: dict[str, Any]) -> bool:
        """Overwrite the reserved bytes with the exit (JSON, padded); True when it held."""
        if self.fd is None:
            return False
        blob = json.dumps(values, default=str).encode()
        if len(blob) > SIZE - 1:
            values = dict(values, reason=str(values.get("reason", ""))[:200], error=str(values.get("error", ""))[:200])
            blob = json.dumps(values, default=str).encode()[:SIZE - 1]
        try:
            os.pwrite(self.fd, blob.ljust(SIZE - 1) + b"\n", 0)
            os.fsync(self.fd)
            return True
        except OSError:
            return False

    def remove(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        try:
            os.unlink(self.path)
        except OSError:
            pass


def read(log_path: str | os.PathLike) -> dict[str, Any] | None:
    """The exit a supervisor recorded for the run of this log, or None (no
    file, only the reservation, or unreadable)."""
    try:
        with open(path_for(log_path), "rb") as fh:
            data = fh.read(SIZE + 1).strip()
    except OSError:
        return None
    if not data:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("status") in EXITED else None
