"""prepare's on-disk output: the sample arrays and summary.json (read by vocab, extract).

<output>/samples.safetensors   input_ids int32 [total], loss_mask uint8 [total],
                               offsets int64 [N+1] (sample i = [offsets[i], offsets[i+1])),
                               source_line int64 [N] (1-based input line of sample i)
<output>/summary.json          counts, drops, truncation, histograms; status "complete"

Both are written under a `.tmp` name then renamed, samples first and the
summary last, so a summary with status "complete" means a whole output.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ops.common import TMP_SUFFIX, write_json_atomic

SAMPLES = "samples.safetensors"
SUMMARY = "summary.json"
FORMAT_VERSION = 1
# Histogram upper bin edges (token counts); max_seq_len is added so that every
# truncated sample lands in the bin that ends at max_seq_len.
BASE_EDGES = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]


def histogram_edges(max_seq_len: int) -> list[int]:
    return sorted(set(BASE_EDGES) | {int(max_seq_len)})


def histogram(lengths: np.ndarray, edges: list[int]) -> list[int]:
    """len(edges)+1 counts: counts[i] = #{edges[i-1] < len <= edges[i]}
    (edges[-1] = 0 for i = 0); the last count is len > edges[-1]."""
    idx = np.searchsorted(np.asarray(edges), np.asarray(lengths), side="left")
    return np.bincount(idx, minlength=len(edges) + 1).astype(int).tolist()


def length_stats(lengths: np.ndarray) -> dict:
    if len(lengths) == 0:
        return {"min": 0, "max": 0, "mean": 0.0, "p50": 0, "p99": 0}
    return {"min": int(lengths.min()), "max": int(lengths.max()),
            "mean": round(float(lengths.mean()), 2),
            "p50": int(np.percentile(lengths, 50)), "p99": int(np.percentile(lengths, 99))}


def start_output(output: Path) -> None:
    """Make the directory and retire a previous summary before any new byte lands,
    so an interrupted rerun never looks complete."""
    output.mkdir(parents=True, exist_ok=True)
    for name in (SUMMARY, SUMMARY + TMP_SUFFIX, SAMPLES + TMP_SUFFIX):
        try:
            (output / name).unlink()
        except FileNotFoundError:
            pass


def write_samples(output: Path, ids: list[np.ndarray], masks: list[np.ndarray],
                  lines: list[int]) -> None:
    from safetensors.numpy import save_file

    lengths = np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids))
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tensors = {
        "input_ids": np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
        "loss_mask": np.concatenate(masks).astype(np.uint8) if masks else np.zeros(0, np.uint8),
        "offsets": offsets,
        "source_line": np.asarray(lines, dtype=np.int64),
    }
    tmp = output / (SAMPLES + TMP_SUFFIX)
    # One metadata key: safetensors keeps metadata in a hash map, so several
    # keys would land in a random order and identical runs would differ in bytes.
    save_file(tensors, str(tmp), metadata={"format": f"eagle3-prepare/{FORMAT_VERSION}"})
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, output / SAMPLES)


def write_summary(output: Path, summary: dict) -> None:
    write_json_atomic(output / SUMMARY, summary)


def load_samples(output: Path) -> dict[str, np.ndarray]:
    """The arrays of a complete prepare output (vocab and tests read it this way)."""
    from safetensors.numpy import load_file

    return load_file(str(output / SAMPLES))
