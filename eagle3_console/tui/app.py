"""The console's Textual App: holds what the screen needs (workspace, NVML,
collector, options), loads the layout, and leaves when the terminal goes.

Everything shown and done lives in eagle3_console/tui/: screen.py composes
and renders, its sampler worker polls Collector.collect() off the UI thread,
guarded.py is the table of guarded actions, host.py what the screen reads
of this App (a protocol: the screen never imports this module) and Frozen,
console.tcss the layout.
tui/ is the only part of the console that imports textual;
commands.py (the typer app) calls run_app() for the bare command and `tui`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

from textual.app import App

from eagle3_console.tui.host import Frozen
from eagle3_console.tui.screen import ConsoleScreen
from eagle3_console.kernel.workspace import Workspace

REFRESH_S = 1.0
STOP_GRACE_S = 10.0


class ConsoleApp(App[int]):
    TITLE = "eagle3-console"
    CSS_PATH = "console.tcss"
    # Every key is listed in the footer and in `?`; the palette would only
    # take footer room at 80 columns.
    ENABLE_COMMAND_PALETTE = False
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-medium"), (44, "-tall")]

    def __init__(self, ws: Workspace, *, readonly: bool = False, nvml: Any = None, collector: Any = None,
                 refresh_s: float = REFRESH_S, frozen: Frozen | None = None, stop_grace_s: float = STOP_GRACE_S,
                 kill_release_timeout_s: float = 60.0) -> None:
        super().__init__()
        self.ws, self.readonly, self.refresh_s, self.frozen = ws, readonly, refresh_s, frozen
        self.stop_grace_s, self.kill_release_timeout_s = stop_grace_s, kill_release_timeout_s
        if nvml is None and collector is None:
            from eagle3_console.monitor.gpus import Nvml
            nvml = Nvml()
        # One NVML session for sampling and for the kill action's release check.
        self.nvml = nvml
        if collector is None:
            from eagle3_console.observe.snapshot import Collector
            collector = Collector(ws, nvml=nvml)
        self.collector = collector
        self.exit_note: str | None = None

    def get_default_screen(self) -> ConsoleScreen:
        return ConsoleScreen()

    @property
    def main_screen(self) -> ConsoleScreen:
        return self.default_screen      # type: ignore[return-value]

    def on_mount(self) -> None:
        try:
            # The terminal went away (SSH dropped, tmux pane killed): leave, do not spin.
            self._loop.add_signal_handler(signal.SIGHUP, self.terminal_gone)
        except (NotImplementedError, RuntimeError, ValueError, AttributeError):
            pass

    def terminal_gone(self) -> None:
        self.exit_note = "terminal went away"
        self.exit(0)
        # Restoring a terminal that no longer exists can block in the driver;
        # nothing is left to show, so do not linger (supervised runs are not ours).
        watchdog = threading.Timer(5.0, os._exit, args=(0,))
        watchdog.daemon = True
        watchdog.start()

    @staticmethod
    def terminal_alive() -> bool:
        """False once the controlling terminal is gone (a hung-up tty fails ioctls)."""
        try:
            os.get_terminal_size(sys.__stdout__.fileno())
            return True
        except (OSError, ValueError, AttributeError):
            # Not a terminal at all (headless tests): nothing went away.
            return not _was_tty

    def shutdown(self) -> None:
        """After run(): release NVML once no sampler pass is using it (a pass
        stuck in a slow call is a daemon thread and does not hold the exit)."""
        if self.main_screen.wait_idle(2.0):
            try:
                self.collector.close()
            except Exception:
                pass


_was_tty = bool(getattr(sys.__stdout__, "isatty", lambda: False)())


def run_app(ws: Workspace, readonly: bool = False, **kw: Any) -> int:
    """Open the console on `ws`; returns the process exit code. Running stages
    keep running after it exits: they are supervised, never its children."""
    kw.setdefault("frozen", Frozen.from_env())
    app = ConsoleApp(ws, readonly=readonly, **kw)
    try:
        code = app.run()
    finally:
        app.shutdown()
    if app.exit_note:
        print(f"eagle3-console: {app.exit_note}", file=sys.stderr)
    else:
        live = app.main_screen.live_runs()
        if live:
            print("eagle3-console: still running (supervised): " + ", ".join(live), file=sys.stderr)
    # An exception that ended the app (Textual printed its traceback) is exit 1, never 0.
    return code or app.return_code or 0
