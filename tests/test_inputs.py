"""Every input checked where the README promises it (issue 9, section 3):
bad input exits 3 naming the file and key; "nothing to do" exits 0."""

from __future__ import annotations

import os

from tests.conftest import stage_cmd


def test_custom_param_takes_the_type_of_its_default(ws):
    ws.write(f"""
[stages.count]
argv = {stage_cmd("progress.py", "--n", "{{n}}", "--sleep", "0")}
params = {{ n = 200 }}
""")
    proc = ws.call("run", "count", "--set", "n=abc")
    assert proc.returncode == 3 and "param n" in proc.stderr and "integer" in proc.stderr, proc.stderr
    assert ws.latest("count") is None


def test_runs_of_an_unknown_stage_is_bad_input(ws):
    ws.write('[stages.a]\nargv = ["true"]\n')
    proc = ws.call("runs", "nosuch")
    assert proc.returncode == 3 and "nosuch" in proc.stderr


def test_unknown_dtype_is_refused(ws):
    ws.write('[target]\ndtype = "fp33"\n[stages.a]\nargv = ["true"]\n')
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3 and "target.dtype" in proc.stderr and "fp33" in proc.stderr


def test_halve_batch_without_batch_param_says_so(ws):
    ws.write('[stages.a]\nargv = ["true"]\n')
    ws.cli("run", "a", check=0)
    ws.wait_status("a", ("succeeded",))
    proc = ws.cli("restart", "a", "--halve-batch")
    assert proc.returncode == 3 and "batch_param" in proc.stderr, (proc.stdout, proc.stderr)


def test_literal_braces_in_argv(ws):
    ws.write('[stages.a]\nargv = ["python", "-c", "print({{\\"k\\": {n}}})"]\nparams = { n = 4 }\n')
    ws.cli("run", "a", check=0)
    run = ws.wait_status("a", ("succeeded",))
    assert run.argv[-1] == 'print({"k": 4})'
    assert "{'k': 4}" in open(run.log_path).read()


def test_unknown_op_lists_the_ops_once(ws):
    ws.write('[stages.a]\nop = "nosuch"\n')
    proc = ws.call("status", "--no-gpus")
    assert proc.returncode == 3 and proc.stderr.count("prepare") == 1, proc.stderr


def test_clean_names_a_symlinked_output(ws, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.tmp").write_text("x")
    ws.write('[stages.a]\nargv = ["false"]\noutputs = ["out"]\n')
    os.symlink(elsewhere, ws.root / "out")
    ws.cli("run", "a", check=0)
    ws.wait_status("a", ("failed",))
    proc = ws.cli("clean", "a", "--yes")
    assert proc.returncode == 2 and "is a symlink" in proc.stdout and str(ws.root / "out") in proc.stdout, proc.stdout
    assert (elsewhere / "f.tmp").exists()


def test_nothing_to_do_exits_0_everywhere(ws):
    ws.write('[stages.a]\nargv = ["true"]\noutputs = ["out"]\n')
    for args in (("stop", "a"), ("kill-workers", "a"), ("clean", "a")):
        proc = ws.cli(*args)
        assert proc.returncode == 0 and "nothing to do" in proc.stdout, (args, proc.stdout, proc.stderr)
