"""Progress pane of the selected stage: per-shard bars, samples and tokens
done, rate, ETA, and weight loading while a model loads; and the stage's
result as its op's view of it, which the snapshot carries (bench's: acceptance length,
acceptance per draft position, speed-up, whether the speculative output
equals greedy decoding).

Renders one StageStatus: its ShardProgress when the stage writes shards, else
the progress its log printed (LogState), and its result record's view."""

from __future__ import annotations

import re

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text
from textual.containers import VerticalScroll

from eagle3_console.kernel.model import RunStatus, ServeStatus, StageOnly, StageStatus
from eagle3_console.tui.panes import fmt
from eagle3_console.tui.panes.body import Body, retitle
from eagle3_console.tui.panes.curves import CurvesBody


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
        # The storage on a line of its own: the counts above stay whole in a narrow pane
        # (Rich wraps at any space, no-break ones included).
        if sp.format or sp.bytes_per_token:
            t.append("  format ", "dim")
            t.append(sp.format or "?")
            if sp.bytes_per_token:
                t.append(f"  {fmt.nbytes(sp.bytes_per_token)}/token")
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
    if st.status == RunStatus.RUNNING:
        # A finished run's last rate says nothing about now: shown while running only.
        rate, unit = st.rate, f" {st.rate_unit}" if st.rate_unit else "/s"
        if rate is None and log is not None and log.rate is not None:
            rate, unit = log.rate, f" {log.rate_unit or 'it/s'}"
        t.append("rate ", "dim")
        t.append(fmt.rate(rate, unit))
        if st.tokens_per_s is not None:
            t.append(f"  {fmt.rate(st.tokens_per_s, ' tok/s')}")
        t.append("  ETA ", "dim")
        t.append(fmt.duration(st.eta_s))
    else:
        cause = failure_cause(st)
        if cause is None:
            t.append("not run yet" if st.status == StageOnly.NEVER else st.status, "dim")
        else:
            message, line = cause
            t.append(message, "bold red")
            if line:
                t.append(f"\n{line}", "red")
    return t


def failure_cause(st: StageStatus) -> tuple[str, str | None] | None:
    """A failed or lost run's alert and the line `status` prints under it (the rank's
    or the op's own error), so the cause is on screen where the stage is."""
    for a in st.alerts:
        if a.code in ("stage_failed", "lost") and a.level == "critical":
            return a.message, (a.line.strip()[:160] if a.line else None)
    return None


def serve_text(st: StageStatus) -> Text | None:
    """A serve stage's server: its state and why, time to ready, the live figures."""
    sv = st.serve
    if sv is None:
        return None
    t = Text()
    t.append("server ", "dim")
    t.append(sv.state.replace("_", " "), {ServeStatus.READY: "bold green", ServeStatus.UNHEALTHY: "bold red"}.get(sv.state, "cyan"))
    t.append(f" {sv.url}", "dim")
    if sv.time_to_ready_s is not None:
        t.append("  ready after ", "dim")
        t.append(fmt.duration(sv.time_to_ready_s))
    if sv.reason and sv.state != ServeStatus.READY:
        t.append(f"\n{sv.reason}", "red" if sv.state == ServeStatus.UNHEALTHY else "dim")
    if sv.state == ServeStatus.READY:
        parts = sv.figures()
        if parts:
            t.append("\n" + "  ".join(parts))
        if sv.metrics is False:
            t.append("\n/metrics off (figures from /server_info)", "dim")
    return t


# The colours of a ResultView's roles (ops/spec.py; the snapshot carries the view: StageStatus.view).
ROLE_STYLE = {"label": "dim", "strong": "bold", "headline": "bold green", "ok": "green",
              "alarm": "bold white on red", "warn": "yellow"}


def result_text(st: StageStatus) -> Text | None:
    """The record's head (bench's: what matters first, so that a 5-line pane
    shows it with the per-position bars), after whose record it is."""
    view = st.view
    if view is None:
        return None
    t = Text()
    whose = st.result_whose()
    if whose:
        t.append(whose.rstrip(": ") + "\n", "yellow")
    for text, role in view.head:
        t.append(text, ROLE_STYLE.get(role))
    return t


def result_details(st: StageStatus) -> Text | None:
    """The rest of the record, under the bars (bench's: throughputs, forwards, drafter)."""
    view = st.view
    return Text("\n".join(view.details), "dim") if view is not None and view.details else None


def bar_rows(st: StageStatus) -> list[tuple[str, str, float | None, str]]:
    """(label, style, fraction, count) of the loading, overall and per-shard bars."""
    rows = []
    log, sp = st.log, st.shards
    if log is not None and log.load_pct is not None and st.status == RunStatus.RUNNING and not st.progress:
        rows.append(("loading weights", "bold cyan", log.load_pct / 100, f"{log.load_pct:.0f}%"))
    view = st.view
    # Done and its record says more than "100%": no bar for it.
    if st.progress is not None and not ((view is not None or st.result_line) and st.status == RunStatus.SUCCEEDED):
        rows.append(("overall", "bold", st.progress, fmt.done_pct(st.progress)))
    if sp is not None:
        # One shard's bar is the overall bar again: shown from two shards on.
        rows += shard_rows(sp.shards) if len(sp.shards) > 1 or st.progress is None else []
    for label, f in view.bars if view is not None else ():
        rows.append((label, "", f, "-" if f is None else fmt.pct(f)))
    return rows


# Up to this many shards get a bar each; beyond, runs of complete and of
# not-started shards fold into one line, so the shards being written stay in
# view in a short pane (a real extraction has ten or more).
SHARD_BARS = 4
_ROWS = re.compile(r"rows_(\d+)-(\d+)")


