"""Sizes of the EAGLE-3 drafter, derived from the target's config.json.

Used by ops.train (to build the drafter), ops.export (to write the engines'
config.json) and ops.bench (to rebuild it from an export). The drafter's
decoder layer has the target's hidden size, heads, head_dim and MLP width, so
that the engines' stock Llama layer classes can load it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ops.common import load_json_file


class TargetConfigError(ValueError):
    """The target's config.json lacks what the drafter needs."""


@dataclass
class DrafterConfig:
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    target_vocab_size: int
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    max_position_embeddings: int = 4096
    # Hugging Face's rope dict: {"rope_type": ..., "rope_theta": ..., scaling keys}.
    rope_parameters: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default",
                                                                      "rope_theta": 10000.0})
    # Canonical aux layer ids (0-indexed decoder layer whose OUTPUT is captured).
    aux_layer_ids: list[int] = field(default_factory=list)
    target_num_layers: int = 0
    target_architecture: str = "LlamaForCausalLM"
    target_model_type: str = "llama"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "DrafterConfig":
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"drafter config has unknown keys {unknown}")
        return cls(**data)

    def llama_config(self):
        """A transformers LlamaConfig with these sizes (for the rotary embedding and MLP)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rms_norm_eps=self.rms_norm_eps,
            hidden_act=self.hidden_act,
            max_position_embeddings=self.max_position_embeddings,
            rope_parameters=dict(self.rope_parameters),
            vocab_size=self.draft_vocab_size,
            num_hidden_layers=1,
        )


def read_target_config(target: Path) -> dict[str, Any]:
    path = Path(target) / "config.json"
    data = load_json_file(path, TargetConfigError, "--target must be a Hugging Face checkpoint directory")
    # Multimodal checkpoints keep the language model's sizes in text_config.
    if isinstance(data.get("text_config"), dict) and "hidden_size" not in data:
        merged = dict(data["text_config"])
        merged.setdefault("architectures", data.get("architectures"))
        merged.setdefault("tie_word_embeddings", data.get("tie_word_embeddings", False))
        data = merged
    return data


def rope_parameters_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope dict in transformers 5 form, from either the new or the legacy keys."""
    if isinstance(cfg.get("rope_parameters"), dict):
        out = dict(cfg["rope_parameters"])
    else:
        out = dict(cfg.get("rope_scaling") or {})
        if "type" in out and "rope_type" not in out:
            out["rope_type"] = out.pop("type")
    out.setdefault("rope_type", "default")
    out.setdefault("rope_theta", float(cfg.get("rope_theta", 10000.0)))
    return out


def from_target(target: Path, draft_vocab_size: int, aux_layer_ids: list[int],
                overrides: dict[str, Any] | None = None) -> DrafterConfig:
    """The drafter's sizes for `target` (its config.json), with optional overrides
    (num_attention_heads, num_key_value_heads, intermediate_size) for targets whose
    own layers are not Llama-shaped (MoE, MLA)."""
    cfg = read_target_config(Path(target))
    path = Path(target) / "config.json"
    overrides = {k: v for k, v in (overrides or {}).items() if v not in (None, 0, "")}

    def need(key: str) -> Any:
        if key in overrides:
            return overrides[key]
        if cfg.get(key) in (None, ""):
            raise TargetConfigError(f"{path}: key {key!r} missing; the drafter copies it from the target")
        return cfg[key]

    hidden = int(need("hidden_size"))
    heads = int(need("num_attention_heads"))
    kv_heads = int(overrides.get("num_key_value_heads") or cfg.get("num_key_value_heads") or heads)
    head_dim = int(overrides.get("head_dim") or cfg.get("head_dim") or hidden // heads)
    inter = int(overrides.get("intermediate_size") or cfg.get("intermediate_size") or 0)
    if not inter:
        raise TargetConfigError(f"{path}: key 'intermediate_size' missing; pass --intermediate-size")
    vocab = int(need("vocab_size"))
    n_layers = int(need("num_hidden_layers"))
    bad = [k for k in aux_layer_ids if not 0 <= int(k) < n_layers]
    if bad:
        raise TargetConfigError(f"aux layer ids {bad} are outside the target's {n_layers} layers ({path})")
    if draft_vocab_size > vocab:
        raise TargetConfigError(f"draft vocab {draft_vocab_size} exceeds the target's vocab_size {vocab} ({path})")
    archs = cfg.get("architectures") or ["LlamaForCausalLM"]
    return DrafterConfig(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        draft_vocab_size=int(draft_vocab_size),
        target_vocab_size=vocab,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        hidden_act=str(cfg.get("hidden_act", "silu")),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        rope_parameters=rope_parameters_of(cfg),
        aux_layer_ids=[int(k) for k in aux_layer_ids],
        target_num_layers=n_layers,
        target_architecture=str(archs[0]),
        target_model_type=str(cfg.get("model_type", "llama")),
    )
