"""The pipeline's result in the console: bench's bench.json (acceptance length,
acceptance per draft position, speed-up, output equal to greedy) in the
stages table and, with bench selected, in the Progress pane. A real
workspace: a pipeline file with the bench op, a registry whose runs
succeeded, and the bench.json the op writes; the app samples it as usual.
Also: which stage the console selects by itself, and when it stops."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from eagle3_console.kernel.registry import Registry
from eagle3_console.kernel.workspace import Workspace
from tests.conftest import stage_cmd
from tests.test_tui_helpers import make_app, pane_text, run, wait_until

BENCH = {
    "drafter": "runs/export/sglang", "format": "sglang", "draft_tokens": 3,
    "acceptance_length": 2.706896551724138,
    "accept_rate_per_position": [0.9137931034482759, 0.4716981132075472, 0.84],
    "target_forwards_plain": 159, "target_forwards_speculative": 66, "tokens": 159,
    "prompts": [20, 48, 71, 75, 111, 128, 132, 144],
    "tok_s_plain": 323.27, "tok_s_speculative": 354.74, "speedup": 1.0973, "outputs_match": True,
    "mismatches": [],
}


def bench_workspace(root: Path, result: dict) -> None:
    (root / "eagle3.toml").write_text(f"""
[target]
path = "assets/target"
num_layers = 8
hidden_size = 64
dtype = "float32"
vocab_size = 512

[stages.prepare]
argv = {stage_cmd("progress.py", "--n", "3")}

[stages.bench]
op = "bench"
depends_on = ["prepare"]
params = {{ drafter = "runs/export", data = "data/hidden_states", output = "runs/bench", num_prompts = 8, max_new_tokens = 48, draft_tokens = 3, device = "cpu" }}
""")
    out = root / "runs" / "bench"
    out.mkdir(parents=True)
    (out / "bench.json").write_text(json.dumps(result))
    ws = Workspace.at(root)
    ws.ensure_state()
    now = time.time()
    with Registry(ws.db_path) as reg:
        params = {"drafter": "runs/export", "data": "data/hidden_states", "output": "runs/bench",
                  "num_prompts": 8, "max_new_tokens": 48, "draft_tokens": 3, "device": "cpu"}
        for stage, started, p in (("bench", now - 60, params), ("prepare", now - 600, {})):
            r = reg.create_run(stage, ["python", "-m", f"ops.{stage}"], p, {}, str(root),
                               lambda rid, s=stage: ws.log_path(rid, s))
            Path(r.log_path).write_text("progress: prompt 8/8 accept length 2.71\n")
            reg.update(r.id, status="running", started=started, pid=None)
            reg.finish(r.id, "succeeded", ended=started + 6, exit_code=0)


@pytest.mark.parametrize("size", [(160, 48), (80, 24)], ids=["160x48", "80x24"])
def test_bench_result_in_the_table_and_the_progress_pane(tmp_path, size):
    bench_workspace(tmp_path, BENCH)

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=size) as pilot:
            table = app.query_one("#stages")
            await wait_until(pilot, lambda: app.main_screen.snapshot is not None and "result" in table.columns_shown)
            # Nothing runs or failed: the stage that ran last is shown, here bench.
            assert app.main_screen.selected == "bench"
            cell = table.get_row("bench")[table.columns_shown.index("result")]
            assert str(cell) == "AL 2.71" and "green" in str(cell.style)
            assert str(table.get_row("prepare")[table.columns_shown.index("result")]) == "-"
            await wait_until(pilot, lambda: "acceptance length 2.71" in pane_text(app, "progress"))
            text = pane_text(app, "progress")
            assert "speed-up 1.10x · output == greedy" in text and "8 prompts, 159 tokens" in text
            assert "K=3, max 4" in text and "target forwards 66 vs 159" in text
            assert "354.7 tok/s speculative vs 323.3 plain" in text and "drafter runs/export/sglang" in text
            assert "accept @1" in text and "91%" in text and "accept @2" in text and "47%" in text
            if size[0] == 80:
                # No room for everything: started (then run) give way, the result stays.
                assert "started" not in table.columns_shown
    run(main())


def test_a_speculative_output_that_differs_from_greedy_stands_out(tmp_path):
    bench_workspace(tmp_path, dict(BENCH, outputs_match=False, mismatches=[{"prompt": 3}]))

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#stages")
            await wait_until(pilot, lambda: app.main_screen.snapshot is not None and "result" in table.columns_shown)
            cell = table.get_row("bench")[table.columns_shown.index("result")]
            assert "!=greedy" in str(cell) and "red" in str(cell.style)
            await wait_until(pilot, lambda: "OUTPUT DIFFERS FROM GREEDY on 1 prompts" in pane_text(app, "progress"))
    run(main())


def test_the_selection_follows_the_active_stage_until_the_operator_moves(tmp_path):
    bench_workspace(tmp_path, BENCH)

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: app.main_screen.selected == "bench")
            # The operator moves up to prepare: the panes follow the cursor...
            await pilot.press("up")
            await wait_until(pilot, lambda: app.main_screen.selected == "prepare")
            await wait_until(pilot, lambda: "Progress: prepare" in str(app.query_one("#progress").border_title))
            passes = app.main_screen.passes
            await wait_until(pilot, lambda: app.main_screen.passes >= passes + 3)
            # ...and later passes do not take the selection back.
            assert app.main_screen.selected == "prepare"
    run(main())


def test_an_sglang_bench_result_is_labelled_with_its_engine(tmp_path):
    result = {"engine": "sglang", "url": "http://127.0.0.1:30000", "acceptance_length": 2.91, "draft_tokens": 3,
              "tok_s_speculative": 120.5, "tok_s_plain": 41.0, "speedup": 2.94, "outputs_match": True,
              "prompts": [0, 1, 2], "tokens": 96}
    bench_workspace(tmp_path, result)

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            table = app.query_one("#stages")
            await wait_until(pilot, lambda: app.main_screen.snapshot is not None and "result" in table.columns_shown)
            assert str(table.get_row("bench")[table.columns_shown.index("result")]) == "AL 2.91 sglang"
            await wait_until(pilot, lambda: "engine sglang http://127.0.0.1:30000" in pane_text(app, "progress"))
            assert "speed-up 2.94x" in pane_text(app, "progress")
    run(main())