def shard_rows(shards) -> list[tuple[str, str, float | None, str]]:
    def row(sh):
        return (sh.name, "", sh.done / sh.expected if sh.expected else None,
                f"{sh.done}/{sh.expected if sh.expected else '?'}")
    if len(shards) <= SHARD_BARS:
        return [row(sh) for sh in shards]

    def kind(sh) -> str:
        if sh.expected and sh.done >= sh.expected:
            return "complete"
        return "not started" if sh.done == 0 else "writing"
    out: list[tuple[str, str, float | None, str]] = []
    i = 0
    while i < len(shards):
        k = kind(shards[i])
        j = i
        while j < len(shards) and kind(shards[j]) == k and k != "writing":
            j += 1
        if j - i >= 2:
            first, last = _ROWS.fullmatch(shards[i].name), _ROWS.fullmatch(shards[j - 1].name)
            label = f"rows_{first[1]}-{last[2]}" if first and last else f"{shards[i].name}.."
            out.append((label, "dim", 1.0 if k == "complete" else 0.0,
                        f"{j - i} complete" if k == "complete" else f"{j - i} pending"))
            i = j
        else:
            out.append(row(shards[i]))
            i += 1
    return out


def bars_table(rows: list[tuple[str, str, float | None, str]]) -> Table:
    """All bars in one grid, so that labels and bars align."""
    table = Table.grid(padding=(0, 1), expand=True)
    table.add_column("what", no_wrap=True)
    table.add_column("bar", ratio=1, min_width=6)
    table.add_column("n", justify="right", no_wrap=True)
    for label, style, f, n in rows:
        colour = "cyan" if label == "loading weights" else "green"
        table.add_row(Text(label, style), bar(f, colour) if f is not None else Text("?", "dim"), n)
    return table


class ProgressPane(VerticalScroll, can_focus=False):
    # No scrollbar: can_focus=False, so it could not be scrolled by key, and its thumb in the
    # last columns read as stray marks; the content is fitted to the pane instead (curves' rows).
    DEFAULT_CSS = """
    ProgressPane { border: round $primary-darken-1; padding: 0 1; scrollbar-size-vertical: 0; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.border_title = "Progress"
        # Two bodies: the counts change every second while running, the bars
        # far less often, and a repaint costs what the body holds.
        self._body = Body("select a stage")
        self._bars = Body("")
        self._curves = CurvesBody("")
        self._last: tuple | None = None

    def compose(self):
        # The curves first: a short pane (80x24) shows them before it scrolls.
        yield self._curves
        yield self._body
        yield self._bars

    def on_resize(self) -> None:
        # The curves' rows follow the pane's height.
        if self._last is not None:
            self.show(*self._last)

    def _room(self, parts: list) -> int | None:
        """The rows left once `parts` (Texts, wrapped at the pane's width) are shown; None before layout."""
        height, width = self.size.height, self.size.width     # the content area: inside border and padding
        if height <= 0 or width <= 0:
            return None
        return height - sum(len(p.wrap(self.app.console, width)) for p in parts if p is not None and p.plain)

    def show(self, st: StageStatus | None, now: float) -> None:
        self._last = (st, now)
        title = "Progress" if st is None else (
            f"Progress: {st.name}" + (f" (run {st.run_id})" if st.run_id else ""))
        retitle(self, title)
        if st is None:
            self._curves.show(st)
            self._body.paint(None, "select a stage")
            self._bars.paint(None, "")
            return
        result = result_text(st)
        served = serve_text(st)
        if served is not None:
            text = served
        elif result is None and st.result_said():
            # The op's own record (prepare's drops and truncation, vocab's coverage, ...).
            counts = summary(st, now)
            if st.status == RunStatus.SUCCEEDED:
                # Its "succeeded" line (and a "no progress reported" from an op that prints
                # no counter, or train's "done 72/72") say less than the result line.
                first = counts.split("\n")[0]
                counts = Text() if first.plain.startswith(("no progress", "done ")) else first
            elif st.status == StageOnly.NEVER and counts.plain.startswith("no progress"):
                counts = Text()     # "not run yet": the result line says so ("no run recorded here")
            line = Text(st.result_said(), "green" if st.status == RunStatus.SUCCEEDED else "yellow")
            text = Text.assemble(counts, "\n", line) if counts.plain else line
        elif result is None:
            text = summary(st, now)
        elif st.status == RunStatus.SUCCEEDED:
            text = result         # its "done N/N, succeeded" says nothing more
        else:
            text = Text.assemble(summary(st, now), "\n", result)
        if st.job is not None:      # a slurm run: where its job is (queued, on which nodes, how it ended)
            text = Text.assemble(Text(st.job.line(), "cyan"), "\n", text)
        self._body.paint(text, text)
        rows = bar_rows(st)
        label = None
        if st.shards is not None and len(st.shards.shards) > 1:
            label = f"{len(st.shards.shards)} shards ({st.shards.layout})"
        details = result_details(st)
        bar_lines = Text("\n".join(["-"] * (len(rows) + bool(label))))
        self._curves.show(st, self._room([text, bar_lines, details]))
        # Fractions rounded to what a bar can show: a sample more is not a repaint.
        key = (label, [(r[0], r[1], None if r[2] is None else round(r[2], 3), r[3]) for r in rows], details)

        def build() -> Group:
            parts: list = []
            if label:
                parts.append(Text(label, "dim"))
            if rows:
                parts.append(bars_table(rows))
            if details is not None:
                parts.append(details)
            return Group(*parts)
        self._bars.paint(key, build)
