"""The header line: workspace, host, time and overall health (the worst alert).

Renders Snapshot.workspace/host/time/health/alerts; the app may override the
shown time and host (frozen, for reproducible screenshots) and adds its own
state (read-only mode, a failing sampler)."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from eagle3_console.model import LEVEL_RANK, Snapshot

HEALTH_STYLE = {"ok": "bold green", "warning": "bold yellow", "critical": "bold white on red",
                "unknown": "bold magenta"}


def worst_alert(snap: Snapshot):
    """The most severe alert; among equals, the one that says why (out of
    memory) before the bare "stage failed" that comes with it."""
    alerts = sorted(snap.alerts, key=lambda a: (LEVEL_RANK.get(a.level, 0), a.code != "stage_failed"),
                    reverse=True)
    return alerts[0] if alerts else None


class HeaderBar(Static):
    DEFAULT_CSS = """
    HeaderBar { height: 1; background: $panel; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__("eagle3-console  (sampling...)", **kw)
        self._key: tuple | None = None
        self._args: tuple | None = None

    def on_resize(self) -> None:
        # What fits depends on the width (the date, how much of the alert shows).
        if self._args is not None:
            self.show(*self._args[0], **self._args[1])

    def show(self, snap: Snapshot | None, *, workspace: str, host: str, now: float,
             readonly: bool = False, sampler_error: str | None = None) -> None:
        self._args = ((snap,), dict(workspace=workspace, host=host, now=now, readonly=readonly,
                                    sampler_error=sampler_error))
        # Health first: at 80 columns the alert text is what gets cut, never the state.
        left = Text(no_wrap=True, overflow="ellipsis")
        left.append("eagle3-console ", "bold")
        if sampler_error:
            left.append(" SAMPLER ERROR ", "bold white on red")
            left.append(f" {sampler_error}", "red")
        elif snap is None:
            left.append("sampling...", "dim")
        else:
            health = snap.health
            left.append(f" {health.upper()} ", HEALTH_STYLE.get(health, "bold"))
            alert = worst_alert(snap)
            if alert is not None:
                more = len(snap.alerts) - 1
                left.append(f" {alert.message}")
                if more:
                    left.append(f" (+{more})", "dim")
        right = Text(no_wrap=True, overflow="ellipsis", justify="right")
        if readonly:
            right.append("read-only ", "bold cyan")
        right.append(workspace, "cyan")
        right.append(f"  {host}  ")
        # Minutes: a seconds clock would repaint the header every second for
        # nothing an operator reads (elapsed times and the log show liveness).
        fmt_ = "%Y-%m-%d %H:%M" if self.size.width >= 120 else "%H:%M"
        right.append(datetime.fromtimestamp(now).strftime(fmt_))
        key = (left, right, self.size.width)
        if key == self._key:
            return
        self._key = key
        grid = Table.grid(expand=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(no_wrap=True, justify="right", max_width=max(20, self.size.width // 2))
        grid.add_row(left, right)
        # One fixed line: never worth a relayout of the screen.
        self.update(grid, layout=False)
