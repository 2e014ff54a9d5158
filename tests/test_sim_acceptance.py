"""Simulated acceptance length (issue 12 s3, issue 22 item 3).

The formula 1 + sum_k prod_{j<=k} acc_j on hand-computed cases; the walk that
counts bench's verify steps over an answer (metrics.chain_verifies) by hand;
train writes the figure into every metrics.jsonl record and the train stage's
result line, from the held-out samples (bench's count of a decode over their
answers) when it holds samples out; on the toy target that figure comes within
0.2 of the acceptance length the reference bench measures (completion tokens /
verify steps, bonus token included) on those held-out prompts, and equals it
exactly when the held-out answers are the target's own greedy output.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ops.drafter.metrics import chain_verifies, from_record, simulated_acceptance_length


def test_formula_by_hand():
    assert simulated_acceptance_length([]) == 1.0
    assert simulated_acceptance_length([0.0, 1.0, 1.0]) == 1.0      # the chain stops at the first miss
    assert simulated_acceptance_length([1.0, 1.0, 1.0]) == 4.0      # K + 1: every draft and the bonus
    assert math.isclose(simulated_acceptance_length([0.8, 0.5, 0.25]), 1 + 0.8 + 0.4 + 0.1)
    assert math.isclose(simulated_acceptance_length([0.9] * 7), 1 + sum(0.9 ** k for k in range(1, 8)))
    for bad in ([1.2], [0.5, -0.1], [float("nan")]):
        with pytest.raises(ValueError, match="not in"):
            simulated_acceptance_length(bad)


def test_chain_verifies_by_hand():
    # accepted[i]: drafts accepted when the chain drafts after token i of the turn.
    assert chain_verifies([]) == 0                      # a one-token answer: the prefill's token alone
    assert chain_verifies([0, 0, 0]) == 3               # nothing accepted: one token a verify
    assert chain_verifies([3, 0, 0, 0, 0]) == 2         # 4 tokens, then the last one: 6 tokens / 2 verifies
    assert chain_verifies([1, 9, 2, 0, 3, 0]) == 3      # visits 0, 2, 5; the drafts made at 1, 3, 4 never count
    assert chain_verifies([3] * 8) == 2                 # the last verify's tokens past the answer's end are cut


def test_turns_are_the_loss_masked_runs():
    from ops.train.heldout import turns

    assert turns([0, 0, 1, 1, 1, 0, 0, 1, 1]) == [(2, 4), (7, 8)]
    assert turns([0, 0]) == [] and turns([1]) == [(0, 0)]


def test_from_record_prefers_the_field_and_falls_back_to_acc():
    assert from_record({"simulated_acceptance_length": 2.5, "acc": [0.0]}) == 2.5
    assert math.isclose(from_record({"acc": [0.5, 0.5]}), 1.75)     # records written before the field
    assert from_record({"acc": []}) is None and from_record({}) is None
    assert from_record({"acc": ["x"]}) is None


def test_result_line_says_it():
    from ops.train.spec import result_line

    line = result_line({"step": 10, "total": 20, "loss": 1.0, "acc": [0.8, 0.5]})
    assert line.endswith("accuracy per step 0.80/0.50, simulated AL 2.20"), line
    held = {"tokens": 30, "verifies": 12, "by_depth": [2.0, 2.5], "acc": [0.7, 0.4]}
    line = result_line({"step": 10, "total": 20, "loss": 1.0, "acc": [0.8, 0.5], "heldout": held,
                        "simulated_acceptance_length": 2.5})
    assert line.endswith("accuracy per step 0.80/0.50, simulated AL 2.50 on held-out samples"), line


# ---------------------------------------------------------------- against bench
torch_needed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("torch") is None, reason="needs torch (the pipeline extra)")

# Measured on the toy target (64 samples, 8 held out, K = 3, 24 new tokens, the 8
# held-out prompts; deterministic on CPU): the last record's figure (the held-out
# walk) vs bench's acceptance length; in brackets the formula on the held-out
# per-step accuracies and the last training window's figure (before issue 22 the record's):
#   lr 3e-3, 12 epochs: 2.271 (193 / 85) vs 2.157 (192 / 89)   [2.400, 3.39]
#   lr 3e-3, 3 epochs:  1.379 (193 / 140) vs 1.381 (192 / 139) [1.399, 1.60]
#   lr 0, 1 step:       1.043 (193 / 185) vs 1.043 (192 / 184) [1.000, 1.01]
# What is left is the text: the walk decodes the corpus' answers, bench the target's
# own greedy continuation (test_heldout_walk_is_bench_on_the_targets_own_answers:
# equal to the count there). TOLERANCE is issue 22's; the training window's figure
# (1.23 over bench on the first) and the formula on held-out accuracies fail it.
TOLERANCE = 0.2


def _train_export_bench(assets: dict, out: Path, extra: list[str], k: int = 3, new_tokens: int = 24):
    """(metrics.jsonl's records, bench.json) of train -> export -> bench on the toy assets."""
    from ops.bench.__main__ import main as bench
    from ops.export.__main__ import main as export
    from ops.train.__main__ import main as train

    run = out / "run"
    assert train(["--data", str(assets["data"]), "--vocab", str(assets["vocab"]), "--target", str(assets["target"]),
                  "--output", str(run), "--workers", "0", "--token-budget", "256", "--ttt-steps", str(k),
                  "--holdout", "8", "--log-every", "5", "--save-every", "1000", *extra]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    exported = out / "export"
    assert export(["--checkpoint", str(run), "--output", str(exported), "--dtype", "float32"]) == 0
    assert bench(["--drafter", str(exported), "--target", str(assets["target"]), "--output", str(out / "b"),
                  "--draft-tokens", str(k), "--max-new-tokens", str(new_tokens), "--num-prompts", "8"]) == 0
    return records, json.loads((out / "b" / "bench.json").read_text())


@torch_needed
@pytest.mark.slow
@pytest.mark.parametrize("name,extra", [
    ("trained", ["--lr", "3e-3", "--epochs", "12"]),
    ("partly", ["--lr", "3e-3", "--epochs", "3"]),
    ("untrained", ["--lr", "0", "--max-steps", "1"]),
])
def test_simulated_from_heldout_matches_bench(assets, tmp_path, name, extra, capsys):
    import torch

    from ops.train.spec import SPEC

    torch.set_num_threads(1)
    records, result = _train_export_bench(assets, tmp_path, extra)
    # Every record carries the figure: the held-out walk's tokens / verify steps; the stage's line says the last.
    for rec in records:
        held = rec["heldout"]
        assert held["tokens"] > 0 and len(held["acc"]) == len(rec["acc"]) == 3, rec
        assert math.isclose(rec["simulated_acceptance_length"], held["tokens"] / held["verifies"],
                            abs_tol=1e-3), rec
    last = records[-1]
    assert f"simulated AL {last['simulated_acceptance_length']:.2f}" in SPEC.result_line(last)
    measured = result["acceptance_length"]
    with capsys.disabled():
        print(f"\n{name}: simulated {last['simulated_acceptance_length']:.3f} "
              f"({last['heldout']['tokens']} / {last['heldout']['verifies']}), bench {measured:.3f} "
              f"({result['completion_tokens']} / {result['verify_forwards']}); formula on held-out accuracies "
              f"{simulated_acceptance_length(last['heldout']['acc']):.3f}, on the training window's "
              f"{simulated_acceptance_length(last['acc']):.3f}")
    assert abs(last["simulated_acceptance_length"] - measured) <= TOLERANCE, (name, last, measured)
    # The formula on held-out accuracies, the figure before the walk, stays within issue 12's 0.35.
    assert abs(simulated_acceptance_length(last["heldout"]["acc"]) - measured) <= 0.35, (name, last, measured)


@torch_needed
@pytest.mark.slow
def test_heldout_walk_is_bench_on_the_targets_own_answers(assets, tmp_path, capsys):
    """With answers the target wrote itself (greedy, as bench decodes), the held-out
    walk is bench's decode: the same completion tokens and verify steps."""
    import torch
    from transformers import AutoModelForCausalLM

    from ops.drafter import toy

    torch.set_num_threads(1)
    new_tokens = 24
    target = AutoModelForCausalLM.from_pretrained(assets["target"], dtype=torch.float32).eval()
    samples = []
    with torch.no_grad():
        for ids, _mask in toy.make_corpus(64, seed=11):
            prompt = ids[:3]
            out = target.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                  eos_token_id=toy.EOS, pad_token_id=toy.EOS)[0, 3:].tolist()
            samples.append((prompt + out, [0] * 3 + [1] * len(out)))
    own = {"target": assets["target"], "data": tmp_path / "hidden_states", "vocab": tmp_path / "vocab"}
    toy.extract(own["target"], samples, own["data"], [0, 1, 2])
    toy.build_vocab(samples, own["vocab"], 80)
    records, result = _train_export_bench(own, tmp_path, ["--lr", "3e-3", "--epochs", "12"], new_tokens=new_tokens)
    held = records[-1]["heldout"]
    with capsys.disabled():
        print(f"\non the target's own answers: held-out walk {held['tokens']} / {held['verifies']}, bench "
              f"{result['completion_tokens']} / {result['verify_forwards']}")
    assert result["outputs_match"] is True
    assert (held["tokens"], held["verifies"]) == (result["completion_tokens"], result["verify_forwards"])
    assert 1.2 < result["acceptance_length"] < 3.8      # a drafter that is neither useless nor perfect
    # A bench at a smaller depth (draft_tokens 2 of the drafter trained at ttt_steps 3): by_depth[1].
    from ops.bench.__main__ import main as bench

    assert bench(["--drafter", str(tmp_path / "export"), "--target", str(own["target"]), "--output",
                  str(tmp_path / "b2"), "--draft-tokens", "2", "--max-new-tokens", str(new_tokens),
                  "--num-prompts", "8"]) == 0
    shallow = json.loads((tmp_path / "b2" / "bench.json").read_text())
    assert held["by_depth"][-1] == pytest.approx(records[-1]["simulated_acceptance_length"], abs=1e-4)
    assert held["by_depth"][1] == pytest.approx(shallow["acceptance_length"], abs=1e-4), (held, shallow)
