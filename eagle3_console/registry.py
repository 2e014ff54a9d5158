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
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

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
    stop_requested INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_stage ON runs(stage, id);
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

LIVE = ("pending", "running")
FINISHED = ("succeeded", "failed", "killed", "lost")


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

    @property
    def live(self) -> bool:
        return self.status in LIVE

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> "Run":
        d = dict(row)
        d["argv"] = json.loads(d["argv"])
        d["params"] = json.loads(d["params"])
        d["env"] = json.loads(d["env"])
        return cls(**d)


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


def actor_name() -> str:
    return f"{os.environ.get('USER', 'uid' + str(os.getuid()))}@pid{os.getpid()}"


class Registry:
    def __init__(self, db_path: Path):
        self.path = db_path
        db_path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(db_path, timeout=30, isolation_level=None)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.executescript(SCHEMA)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # runs
    def create_run(self, stage: str, argv: list[str], params: dict, env: dict, cwd: str,
                   log_path_for: Any, restart_of: int | None = None, reason: str | None = None) -> Run:
        cur = self.conn.execute(
            "INSERT INTO runs (stage, argv, params, env, cwd, status, created, log_path, restart_of, reason)"
            " VALUES (?, ?, ?, ?, ?, 'pending', ?, '', ?, ?)",
            (stage, json.dumps(argv), json.dumps(params), json.dumps(env), cwd, time.time(), restart_of, reason))
        run_id = cur.lastrowid
        self.conn.execute("UPDATE runs SET log_path = ? WHERE id = ?", (str(log_path_for(run_id)), run_id))
        return self.get(run_id)

    def get(self, run_id: int) -> Run:
        row = self.conn.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(f"no run {run_id}")
        return Run.from_row(row)

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
            f"UPDATE runs SET {cols} WHERE id = ? AND status IN ('pending', 'running')",
            (status, *values.values(), run_id))
        return cur.rowcount == 1

    def latest(self, stage: str) -> Run | None:
        row = self.conn.execute("SELECT * FROM runs WHERE stage = ? ORDER BY id DESC LIMIT 1", (stage,)).fetchone()
        return Run.from_row(row) if row else None

    def runs(self, stage: str | None = None, limit: int = 50) -> list[Run]:
        if stage:
            rows = self.conn.execute("SELECT * FROM runs WHERE stage = ? ORDER BY id DESC LIMIT ?", (stage, limit))
        else:
            rows = self.conn.execute("SELECT * FROM runs ORDER BY id DESC LIMIT ?", (limit,))
        return [Run.from_row(r) for r in rows]

    def live_runs(self) -> list[Run]:
        rows = self.conn.execute("SELECT * FROM runs WHERE status IN ('pending', 'running') ORDER BY id")
        return [Run.from_row(r) for r in rows]

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
