"""bench's table in the console: the Progress pane with bench selected and the status line show a row per
(setting, concurrency), the degenerate-completion share and the comparison with the other engine."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT
from tests.test_tui_bench import BENCH, bench_workspace
from tests.test_tui_helpers import make_app, pane_text, run, wait_until


def _row(label, steps, c, al, tok_s, speedup, rates, degenerate):
    return {"label": label, "setting": {"steps": steps, "topk": 1, "draft_tokens": steps + 1}, "concurrency": c,
            "acceptance_length": al, "tok_s": tok_s, "speedup": speedup, "accept_rate_per_position": rates,
            "degenerate": {"threshold": 0.5, "judged": 8, "count": degenerate, "share": degenerate / 8,
                           "prompts": []}}


RESULT = dict(BENCH, table=[
    _row("(3,1,4)", 3, 1, 2.71, 354.7, 1.1, [0.91, 0.47, 0.84], 1),
    _row("(3,1,4)", 3, 8, 2.71, 2210.4, 1.05, [0.91, 0.47, 0.84], 1),
    _row("(7,1,8)", 7, 1, 3.02, 301.2, 0.93, [0.91, 0.47, 0.84, 0.5, 0.4, None, None], 1),
], degenerate={"threshold": 0.5, "judged": 8, "count": 1, "share": 0.125, "prompts": [48]},
    compared={"with": "runs/bench_sglang/bench.json", "engine_other": "sglang", "prompts": 8,
              "differing_completions": 3, "tokens": 159, "tokens_other": 171, "acceptance_length": 2.71,
              "acceptance_length_other": 3.1})


def test_the_table_in_the_progress_pane(tmp_path):
    bench_workspace(tmp_path, RESULT)

    async def main():
        app = make_app(tmp_path, refresh_s=0.2)
        async with app.run_test(size=(160, 60)) as pilot:
            await wait_until(pilot, lambda: "setting  conc" in pane_text(app, "progress"))
            text = pane_text(app, "progress")
            # One line a row in the side pane (rates in percent); the longer lines wrap.
            assert "setting  conc    AL   tok/s  speed degen accept@1..k %\n" in text
            assert "(3,1,4)  x1    2.71   354.7  1.10x   1/8 91/47/84\n" in text
            assert "(3,1,4)  x8    2.71  2210.4  1.05x   1/8 91/47/84\n" in text
            assert "(7,1,8)  x1    3.02   301.2  0.93x   1/8 91/47/84/50/40/-/-\n" in text
            flat = " ".join(text.split())
            assert "degenerate completions 1/8 (distinct bigrams < 0.5): repetition inflates acceptance" in flat
            assert ("vs sglang (runs/bench_sglang/bench.json): 3 of 8 completions differ, 159 vs 171 tokens, "
                    "AL 2.71 vs 3.10") in flat
    run(main())


def test_the_status_line_flags_degenerate_and_differing_completions(tmp_path):
    bench_workspace(tmp_path, RESULT)
    proc = subprocess.run([sys.executable, "-m", "eagle3_console.cli", "-w", str(tmp_path), "status", "--json",
                           "--no-gpus"], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    [stage] = [s for s in json.loads(proc.stdout)["stages"] if s["name"] == "bench"]
    assert stage["result"]["table"][2]["label"] == "(7,1,8)"
    assert stage["result_line"].endswith("; DEGENERATE 1/8 completions; 3/8 completions differ from sglang's")


def test_the_table_in_the_exporter(tmp_path):
    """The exporter's /metrics over real HTTP: a gauge pair per row, labelled by setting and concurrency."""
    import urllib.request

    from tests.conftest import wait_for

    bench_workspace(tmp_path, RESULT)
    proc = subprocess.Popen([sys.executable, "-m", "eagle3_console.cli", "-w", str(tmp_path), "exporter", "--port",
                             "0", "--no-gpus", "--interval", "0.5"], stdout=subprocess.PIPE, text=True, cwd=str(ROOT))
    try:
        line = proc.stdout.readline()
        port = int(line.split("http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])

        def scrape():
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            return text if "eagle3_bench_table_acceptance_length" in text else None

        text = wait_for(scrape, timeout=30)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert any(ln.startswith("eagle3_bench_table_acceptance_length{") and 'setting="(3,1,4)"' in ln
               and 'concurrency="8"' in ln and ln.endswith(" 2.71") for ln in text.splitlines())
    assert any(ln.startswith("eagle3_bench_table_output_tokens_per_second{") and 'setting="(7,1,8)"' in ln
               and ln.endswith(" 301.2") for ln in text.splitlines())
    assert any(ln.startswith("eagle3_bench_degenerate_ratio{") and ln.endswith(" 0.125") for ln in text.splitlines())
