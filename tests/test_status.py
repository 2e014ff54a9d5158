"""status: the JSON contract, the exit codes, and what it must not import."""

from __future__ import annotations

import json
import subprocess
import textwrap

from tests.conftest import PY, extract_pipeline, stage_cmd, wait_for


def pipe(extra: str = "") -> str:
    return f"""
[stages.shards]
argv = {stage_cmd("shards.py", "--output", "out/hs", "--n", "{n}", "--rows", "10", "--crash-at", "{crash}")}
params = {{ n = 30, crash = -1 }}
outputs = ["out/hs"]
expected_samples = 30
batch_param = "n"

[stages.ok]
argv = {stage_cmd("progress.py", "--n", "4", "--sleep", "0.01")}
{extra}
"""


def status(ws, *args):
    proc = ws.call("status", "--json", *args)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else None, proc


def test_json_contract_on_a_fresh_workspace(ws):
    ws.write(pipe())
    code, data, _ = status(ws)
    assert code == 0
    for key in ("schema", "workspace", "stages", "disk", "alerts", "health"):
        assert key in data
    assert isinstance(data["schema"], int)
    assert "gpus_unavailable" in data or data["gpus"]
    names = [s["name"] for s in data["stages"]]
    assert names == ["shards", "ok"]
    for s in data["stages"]:
        for key in ("name", "status", "run_id", "pid", "progress", "rate", "eta_s", "exit_code", "alerts"):
            assert key in s
        assert s["status"] == "never"


def test_succeeded_shards_progress_and_disk(ws):
    ws.write(pipe())
    ws.cli("run", "shards", check=0)
    ws.wait_status("shards", ("succeeded",))
    code, data, _ = status(ws)
    assert code == 0, data["alerts"]
    st = data["stages"][0]
    assert st["status"] == "succeeded" and st["progress"] == 1.0
    assert st["shards"]["samples_done"] == 30 and len(st["shards"]["shards"]) == 3
    assert st["shards"]["tokens_done"] == 30 * 16
    disk = data["disk"][0]
    assert disk["written_bytes"] > 30 * 16 * 8 and disk["files"] == 31


def test_failed_stage_with_oom_is_critical(ws):
    ws.write(pipe())
    ws.cli("run", "shards", "--set", "crash=12", check=0)
    ws.wait_status("shards", ("failed",))
    code, data, proc = status(ws)
    assert code == 2
    codes = {a["code"] for a in data["alerts"]}
    assert {"stage_failed", "oom"} <= codes
    oom = next(a for a in data["alerts"] if a["code"] == "oom")
    assert "CUDA out of memory" in oom["line"]
    st = data["stages"][0]
    assert st["exit_code"] == 1 and st["shards"]["tmp_files"] == 1
    # The readable form says the same.
    plain = ws.call("status")
    assert plain.returncode == 2 and "OOM" in plain.stdout and "out of memory" in plain.stdout


def test_disk_projected_short_is_a_warning(ws):
    ws.write(pipe().replace("expected_samples = 30", "expected_samples = 30\nestimate_bytes = 1000000000000000000"))
    code, data, _ = status(ws)
    # Never ran: the estimate alone says it will not fit, before the run (issue 20).
    assert code == 1 and any(a["code"] == "disk_short" for a in data["alerts"])
    assert data["disk"][0]["estimate_kind"] == "declared" and data["disk"][0]["written_bytes"] == 0
    assert ws.cli("run", "shards").returncode == 2        # the preflight refuses
    assert ws.cli("run", "shards", "--force").returncode == 2     # --force is for the dependencies
    ws.cli("run", "shards", "--ignore-disk", "--set", "n=10", check=0)
    ws.wait_status("shards", ("succeeded",))
    # 10 of 30 expected done: projected 3x written fits; the estimate is what
    # a fresh run would need. Force a short projection: expected far above done.
    ws.write(pipe().replace("expected_samples = 30", "expected_samples = 1000000000000"))
    code, data, _ = status(ws)
    assert code == 1
    assert any(a["code"] == "disk_short" for a in data["alerts"])


def test_unreadable_state_is_unknown(ws):
    ws.write(pipe())
    (ws.root / ".eagle3").mkdir()
    (ws.root / ".eagle3" / "state.db").write_text("this is not sqlite " * 100)
    code, _data, proc = status(ws)
    assert code == 3 and "unreadable" in proc.stderr


