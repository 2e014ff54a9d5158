"""A destructive action (clean, kill-workers) in the audit log even when it is
interrupted: recorded `started` before it acts, and `interrupted: SIGTERM`
(with how far it got) if SIGTERM, SIGINT or SIGHUP ends it; its normal end is
the action's own record. The CLI runs execute_clean / execute_kill through it.

SIGTERM and SIGHUP are turned into an exception in the main thread
(eagle3_console/kernel/interrupts.py, which `stop` uses too), so the action unwinds
through its own cleanup (open folders closed, locks released) instead of dying
between two files; what was done stays done.
"""

from __future__ import annotations

import os
import signal
from typing import Callable, TypeVar

from eagle3_console.kernel.interrupts import Interrupted, Signalled, held_off, signals_raise, signum_of
from eagle3_console.kernel.refused import Refused
from eagle3_console.kernel.registry import Registry
from eagle3_console.kernel.workspace import Workspace

T = TypeVar("T")


def recorded(ws: Workspace, action: str, stage: str, run_id: int | None, what: str,
             done: Callable[[], str], act: Callable[[], T]) -> T:
    """act() between a `started` record and its end; `what`: the plan in a line
    (the `started` record's detail); `done()`: how far the action got, asked only
    after an interruption. act's value is returned.

    One frame holds the handlers, the record and the action in one try: a
    signal's handler raises at whichever instruction it lands on, and from the
    `started` record on every one of them is inside it. (A generator context
    manager around the action leaves a window: a handler run in contextlib's
    __enter__, after the generator yielded and before the with block began,
    escapes the except and leaves `started` with no end.)"""
    signum = None
    try:
        with signals_raise():
            with Registry(ws.db_path) as reg:
                reg.record(action, "started", stage=stage, run_id=run_id, detail=what)
            return act()
    except (Signalled, KeyboardInterrupt) as exc:
        signum = signum_of(exc)
    except Refused as exc:
        # Re-planned at execution and refused (a parallel clean took the files): the
        # `started` record gets its end here, the action recorded nothing of its own.
        with Registry(ws.db_path) as reg:
            reg.record(action, "nothing to do" if exc.code == 0 else (f"refused: {exc.kind}" if exc.kind
                                                                       else "refused"),
                       stage=stage, run_id=run_id, detail=str(exc))
        raise
    with held_off():
        name = signal.Signals(signum).name
        progress = done()
        with Registry(ws.db_path) as reg:
            reg.record(action, f"interrupted: {name}", stage=stage, run_id=run_id, detail=progress)
        said = (f"{action} {stage}: interrupted by {name}: {progress} "
                f"(recorded in the audit log: `events --stage {stage}`)")
    raise Interrupted(said, signum)


def files_gone(paths: list[str], verb: str) -> Callable[[], str]:
    """How many of the planned files are no longer where they were."""
    def count() -> str:
        gone = sum(1 for p in paths if not os.path.lexists(p))
        return f"{gone:,} of {len(paths):,} file(s) {verb}, {len(paths) - gone:,} left in place"
    return count


def procs_gone(procs: list) -> Callable[[], str]:
    """How many of the planned processes (pid and create time, as the plan saw them) have ended."""
    import psutil

    def count() -> str:
        left = []
        for p in procs:
            try:
                if abs(psutil.Process(p.pid).create_time() - p.create_time) <= 0.01:
                    left.append(p.pid)
            except psutil.NoSuchProcess:
                pass
        return (f"{len(procs) - len(left)} of {len(procs)} process(es) gone"
                + (f", still alive: {left}" if left else ""))
    return count
