"""Training from each storage format on the toy target (benchmarks/formats_table.py
--toy: the real ops.extract and ops.train in subprocesses, the same samples,
seed and held-out split for each format): train's held-out simulated
acceptance length from fp8 stays within FP8_MARGIN of bf16's, int4's within
INT4_MARGIN, and the bytes a token fall as the formats say.

Measured here (2 shared cores, seeds 0 and 1): bf16 2.193 / 2.175, fp8 2.193 /
2.153, int4 2.244 / 2.221; the toy's seed-to-seed spread is 0.02-0.04, so the
margins are the issue's goals for the real model widened by that spread
(fp8: 0.05 -> 0.1; int4: 2 % of 2.2 -> 0.15)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.test_benchmarks_throughput import run_benchmark

FP8_MARGIN = 0.1
INT4_MARGIN = 0.15


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_from_fp8_and_int4_keeps_the_held_out_acceptance_of_bf16(tmp_path, request):
    pytest.importorskip("torch")
    from ops.drafter import toy

    # The toy target, corpus and vocab are built once (the pytest cache), as tests/test_sim_acceptance.py's.
    digest = hashlib.sha1(Path(toy.__file__).read_bytes()).hexdigest()[:12]
    toy_dir = request.config.cache.mkdir(f"eagle3-formats-toy-{digest}")
    out = run_benchmark("formats_table.py", "--toy", "--out", str(tmp_path), "--toy-dir", str(toy_dir),
                        "--seeds", "0", timeout=900)
    result = json.loads((tmp_path / "formats_table.json").read_text())
    rows = {r["format"]: r for r in result["formats"]}
    assert set(rows) == {"bf16", "fp8", "int4"}
    al = {fmt: r["trains"][0]["heldout_al"] for fmt, r in rows.items()}
    assert all(r["trains"][0]["heldout_tokens"] > 0 for r in rows.values())
    assert abs(al["fp8"] - al["bf16"]) <= FP8_MARGIN, al
    assert abs(al["int4"] - al["bf16"]) <= INT4_MARGIN, al
    # The toy target is float32 (4 B an element): fp8 about a quarter of the bytes, int4 an eighth, ids on top.
    ratio = {fmt: r["bytes_per_token"] / rows["bf16"]["bytes_per_token"] for fmt, r in rows.items()}
    assert 0.25 < ratio["fp8"] < 0.32 and 0.125 < ratio["int4"] < 0.16, ratio
    assert "format    B/token" in out and out.count("held-out simulated AL") == 3
    # --reuse: a second call into the same folder runs nothing the first completed (how one table is
    # finished over several calls of a GPU machine that keeps its disk) and gives the same rows.
    logs = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.log")}
    run_benchmark("formats_table.py", "--toy", "--out", str(tmp_path), "--toy-dir", str(toy_dir),
                  "--seeds", "0", "--reuse", timeout=300)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.log")} == logs
    assert json.loads((tmp_path / "formats_table.json").read_text())["formats"] == result["formats"]
