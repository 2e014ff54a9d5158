"""`events` readable once watch has refused a restart (a real failed run, real
`watch --once` passes, the CLI as a subprocess at 160 columns): the outcome is
short and fixed (`refused: disk`) with the refusal's words as the detail, the
identical refusals of every cron pass are one line with their count, and the
targets column says it is a count."""

from __future__ import annotations

import json


PIPE = """
[stages.w]
argv = ["false"]
outputs = ["out/w"]
estimate_bytes = 1000000000000000000
restart = { max = 3, backoff_s = 0 }
"""


def test_watch_refusals_are_short_folded_and_detailed(ws):
    ws.write(PIPE)
    ws.cli("run", "w", "--ignore-disk", check=0)
    ws.wait_status("w", ("failed",))
    for _ in range(3):
        proc = ws.cli("watch", "--once", "--no-gpus")
        assert "w: not restarted: stage 'w' needs about" in proc.stdout, (proc.stdout, proc.stderr)
    data = json.loads(ws.call("events", "--json", check=0).stdout)
    refused = [e for e in data if e["action"] == "watch-restart"]
    assert len(refused) == 1, data
    assert refused[0]["outcome"] == "refused: disk" and refused[0]["repeats"] == 3, refused
    assert "free space or pass --ignore-disk" in refused[0]["detail"]
    assert refused[0]["first_time"] < refused[0]["time"]
    table = ws.call("events", "-n", "3", check=0, env={"COLUMNS": "160"}).stdout
    lines = table.splitlines()
    assert max(len(x) for x in lines) <= 160, table
    row = next(x for x in lines if "watch-restart" in x)
    assert "refused: disk" in row and "3 since" in row, table
    assert "needs about" in row, table          # the detail is readable, not squeezed away
    assert "n targets" in lines[1], table       # a count, said to be one
    launch = next(x for x in lines if "│ run " in x)
    assert "│ 1 " in launch and "disk ignored" in launch, table     # one argv: one target
