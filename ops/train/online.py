"""Online training's states: the target, loaded by the train run, computes each
batch's aux and final states from prepare's token ids; nothing of size is
written (SpecForge's online mode up to v0.2, speculators' online mode).

Data flow: prepare's samples.safetensors (ops/prepared.py) -> a batch's
token ids -> the target (ops/target_model: the loading, placement, forward hooks
and forward that extract's HF engine runs too) -> the batch's states, padded as
ops/drafter/data.py's collate pads a batch read from disk -> the prefetcher
(ops/train/prefetch.py) -> the drafter's step. The batches, their order, the
held-out split and the resume position are the offline run's (same lengths,
same seed), so the two modes train the same drafter up to the target's
numerics. OnlineData stands where offline's DataInfo stands: the loop, the
held-out walk and the checks read the same fields of either.

Which side bounds a colocated run: `forward_s` sums the time the target's
forwards took (in the prefetcher's thread), the loop sums the time the
drafter's steps took; the progress line says which is larger.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops import hidden_formats
from ops.drafter.data import BatchDataset


# Online: the drafter's steps waited for the target's batches this share of a window or more -> the
# target's forward bounds the run; below it the drafter's steps do (the forward runs ahead of them).
BOUND_WAIT_SHARE = 1 / 3


def args_online(args) -> bool:
    """States computed by a target in this run or its producer (not read from an extraction)."""
    return getattr(args, "mode", "offline") in ("online", "streamed")


def bound_words(online: dict) -> str:
    """The online window in words: both rates, and which side bounds the run."""
    target = online.get("target_tok_s")
    spool = "spool_cap" in online
    side = ("bound by the " + ("producer" if spool else "target's forward") if online.get("bound") == "target"
            else "bound by the drafter's step")
    words = ((f"{'producer' if spool else 'target forward'} {target:.0f} tok/s, " if target else "")
             + f"drafter step {online.get('drafter_tok_s', 0):.0f} tok/s; {side} (the drafter waited "
             f"{100 * online.get('wait_share', 0):.0f} % of the window")
    if spool:
        from ops.spool import fill_words

        blocked = online.get("producer_blocked_share") or 0
        words += (f", the producer was blocked at the watermark {100 * blocked:.0f} %); spool "
                  f"{fill_words(int(online.get('spool_bytes') or 0), int(online.get('spool_cap') or 0))}")
    else:
        words += ")"
    return words


@dataclass
class OnlineData:
    """What training reads, in online mode: offline's DataInfo fields, from the
    target's config and prepare's samples, and the loaded target."""

    root: Path                      # prepare's output (named in messages)
    hidden_size: int
    layer_ids: list[int]
    final_post_norm: bool
    config: dict
    samples: dict[int, Path]        # idx -> samples.safetensors (for out_of_vocab's message)
    lengths: dict[int, int]
    prepared: Any                   # ops/prepared.PreparedSamples
    target: Any = None              # ops/target_model/forward.HFTarget once loaded
    device: Any = None              # where the target's states come out
    format: str = hidden_formats.DEFAULT
    clock: Any = field(default_factory=lambda: _Clock())
    _stream: Any = None
    lock: Any = field(default_factory=threading.Lock)

    def dataset(self, batches: list[list[int]], max_len: int, bucket: int = 0, token_budget: int = 0):
        return OnlineBatches(self, batches, max_len, bucket, token_budget)

    def describe(self) -> str:
        return f"online: states from the target's forward ({self.root}, layers {self.layer_ids})"

    def begin_epoch(self, epoch: int, position: int, batches: list[list[int]]) -> None:
        """Nothing to announce: the target computes whatever batch comes."""

    def finish(self) -> None:
        """Nothing to release: the run's end frees the target."""

    def window(self, elapsed: float, waited: float, tokens: int) -> dict:
        """The window's two sides: the target's forwards (in the prefetcher's
        thread) and the drafter's steps; the share of the window the steps
        waited for a batch says which side bounds the run."""
        forward_s, forward_tokens = self.clock.take()
        wait_share = min(1.0, waited / elapsed)
        return {"target_tok_s": round(forward_tokens / forward_s, 1) if forward_s > 0 else None,
                "drafter_tok_s": round(tokens / max(1e-9, elapsed - waited), 1),
                "forward_s": round(forward_s, 3), "waited_s": round(waited, 3),
                "wait_share": round(wait_share, 4),
                # Waiting for a third of the window or more: the forward is what the drafter waits on.
                "bound": "target" if wait_share >= BOUND_WAIT_SHARE else "drafter"}

    def stream(self):
        """The CUDA stream the target's forwards run on (None on the CPU)."""
        import torch

        device = torch.device(self.device) if self.device is not None else None
        if device is None or device.type != "cuda":
            return None
        if self._stream is None:
            self._stream = torch.cuda.Stream(device)
        return self._stream


