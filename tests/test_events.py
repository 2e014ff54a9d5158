"""`events`: the audit log (Registry.events) read back, newest first, by
stage and count, as a table or JSON; reading it creates no state database."""

from __future__ import annotations

import json


def test_events_lists_the_audit_log_newest_first(ws):
    ws.write('[stages.a]\nargv = ["true"]\n[stages.b]\nargv = ["true"]\n')
    run = ws.record_finished_run("a", {}, status="failed")
    with ws.registry() as reg:
        reg.record("stop", "killed", stage="a", run_id=run.id, targets=[1234], actor="op@pid1")
        reg.record("clean", "ok", stage="a", run_id=run.id, targets=["/x/part.bin"], detail="1 file", actor="op@pid2")
        reg.record("kill-workers", "ok", stage="b", targets=[5, 6], actor="op@pid3")
    data = json.loads(ws.call("events", "--json", check=0).stdout)
    assert [e["action"] for e in data] == ["kill-workers", "clean", "stop"]
    assert data[1] == {**data[1], "stage": "a", "run_id": run.id, "targets": ["/x/part.bin"], "outcome": "ok",
                       "detail": "1 file", "actor": "op@pid2"}
    only_a = json.loads(ws.call("events", "--stage", "a", "--limit", "1", "--json", check=0).stdout)
    assert [e["action"] for e in only_a] == ["clean"]
    table = ws.call("events", "-n", "2", check=0).stdout
    assert "kill-workers" in table and "clean" in table and "stop" not in table


def test_events_of_an_unknown_stage_is_bad_input_and_none_yet_is_empty(ws):
    ws.write('[stages.a]\nargv = ["true"]\n')
    assert json.loads(ws.call("events", "--json", check=0).stdout) == []
    assert not (ws.root / ".eagle3" / "state.db").exists()
    proc = ws.call("events", "--stage", "nope", check=3)
    assert "nope" in proc.stderr and "Traceback" not in proc.stderr
    assert ws.call("events", "--limit", "0", check=3).returncode == 3


def test_a_run_refused_for_its_dependency_or_a_live_run_is_in_the_audit_log(ws):
    """README: events lists runs "started or refused". Before, only the disk and
    lint refusals were recorded: `run b` refused on its dependency left no event."""
    ws.write('[stages.a]\nargv = ["sleep", "30"]\n[stages.b]\nargv = ["true"]\ndepends_on = ["a"]\n')
    proc = ws.call("run", "b", check=2)
    assert "depends on 'a'" in proc.stderr
    ws.cli("run", "a", check=0)
    ws.call("run", "a", check=2)
    ws.cli("stop", "a", "--grace", "1", check=0)
    data = json.loads(ws.call("events", "--json", check=0).stdout)
    refused = [(e["stage"], e["outcome"]) for e in data if e["action"] == "run" and e["outcome"].startswith("refused")]
    assert ("b", "refused: dependencies") in refused, data
    assert ("a", "refused: live run") in refused, data
    b = next(e for e in data if e["stage"] == "b")
    assert "depends on 'a'" in b["detail"]
