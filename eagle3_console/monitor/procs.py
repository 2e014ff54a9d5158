"""Which live processes belong to which run.

Where it sits: runs.py records each run's leader pid with its create_time,
its process group and session (supervise.py); this module turns those records
into the set of live processes of the run. snapshot.collect() uses it to name
the owner of every GPU process (attach_owners), and actions.kill-workers to
know exactly what it may signal (run_processes). Nothing here signals anything.
The rows themselves (psutil, /proc/<pid>/environ) are monitor/procrows.py's.

How a process is tied to a run, strongest first:
  leader   the stage process the supervisor started (pid + create_time)
  tree     a descendant of the leader, or of a process tied below
  pgid     in the run's process group (the supervisor makes the leader a
           group leader), e.g. a worker reparented to init after its parent died
  session  in the run's session (a worker that moved to a group of its own)
  env      EAGLE3_RUN_ID=<run id> in its environment (a worker that even
           called setsid); read from /proc/<pid>/environ, so only for our user
A pid is never trusted alone: pids are reused, so the leader counts only with
its recorded create_time, and a group or session id counts only while it has
not been handed to an unrelated process (see _id_trusted).

Cost: one psutil.process_iter pass per ProcessTable.snapshot(), shared by
every run of a refresh; naming the owners of a few GPU processes needs only
ProcessTable.partial() (those pids, their ancestors and each run's recorded
ids: a few reads, not one per process of the machine); environments are read
once per process lifetime (cached by pid and create_time) and only for
processes that nothing else tied.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

from eagle3_console.kernel.model import GpuReport
from eagle3_console.monitor.procrows import (CREATE_TIME_TOL_S, Row, all_rows, env_key, forget_envs,
                                             process_alive, read_cmdline, read_row, run_env)

__all__ = ["LEADER", "TREE", "PGID", "SESSION", "ENV", "RunRef", "ProcInfo", "ProcessTable", "orphans",
           "run_processes", "owner_of", "attach_owners", "process_alive", "CREATE_TIME_TOL_S"]

LEADER, TREE, PGID, SESSION, ENV = "leader", "tree", "pgid", "session", "env"


@dataclass(frozen=True)
class RunRef:
    """What the registry knows about one live run, enough to find its processes."""

    run_id: int
    stage: str
    pid: int | None                 # the stage's leader (started by the supervisor)
    create_time: float | None       # the leader's, as psutil reported it at start
    pgid: int | None = None
    sid: int | None = None
    supervisor_pid: int | None = None
    supervisor_create_time: float | None = None
    workspace: str | None = None    # EAGLE3_WORKSPACE of its processes (the run's cwd)
    ended: float | None = None      # when the run's end was recorded (None while it runs)
    registry: str | None = None     # EAGLE3_REGISTRY of its processes

    @classmethod
    def from_run(cls, run: Any) -> "RunRef":
        """From a registry row (anything with the Run attribute names)."""
        return cls(run_id=run.id, stage=run.stage, pid=run.pid, create_time=run.create_time,
                   pgid=getattr(run, "pgid", None), sid=getattr(run, "sid", None),
                   supervisor_pid=getattr(run, "supervisor_pid", None),
                   supervisor_create_time=getattr(run, "supervisor_create_time", None),
                   workspace=getattr(run, "cwd", None), ended=getattr(run, "ended", None),
                   registry=getattr(run, "registry", None))


@dataclass(frozen=True)
class ProcInfo:
    """One live process of a run, with how it was tied to it."""

    pid: int
    create_time: float
    name: str
    cmdline: tuple[str, ...]
    ppid: int
    pgid: int | None
    sid: int | None
    status: str
    how: str                        # leader | tree | pgid | session | env
    run_id: int
    stage: str


class ProcessTable:
    """One snapshot of the process table, shared by all runs of one refresh."""

    def __init__(self, rows: Iterable[Row] = ()) -> None:
        self.rows: dict[int, Row] = {r.pid: r for r in rows}
        self.children: dict[int, list[int]] = {}
        self.by_pgid: dict[int, list[Row]] = {}
        self.by_sid: dict[int, list[Row]] = {}
        for r in self.rows.values():
            self.children.setdefault(r.ppid, []).append(r.pid)
            if r.pgid is not None:
                self.by_pgid.setdefault(r.pgid, []).append(r)
            if r.sid is not None:
                self.by_sid.setdefault(r.sid, []).append(r)
        self._cmdlines: dict[int, tuple[str, ...]] = {}
        self._owners: dict[tuple[tuple[RunRef, ...], frozenset[int] | None], dict[int, ProcInfo]] = {}

    @classmethod
    def snapshot(cls) -> "ProcessTable":
        table = cls(all_rows())
        forget_envs({(r.pid, r.create_time) for r in table.rows.values()})
        return table

    @classmethod
    def partial(cls, pids: Iterable[int], refs: Iterable[RunRef]) -> "ProcessTable":
        """The rows `owners(refs, only=pids)` reads, and no others: the same
        answer for those pids as snapshot()'s table, at a few reads instead
        of one per process of the machine (a GPU host runs hundreds).

        Why the answer is the same, lookup by lookup, for a pid w of `pids`:
          rows / ancestors  w and its whole ppid chain are loaded (the walk
                  stops where ancestors() stops: ppid <= 1 or a vanished row),
                  so `look` and the rows read (status, name, create_time)
                  are the full table's.
          matches  reads only the leader's and the supervisor's rows: loaded,
                  so `excluded` and each leader's trust are the same.
          _id_trusted  reads the row of the pid equal to the group/session
                  id; a missing row means "trusted" (the id is still
                  reserved), so the holder is loaded whenever it lives.
          descendants  w is a descendant of p exactly when p is on w's
                  chain, and the chain from p down to w is loaded; what the
                  partial children index misses is what no wanted pid's
                  answer depends on (ties of processes off the chains).
          by_pgid / by_sid  w's own row, with its ids, is in the index.
          run_env / cmdline  read for w and its ancestors only, per pid.
        Every tie of w and of its ancestors thus happens here as there. Where
        two runs tie one process with equal strength the first tie wins, so
        the order of ties matters too: rows are kept in pid order, as
        psutil.process_iter yields them, so every list walked (rows,
        children, by_pgid, by_sid) is the full one's in the same order less
        the processes not loaded, and the ties of the loaded processes come
        in the same order."""
        refs = tuple(refs)
        want: list[int] = [p for p in pids if p is not None and p > 0]
        for ref in refs:
            want.extend(i for i in (ref.pid, ref.supervisor_pid, ref.pgid, ref.sid) if i is not None and i > 0)
        rows: dict[int, Row] = {}
        tried: set[int] = set()
        for pid in want:
            # Walk up: ancestors() follows ppid while it is > 1.
            while pid not in tried:
                tried.add(pid)
                row = read_row(pid)
                if row is None:
                    break
                rows[pid] = row
                if row.ppid <= 1:
                    break
                pid = row.ppid
        table = cls(rows[pid] for pid in sorted(rows))
        # Prune only what this table looked at: a process it never read may
        # well still live, and its cached environment stay valid.
        forget_envs({(r.pid, r.create_time) for r in rows.values()}, tried)
        return table

    def get(self, pid: int) -> Row | None:
        return self.rows.get(pid)

    def matches(self, pid: int | None, create_time: float | None, tol: float = CREATE_TIME_TOL_S) -> bool:
        row = self.rows.get(pid) if pid is not None else None
        return (row is not None and create_time is not None
                and abs(row.create_time - create_time) <= tol)

    def cmdline(self, pid: int) -> tuple[str, ...]:
        if pid not in self._cmdlines:
            self._cmdlines[pid] = read_cmdline(pid)
        return self._cmdlines[pid]

    def descendants(self, pid: int) -> list[int]:
        out, stack = [], list(self.children.get(pid, ()))
        while stack:
            child = stack.pop()
            out.append(child)
            stack.extend(self.children.get(child, ()))
        return out

    def _id_trusted(self, ident: int | None, ref: RunRef) -> bool:
        """Whether a recorded group/session id still names the run's group/session.

        Linux keeps a pid reserved while a group or session of that id has a
        member, so an id is only handed on after the group emptied and the pid
        was reused; then its new holder is alive with another create_time (or
        is newer than our leader, which started the group)."""
        if not ident or ident <= 1:
            return False
        holder = self.rows.get(ident)
        if holder is None:
            return True
        if ident == ref.pid:
            return self.matches(ref.pid, ref.create_time)
        if ident == ref.supervisor_pid:
            return self.matches(ref.supervisor_pid, ref.supervisor_create_time)
        # A session leader we did not record (the launcher's first fork): it
        # must be older than the leader, which started inside its session.
        return ref.create_time is not None and holder.create_time <= ref.create_time + CREATE_TIME_TOL_S

    def ancestors(self, pid: int) -> list[int]:
        out, seen = [], {pid}
        row = self.rows.get(pid)
        while row is not None and row.ppid > 1 and row.ppid not in seen:
            out.append(row.ppid)
            seen.add(row.ppid)
            row = self.rows.get(row.ppid)
        return out

    def owners(self, refs: Iterable[RunRef], only: Iterable[int] | None = None) -> dict[int, ProcInfo]:
        """pid -> ProcInfo for every live process tied to one of `refs`
        (with `only`: for those pids alone, the same answer at less cost).

        A process tied to two runs (it cannot be in both trees) goes to the
        strongest tie; the supervisor itself is never counted as a stage
        process, nor is a zombie (it has exited; only its parent's wait() is due).

        `only` (the GPU processes, for attach_owners): a pid's tie depends on
        its own environment and its ancestors' (a descendant of a process tied
        by group, session or environment is tied by tree), never on another
        process's; so only those environments are read, not one per process of
        the machine newer than the oldest run (a one-shot `status` has no
        environment cached), and only their command lines."""
        refs = tuple(refs)
        wanted = None if only is None else frozenset(only)
        if (refs, wanted) in self._owners:
            return self._owners[(refs, wanted)]
        look = None
        if wanted is not None:
            look = set(wanted)
            for pid in wanted:
                look.update(self.ancestors(pid))
        rank = {LEADER: 0, TREE: 1, PGID: 2, SESSION: 3, ENV: 4}
        tied: dict[int, tuple[RunRef, str]] = {}

        def tie(pid: int, ref: RunRef, how: str) -> None:
            if pid in excluded:
                return
            current = tied.get(pid)
            if current is None or rank[how] < rank[current[1]]:
                tied[pid] = (ref, how)

        # Never the supervisor (it must live to record the exit) nor ourselves.
        excluded = {r.supervisor_pid for r in refs
                    if self.matches(r.supervisor_pid, r.supervisor_create_time)}
        excluded.add(os.getpid())
        by_env: dict[str, RunRef] = {env_key(r.workspace, r.run_id): r for r in refs if r.workspace}
        registries = {r.registry for r in refs if r.registry}
        for ref in refs:
            leader_ok = self.matches(ref.pid, ref.create_time)
            if leader_ok:
                tie(ref.pid, ref, LEADER)
                for d in self.descendants(ref.pid):
                    tie(d, ref, TREE)
            for ident, index, how in ((ref.pgid, self.by_pgid, PGID), (ref.sid, self.by_sid, SESSION)):
                if not self._id_trusted(ident, ref):
                    continue
                for row in index.get(ident, ()):
                    if ref.create_time is not None and row.create_time < ref.create_time - CREATE_TIME_TOL_S:
                        continue    # older than the run: cannot have been started by it
                    if ref.ended is not None and row.create_time > ref.ended + 1.0:
                        # Started after the run ended, in an id left without a living leader: the id
                        # may have been reused since. Its real workers are older, or found by tree/env.
                        continue
                    tie(row.pid, ref, how)
        # Last resort: the environment, for processes nothing else tied.
        if by_env:
            oldest = min((r.create_time for r in refs if r.create_time is not None), default=None)
            for row in self.rows.values():
                if row.pid in tied or row.pid in excluded or (look is not None and row.pid not in look):
                    continue
                if oldest is not None and row.create_time < oldest - CREATE_TIME_TOL_S:
                    continue
                value = run_env(row)
                if value is None or value.key not in by_env:
                    continue
                if value.registry and registries and value.registry not in registries:
                    continue    # the same id in an earlier registry: another run
                ref = by_env[value.key]
                if ref.ended is not None and row.create_time > ref.ended + 1.0:
                    continue    # started after the run ended: it copied the environment, it is not the run's
                tie(row.pid, ref, ENV)
        # Descendants of an orphan tied by group/session/env belong to it too.
        for pid, (ref, how) in list(tied.items()):
            if how in (PGID, SESSION, ENV):
                for d in self.descendants(pid):
                    tie(d, ref, TREE)
        result = {}
        for pid, (ref, how) in tied.items():
            if wanted is not None and pid not in wanted:
                continue
            row = self.rows[pid]
            if row.zombie:
                continue    # exited, awaiting its parent's wait(): nothing to watch or signal
            result[pid] = ProcInfo(pid=pid, create_time=row.create_time, name=row.name,
                                   cmdline=self.cmdline(pid), ppid=row.ppid, pgid=row.pgid,
                                   sid=row.sid, status=row.status, how=how,
                                   run_id=ref.run_id, stage=ref.stage)
        self._owners[(refs, wanted)] = result
        return result


def orphans(table: ProcessTable, workspace: str, registry_id: str, known_run_ids: Iterable[int] = ()
            ) -> dict[str, list[int]]:
    """stage -> pids of live processes that a run of this workspace started but
    that belong to no run of the current registry: the registry they belonged
    to was deleted or replaced. They may hold GPUs and write outputs; a new run
    of their stage would race them. Reads environments (cached per process)."""
    known = {str(i) for i in known_run_ids}
    found: dict[str, list[int]] = {}
    for row in table.rows.values():
        if row.pid == os.getpid() or row.zombie:
            continue
        value = run_env(row)
        if value is None or value.workspace != workspace:
            continue
        if value.registry == registry_id or (value.registry is None and value.run_id in known):
            continue    # a run of ours (live, or ended: leftover_workers' business)
        found.setdefault(value.stage or f"run {value.run_id}", []).append(row.pid)
    return {k: sorted(v) for k, v in found.items()}


def run_processes(ref: RunRef, table: ProcessTable | None = None) -> list[ProcInfo]:
    """Every live process of one run, leader first, then by pid."""
    table = table or ProcessTable.snapshot()
    procs = table.owners((ref,)).values()
    return sorted(procs, key=lambda p: (p.how != LEADER, p.pid))


def owner_of(pid: int, refs: Iterable[RunRef], table: ProcessTable | None = None
             ) -> tuple[int, str, str] | None:
    """(run_id, stage, how) of the run that owns `pid`, or None."""
    table = table or ProcessTable.snapshot()
    info = table.owners(refs).get(pid)
    return None if info is None else (info.run_id, info.stage, info.how)


def attach_owners(report: GpuReport, refs: Iterable[RunRef], table: ProcessTable | None = None) -> GpuReport:
    """Fill each GPU process's name, create_time and owning run, in place.

    NVML reports pids in the host's pid namespace; a pid not in our table
    (another container, or already gone) keeps run_id None. Without `table`,
    a partial one of just what the answer reads (ProcessTable.partial)."""
    if not report.available:
        return report
    refs = tuple(refs)
    pids = {gp.pid for gpu in report.gpus for gp in gpu.processes}
    if table is None:
        table = ProcessTable.partial(pids, refs)
    owners = table.owners(refs, only=pids)
    for gpu in report.gpus:
        for gp in gpu.processes:
            row = table.get(gp.pid)
            gp.visible = row is not None
            if row is not None:
                gp.name = gp.name or row.name
                gp.create_time = row.create_time
            info = owners.get(gp.pid)
            if info is not None:
                gp.run_id, gp.stage, gp.how = info.run_id, info.stage, info.how
    return report
