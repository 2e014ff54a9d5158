"""`status --json` without typer (eagle3_console/cli.py): the same bytes on
stdout and stderr and the same exit code as the typer command, and neither
typer nor click imported; anything else about the arguments goes to typer."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import pytest

from eagle3_console.cli import status_json_args
from tests.conftest import PY

ENTRY = "import sys; from eagle3_console.cli import run; run(sys.argv[1:], fast={fast})"
# The two calls run one after the other: the clock and the free space move.
VOLATILE = re.compile(r'("(?:time|free_bytes)": )[0-9.e+-]+')


def both(ws, *args, env=None):
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    e.update(env or {})
    runs = []
    for fast in (True, False):
        p = subprocess.run([PY, "-c", ENTRY.format(fast=fast), *args], capture_output=True, text=True,
                           timeout=60, env=e, cwd=str(ws.root))
        runs.append((p.returncode, VOLATILE.sub(r"\1N", p.stdout), p.stderr))
    assert runs[0] == runs[1]
    return runs[0]


def test_same_output_and_exit_code_as_typer(ws):
    ws.write('[stages.noop]\nargv = ["true"]\n')
    code, out, err = both(ws, "-w", str(ws.root), "status", "--json", "--no-gpus")
    assert code == 0 and '"workspace": "%s"' % ws.root in out and err == ""
    assert both(ws, "status", "--json", "--no-gpus", "--workspace", str(ws.root))[1] == out
    assert both(ws, "status", f"--workspace={ws.root}", "--no-gpus", "--json")[1] == out
    assert both(ws, "status", "--no-gpus", "--json", env={"EAGLE3_WORKSPACE": str(ws.root)})[1] == out
    assert both(ws, "status", "--json", "--no-gpus")[1] == out        # the current folder
    ws.record_finished_run("noop", {}, status="failed")
    code, out, _ = both(ws, "-w", str(ws.root), "status", "--json", "--no-gpus")
    assert code == 2 and '"health": "critical"' in out


def test_same_errors_as_typer(ws, tmp_path):
    code, out, err = both(ws, "-w", str(tmp_path / "nowhere"), "status", "--json", "--no-gpus")
    assert code == 3 and out == "" and "eagle3.toml" in err and "Traceback" not in err
    ws.write('[stages.noop]\nargv = ["true"]\n')
    (ws.root / ".eagle3").mkdir()
    (ws.root / ".eagle3" / "state.db").write_text("this is not sqlite " * 100)
    code, out, err = both(ws, "-w", str(ws.root), "status", "--json", "--no-gpus")
    assert code == 3 and "state.db" in err and "Traceback" not in err
    ws.write('[stages.noop]\nargv = "true"\n')
    code, out, err = both(ws, "-w", str(ws.root), "status", "--json", "--no-gpus")
    assert code == 3 and "argv" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, want", [
    (["status", "--json"], (None, False)),
    (["-w", "/a", "status", "--json", "--no-gpus"], ("/a", True)),
    (["status", "--no-gpus", "--json", "-w", "/a"], ("/a", True)),
    (["--workspace=/a", "status", "--json"], ("/a", False)),
    (["status"], None),                                     # the table: rich, typer
    (["--json", "status"], None),                           # typer says --json is no group option
    (["status", "--json", "--help"], None),
    (["status", "--json", "extra"], None),
    (["status", "--json", "-w", "/a", "-w", "/b"], None),
    (["status", "--json", "-w"], None),
    (["status", "--json", "-w", "--no-gpus"], None),
    (["status", "--json", "--workspace="], None),
    (["--readonly", "status", "--json"], None),
    (["status", "--json", "--", "-w"], None),
    (["run", "status", "--json"], None),
    (["status", "status", "--json"], None),
])
def test_only_plain_status_json_skips_typer(argv, want):
    assert status_json_args(argv) == want


def test_no_typer_click_textual_or_torch_on_that_path(ws):
    ws.write('[stages.noop]\nargv = ["true"]\n')
    probe = textwrap.dedent(f"""
        import sys
        from eagle3_console.cli import run
        try:
            run(["-w", {str(ws.root)!r}, "status", "--json", "--no-gpus"])
        except SystemExit as exc:
            sys.stderr.write(f"EXIT={{exc.code}}\\n")
        heavy = sorted(m for m in sys.modules
                       if m.split(".")[0] in ("typer", "click", "rich", "textual", "torch", "psutil", "pynvml"))
        sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
        # Only what other commands need: shutil (bz2, lzma), threading, the serve and curve monitors.
        unneeded = sorted(m for m in ("shutil", "threading", "eagle3_console.monitor.serve",
                                      "eagle3_console.monitor.metrics") if m in sys.modules)
        sys.stderr.write("UNNEEDED=" + ",".join(unneeded) + "\\n")
    """)
    proc = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60)
    assert "EXIT=0" in proc.stderr and "HEAVY=\n" in proc.stderr, proc.stderr
    assert "UNNEEDED=\n" in proc.stderr, proc.stderr
