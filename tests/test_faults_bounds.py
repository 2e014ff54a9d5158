"""Fault injection, issue 28: numbers and strings where they enter (the
pipeline file, --set, the CLI's options) and a workspace that is no
workspace (items 10-13, 24, 30): refusals and parse errors, so the CLI runs in
this process (WS.call: cli.run as the console script runs it; its exit code and
both streams): no process is what these test. Each test failed on the main
branch it was written against."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import extract_pipeline, stage_cmd

SLEEPER = f"""
[stages.sleeper]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 30.0 }}
"""


def _one_clear_line(proc, *words: str) -> None:
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ------------------------------------------------------------------ 10. a NUL in a string value
@pytest.mark.parametrize("body, key", [
    ('argv = ["python", "-c", "print(1)\\u0000"]', "stages.w.argv"),
    ('argv = ["python", "-c", "{x}"]\nparams = { x = "a\\u0000b" }', "stages.w.params.x"),
    ('argv = ["python", "-c", "pass"]\nenv = { X = "\\u0000" }', "stages.w.env.X"),
    ('argv = ["python", "-c", "pass"]\ndescription = "a\\u0000"', "stages.w.description"),
])
def test_a_nul_in_a_pipeline_string_is_refused_at_load(ws, body, key):
    """Before: accepted; the run stayed "pending, pid None", its supervisor died
    silently and the run was found lost with no cause named."""
    ws.write(f"[stages.w]\n{body}\n")
    for args in (("run", "w"), ("status",), ("watch", "--once", "--no-gpus")):
        proc = ws.call(*args)
        _one_clear_line(proc, "eagle3.toml", key, "NUL")
    assert ws.latest("w") is None       # nothing was started


def test_a_nul_in_a_set_value_is_refused(ws):
    ws.write(SLEEPER)
    proc = ws.call("run", "sleeper", "--set", 'seconds="1\\u0000"')
    _one_clear_line(proc, "--set", "NUL")
    assert ws.latest("sleeper") is None


# ------------------------------------------------------------------ 11. prepare's estimate on an empty input
def test_prepare_estimate_on_an_empty_input_with_limit(ws):
    """Before: ZeroDivisionError (exit 1) from status, status --json, watch --once and run."""
    ws.write(TINY_PREPARE)
    (ws.root / "data").mkdir()
    (ws.root / "data" / "raw.jsonl").write_bytes(b"")
    for args in (("status", "--no-gpus"), ("status", "--json", "--no-gpus"), ("watch", "--once", "--no-gpus")):
        proc = ws.call(*args)
        assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), (args, proc.returncode, proc.stderr)
    snap = json.loads(ws.call("status", "--json", "--no-gpus").stdout)
    disk = {d["stage"]: d for d in snap["disk"]}
    assert disk["prepare"]["estimate_bytes"] == 0, disk


TINY_PREPARE = """
[target]
path = "models/target"
num_layers = 2
hidden_size = 8

[stages.prepare]
op = "prepare"
params = { input = "data/raw.jsonl", output = "data/prepared", limit = 100 }
"""


# ------------------------------------------------------------------ 12. ASCII numbers only
@pytest.mark.parametrize("value", ["\u0663", "\u0661\u0660", "\uff15", "\u0663.5"])
def test_set_takes_ascii_digits_only(ws, value):
    """Before: `--set seconds=٣` passed the type check (int() reads Arabic-Indic
    digits), was recorded as the string '٣' and passed on."""
    ws.write(SLEEPER)
    proc = ws.call("run", "sleeper", "--set", f"seconds={value}")
    _one_clear_line(proc, "seconds", "expected a number")
    assert ws.latest("sleeper") is None


def test_an_ops_int_param_takes_ascii_digits_only(ws):
    ws.write(extract_pipeline(""))
    proc = ws.call("run", "extract", "--set", "token_budget=\u0663\u0663", "--ignore-disk", "--force")
    _one_clear_line(proc, "token_budget", "expected an integer")
    assert ws.latest("extract") is None


def test_the_ops_own_parser_refuses_non_ascii_digits():
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "ops.extract", "--target", "t", "--input", "i", "--output", "o",
                           "--token-budget", "\u0663\u0663"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "expected an integer" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ 13. halving a share has a floor; restarts a default maximum
SHARE = {"input": "data/prepared", "output": "data/hs", "engine": "sglang"}
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB\n"


def test_a_share_is_not_halved_below_its_floor(ws):
    """Before: watch --advance halved mem_fraction_static 12 times in 72 s down to 0.0002."""
    ws.write(extract_pipeline(', engine = "sglang", mem_fraction_static = 0.06',
                              'batch_param = "mem_fraction_static"\n'))
    run = ws.record_finished_run("extract", {**SHARE, "mem_fraction_static": 0.06})
    Path(run.log_path).write_text(OOM)
    proc = ws.call("watch", "--once", "--no-gpus")
    assert "Traceback" not in proc.stderr
    assert ws.latest("extract").id == run.id, proc.stdout      # no restart at 0.03
    proc = ws.call("restart", "extract", "--halve-batch", "--yes", "--ignore-disk")
    assert proc.returncode == 2 and "not halved below 0.05" in proc.stdout, (proc.stdout, proc.stderr)
    assert ws.latest("extract").id == run.id


def test_oom_restarts_without_a_policy_stop_at_a_default_maximum(ws):
    """A chain of out-of-memory restarts (no `restart` table: the halving alone
    restarts) ends after policy.OOM_RESTARTS, whatever the batch left."""
    from eagle3_console.actions.policy import OOM_RESTARTS
    from eagle3_console.kernel.workspace import Workspace
    ws.write(f"""
