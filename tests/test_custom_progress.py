"""A custom stage's progress: its own sample files (`sample_glob`), or, with
none matching, its log's counter; never a count and a percentage that
disagree. Real runs of tests/stages/bins.py through the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import stage_cmd, wait_for


def pipeline(glob: str | None) -> str:
    line = f'sample_glob = "{glob}"' if glob else ""
    return f"""
[stages.bins]
argv = {stage_cmd("bins.py", "--output", "out/bins", "--n", "40", "--pause-at", "21")}
outputs = ["out/bins"]
expected_samples = 40
{line}
"""


def stage(ws) -> dict:
    return json.loads(ws.call("status", "--json", "--no-gpus").stdout)["stages"][0]


@pytest.mark.parametrize("glob", ["sample_*.bin", None], ids=["its-pattern", "no-pattern-its-log"])
def test_a_custom_stage_counts_its_own_files_or_follows_its_log(ws, glob):
    ws.write(pipeline(glob))
    ws.cli("run", "bins", check=0)
    wait_for(lambda: (s := stage(ws))["log"] and s["log"]["progress_done"] == 21, timeout=30)
    st = stage(ws)
    assert st["progress"] == pytest.approx(21 / 40)
    if glob:
        assert (st["shards"]["samples_done"], st["shards"]["samples_expected"]) == (21, 40)
        assert st["shards"]["layout"] == "glob"
    else:
        # Nothing names its files: no count (it said 0/40 next to the log's 21/40).
        assert st["shards"] is None
    text = ws.call("status", "--no-gpus").stdout
    assert "52.5%" in text and ("(21/40)" in text) == bool(glob) and "(0/40)" not in text
    (ws.root / "out" / "bins" / "go").touch()
    ws.wait_status("bins", ("succeeded",))
    st = stage(ws)
    assert st["progress"] == 1.0
    assert (st["shards"] or {}).get("samples_done", 40) == 40      # 100.0% (0/40) was the other half of it
    assert "(0/40)" not in ws.call("status", "--no-gpus").stdout


def test_sample_glob_must_stay_under_the_output(ws):
    ws.write(pipeline("../elsewhere/*.bin"))
    proc = ws.call("status", "--json", "--no-gpus")
    assert proc.returncode == 3 and "stages.bins.sample_glob" in proc.stderr and "Traceback" not in proc.stderr
