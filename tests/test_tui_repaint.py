"""What keeps an idle console cheap (benchmarks/tui_idle.py measures the CPU):
the panes repaint only what changed. The widgets are mounted in a small host
app and fed model dataclasses, as the console feeds them from a Snapshot;
counters on the widgets and a recording refresh() show what was repainted."""

from __future__ import annotations

import asyncio

from textual.app import App, ComposeResult
from textual.widgets import Static

from eagle3_console.kernel.model import LogState, StageStatus
from eagle3_console.tui.panes.body import retitle
from eagle3_console.tui.panes.log import LogPane
from eagle3_console.tui.panes.stages import StageTable


class Host(App):
    def __init__(self, *widgets) -> None:
        super().__init__()
        self.widgets = widgets

    def compose(self) -> ComposeResult:
        yield from self.widgets


def tail(n: int, start: int = 0) -> list[str]:
    return [f"progress: samples {i}/20000 tokens {i * 512} errors 0" for i in range(start, start + n)]


def test_a_following_log_renders_only_the_lines_appended():
    async def main():
        pane = LogPane()
        async with Host(pane).run_test(size=(100, 30)) as pilot:
            pane.show("extract", 1, LogState(path="x.log", tail=tail(200)))
            await pilot.pause()
            first = pane.view.strips_rendered
            assert 0 < first <= 30             # the visible lines, not the 200 of the tail
            # The tail window moves by two lines: two new lines to render, the
            # others are the same text one screen row up.
            pane.show("extract", 1, LogState(path="x.log", tail=tail(200, start=2)))
            await pilot.pause()
            assert pane.view.strips_rendered - first == 2
            assert list(pane.view.lines) == tail(200, start=2)
            assert pane.view.scroll_y == pane.view.max_scroll_y       # still following the end
    asyncio.run(main())


def test_the_log_says_following_only_while_it_follows():
    """A finished run's log gets no new line: scrolling up must change the
    subtitle by itself (it said `following` after the operator scrolled up)."""
    async def main():
        pane = LogPane()
        async with Host(pane).run_test(size=(100, 30)) as pilot:
            pane.show("extract", 1, LogState(path="x.log", tail=tail(200)))
            await pilot.pause()
            assert pane.border_subtitle == "following"
            pane.view.focus()
            await pilot.press("pageup")
            await pilot.pause()
            assert not pane.view.following and pane.border_subtitle == "scrolled (end: follow)"
            pane.show("extract", 1, LogState(path="x.log", tail=tail(200)))     # the same tail again
            await pilot.pause()
            assert pane.border_subtitle == "scrolled (end: follow)"
            await pilot.press("end")
            await pilot.pause()
            assert pane.view.following and pane.border_subtitle == "following"
    asyncio.run(main())


def test_a_filter_keeping_only_the_last_lines_drops_the_others():
    async def main():
        pane = LogPane()
        async with Host(pane).run_test(size=(100, 30)) as pilot:
            lines = tail(5) + ["RuntimeError: CUDA out of memory"]
            pane.show("extract", 1, LogState(path="x.log", tail=lines))
            await pilot.pause()
            # The filtered lines are a suffix of the shown ones: still a redraw,
            # not an append that would leave the unmatched lines above.
            pane.filter_text = "memory"
            pane._refresh_lines()
            await pilot.pause()
            assert list(pane.view.lines) == ["RuntimeError: CUDA out of memory"]
            assert "1 error line ·" in str(pane.border_subtitle)
    asyncio.run(main())


class RecordingTable(StageTable):
    def __init__(self, **kw) -> None:
        self.full_refreshes = 0
        super().__init__(**kw)

    def refresh(self, *regions, **kw):
        if not regions and not getattr(self, "_cells_only", False):
            self.full_refreshes += 1
        return super().refresh(*regions, **kw)


T0 = 1_800_000_000.0


def stages() -> list[StageStatus]:
    return [StageStatus(name="prepare", op="prepare", status="succeeded", run_id=1, started=T0 - 900,
                        ended=T0 - 800, exit_code=0),
            StageStatus(name="extract", op="extract", status="running", run_id=2, started=T0,
                        progress=0.25, rate=1.5, eta_s=5000.0)]


def test_a_ticking_cell_repaints_its_row_not_the_table():
    async def main():
        table = RecordingTable()
        async with Host(table).run_test(size=(120, 20)) as pilot:
            table.show(stages(), T0 + 10)
            await pilot.pause()
            full, rows = table.full_refreshes, table.row_repaints
            table.show(stages(), T0 + 11)                     # the running stage's elapsed: 10s -> 11s
            await pilot.pause()
            assert table.row_repaints - rows == 1
            assert table.full_refreshes == full
            assert str(table.get_row("extract")[4]) == "11s"
            # Unchanged values: nothing at all.
            table.show(stages(), T0 + 11)
            assert table.row_repaints - rows == 1 and table.full_refreshes == full
    asyncio.run(main())


def test_retitle_repaints_only_when_the_title_changed():
    calls = []

    class Pane(Static):
        def refresh(self, *regions, **kw):
            calls.append(regions)
            return super().refresh(*regions, **kw)

    async def main():
        pane = Pane("body")
        async with Host(pane).run_test(size=(40, 5)) as pilot:
            await pilot.pause()
            calls.clear()
            retitle(pane, "Log: extract", "following")
            n = len(calls)
            assert n >= 1 and pane.border_title == "Log: extract"
            retitle(pane, "Log: extract", "following")
            assert len(calls) == n
            retitle(pane, subtitle="scrolled")
            assert len(calls) > n and pane.border_subtitle == "scrolled"
    asyncio.run(main())


def test_columns_give_way_on_a_narrow_table_and_come_back(tmp_path):
    # One stage: the rebuild after a column change must re-add its row (a
    # failed OOM run widens the status and exit cells past the width).
    async def main():
        table = RecordingTable()
        async with Host(table).run_test(size=(120, 12)) as pilot:
            running = [stages()[1]]
            table.show(running, T0 + 10)
            await pilot.pause()
            assert "started" in table.columns_shown and "run" in table.columns_shown
            await pilot.resize_terminal(72, 12)
            await pilot.pause()
            failed = [StageStatus(name="extract", op="extract", status="failed", run_id=2, started=T0, ended=T0 + 60,
                                  exit_code=1, progress=0.75)]
            from eagle3_console.kernel.model import LogFinding, LogState
            # Out of memory as the snapshot finds it (model.oom_finding: the log's finding).
            failed[0].log = LogState(path="extract.log", findings={"oom": LogFinding("oom", "CUDA out of memory")})
            table.show(failed, T0 + 70)
            await pilot.pause()
            assert "started" not in table.columns_shown and "result" in table.columns_shown
            row = dict(zip(table.columns_shown, table.get_row("extract")))
            assert str(row["status"]) == "failed OOM" and str(row["exit"]) == "1" and str(row["progress"]) == "75%"
            await pilot.resize_terminal(140, 12)
            await pilot.pause()
            assert "started" in table.columns_shown
            assert str(dict(zip(table.columns_shown, table.get_row("extract")))["status"]) == "failed OOM"
    asyncio.run(main())
