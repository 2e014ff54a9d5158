"""Where the commands print: stdout and stderr as rich Consoles, made on
first use, so that `status --json` (cron, every minute) prints with print()
and never pays rich's import. Every command and the error path print here.

A standard stream closed by the caller (`watch --once >&-`) is opened on
/dev/null at import: otherwise the next file this process opens (state.db)
takes its number, and a print, or a stage inheriting it, writes into that
file. A stream that refuses a write (a full disk, /dev/full) raises
Unwritable, which exit.py says in one line (exit 3).
"""

from __future__ import annotations

import errno
import os
import sys


def _open_closed_std_streams() -> None:
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False))


_open_closed_std_streams()

# soft_wrap: plans list paths that must stay greppable, never folded.
# Piped (cron, grep) output is not folded to 80 columns.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class Unwritable(Exception):
    """stdout or stderr refused a write: what the command says is lost."""

    def __init__(self, stream: str, exc: OSError):
        self.stream, self.errno = stream, exc.errno
        super().__init__(f"{stream}: cannot write the output: {exc.strerror or exc}")


def write_failed(exc: BaseException) -> bool:
    """Whether `exc` is a write to a standard stream that failed for good
    (a closed pipe is not: click and the entry point say nothing of it)."""
    return isinstance(exc, OSError) and exc.filename is None and exc.errno in (errno.ENOSPC, errno.EDQUOT,
                                                                               errno.EIO, errno.EFBIG)


class LazyConsole:
    """A rich Console made on first use."""

    def __init__(self, name: str, **kwargs: object) -> None:
        self._name = name
        self._kwargs = kwargs
        self._console = None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._kwargs)
            self._console.on_broken_pipe = _broken_pipe
        attr = getattr(self._console, name)
        return self._guarded(attr) if name == "print" else attr

    def _guarded(self, print_):
        def guarded(*args, **kwargs):
            try:
                return print_(*args, **kwargs)
            except OSError as exc:
                if not write_failed(exc):
                    raise
                raise Unwritable(self._name, exc) from None
        return guarded


out = LazyConsole("stdout", soft_wrap=True, width=_PIPE_WIDTH)
err = LazyConsole("stderr", stderr=True, soft_wrap=True, width=_PIPE_WIDTH)


def say(line: str) -> None:
    """A line on stdout as it is: no markup read in it, nothing highlighted."""
    out.print(line, highlight=False, markup=False)


def warn(line: str) -> None:
    """A line on stderr as it is; where stderr itself refuses it, nothing more can be said."""
    try:
        err.print(line, highlight=False, markup=False)
    except Unwritable:
        pass


def reader_gone() -> None:
    """The reader of stdout went away (`status | head -1`): what is left to print
    goes to /dev/null, so the command still ends with its own exit code (a
    monitoring check reads it through `set -o pipefail`), not the pipe's."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, sys.stdout.fileno())
    finally:
        os.close(null)


def closed_pipe(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EPIPE


def _broken_pipe() -> None:
    """rich's own answer to a closed pipe is SystemExit(1), which would replace the
    command's exit code: raised as the OSError it is, for the command to decide."""
    reader_gone()
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
