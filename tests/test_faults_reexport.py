"""Re-export through the console (issue 28 item 1): the supervisor's own claim
file in the export folder never blocks the export it supervises. The real
CLI, supervisor and export op on the toy drafter."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from tests.conftest import WS  # noqa: E402


def test_run_export_twice_and_restart_it_through_the_console(tmp_path, assets, trained):  # noqa: F811
    """Before: every re-export failed after 15-27 s with "runs/export holds
    .eagle3-lock, which export did not write", exit 2."""
    ws = WS(tmp_path / "ws")
    ws.root.mkdir()
    cfg = json.loads((assets["target"] / "config.json").read_text())
    ws.write(f"""
[target]
path = "{assets['target']}"
num_layers = {cfg['num_hidden_layers']}
hidden_size = {cfg['hidden_size']}
vocab_size = {cfg['vocab_size']}

[stages.export]
op = "export"
params = {{ checkpoint = "{trained}", output = "runs/export" }}
""")
    out = ws.root / "runs" / "export"
    seen = []
    for args in (("run", "export"), ("run", "export"), ("restart", "export", "--yes")):
        ws.cli(*args, check=0)
        run = ws.wait_status("export", ("succeeded", "failed"), timeout=180)
        seen.append(run.status)
        log = run.log_path and open(run.log_path).read()
        assert run.status == "succeeded", (args, log)
        info = json.loads((out / "export_info.json").read_text())
        assert info and (out / "sglang" / "config.json").exists()
    assert seen == ["succeeded"] * 3
    assert not (out / ".eagle3-lock").exists()        # released at each run's end
