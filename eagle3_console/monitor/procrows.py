"""The process table's rows as psutil reads them, and what each process's
environment says of the run that started it.

Where it sits: monitor/procs.py builds its ProcessTable from these rows and
ties them to runs; process_alive() answers whether one recorded process still
runs (runs.py, claims, the stopper). psutil is imported at first use, and each
process's environment read once per process lifetime (cached by pid and
create_time, once the process is old enough to have exec'd).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from eagle3_console.kernel.workspace import ENV_REGISTRY, ENV_RUN_ID, ENV_STAGE, ENV_WORKSPACE

# psutil derives create_time from /proc/<pid>/stat start ticks (1/100 s) plus
# the boot time; two readings of one process agree far inside this.
CREATE_TIME_TOL_S = 0.01


class _LazyPsutil:
    """psutil imported at first use (its import is a visible share of `status`): a `status --json` with no live run
    and no GPU process never needs it."""

    def __getattr__(self, name: str) -> Any:
        import psutil as module
        globals()["psutil"] = module
        return getattr(module, name)


psutil: Any = _LazyPsutil()


def process_alive(pid: int | None, create_time: float | None, tol: float = CREATE_TIME_TOL_S) -> bool:
    """Whether the process recorded as (pid, create_time) still runs.

    False for an unknown create_time (an untrusted pid), a pid now held by
    another process, a dead pid, and a zombie (it runs nothing any more)."""
    if pid is None or create_time is None or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            if abs(proc.create_time() - create_time) > tol:
                return False
            return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


@dataclass
class Row:
    """One process as the table holds it (psutil's as_dict, plus group and session)."""


    pid: int
    ppid: int
    create_time: float
    name: str
    status: str
    pgid: int | None
    sid: int | None

    @property
    def zombie(self) -> bool:
        """Exited, awaiting its parent's wait(): it runs nothing any more."""
        return self.status == psutil.STATUS_ZOMBIE


@dataclass(frozen=True)
class RunEnv:
    """What a process's environment says of the run that started it."""

    workspace: str
    run_id: str
    registry: str | None        # absent in processes started before registries had ids
    stage: str | None

    @property
    def key(self) -> str:
        return env_key(self.workspace, self.run_id)


# (pid, create_time) -> RunEnv or None. /proc/<pid>/environ is the environment
# the process's program was started with, so it no longer changes once that
# program runs. Run ids are small integers repeated in every workspace (and in
# every new registry of one): an id alone would tie another workspace's workers
# to this run.
_ENV_CACHE: dict[tuple[int, float], RunEnv | None] = {}
# A process younger than this is read again at each look, not cached: between
# the fork and the exec of a launch with its own environment (a supervisor's
# stage, Popen(env=...)) /proc shows the parent's, and exec keeps the pid and
# create_time, so a reading cached in that window would hide the run's id for
# the process's whole life. The window is short but not bounded on a loaded
# machine; older processes that exec again keep their environment.
ENV_SETTLE_S = 10.0


def env_key(workspace: str | None, run_id: int | str) -> str:
    return f"{workspace}\0{run_id}"


def run_env(row: Row) -> RunEnv | None:
    key = (row.pid, row.create_time)
    if key in _ENV_CACHE:
        return _ENV_CACHE[key]
    value: RunEnv | None
    try:
        env = psutil.Process(row.pid).environ()
        rid, ws = env.get(ENV_RUN_ID), env.get(ENV_WORKSPACE)
        value = RunEnv(ws, rid, env.get(ENV_REGISTRY), env.get(ENV_STAGE)) \
            if rid is not None and ws is not None else None
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        value = None    # another user's process, or gone: cannot be ours by env
    if time.time() - row.create_time >= ENV_SETTLE_S:
        _ENV_CACHE[key] = value
    return value


_ROW_ATTRS = ["pid", "ppid", "create_time", "name", "status"]


def _row(info: dict) -> Row | None:
    """A row from psutil's as_dict(_ROW_ATTRS) (an unreadable attribute None),
    with the process's group and session; None for a process that vanished
    between being listed and being read."""
    if info["create_time"] is None or info["ppid"] is None:
        return None
    try:
        pgid, sid = os.getpgid(info["pid"]), os.getsid(info["pid"])
    except OSError:
        pgid = sid = None
    return Row(info["pid"], info["ppid"], info["create_time"], info["name"] or "", info["status"] or "", pgid, sid)


def read_row(pid: int) -> Row | None:
    """One process's row, read as process_iter reads it (as_dict under
    oneshot), so a partial table's rows are the full one's; None when the
    process is gone."""
    try:
        return _row(psutil.Process(pid).as_dict(_ROW_ATTRS))
    except psutil.NoSuchProcess:
        return None


def all_rows() -> Iterator[Row]:
    """Every process of the machine, in pid order, as one psutil.process_iter pass reads them."""
    return (row for row in (_row(p.info) for p in psutil.process_iter(_ROW_ATTRS)) if row is not None)


def read_cmdline(pid: int) -> tuple[str, ...]:
    """A process's command line; () when it is gone or not ours to read."""
    try:
        return tuple(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return ()


def forget_envs(live: set[tuple[int, float]], looked_at: Iterable[int] | None = None) -> None:
    """Forget the cached environments of processes gone (of those whose pid is
    in looked_at, when given: a process never read may well still live), so
    the cache stays bounded."""
    pids = None if looked_at is None else set(looked_at)
    for key in [k for k in _ENV_CACHE if (pids is None or k[0] in pids) and k not in live]:
        del _ENV_CACHE[key]
