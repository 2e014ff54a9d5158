"""The entry point. The bare command opens the TUI; the commands are typer's
(eagle3_console/commands.py, actions and exporter in cli_actions.py).

`status --json` (cron, every minute) is answered here without typer: its
arguments are few and fixed, and click and typer are a third of the
process's imports. Anything else, or anything unusual about those arguments,
goes through typer. Both paths run status_json(), so the output and the exit
code are the same (tests/test_status.py runs both).

Data flow: cli -> config / runs / actions / snapshot. This module must never
import textual or torch at import time: `status --json` runs from cron.
Exit codes: 0 OK, 1 WARNING, 2 CRITICAL or refused, 3 UNKNOWN / bad input,
75 another `watch` holds the lock.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Optional

from eagle3_console import config as cfg
from eagle3_console.registry import StateError
from eagle3_console.workspace import ENV_WORKSPACE, Workspace

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN, EXIT_LOCKED = 0, 1, 2, 3, 75

# soft_wrap: plans list paths that must stay greppable, never folded.
# Piped (cron, grep) output is not folded to 80 columns.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class _LazyConsole:
    """A rich Console made on first use: `status --json` (cron, every minute)
    prints with print() and never pays rich's import."""

    def __init__(self, **kwargs: object) -> None:
        self._kwargs = kwargs
        self._console = None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


out = _LazyConsole(soft_wrap=True, width=_PIPE_WIDTH)
err = _LazyConsole(stderr=True, soft_wrap=True, width=_PIPE_WIDTH)


# The workspace of this invocation, for main()'s last-resort error line.
_WORKSPACE: list[Optional[Workspace]] = [None]


class Ctx:
    """The invocation's workspace. Its refusals are SystemExit with the exit
    code, which click lets through unchanged, so that the typer commands and
    the path without typer share them."""

    def __init__(self, workspace: Optional[Path]):
        self.ws = Workspace.at(workspace)
        _WORKSPACE[0] = self.ws

    def pipeline(self) -> cfg.Pipeline:
        try:
            return cfg.load(self.ws.config_path)
        except cfg.ConfigError as exc:
            err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
            raise SystemExit(EXIT_UNKNOWN)

    def stage(self, name: str) -> cfg.Stage:
        # An unknown stage is bad input (exit 3), not a crash with a traceback.
        pipe = self.pipeline()
        try:
            return pipe.stage(name)
        except cfg.ConfigError as exc:
            err.print(f"error: {exc}", highlight=False, markup=False)
            raise SystemExit(EXIT_UNKNOWN)


