"""The header line: workspace, host, time and overall health (the worst alert).

Renders Snapshot.workspace/host/time/health/alerts; the app may override the
shown time and host (frozen, for reproducible screenshots) and adds its own
state (read-only mode, a failing sampler)."""

from __future__ import annotations

from datetime import datetime

from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from eagle3_console.kernel.model import LEVEL_RANK, Snapshot
from eagle3_console.tui.panes import fmt

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
        # Minutes: a seconds clock would repaint the header every second for
        # nothing an operator reads (elapsed times and the log show liveness).
        clock = datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M" if self.size.width >= 120 else "%H:%M")
        # At 80 columns the alert (left) needs the room more than the workspace path.
        # A short alert leaves the rest to the path.
        base = self.size.width // 2 if self.size.width >= 120 else self.size.width * 2 // 5
        room = max(20, base, self.size.width - 2 - left.cell_len - 2)
        tail = f"  {host}  {clock}"
        lead = "read-only " if readonly else ""
        # The clock and host are never cut: the workspace path gives way, from its front.
        right = Text(no_wrap=True, overflow="ellipsis", justify="right")
        right.append(lead, "bold cyan")
        # (A space first: a cut alert on the left and a cut path do not run together as "……".)
        right.append(" " + fmt.path_tail(workspace, max(room - len(tail) - len(lead) - 1, 1)), "cyan")
        right.append(tail)
        key = (left, right, self.size.width)
        if key == self._key:
            return
        self._key = key
        grid = Table.grid(expand=True)
        grid.add_column(ratio=1, no_wrap=True, overflow="ellipsis")
        grid.add_column(no_wrap=True, justify="right", max_width=room)
        grid.add_row(left, right)
        # One fixed line: never worth a relayout of the screen.
        self.update(grid, layout=False)
