"""Training data: the extract op's hidden-state shards, batched by a token budget.

Reads the DESIGN.md layout (data_config.json, sample_lengths.json,
rows_<a>-<b>/data_<idx>.safetensors). Samples are length-sorted into batches of
similar lengths whose padded size stays within the token budget; a
DistributedSampler then deals whole batches to ranks (rank r gets batches
r, r+W, ... of the epoch's shuffled order), so a step on W ranks sees the same
batches as W accumulated micro-batches on one rank. Sample files are opened
with safetensors' safe_open (memory-mapped) inside DataLoader workers.

Length buckets: with `bucket` > 0 a batch's padded length is its
longest sample rounded up to a multiple of `bucket` (capped at max_len), and a
batch never mixes buckets, and a bucket's last, partial batch is padded with
empty rows (length 0) up to the bucket's full budget // length rows, so a
corpus of any number of distinct lengths gives one batch shape per bucket:
what bounds the kernels that FlexAttention and torch.compile build per shape
(the empty rows cost at most one batch's compute per bucket and epoch). The
padding is loss-masked like any other (lengths stay the samples' own), so the
loss and accuracies do not change.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ops.formats import (DATA_CONFIG, SAMPLE_LENGTHS, SAMPLE_RE, SHARD_DIR_RE, BadDataConfig, BadSampleFile,
                         read_data_config, read_safetensors_header, tokens_in_header)
from ops import hidden_formats

KEYS = ("input_ids", "loss_mask", "aux_hidden_states", "final_hidden_states")
# A batch's key for each state tensor of a file (and its parts': "aux_scale").
BATCH_KEYS = {"aux_hidden_states": "aux", "final_hidden_states": "final"}


class DataError(ValueError):
    pass


class FormatError(DataError):
    """A sample file in another format than its data_config.json declares (exit 3)."""


@dataclass
class DataInfo:
    root: Path
    hidden_size: int
    layer_ids: list[int]
    final_post_norm: bool
    config: dict
    samples: dict[int, Path]        # idx -> file
    lengths: dict[int, int]         # idx -> tokens
    format: str = hidden_formats.DEFAULT    # how the states are stored (ops/hidden_formats.py)

    def dataset(self, batches: list[list[int]], max_len: int, bucket: int = 0, token_budget: int = 0):
        """Item i = batch i read from the files (online training's OnlineData answers the same)."""
        return BatchDataset(self, batches, max_len, bucket, token_budget)

    def describe(self) -> str:
        return f"offline: states from {self.root} ({self.format})"

    def begin_epoch(self, epoch: int, position: int, batches: list[list[int]]) -> None:
        """Nothing to announce: the states are on disk (the spool's consumer announces its plan)."""

    def finish(self) -> None:
        """Nothing to release."""

    def window(self, elapsed: float, waited: float, tokens: int) -> None:
        """No second side to record: the states were extracted before."""
        return None


def read_data(root: Path, require_complete: bool = True) -> DataInfo:
    root = Path(root)
    cfg_path = root / DATA_CONFIG
    try:
        cfg = read_data_config(root, strict=True)
    except BadDataConfig as exc:
        raise DataError(f"{cfg_path}: missing; --data must be the extract op's output directory" if exc.missing
                        else str(exc)) from None
    for key in ("hidden_size", "layer_ids"):
        if key not in cfg:
            raise DataError(f"{cfg_path}: key {key!r} missing")
    if require_complete and cfg.get("status", "complete") != "complete":
        raise DataError(f"{cfg_path}: status is {cfg.get('status')!r}, not 'complete'; "
                        "finish (or verify) the extraction first")
    layer_ids = [int(k) for k in cfg["layer_ids"]]
    # Some writers list the final layer after the aux layers (e.g. [2, 30, 58, 60]).
    if len(layer_ids) == 4 and cfg.get("num_layers_captured") == 4:
        layer_ids = layer_ids[:3]
    if len(layer_ids) != 3:
        raise DataError(f"{cfg_path}: layer_ids {cfg['layer_ids']} must name 3 aux layers")
    fmt = hidden_formats.config_format(cfg, str(cfg_path))
    final = str(cfg.get("final_hidden_state", "post_norm")).lower()
    if final not in ("post_norm", "pre_norm"):
        raise DataError(f"{cfg_path}: final_hidden_state is {final!r}; expected 'post_norm' or 'pre_norm'")
    samples: dict[int, Path] = {}
    for shard in sorted(p for p in root.iterdir() if p.is_dir() and SHARD_DIR_RE.match(p.name)):
        for f in shard.iterdir():
            m = SAMPLE_RE.match(f.name)
            if m and m.group(2) == "safetensors":
                samples[int(m.group(1))] = f
    if not samples:
        raise DataError(f"{root}: no rows_<a>-<b>/data_<idx>.safetensors sample files")
    first = samples[min(samples)]
    try:
        _check_format(first, hidden_formats.file_format(read_safetensors_header(first)[0]), fmt)
    except BadSampleFile as exc:
        raise DataError(str(exc)) from None
    lengths: dict[int, int] = {}
    try:
        recorded = json.loads((root / SAMPLE_LENGTHS).read_text())
        lengths = {int(k): int(v) for k, v in recorded.items() if int(k) in samples}
    except (OSError, ValueError):
        pass
    for idx, path in samples.items():
        if idx not in lengths:
            try:
                n = tokens_in_header(read_safetensors_header(path)[0])
            except BadSampleFile as exc:
                raise DataError(str(exc)) from None
            if n is None:
                raise DataError(f"{path}: no 'input_ids' tensor")
            lengths[idx] = n
    return DataInfo(root=root, hidden_size=int(cfg["hidden_size"]), layer_ids=layer_ids,
                    final_post_norm=final == "post_norm", config=cfg, samples=samples, lengths=lengths,
                    format=fmt)


def _check_format(path: Path, found: str, declared: str) -> None:
    if found != declared:
        raise FormatError(f"{path}: format {found!r} in the file's header, {path.parents[1] / DATA_CONFIG} "
                          f"declares {declared!r}; the output mixes formats")


def bucket_length(n: int, bucket: int, max_len: int) -> int:
    """The padded length of a batch whose longest sample has n tokens (n <= max_len)."""
    if bucket <= 0:
        return n
    return min(max_len, -(-n // bucket) * bucket)


def make_batches(lengths: dict[int, int], token_budget: int, max_len: int, bucket: int = 0) -> list[list[int]]:
    """Length-sorted batches (shortest first) whose count x padded length (the
    longest, capped at max_len, rounded up to its bucket) <= token_budget; with
    a bucket, a batch holds one bucket's samples only (extract's planner:
    ops/batching.py token_batches)."""
    from ops.batching import token_batches

    return token_batches(lengths, lambda i: min(lengths[i], max_len), token_budget, longest_first=False,
                         padded=lambda n: bucket_length(n, bucket, max_len), one_length=bucket > 0)


def load_sample(path: Path, hidden: int, max_len: int, fmt: str = hidden_formats.DEFAULT) -> dict:
    """A sample's tensors, its states as stored (encoded in `fmt`: decoded on
    the training device, ops/train/prefetch.py)."""
    import torch
    from safetensors import safe_open

    names = ["input_ids", "loss_mask"] + [k + s for k in KEYS[2:] for s in hidden_formats.suffixes(fmt)]
    try:
        with safe_open(str(path), framework="pt") as fh:
            _check_format(path, hidden_formats.file_format({"__metadata__": fh.metadata()}), fmt)
            keys = set(fh.keys())
            missing = [k for k in names if k not in keys]
            if missing:
                raise DataError(f"{path}: tensors {missing} missing (has {sorted(keys)})")
            out = {k: fh.get_slice(k)[:max_len] for k in names}
    except DataError:
        raise
    except Exception as exc:
        raise DataError(f"{path}: unreadable ({exc})") from None
    t = out["input_ids"].shape[0]
    expect = {"input_ids": (t,), "loss_mask": (t,)}
    for key, width in (("aux_hidden_states", 3 * hidden), ("final_hidden_states", hidden)):
        for suffix, (_dtype, shape) in hidden_formats.layout(fmt, t, width, hidden, "").items():
            expect[key + suffix] = tuple(shape)
    for k, shape in expect.items():
        if tuple(out[k].shape) != shape:
            raise DataError(f"{path}: tensor {k!r} has shape {tuple(out[k].shape)}, expected {shape}")
    out["input_ids"] = out["input_ids"].to(torch.long)
    out["loss_mask"] = out["loss_mask"].to(torch.bool)
    return out


def padded_shape(lengths: list[int], bucket: int = 0, max_len: int = 0, token_budget: int = 0) -> tuple[int, int]:
    """(rows, tokens) of the collated batch of samples of these lengths (see collate)."""
    t = max(lengths)
    t = bucket_length(t, bucket, max(max_len, t))
    rows = len(lengths)
    if bucket > 0 and token_budget > 0:
        rows = max(rows, token_budget // t)     # (an over-long sample alone: 1 row)
    return rows, t


def _empty(shape: tuple, dtype):
    """torch.empty, in shared memory inside a DataLoader worker (as torch's own
    collate does): a worker's batch is otherwise copied once more into shared
    memory to reach the main process (at 8 x 2,048 tokens of an 8B target,
    534 MB a batch)."""
    import torch

    if torch.utils.data.get_worker_info() is None:
        return torch.empty(shape, dtype=dtype)
    numel = 1
    for n in shape:
        numel *= n
    storage = torch.empty(0, dtype=dtype)._typed_storage()._new_shared(numel)
    return torch.empty(0, dtype=dtype).new(storage).view(shape)


def collate(samples: list[dict], bucket: int = 0, max_len: int = 0, token_budget: int = 0) -> dict:
    """Right-padded batch (to the longest sample, or to its bucket's length and,
    given token_budget, to its bucket's rows with empty samples); causal
    attention never looks at the padding, the loss never counts it."""
    import torch

    own = [s["input_ids"].shape[0] for s in samples]
    b, t = padded_shape(own, bucket, max_len, token_budget)
    lengths = torch.tensor(own + [0] * (b - len(samples)))

    def pad(key, fill_shape, dtype):
        # Only the padding is zeroed: the rows are copied over anyway.
        out = _empty((b, t) + fill_shape, dtype)
        for i, s in enumerate(samples):
            n = s[key].shape[0]
            out[i, :n] = s[key]
            out[i, n:] = 0
        out[len(samples):] = 0
        return out

    out = {"input_ids": pad("input_ids", (), torch.long), "loss_mask": pad("loss_mask", (), torch.bool),
           "lengths": lengths}
    for key, first in samples[0].items():
        if key.startswith(tuple(BATCH_KEYS)):
            name = next(n for n in BATCH_KEYS if key.startswith(n))
            out[BATCH_KEYS[name] + key[len(name):]] = pad(key, first.shape[1:], first.dtype)
    return out


class BatchDataset:
    """Item i = batch i, loaded and collated (a torch Dataset by duck typing)."""

    def __init__(self, info: DataInfo, batches: list[list[int]], max_len: int, bucket: int = 0,
                 token_budget: int = 0):
        self.info, self.batches, self.max_len = info, batches, max_len
        self.bucket, self.token_budget = bucket, token_budget

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict:
        import torch

        batch = collate([load_sample(self.info.samples[idx], self.info.hidden_size, self.max_len, self.info.format)
                         for idx in self.batches[i]], self.bucket, self.max_len, self.token_budget)
        batch["samples"] = torch.tensor(self.batches[i])    # row -> sample index, for error messages
        return batch


def batch_loader(dataset, order: list[int], workers: int, pin: bool = False, persistent: bool = False):
    """The DataLoader over `dataset` in `order`, its batches collated by `workers` processes
    (none: in the caller's thread), for ops.train and the benchmark that times its data path.

    The workers start from a forkserver, not by fork: the loader is iterated in the
    prefetcher's thread (ops/train/prefetch.py), so each epoch's workers were forked while
    the main thread ran a step, and a child that inherits a lock the step held at that
    instant waits on it forever, and the loader on the child (a tiny train benchmark hung
    so once in about 60 runs, its worker stuck in its start; tests/test_batch_loader.py).
    The forkserver is one single-threaded process with torch and this module imported once;
    a worker is a fork of it, and receives the dataset pickled (a fork of this one inherited it)."""
    from torch.utils.data import DataLoader

    context = None
    if workers > 0:
        import multiprocessing

        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["torch", __name__])
    return DataLoader(dataset, batch_size=None, sampler=order, num_workers=workers, pin_memory=pin,
                      persistent_workers=persistent, multiprocessing_context=context)


def holdout_split(indices: list[int], n: int, seed: int) -> tuple[list[int], list[int]]:
    """(train, held out): n samples drawn by seed, kept out of training for bench."""
    import random

    ordered = sorted(indices)
    if n <= 0:
        return ordered, []
    if n >= len(ordered):
        raise DataError(f"--holdout {n} leaves no training samples (only {len(ordered)} exist)")
    held = sorted(random.Random(seed).sample(ordered, n))
    hs = set(held)
    return [i for i in ordered if i not in hs], held


def batch_keys(fmt: str) -> tuple[str, ...]:
    """A collated batch's state keys in `fmt` ("aux", "final", and their parts: "aux_scale")."""
    return tuple(short + s for short in BATCH_KEYS.values() for s in hidden_formats.suffixes(fmt))


def decode_batch(batch: dict, fmt: str, hidden: int, dtype) -> dict:
    """{"aux", "final"}: a batch's states decoded into `dtype`, where its tensors are (the GPU in training)."""
    if fmt == hidden_formats.BF16:
        return {short: batch[short].to(dtype) for short in BATCH_KEYS.values()}
    from ops.hidden_codec import decode

    return {short: decode(fmt, {s: batch[short + s] for s in hidden_formats.suffixes(fmt)}, hidden, dtype)
            for short in BATCH_KEYS.values()}
