"""Where the commands print: stdout and stderr as rich Consoles, made on
first use, so that `status --json` (cron, every minute) prints with print()
and never pays rich's import. Every command and the error path print here.
"""

from __future__ import annotations

import os
import sys

# soft_wrap: plans list paths that must stay greppable, never folded.
# Piped (cron, grep) output is not folded to 80 columns.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class LazyConsole:
    """A rich Console made on first use."""

    def __init__(self, **kwargs: object) -> None:
        self._kwargs = kwargs
        self._console = None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


out = LazyConsole(soft_wrap=True, width=_PIPE_WIDTH)
err = LazyConsole(stderr=True, soft_wrap=True, width=_PIPE_WIDTH)


def say(line: str) -> None:
    """A line on stdout as it is: no markup read in it, nothing highlighted."""
    out.print(line, highlight=False, markup=False)


def warn(line: str) -> None:
    """A line on stderr as it is."""
    err.print(line, highlight=False, markup=False)
