"""bench with engine = "sglang" against the SGLang test double (tests/sglang_double.py):
held-out prompts from prepared data, /flush_cache, greedy /generate, acceptance length
= total completion tokens / total spec_verify_ct, the speed-up against a baseline URL."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import save_file

from ops.bench.spec import SPEC, result_line
from ops.spec import EstimateContext
from tests.conftest import ROOT, wait_for
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
    assert [q["input_ids"] for q in measured] == PROMPTS * 2       # the measured pass, then the table's row
    assert all(q["sampling_params"]["temperature"] == 0.0 for q in spec.requests + base.requests)
    # warm-up, measured pass, the table's row; the baseline's x8 pass: its own drift (the numerical floor)
    assert spec.flushes == 3 and base.flushes == 4
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


def test_a_server_that_is_not_there_is_one_line_at_the_readiness_deadline(tmp_path):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    proc = bench("--url", "http://127.0.0.1:9", "--prompts-file", str(pf), "--output", str(tmp_path / "out"),
                 "--ready-timeout-s", "1")
    assert proc.returncode == 2
    assert proc.stderr == ("error: http://127.0.0.1:9: not ready within ready_timeout_s 1 s: /ready: connection "
                           "refused (nothing listens on the port yet)\n")


def test_the_lint_says_what_each_engine_needs(tmp_path):
    lint = SPEC.lint
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
                 "--output", str(tmp_path / "out"), "--ready-timeout-s", "1")
    assert proc.returncode == 2 and proc.stderr.startswith("error: http://127.0.0.1:9: not ready within ")
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

    hung = socket.socket()
    hung.bind(("127.0.0.1", 0))
    hung.listen(8)          # the kernel completes the handshake; nobody ever reads
    url = f"http://127.0.0.1:{hung.getsockname()[1]}"
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": PROMPTS[0]}) + "\n")
    try:
        # bench's own timeout (120 s) is far below the default --timeout-s (600, for one
        # generation): the ready timeout, not the generation's, ended it (its line below).
        proc = bench("--url", url, "--prompts-file", str(pf), "--output", str(tmp_path / "out"),
                     "--ready-timeout-s", "3")
    finally:
        hung.close()
    assert proc.returncode == 2
    assert proc.stderr == f"error: {url}: not ready within ready_timeout_s 3 s: /ready: no answer within 3 s (timed out)\n"


# --- waiting for readiness before the first probe --------------------------------------

def _prompts(tmp_path):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("\n".join(json.dumps({"input_ids": p}) for p in PROMPTS) + "\n")
    return pf


def warm_up_later(double: Double, after_s: float):
    """SGLang's start-up (http_server.py _execute_server_warmup): the warm-up /generate,
    whose first forward compiles the kernels (the double's first_forward_s), then Up."""
    import threading
    import urllib.request

    def run():
        time.sleep(after_s)
        req = urllib.request.Request(double.url + "/generate", data=json.dumps(
            {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 8}}).encode(),
            headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()
        double.status = "Up"
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_bench_waits_while_the_server_compiles_its_kernels(tmp_path):
    # The run: the first start compiled kernels for minutes; /server_info (a scheduler
    # round trip) answered nothing meanwhile, and the bench's 10 s probe gave up.
    d = Double(speculative=True, accept_length=3.0, first_forward_s=13.0).start()
    try:
        warm_up_later(d, 0.0)
        proc = bench("--url", d.url, "--prompts-file", str(_prompts(tmp_path)), "--max-new-tokens", "9",
                     "--output", str(tmp_path / "out"), "--ready-timeout-s", "60")
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    assert f"bench: waiting for {d.url} to be ready: /ready answered 503 (0 s of 60 s)" in proc.stdout
    assert f"bench: {d.url} ready after " in proc.stdout
    # The first probe came after the server was up.
    assert d.paths.index("/server_info") > max(i for i, p in enumerate(d.paths) if p == "/ready")
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["acceptance_length"] == pytest.approx(3.0)


def test_bench_waits_for_a_port_that_is_not_open_yet(tmp_path):
    import socket
    import threading

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started: list[Double] = []
    said = tmp_path / "bench.out"
    refused = "/ready: connection refused (nothing listens on the port yet) (0 s of 60 s)"

    def later():
        # The port opens once bench said it found it closed (the weights load before SGLang
        # binds its port): an event, not a fixed 2 s that a slow start of bench could outlast.
        wait_for(lambda: refused in said.read_text(), timeout=60)
        d = Double(port=port, speculative=True).start()
        d.status = "Up"
        started.append(d)
    t = threading.Thread(target=later, daemon=True)
    try:
        with open(said, "w") as out, open(tmp_path / "bench.err", "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "ops.bench", "--engine", "sglang", "--url",
                                     f"http://127.0.0.1:{port}", "--prompts-file", str(_prompts(tmp_path)),
                                     "--max-new-tokens", "9", "--output", str(tmp_path / "out"),
                                     "--ready-timeout-s", "60"], stdout=out, stderr=err, cwd=str(ROOT),
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"))
            t.start()
            code = proc.wait(timeout=120)
    finally:
        t.join()
        if started:
            started[0].stop()
    assert code == 0, (tmp_path / "bench.err").read_text()
    assert refused in said.read_text()


def test_bench_waits_on_a_server_without_ready_through_health_generate(tmp_path):
    d = Double(speculative=True, accept_length=2.4, version="0.5.17", ready_route=False).start()
    base = Double(speculative=False, version="0.5.17", ready_route=False).start()
    base.status = "Up"
    try:
        warm_up_later(d, 2.5)
        proc = bench("--url", d.url, "--baseline-url", base.url, "--prompts-file", str(_prompts(tmp_path)),
                     "--max-new-tokens", "12", "--output", str(tmp_path / "out"), "--ready-timeout-s", "60")
    finally:
        d.stop()
        base.stop()
    assert proc.returncode == 0, proc.stderr
    assert (f"bench: waiting for {d.url} to be ready: /health_generate answered 503 (this server has no /ready) "
            f"(0 s of 60 s)") in proc.stdout
    assert f"ready after" in proc.stdout and "/health_generate answered 200" in proc.stdout
    r = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert r["server"]["version"] == "0.5.17" and r["outputs_match"] is True


def test_a_server_not_ready_by_the_deadline_is_one_line_and_no_prompt_is_sent(tmp_path):
    d = Double(speculative=True).start()       # Starting, for ever
    try:
        proc = bench("--url", d.url, "--prompts-file", str(_prompts(tmp_path)), "--output", str(tmp_path / "out"),
                     "--ready-timeout-s", "2.5")
    finally:
        d.stop()
    assert proc.returncode == 2
    assert proc.stderr == f"error: {d.url}: not ready within ready_timeout_s 2.5 s: /ready answered 503\n"
    assert d.requests == [] and "/server_info" not in d.paths and "progress:" not in proc.stdout
    assert not (tmp_path / "out" / "bench.json").exists()


def test_ready_timeout_s_must_be_positive(tmp_path):
    proc = bench("--url", "http://127.0.0.1:9", "--prompts-file", str(_prompts(tmp_path)),
                 "--output", str(tmp_path / "out"), "--ready-timeout-s", "0")
    # The bound is the param's (ops/bench/spec.py): argparse refuses it here, the
    # console at `run` (before the lint), in the same words.
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1] == "python -m ops.bench: error: argument --ready-timeout-s: expected > 0, got 0.0"
    assert SPEC.param_type_error("ready_timeout_s", -5) == "expected > 0, got -5"
