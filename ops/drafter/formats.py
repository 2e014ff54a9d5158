"""The two on-disk drafter formats: what export writes and what bench / --check read.

Checked against the engines' loaders (sources read with the search/fetch tools):

SGLang, python/sglang/srt/models/llama_eagle3.py (LlamaForCausalLMEagle3):
- `LlamaModel.__init__`: `fc = Linear(target_hidden_size * 3, hidden_size)`
  (`target_hidden_size` read from the config when present), `midlayer =
  LlamaDecoderLayer(...)` whose `self_attn.qkv_proj` takes `2 * hidden_size`,
  plus `hidden_norm`, `input_layernorm`, `post_attention_layernorm`, `mlp`
  (LlamaMLP over `config.intermediate_size`); `norm`; more layers only when
  `num_hidden_layers > 1` (we write 1).
- `LlamaForCausalLMEagle3.__init__`: `if config.tie_word_embeddings: lm_head =
  embed_tokens` -- so we write `tie_word_embeddings: false`; `lm_head` is
  `ParallelLMHead(draft_vocab_size, hidden_size)`.
- `load_weights`: `d2t` becomes `hot_token_id = d2t + arange` (so d2t holds
  offsets: target = draft + d2t[draft]); `t2d` is skipped; q/k/v_proj and
  gate/up_proj are stacked into qkv_proj / gate_up_proj; other names get a
  `model.` prefix when not found as they are (fc.weight -> model.fc.weight,
  midlayer.* -> model.midlayer.*, norm.weight -> model.norm.weight);
  `lm_head.weight` matches as it is. No embed_tokens: the worker shares the
  target's embedding.
- The aux layer ids come from `eagle_config.eagle_aux_hidden_state_layer_ids`
  and go through the target's `set_eagle3_layers_to_capture` (ops.layers).

vLLM, vllm/model_executor/models/llama_eagle3.py (Eagle3LlamaForCausalLM):
- `LlamaDecoderLayer` layer 0: `qkv_input_size = 2 * hidden_size`, `hidden_norm`;
  `norm_before_residual` picks `_norm_before_residual` (residual = normed
  hidden) or `_norm_after_residual` (residual = hidden; ours).
- `LlamaModel.load_weights`: `midlayer.` is renamed to `layers.0.`; stacked
  q/k/v and gate/up as in SGLang. `Eagle3LlamaForCausalLM.load_weights`: `t2d`
  skipped, `d2t` -> `draft_id_to_target_id` (used as `base + d2t` in
  compute_logits), names other than lm_head get `model.`; embed_tokens skipped
  when absent.
- vllm/transformers_utils/configs/speculators/algos.py `update_eagle3`:
  `norm_before_residual = config_dict.get("norm_before_residual", True)` --
  absent means True, so we write false explicitly; `draft_vocab_size`,
  `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` are read from the
  top level; the layer sizes from `transformer_layer_config`.
  .../speculators/base.py: requires `speculators_config.proposal_methods[0]
  .speculative_tokens`, `speculators_config.verifier.name_or_path`,
  `speculators_model_type`, `transformer_layer_config` (a dict).

speculators (vllm-project/speculators) src/speculators/models/eagle3/config.py
(`Eagle3SpeculatorConfig`: architectures ["Eagle3Speculator"],
speculators_model_type "eagle3", transformer_layer_config, draft_vocab_size,
norm_before_residual, target_hidden_size, eagle_aux_hidden_state_layer_ids)
and core.py / model_definitions.py (`fc`, `layers.0.{self_attn.q/k/v/o_proj,
mlp.*, input_layernorm, hidden_norm, post_attention_layernorm}`, `norm`,
`lm_head`, `d2t`, `t2d`). embed_tokens.weight is written too (the target's
embedding in the export's dtype): 0.9.0's model.py `DraftVocabMixin` lists it in
`_keys_to_ignore_on_load_missing` and `_load_verifier_weights` fills it from the
verifier only `if self.embed_tokens.weight.isnan().any()`, a check on a tensor
that from_pretrained allocates and does not initialise, so a missing one gave
allocator-dependent logits. vLLM loads it when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ops.drafter.config import DrafterConfig, rope_parameters_of
from ops import layers
from ops.common import load_json_file

SGLANG_ARCH = "LlamaForCausalLMEagle3"
SPECULATORS_ARCH = "Eagle3Speculator"
SGLANG_DIR = "sglang"
SPECULATORS_DIR = "speculators"
INFO_FILE = "export_info.json"
WEIGHTS = "model.safetensors"


class ExportFormatError(ValueError):
    pass


def _legacy_rope(cfg: DrafterConfig) -> tuple[float, dict | None]:
    rope = dict(cfg.rope_parameters)
    theta = float(rope.pop("rope_theta", 10000.0))
    if rope.get("rope_type", "default") == "default":
        return theta, None
    return theta, rope


def _layer_fields(cfg: DrafterConfig, dtype: str) -> dict[str, Any]:
    theta, scaling = _legacy_rope(cfg)
    return {
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": cfg.hidden_act,
        "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "vocab_size": cfg.target_vocab_size,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": dtype,
    }


def sglang_config(cfg: DrafterConfig, dtype: str) -> dict[str, Any]:
    ids = layers.sglang_config_ids_for(cfg.target_architecture, cfg.aux_layer_ids)
    return dict(_layer_fields(cfg, dtype), architectures=[SGLANG_ARCH],
                draft_vocab_size=cfg.draft_vocab_size, target_hidden_size=cfg.hidden_size,
                eagle_config={"eagle_aux_hidden_state_layer_ids": ids, "use_aux_hidden_state": True})


def speculators_config(cfg: DrafterConfig, dtype: str, speculative_tokens: int, verifier: str) -> dict[str, Any]:
    return {
        "architectures": [SPECULATORS_ARCH],
        "speculators_model_type": "eagle3",
        "draft_vocab_size": cfg.draft_vocab_size,
        "norm_before_residual": False,
        "target_hidden_size": cfg.hidden_size,
        "eagle_aux_hidden_state_layer_ids": layers.vllm_aux_ids(cfg.aux_layer_ids),
        "transformer_layer_config": _layer_fields(cfg, dtype),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier, "architectures": [cfg.target_architecture]},
        },
        "torch_dtype": dtype,
    }


def to_format(state: dict, fmt: str) -> dict:
    """The drafter's state (SGLang names) renamed for `fmt`."""
    if fmt == SGLANG_DIR:
        return dict(state)
    if fmt == SPECULATORS_DIR:
        return {k.replace("midlayer.", "layers.0.", 1) if k.startswith("midlayer.") else k: v
                for k, v in state.items()}
    raise ExportFormatError(f"unknown format {fmt!r}")


