"""The tokenized samples that prepare wrote, as the stages after it read them.

prepare -> `<input>/samples.safetensors` (`input_ids` int32 flat, `loss_mask`
uint8 flat, `offsets` int64 [N+1]: sample i = [offsets[i], offsets[i+1]))
-> here -> extract's loop, online training's target forward, bench's prompts.
Below the stages, since three read it. Read with safetensors' numpy backend:
the arrays of a 1M-sample corpus are a few hundred MB at most.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ops.common import BadInput, read_json

SAMPLES_FILE = "samples.safetensors"
SUMMARY_FILE = "summary.json"
_KEYS = {"input_ids": ("int32", "int64"), "loss_mask": ("uint8", "int64", "bool"), "offsets": ("int64",)}


@dataclass
class PreparedSamples:
    input_ids: np.ndarray
    loss_mask: np.ndarray
    offsets: np.ndarray
    max_seq_len: int | None = None   # truncation applied on top of prepare's
    limit: int | None = None         # the num_samples param

    def __len__(self) -> int:
        n = len(self.offsets) - 1
        return n if self.limit is None else min(n, self.limit)

    def length(self, idx: int) -> int:
        n = int(self.offsets[idx + 1] - self.offsets[idx])
        return n if self.max_seq_len is None else min(n, self.max_seq_len)

    def lengths(self) -> list[int]:
        raw = np.diff(self.offsets[: len(self) + 1])
        if self.max_seq_len is not None:
            raw = np.minimum(raw, self.max_seq_len)
        return [int(n) for n in raw]

    def get(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        start = int(self.offsets[idx])
        end = start + self.length(idx)
        return self.input_ids[start:end], self.loss_mask[start:end]


def load_samples(directory: Path, max_seq_len: int | None = None,
                 limit: int | None = None) -> PreparedSamples:
    """prepare's samples, checked: BadInput naming the file and key otherwise."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(directory) / SAMPLES_FILE
    if not Path(directory).is_dir():
        raise BadInput(f"input {directory}: not a directory (the output of prepare expected)")
    if not path.is_file():
        raise BadInput(f"{path}: not found (prepare writes it; run prepare first)")
    summary = Path(directory) / SUMMARY_FILE
    if not summary.is_file():
        raise BadInput(f"{summary}: not found; prepare writes it last, so its output is unfinished")
    status = (read_json(summary) or {}).get("status", "complete")
    if status != "complete":
        raise BadInput(f"{summary}: status {status!r}, not 'complete'; prepare did not finish")
    try:
        arrays = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise BadInput(f"{path}: not a readable safetensors file ({exc})") from exc
    for key, dtypes in _KEYS.items():
        if key not in arrays:
            raise BadInput(f"{path}: no tensor {key!r} (has {sorted(arrays)})")
        arr = arrays[key]
        if arr.ndim != 1 or str(arr.dtype) not in dtypes:
            raise BadInput(f"{path}: {key!r} is {arr.dtype} {list(arr.shape)}, "
                           f"expected a flat {' or '.join(dtypes)} array")
    ids, mask, offsets = arrays["input_ids"], arrays["loss_mask"], arrays["offsets"]
    if len(mask) != len(ids):
        raise BadInput(f"{path}: loss_mask has {len(mask)} tokens, input_ids {len(ids)}")
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(ids):
        raise BadInput(f"{path}: offsets must run from 0 to len(input_ids)={len(ids)}, "
                       f"got {offsets[:1].tolist()}..{offsets[-1:].tolist()}")
    steps = np.diff(offsets)
    if len(steps) and steps.min() <= 0:
        bad = int(np.argmin(steps))
        raise BadInput(f"{path}: sample {bad} is empty or offsets decrease "
                       f"(offsets[{bad}]={int(offsets[bad])}, offsets[{bad + 1}]={int(offsets[bad + 1])})")
    if max_seq_len is not None and max_seq_len <= 0:
        raise BadInput(f"max_seq_len must be positive, got {max_seq_len}")
    if limit is not None and limit <= 0:
        raise BadInput(f"num_samples must be positive, got {limit}")
    return PreparedSamples(ids, mask, offsets, max_seq_len, limit)
