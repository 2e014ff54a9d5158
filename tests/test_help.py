"""`--help` says what each option does and the exit codes, 75 and the signal
exits included (the CLI as a real subprocess)."""

from __future__ import annotations

import pytest

OPTIONS = [
    (("kill-workers",), "--grace", "Seconds between SIGTERM and SIGKILL"),
    (("watch",), "--no-gpus", "Skip NVML"),
    (("watch",), "75", "another watch holds .eagle3/watch.lock"),
    (("runs",), "--json", "each run's argv, params, env and pids"),
    (("init",), "DIRECTORY", "default: the workspace"),
    ((), "75", "75 another `watch` holds .eagle3/watch.lock"),
    ((), "128+N", "128+N ended by signal N"),
]


@pytest.mark.parametrize("command,word,said", OPTIONS, ids=[f"{' '.join(c) or 'app'} {w}" for c, w, _ in OPTIONS])
def test_help_says_it(ws, command, word, said):
    text = " ".join(ws.cli(*command, "--help", check=0, env={"COLUMNS": "200"}).stdout.split())
    assert word in text and said in text, text
