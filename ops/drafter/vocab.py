"""The draft vocabulary (vocab op's output): d2t offsets and the t2d mask.

`<dir>/vocab.safetensors`: d2t int64 [draft] with target_id = draft_id + d2t[draft_id],
t2d bool [target_vocab]. Read by train (head init, loss restriction), export
(copied into the checkpoint) and bench (mapping draft tokens to target ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:          # annotations only: torch is imported where it is used
    import torch

VOCAB_FILE = "vocab.safetensors"


class VocabError(ValueError):
    pass


@dataclass
class DraftVocab:
    d2t: "torch.Tensor"          # int64 [draft]
    t2d: "torch.Tensor"          # bool [target_vocab]

    @property
    def draft_to_target(self) -> "torch.Tensor":
        import torch

        return self.d2t + torch.arange(self.d2t.shape[0], dtype=torch.long)

    @property
    def size(self) -> int:
        return int(self.d2t.shape[0])


def load_vocab(path: Path, target_vocab_size: int | None = None) -> DraftVocab:
    import torch
    from safetensors.torch import load_file

    path = Path(path)
    file = path / VOCAB_FILE if path.is_dir() else path
    if not file.exists():
        raise VocabError(f"{file}: missing (the vocab op writes it)")
    try:
        tensors = load_file(str(file))
    except Exception as exc:  # safetensors raises its own error types
        raise VocabError(f"{file}: unreadable safetensors ({exc})") from None
    for key in ("d2t", "t2d"):
        if key not in tensors:
            raise VocabError(f"{file}: no tensor {key!r} (has {sorted(tensors)})")
    d2t = tensors["d2t"].to(torch.long)
    t2d = tensors["t2d"].to(torch.bool)
    if d2t.dim() != 1 or t2d.dim() != 1:
        raise VocabError(f"{file}: d2t and t2d must be 1-D, got {tuple(d2t.shape)} and {tuple(t2d.shape)}")
    if target_vocab_size is not None and t2d.shape[0] != target_vocab_size:
        raise VocabError(f"{file}: t2d covers {t2d.shape[0]} ids but the target's vocab_size is {target_vocab_size}")
    ids = d2t + torch.arange(d2t.shape[0])
    if ids.min() < 0 or ids.max() >= t2d.shape[0]:
        raise VocabError(f"{file}: d2t maps draft ids outside the target vocab [0, {t2d.shape[0]})")
    if not bool(t2d[ids].all()) or int(t2d.sum()) != d2t.shape[0]:
        raise VocabError(f"{file}: d2t and t2d disagree (t2d has {int(t2d.sum())} true, d2t has {d2t.shape[0]} ids)")
    return DraftVocab(d2t=d2t, t2d=t2d)
