"""The console at 80x24 (an SSH terminal): every stage row of an 8-stage
pipeline visible without scrolling, next to 8 GPUs; the header's clock never
cut; no scrollbar in the log; bench's result whole in its pane. Read from the
screen the app exports (its SVG screenshot turned back into text rows)."""

from __future__ import annotations

import html
import re

import pytest

from tests.conftest import stage_cmd
from tests.test_tui_bench import BENCH, bench_workspace
from tests.test_tui_helpers import busy_gpus, frozen, make_app, run, wait_until
from eagle3_console.tui.panes.log import LogPane
from eagle3_console.tui.panes.stages import StageTable

STAGES = ("prepare", "vocab", "extract", "verify", "train", "export", "bench", "serve")


def screen_rows(svg: str) -> list[str]:
    """The text of each screen row of a Textual SVG screenshot."""
    rows: dict[int, list[tuple[int, str]]] = {}
    for m in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="[\d.]+" textLength="[\d.]+" '
                         r'clip-path="url\(#[^)]*-line-(\d+)\)">(.*?)</text>', svg):
        rows.setdefault(int(m.group(2)), []).append((round(float(m.group(1)) / 12.2), html.unescape(m.group(3))))
    out = []
    for line in range(max(rows) + 1 if rows else 0):
        buf = [" "] * 400
        for col, txt in rows.get(line, []):
            buf[col:col + len(txt)] = txt
        out.append("".join(buf).replace("\u00a0", " ").rstrip())
    return out


def eight_stages(root) -> None:
    body = "".join(f'\n[stages.{name}]\nargv = {stage_cmd("progress.py", "--n", "2")}\n' for name in STAGES)
    (root / "eagle3.toml").write_text(body)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_every_stage_row_shows_without_scrolling(tmp_path, size):
    eight_stages(tmp_path)

    async def main():
        app = make_app(tmp_path, gpus=busy_gpus(8), refresh_s=3600, frozen=frozen())
        async with app.run_test(size=size) as pilot:
            await wait_until(pilot, lambda: app.main_screen.passes >= 1)
            await pilot.pause(0.3)
            table = app.query_one(StageTable)
            assert table.row_count == len(STAGES) and table.max_scroll_y == 0
            rows = screen_rows(app.export_screenshot())
            assert 0 < len(rows) <= size[1]      # (an empty last row has no text element)
            first = [r.replace("│", " ").split()[:1] for r in rows]
            shown = [w[0] for w in first if w and w[0] in STAGES]
            assert shown == list(STAGES), "\n".join(rows)
            # The clock (frozen at 03:25) is whole at the end of the header, the host before it.
            assert rows[0].endswith("gpu-node-01  03:25") or rows[0].endswith("gpu-node-01  2026-01-01 03:25"), rows[0]
            log = app.query_one(LogPane)
            assert log.region.height >= 3
            if size == (80, 24):
                assert not log.view.show_vertical_scrollbar or log.view.styles.scrollbar_size_vertical == 0
    run(main())


def test_bench_result_is_whole_at_80x24(tmp_path):
    """With the demo's seven stages in the table: it was clipped after accept @2."""
    bench_workspace(tmp_path, BENCH)
    with open(tmp_path / "eagle3.toml", "a") as fh:
        for name in ("vocab", "extract", "verify", "train", "export"):
            fh.write(f'\n[stages.{name}]\nargv = {stage_cmd("progress.py", "--n", "2")}\n')

    async def main():
        app = make_app(tmp_path, refresh_s=3600)
        async with app.run_test(size=(80, 24)) as pilot:
            await wait_until(pilot, lambda: app.main_screen.passes >= 1 and app.main_screen.selected == "bench")
            await pilot.pause(0.3)
            text = "\n".join(screen_rows(app.export_screenshot()))
            for part in ("acceptance length 2.71", "speed-up 1.10x", "output == greedy",
                         "accept @1", "accept @2", "accept @3", "AL 2.71"):
                assert part in text, text
    run(main())
