"""Stages pane: a table of stage, status, run id, started, elapsed, progress,
rate, ETA and exit code / signal; failed, killed, lost and OOM'd runs stand out.

Renders Snapshot.stages (StageStatus). The row under the cursor is the
selected stage: the Progress, Disk and Log panes follow it (the app listens to
StageTable.Selected). Rows are updated in place so the cursor stays put."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from eagle3_console.model import StageStatus
from widgets import fmt
from widgets.body import retitle

COLUMNS = ("stage", "status", "run", "started", "elapsed", "progress", "rate", "ETA", "exit")
STATUS_STYLE = {"running": "bold green", "pending": "cyan", "succeeded": "green", "failed": "bold red",
                "killed": "bold yellow", "lost": "bold magenta", "never": "dim"}


def is_oom(st: StageStatus) -> bool:
    return (st.log is not None and st.log.oom is not None) or any(a.code == "oom" for a in st.alerts)


def status_text(st: StageStatus) -> Text:
    label = st.status
    style = STATUS_STYLE.get(st.status, "")
    if is_oom(st) and st.status != "running":
        label, style = f"{st.status} OOM", "bold white on red"
    elif is_oom(st):
        label, style = "running OOM?", "bold red"
    return Text(label, style)


def elapsed(st: StageStatus, now: float) -> float | None:
    if st.started is None:
        return None
    return (st.ended or now) - st.started


def row(st: StageStatus, now: float) -> tuple:
    running = st.status == "running"
    rate = st.rate if running else None
    if st.tokens_per_s is not None and rate is not None:
        rate_s = f"{fmt.rate(rate)} {fmt.rate(st.tokens_per_s, 'tok/s')}"
    else:
        rate_s = fmt.rate(rate)
    exit_s = fmt.exit_text(st.exit_code, st.signal)
    return (
        Text(st.name, "bold"),
        status_text(st),
        "-" if st.run_id is None else str(st.run_id),
        fmt.clock(st.started, now),
        # Minutes once past the first one: the table repaints once a minute, not every second.
        fmt.duration(elapsed(st, now), coarse=running),
        fmt.pct(st.progress),
        rate_s,
        fmt.duration(st.eta_s) if running else "-",
        Text(exit_s, "bold red" if exit_s not in ("-", "0") else ""),
    )


class StageTable(DataTable):
    DEFAULT_CSS = """
    StageTable { height: auto; max-height: 14; border: round $primary-darken-1; }
    StageTable:focus { border: round $accent; }
    """

    @dataclass
    class Selected(Message):
        stage: str

    def __init__(self, **kw) -> None:
        self._cells_only = False       # set before DataTable's __init__, which refreshes
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self.border_title = "Stages"
        self._names: list[str] = []
        self._rows: dict[str, tuple] = {}
        self.row_repaints = 0

    def refresh(self, *regions, repaint: bool = True, layout: bool = False, recompose: bool = False):
        # DataTable.update_cell repaints the whole table; while show() updates
        # cells it repaints only the rows it changed (refresh_row), so a ticking
        # ETA costs one row a second, not the table.
        if self._cells_only and not regions and not layout and not recompose:
            return self
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def on_mount(self) -> None:
        for c in COLUMNS:
            self.add_column(c, key=c)

    @property
    def selected(self) -> str | None:
        if not self._names:
            return None
        return self._names[min(self.cursor_row, len(self._names) - 1)]

    def show(self, stages: list[StageStatus], now: float) -> None:
        names = [s.name for s in stages]
        if names != self._names:
            keep = self.selected
            self.clear()
            self._rows = {st.name: row(st, now) for st in stages}
            for st in stages:
                self.add_row(*self._rows[st.name], key=st.name)
            self._names = names
            if keep in names:
                self.move_cursor(row=names.index(keep), animate=False)
            elif names:
                self.post_message(self.Selected(self.selected))
        else:
            # Only changed cells: an idle console must not repaint the table every second.
            for index, st in enumerate(stages):
                new, old = row(st, now), self._rows.get(st.name, ())
                changed = False
                for i, (col, value) in enumerate(zip(COLUMNS, new)):
                    if i >= len(old) or old[i] != value:
                        # Re-measuring the column repaints the whole table: only when the text got longer.
                        longer = i >= len(old) or len(str(value)) > len(str(old[i]))
                        self._cells_only = not longer
                        try:
                            self.update_cell(st.name, col, value, update_width=longer)
                        finally:
                            self._cells_only = False
                        changed = True
                if changed:
                    self.row_repaints += 1
                    self.refresh_row(index)
                self._rows[st.name] = new
        failed = sum(1 for s in stages if s.status in ("failed", "lost"))
        running = sum(1 for s in stages if s.status == "running")
        retitle(self, subtitle=f"{running} running" + (f", {failed} failed/lost" if failed else ""))

    def select(self, stage: str) -> None:
        if stage in self._names:
            self.move_cursor(row=self._names.index(stage), animate=False)

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key is not None and event.row_key.value is not None:
            self.post_message(self.Selected(event.row_key.value))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key is not None and event.row_key.value is not None:
            self.post_message(self.Selected(event.row_key.value))