class Unreadable(Exception):
    """The workspace cannot be read (pipeline file, state database): the one line why."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code        # config_error | state_error: the JSON alert's code


def _collect(c: Ctx, no_gpus: bool):
    from eagle3_console.snapshot import Collector
    try:
        col = Collector(c.ws, persist=True, gpus=not no_gpus)
        try:
            return col.collect()
        finally:
            col.close()
    except (cfg.ConfigError, StateError) as exc:
        raise Unreadable(str(exc), "config_error" if isinstance(exc, cfg.ConfigError) else "state_error") from None
    except sqlite3.Error as exc:
        raise Unreadable(f"state database {c.ws.db_path} is unreadable: {exc}", "state_error") from None


def collect(c: Ctx, no_gpus: bool = False):
    c.pipeline()
    try:
        return _collect(c, no_gpus)
    except Unreadable as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise SystemExit(EXIT_UNKNOWN)


def status_json(c: Ctx, no_gpus: bool) -> int:
    """Print the snapshot as one JSON object; its exit code. A workspace that cannot
    be read is still one object (health unknown, the error), for whatever parses it."""
    try:
        snap = _collect(c, no_gpus)
    except Unreadable as exc:
        import time
        err.print(f"error: {exc}", highlight=False, markup=False)
        alert = {"level": "unknown", "code": exc.code, "message": str(exc), "stage": None, "line": None}
        print(json.dumps({"schema": 1, "workspace": str(c.ws.root), "host": os.uname().nodename,
                          "time": time.time(), "health": "unknown", "error": str(exc), "stages": [],
                          "gpus": [], "disk": [], "alerts": [alert]}, indent=2))
        return EXIT_UNKNOWN
    print(json.dumps(snap.to_dict(), indent=2, default=str))
    return snap.exit_code


# ------------------------------------------------------------------ without typer
_WORKSPACE_FLAGS = ("-w", "--workspace")


def status_json_args(argv: list[str]) -> tuple[Optional[str], bool] | None:
    """(workspace or None, no_gpus) when argv is `status --json` with only
    -w/--workspace and --no-gpus around it, in any order typer accepts; None
    for anything else (typer parses it, and says what is wrong)."""
    if argv.count("status") != 1 or "--json" not in argv:
        return None
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None     # a shell-completion request: click's
    workspace: Optional[str] = None
    seen_workspace = seen_status = no_gpus = False
    i = 0
    while i < len(argv):
        a = argv[i]
        value = None
        if a in _WORKSPACE_FLAGS:
            if i + 1 >= len(argv):
                return None
            value = argv[i + 1]
            i += 1
        elif a.startswith("--workspace="):
            value = a.partition("=")[2]
        elif a == "status":
            seen_status = True
        elif a == "--json" and seen_status:
            pass
        elif a == "--no-gpus" and seen_status:
            no_gpus = True
        else:
            return None
        if value is not None:
            # Twice, empty, or a value click might read as an option: typer's call.
            if seen_workspace or not value or value.startswith("-"):
                return None
            workspace, seen_workspace = value, True
        i += 1
    if workspace is None and os.environ.get(ENV_WORKSPACE) == "":
        return None
    return workspace, no_gpus


def _status_without_typer(args: tuple[Optional[str], bool]) -> None:
    """click's standalone handling, for the exits status_json can take."""
    workspace, no_gpus = args
    try:
        code = status_json(Ctx(Path(workspace) if workspace is not None else None), no_gpus)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        import click.utils      # as click does: no second error while flushing a closed pipe
        sys.stdout = click.utils.PacifyFlushWrapper(sys.stdout)
        sys.stderr = click.utils.PacifyFlushWrapper(sys.stderr)
        sys.exit(1)
    sys.exit(code)


# ------------------------------------------------------------------ main
def _environment_error(exc: BaseException) -> str | None:
    """One line for a broken workspace (state database, state folder, pipeline
    file), or None for anything else (a bug: its traceback is wanted)."""
    ws = _WORKSPACE[0]
    if isinstance(exc, (StateError, cfg.ConfigError)):
        return str(exc)
    if isinstance(exc, sqlite3.Error):
        where = ws.db_path if ws else "the state database"
        return f"state database {where}: {exc}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return None


def main() -> None:
    argv = sys.argv[1:]
    if status_json_args(argv) is None:
        run(argv)
        return
    try:
        run(argv)
    except SystemExit as exc:
        _exit_now(exc.code)


def _exit_now(code: Any) -> None:
    """End a finished `status --json` process without the interpreter's teardown.

    Its output is written and its files and database closed by then; what is
    left is freeing every module and the exit handlers of the C libraries it
    loaded (libnvidia-ml): 21 ms of 188 on an H200 with NVML live
    (benchmarks/status_cost.py --gpu-worker), on the call cron makes every
    minute. Python's atexit handlers still run; only this console-script
    entry does it (run() raises SystemExit for tests and the TUI)."""
    import atexit

    if code is None:
        code = EXIT_OK
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise
        code = 1        # as click: a reader that went away is exit 1, said nowhere
    atexit._run_exitfuncs()
    os._exit(code)


def run(argv: list[str], fast: bool = True) -> None:
    """The command line; fast=False sends `status --json` through typer too (tests compare the two)."""
    try:
        args = status_json_args(argv) if fast else None
        if args is not None:
            _status_without_typer(args)
        from eagle3_console.commands import app, hoist_workspace
        app(args=hoist_workspace(argv))
    except Exception as exc:
        # Exit 3 (UNKNOWN) is promised for a workspace that cannot be read; cron
        # reads a traceback's exit 1 as a mere WARNING.
        line = _environment_error(exc)
        if line is None:
            raise
        err.print(f"error: {line}", highlight=False, markup=False)
        sys.exit(EXIT_UNKNOWN)


def __getattr__(name: str) -> Any:
    # `cli.app`, `cli.hoist_workspace`: the typer app, imported when asked for.
    if name in ("app", "hoist_workspace", "WORKSPACE_FLAGS"):
        from eagle3_console import commands
        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    # `python -m eagle3_console.cli`: the module the commands import, not a
    # second copy of it named __main__ (the last-resort error line reads its workspace).
    from eagle3_console.cli import main as _main
    _main()
