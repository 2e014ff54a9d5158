"""What the console's screen needs from the App that holds it (ConsoleHost),
and the frozen clock/host it may be given (Frozen).

The arrows run one way: eagle3_console/tui/app.py (the Textual App) imports the
screen and this module and provides a ConsoleHost; the screen reads its App
through this protocol only, never through app.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from eagle3_console.kernel.workspace import Workspace

# Reproducible screens (snapshot tests, screenshots in docs): a fixed clock and host.
ENV_FROZEN_TIME = "EAGLE3_CONSOLE_FROZEN_TIME"
ENV_FROZEN_HOST = "EAGLE3_CONSOLE_FROZEN_HOST"


@dataclass
class Frozen:
    """Shown instead of the live clock/host/workspace path (the data stay live)."""
    time: float | None = None
    host: str | None = None
    workspace: str | None = None

    @classmethod
    def from_env(cls) -> "Frozen | None":
        t, h = os.environ.get(ENV_FROZEN_TIME), os.environ.get(ENV_FROZEN_HOST)
        if t is None and h is None:
            return None
        return cls(time=float(t) if t else None, host=h)


class ConsoleHost(Protocol):
    """The screen's App: the workspace and its sampling, the options, and
    the Textual calls the screen makes."""

    ws: Workspace
    readonly: bool
    nvml: Any
    collector: Any
    refresh_s: float
    frozen: Frozen | None
    stop_grace_s: float
    kill_release_timeout_s: float
    exit_note: str | None

    def terminal_alive(self) -> bool: ...
    def terminal_gone(self) -> None: ...
    def notify(self, message: str, **kwargs: Any) -> None: ...
    def clear_notifications(self) -> None: ...
    def push_screen(self, screen: Any, callback: Callable[..., Any] | None = None, **kwargs: Any) -> Any: ...
    def exit(self, result: Any = None, **kwargs: Any) -> None: ...
