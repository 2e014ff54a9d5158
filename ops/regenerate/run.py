"""The rows through an engine: a bounded pool, the journal, progress, and the dead-server rule.

At most `concurrency` rows are in flight (each row's turns go one after the
other; rows run side by side). Every finished row is journaled at once. The
log gets the console's summary line (eagle3_console/monitor/logparse.py):

    progress: items 120/10000 tokens 51234 errors 2 tok/s 812.3 rows/s 1.9 eta_s 5120

items: the rows answered and kept (a failed row is counted in errors and asked
again by the next run), so a run's share is what its output holds.

A request that gets no HTTP answer at all makes the runner ask the server once
whether it still answers; a server that does not, or a streak of rows that all
failed by timeout or server error, ends the run (ServerGone): within about one
request timeout, never a hang. Rows already answered stay in the journal,
and so do those whose answers came in while the run was ending (the requests
in flight get up to DRAIN_S more); the log's last progress line, said however
the run ends, counts the rows done and kept.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Callable

from ops.prompts import PromptRow
from ops.regenerate.engine import ConnectionLost, answer_row
from ops.regenerate.journal import Journal

SAY_EVERY_S = 1.0
DRAIN_S = 10.0                  # at most this long for the requests in flight when the server is gone
SERVER_KINDS = ("timeout", "server_error")


class ServerGone(RuntimeError):
    """The server stopped answering; the message says what was seen."""


class Progress:
    def __init__(self, total: int, done: dict[int, dict], log: Callable[[str], None]):
        self.total, self.done, self.log = total, done, log
        self.t0 = time.monotonic()
        self.said = 0.0
        self.rows = 0           # rows finished by this run
        self.tokens = 0         # completion tokens of this run

    def add(self, record: dict) -> None:
        self.rows += 1
        self.tokens += int(record.get("completion_tokens") or 0)
        self.say()

    def say(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.said < SAY_EVERY_S:
            return
        self.said = now
        secs = max(now - self.t0, 1e-9)
        errors = sum(1 for r in self.done.values() if r.get("failed"))
        answered = len(self.done) - errors      # done and kept: a failed row is asked again
        tokens = sum(int(r.get("completion_tokens") or 0) for r in self.done.values() if not r.get("failed"))
        rate = self.rows / secs
        eta = f" eta_s {(self.total - answered) / rate:.0f}" if rate > 0 else ""
        self.log(f"progress: items {answered}/{self.total} tokens {tokens} errors {errors} "
                 f"tok/s {self.tokens / secs:.1f} rows/s {rate:.2f}{eta}")


def run_rows(engine, rows: list[PromptRow], journal: Journal, done: dict[int, dict], concurrency: int,
             log: Callable[[str], None], n: int = 1) -> Progress:
    """Answer every row not answered yet (n sampled conversations a row); `done` gets each finished row's record."""
    todo = [r for r in rows if r.index not in done or done[r.index].get("failed")]
    progress = Progress(len(rows), done, log)
    streak_limit = max(8, 2 * concurrency)
    streak = 0

    def finish(record: dict, check: bool = True) -> None:
        nonlocal streak
        journal.append(record)
        done[record["row"]] = record
        progress.add(record)
        streak = streak + 1 if record.get("failed") in SERVER_KINDS else 0
        if check and streak >= streak_limit:
            why = _dead(engine)
            raise ServerGone(f"the last {streak} rows all failed ({record['failed']}: {record['detail']})"
                             + (f"; {why}" if why else "; the server answers probes but not chats"))

    def lost(row: PromptRow, exc: ConnectionLost) -> dict:
        why = _dead(engine)
        if why:
            raise ServerGone(f"{exc}; {why}")
        return {"row": row.index, "id": row.id, "failed": "server_error", "detail": str(exc), "turn": None}

    try:
        if concurrency <= 1:
            for row in todo:
                try:
                    record = answer_row(engine, row, n)
                except ConnectionLost as exc:
                    record = lost(row, exc)
                finish(record)
        else:
            _pool(engine, todo, concurrency, finish, lost, n)
    finally:
        progress.say(force=True)        # however it ends: the rows done and kept
    return progress


def _pool(engine, todo: list[PromptRow], concurrency: int, finish, lost, n: int) -> None:
    pool = cf.ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="regenerate")
    pending: dict[cf.Future, PromptRow] = {}
    queue = iter(todo)
    gone: ServerGone | None = None
    try:
        while gone is None:
            while len(pending) < concurrency:
                row = next(queue, None)
                if row is None:
                    break
                pending[pool.submit(answer_row, engine, row, n)] = row
            if not pending:
                return
            finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
            gone = _finish_all(finished, pending, finish, lost)
        # The server is gone: the answers that still come in are kept, not asked again.
        finished, _ = cf.wait(pending, timeout=min(DRAIN_S, getattr(engine, "timeout_s", DRAIN_S)))
        _finish_all(finished, pending, finish, None)
        raise gone
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _finish_all(finished, pending: dict, finish, lost) -> ServerGone | None:
    """Journal every finished row (all of them, even after one says the server is gone)."""
    gone = None
    for fut in finished:
        row = pending.pop(fut)
        try:
            record = fut.result()
        except ConnectionLost as exc:
            if lost is None:
                continue                # ending anyway: that row is asked again next run
            try:
                record = lost(row, exc)
            except ServerGone as why:
                gone = gone or why
                continue
        if lost is None and record.get("failed"):
            continue                    # ending anyway: a failed row is asked again next run
        try:
            finish(record, check=lost is not None)
        except ServerGone as why:
            gone = gone or why
    return gone


def _dead(engine) -> str | None:
    alive = getattr(engine, "alive", None)
    return alive() if alive else None
