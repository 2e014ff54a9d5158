"""GPU pane: one row per GPU with a memory bar, util, temperature, power, the
runs whose processes sit on it and a short memory history; or why NVML is
unavailable.

Renders Snapshot.gpus (a GpuReport). The memory history is kept here, from the
reports this pane was shown (one point per refresh): it is display state, not
sampled data. Columns drop from the right-hand side on narrow terminals so
that 8 or 16 GPUs still read one per line at 80 columns."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll
from textual.renderables.sparkline import Sparkline

from eagle3_console.kernel.model import GpuInfo, GpuReport, HostGpus
from eagle3_console.tui.panes import fmt
from eagle3_console.tui.panes.body import Body, retitle

HISTORY = 60


def mem_fraction(g: GpuInfo) -> float | None:
    if g.mem_used is None or not g.mem_total:
        return None
    return g.mem_used / g.mem_total


def spark(points: list[float], width: int) -> str:
    """Memory history on an absolute 0..100 % scale (a flat line at 91 % must
    not look like an empty GPU, as a min..max-scaled sparkline would)."""
    bars = Sparkline.BARS
    pts = points[-width:]
    return "".join(bars[min(len(bars) - 1, int(p * len(bars)))] for p in pts).rjust(width)


def owners(g: GpuInfo) -> Text:
    """Who holds memory on this GPU: `stage#run`, or the bare pid when no run owns it."""
    t = Text(no_wrap=True, overflow="ellipsis")
    seen: dict[str, int] = {}
    for p in g.processes:
        key = f"{p.stage}#{p.run_id}" if p.run_id is not None else f"pid {p.pid}?"
        seen[key] = seen.get(key, 0) + (p.used_bytes or 0)
    for i, (key, used) in enumerate(seen.items()):
        if i:
            t.append(" ")
        t.append(key, "bold" if "#" in key else "bold yellow")
        if used:
            t.append(f" {fmt.nbytes(used)}", "dim")
    return t


def bar_style(f: float | None) -> str:
    if f is None:
        return "dim"
    return "red" if f >= 0.95 else ("yellow" if f >= 0.8 else "green")


def memory_bar(f: float | None) -> ProgressBar:
    return ProgressBar(total=1.0, completed=f or 0.0, width=None, complete_style=bar_style(f),
                       finished_style=bar_style(f))


class GpuPane(VerticalScroll, can_focus=False):
    DEFAULT_CSS = """
    GpuPane { height: auto; max-height: 20; border: round $primary-darken-1; padding: 0 1; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "GPUs"
        self._body = Body("sampling...")
        self._hosts = Body("")
        self._history: dict[str, deque[float]] = {}
        self._report: GpuReport | None = None

    def compose(self):
        yield self._body
        yield self._hosts

    def show(self, report: GpuReport, hosts: Sequence[HostGpus] = ()) -> None:
        # Other nodes' GPUs (the pipeline file's hosts), one line each and a line a GPU.
        said = [line for h in hosts for line in h.lines()]
        self._hosts.paint(tuple(said), Text("\n".join(said), "dim" if not said else ""))
        self._hosts.display = bool(said)
        self._report = report
        if report.available:
            live = set()
            for g in report.gpus:
                key = g.uuid or str(g.index)
                live.add(key)
                f = mem_fraction(g)
                if f is not None:
                    self._history.setdefault(key, deque(maxlen=HISTORY)).append(f)
            for key in set(self._history) - live:
                del self._history[key]
        self._render_body()

    def on_resize(self) -> None:
        if self._report is not None:
            self._render_body()

    def _title(self, title: str, subtitle: str | None = None) -> None:
        retitle(self, title, subtitle)

    def _render_body(self) -> None:
        report = self._report
        if not report.available:
            self._title("GPUs")
            self._body.paint(("unavailable", report.reason),
                             Text.assemble(("NVML unavailable: ", "bold yellow"), report.reason or "unknown reason"))
            return
        used = sum(g.mem_used or 0 for g in report.gpus)
        total = sum(g.mem_total or 0 for g in report.gpus)
        self._title(f"GPUs ({len(report.gpus)}, {fmt.gib(used)}/{fmt.gib(total)} GiB)",
                    f"driver {report.driver}" if report.driver else None)
        if not report.gpus:
            self._body.paint("none", "NVML sees no GPU")
            return
        width = max(self.size.width - 4, 40)
        short = self.app.size.height < 32
        history = tuple(tuple(h) for h in self._history.values())
        key = (report.gpus, width, short, history)
        if short:
            # Short terminal: several GPUs a line, so that 8 show in 2 lines at 80
            # columns (the stage table needs the rows); owners get the room left.
            per_line = max(1, min(4, width // 19))
            self._body.paint(key, lambda: self._compact(report.gpus, per_line))
            return
        if len(report.gpus) > 8 and width >= 150:
            # 16 GPUs on a wide terminal: two tables side by side, 8 rows each.
            n = (len(report.gpus) + 1) // 2

            def two() -> Table:
                grid = Table.grid(padding=(0, 2), expand=True)
                grid.add_column(ratio=1)
                grid.add_column(ratio=1)
                grid.add_row(self._table(report.gpus[:n], False), self._table(report.gpus[n:], False))
                return grid
            self._body.paint(key, two)
            return
        self._body.paint(key, lambda: self._table(report.gpus, width >= 110))

    def _table(self, gpus: list[GpuInfo], wide: bool) -> Table:
        table = Table(box=None, show_header=True, header_style="bold", pad_edge=False, padding=(0, 1),
                      expand=True)
        table.add_column("#", justify="right", width=2, no_wrap=True)
        if wide:
            table.add_column("name", no_wrap=True, overflow="ellipsis", max_width=22)
        table.add_column("memory", ratio=1, min_width=8, no_wrap=True)
        table.add_column("used/total", justify="right", no_wrap=True)
        table.add_column("util", justify="right", no_wrap=True)
        table.add_column("temp", justify="right", no_wrap=True)
        table.add_column("power", justify="right", no_wrap=True)
        table.add_column("runs", ratio=1, no_wrap=True, overflow="ellipsis")
        if wide:
            table.add_column("mem history", no_wrap=True, width=20)
        for g in gpus:
            table.add_row(*self._row(g, wide))
        return table

    def _compact(self, gpus: list[GpuInfo], per_line: int) -> Table:
        grid = Table.grid(padding=(0, 2), expand=True)
        for _ in range(per_line):
            grid.add_column(ratio=1)
        cells = []
        for g in gpus:
            cell = Table.grid(padding=(0, 1), expand=True)
            cell.add_column(width=2, justify="right", no_wrap=True)
            cell.add_column(ratio=1, min_width=4, no_wrap=True)
            cell.add_column(no_wrap=True)
            f = mem_fraction(g)
            if g.lost or (g.error and g.mem_total is None):
                cell.add_row(str(g.index), Text("LOST" if g.lost else "error", "bold white on red"),
                             Text((g.error or "")[:24], "yellow"))
            else:
                stats = Text(f"{fmt.pct(f):>4} ")
                stats.append("u" + ("-" if g.util_pct is None else f"{g.util_pct}%"), "dim")
                who = owners(g)
                if who.plain:
                    stats.append(" ")
                    stats.append_text(who)
                cell.add_row(str(g.index), memory_bar(f), stats)
            cells.append(cell)
        while len(cells) % per_line:
            cells.append("")
        for i in range(0, len(cells), per_line):
            grid.add_row(*cells[i:i + per_line])
        return grid

    def _row(self, g: GpuInfo, wide: bool) -> list:
        name = g.name.removeprefix("NVIDIA ")
        if g.lost or g.error and g.mem_total is None:
            problem = Text(f"{'LOST: ' if g.lost else ''}{g.error or 'fell off the bus'}",
                           "bold white on red" if g.lost else "yellow", no_wrap=True, overflow="ellipsis")
            cells = [str(g.index)] + ([name] if wide else []) + [problem, "", "", "", ""]
            cells += [owners(g)] + ([""] if wide else [])
            return cells
        f = mem_fraction(g)
        bar = memory_bar(f)
        used = f"{fmt.gib(g.mem_used)}/{fmt.gib(g.mem_total)}G {fmt.pct(f):>4}"
        util = "-" if g.util_pct is None else f"{g.util_pct}%"
        temp = "-" if g.temp_c is None else f"{g.temp_c}C"
        cells = [str(g.index)] + ([name] if wide else []) + [bar, used, util, temp]
        cells.append("-" if g.power_w is None else f"{g.power_w:.0f}W")
        cells.append(owners(g))
        if wide:
            hist = list(self._history.get(g.uuid or str(g.index), ()))
            cells.append(Text(spark(hist, 20), bar_style(f)))
        return cells
