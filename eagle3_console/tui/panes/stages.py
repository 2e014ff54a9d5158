"""Stages pane: a table of stage, status, run id, started, elapsed, progress,
rate, ETA, exit code / signal and result (its op's view, on the snapshot: bench's acceptance length); failed,
killed, lost and OOM'd runs stand out.

Renders Snapshot.stages (StageStatus). The row under the cursor is the
selected stage: the Progress, Disk and Log panes follow it (the app listens to
StageTable.Selected, which says whether the operator moved the cursor or the
app did). Rows are updated in place so the cursor stays put."""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.message import Message
from textual.widgets import DataTable

from eagle3_console.kernel.model import RunStatus, ServeStatus, StageOnly, StageStatus, oom_finding
from eagle3_console.tui.panes import fmt
from eagle3_console.tui.panes.body import retitle

COLUMNS = ("stage", "status", "run", "started", "elapsed", "progress", "rate", "ETA", "exit", "result")
STATUS_STYLE = {RunStatus.RUNNING: "bold green", RunStatus.PENDING: "cyan", RunStatus.SUCCEEDED: "green",
                RunStatus.FAILED: "bold red", RunStatus.KILLED: "bold yellow", RunStatus.LOST: "bold magenta",
                StageOnly.NEVER: "dim", StageOnly.STALE: "yellow"}


SERVE_STYLE = {ServeStatus.LOADING: "cyan", ServeStatus.WARMING_UP: "cyan", ServeStatus.READY: "bold green",
               ServeStatus.UNHEALTHY: "bold red"}


def status_text(st: StageStatus) -> Text:
    label = st.status
    style = STATUS_STYLE.get(st.status, "")
    if st.serve is not None and st.status == RunStatus.RUNNING and st.serve.state in SERVE_STYLE:
        # A server runs for hours: whether it answers is its status.
        label, style = st.serve.state.replace("_", " "), SERVE_STYLE[st.serve.state]
    if st.job is not None and st.status == RunStatus.PENDING and st.job.reason:
        label = f"pending ({st.job.reason})"       # waiting in Slurm's queue, and why
    if oom_finding(st) and st.status != RunStatus.RUNNING:
        label, style = f"{st.status} OOM", "bold white on red"
    elif oom_finding(st):
        label, style = "running OOM?", "bold red"
    return Text(label, style)


def result_text(st: StageStatus) -> Text:
    """The stage's result in a cell, as its op's view of it says it (bench's
    acceptance length: completion tokens / verify steps, SGLang's), red when it
    alarms (speculative output differed from greedy), none when the stage's
    latest run did not produce it (an earlier run's)."""
    view = st.view
    if view is None or view.cell is None:
        return Text("-")
    if st.status != StageOnly.NEVER and not st.result_is_latest_runs():
        # An earlier run's figure next to a killed or failed run reads as its own (the Progress
        # pane says whose it is: "an earlier run's result (latest run N: killed)").
        return Text("-")
    text, role = view.cell
    if role == "alarm":
        return Text(text, "bold red")
    return Text(text, "bold green" if st.status == RunStatus.SUCCEEDED else "dim")


def elapsed(st: StageStatus, now: float) -> float | None:
    if st.started is None:
        return None
    return (st.ended or now) - st.started


def row(st: StageStatus, now: float) -> tuple:
    running = st.status == RunStatus.RUNNING
    # Samples (or items) a second; tokens/s is in the Progress pane, the
    # table keeps its width for the result column at 80 columns.
    rate_s = fmt.rate(st.rate if running else None)
    exit_s = fmt.exit_text(st.exit_code, st.signal)
    return (
        Text(st.name, "bold"),
        status_text(st),
        "-" if st.run_id is None else str(st.run_id),
        fmt.clock(st.started, now),
        # Minutes once past the first one: the table repaints once a minute, not every second.
        fmt.duration(elapsed(st, now), coarse=running),
        fmt.done_pct(st.progress),
        rate_s,
        fmt.duration(st.eta_s) if running else "-",
        Text(exit_s, "bold red" if exit_s not in ("-", "0") else ""),
        result_text(st),
    )


