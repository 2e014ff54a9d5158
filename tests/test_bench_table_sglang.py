"""bench's table with engine = "sglang" against the SGLang test double (tests/sglang_double.py, whose
meta_info mirrors sglang 0.5.23's tokenizer_manager.py, spec_correct_drafts_histogram included):
one speculative server per (steps, topk, draft tokens) setting, each at concurrency 1 and 8, beside
the baseline; per-position acceptance from the histogram; the degenerate-completion share."""

from __future__ import annotations

import json
import math

import pytest

from ops.bench.spec import result_line
from tests.sglang_double import Double
from tests.test_op_bench_sglang import bench

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [11, 12, 13, 14, 15, 16, 17, 18]]
SETTINGS = [(3, 4, 2.5), (5, 6, 3.0), (7, 8, 3.5)]      # steps, draft tokens, the double's accept length


@pytest.fixture
def servers():
    spec = [Double(speculative=True, num_steps=s, num_draft_tokens=d, accept_length=al, step_s=0.002,
                   loop_after=9).start() for s, d, al in SETTINGS]
    base = Double(speculative=False, step_s=0.002, loop_after=9).start()
    for d in spec + [base]:
        d.status = "Up"
    yield spec, base
    for d in spec + [base]:
        d.stop()


def expected_rates(n: int, accept_length: float, drafts: int) -> list[float]:
    """The conditional acceptance of draft i when `n` tokens took ceil(n / AL) verify steps
    and their n - steps accepted drafts spread evenly (the double's model)."""
    steps = math.ceil(n / accept_length)
    correct = n - steps
    per_step = [correct // steps + (1 if i < correct % steps else 0) for i in range(steps)]
    return [sum(m >= i for m in per_step) / sum(m >= i - 1 for m in per_step) if any(m >= i - 1 for m in per_step)
            else None for i in range(1, drafts + 1)]


def test_a_row_per_server_and_concurrency(servers, tmp_path):
    spec, base = servers
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("\n".join(json.dumps({"input_ids": p}) for p in PROMPTS) + "\n")
    proc = bench("--url", ",".join(d.url for d in spec), "--baseline-url", base.url, "--prompts-file", str(pf),
                 "--max-new-tokens", "32", "--concurrency", "1,8", "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "out" / "bench.json").read_text())
    rows = r["table"]
    assert [(x["label"], x["concurrency"]) for x in rows] == [
        ("baseline", 1), ("baseline", 8), ("(3,1,4)", 1), ("(3,1,4)", 8), ("(5,1,6)", 1), ("(5,1,6)", 8),
        ("(7,1,8)", 1), ("(7,1,8)", 8)]
    for x in rows:
        assert x["prompts"] == 3 and x["completion_tokens"] == 3 * 32
        assert x["tok_s"] == x["completion_tokens"] / x["seconds"]
        assert x["differing_from_concurrency_1"] == 0 if x["concurrency"] == 8 else "differing_from_concurrency_1" \
            not in x
        if x["label"] == "baseline":
            assert x["acceptance_length"] is None
            continue
        (steps, _d, al), = [s for s in SETTINGS if s[0] == x["setting"]["steps"]]
        assert x["setting"] == {"steps": steps, "topk": 1, "draft_tokens": steps + 1}
        assert x["verify_steps"] == 3 * math.ceil(32 / al)
        assert x["acceptance_length"] == pytest.approx(96 / x["verify_steps"])
        assert x["accept_rate_per_position"] == pytest.approx(expected_rates(32, al, steps))
        assert x["speedup"] == pytest.approx(x["tok_s"] / rows[0 if x["concurrency"] == 1 else 1]["tok_s"])
    # The headline record: the first server's, with its per-position acceptance from the histogram too.
    assert r["accept_rate_per_position"] == pytest.approx(expected_rates(32, 2.5, 3))
    assert sum(r["spec_correct_drafts_histogram"]) == r["spec_verify_ct"]
    # Prompt 2 (first id 9) loops on two tokens: one of three completions is degenerate.
    assert r["degenerate"] == {"threshold": 0.5, "judged": 3, "count": 1, "share": 1 / 3, "prompts": [2]}
    assert all(x["degenerate"]["count"] == 1 for x in rows)
    assert "bench: (7,1,8) x8 " in proc.stdout
    assert result_line(r).startswith("engine sglang: acceptance length")


def test_one_serve_stage_per_setting_binds_one_url_each(ws):
    """params.server names several speculative serve stages (comma-separated): the launch's --url
    carries each one's URL, in order, for the table's rows."""
    from tests.test_serve_e2e import bench_pipeline

    toml = bench_pipeline(31011, 31012, 'server = "serve_spec,serve_spec6", baseline_server = "serve_base", '
                                        'ready_timeout_s = 1')
    toml += """
[stages.serve_spec6]
op = "serve"
gpus = [0]
params = { port = 31013, mode = "speculative", drafter = "runs/export", num_steps = 5, num_draft_tokens = 6, launcher = "tests.fake_launch_server" }
"""
    ws.write(toml)
    (ws.root / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3, 4]}\n')
    ws.cli("run", "bench_sglang", check=0)
    argv = ws.latest("bench_sglang").argv
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:31011,http://127.0.0.1:31013"
    ws.wait_status("bench_sglang", ("failed", "succeeded"), timeout=30)
    ws.write(toml.replace('server = "serve_spec,serve_spec6"', 'server = "serve_spec,serve_base"'))
    proc = ws.cli("run", "bench_sglang", check=3)
    assert "serve stage 'serve_base' has mode 'target'; server needs a 'speculative' server" in proc.stderr
