"""`status | head -1`: a reader that goes away does not change the monitoring
exit code (CRITICAL stays 2, read through `set -o pipefail`). The CLI as a real
subprocess whose stdout pipe is closed before it prints, and a real shell pipe."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import PY


def _status(ws, *args) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("EAGLE3_WORKSPACE", None)
    return subprocess.Popen([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "status", "--no-gpus", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.parametrize("args", [(), ("--json",)], ids=["table", "json"])
def test_a_closed_stdout_keeps_the_critical_exit_code(ws, args):
    ws.write('[stages.w]\nargv = ["false"]\n')
    ws.record_finished_run("w", {}, status="failed")
    proc = _status(ws, *args)
    proc.stdout.close()             # the reader is gone before the first line is printed
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 2, err
    assert "Traceback" not in err, err


def test_status_piped_into_head_exits_critical(ws):
    ws.write('[stages.w]\nargv = ["false"]\n')
    ws.record_finished_run("w", {}, status="failed")
    script = f'set -o pipefail; "{PY}" -m eagle3_console.cli -w "{ws.root}" status --no-gpus | head -c 1 >/dev/null'
    for _ in range(3):
        assert subprocess.run(["bash", "-c", script], timeout=60).returncode == 2
