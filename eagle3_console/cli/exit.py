"""The exit codes of every command (README's table) and the one mapping
from an exception to its code and its line on the terminal.

Every command's failure goes through report(): the typer group catches what
a command raises (opts.ExitCodeGroup), and the entry point catches what
`status --json` without typer raises (cli/__init__.py). A bug, an exception this
does not know, keeps its traceback.

No typer or click here: the path without typer uses it.
"""

from __future__ import annotations

import errno
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from eagle3_console.cli.out import Unwritable, out, warn, write_failed
from eagle3_console.kernel.config import ConfigError
from eagle3_console.kernel.registry import StateError

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN, EXIT_LOCKED = 0, 1, 2, 3, 75
EXIT_BAD_INPUT = EXIT_UNKNOWN       # bad input is UNKNOWN: an error to fix, no refusal


class CommandError(Exception):
    """A command's own failure in one line, `error: <message>`, and its exit
    code: 3 (bad input, an unreadable workspace) unless said otherwise."""

    def __init__(self, message: str, code: int = EXIT_UNKNOWN):
        super().__init__(message)
        self.code = code


class Unreadable(CommandError):
    """The workspace cannot be read (pipeline file, state database): the one line why."""

    def __init__(self, message: str, alert: str):
        super().__init__(message, EXIT_UNKNOWN)
        self.alert = alert      # config_error | state_error: the JSON alert's code


@dataclass(frozen=True)
class Failure:
    code: int
    line: str
    stdout: bool = False        # "nothing to do" is no error: it is said on stdout


def failure(exc: BaseException, db_path: Optional[Path] = None) -> Failure | None:
    """The exit code and line for `exc`, or None for a bug (its traceback is wanted).
    Exit 3 (UNKNOWN) is promised for a workspace that cannot be read: cron
    reads a traceback's exit 1 as a mere WARNING."""
    if isinstance(exc, CommandError):
        return Failure(exc.code, f"error: {exc}")
    if isinstance(exc, (ConfigError, StateError)):
        return Failure(EXIT_UNKNOWN, f"error: {exc}")
    if isinstance(exc, sqlite3.Error):
        return Failure(EXIT_UNKNOWN, f"error: state database {db_path or 'the state database'}: {exc}")
    if isinstance(exc, Unwritable):
        return Failure(EXIT_UNKNOWN, f"error: {exc}")
    if write_failed(exc):
        return Failure(EXIT_UNKNOWN, f"error: {Unwritable('stdout', exc)}")
    if isinstance(exc, OSError):
        # A closed pipe is click's (and the entry point's): exit 1, said nowhere.
        if exc.filename and exc.errno != errno.EPIPE:
            return Failure(EXIT_UNKNOWN, f"error: {exc.filename}: {exc.strerror or exc}")
        return None
    # Imported here: only a command that ran them can raise theirs.
    from eagle3_console.runs import Refused
    if isinstance(exc, Refused):
        # Exit 3 is bad input (README): an error to fix, not a refusal to do something;
        # exit 0 is "nothing to do" (what was asked for already holds).
        word = {EXIT_UNKNOWN: "error", EXIT_OK: "nothing to do"}.get(exc.code, "refused")
        return Failure(exc.code, f"{word}: {exc}", stdout=exc.code == EXIT_OK)
    from eagle3_console.actions.policy import LockHeld
    if isinstance(exc, LockHeld):
        return Failure(EXIT_LOCKED, str(exc))
    return None


def report(exc: BaseException, db_path: Optional[Path] = None) -> int | None:
    """Say `exc`'s line; its exit code, or None for a bug (the caller re-raises)."""
    f = failure(exc, db_path)
    if f is None:
        return None
    if f.stdout:
        out.print(f.line, highlight=False, markup=False)
    else:
        warn(f.line)
    return f.code
