"""The header line: workspace, host, time and overall health (the worst alert).

Renders Snapshot.workspace/host/time/health/alerts; the app may override the
shown time and host (frozen, for reproducible screenshots) and adds its own
state (read-only mode, a failing sampler)."""

from __future__ import annotations

from datetime import datetime

from rich.text import Text
from textual.widgets import Static

from eagle3_console.model import LEVEL_RANK, Snapshot

HEALTH_STYLE = {"ok": "bold green", "warning": "bold yellow", "critical": "bold white on red",
                "unknown": "bold magenta"}


def worst_alert(snap: Snapshot):
    alerts = sorted(snap.alerts, key=lambda a: LEVEL_RANK.get(a.level, 0), reverse=True)
    return alerts[0] if alerts else None


class HeaderBar(Static):
    DEFAULT_CSS = """
    HeaderBar { height: 1; background: $panel; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__("eagle3-console  (sampling...)", **kw)

    def show(self, snap: Snapshot | None, *, workspace: str, host: str, now: float,
             readonly: bool = False, sampler_error: str | None = None) -> None:
        t = Text(no_wrap=True, overflow="ellipsis")
        t.append("eagle3-console", "bold")
        if readonly:
            t.append(" [read-only]", "bold cyan")
        t.append(f"  {workspace}", "cyan")
        t.append(f"  {host}  ")
        t.append(datetime.fromtimestamp(now).strftime("%Y-%m-%d %H:%M:%S"))
        t.append("  ")
        if sampler_error:
            t.append(" SAMPLER ERROR ", "bold white on red")
            t.append(f" {sampler_error}", "red")
        elif snap is None:
            t.append("sampling...", "dim")
        else:
            health = snap.health
            t.append(f" {health.upper()} ", HEALTH_STYLE.get(health, "bold"))
            alert = worst_alert(snap)
            if alert is not None:
                more = len(snap.alerts) - 1
                where = f"{alert.stage}: " if alert.stage else ""
                t.append(f" {where}{alert.message}")
                if more:
                    t.append(f" (+{more} more)", "dim")
        self.update(t)
