"""Refused: an action the console did not take, with the reason and its exit code.

Raised by runs (launch, stop), the actions (clean, kill, restart) and the
stopper; the CLI prints it and exits with its code, the TUI shows it. Its own
module so that every layer can raise it without importing runs.
"""

from __future__ import annotations


class Refused(Exception):
    """An action that was not taken, with the reason; `code` is the exit code."""

    def __init__(self, message: str, code: int = 2, kind: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.code = code
        self.kind = kind        # what the audit log says of it: "refused: <kind>"
        self.detail = detail    # the audit log's detail, where it is not the message


class NothingToDo(Refused):
    """Not taken because there is nothing to act on (stop with no live run):
    exit 0, since the state the operator asked for already holds."""

    def __init__(self, message: str):
        super().__init__(message, code=0)
