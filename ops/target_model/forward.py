"""The target's forward with its hooks: a batch of token ids in, its states out (output.py).

Where it sits: below the stages. Extract's HF engine (ops/extract/hf_engine.py) drives it for the
states it writes, train's online mode (ops/train/online.py) for each batch it trains on, export's check
(ops/export/__main__.py) for the held-out samples an online run stored no states of: one forward, so
the three can never compute the states two ways. The batch is padded to its longest sample;
capture.py's hooks return the aux layers' outputs and the final post-norm state.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ops.target_model import model as target_mod
from ops.target_model.capture import HiddenStateCapture
from ops.target_model.output import TargetOutput


class HFTarget:
    """The batch padded to its longest sample, through the hooked model."""

    def __init__(self, model, layer_ids) -> None:
        self.capture = HiddenStateCapture(model, layer_ids)
        self.input_device = self.capture.base.get_input_embeddings().weight.device

    def forward(self, tokens) -> TargetOutput:
        longest = max(len(tok) for tok in tokens)
        cuda = self.input_device.type == "cuda"
        # Pinned inputs: a copy from pageable memory makes the host wait for
        # the stream (CUDA's sync rules for pageable H2D), i.e. for the last
        # batch's forward, and the GPU then idles while this one is launched.
        ids = torch.zeros((len(tokens), longest), dtype=torch.long, pin_memory=cuda)
        for row, tok in enumerate(tokens):
            ids[row, :len(tok)] = torch.from_numpy(tok.astype(np.int64))
        mask = None
        if any(len(tok) < longest for tok in tokens):
            # Only a padded batch needs the mask: with one, transformers asks
            # the device whether it is all ones (a sync), without one it
            # takes the causal path the all-ones mask would take anyway.
            mask = torch.zeros((len(tokens), longest), dtype=torch.long, pin_memory=cuda)
            for row, tok in enumerate(tokens):
                mask[row, :len(tok)] = 1
            mask = mask.to(self.input_device, non_blocking=True)
        aux, final = self.capture(ids.to(self.input_device, non_blocking=True), mask)
        return TargetOutput(aux, final, [(aux[row, :len(tok)], final[row, :len(tok)])
                                         for row, tok in enumerate(tokens)])

    def close(self) -> None:
        self.capture.close()


def states_for(samples_dir: Path, target_dir: Path, layer_ids: list[int], ids: list[int],
               device: str = "cpu") -> dict:
    """idx -> (input_ids [1, T], aux [1, T, 3H] float32, on the CPU) of prepare's samples `ids`,
    through the target with these hooks, on `device` ("cpu": float32; "cuda": bfloat16, as extract
    runs it there): what export's check reads where an online (or streamed) run stored no states."""
    from ops.prepared import load_samples

    prepared = load_samples(Path(samples_dir))
    info = target_mod.read_target(Path(target_dir))
    placement = target_mod.Placement("cuda:0", None) if device == "cuda" else target_mod.Placement("cpu", None)
    model = target_mod.load_model(info, "bfloat16" if device == "cuda" else "float32", placement)
    target = HFTarget(model, list(layer_ids))
    out = {}
    try:
        for idx in ids:
            tok, _mask = prepared.get(idx)
            states = target.forward([tok])
            aux = states.samples[0][0].float().cpu().clone().unsqueeze(0)
            out[idx] = (torch.from_numpy(tok.astype("int64")).unsqueeze(0), aux)
    finally:
        target.close()
    return out