class _Clock:
    """Seconds the target's forwards took, summed (read by the loop's window)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.forward_s = 0.0
        self.forward_tokens = 0

    def add(self, seconds: float, tokens: int) -> None:
        with self.lock:
            self.forward_s += seconds
            self.forward_tokens += tokens

    def take(self) -> tuple[float, int]:
        with self.lock:
            out = (self.forward_s, self.forward_tokens)
            self.forward_s, self.forward_tokens = 0.0, 0
            return out


def _nothing():
    return contextlib.nullcontext()


class OnlineBatches(BatchDataset):
    """Item i = batch i: its token ids through the target, collated as a batch read from disk is."""

    def __getitem__(self, i: int) -> dict:
        import torch

        from ops.drafter.data import padded_shape

        idxs = self.batches[i]
        rows = [self.info.prepared.get(idx) for idx in idxs]
        ids = [tok[: self.max_len] for tok, _ in rows]
        own = [len(tok) for tok in ids]
        b, t = padded_shape(own, self.bucket, self.max_len, self.token_budget)
        t0 = time.perf_counter()
        stream = self.info.stream()
        # One forward at a time: the prefetcher's thread and the held-out walk (the
        # training thread) share the target, whose hooks keep one batch's layers.
        with self.info.lock, (torch.cuda.stream(stream) if stream is not None else _nothing()):
            out = self.info.target.forward(ids)
            hidden = self.info.hidden_size
            # Fresh tensors, outside the forward's inference mode (autograd may save
            # them); the padding zeroed as collate zeroes a batch read from disk.
            aux = torch.zeros((b, t, out.aux.shape[-1]), dtype=out.aux.dtype, device=out.aux.device)
            final = torch.zeros((b, t, hidden), dtype=out.final.dtype, device=out.final.device)
            for row, (a, f) in enumerate(out.samples):
                aux[row, : own[row]] = a
                final[row, : own[row]] = f
            if stream is not None:
                # The forward ran on a stream of its own (beside the drafter's step on
                # the compute stream); waited for here, in the prefetcher's thread, so
                # the states are whole when the step takes them and the time is the
                # forward's own. The prefetcher records the compute stream's use of
                # them (record_stream) before the allocator may hand them back.
                stream.synchronize()
        self.info.clock.add(time.perf_counter() - t0, sum(own))
        input_ids = torch.zeros((b, t), dtype=torch.long)
        loss_mask = torch.zeros((b, t), dtype=torch.bool)
        for row, (tok, mask) in enumerate(rows):
            n = own[row]
            input_ids[row, :n] = torch.from_numpy(tok[:n].astype("int64"))
            loss_mask[row, :n] = torch.from_numpy(mask[:n].astype(bool))
        return {"input_ids": input_ids, "loss_mask": loss_mask,
                "lengths": torch.tensor(own + [0] * (b - len(idxs))),
                "aux": aux, "final": final, "samples": torch.tensor(idxs)}


def open_online(args, head_vocab_size: int | None) -> OnlineData:
    """prepare's samples and the target's config, checked (BadInput: one line,
    naming the key or the file); the target is loaded later (load_target)."""
    from ops.common import BadInput
    from ops.target_model import model as target_mod
    from ops.prepared import load_samples
    from ops.layers import parse_layer_ids

    if not args.samples:
        raise BadInput("mode online needs samples (prepare's output directory: --samples, `samples = ...`)")
    if not args.target:
        raise BadInput("mode online needs the target (--target, the [target] table's path): it computes the states")
    info = target_mod.read_target(Path(args.target))
    try:
        layer_ids = parse_layer_ids(args.layer_ids, info.num_layers)
    except ValueError as exc:
        raise BadInput(f"layer_ids: target {info.path}: {exc}") from None
    if len(layer_ids) != 3:
        raise BadInput(f"layer_ids {layer_ids}: the drafter takes 3 aux layers")
    prepared = load_samples(Path(args.samples))
    path = Path(args.samples) / "samples.safetensors"
    lengths = {i: n for i, n in enumerate(prepared.lengths())}
    if head_vocab_size is not None:
        top = int(prepared.input_ids.max()) if len(prepared.input_ids) else -1
        if top >= head_vocab_size or (len(prepared.input_ids) and int(prepared.input_ids.min()) < 0):
            raise BadInput(f"{path}: token id {top} outside the target's vocabulary of {head_vocab_size} ids "
                           f"({info.path}); prepare ran with another tokenizer")
    dtype = target_mod.resolve_dtype(args.target_dtype, info)
    config = {"mode": "online", "samples": str(Path(args.samples).resolve()), "layer_ids": layer_ids,
              "dtype": dtype, "hidden_size": info.hidden_size, "target": str(info.path.resolve())}
    return OnlineData(root=Path(args.samples), hidden_size=info.hidden_size, layer_ids=layer_ids,
                      final_post_norm=True, config=config, samples={i: path for i in lengths}, lengths=lengths,
                      prepared=prepared)


def load_target(data: OnlineData, args, place) -> None:
    """The target on its device (the drafter's, or its own), with its forward hooks (ops/target_model)."""
    from ops.target_model import model as target_mod
    from ops.target_model.forward import HFTarget

    info = target_mod.read_target(Path(args.target))
    where = str(place.device) if args.target_device == "auto" else args.target_device
    placement = target_mod.choose_placement(where, info, place.world, place.local_rank)
    t0 = time.monotonic()
    model = target_mod.load_model(info, data.config["dtype"], placement)
    for p in model.parameters():
        p.requires_grad_(False)
    if getattr(args, "target_compile", False):
        from ops.target_model.capture import compile_layers

        place.log(f"online: target_compile: {compile_layers(model)} decoder layers compiled")
    place.log(f"online: target {info.path} loaded on {placement.describe()} in "
              f"{time.monotonic() - t0:.1f} s ({data.config['dtype']}, aux layers {data.layer_ids})")
    data.target = HFTarget(model, data.layer_ids)
    data.device = placement.device
