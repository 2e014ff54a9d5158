"""The target's frozen embedding, final norm and LM head, read tensor by tensor.

ops.train needs these three tensors of the target (token embeddings for the
drafter's input, the LM head for the target's distribution and to initialise
the drafter's head). A 1T-parameter target must never be loaded whole, so the
tensors are found through model.safetensors.index.json (or the single file's
header) and read with safetensors' safe_open, which maps only what is asked.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ops.drafter.config import read_target_config
from ops.formats import BadSampleFile, read_safetensors_header

if TYPE_CHECKING:          # annotations only: torch is imported where it is used
    import torch

INDEX = "model.safetensors.index.json"


class TargetWeightsError(ValueError):
    """The target directory lacks a tensor the drafter needs."""


@dataclass
class TargetHead:
    embed: "torch.Tensor"       # [V, H]
    norm: "torch.Tensor"        # [H] final RMSNorm weight
    lm_head: "torch.Tensor"     # [V, H]
    eps: float
    tied: bool
    names: dict[str, str]       # which tensor names were read (for the log)


def tensor_locations(target: Path) -> dict[str, Path]:
    """name -> safetensors file, from the index json or the files' headers."""
    target = Path(target)
    index = target / INDEX
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as exc:
            raise TargetWeightsError(f"{index}: no readable 'weight_map' ({exc})") from None
        return {name: target / fname for name, fname in weight_map.items()}
    files = sorted(target.glob("*.safetensors"))
    if not files:
        raise TargetWeightsError(f"{target}: no *.safetensors files and no {INDEX}")
    out: dict[str, Path] = {}
    for f in files:
        try:
            header, _ = read_safetensors_header(f)
        except BadSampleFile as exc:
            raise TargetWeightsError(str(exc)) from None
        out.update({name: f for name in header if name != "__metadata__"})
    return out


def _pick(names: list[str], suffix: str, what: str, target: Path) -> str | None:
    found = [n for n in names if n == suffix or n.endswith("." + suffix)]
    # Prefer the language model's tensor over a vision tower's or an MTP layer's.
    found = [n for n in found if ".layers." not in n and "vision" not in n and "mtp" not in n] or found
    if len(found) > 1:
        found.sort(key=len)
    return found[0] if found else None


def load_target_head(target: Path, dtype=None) -> TargetHead:
    from safetensors import safe_open

    target = Path(target)
    cfg = read_target_config(target)
    locations = tensor_locations(target)
    names = sorted(locations)
    embed_name = _pick(names, "embed_tokens.weight", "embedding", target)
    if embed_name is None:
        raise TargetWeightsError(f"{target}: no tensor named '*embed_tokens.weight' among {len(names)} tensors")
    norm_candidates = [n for n in names if n.endswith("norm.weight") and ".layers." not in n
                       and "embed" not in n and "vision" not in n and "mtp" not in n]
    if not norm_candidates:
        raise TargetWeightsError(f"{target}: no final norm tensor ('model.norm.weight') found")
    norm_name = min(norm_candidates, key=len)
    head_name = _pick(names, "lm_head.weight", "lm head", target)
    tied = bool(cfg.get("tie_word_embeddings", False)) or head_name is None

    def read(name: str) -> "torch.Tensor":
        path = locations[name]
        if not path.exists():
            raise TargetWeightsError(f"{path}: listed for tensor {name!r} but missing")
        with safe_open(str(path), framework="pt") as fh:
            t = fh.get_tensor(name)
        return t.to(dtype) if dtype is not None else t

    embed = read(embed_name)
    lm_head = embed if tied else read(head_name)
    norm = read(norm_name)
    hidden = int(cfg.get("hidden_size", embed.shape[1]))
    for name, t in ((embed_name, embed), ("lm_head", lm_head)):
        if t.dim() != 2 or t.shape[1] != hidden:
            raise TargetWeightsError(f"{target}: tensor {name!r} has shape {tuple(t.shape)}, "
                                     f"expected [vocab, {hidden}]")
    if tuple(norm.shape) != (hidden,):
        raise TargetWeightsError(f"{target}: tensor {norm_name!r} has shape {tuple(norm.shape)}, expected [{hidden}]")
    return TargetHead(embed=embed, norm=norm, lm_head=lm_head,
                      eps=float(cfg.get("rms_norm_eps", 1e-6)), tied=tied,
                      names={"embed": embed_name, "norm": norm_name,
                             "lm_head": embed_name if tied else head_name})
