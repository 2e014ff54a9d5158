"""bench's table (ops/bench/report.py, table.py, figures.py) with the reference decoder on the toy target:
acceptance length and output tok/s per (steps, topk, draft tokens) setting and concurrency, per-position
acceptance, the degenerate-completion share, and the comparison with another engine's bench.json."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from ops.bench.figures import distinct_bigram_ratio  # noqa: E402
from tests.test_op_bench import bench, drafters  # noqa: E402,F401  (assets: tests/conftest.py)

SETTINGS = "3/1/4,5/1/6,7/1/8"


def bigram_ratio(tokens: list[int]) -> float:
    pairs = list(zip(tokens, tokens[1:]))
    return len(set(pairs)) / len(pairs)


def test_a_row_per_setting_and_concurrency(assets, drafters, tmp_path):  # noqa: F811
    code, r = bench(assets, drafters["trained"], tmp_path / "b", "--settings", SETTINGS, "--concurrency", "1,8")
    assert code == 0
    rows = r["table"]
    assert [(x["label"], x["concurrency"]) for x in rows] == [
        (s, c) for s in ("(3,1,4)", "(5,1,6)", "(7,1,8)") for c in (1, 8)]
    for x in rows:
        steps = x["setting"]["steps"]
        assert x["prompts"] == 8 and x["completion_tokens"] == 8 * 24
        assert x["acceptance_length"] == x["completion_tokens"] / x["verify_steps"]
        assert x["tok_s"] == x["completion_tokens"] / x["seconds"]
        # Per position: draft 1 is examined at every verify step; a later one only after its predecessors.
        assert len(x["accept_rate_per_position"]) == steps
        assert x["examined_per_position"][0] == x["verify_steps"]
        for i in range(1, steps):
            assert x["examined_per_position"][i] == x["accepted_per_position"][i - 1]
        assert x["accept_rate_per_position"] == [a / e if e else None for a, e in
                                                 zip(x["accepted_per_position"], x["examined_per_position"])]
        # Each verify step yields its accepted drafts + a bonus; each prompt's prefill one more (up to the cap).
        assert sum(x["accepted_per_position"]) + x["verify_steps"] + 8 >= x["completion_tokens"]
        if x["concurrency"] == 8:
            assert x["differing_from_concurrency_1"] == 0
    # The first row is the main pass (K=3): the same figures as the record's headline.
    assert rows[0]["verify_steps"] == r["verify_forwards"] and rows[0]["acceptance_length"] == r["acceptance_length"]
    # Longer chains accept at least as many tokens per verify step on this drafter.
    by = {x["label"]: x["acceptance_length"] for x in rows if x["concurrency"] == 1}
    assert by["(7,1,8)"] >= by["(3,1,4)"]


def test_degenerate_share_is_counted_from_the_completions(assets, drafters, tmp_path):  # noqa: F811
    code, r = bench(assets, drafters["trained"], tmp_path / "b")
    assert code == 0
    completions = r["completions"]
    assert sorted(completions, key=int) == [str(p) for p in sorted(r["prompts"])]
    low = sorted(int(p) for p, t in completions.items() if bigram_ratio(t) < 0.5)
    d = r["degenerate"]
    assert (d["judged"], d["count"], d["prompts"], d["threshold"]) == (8, len(low), low, 0.5)
    assert d["share"] == len(low) / 8
    assert r["table"][0]["degenerate"] == d


def test_distinct_bigram_ratio_flags_a_loop():
    loop = [5, 6] * 16
    assert distinct_bigram_ratio(loop) == 2 / 31
    assert distinct_bigram_ratio(list(range(32))) == 1.0
    assert distinct_bigram_ratio([1, 2, 3]) is None       # too short to judge


def test_compare_with_another_bench_names_the_differing_completions(assets, drafters, tmp_path):  # noqa: F811
    code, first = bench(assets, drafters["trained"], tmp_path / "a")
    other = dict(first)
    changed = dict(first["completions"])
    victim = sorted(changed)[0]
    changed[victim] = changed[victim][:10]
    other.update(completions=changed, engine="sglang", acceptance_length=3.5)
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, r = bench(assets, drafters["trained"], tmp_path / "b", "--compare", str(tmp_path / "other.json"))
    assert code == 0
    c = r["compared"]
    assert (c["prompts"], c["differing_completions"], c["differing_prompts"]) == (8, 1, [victim])
    assert (c["tokens"], c["tokens_other"]) == (8 * 24, 8 * 24 - 14)
    assert (c["engine_other"], c["acceptance_length_other"]) == ("sglang", 3.5)
    assert c["acceptance_length"] == r["acceptance_length"]


def test_bad_settings_and_compare_are_one_line(assets, drafters, tmp_path, capsys):  # noqa: F811
    from ops.bench.__main__ import main

    base = ["--drafter", str(drafters["trained"]), "--target", str(assets["target"]), "--output", str(tmp_path / "o")]
    assert main(base + ["--settings", "3/2/4"]) == 2
    assert "argument --settings: setting 3/2/4: the reference decoder drafts a chain" in capsys.readouterr().err
    (tmp_path / "x.json").write_text("{}")
    assert main(base + ["--compare", str(tmp_path / "x.json")]) == 2
    assert f"compare {tmp_path / 'x.json'}: key 'completions'" in capsys.readouterr().err
