"""What /proc says of the processes the tests start: whether one still runs (a zombie does
not: a daemon's parent is init, which reaps when it will) and which carry an entry in their
environment (the test's token, a test cluster's SLURM_CONF). Shared by conftest.py's
teardown, the test Slurm cluster and the tests that watch a worker end."""

from __future__ import annotations

import os


def state(pid: int) -> str | None:
    """The kernel's one-letter state of `pid` (Z: a zombie, T: stopped); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def holding_env(entry: str) -> list[int]:
    """The processes (other than this one) whose environment has `entry` ("NAME=value")."""
    want = entry.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if want in fh.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            pass
    return found
