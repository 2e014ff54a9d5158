"""The run registry: SQLite (WAL) at .eagle3/state.db.

Data flow: runs.launch / supervise write here; snapshot.collect and the
actions read here. Every process (CLI, supervisor, TUI, cron) opens its own
connection; WAL lets readers go on while a supervisor writes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

from eagle3_console.kernel.model import ACTIVE, EXITED, MAY_BE_ALIVE, RunStatus  # noqa: F401 - the registry's words
from eagle3_console.kernel.registrybusy import STEP_S, WAIT_S, PatientConnection

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stage TEXT NOT NULL,
    argv TEXT NOT NULL,
    params TEXT NOT NULL,
    env TEXT NOT NULL DEFAULT '{}',
    cwd TEXT NOT NULL,
    status TEXT NOT NULL,
    created REAL NOT NULL,
    supervisor_pid INTEGER,
    supervisor_create_time REAL,
    pid INTEGER,
    pgid INTEGER,
    sid INTEGER,
    create_time REAL,
    started REAL,
    ended REAL,
    exit_code INTEGER,
    signal INTEGER,
    log_path TEXT NOT NULL,
    restart_of INTEGER REFERENCES runs(id),
    reason TEXT,
    stop_requested INTEGER NOT NULL DEFAULT 0,
    launcher TEXT NOT NULL DEFAULT 'local',
    job_id TEXT,
    job_state TEXT,
    job_reason TEXT,
    job_nodes TEXT
);
CREATE INDEX IF NOT EXISTS runs_stage ON runs(stage, id);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    stage TEXT,
    run_id INTEGER,
    targets TEXT NOT NULL DEFAULT '[]',
    outcome TEXT NOT NULL,
    detail TEXT
);
"""


_ACTIVE_SQL = ", ".join(f"'{s}'" for s in ACTIVE)
# Columns added after the first release, with their declarations: a registry
# made before them gets them at open (ALTER TABLE), its rows the defaults.
ADDED_COLUMNS = {
    "launcher": "TEXT NOT NULL DEFAULT 'local'",     # local | slurm (eagle3_console/runs/slurm/)
    "job_id": "TEXT", "job_state": "TEXT", "job_reason": "TEXT", "job_nodes": "TEXT",
}


@dataclass
class Run:
    id: int
    stage: str
    argv: list[str]
    params: dict[str, Any]
    env: dict[str, str]
    cwd: str
    status: str
    created: float
    supervisor_pid: int | None
    supervisor_create_time: float | None
    pid: int | None
    pgid: int | None
    sid: int | None
    create_time: float | None
    started: float | None
    ended: float | None
    exit_code: int | None
    signal: int | None
    log_path: str
    restart_of: int | None
    reason: str | None
    stop_requested: int
    launcher: str = "local"
    job_id: str | None = None       # the scheduler's job (launcher slurm), with its last seen state
    job_state: str | None = None
    job_reason: str | None = None
    job_nodes: str | None = None
    # The registry (meta.registry_id) the run belongs to: run ids restart in a
    # new registry, so an id is only a run's together with this.
    registry: str | None = None

    @property
    def live(self) -> bool:
        return self.status in ACTIVE

    @classmethod
    def from_row(cls, row: sqlite3.Row, registry: str | None = None) -> "Run":
        d = dict(row)
        d["registry"] = registry
        d["argv"] = json.loads(d["argv"])
        d["params"] = json.loads(d["params"])
        d["env"] = json.loads(d["env"])
        return cls(**d)


def _fresh_log(path: Path) -> Path:
    """`path`, or `<stem>.2.log`, ...: a log file no earlier run wrote (ids restart
    when a registry is started anew; appending to an old run's log would merge two)."""
    path = Path(path)
    n = 1
    candidate = path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return candidate


@dataclass
class Event:
    id: int
    time: float
    actor: str
    action: str
    stage: str | None
    run_id: int | None
    targets: list[Any]
    outcome: str
    detail: str | None


class StateError(Exception):
    """The state database is unusable: vanished, replaced, corrupt or unwritable.
    The message names the file; the CLI exits 3 (UNKNOWN) on it."""


# Beside the database, the id of the registry it holds. The database alone
# cannot tell "never created" from "deleted under a live run" (a fresh empty
# one would restart run ids at 1 and start duplicates of live stages).
ID_SUFFIX = ".id"


def id_path(db_path: Path) -> Path:
    return db_path.with_suffix(ID_SUFFIX)


