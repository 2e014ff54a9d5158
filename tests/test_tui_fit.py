"""The Progress pane fits what it shows (issue 20): at 160x48 train's result line
was cut off under the curves, at 80x24 acc@2 was left out and bench showed only
accept @1/@2, and the pane's scrollbar drew stray marks at its edge. A real
workspace as the demo leaves it: train (3 TTT steps) and bench succeeded."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eagle3_console.kernel.registry import Registry
from eagle3_console.kernel.workspace import Workspace
from tests.test_tui_bench import BENCH
from tests.test_tui_helpers import make_app, pane_text, run, select, wait_until
from eagle3_console.tui.panes.body import Body

ACC = [0.81, 0.72, 0.63]


def workspace(root: Path) -> None:
    (root / "eagle3.toml").write_text("""
[target]
path = "assets/target"
num_layers = 8
hidden_size = 64
dtype = "float32"
vocab_size = 512

[stages.train]
op = "train"
params = { data = "data/hs", vocab = "data/vocab", output = "runs/train", ttt_steps = 3 }

[stages.bench]
op = "bench"
depends_on = ["train"]
params = { drafter = "runs/export", data = "data/hs", output = "runs/bench", draft_tokens = 3 }
""")
    ws = Workspace.at(root)
    ws.ensure_state()
    now = time.time()
    with Registry(ws.db_path) as reg:
        for stage, started, params in (
                ("train", now - 300, {"data": "data/hs", "vocab": "data/vocab", "output": "runs/train", "ttt_steps": 3}),
                ("bench", now - 120, {"drafter": "runs/export", "data": "data/hs", "output": "runs/bench",
                                      "draft_tokens": 3})):
            r = reg.create_run(stage, ["python", "-m", f"ops.{stage}"], params, {}, str(root),
                               lambda rid, s=stage: ws.log_path(rid, s))
            Path(r.log_path).write_text("done\n")
            reg.update(r.id, status="running", started=started, pid=None)
            reg.finish(r.id, "succeeded", ended=started + 60, exit_code=0)
    out = root / "runs" / "train"
    out.mkdir(parents=True)
    recs = []
    for i in range(1, 9):
        acc = [round(a * (1 - 0.5 ** i), 4) for a in ACC]
        recs.append({"step": 10 * i, "total": 80, "loss": 4.0 - 0.3 * i, "acc": acc,
                     "simulated_acceptance_length": round(1 + acc[0] + acc[0] * acc[1] + acc[0] * acc[1] * acc[2], 4),
                     "tok_s": 3000.0, "lr": 1e-4})
    recs[-1]["acc"] = ACC
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (root / "runs" / "bench").mkdir(parents=True)
    (root / "runs" / "bench" / "bench.json").write_text(json.dumps(dict(BENCH, engine="reference")))


def fits(app) -> bool:
    pane = app.query_one("#progress")
    return pane.virtual_size.height <= pane.size.height


@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
def test_the_progress_pane_shows_all_of_train_and_bench_without_a_scrollbar(tmp_path, size):
    workspace(tmp_path)

    async def main():
        app = make_app(tmp_path, refresh_s=0.3)
        async with app.run_test(size=size) as pilot:
            await select(pilot, app, "train")
            await wait_until(pilot, lambda: "simulated AL" in pane_text(app, "progress") and "sim AL" in
                             pane_text(app, "progress"))
            await wait_until(pilot, lambda: not any(b.pending_fit for b in app.query(Body)))
            await pilot.pause(0.5)
            text = pane_text(app, "progress")
            curves = text.split("loss 1.6000")[0]        # the curves, above the result line
            assert all(f"{a:.2f}" in curves for a in ACC), text     # every TTT step's accuracy
            assert "accuracy per step 0.81/0.72/0.63" in text
            assert fits(app), (app.query_one("#progress").virtual_size, app.query_one("#progress").size, text)
            await select(pilot, app, "bench")
            await wait_until(pilot, lambda: "accept @3" in pane_text(app, "progress"))
            await wait_until(pilot, lambda: not any(b.pending_fit for b in app.query(Body)))
            await pilot.pause(0.5)
            from textual.widgets import Static

            from tests.test_tui_helpers import rendered
            shown = [rendered(b).rstrip("\n") for b in app.query_one("#progress").query(Static) if b.display]
            text = "\n".join(x for x in shown if x)
            first = text.split("accept @3")[0].count("\n")
            # The three bars within the pane's rows (the details under them may be cut on 80x24).
            assert first < app.query_one("#progress").size.height, text
            for pane in ("#progress", "#disk"):
                assert app.query_one(pane).styles.scrollbar_size_vertical == 0
    run(main())
