"""vocab: the draft vocabulary rule, d2t/t2d consistency, coverage, padding, bad input.

Inputs are prepare outputs written with prepare's own writer from arrays
built by hand (so every count is known), plus one real prepare -> vocab run
as subprocesses through the specs' argv.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from ops.common import run_main
from ops.prepare.output import write_samples, write_summary
from ops.spec import EstimateContext
from ops.vocab.__main__ import main as vocab_main
from ops.vocab.spec import SPEC

REPO = Path(__file__).resolve().parents[1]


def fake_prepare(out: Path, samples: list[tuple[list[int], list[int]]], tokenizer: str = "") -> Path:
    out.mkdir(parents=True)
    write_samples(out, [np.asarray(i, np.int32) for i, _ in samples],
                  [np.asarray(m, np.uint8) for _, m in samples], list(range(1, len(samples) + 1)))
    write_summary(out, {"status": "complete", "samples": len(samples), "tokenizer": tokenizer})
    return out


def run(args) -> int:
    return run_main(vocab_main, [str(a) for a in args], prog="vocab")


def load(out: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    t = load_file(str(out / "vocab.safetensors"))
    return t["d2t"], t["t2d"], json.loads((out / "vocab.json").read_text())


def test_most_frequent_masked_ids_ties_by_id_and_coverage(tmp_path):
    # masked counts: 7 -> 5, 3 -> 3, 9 -> 3, 20 -> 2, 1 -> 1, 4 -> 1; unmasked ids do not count
    samples = [
        ([0, 7, 7, 7, 3, 3, 15, 15, 15, 15], [0, 1, 1, 1, 1, 1, 0, 0, 0, 0]),
        ([0, 9, 9, 9, 20, 20, 7, 7, 1, 4, 3], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]),
    ]
    src = fake_prepare(tmp_path / "prep", samples)
    assert run(["--input", src, "--output", tmp_path / "v", "--draft-vocab-size", 4,
                "--target-vocab-size", 32]) == 0
    d2t, t2d, info = load(tmp_path / "v")
    # top 4 by count: 7 (5), then 3 and 9 (3 each, 3 first by id), then 20 (2); 1 and 4 are left out
    assert d2t.dtype == np.int64 and t2d.dtype == np.bool_
    assert (np.arange(4) + d2t).tolist() == [3, 7, 9, 20]
    assert t2d.shape == (32,) and np.flatnonzero(t2d).tolist() == [3, 7, 9, 20]
    masked = Counter(i for ids, m in samples for i, k in zip(ids, m) if k)
    hand = sum(masked[i] for i in (3, 7, 9, 20)) / sum(masked.values())
    assert info["coverage"] == pytest.approx(hand, abs=1e-6) and hand == pytest.approx(13 / 15)
    assert info["distinct_masked_ids"] == 6 and info["padded"] == 0
    assert info["draft_vocab_size"] == 4 and info["target_vocab_size"] == 32
    assert info["status"] == "complete"


def test_padding_with_lowest_unused_ids_and_cap_at_target(tmp_path, capsys):
    src = fake_prepare(tmp_path / "prep", [([5, 2, 8, 8], [1, 1, 1, 0])])
    assert run(["--input", src, "--output", tmp_path / "v", "--draft-vocab-size", 6,
                "--target-vocab-size", 10]) == 0
    d2t, t2d, info = load(tmp_path / "v")
    # 5, 2 and the first 8 are masked; the lowest unused ids 0, 1, 3 pad the rest
    assert (np.arange(6) + d2t).tolist() == [0, 1, 2, 3, 5, 8]
    assert info["padded"] == 3 and info["distinct_masked_ids"] == 3 and info["coverage"] == 1.0
    assert "coverage 100.00%" in capsys.readouterr().out
    # a draft larger than the target is capped at the target's size
    assert run(["--input", src, "--output", tmp_path / "cap", "--draft-vocab-size", 50,
                "--target-vocab-size", 10]) == 0
    d2t, t2d, info = load(tmp_path / "cap")
    assert info["draft_vocab_size"] == 10 and t2d.all() and (d2t == 0).all()


def test_target_vocab_from_the_target_config(tmp_path):
    src = fake_prepare(tmp_path / "prep", [([1, 2, 3], [0, 1, 1])])
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"vocab_size": 40}))
    assert run(["--input", src, "--output", tmp_path / "v", "--target", target, "--draft-vocab-size", 8]) == 0
    d2t, t2d, info = load(tmp_path / "v")
    assert t2d.shape == (40,) and info["target_vocab_size"] == 40
    assert (np.arange(8) + d2t).tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    ctx = EstimateContext(root=tmp_path, params={"draft_vocab_size": 8}, target={"path": "target"})
    assert SPEC.estimate_bytes(ctx) >= (tmp_path / "v" / "vocab.safetensors").stat().st_size


def test_bad_inputs(tmp_path, capsys):
    assert run(["--input", tmp_path / "nothing", "--output", tmp_path / "v", "--target-vocab-size", 10]) == 2
    assert f"input {tmp_path / 'nothing'}: no complete prepare output" in capsys.readouterr().err
    src = fake_prepare(tmp_path / "prep", [([1, 12], [1, 1])])
    assert run(["--input", src, "--output", tmp_path / "v", "--target-vocab-size", 10]) == 2
    assert "token id 12 is outside the target vocabulary of 10" in capsys.readouterr().err
    assert run(["--input", src, "--output", tmp_path / "v", "--target", tmp_path / "no-target"]) == 2
    assert f"target directory {tmp_path / 'no-target'}: no such directory" in capsys.readouterr().err
    assert not (tmp_path / "v" / "vocab.json").exists()


@pytest.mark.slow  # two stage subprocesses, each importing transformers
def test_prepare_then_vocab_as_programs(tmp_path):
    """The real pipeline's first two stages through their specs' argv."""
    from ops.demo.corpus import generate_rows, row_texts, write_corpus
    from ops.demo.tokenizer import build_tokenizer, save_tokenizer
    from ops.prepare.spec import SPEC as PREPARE

    rows = generate_rows(seed=4, n=80)
    write_corpus(tmp_path / "in.jsonl", rows)
    save_tokenizer(build_tokenizer([t for r in rows for t in row_texts(r)], vocab_size=300), tmp_path / "target")
    argv = PREPARE.argv({"input": "in.jsonl", "output": "prep"}, target_path="target", python=sys.executable)
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    argv = SPEC.argv({"input": "prep", "output": "vocab", "draft_vocab_size": 60}, target_path="target",
                     python=sys.executable)
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    arr = load_file(str(tmp_path / "prep" / "samples.safetensors"))
    d2t, t2d, info = load(tmp_path / "vocab")
    draft_ids = np.arange(len(d2t)) + d2t
    assert len(d2t) == 60 and np.all(np.diff(draft_ids) > 0)
    assert np.all(t2d[draft_ids]) and t2d.sum() == 60 and len(t2d) == info["target_vocab_size"] == 300
    masked = arr["input_ids"][arr["loss_mask"] == 1]
    assert info["coverage"] == pytest.approx(np.isin(masked, draft_ids).mean(), abs=1e-6)
    assert 0.5 < info["coverage"] < 1.0
    assert f"coverage {info['coverage']:.2%}" in proc.stdout
    assert SPEC.partial_files(tmp_path / "vocab") == []


def test_spec_imports_no_torch():
    code = "import sys, ops.vocab.spec; sys.exit(any(m in sys.modules for m in ('torch', 'transformers', 'tokenizers')))"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
