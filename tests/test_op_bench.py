"""ops.bench: speculative greedy output equals plain greedy output for any
drafter (trained, untrained, miswired), and the acceptance length separates a
trained drafter from an untrained or miswired one on a learnable toy target.

Measured on this toy (64 samples, 8 held out, 84 steps, K=3, 24 new tokens,
8 prompts), acceptance length as SGLang counts it (completion tokens / verify
steps): trained 2.13 (192/90), aux ids off by one 1.54 (192/125), d2t zeroed
1.04 (192/184), untrained 1.04 (no draft ever accepted: each verify step yields
its bonus token, and each prompt's prefill one more); `pytest -s
tests/test_op_bench.py` prints the bench lines. The margin
asserted below (0.5) sits well inside that gap and well above noise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


torch.set_num_threads(1)
MARGIN = 0.5


def train_and_export(assets, root: Path, name: str, *extra) -> Path:
    from ops.export.__main__ import main as export
    from ops.train.__main__ import main as train

    assert train(["--data", str(assets["data"]), "--vocab", str(assets["vocab"]), "--target", str(assets["target"]),
                  "--output", str(root / name), "--workers", "0", "--token-budget", "256", "--ttt-steps", "3",
                  "--holdout", "8", "--log-every", "100", "--save-every", "1000", *extra]) == 0
    out = root / f"{name}_export"
    assert export(["--checkpoint", str(root / name), "--output", str(out), "--dtype", "float32"]) == 0
    return out


@pytest.fixture(scope="module")
def drafters(assets, tmp_path_factory):
    root = tmp_path_factory.mktemp("drafters")
    return {"trained": train_and_export(assets, root, "trained", "--lr", "3e-3", "--epochs", "12"),
            # lr 0: one real optimizer step that leaves the initial weights as they are
            "untrained": train_and_export(assets, root, "untrained", "--lr", "0", "--max-steps", "1")}


def bench(assets, drafter: Path, out: Path, *extra) -> tuple[int, dict]:
    from ops.bench.__main__ import main

    code = main(["--drafter", str(drafter), "--target", str(assets["target"]), "--output", str(out),
                 "--draft-tokens", "3", "--max-new-tokens", "24", "--num-prompts", "8", *extra])
    return code, json.loads((out / "bench.json").read_text())


def test_trained_drafter_accepts_more_and_output_equals_greedy(assets, drafters, tmp_path, capsys):
    code, trained = bench(assets, drafters["trained"], tmp_path / "trained")
    assert code == 0 and trained["outputs_match"]
    code, untrained = bench(assets, drafters["untrained"], tmp_path / "untrained")
    assert code == 0 and untrained["outputs_match"]
    # The prompts are the held-out samples training recorded, cut before the answer.
    info = json.loads((drafters["trained"] / "export_info.json").read_text())
    assert trained["prompts"] == info["holdout"][:8] and len(trained["prompts"]) == 8
    assert trained["acceptance_length"] >= untrained["acceptance_length"] + MARGIN, (trained, untrained)
    assert 1.0 <= untrained["acceptance_length"] <= 4.0
    assert len(trained["accept_rate_per_position"]) == 3
    # Every token came from a target forward: tokens = prefill token + verify output, capped.
    assert trained["target_forwards_speculative"] < trained["target_forwards_plain"]
    assert trained["speedup"] > 0 and trained["tokens"] == 8 * 24
    # Acceptance length is SGLang's: completion tokens / verify steps, the bonus token included.
    for r in (trained, untrained):
        assert r["acceptance_length"] == r["completion_tokens"] / r["verify_forwards"]
        assert r["completion_tokens"] == r["tokens"]           # outputs match: as many tokens as greedy's
    # No draft accepted: each verify step yields its bonus token, and each prompt's prefill one more.
    assert untrained["completion_tokens"] == untrained["verify_forwards"] + 8
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("bench: acceptance length")]
    assert len(lines) == 2 and "greedy match 8/8" in lines[0]
    assert f"(completion tokens / verify steps: {trained['completion_tokens']}/{trained['verify_forwards']}, K=3)" \
        in lines[0]


def test_miswired_drafters_still_decode_exactly_but_accept_less(assets, drafters, tmp_path):
    """Aux layers off by one (config ids shifted) or d2t misapplied (draft ids
    taken as target ids): greedy equality holds, acceptance collapses."""
    import shutil

    from safetensors.torch import load_file, save_file

    _, good = bench(assets, drafters["trained"], tmp_path / "good")

    shifted = tmp_path / "shifted"
    shutil.copytree(drafters["trained"], shifted)
    cfg_path = shifted / "sglang" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in
                                                               cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    cfg_path.write_text(json.dumps(cfg))
    code, off = bench(assets, shifted / "sglang", tmp_path / "off")
    assert code == 0 and off["outputs_match"] and off["aux_layer_ids"] == [1, 2, 3]

    nod2t = tmp_path / "nod2t"
    shutil.copytree(drafters["trained"], nod2t)
    w = load_file(str(nod2t / "sglang" / "model.safetensors"))
    w["d2t"] = torch.zeros_like(w["d2t"])
    save_file(w, str(nod2t / "sglang" / "model.safetensors"))
    code, bad = bench(assets, nod2t / "sglang", tmp_path / "bad")
    assert code == 0 and bad["outputs_match"]

    for wrong in (off, bad):
        assert good["acceptance_length"] >= wrong["acceptance_length"] + MARGIN, (good, wrong)


def test_bad_prompts_file_is_named(assets, drafters, tmp_path, capsys):
    from ops.bench.__main__ import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 4, 12]}\n{"text": "no ids"}\n')
    code = main(["--drafter", str(drafters["trained"]), "--target", str(assets["target"]),
                 "--output", str(tmp_path / "o"), "--prompts-file", str(prompts)])
    assert code == 2
    assert f"{prompts}:2" in capsys.readouterr().err
