"""A console action ended by a signal: SIGTERM and SIGHUP raised as an exception
in the main thread (as SIGINT raises KeyboardInterrupt), so the action unwinds
through its own cleanup and says how far it got; the CLI prints `said` and exits
with `code` (128 + the signal's number).

Where it sits: the kernel; `stop` (runs/stopper.py) and the destructive
actions' audit record (actions/interrupted.py) both use it.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

# Raised as Signalled inside signals_raise(); SIGINT stays Python's KeyboardInterrupt.
SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """The action was ended by a signal; `said` is the line the CLI prints, `code` its exit code."""

    def __init__(self, said: str, signum: int):
        super().__init__(said)
        self.said = said
        self.code = 128 + signum


class Signalled(BaseException):
    """SIGTERM or SIGHUP arrived (a BaseException: no `except Exception` of the action swallows it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum, _frame):
    raise Signalled(signum)


@contextmanager
def signals_raise() -> Iterator[None]:
    """SIGNALS raise Signalled inside the block (main thread only: the TUI's workers keep
    their process's handlers); the handlers before it are put back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {}
    try:
        for s in SIGNALS:
            before[s] = signal.signal(s, _raise)
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextmanager
def held_off() -> Iterator[None]:
    """SIGINT and SIGNALS ignored inside the block (main thread only): a second signal
    while the interruption is recorded would lose the record."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = {s: signal.signal(s, signal.SIG_IGN) for s in (*SIGNALS, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)


def signum_of(exc: BaseException) -> int:
    """The signal a KeyboardInterrupt or a Signalled stands for."""
    return signal.SIGINT if isinstance(exc, KeyboardInterrupt) else exc.signum