class StageTable(DataTable):
    DEFAULT_CSS = """
    StageTable { height: auto; max-height: 14; border: round $primary-darken-1; }
    StageTable:focus { border: round $accent; }
    """

    @dataclass
    class Selected(Message):
        stage: str
        by_user: bool = False       # the operator moved the cursor (else the app or a redraw did)

    def __init__(self, **kw) -> None:
        self._cells_only = False       # set before DataTable's __init__, which refreshes
        self.user_moved = False        # the operator has moved the cursor at least once
        super().__init__(cursor_type="row", zebra_stripes=False, **kw)
        self.border_title = "Stages"
        self._names: list[str] = []
        self._rows: dict[str, tuple] = {}
        self.row_repaints = 0
        self.columns_shown: tuple[str, ...] = ()
        self._last: tuple | None = None

    def refresh(self, *regions, repaint: bool = True, layout: bool = False, recompose: bool = False):
        # DataTable.update_cell repaints the whole table; while show() updates
        # cells it repaints only the rows it changed (refresh_row), so a ticking
        # ETA costs one row a second, not the table.
        if self._cells_only and not regions and not layout and not recompose:
            return self
        return super().refresh(*regions, repaint=repaint, layout=layout, recompose=recompose)

    def on_mount(self) -> None:
        self._set_columns(COLUMNS)

    def _set_columns(self, columns: tuple[str, ...]) -> None:
        self.clear(columns=True)
        self._names, self._rows = [], {}
        self.columns_shown = columns
        for c in columns:
            self.add_column(c, key=c)

    def fit_columns(self, rows: list[tuple], width: int) -> tuple[str, ...]:
        """The columns that fit `width`: `started`, then `run`, drop out on
        narrow terminals (the Progress and Log titles name the run)."""
        # A column is its widest cell plus a cell of padding each side; keep
        # room for the vertical scrollbar, and a margin before a dropped
        # column comes back, so that a ticking rate does not flip the layout.
        widths = {c: max([len(c)] + [len(str(r[i]).rstrip()) for r in rows]) + 2 for i, c in enumerate(COLUMNS)}
        for drop in ((), ("started",), ("started", "run")):
            cols = tuple(c for c in COLUMNS if c not in drop)
            margin = 2 + (4 if len(cols) > len(self.columns_shown) else 0)
            if sum(widths[c] for c in cols) + margin <= width or drop == ("started", "run"):
                return cols
        return COLUMNS  # unreachable

    def on_resize(self) -> None:
        if self._last is not None:
            self.show(*self._last)

    @property
    def selected(self) -> str | None:
        if not self._names:
            return None
        return self._names[min(self.cursor_row, len(self._names) - 1)]

    def show(self, stages: list[StageStatus], now: float) -> None:
        self._last = (stages, now)
        full = {st.name: row(st, now) for st in stages}
        keep = self.selected
        rebuilt = False
        if self.size.width:
            columns = self.fit_columns(list(full.values()), self.size.width)
            if columns != self.columns_shown:
                self._set_columns(columns)
                rebuilt = True
        index = [COLUMNS.index(c) for c in self.columns_shown]
        rows = {name: tuple(r[i] for i in index) for name, r in full.items()}
        names = [s.name for s in stages]
        if rebuilt or names != self._names:
            self.clear()
            self._rows = rows
            for st in stages:
                self.add_row(*self._rows[st.name], key=st.name)
            self._names = names
            if keep in names:
                self.move_cursor(row=names.index(keep), animate=False)
            elif names:
                self.post_message(self.Selected(self.selected, self.user_moved))
        else:
            # Only changed cells: an idle console must not repaint the table every second.
            for index, st in enumerate(stages):
                new, old = rows[st.name], self._rows.get(st.name, ())
                changed = False
                for i, (col, value) in enumerate(zip(self.columns_shown, new)):
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
        failed = sum(1 for s in stages if s.status in (RunStatus.FAILED, RunStatus.LOST))
        running = sum(1 for s in stages if s.status == RunStatus.RUNNING)
        retitle(self, subtitle=f"{running} running" + (f", {failed} failed/lost" if failed else ""))

    def select(self, stage: str) -> None:
        """Select `stage` as the operator would: the app stops following the active stage."""
        self.user_moved = True
        self.follow(stage)

    def follow(self, stage: str) -> None:
        """Move the cursor to `stage` on the app's behalf (the active stage)."""
        if stage in self._names:
            self.move_cursor(row=self._names.index(stage), animate=False)

    # The operator's moves (keys, mouse): from then on the selection is theirs.
    def _moved(self) -> None:
        self.user_moved = True

    def action_cursor_up(self) -> None:
        self._moved()
        super().action_cursor_up()

    def action_cursor_down(self) -> None:
        self._moved()
        super().action_cursor_down()

    def action_page_up(self) -> None:
        self._moved()
        super().action_page_up()

    def action_page_down(self) -> None:
        self._moved()
        super().action_page_down()

    def action_scroll_top(self) -> None:
        self._moved()
        super().action_scroll_top()

    def action_scroll_bottom(self) -> None:
        self._moved()
        super().action_scroll_bottom()

    def action_select_cursor(self) -> None:
        self._moved()
        super().action_select_cursor()

    def on_click(self) -> None:
        self._moved()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        event.stop()
        if event.row_key is not None and event.row_key.value is not None:
            self.post_message(self.Selected(event.row_key.value, self.user_moved))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        event.stop()
        if event.row_key is not None and event.row_key.value is not None:
            self.post_message(self.Selected(event.row_key.value, self.user_moved))