def from_format(state: dict, fmt: str) -> dict:
    """The drafter's trainable state (SGLang names) from `fmt`'s tensors (the
    speculators format's copy of the target's embedding is not the drafter's)."""
    if fmt == SPECULATORS_DIR:
        return {k.replace("layers.0.", "midlayer.", 1) if k.startswith("layers.0.") else k: v
                for k, v in state.items() if k != "embed_tokens.weight"}
    return dict(state)


def expected_shapes(config: dict, fmt: str) -> dict[str, tuple[int, ...]]:
    """Every tensor the engine's loader takes, with its shape, from config.json alone."""
    lc = config["transformer_layer_config"] if fmt == SPECULATORS_DIR else config
    h, tgt_h = lc["hidden_size"], config.get("target_hidden_size") or lc["hidden_size"]
    q, kv = lc["num_attention_heads"] * lc["head_dim"], lc["num_key_value_heads"] * lc["head_dim"]
    inter, vd, vt = lc["intermediate_size"], config["draft_vocab_size"], lc["vocab_size"]
    layer = "layers.0." if fmt == SPECULATORS_DIR else "midlayer."
    return {
        "fc.weight": (h, 3 * tgt_h),
        f"{layer}self_attn.q_proj.weight": (q, 2 * h),
        f"{layer}self_attn.k_proj.weight": (kv, 2 * h),
        f"{layer}self_attn.v_proj.weight": (kv, 2 * h),
        f"{layer}self_attn.o_proj.weight": (h, q),
        f"{layer}mlp.gate_proj.weight": (inter, h),
        f"{layer}mlp.up_proj.weight": (inter, h),
        f"{layer}mlp.down_proj.weight": (h, inter),
        f"{layer}input_layernorm.weight": (h,),
        f"{layer}hidden_norm.weight": (h,),
        f"{layer}post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
        "d2t": (vd,),
        "t2d": (vt,),
        **({"embed_tokens.weight": (vt, h)} if fmt == SPECULATORS_DIR else {}),
    }


