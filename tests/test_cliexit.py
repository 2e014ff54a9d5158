"""cli/exit.py's failure(): the one mapping from what a command raises to README's
exit code and the line it prints; a bug (anything else) maps to None and
keeps its traceback."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest

from eagle3_console.cli.exit import CommandError, Failure, Unreadable, failure
from eagle3_console.kernel.config import ConfigError
from eagle3_console.actions.policy import LockHeld
from eagle3_console.kernel.registry import StateError
from eagle3_console.runs import NothingToDo, Refused


@pytest.mark.parametrize("exc, want", [
    (ConfigError("eagle3.toml", "stages.x", "no such stage"), Failure(3, "error: eagle3.toml: stages.x: no such stage")),
    (StateError("state database /s.db has vanished"), Failure(3, "error: state database /s.db has vanished")),
    (Unreadable("state database /s.db is unreadable: x", "state_error"),
     Failure(3, "error: state database /s.db is unreadable: x")),
    (CommandError("stage 'a' has no runs yet", 2), Failure(2, "error: stage 'a' has no runs yet")),
    (Refused("dependency b is not done"), Failure(2, "refused: dependency b is not done")),
    (Refused("unknown param", code=3), Failure(3, "error: unknown param")),
    (NothingToDo("no live run"), Failure(0, "nothing to do: no live run", stdout=True)),
    (LockHeld("another watch (pid 7) holds the lock"), Failure(75, "another watch (pid 7) holds the lock")),
    (sqlite3.DatabaseError("file is not a database"),
     Failure(3, "error: state database /w/.eagle3/state.db: file is not a database")),
    (PermissionError(errno.EACCES, "Permission denied", "/w/eagle3.toml"),
     Failure(3, "error: /w/eagle3.toml: Permission denied")),
])
def test_each_failure_has_its_exit_code_and_line(exc, want):
    assert failure(exc, Path("/w/.eagle3/state.db")) == want


@pytest.mark.parametrize("exc", [KeyError("x"), ValueError("bug"), OSError(errno.EPIPE, "Broken pipe"),
                                 OSError(errno.ENOENT, "no file name")])
def test_a_bug_or_a_closed_pipe_is_not_mapped(exc):
    assert failure(exc) is None