def test_status_json_imports_neither_textual_nor_torch(ws):
    ws.write(pipe())
    probe = textwrap.dedent(f"""
        import sys
        sys.argv = ["eagle3-console", "-w", {str(ws.root)!r}, "status", "--json"]
        from eagle3_console import cli
        try:
            cli.app()
        except SystemExit:
            pass
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "torch", "transformers"))
        sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
    """)
    proc = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60)
    line = next(l for l in proc.stderr.splitlines() if l.startswith("HEAVY="))
    assert line == "HEAVY=", line
    json.loads(proc.stdout)


def test_bench_result_line_says_when_it_is_an_earlier_runs():
    from eagle3_console.kernel.model import StageStatus

    def result_line(st):
        return st.result_said()         # what `status` prints under its table

    result = {"acceptance_length": 2.71, "draft_tokens": 3, "accept_rate_per_position": [0.8, 0.6, 0.3],
              "speedup": 1.1, "outputs_match": True}
    from ops.bench.spec import SPEC
    line = SPEC.result_line(result)
    def bench(status, run_id, written_at):
        return StageStatus("bench", "bench", status, run_id=run_id, started=1000.0, result=result,
                           result_line=line, result_time=written_at)
    ok = result_line(bench("succeeded", 7, 1010.0))
    assert ok.startswith("acceptance length 2.71 (K=3; per position 0.80, 0.60, 0.30)")
    # Written before the latest run started: the earlier run's.
    rerun = result_line(bench("failed", 8, 900.0))
    assert rerun.startswith("an earlier run's result (latest run 8: failed): acceptance length 2.71")
    # Written by the latest run, which then failed (bench exits 1 when output != greedy) or still runs.
    assert result_line(bench("failed", 8, 1010.0)).startswith("run 8 failed: acceptance length")
    assert result_line(bench("running", 8, 1010.0)).startswith("so far: acceptance length")
    never = StageStatus("bench", "bench", "never", result=result, result_line=line)
    assert result_line(never).startswith("no run recorded here")


def test_workspace_option_after_the_command(ws, tmp_path):
    # Operators type `status -w DIR`; the option is the group's, so it is moved in front.
    from eagle3_console.cli import hoist_workspace

    assert hoist_workspace(["status", "--json", "-w", "/a"]) == ["-w", "/a", "status", "--json"]
    assert hoist_workspace(["run", "status", "--workspace=/a", "--set", "x=1"]) == \
        ["--workspace=/a", "run", "status", "--set", "x=1"]
    assert hoist_workspace(["-w", "/a", "status"]) == ["-w", "/a", "status"]
    assert hoist_workspace(["logs", "x", "--", "-w", "/a"]) == ["logs", "x", "--", "-w", "/a"]
    ws.write('[stages.noop]\nargv = ["true"]\n')
    proc = subprocess.run([PY, "-c", "import sys; from eagle3_console.cli import main; sys.argv[0] = 'eagle3-console'; main()",
                           "status", "--json", "--no-gpus", "-w", str(ws.root)],
                          capture_output=True, text=True, timeout=60, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["workspace"] == str(ws.root)


def test_rate_carries_its_unit_and_only_a_running_stage_shows_one(ws):
    ws.write(f"[stages.p]\nargv = {stage_cmd('progress.py', '--n', '400', '--sleep', '0.05')}\n")
    ws.cli("run", "p", check=0)

    def running_rate():
        snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
        st = snap["stages"][0]
        return st["status"] == "running" and st["rate"] and st
    st = wait_for(running_rate, timeout=30)
    assert st["rate_unit"] == "it/s" and st["rate"] > 0
    assert " it/s" in ws.call("status", "--no-gpus").stdout
    ws.cli("stop", "p", "--grace", "2", check=0)
    text = ws.call("status", "--no-gpus").stdout
    assert "it/s" not in text          # a stopped stage's last window is not a rate now
    st = json.loads(ws.call("status", "--json", "--no-gpus").stdout)["stages"][0]
    assert st["status"] == "killed" and st["rate"] is None and st["eta_s"] is None


def test_a_stages_params_are_what_its_run_gets_defaults_merged(ws):
    """Issue 21: the op spec's defaults merge in one place (OpSpec.effective),
    and the snapshot reads it. Before: status --json showed only the params the
    pipeline file set, so `watch` judged an OOM'd extract at its default
    token_budget as having nothing to halve."""
    from ops.extract.spec import SPEC
    ws.write(extract_pipeline(", writers = 2"))
    ws.record_finished_run("extract", {"input": "data/prepared", "output": "data/hs", "writers": 2})
    _code, data, proc = status(ws, "--no-gpus")
    (st,) = data["stages"]
    assert st["params"]["writers"] == 2, proc.stdout                       # the run's own
    assert st["params"]["token_budget"] == SPEC.params["token_budget"]      # the op's default
    assert st["params"]["engine"] == "hf"
