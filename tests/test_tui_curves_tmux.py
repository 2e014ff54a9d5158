"""The curves in the real console in tmux (issue 12, s2), at 80x24 and 160x48:
train's metrics.jsonl is appended to while the console shows it, and the new
window's values appear (the collector's reader follows the file)."""

from __future__ import annotations

import json
import os
import re

import pytest

from tests.conftest import wait_for
from tests.test_tui_curves import K, pipeline, records
from tests.test_tui_tmux import Tmux, console_cmd, pytestmark  # noqa: F401 - tmux or skip


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_curves_follow_the_metrics_file_in_tmux(ws, size):
    (ws.root / "eagle3.toml").write_text(pipeline().split("[stages.prepare]")[0] + f"""
[stages.train]
op = "train"
params = {{ data = "data/hs", vocab = "data/vocab", output = "runs/train", ttt_steps = {K} }}
""")
    out = ws.root / "runs" / "train"
    out.mkdir(parents=True)
    recs = records(40)
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    tmux = Tmux(ws.root, f"e3curves{os.getpid()}{size[0]}")
    try:
        tmux.start(console_cmd(ws.root), size)
        last = recs[-1]
        # A short pane (80x24) says every step's accuracy on one line (issue 20: acc@2 was left out).
        accs = ("acc@1", f"acc@{K}") if size[1] >= 40 else (f"acc@1-{K}",)
        screen = tmux.wait_screen("Progress: train", "sim AL", f"{last['simulated_acceptance_length']:.2f}",
                                  f"{last['acc'][0]:.2f}", *accs, timeout=90)   # the app's start, on a loaded machine
        assert "▁" in screen or "▂" in screen          # the sparklines' glyphs
        if size[1] >= 40:
            # Every step's sparkline; the loss chart (with its step range) only where the pane has
            # rows left after the result line (issue 20: the result line was cut off under it).
            assert all(f"acc@{k}" in screen for k in range(1, K + 1))
        # A new window: its values show without a restart.
        new = dict(last, step=last["step"] + 10, loss=0.4321, acc=[0.99, 0.98, 0.97, 0.96],
                   simulated_acceptance_length=4.8)
        with open(out / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(new) + "\n")
        # On the curves' own lines (the result line under them says the same figures).
        acc = r"acc@1\s+[▁-█ ]+ 0\.99" if size[1] >= 40 else rf"acc@1-{K} 0\.99 0\.98 0\.97 0\.96"
        wait_for(lambda: re.search(r"sim AL\s+[▁-█ ]+ 4\.80", tmux.screen())
                 and re.search(acc, tmux.screen()), timeout=60, poll=0.2)   # a loaded CI machine: xdist workers beside the TUI
    finally:
        tmux.kill()
