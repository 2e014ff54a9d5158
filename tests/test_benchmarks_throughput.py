"""The throughput benchmarks still run (at their tiny shape, on the CPU) and
print their ratios against the baselines they measure. No timing is asserted:
the figures that matter come from a GPU machine (benchmarks/gpu_session.sh)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, *args: str, timeout: int = 240) -> str:
    # One torch thread, as the rest of the suite (tests/conftest.py): no figure is asserted, and a
    # second thread on the tiny shape only contends with the other torch lane.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_extract_throughput_tiny_prints_its_ratios(tmp_path):
    # A token budget of 1,024 (the default's 16,384 made the bare forwards 256 x 64 and 128 x 64: 4 of
    # its 20 s on an idle 2-core machine); no figure is asserted, the lines are.
    out = run_benchmark("extract_throughput.py", "--shape", "tiny", "--out", str(tmp_path), "--token-budget", "1024",
                        "--durable", "fsync,syncfs", "--json", str(tmp_path / "r.json"))
    assert out.startswith("device: CPU")
    assert re.search(r"compute floor [\d,]+ tok/s", out)
    assert re.search(r"write floor [\d,]+ tok/s", out)
    assert re.search(r"bare forward \d+ x 64 with an all-ones mask: [\d,]+ tok/s", out)
    assert re.search(r"bare forward \d+ x 64 without a mask: [\d,]+ tok/s", out)
    assert re.search(r"naive extractor .*: [\d,]+ tok/s", out)
    for mode in ("fsync", "syncfs"):
        line = next(ln for ln in out.splitlines() if ln.startswith(f"ops.extract --durable {mode}:"))
        assert re.search(r"= \d+\.\d\d of the bare forward, \d+\.\d\d of the lower floor", line), line
        assert re.search(r"[\d,]+ MB/s written", line) and "durability step" in line, line
    assert "cost least here" in out
    assert (tmp_path / "r.json").is_file()
    assert not list(tmp_path.glob("extract-throughput-tiny"))   # cleaned up: no 16 GB left behind on a GPU box


def test_mfu_count_is_the_issues_formula():
    """The 8B drafter's count: 16.38 GFLOP a token at T=2048, K=7 (issue 11's 43.5 % at
    20,900 tok/s and 787 TFLOP/s is 16.38 GFLOP a token)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.train_throughput import flops_per_token
    from ops.drafter.config import DrafterConfig

    cfg = DrafterConfig(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                        intermediate_size=14336, draft_vocab_size=32000, target_vocab_size=128256)
    assert flops_per_token(cfg, 7, 2048) / 1e9 == pytest.approx(16.38, abs=0.01)
    assert 0.435 * 787e12 / 20900 / 1e9 == pytest.approx(16.38, abs=0.02)


@pytest.mark.slow
def test_train_throughput_tiny_prints_its_ratios(tmp_path):
    out = run_benchmark("train_throughput.py", "--shape", "tiny", "--out", str(tmp_path), "--program", "64,128",
                        "--staging", "pinned,inline", "--json", str(tmp_path / "r.json"))
    assert out.startswith("device: CPU")
    for seq in (64, 128):
        lines = [ln for ln in out.splitlines() if ln.startswith(f"train {seq}-token samples")]
        assert ["batches pinned" in lines[0], "batches inline" in lines[1]] == [True, True], lines
        for line in lines:
            assert re.search(r"[\d,]+ tok/s = \d+\.\d% MFU", line), line
            assert re.search(r"\d+\.\d% of step time waiting for data", line), line
        # The program runs once a length, beside the first variant.
        assert re.search(r"python -m ops.train said [\d,]+ tok/s", lines[0]), lines[0]
        assert "python -m ops.train" not in lines[1]
    assert (tmp_path / "r.json").is_file()


@pytest.mark.slow
def test_train_throughput_tiny_with_levers_checks_them_first(tmp_path):
    # flex has no CPU backward: the chunked loss and fused AdamW are what the CPU can time.
    out = run_benchmark("train_throughput.py", "--shape", "tiny", "--seq", "64", "--out", str(tmp_path),
                        "--levers", "chunked,fused-adamw", "--check-levers")
    check = next(ln for ln in out.splitlines() if ln.startswith("levers (ttt attention mask, loss chunked, "
                                                                  "fused AdamW on") and "vs the old path" in ln)
    cos = float(re.search(r"gradient cosine ([\d.]+)", check).group(1))
    assert cos > 0.9999, check
    assert re.search(r"train 64-token samples .*levers chunked,fused-adamw \(.*\), batches pinned: [\d,]+ tok/s = \d+\.\d% MFU", out)


@pytest.mark.slow
def test_train_throughput_counts_the_compiles_of_mixed_lengths(tmp_path):
    """The compiled step over a corpus of many lengths in buckets: its graphs
    are built in the warm-up pass (printed apart from tok/s), none in the
    timed pass over the same batches. Dynamo's capture alone (backend eager):
    the graphs and recompiles are dynamo's; inductor's code generation took
    50 of this test's 58 s and is tested in tests/test_length_buckets.py
    (the compiled step equals the eager one)."""
    out = run_benchmark("train_throughput.py", "--shape", "tiny", "--seq", "128", "--out", str(tmp_path),
                        "--levers", "compile,chunked,bucket", "--length-bucket", "64", "--lengths", "mixed",
                        "--steps", "2", "--compile-backend", "eager")
    line = next(ln for ln in out.splitlines() if ln.startswith("compile 128 (backend eager):"))
    m = re.search(r"(\d+) graphs built in the (\d+) warm-up steps .* (\d+) in the timed steps; (\d+) batch shapes",
                  line)
    graphs, _warm, timed, n_shapes = (int(x) for x in m.groups())
    assert 0 < graphs <= 3 * n_shapes and n_shapes <= 2 and timed == 0, line
    assert re.search(r"train 128-token samples .*compile on, length bucket 64\), batches pinned: [\d,]+ tok/s", out)
