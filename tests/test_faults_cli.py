"""Fault injection, issue 19: the CLI's input checks and exit codes, played end
to end with the real CLI in subprocesses (items 10, 11, 15, 18, 21, 22, 23;
the supervisor, stop, logs -f, backoff and exporter items are in
tests/test_faults_supervise.py). Each test failed on the main branch it was
written against."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.conftest import stage_cmd, wait_for

SLEEPER = f"""
[stages.sleeper]
argv = {stage_cmd("sleeper.py", "--seconds", "{seconds}")}
params = {{ seconds = 30.0 }}
"""


def _one_clear_line(proc, *words: str) -> None:
    assert "Traceback" not in proc.stderr and "rror" in proc.stderr, proc.stderr
    for w in words:
        assert w in proc.stderr, (w, proc.stderr)


# ------------------------------------------------------------------ 10. numeric options
@pytest.mark.parametrize("args, option", [
    (("exporter", "--port", "70000"), "--port"),
    (("exporter", "--port", "-1"), "--port"),
    (("exporter", "--interval", "nan"), "--interval"),
    (("exporter", "--interval", "inf"), "--interval"),
    (("exporter", "--interval", "-1"), "--interval"),
    (("exporter", "--interval", "0"), "--interval"),
    (("watch", "--once", "--interval", "-1"), "--interval"),
    (("watch", "--interval", "nan"), "--interval"),
    (("watch", "--interval", "1e300"), "--interval"),
    (("stop", "sleeper", "--grace", "nan"), "--grace"),
    (("stop", "sleeper", "--grace", "-3"), "--grace"),
    (("kill-workers", "sleeper", "--grace", "inf"), "--grace"),
    (("kill-workers", "sleeper", "--wait", "-1"), "--wait"),
    (("runs", "-n", "-1"), "-n"),
    (("runs", "-n", "99999999999999999999999"), "-n"),
    (("logs", "sleeper", "-n", "-5"), "-n"),
    (("logs", "sleeper", "--run", "0"), "--run"),
])
def test_every_numeric_option_is_checked_at_parse_exit_3(ws, args, option):
    """Before: --port 70000 an OverflowError traceback (exit 1); --interval nan
    accepted (a busy sampler), inf killed the sampler thread; watch
    --interval -1 / nan a ValueError traceback; -n -1 silently accepted."""
    ws.write(SLEEPER)
    proc = ws.cli(*args, timeout=20)
    assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
    _one_clear_line(proc, option)
    assert "Traceback" not in proc.stderr


def test_watch_and_exporter_still_take_a_fractional_interval(ws):
    ws.write(SLEEPER)
    ws.cli("watch", "--once", "--no-gpus", "--interval", "0.05", check=0)


# ------------------------------------------------------------------ 22. usage errors are bad input
@pytest.mark.parametrize("args", [("run", "-rf"), ("run",), ("status", "--jsn"), ("no-such-command",),
                                  ("exporter", "--port", "abc")])
def test_click_usage_errors_exit_3_not_2(ws, args):
    """Before: exit 2, which the README's table calls CRITICAL (a stage failed)."""
    ws.write(SLEEPER)
    proc = ws.cli(*args)
    assert proc.returncode == 3, (proc.returncode, proc.stderr)
    assert "Error" in proc.stderr and "Traceback" not in proc.stderr


def test_help_is_still_exit_0(ws):
    ws.write(SLEEPER)
    assert "Usage" in ws.cli("run", "--help", check=0).stdout


# ------------------------------------------------------------------ 11. deep nesting
def test_600_deep_nested_array_in_params_is_one_line_exit_3(ws):
    """Before: a RecursionError traceback of 3,000 lines, exit 1."""
    deep = "[" * 600 + "]" * 600
    ws.write(f"""
[stages.s]
argv = ["python", "-c", "pass"]
params = {{ x = {deep} }}
""")
    for args in (("status", "--no-gpus"), ("status", "--json", "--no-gpus"), ("run", "s")):
        proc = ws.cli(*args)
        assert proc.returncode == 3, (args, proc.returncode, proc.stderr[-500:])
        assert "Traceback" not in proc.stderr and "RecursionError" not in proc.stderr
        assert len(proc.stderr.splitlines()) == 1 and "eagle3.toml" in proc.stderr and "nested" in proc.stderr


def test_nesting_that_tomllib_parses_but_is_absurd_is_refused_with_its_key(ws):
    deep = "[" * 200 + "1" + "]" * 200
    ws.write(f"""
[stages.s]
argv = ["python", "-c", "pass"]
params = {{ x = {deep} }}
""")
    proc = ws.cli("status", "--no-gpus")
    assert proc.returncode == 3 and "stages.s.params.x" in proc.stderr and "nested" in proc.stderr, proc.stderr


def test_a_deep_set_value_is_one_line_exit_3(ws):
    ws.write(SLEEPER)
    proc = ws.cli("run", "sleeper", "--set", "seconds=" + "[" * 600 + "]" * 600)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "--set" in proc.stderr, proc.stderr[-300:]
    assert ws.latest("sleeper") is None


# ------------------------------------------------------------------ 21. BOM
def test_a_pipeline_file_with_a_utf8_bom_is_accepted(ws):
    """Before: "Invalid statement (line 1, column 1)", exit 3."""
    (ws.root / "eagle3.toml").write_bytes(b"\xef\xbb\xbf" + SLEEPER.encode())
    proc = ws.cli("status", "--json", "--no-gpus")
    assert proc.returncode == 0, proc.stderr
    assert [s["name"] for s in json.loads(proc.stdout)["stages"]] == ["sleeper"]
