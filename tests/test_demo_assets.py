"""The demo assets: what they contain, the cache, determinism, and that the
first two stages run on them. Built at a reduced size (fewer conversations
and training steps) so the whole file stays a few seconds long.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.common import run_main
from ops.demo import MARKER, build_demo_assets

REPO = Path(__file__).resolve().parents[1]
SMALL = {"train_steps": 12, "n_conversations": 80}


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    dest = tmp_path_factory.mktemp("demo")
    return dest, build_demo_assets(dest, seed=0, **SMALL)


def files(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_assets_are_a_real_target_and_corpus(demo):
    from transformers import AutoConfig, AutoTokenizer

    dest, result = demo
    assert result["cached"] is False
    assert Path(result["corpus_path"]) == dest / result["corpus"]
    rows = [json.loads(line) for line in (dest / result["corpus"]).read_text().splitlines()]
    assert len(rows) == result["conversations"] == SMALL["n_conversations"]
    assert any("conversations" in r for r in rows) and any("messages" in r for r in rows)
    target = dest / result["target"]
    cfg = AutoConfig.from_pretrained(str(target))
    assert cfg.architectures == ["LlamaForCausalLM"]
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
        result["num_layers"], result["hidden_size"], result["vocab_size"])
    assert (target / "model.safetensors").is_file()
    tok = AutoTokenizer.from_pretrained(str(target))
    assert tok.is_fast and len(tok) == cfg.vocab_size and tok.chat_template
    assert result["draft_vocab_size"] < result["vocab_size"]
    assert len(set(result["layer_ids"])) == 3 and max(result["layer_ids"]) < result["num_layers"]
    train = result["train"]
    assert train["steps"] == SMALL["train_steps"] and train["loss_after"] < train["loss_before"]
    assert json.loads((dest / MARKER).read_text())["status"] == "complete"


def test_second_call_is_served_from_the_cache(demo):
    dest, result = demo
    before = files(dest)
    again = build_demo_assets(dest, seed=0, **SMALL)
    assert again["cached"] is True
    assert {k: v for k, v in again.items() if k != "cached"} == {k: v for k, v in result.items() if k != "cached"}
    assert files(dest) == before          # nothing rewritten: same bytes, same mtimes


def test_deterministic_for_a_seed_and_rebuilt_for_another(demo, tmp_path):
    dest, result = demo
    twin = build_demo_assets(tmp_path / "twin", seed=0, **SMALL)
    assert twin["cached"] is False
    for name in ("data/conversations.jsonl", "target/tokenizer.json", "target/model.safetensors"):
        assert (tmp_path / "twin" / name).read_bytes() == (dest / name).read_bytes(), name
    assert twin["train"]["loss_after"] == result["train"]["loss_after"]
    other = build_demo_assets(tmp_path / "twin", seed=1, **SMALL)
    assert other["cached"] is False and other["seed"] == 1
    assert (tmp_path / "twin" / "data/conversations.jsonl").read_bytes() != (dest / "data/conversations.jsonl").read_bytes()
    assert not (tmp_path / "twin" / "target.building").exists()


def test_prepare_and_vocab_run_on_the_demo(demo, tmp_path):
    from ops.prepare.__main__ import main as prepare_main
    from ops.vocab.__main__ import main as vocab_main

    dest, result = demo
    target = str(dest / result["target"])
    assert run_main(prepare_main, ["--input", str(dest / result["corpus"]), "--output", str(tmp_path / "prep"),
                                   "--target", target, "--max-seq-len", str(result["max_seq_len"])]) == 0
    summary = json.loads((tmp_path / "prep" / "summary.json").read_text())
    assert summary["truncated"] > 0 and summary["samples"] == result["conversations"]
    assert run_main(vocab_main, ["--input", str(tmp_path / "prep"), "--output", str(tmp_path / "vocab"),
                                 "--target", target, "--draft-vocab-size", str(result["draft_vocab_size"])]) == 0
    info = json.loads((tmp_path / "vocab" / "vocab.json").read_text())
    assert info["target_vocab_size"] == result["vocab_size"] and 0.5 < info["coverage"] <= 1.0


def test_importing_the_builder_imports_no_torch():
    code = "import sys, ops.demo; sys.exit(any(m in sys.modules for m in ('torch', 'transformers', 'tokenizers')))"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
