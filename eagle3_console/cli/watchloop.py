"""The passes of `watch`: each reads the pipeline file once, takes the
snapshot, applies the policies (policy.py) and says what it saw.

A long-running watch outlives a pipeline file that is invalid or missing for
a while (an editor's save, a `git checkout`) and a registry that another
process holds busy: the pass says why it could not run and the next one tries
again, so a pending restart still happens once the file is back. `--once`
(cron) reports the first such failure and exits 3; a long watch whose first
pass meets it says so once and retries, as later. A pass rests at least as
long as it took, so a short interval on a large pipeline never keeps a core
busy.

Data flow: config.load (once a pass) -> ctx.collect -> policy.apply /
policy.advance -> `tell` (the terminal) and the registry's events.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Callable

from eagle3_console.kernel import config as cfg
from eagle3_console.actions import policy
from eagle3_console.cli.exit import Unreadable
from eagle3_console.cli.ctx import Ctx, collect
from eagle3_console.kernel.registry import StateError


@dataclass
class Options:
    once: bool = False
    interval_s: float = 30.0
    no_gpus: bool = False
    advance: bool = False
    until_done: bool = False


class Said:
    """The alerts a long watch last said: a pass says the new ones and the ones
    that cleared, never again one that stands unchanged (a day of 30 s passes
    repeated one failure 2,880 times)."""

    def __init__(self) -> None:
        self.alerts: list[str] = []

    def lines(self, now: list[str]) -> list[str]:
        before, after = set(self.alerts), set(now)
        out = [line for line in now if line not in before]
        out += [f"cleared: {line}" for line in self.alerts if line not in after]
        self.alerts = list(dict.fromkeys(now))
        return out


def one_pass(c: Ctx, opts: Options, tell: Callable[[str], None],
             read: Callable[[], None] = lambda: None, said: Said | None = None) -> int | None:
    """One pass; its exit code when the watch is done (`--once`, or `--until-done`
    with the pipeline settled), else None. `read()` is called once the workspace
    has been read, before anything is done (a watch that was failing says so first).
    `said`: what the watch's earlier passes said (a long watch); without it every alert is said."""
    told = 0

    def say(line: str) -> None:
        nonlocal told
        told += 1
        tell(line)
    pipe = cfg.load(c.ws.config_path)
    snap = collect(c, opts.no_gpus, pipe)
    read()
    acted = policy.apply(c.ws, snap, say, pipe=pipe)
    if opts.advance:
        acted += policy.advance(c.ws, snap, say, pipe=pipe)
    if acted:
        snap = collect(c, opts.no_gpus, pipe)
    lines = [f"{a.level.upper()}: {a.message}" for a in snap.alerts]
    for line in (said.lines(lines) if said is not None else lines):
        say(line)
    if opts.once:
        if not told:     # a cron log that stays empty cannot tell "ran, all well" from "never ran"
            say(f"nothing to do: health {snap.health}; " + ", ".join(f"{s.name} {s.status}" for s in snap.stages))
        return snap.exit_code
    if opts.until_done and policy.settled(snap) and not policy.restart_pending(c.ws, snap, pipe):
        tell("pipeline settled: " + ", ".join(f"{s.name} {s.status}" for s in snap.stages))
        return snap.exit_code
    return None


def _why(exc: Exception) -> str | None:
    """What keeps a pass from running that a later pass may not meet, or None."""
    if isinstance(exc, (cfg.ConfigError, StateError, Unreadable)):
        return str(exc)
    if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
        return f"the state database is busy: {exc}"
    return None


def run(c: Ctx, opts: Options, tell: Callable[[str], None]) -> int:
    """Passes under the watch lock until one says the watch is done; the exit code."""
    with policy.WatchLock(c.ws):
        failing: str | None = None
        said = None if opts.once else Said()

        def resumed() -> None:
            nonlocal failing
            if failing is not None:
                tell("passes resumed: the workspace reads again")
                failing = None

        while True:
            began = time.monotonic()
            try:
                code = one_pass(c, opts, tell, resumed, said)
            except Exception as exc:     # noqa: BLE001 - sorted by _why: a bug is re-raised
                why = _why(exc)
                if why is None or opts.once:
                    raise
                if why != failing:
                    tell(f"UNKNOWN: pass skipped: {why}; trying again every {opts.interval_s:g} s")
                failing = why
            else:
                if code is not None:
                    return code
            time.sleep(max(opts.interval_s, time.monotonic() - began))
