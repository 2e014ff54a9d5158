"""bench reports code prompts and chat prompts apart (issue 36 item 7; ops/bench/kinds.py): a prompt
is code when it or the target's own answer holds a fenced block. On the recorded Qwen2.5-Coder-1.5B
pass (H100, SGLang 0.5.23) and through bench against the SGLang double with a real tokenizer."""

from __future__ import annotations

import json
import subprocess

import pytest

from ops.bench.kinds import prompt_kind, split, words
from tests.conftest import ROOT
from tests.sglang_double import Double


def bench(capsys, *argv: str) -> subprocess.CompletedProcess:
    """ops.bench's main() in this process, as `python -m ops.bench` runs it (its output and the
    bench.json are what these tests read; a process would import torch and transformers again)."""
    from ops.bench.__main__ import main

    code = main(["--engine", "sglang", *argv])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)

RECORDED = ROOT / "tests" / "data" / "qwen_h100_bench_per_prompt.json"


def test_the_rule():
    assert prompt_kind("Fix this:\n```python\nprint(1\n```", "Sure.") == "code"
    assert prompt_kind("Sort a list in Python", "Use:\n```python\nsorted(xs)\n```") == "code"
    assert prompt_kind("name a river", "The Nile.") == "chat"
    assert prompt_kind("what does `x` mean", "an inline `x` is not a block") == "chat"


def test_the_split_of_the_recorded_qwen_pass():
    rows = json.loads(RECORDED.read_text())["per_prompt"]
    kinds = {r["prompt"]: r["kind"] for r in rows}
    out = split(rows, kinds)
    code, chat = out["kinds"]["code"], out["kinds"]["chat"]
    assert (code["prompts"], chat["prompts"]) == (16, 16)
    assert code["completion_tokens"] + chat["completion_tokens"] == 6608
    assert code["verify_steps"] + chat["verify_steps"] == 3904
    # The drafter accepts more on code than on chat: 1.75 against 1.61 (1.69 over all 32).
    assert code["acceptance_length"] == pytest.approx(1.751, abs=1e-3)
    assert chat["acceptance_length"] == pytest.approx(1.610, abs=1e-3)
    assert code["speedup"] is None              # this recording kept no per-prompt baseline times
    assert words(out) == "code 16: AL 1.75; chat 16: AL 1.61"


def test_bench_splits_by_kind_with_the_targets_tokenizer(smollm2_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    rows = [{"prompt": "Why does this fail?\n```python\nprint(1\n```"}, {"prompt": "name a river"},
            {"prompt": "What is the capital of France?"}]
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = Double(speculative=True, accept_length=3.0, num_draft_tokens=4, step_s=0.001).start()
    base = Double(speculative=False, step_s=0.001).start()
    spec.status = base.status = "Up"
    try:
        proc = bench(capsys, "--url", spec.url, "--baseline-url", base.url, "--prompts-file", str(pf),
                     "--target", str(smollm2_dir), "--max-new-tokens", "12", "--num-prompts", "3",
                     "--output", str(tmp_path / "out"))
    finally:
        spec.stop()
        base.stop()
    assert proc.returncode == 0, proc.stderr
    r = json.loads((tmp_path / "out" / "bench.json").read_text())
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    texts = {1: rows[0]["prompt"], 2: rows[1]["prompt"], 3: rows[2]["prompt"]}
    want = {i: prompt_kind(texts[i], tok.decode(r["baseline_completions"][str(i)])) for i in texts}
    assert want[1] == "code"
    got = r["by_kind"]["kinds"]
    assert sum(f["prompts"] for f in got.values()) == 3
    assert got["code"]["prompts"] == sum(k == "code" for k in want.values())
    for f in got.values():
        assert f["speedup"] == pytest.approx(f["tok_s_speculative"] / f["tok_s_plain"])
        assert f["acceptance_length"] == pytest.approx(f["completion_tokens"] / f["verify_steps"])
    assert f"bench: by kind ({r['by_kind']['rule']}): {words(r['by_kind'])}" in proc.stdout


def test_without_a_tokenizer_there_is_no_split(tmp_path, capsys):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n")
    d = Double(speculative=True, step_s=0.001).start()
    d.status = "Up"
    try:
        proc = bench(capsys, "--url", d.url, "--prompts-file", str(pf), "--max-new-tokens", "4",
                     "--output", str(tmp_path / "out"))
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    assert "by_kind" not in json.loads((tmp_path / "out" / "bench.json").read_text())
    assert "by kind" not in proc.stdout


def test_a_target_without_a_tokenizer_leaves_the_split_out_and_the_bench_stands(tmp_path, capsys):
    # A pipeline's [target] may be a name or a folder of weights only: bench passes --target all the same.
    pf = tmp_path / "prompts.jsonl"
    pf.write_text(json.dumps({"input_ids": [1, 2, 3, 4]}) + "\n")
    weights_only = tmp_path / "target"
    weights_only.mkdir()
    d = Double(speculative=True, step_s=0.001).start()
    d.status = "Up"
    try:
        procs = [bench(capsys, "--url", d.url, "--prompts-file", str(pf), "--max-new-tokens", "4",
                       "--target", target, "--output", str(tmp_path / f"out{i}"))
                 for i, target in enumerate([str(tmp_path / "absent"), str(weights_only)])]
    finally:
        d.stop()
    for i, proc in enumerate(procs):
        assert proc.returncode == 0, proc.stderr
        assert "by_kind" not in json.loads((tmp_path / f"out{i}" / "bench.json").read_text())
    assert "bench: no code/chat split: the target" in procs[0].stdout and "not a local folder" in procs[0].stdout
    assert f"bench: no code/chat split: {weights_only}: no tokenizer" in procs[1].stdout
