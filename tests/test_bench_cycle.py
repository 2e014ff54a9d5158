"""bench measures the verify cycle at batch 1 (issue 36 item 5), against the SGLang test double
(tests/sglang_double.py, whose meta_info timings mirror sglang 0.5.23's req_time_stats.py and whose
/metrics counter mirrors its device timer's `sglang:forward_execution_seconds_total{category}`).

cycle = the server's decode time (e2e_latency - first_token_latency) / verify steps; a plain step =
the baseline's decode time / (completion tokens - 1); with the device timer, the verify forward and
a draft step from the counter's growth over the pass. Without SGLang's timings: wall time / verify
steps and wall time / completion tokens."""

from __future__ import annotations

import json

import pytest

from ops.bench.figures import cycle_figures
from ops.bench.spec import result_line
from ops.bench.view import result_view
from tests.sglang_double import Double
from tests.test_op_bench_sglang import bench

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [11, 12, 13, 14, 15, 16, 17, 18]]
STEP_S, DRAFT_S = 0.002, 0.0005


def run(tmp_path, **kw):
    spec = Double(speculative=True, accept_length=3.0, num_steps=3, num_draft_tokens=4, step_s=STEP_S,
                  draft_step_s=DRAFT_S, **kw).start()
    base = Double(speculative=False, step_s=STEP_S, **kw).start()
    spec.status = base.status = "Up"
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("\n".join(json.dumps({"input_ids": p}) for p in PROMPTS) + "\n")
    try:
        proc = bench("--url", spec.url, "--baseline-url", base.url, "--prompts-file", str(pf),
                     "--max-new-tokens", "24", "--output", str(tmp_path / "out"))
    finally:
        spec.stop()
        base.stop()
    assert proc.returncode == 0, proc.stderr
    return proc, json.loads((tmp_path / "out" / "bench.json").read_text())


def test_the_cycle_from_sglangs_timings_and_device_timer(tmp_path):
    proc, r = run(tmp_path, device_timer=True)
    c = r["cycle"]
    assert c["batch"] == 1 and c["source"] == "meta_info" and c["plain_source"] == "meta_info"
    assert c["verify_steps"] == r["spec_verify_ct"] == 3 * 8          # ceil(24 / 3) a prompt
    # The device timer's split is the double's modelled GPU time, exactly.
    assert c["verify_s"] == pytest.approx(STEP_S) and c["draft_s"] == pytest.approx(3 * DRAFT_S)
    assert c["draft_step_s"] == pytest.approx(DRAFT_S) and c["plain_forward_s"] == pytest.approx(STEP_S)
    # The server-side decode time covers at least the modelled sleeps.
    assert c["cycle_s"] >= STEP_S + 3 * DRAFT_S and c["plain_step_s"] >= STEP_S
    assert c["cycle_over_plain_step"] == pytest.approx(c["cycle_s"] / c["plain_step_s"])
    # Per setting: the rows at concurrency 1.
    base_row, spec_row = r["table"]
    assert base_row["step_s"] >= STEP_S and base_row["time_source"] == "meta_info" and "cycle_s" not in base_row
    assert spec_row["cycle_s"] >= STEP_S + 3 * DRAFT_S and spec_row["time_source"] == "meta_info"
    assert spec_row["draft_step_s"] == pytest.approx(DRAFT_S) and spec_row["verify_s"] == pytest.approx(STEP_S)
    # Shown: the bench line, the result line, the console's details and table.
    # The rest of the cycle is the server's host time: what no drafter can buy back.
    assert c["host_s"] == pytest.approx(c["cycle_s"] - c["verify_s"] - c["draft_s"]) and c["host_s"] >= 0
    assert spec_row["host_s"] == pytest.approx(spec_row["cycle_s"] - STEP_S - 3 * DRAFT_S)
    ms = lambda s: f"{1e3 * s:.2f} ms"  # noqa: E731
    words = (f"cycle {ms(c['cycle_s'])} (draft step {ms(DRAFT_S)}, verify {ms(STEP_S)}, host {ms(c['host_s'])}) "
             f"vs plain step {ms(c['plain_step_s'])}")
    assert f"| {words}" in proc.stdout
    assert f", {words}; " in result_line(r) or result_line(r).endswith(f", {words}")
    details = "\n".join(result_view(r).details)
    assert f"batch 1: {words}" in details and "[meta_info]" in details
    assert (f"cycle {1e3 * spec_row['cycle_s']:.2f}ms draft {1e3 * DRAFT_S:.2f}ms "
            f"host {1e3 * spec_row['host_s']:.2f}ms") in details
    # What made the cycle, as the server resolved it (its /server_info).
    assert {k: r["server"][k] for k in ("attention_backend", "disable_overlap_schedule")} == \
        {"attention_backend": "fa3", "disable_overlap_schedule": False}
    assert r["server"]["cuda_graph_config"]["decode"]["backend"] == "full"