def detect_format(path: Path) -> tuple[Path, str]:
    """(directory, format) for an export output root or one format's directory."""
    path = Path(path)
    for sub in (SGLANG_DIR, SPECULATORS_DIR):
        if (path / sub / "config.json").exists():
            path = path / sub
            break
    cfg_path = path / "config.json"
    config = load_json_file(cfg_path, ExportFormatError, "expected an export directory")
    if config.get("speculators_model_type") == "eagle3":
        return path, SPECULATORS_DIR
    if SGLANG_ARCH in (config.get("architectures") or []):
        return path, SGLANG_DIR
    raise ExportFormatError(f"{cfg_path}: neither architectures [{SGLANG_ARCH!r}] nor "
                            f"speculators_model_type 'eagle3'")


def canonical_ids(config: dict, fmt: str, target_arch: str) -> list[int]:
    """The canonical aux ids a written config makes the engine capture."""
    if fmt == SPECULATORS_DIR:
        return [int(v) - 1 for v in config["eagle_aux_hidden_state_layer_ids"]]
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    return [int(v) - 1 for v in layers.apply_sglang_rule(target_arch, ids)]


def read_export(path: Path, target_arch: str | None = None):
    """(Eagle3Drafter on CPU in float32, DrafterConfig, format, directory) from an
    export; shapes are checked against the config before anything is loaded."""
    import torch
    from safetensors.torch import load_file

    from ops.drafter.model import Eagle3Drafter

    path, fmt = detect_format(path)
    config = json.loads((path / "config.json").read_text())
    info = {}
    info_path = path.parent / INFO_FILE
    if info_path.exists():
        info = json.loads(info_path.read_text())
    arch = target_arch or info.get("target_architecture") or "LlamaForCausalLM"
    weights = path / WEIGHTS
    if not weights.exists():
        raise ExportFormatError(f"{weights}: missing")
    state = load_file(str(weights))
    want = expected_shapes(config, fmt)
    missing = sorted(set(want) - set(state))
    extra = sorted(set(state) - set(want))
    if missing or extra:
        raise ExportFormatError(f"{weights}: missing tensors {missing}, unexpected tensors {extra}")
    for k, shape in want.items():
        if tuple(state[k].shape) != shape:
            raise ExportFormatError(f"{weights}: tensor {k!r} has shape {tuple(state[k].shape)}, "
                                    f"config.json implies {shape}")
    lc = config["transformer_layer_config"] if fmt == SPECULATORS_DIR else config
    cfg = DrafterConfig(
        hidden_size=lc["hidden_size"], num_attention_heads=lc["num_attention_heads"],
        num_key_value_heads=lc["num_key_value_heads"], head_dim=lc["head_dim"],
        intermediate_size=lc["intermediate_size"], draft_vocab_size=config["draft_vocab_size"],
        target_vocab_size=lc["vocab_size"], rms_norm_eps=lc["rms_norm_eps"], hidden_act=lc["hidden_act"],
        max_position_embeddings=lc["max_position_embeddings"], rope_parameters=rope_parameters_of(lc),
        aux_layer_ids=canonical_ids(config, fmt, arch),
        target_num_layers=int(info.get("target_num_layers", 0)), target_architecture=arch,
        target_model_type=str(info.get("target_model_type", "llama")))
    model = Eagle3Drafter(cfg)
    state = {k: (v.float() if v.is_floating_point() else v) for k, v in from_format(state, fmt).items()}
    state["d2t"] = state["d2t"].to(torch.long)
    state["t2d"] = state["t2d"].to(torch.bool)
    model.load_trainable_state(state, where=str(weights))
    return model, cfg, fmt, path
