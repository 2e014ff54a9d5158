"""What every command shares: the invocation's workspace (Ctx, which typer
hands each command as ctx.obj) and the snapshot a command reads
(collect, status_json).

Data flow: config / registry -> Ctx -> snapshot.Collector -> the commands.
No typer or click here: `status --json` without typer (cli/__init__.py) runs
status_json() too, so both paths print the same bytes and exit alike.
Failures are raised (exit.py says them and picks the exit code).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Optional

from eagle3_console.kernel import config as cfg
from eagle3_console.cli import exit
from eagle3_console.cli.exit import Unreadable
from eagle3_console.cli.out import closed_pipe, reader_gone
from eagle3_console.kernel.registry import StateError
from eagle3_console.kernel.workspace import Workspace


class Ctx:
    """The invocation's workspace and its pipeline file."""

    def __init__(self, workspace: Optional[Path]):
        self.ws = Workspace.at(workspace)
        self._pipe: cfg.Pipeline | None = None

    def pipeline(self) -> cfg.Pipeline:
        """The pipeline file, read once a command and handed down from here."""
        if self._pipe is None:
            self._pipe = cfg.load(self.ws.config_path)
        return self._pipe

    def stage(self, name: str) -> cfg.Stage:
        # An unknown stage is a ConfigError: bad input (exit 3), not a crash with a traceback.
        return self.pipeline().stage(name)

    def stage_or_live(self, name: str) -> cfg.Stage | None:
        """The stage, or None for one removed from the pipeline file while a run
        of it lives (it stays stoppable by name until it ends); else the
        ConfigError of an unknown stage."""
        pipe = self.pipeline()
        if name in pipe.stages:
            return pipe.stages[name]
        from eagle3_console.runs.liveness import stage_alive
        from eagle3_console.kernel.registry import Registry, RunStatus
        if self.ws.db_path.exists():
            with Registry(self.ws.db_path) as reg:
                run = reg.latest(name)
            if run is not None and (run.live or (run.status == RunStatus.LOST and stage_alive(run))):
                return None
        return pipe.stage(name)


def ctx_of(typer_ctx: Any) -> Ctx:
    """The Ctx the group's callback put on typer's context."""
    return typer_ctx.obj


def _collect(c: Ctx, no_gpus: bool, pipe: Optional[cfg.Pipeline] = None):
    from eagle3_console.observe.snapshot import Collector
    try:
        col = Collector(c.ws, persist=True, gpus=not no_gpus)
        try:
            return col.collect(pipe)
        finally:
            col.close()
    except (cfg.ConfigError, StateError) as exc:
        raise Unreadable(str(exc), "config_error" if isinstance(exc, cfg.ConfigError) else "state_error") from None
    except sqlite3.Error as exc:
        raise Unreadable(f"state database {c.ws.db_path} is unreadable: {exc}", "state_error") from None


def collect(c: Ctx, no_gpus: bool = False, pipe: Optional[cfg.Pipeline] = None):
    """The workspace's snapshot; a pipeline file or state database that cannot
    be read raises (exit 3). `pipe`: the pipeline file as the caller read it."""
    return _collect(c, no_gpus, pipe or c.pipeline())


def status_json(c: Ctx, no_gpus: bool) -> int:
    """Print the snapshot as one JSON object; its exit code. A workspace that cannot
    be read is still one object (health unknown, the error), for whatever parses it."""
    try:
        snap = _collect(c, no_gpus)
    except Unreadable as exc:
        import time
        code = exit.report(exc)
        alert = {"level": "unknown", "code": exc.alert, "message": str(exc), "stage": None, "line": None}
        print(json.dumps({"schema": 1, "workspace": str(c.ws.root), "host": os.uname().nodename,
                          "time": time.time(), "health": "unknown", "error": str(exc), "stages": [],
                          "gpus": [], "disk": [], "alerts": [alert]}, indent=2))
        return code
    try:
        print(json.dumps(snap.to_dict(), indent=2, default=str), flush=True)
    except OSError as exc:
        if not closed_pipe(exc):
            raise
        reader_gone()
    return snap.exit_code