[stages.w]
argv = {stage_cmd("sleeper.py", "--seconds", "0")}
params = {{ batch = 1000000 }}
batch_param = "batch"
""")
    w = Workspace(ws.root)
    w.ensure_state()
    prev = None
    with ws.registry() as reg:
        for i in range(OOM_RESTARTS + 1):
            run = reg.create_run("w", ["w"], {"batch": 1000000 >> i}, {}, str(ws.root),
                                 lambda rid: w.log_path(rid, "w"), restart_of=prev)
            reg.finish(run.id, "failed", ended=0.0, exit_code=1)
            Path(reg.get(run.id).log_path).write_text(OOM)
            prev = run.id
    proc = ws.call("watch", "--once", "--no-gpus")
    assert "Traceback" not in proc.stderr
    assert ws.latest("w").id == prev, proc.stdout       # the 11th restart is not made


# ------------------------------------------------------------------ 24. bounds where a number enters
@pytest.mark.parametrize("restart, key", [
    ("{ max = 2, backoff_s = nan }", "restart.backoff_s"),
    ("{ max = 2, backoff_s = -5 }", "restart.backoff_s"),
    ("{ max = 2, backoff_s = 1e300 }", "restart.backoff_s"),
    ("{ max = 2, backoff_s = inf }", "restart.backoff_s"),
    ("{ max = -1 }", "restart.max"),
    ("{ max = 100000000 }", "restart.max"),
])
def test_restart_policy_numbers_are_bounded(ws, restart, key):
    """Before: all accepted (nan and -5: no backoff; 1e300: `--until-done` never
    settles; inf: "backoff, inf s left" forever)."""
    ws.write(SLEEPER + f"restart = {restart}\n")
    for args in (("status", "--no-gpus"), ("watch", "--once", "--no-gpus"), ("run", "sleeper")):
        _one_clear_line(ws.call(*args), "eagle3.toml", f"stages.sleeper.{key}", "expected")
    assert ws.latest("sleeper") is None


@pytest.mark.parametrize("gpus, bad", [("[-1, 0]", 0), ("[0, 0]", 1), ("[0, 99999999999]", 1), ("[1, 2, 1]", 2)])
def test_gpu_indexes_are_bounded_and_distinct(ws, gpus, bad):
    """Before: `gpus = [-1, 0, 0, 99999999999]` accepted and passed as CUDA_VISIBLE_DEVICES."""
    ws.write(SLEEPER + f"gpus = {gpus}\n")
    _one_clear_line(ws.call("run", "sleeper"), "eagle3.toml", f"stages.sleeper.gpus[{bad}]", "expected")
    assert ws.latest("sleeper") is None


def test_an_empty_gpu_list_and_distinct_indexes_still_load(ws):
    ws.write(SLEEPER + "gpus = [0, 1, 7]\n")
    ws.call("status", "--no-gpus", check=0)
    ws.write(SLEEPER + "gpus = []\n")
    ws.call("status", "--no-gpus", check=0)


@pytest.mark.parametrize("args", [("watch", "--once", "--no-gpus", "--interval", "1e-300"),
                                  ("watch", "--once", "--no-gpus", "--interval", "0.001"),
                                  ("exporter", "--port", "0", "--no-gpus", "--interval", "1e-300")])
def test_intervals_have_a_floor(ws, args):
    """Before: `watch --interval 1e-300` and `exporter --interval 1e-300` ran,
    busy-looping at 92-97 % of a core."""
    ws.write(SLEEPER)
    proc = ws.call(*args, timeout=30)
    assert proc.returncode == 3 and "--interval" in proc.stderr and "0.05" in proc.stderr, (proc.returncode,
                                                                                           proc.stderr)
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ 30. runs / events without a pipeline file
@pytest.mark.parametrize("args", [("runs",), ("runs", "--json"), ("events",), ("events", "--json")])
def test_runs_and_events_without_a_pipeline_file_exit_3(tmp_path, args):
    """Before: an empty table or `[]`, exit 0, on a typo'd -w (every other command: exit 3)."""
    from tests.conftest import WS
    ws = WS(tmp_path / "no-such-workspace")
    ws.root.mkdir()
    proc = ws.call(*args)
    _one_clear_line(proc, "eagle3.toml", "no pipeline file here")
    assert proc.stdout == ""
    assert not (ws.root / ".eagle3").exists()       # a read never creates the state folder