def test_without_sglangs_timings_the_cycle_is_timed_around_it(tmp_path):
    # No --enable-metrics: no first_token_latency in meta_info, no /metrics.
    _proc, r = run(tmp_path, metrics=False)
    c = r["cycle"]
    assert c["source"] == "wall" and c["plain_source"] == "wall" and c["device_timer"] is False
    assert c["cycle_s"] == pytest.approx(r["time_speculative_s"] / r["spec_verify_ct"])
    assert c["plain_step_s"] == pytest.approx(r["time_plain_s"] / r["tokens_plain"])
    assert c["draft_step_s"] is None and c["verify_s"] is None and c["host_s"] is None
    assert r["table"][1]["time_source"] == "wall" and "draft_step_s" not in r["table"][1]


def test_cycle_figures_on_a_recorded_pass():
    # benchmarks/results/h200_2026-12-03_session21: (3,1,4) at concurrency 1, 48 prompts, 9418 tokens,
    # 4025 verify steps in 20.53 s; the baseline's 9418 tokens in 15.04 s (wall: no meta_info timings kept).
    c = cycle_figures([(None, 4025, 9418, 20.531300628000054)], [(None, 0, 9418, 15.036086682999894)], 3, None, None)
    assert c["cycle_s"] == pytest.approx(20.5313 / 4025, rel=1e-4)          # 5.10 ms a cycle
    assert c["plain_step_s"] == pytest.approx(15.0361 / 9418, rel=1e-4)     # 1.60 ms a token
    # A cycle costs 3.2 plain steps and yields 2.34 tokens: why that setting was slower than the target alone.
    assert c["cycle_over_plain_step"] == pytest.approx(3.195, abs=1e-3)


def test_host_time_on_the_qwen_h100_pass():
    # benchmarks/results/h100_2026-12-07_qwen_run (out.tgz bench.json): (3,1,4) at concurrency 1, 32 prompts,
    # 6608 tokens in 3904 verify steps; SGLang's decode time 4.381 ms a cycle, its device timer's growth over
    # the pass: target_verify 2.294 ms and the drafter's forwards 0.469 ms a cycle.
    steps = 3904
    c = cycle_figures([(0.00438123606211488 * steps, steps, 6608, 17.78)], [(0.002255108364904583 * 6607, 0, 6608, 15.31)],
                      3, {"target_verify": 0.0022936471238976614 * steps,
                          "eagle_draft": 2 / 3 * 0.00046935450010856606 * steps,
                          "eagle_draft_extend": 1 / 3 * 0.00046935450010856606 * steps}, None)
    assert c["cycle_over_plain_step"] == pytest.approx(1.943, abs=1e-3)
    assert c["verify_s"] + c["draft_s"] == pytest.approx(0.002763, abs=1e-6)     # the GPU's part: 1.22 plain steps
    assert c["host_s"] == pytest.approx(0.001618, abs=1e-6)                       # the host's: 37 % of the cycle