def actor_name() -> str:
    return f"{os.environ.get('USER', 'uid' + str(os.getuid()))}@pid{os.getpid()}"


class Registry:
    def __init__(self, db_path: Path, busy_wait_s: float = WAIT_S):
        self.path = db_path
        marker = id_path(db_path)
        try:
            expected = marker.read_text().strip() or None
        except FileNotFoundError:
            expected = None
        except OSError as exc:
            raise StateError(f"{marker}: unreadable: {exc.strerror}") from None
        if expected and not db_path.exists():
            raise StateError(
                f"state database {db_path} has vanished (registry {expected} was there, per {marker.name}); "
                f"runs it recorded may still be alive. Restore it, or move {marker} aside to start an empty registry")
        try:
            db_path.parent.mkdir(parents=True, exist_ok=True)
            # Bounded and said while another process holds it busy (registrybusy.py).
            self.conn = PatientConnection(sqlite3.connect(db_path, timeout=STEP_S, isolation_level=None), db_path,
                                          busy_wait_s)
            self.conn.row_factory = sqlite3.Row
            if expected:
                self._check_holds_a_registry(expected, marker)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA synchronous=NORMAL")
            self.conn.executescript(SCHEMA)
            self._add_columns()
            row = self.conn.execute("SELECT value FROM meta WHERE key = 'registry_id'").fetchone()
            if row is None:
                import uuid     # 10 ms of import (platform) that every later open skips
                # Racing first openers: one insert wins, both read the winner's id.
                self.conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('registry_id', ?)",
                                  (uuid.uuid4().hex,))
                # Logs already there: an earlier registry ran stages here, and
                # some may still live (snapshot then looks for their orphans).
                logs = db_path.parent / "logs"
                if logs.is_dir() and any(logs.glob("*.log")):
                    self.conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('predecessor', '1')")
                row = self.conn.execute("SELECT value FROM meta WHERE key = 'registry_id'").fetchone()
            self.registry_id = row[0]
        except sqlite3.Error as exc:
            hint = "" if os.access(db_path.parent, os.W_OK) else f" ({db_path.parent} is not writable)"
            raise StateError(f"state database {db_path}: {exc}{hint}") from None
        except OSError as exc:
            raise StateError(f"state database {db_path}: {exc.strerror}") from None
        if expected is None:
            self._write_marker(marker)
        elif expected != self.registry_id:
            self.conn.close()
            raise StateError(
                f"state database {db_path} was replaced: it holds registry {self.registry_id}, {marker.name} says "
                f"{expected}. Restore the original, or move {marker} aside to adopt this one")

    def _add_columns(self) -> None:
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(runs)")}
        for name, decl in ADDED_COLUMNS.items():
            if name in have:
                continue
            try:
                self.conn.execute(f"ALTER TABLE runs ADD COLUMN {name} {decl}")
            except sqlite3.OperationalError as exc:
                if "duplicate column" not in str(exc):      # a racing opener added it first
                    raise

    def _check_holds_a_registry(self, expected: str, marker: Path) -> None:
        """With a marker, the database must already be a registry: read before
        anything is written, so that an emptied state.db (truncated, a 0-byte
        copy) is reported as it is, not made into a new registry first."""
        held = self.conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
        if held:
            held = self.conn.execute("SELECT 1 FROM meta WHERE key = 'registry_id'").fetchone()
        if held:
            return
        self.conn.close()
        size = self.path.stat().st_size
        raise StateError(
            f"state database {self.path} is empty ({size:,} bytes, no registry in it), but {marker.name} says "
            f"registry {expected} was there; runs it recorded may still be alive. Restore it, or move {marker} "
            f"aside to start an empty registry")

    def _write_marker(self, marker: Path) -> None:
        """First opener writes the id (O_EXCL: two racing openers of a new
        workspace agree, since both read the one id the database holds)."""
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            if marker.read_text().strip() not in ("", self.registry_id):
                raise StateError(f"{marker} names another registry than {self.path}") from None
            return
        except OSError:
            return      # a read-only state folder: reading works, the marker waits for a writable one
        with os.fdopen(fd, "w") as fh:
            fh.write(self.registry_id + "\n")

    @property
    def has_predecessor(self) -> bool:
        """Whether this registry was started where an earlier one had run stages."""
        return self.conn.execute("SELECT 1 FROM meta WHERE key = 'predecessor'").fetchone() is not None

    def close(self) -> None:
        self.conn.close()

    @contextmanager
    def immediate(self) -> Iterator["Registry"]:
        """One write transaction taken at once (BEGIN IMMEDIATE): what runs inside
        is atomic against every other process's writes, e.g. "no live run of this
        stage" and "create its run" in runs.launch."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # runs
    def create_run(self, stage: str, argv: list[str], params: dict, env: dict, cwd: str,
                   log_path_for: Any, restart_of: int | None = None, reason: str | None = None,
                   launcher: str = "local") -> Run:
        cur = self.conn.execute(
            "INSERT INTO runs (stage, argv, params, env, cwd, status, created, log_path, restart_of, reason, launcher)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?)",
            (stage, json.dumps(argv), json.dumps(params), json.dumps(env), cwd, str(RunStatus.PENDING), time.time(),
             restart_of, reason, launcher))
        run_id = cur.lastrowid
        self.conn.execute("UPDATE runs SET log_path = ? WHERE id = ?", (str(_fresh_log(log_path_for(run_id))), run_id))
        return self.get(run_id)

    def get(self, run_id: int) -> Run:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id}")
        return Run.from_row(row, self.registry_id)

    def update(self, run_id: int, **values: Any) -> None:
        names = {f.name for f in fields(Run)}
        bad = set(values) - names
        if bad:
            raise KeyError(f"runs has no column(s) {sorted(bad)}")
        cols = ", ".join(f"{k} = ?" for k in values)
        self.conn.execute(f"UPDATE runs SET {cols} WHERE id = ?", (*values.values(), run_id))

    def finish(self, run_id: int, status: str, **values: Any) -> bool:
        """Record an end unless one was recorded already (first writer wins)."""
        cols = ", ".join(["status = ?"] + [f"{k} = ?" for k in values])
        cur = self.conn.execute(
            f"UPDATE runs SET {cols} WHERE id = ? AND status IN ({_ACTIVE_SQL})",
            (status, *values.values(), run_id))
        return cur.rowcount == 1

    def latest(self, stage: str) -> Run | None:
        row = self.conn.execute("SELECT * FROM runs WHERE stage = ? ORDER BY id DESC LIMIT 1", (stage,)).fetchone()
        return Run.from_row(row, self.registry_id) if row else None

    def runs(self, stage: str | None = None, limit: int = 50) -> list[Run]:
        if stage:
            rows = self.conn.execute("SELECT * FROM runs WHERE stage = ? ORDER BY id DESC LIMIT ?", (stage, limit))
        else:
            rows = self.conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [Run.from_row(r, self.registry_id) for r in rows]

    def stage_history(self, stage: str) -> list[tuple[int, str]]:
        """(id, status) of every run of the stage, oldest first (no JSON decoded)."""
        return [(r[0], r[1]) for r in self.conn.execute(
            "SELECT id, status FROM runs WHERE stage = ? ORDER BY id", (stage,))]

    def run_ids(self) -> list[int]:
        return [r[0] for r in self.conn.execute("SELECT id FROM runs")]

    def live_runs(self) -> list[Run]:
        rows = self.conn.execute(f"SELECT * FROM runs WHERE status IN ({_ACTIVE_SQL}) ORDER BY id")
        return [Run.from_row(r, self.registry_id) for r in rows]

    def restart_chain(self, run_id: int) -> Iterator[Run]:
        """The run and the runs it restarted, newest first."""
        current: int | None = run_id
        while current is not None:
            run = self.get(current)
            yield run
            current = run.restart_of

    # events
    def record(self, action: str, outcome: str, stage: str | None = None, run_id: int | None = None,
               targets: list[Any] | None = None, detail: str | None = None, actor: str | None = None) -> None:
        self.conn.execute(
            "INSERT INTO events (time, actor, action, stage, run_id, targets, outcome, detail)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (time.time(), actor or actor_name(), action, stage, run_id, json.dumps(targets or []), outcome, detail))

    def events(self, stage: str | None = None, limit: int = 100) -> list[Event]:
        q = "SELECT * FROM events" + (" WHERE stage = ?" if stage else "") + " ORDER BY id DESC LIMIT ?"
        rows = self.conn.execute(q, ((stage, limit) if stage else (limit,)))
        out = []
        for r in rows:
            d = dict(r)
            d["targets"] = json.loads(d["targets"])
            out.append(Event(**d))
        return out
