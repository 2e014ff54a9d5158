"""A dependency on a serve stage means its server is ready (issue 20): a server
never succeeds, so a bench that depended on one could never start. Real
supervisor, real processes, the fake `launch_server` (tests/fake_launch_server.py)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import ROOT, stage_cmd, wait_for
from tests.test_serve_e2e import free_port


def pipeline(port: int, loaded: Path) -> str:
    """The server loads until the file `loaded` exists (the test says when, no fixed window)."""
    return f"""
[target]
path = "models/target"

[stages.serve]
op = "serve"
gpus = [0]
params = {{ port = {port}, launcher = "tests.fake_launch_server" }}
env = {{ PYTHONPATH = "{ROOT}", FAKE_SGLANG_LOAD_S = "0.5", FAKE_SGLANG_LOAD_UNTIL = "{loaded}", FAKE_SGLANG_WARMUP_S = "0.5" }}

[stages.client]
argv = {stage_cmd("progress.py", "--n", "3", "--sleep", "0.01")}
depends_on = ["serve"]
"""


def serve_state(ws) -> str | None:
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    sv = next(s for s in snap["stages"] if s["name"] == "serve")["serve"]
    return sv["state"] if sv else None


def test_a_stage_that_depends_on_a_server_starts_once_it_is_ready(ws):
    port = free_port()
    loaded = ws.root / "loaded"
    ws.write(pipeline(port, loaded))
    proc = ws.call("run", "client", check=2)
    assert "depends on serve stage 'serve', which never ran (start it: `run serve`)" in proc.stderr
    assert "a dependency on a serve stage means its server is ready" in proc.stderr
    ws.cli("run", "serve", check=0)
    try:
        proc = ws.call("run", "client", check=2)        # loading until told: the port is closed
        assert f"whose server (run 1, http://127.0.0.1:{port}) is loading: port {port} not open yet" in proc.stderr
        assert ws.latest("client") is None
        loaded.write_text("")
        wait_for(lambda: serve_state(ws) == "ready", timeout=30, poll=0.2)
        proc = ws.cli("watch", "--once", "--advance", "--no-gpus")
        assert "client: dependencies done (server ready: serve); started run 2" in proc.stdout, (proc.stdout, proc.stderr)
        assert ws.wait_status("client", ("succeeded",)).exit_code == 0
        # A ready server is done for its dependents, not a run to wait for: the driver ends.
        proc = ws.cli("watch", "--advance", "--until-done", "--interval", "0.2", "--no-gpus", timeout=30)
        assert "pipeline settled: serve running, client succeeded" in proc.stdout
    finally:
        ws.cli("stop", "serve", "--grace", "2")
    proc = ws.call("run", "client", check=2)
    assert "whose run 1 is killed, not serving" in proc.stderr
