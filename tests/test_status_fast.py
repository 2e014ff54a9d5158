"""`status --json` without typer (eagle3_console/cli/__init__.py): the same bytes on
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
    assert code == 3 and "eagle3.toml" in err and "Traceback" not in err
    # stdout is still one JSON object (issue 20), the same on both paths (its time masked by both()).
    assert out.startswith("{") and '"health": "unknown"' in out and '"code": "config_error"' in out
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


MAIN = textwrap.dedent("""
    import atexit, sys
    class Teardown:
        # Freed when the interpreter tears its modules down: a normal exit prints this.
        def __del__(self):
            sys.stderr.write("TEARDOWN\\n")
    keep = Teardown()
    atexit.register(lambda: sys.stderr.write("ATEXIT\\n"))
    from eagle3_console.cli import main
    sys.argv = ["eagle3-console", *sys.argv[1:]]
    main()
""")


def entry(*args, cwd=None):
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    return subprocess.run([PY, "-c", MAIN, *args], capture_output=True, text=True, timeout=60, env=e, cwd=cwd)


def test_status_json_process_ends_without_teardown_but_with_its_output_and_exit_code(ws):
    """The console script ends a `status --json` with os._exit once its output
    is flushed and the atexit handlers ran (the interpreter's teardown cost 21 ms
    of 188 on an H200, benchmarks/status_cost.py); other commands exit normally."""
    ws.write('[stages.noop]\nargv = ["true"]\n')
    p = entry("-w", str(ws.root), "status", "--json", "--no-gpus")
    assert p.returncode == 0 and p.stdout.rstrip().endswith("}"), p
    assert '"workspace": "%s"' % ws.root in p.stdout
    assert "ATEXIT" in p.stderr and "TEARDOWN" not in p.stderr, p.stderr
    ws.record_finished_run("noop", {}, status="failed")
    p = entry("-w", str(ws.root), "status", "--json", "--no-gpus")
    assert p.returncode == 2 and '"health": "critical"' in p.stdout and "TEARDOWN" not in p.stderr
    # A workspace that cannot be read: the error line and exit 3, still no teardown.
    p = entry("-w", str(ws.root / "nowhere"), "status", "--json", "--no-gpus")
    assert p.returncode == 3 and "eagle3.toml" in p.stderr and "Traceback" not in p.stderr
    # The table (typer's path) tears down as usual.
    p = entry("-w", str(ws.root), "status", "--no-gpus")
    assert "noop" in p.stdout and "TEARDOWN" in p.stderr, p


def test_status_json_into_a_closed_pipe_keeps_its_exit_code_quietly(ws):
    ws.write("".join(f'[stages.s{i}]\nargv = ["true"]\n' for i in range(300)))   # past the pipe buffer
    e = dict(os.environ)
    e.pop("EAGLE3_WORKSPACE", None)
    p = subprocess.run(["bash", "-c", f'set -o pipefail; {PY} -c "$0" -w "$1" status --json --no-gpus | head -c 10',
                        MAIN, str(ws.root)], capture_output=True, text=True, timeout=60, env=e)
    # The monitoring code (OK: nothing ran), not the pipe's 1: tests/test_closed_pipe.py has CRITICAL.
    assert len(p.stdout) == 10 and p.returncode == 0, p
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
