"""The layer convention, said once; every other id is derived here.

Sits between the ops that name layers: extract records these ids in
data_config.json, verify recomputes against them, export writes the SGLang /
vLLM draft config from them. Importable without torch.

Canonical id k = the 0-indexed decoder layer whose OUTPUT is captured.

- Hugging Face `output_hidden_states`: `hidden_states[k + 1]` (index 0 is the
  embeddings; in transformers 5 the last entry is overwritten with the
  post-norm state, so k = N - 1 is not reachable there, only through a hook).
- SGLang's internal `layers_to_capture` and vLLM's
  `eagle_aux_hidden_state_layer_ids` count the layer whose INPUT the state is:
  k + 1.
- SGLang's draft `config.json` ids are not used as they are: the target model's
  `set_eagle3_layers_to_capture(layer_ids)` turns them into
  `layers_to_capture`. Checked in sgl-project/sglang,
  python/sglang/srt/models/llama.py (also qwen3.py, glm4_moe_lite.py):
  `layers_to_capture = [val + 1 for val in layer_ids]`;
  python/sglang/srt/models/deepseek_v2.py (DeepSeek V2/V3/V3.2 and Kimi K2,
  whose config says DeepseekV3ForCausalLM): `[val + 1 ...]` only when
  `layer_ids[0] == 1`, else `list(layer_ids)` as they are.
  So `sglang_config_ids_for` picks ids for the draft config, applies the
  engine's rule back to them and refuses unless that lands on k + 1.

Real run: aux layers [2, 30, 58] + final 60 on a 61-layer model = SGLang
capture [3, 31, 59].
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# Architectures / model types served by SGLang's deepseek_v2.py, whose
# set_eagle3_layers_to_capture adds 1 only when the first id is 1.
_FIRST_IS_ONE_FAMILIES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseekv2",
                          "deepseekv3", "deepseekv32", "kimi_k2", "kimik2")

RULE_PLUS_ONE = "plus_one"
RULE_PLUS_ONE_IF_FIRST_IS_ONE = "plus_one_if_first_is_one"


def default_aux_layers(num_layers: int) -> list[int]:
    """Canonical `[1, N//2 - 1, N - 4]`: the layers SGLang and vLLM capture by
    default (their inputs of layers `[2, N//2, N - 3]`)."""
    n = int(num_layers)
    ids = [1, n // 2 - 1, n - 4]
    if any(b <= a for a, b in zip(ids, ids[1:])) or ids[0] < 0:
        raise ValueError(
            f"a {n}-layer target has no three distinct default aux layers "
            f"(the rule [1, N//2-1, N-4] gives {ids}); pass layer_ids explicitly")
    return ids


def parse_layer_ids(value: str | Sequence[int] | None, num_layers: int) -> list[int]:
    """Canonical aux ids from a param ("auto", "2,30,58" or a list), checked
    against the target: integers, strictly increasing, each in [0, N - 1]."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return default_aux_layers(num_layers)
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
    else:
        parts = list(value)
    try:
        ids = [int(p) for p in parts]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"layer_ids {value!r}: expected comma-separated integers ({exc})") from exc
    if not ids:
        raise ValueError(f"layer_ids {value!r}: no layer ids")
    bad = [k for k in ids if not 0 <= k < num_layers]
    if bad:
        raise ValueError(f"layer_ids {ids}: {bad} outside the target's layers 0..{num_layers - 1} "
                         f"(canonical ids are 0-indexed decoder layers whose output is captured)")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"layer_ids {ids}: must be strictly increasing")
    return ids


def hf_hidden_states_index(k: int) -> int:
    return int(k) + 1


def hf_hidden_states_indices(ks: Iterable[int]) -> list[int]:
    return [hf_hidden_states_index(k) for k in ks]


def sglang_capture_ids(ks: Iterable[int]) -> list[int]:
    """SGLang's internal `layers_to_capture`: the layer whose input is the state."""
    return [int(k) + 1 for k in ks]


def vllm_aux_ids(ks: Iterable[int]) -> list[int]:
    """vLLM's `eagle_aux_hidden_state_layer_ids`."""
    return [int(k) + 1 for k in ks]


def sglang_rule(arch: str) -> str:
    """Which `set_eagle3_layers_to_capture` the target architecture gets in
    SGLang; `arch` is an `architectures` entry or a `model_type`."""
    key = str(arch or "").lower().replace("-", "_")
    if any(f in key or f in key.replace("_", "") for f in _FIRST_IS_ONE_FAMILIES):
        return RULE_PLUS_ONE_IF_FIRST_IS_ONE
    return RULE_PLUS_ONE


def apply_sglang_rule(arch: str, config_ids: Sequence[int]) -> list[int]:
    """What SGLang's target model does with the draft config's ids."""
    ids = [int(v) for v in config_ids]
    if sglang_rule(arch) == RULE_PLUS_ONE_IF_FIRST_IS_ONE:
        return [v + 1 for v in ids] if ids and ids[0] == 1 else list(ids)
    return [v + 1 for v in ids]


def sglang_config_ids_for(arch: str, ks: Sequence[int]) -> list[int]:
    """Ids to write into the SGLang draft config.json so that the target's
    `set_eagle3_layers_to_capture` lands on `[k + 1]`; ValueError if none does.

    Candidates, in order: the ids as canonical (what llama.py expects) and the
    ids already shifted (what deepseek_v2.py takes as they are unless the first
    is 1)."""
    want = sglang_capture_ids(ks)
    candidates = [[int(k) for k in ks], want]
    for ids in candidates:
        if apply_sglang_rule(arch, ids) == want:
            return ids
    raise ValueError(
        f"no draft config ids make SGLang ({sglang_rule(arch)} rule for {arch!r}) capture "
        f"{want} for canonical layers {list(ks)}: writing {candidates[0]} gives "
        f"{apply_sglang_rule(arch, candidates[0])}, writing {candidates[1]} gives "
        f"{apply_sglang_rule(arch, candidates[1])}; choose other aux layers")


def engine_ids(ks: Sequence[int], num_layers: int, arch: str | None) -> dict:
    """The per-engine ids data_config.json records next to the canonical ones."""
    out = {
        "layer_ids": [int(k) for k in ks],
        "final_layer_id": int(num_layers) - 1,
        "num_layers_captured": len(ks) + 1,
        "hf_hidden_states_indices": hf_hidden_states_indices(ks),
        "sglang_layers_to_capture": sglang_capture_ids(ks),
        "vllm_eagle_aux_hidden_state_layer_ids": vllm_aux_ids(ks),
    }
    if arch:
        out["sglang_rule"] = sglang_rule(arch)
        try:
            out["sglang_config_layer_ids"] = sglang_config_ids_for(arch, ks)
        except ValueError as exc:
            out["sglang_config_layer_ids"] = None
            out["sglang_config_error"] = str(exc)
    return out
