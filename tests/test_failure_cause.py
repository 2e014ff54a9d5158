"""A failed stage's cause: the rank's own `error: ...` line, never torchrun's
report of it (its `====` banner, its failure table), in `status` and on the
TUI's screen where the stage is, at 160x48 and 80x24. The stage runs a real
torchrun (torch.distributed.run, CPU) whose rank 1 fails."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import WS, stage_cmd
from tests.test_tui_helpers import make_app, pane_text, run, select, wait_until
from eagle3_console.tui.panes.body import Body

CAUSE = "error: /data/shard_7.bin: checksum mismatch (rank 1)"
PLAIN = "shard 7 does not match its checksum"      # a rank's last word that is no `error:` line


@pytest.fixture(scope="module")
def failed_ws(tmp_path_factory):
    ws = WS(tmp_path_factory.mktemp("torchrun"))
    argv = json.loads(stage_cmd("failing_rank.py"))
    argv[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    ws.write(f"[stages.ranks]\nargv = {json.dumps(argv)}\n\n"
             f"[stages.plain]\nargv = {json.dumps(argv + [PLAIN])}\n")
    for stage in ("ranks", "plain"):
        ws.cli("run", stage, check=0)
    for stage in ("ranks", "plain"):
        run_ = ws.wait_status(stage, ("failed", "succeeded"), timeout=120)
        assert run_.status == "failed", run_
        log = open(run_.log_path).read()
        assert "ChildFailedError" in log and "=====" in log, log[-2000:]
    return ws


def test_the_alert_line_is_the_ranks_error_not_torchruns_banner(failed_ws):
    proc = failed_ws.cli("status", "--json", "--no-gpus", check=2)
    alert = next(a for a in json.loads(proc.stdout)["alerts"]
                 if a["code"] == "stage_failed" and a["stage"] == "ranks")
    assert alert["line"] == CAUSE, alert
    text = failed_ws.cli("status", "--no-gpus", check=2).stdout
    assert f"    {CAUSE}" in text, text


def test_without_an_error_line_the_ranks_last_word_is_the_cause(failed_ws):
    """Not torchrun's banner, its failure table or its `E1203 ... failed (exitcode: 3)` logger line."""
    proc = failed_ws.cli("status", "--json", "--no-gpus", check=2)
    alert = next(a for a in json.loads(proc.stdout)["alerts"]
                 if a["code"] == "stage_failed" and a["stage"] == "plain")
    assert alert["line"] == PLAIN, alert


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_the_tui_shows_the_cause_where_the_stage_is(failed_ws, tmp_path, size):
    root = tmp_path / "ws"
    shutil.copytree(failed_ws.root, root)

    async def main():
        app = make_app(root, refresh_s=0.3)
        async with app.run_test(size=size) as pilot:
            await select(pilot, app, "ranks")
            await wait_until(pilot, lambda: "ranks failed (exit code 1)" in pane_text(app, "progress"))
            await wait_until(pilot, lambda: not any(b.pending_fit for b in app.query(Body)))
            await pilot.pause(0.3)
            text = pane_text(app, "progress")
            assert CAUSE in " ".join(text.split()), text
            pane = app.query_one("#progress")
            # On screen, not below the pane's last row.
            before = text.split("checksum")[0].count("\n")
            assert before < pane.size.height, (text, pane.size)
    run(main())
