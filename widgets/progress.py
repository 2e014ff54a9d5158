"""Progress pane of the selected stage: per-shard bars, samples and tokens
done, rate, ETA, and weight loading while a model loads.

Renders one StageStatus: its ShardProgress when the stage writes shards, else
the progress its log printed (LogState)."""

from __future__ import annotations

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.widgets import Static

from eagle3_console.model import ShardProgress, StageStatus
from widgets import fmt


def bar(fraction: float | None, style: str = "green") -> ProgressBar:
    return ProgressBar(total=1.0, completed=fraction or 0.0, width=None, complete_style=style,
                       finished_style="bold green")


def summary(st: StageStatus, now: float) -> Text:
    t = Text()
    sp, log = st.shards, st.log
    if sp is not None and (sp.samples_done or sp.samples_expected):
        t.append("samples ", "dim")
        t.append(f"{fmt.count(sp.samples_done)}/{fmt.count(sp.samples_expected)}", "bold")
        if sp.tokens_done is not None:
            t.append("  tokens ", "dim")
            t.append(fmt.count(sp.tokens_done))
            if sp.tokens_expected:
                t.append(f"/{fmt.count(sp.tokens_expected)}")
        if sp.tmp_files:
            t.append(f"  {sp.tmp_files} .tmp", "yellow")
        if sp.bad_files:
            t.append(f"  {sp.bad_files} unreadable", "bold red")
        if sp.error:
            t.append(f"\n{sp.error}", "red")
    elif log is not None and log.progress_done is not None:
        t.append("done ", "dim")
        t.append(f"{fmt.count(log.progress_done)}/{fmt.count(log.progress_total)}", "bold")
        if log.errors is not None:
            t.append("  errors ", "dim")
            t.append(str(log.errors), "bold red" if log.errors else "green")
    else:
        t.append("no progress reported yet", "dim")
    t.append("\n")
    if st.status == "running":
        # A finished run's last rate says nothing about now: shown while running only.
        rate = st.rate
        unit = "/s"
        if rate is None and log is not None and log.rate is not None:
            rate, unit = log.rate, f" {log.rate_unit or 'it'}/s"
        t.append("rate ", "dim")
        t.append(fmt.rate(rate, unit))
        if st.tokens_per_s is not None:
            t.append(f"  {fmt.rate(st.tokens_per_s, ' tok/s')}")
        t.append("  ETA ", "dim")
        t.append(fmt.duration(st.eta_s))
    else:
        t.append(st.status, "dim")
    if st.started is not None:
        t.append("  elapsed ", "dim")
        t.append(fmt.duration((st.ended or now) - st.started))
    return t


def bars_table(st: StageStatus) -> Table | None:
    """Loading, overall and per-shard bars in one grid, so labels and bars align."""
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column("what", no_wrap=True)
    table.add_column("bar", ratio=1, min_width=6)
    table.add_column("n", justify="right", no_wrap=True)
    log, sp = st.log, st.shards
    if log is not None and log.load_pct is not None and st.status == "running" and not st.progress:
        table.add_row(Text("loading weights", "bold cyan"), bar(log.load_pct / 100, "cyan"), f"{log.load_pct:.0f}%")
    if st.progress is not None:
        table.add_row(Text("overall", "bold"), bar(st.progress), fmt.pct(st.progress))
    if sp is not None:
        for sh in sp.shards:
            f = sh.done / sh.expected if sh.expected else None
            table.add_row(sh.name, bar(f) if f is not None else Text("?", "dim"),
                          f"{sh.done}/{sh.expected if sh.expected else '?'}")
    return table if table.row_count else None


class ProgressPane(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    ProgressPane { border: round $primary-darken-1; padding: 0 1; }
    ProgressPane > Static { width: 1fr; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Progress"
        self._body = Static("select a stage")

    def compose(self):
        yield self._body

    def show(self, st: StageStatus | None, now: float) -> None:
        if st is None:
            self.border_title = "Progress"
            self._body.update("select a stage")
            return
        self.border_title = f"Progress: {st.name}" + (f" (run {st.run_id})" if st.run_id else "")
        parts: list = [summary(st, now)]
        bars = bars_table(st)
        if bars is not None:
            if st.shards is not None and st.shards.shards:
                parts.append(Text(f"{len(st.shards.shards)} shards ({st.shards.layout})", "dim"))
            parts.append(bars)
        self._body.update(Group(*parts))
