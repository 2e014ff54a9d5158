"""The small things a first trial of the console hit (issue 20, item 4): the CLI's
`run` on a finished stage warns as the TUI asks, `watch --once` always says
something, `status --json` answers in JSON when the pipeline file is broken, and a
killed bench does not show the earlier run's acceptance length as its own."""

from __future__ import annotations

import json
import time

from eagle3_console.kernel.model import StageStatus
from ops import get_spec
from tests.conftest import stage_cmd
from eagle3_console.tui.panes.stages import result_text


def chain() -> str:
    return f"""
[stages.a]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}

[stages.b]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}
depends_on = ["a"]

[stages.c]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}
depends_on = ["b"]
"""


def test_run_on_a_finished_stage_warns_which_stages_it_makes_stale(ws):
    ws.write(chain())
    proc = ws.cli("run", "a", check=0)
    assert "warning" not in proc.stderr               # nothing complete yet: nothing to warn of
    ws.wait_status("a", ("succeeded",))
    ws.cli("run", "b", check=0)
    ws.wait_status("b", ("succeeded",))
    proc = ws.cli("run", "a", check=0)
    assert ("warning: a's last run 1 succeeded: its outputs are complete and this run goes into them" in proc.stderr)
    assert "makes stale (their outputs were made from the current ones): b" in proc.stderr
    assert ws.latest("a").id == 3                      # a warning, as the TUI's dialog: the run starts
    ws.wait_status("a", ("succeeded",))
    proc = ws.cli("run", "b", check=0)
    assert "makes stale" not in proc.stderr and "none becomes stale" in proc.stderr


def test_watch_once_says_one_line_when_there_is_nothing_to_do(ws):
    ws.write(chain())
    proc = ws.cli("watch", "--once", "--no-gpus", check=0)
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    assert "nothing to do: health ok; a never, b never, c never" in lines[0]


def test_status_json_on_a_broken_pipeline_file_is_a_json_unknown(ws):
    ws.write("[stages.a\n")
    for args in (("status", "--json"), ("status", "--json", "--no-gpus")):
        proc = ws.call(*args, check=3)
        data = json.loads(proc.stdout)
        assert data["health"] == "unknown" and data["schema"] == 1
        assert "eagle3.toml: (syntax)" in data["error"]
        assert data["alerts"][0]["level"] == "unknown" and data["alerts"][0]["code"] == "config_error"
        assert data["stages"] == [] and data["workspace"] == str(ws.root)
        assert "eagle3.toml: (syntax)" in proc.stderr
    # typer's path (the workspace given twice: cli.status_json_args leaves it to typer) gives the same.
    from eagle3_console.cli import status_json_args
    assert status_json_args(["-w", str(ws.root), "status", "--json", "-w", str(ws.root)]) is None
    proc = ws.call("status", "--json", "-w", str(ws.root), check=3)
    assert json.loads(proc.stdout)["health"] == "unknown"


def test_status_json_on_an_unreadable_state_database_is_a_json_unknown(ws):
    ws.write(chain())
    (ws.root / ".eagle3").mkdir()
    (ws.root / ".eagle3" / "state.db").write_text("this is not sqlite " * 100)
    proc = ws.call("status", "--json", check=3)
    data = json.loads(proc.stdout)
    assert data["health"] == "unknown" and "state.db" in data["error"]


def test_a_killed_bench_does_not_show_the_earlier_runs_acceptance_length():
    now = time.time()
    earlier = {"acceptance_length": 2.51, "outputs_match": True}
    view = get_spec("bench").result_view(earlier)       # what the snapshot carries
    killed = StageStatus(name="bench", op="bench", status="killed", run_id=9, started=now - 30,
                         result=earlier, result_line="acceptance length 2.51", result_time=now - 3600, view=view)
    assert result_text(killed).plain == "-"
    done = StageStatus(name="bench", op="bench", status="succeeded", run_id=9, started=now - 30,
                       result=earlier, result_line="acceptance length 2.51", result_time=now - 1, view=view)
    assert result_text(done).plain == "AL 2.51"
