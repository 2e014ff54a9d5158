"""bench with engine = "sglang" against the SGLang test double (tests/sglang_double.py):
held-out prompts from prepared data, /flush_cache, greedy /generate, acceptance length
= total completion tokens / total spec_verify_ct, the speed-up against a baseline URL."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

from ops.bench.spec import SPEC, result_line
from ops.spec import EstimateContext
from tests.conftest import ROOT
from tests.sglang_double import Double

PROMPTS = [[1, 2, 3, 4, 5], [9, 8, 7], [11, 12, 13, 14, 15, 16, 17, 18]]


@pytest.fixture
def servers():
    spec = Double(speculative=True, accept_length=3.0, num_draft_tokens=4, step_s=0.002).start()
    base = Double(speculative=False, step_s=0.002).start()
    spec.status = base.status = "Up"
    yield spec, base
    spec.stop()
    base.stop()


def hidden_state_data(root, prompts):
    """extract's layout: each sample's tokens before its first loss-masked one are its prompt."""
    (root / "rows_0-2000").mkdir(parents=True)
    for i, p in enumerate(prompts):
        ids = np.array(p + [100, 101, 102], dtype=np.int64)
        mask = np.array([0] * len(p) + [1, 1, 1], dtype=np.uint8)
        save_file({"input_ids": ids, "loss_mask": mask}, str(root / "rows_0-2000" / f"data_{i}.safetensors"))
    (root / "data_config.json").write_text(json.dumps({"hidden_size": 8, "layer_ids": [1, 2, 3],
                                                       "status": "complete"}))
    return root


def bench(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.bench", "--engine", "sglang", *args],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT))


def test_acceptance_and_speedup_from_held_out_prompts(servers, tmp_path):
    spec, base = servers
    data = hidden_state_data(tmp_path / "hs", PROMPTS)
    proc = bench("--url", spec.url, "--baseline-url", base.url, "--data", str(data), "--num-prompts", "3",
                 "--max-new-tokens", "32", "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert r["engine"] == "sglang" and r["url"] == spec.url and r["baseline_url"] == base.url
    steps = math.ceil(32 / 3.0)          # the double's verify steps per prompt
    assert r["tokens"] == 3 * 32 and r["spec_verify_ct"] == 3 * steps
    assert r["acceptance_length"] == pytest.approx(32 / steps)
    assert [p["acceptance_length"] for p in r["per_prompt"]] == [pytest.approx(32 / steps)] * 3
    assert [p["prompt_tokens"] for p in r["per_prompt"]] == [len(p) for p in PROMPTS]
    assert r["draft_tokens"] == 3 and r["server"]["version"] == "0.5.23"
    # 11 verify steps vs 32 decode steps of 2 ms each: about 2.9x; CPU noise allowed.
    assert r["speedup"] > 1.5 and r["tok_s_speculative"] > r["tok_s_plain"]
    assert r["outputs_match"] is True
    # What was sent: greedy, the prompts' ids, after a flush (warm-up, then the measured pass).
    measured = [q for q in spec.requests if q["sampling_params"]["max_new_tokens"] == 32]
    assert [q["input_ids"] for q in measured] == PROMPTS
    assert all(q["sampling_params"]["temperature"] == 0.0 for q in spec.requests + base.requests)
    assert spec.flushes == 2 and base.flushes == 2
    assert "bench: engine sglang acceptance length 2.91 (96 tokens / 33 verify steps)" in proc.stdout
    assert "progress: prompt 6/6 baseline" in proc.stdout
    line = result_line(r)
    assert line.startswith("engine sglang: acceptance length 2.91 (K=3), ") and "vs baseline" in line


def test_without_baseline_and_from_a_prompts_file(servers, tmp_path):
    spec, _base = servers
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("\n".join(json.dumps({"input_ids": p}) for p in PROMPTS) + "\n")
    proc = bench("--url", spec.url, "--prompts-file", str(pf), "--max-new-tokens", "9",
                 "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert r["acceptance_length"] == pytest.approx(3.0) and r["speedup"] is None and r["outputs_match"] is None
    assert result_line(r).endswith("; no baseline")


def test_a_server_without_speculation_is_refused_clearly(servers, tmp_path):
    _spec, base = servers
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    proc = bench("--url", base.url, "--prompts-file", str(pf), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert f"error: {base.url}: not a speculative server (server_info.speculative_algorithm is None)" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_server_that_is_not_there_is_one_line(tmp_path):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    proc = bench("--url", "http://127.0.0.1:9", "--prompts-file", str(pf), "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: http://127.0.0.1:9/server_info: no answer")


def test_the_lint_says_what_each_engine_needs(tmp_path):
    lint = SPEC.extra["lint"]
    ctx = lambda **p: EstimateContext(root=tmp_path, params=p, target={})  # noqa: E731
    assert [str(x) for x in lint(ctx(engine="sglang"), None)] == [
        "error: engine sglang needs params.server (a speculative serve stage of this pipeline) or params.url "
        "(e.g. http://127.0.0.1:30000)"]
    assert "needs params.drafter" in str(lint(ctx(), None)[0])
    assert lint(ctx(engine="sglang", url="http://x:1", data="d"), None) == []


def test_a_baseline_that_is_down_or_speculative_is_refused_before_any_prompt(servers, tmp_path):
    # Found before the speculative pass (minutes on a real server), not after it.
    spec, _base = servers
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    proc = bench("--url", spec.url, "--baseline-url", "http://127.0.0.1:9", "--prompts-file", str(pf),
                 "--output", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.startswith("error: http://127.0.0.1:9/server_info: no answer")
    assert spec.requests == [] and "progress:" not in proc.stdout
    # The same server twice (or two speculative ones) would report a speed-up of about 1.
    proc = bench("--url", spec.url, "--baseline-url", spec.url, "--prompts-file", str(pf),
                 "--output", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {spec.url}: the baseline is a speculative server (server_info."
                           f"speculative_algorithm is 'EAGLE3'); serve it with mode = \"target\"\n")
    assert spec.requests == []


def test_a_server_that_accepts_and_never_answers_is_one_line_in_seconds(tmp_path):
    import socket
    import time

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)          # the kernel completes the handshake; nobody ever reads
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    t0 = time.monotonic()
    try:
        proc = bench("--url", url, "--prompts-file", str(pf), "--output", str(tmp_path / "out"))
    finally:
        hung.close()
    assert time.monotonic() - t0 < 60          # the default --timeout-s is 600, for one generation
    assert proc.returncode == 2 and proc.stderr == f"error: {url}/server_info: no answer (timed out)\n"
