"""A succeeded stage whose run started before a dependency's latest success is
`stale`: in `status`, `status --json` (with its result line) and for `watch
--advance`, which runs it again. Real runs through the CLI and the supervisor."""

from __future__ import annotations

import json

from tests.conftest import stage_cmd


def chain() -> str:
    return f"""
[stages.up]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}

[stages.mid]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}
depends_on = ["up"]

[stages.down]
argv = {stage_cmd("progress.py", "--n", "2", "--sleep", "0.01")}
depends_on = ["mid"]
"""


def run_to_success(ws, stage: str) -> int:
    ws.cli("run", stage, check=0)
    return ws.wait_status(stage, ("succeeded",)).id


def stages(ws) -> dict:
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    return {s["name"]: s for s in snap["stages"]}


def test_a_rerun_upstream_makes_its_dependents_stale_until_they_run_again(ws):
    ws.write(chain())
    for name in ("up", "mid", "down"):
        run_to_success(ws, name)
    assert {n: s["status"] for n, s in stages(ws).items()} == {"up": "succeeded", "mid": "succeeded",
                                                              "down": "succeeded"}
    again = run_to_success(ws, "up")
    st = stages(ws)
    assert st["up"]["status"] == "succeeded" and st["up"]["stale"] is None
    assert st["mid"]["status"] == "stale"
    assert st["mid"]["stale"] == f"up succeeded again (run {again}) after run 2 started"
    # Through mid: down's inputs came from mid's stale outputs.
    assert st["down"]["status"] == "stale" and st["down"]["stale"] == "mid is stale"
    text = ws.call("status", "--no-gpus").stdout
    assert "stale" in text

    # watch --advance treats stale as not done: it runs mid, then down, and settles.
    proc = ws.cli("watch", "--advance", "--until-done", "--interval", "0.2", "--no-gpus", timeout=90)
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert "mid: dependencies succeeded; started run" in proc.stdout
    assert "down: dependencies succeeded; started run" in proc.stdout
    st = stages(ws)
    assert {n: s["status"] for n, s in st.items()} == {"up": "succeeded", "mid": "succeeded", "down": "succeeded"}
    assert st["mid"]["run_id"] > again and st["down"]["run_id"] > st["mid"]["run_id"]


def test_a_failed_rerun_upstream_does_not_make_dependents_stale(ws):
    """Staleness follows a dependency's latest *success*: a rerun that failed
    changed nothing the dependents were made from (its failure is its own alert)."""
    from types import SimpleNamespace

    from eagle3_console.kernel.model import StageStatus
    from eagle3_console.observe.snapshot import mark_stale

    def run(stage, rid, ended):       # the two fields of a registry Run that staleness reads
        return SimpleNamespace(id=rid, stage=stage, status="succeeded", ended=ended)
    up = StageStatus("up", None, "failed", run_id=3, started=50.0)
    mid = StageStatus("mid", None, "succeeded", run_id=2, started=20.0, depends_on=["up"], result_time=25.0)
    mark_stale([up, mid], {"up": run("up", 1, 10.0)})
    assert mid.status == "succeeded" and mid.stale is None
    mark_stale([up, mid], {"up": run("up", 4, 30.0)})
    assert mid.status == "stale" and "run 4" in mid.stale
    assert mid.result_whose().startswith("stale (up succeeded again (run 4)")
