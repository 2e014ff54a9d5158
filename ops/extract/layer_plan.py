"""extract's aux layer ids before a launch: the line `run` prints (every
spelling that gets mixed up, side by side, each named for what it is) and the
lints (ids the target cannot have; a list that may be another spelling). The
spec's plan_lines and lint hooks; the conversions are ops/layers.py's. No torch.
"""

from __future__ import annotations

from pathlib import Path

from ops import layers
from ops.common import count, read_json
from ops.formats import DATA_CONFIG, read_data_config
from ops.spec import EstimateContext, Lint

# The spellings an aux-layer list found elsewhere may be in, and how each maps
# back to canonical ids (the draft config's depends on the target's rule).
_SHIFTED = ("SGLang's capture list (layers_to_capture), vLLM's eagle_aux_hidden_state_layer_ids "
            "or an HF hidden_states index")


def _layer_ids(ctx: EstimateContext) -> tuple[list[int] | None, int | None]:
    """(canonical ids, num_layers); ValueError for ids the target cannot have."""
    n = count(ctx.target.get("num_layers"))
    value = ctx.params.get("layer_ids", "auto")
    if n is None:
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None, None
        return layers.parse_layer_ids(value, 1 << 30), None
    return layers.parse_layer_ids(value, n), n


def _architecture(ctx: EstimateContext) -> str | None:
    """The target's architecture from its config.json (else `[target].architecture`),
    or None where neither is here yet."""
    path = ctx.target.get("path")
    config = read_json(ctx.root / Path(str(path)).expanduser() / "config.json") if path else None
    archs = (config or {}).get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])
    if config and config.get("model_type"):
        return str(config["model_type"])
    return ctx.target.get("architecture") or None


def draft_config_ids(ks: list[int], arch: str | None) -> str:
    """The ids export writes as the SGLang draft config's eagle_aux_hidden_state_layer_ids:
    per the target's set_eagle3_layers_to_capture rule; both rules where the
    architecture is unknown and they differ."""
    def ids_for(a: str) -> str:
        try:
            return str(layers.sglang_config_ids_for(a, ks))
        except ValueError:
            return "none fits"
    if arch:
        return ids_for(arch)
    llama, deepseek = ids_for("LlamaForCausalLM"), ids_for("DeepseekV3ForCausalLM")
    return llama if llama == deepseek else f"{llama} (Llama rule) / {deepseek} (DeepSeek/Kimi rule)"


def layer_line(ctx: EstimateContext) -> list[str]:
    """The aux layers in every spelling, side by side."""
    try:
        ks, n = _layer_ids(ctx)
    except ValueError as exc:
        return [f"layers: {exc}"]
    if ks is None:
        return ["layers: auto ([target].num_layers is not set: the target's config.json decides at run time)"]
    final = f" + final {n - 1}" if n else ""
    shifted = layers.sglang_capture_ids(ks)
    return [f"layers ({n if n else '?'}-layer target): canonical {ks}{final} | "
            f"SGLang capture (layers_to_capture) {shifted} | "
            f"vLLM eagle_aux_hidden_state_layer_ids {layers.vllm_aux_ids(ks)} | "
            f"SGLang draft config.json eagle_aux_hidden_state_layer_ids (export writes) "
            f"{draft_config_ids(ks, _architecture(ctx))} | "
            f"HF hidden_states index {layers.hf_hidden_states_indices(ks)}"]


def _readings(ks: list[int], n: int, arch: str | None) -> str:
    """What canonical ids `ks` would stand for in each other spelling."""
    out = []
    if min(ks) >= 1:
        out.append(f"if it is {_SHIFTED}: canonical {[k - 1 for k in ks]}")
    rules = [arch] if arch else ["LlamaForCausalLM", "DeepseekV3ForCausalLM"]
    seen: dict[str, str] = {}
    for a in rules:
        captured = layers.apply_sglang_rule(a, ks)
        canon = [c - 1 for c in captured]
        if min(canon) >= 0 and max(canon) < n:
            seen.setdefault(str(canon), layers.sglang_rule(a))
    for canon, rule in seen.items():
        out.append(f"if it is an SGLang draft config.json's eagle_aux_hidden_state_layer_ids "
                   f"({rule} rule): canonical {canon}")
    return "; ".join(out)


def layer_lints(ctx: EstimateContext) -> list[Lint]:
    """Ids the target cannot have (error); an explicit list other than the default,
    with every reading it could have if pasted from another spelling (warning)."""
    try:
        ks, n = _layer_ids(ctx)
    except ValueError as exc:
        return [Lint("error", f"stages.{ctx.stage}.params.layer_ids: {exc}", forceable=False)]
    out = output_layer_lints(ctx, ks)
    if ks is None or n is None:
        return out
    try:
        default = layers.default_aux_layers(n)
    except ValueError:
        default = None
    if ks == default:
        return out
    arch = _architecture(ctx)
    said = (f"stages.{ctx.stage}.params.layer_ids {ks} is read as canonical ids (the OUTPUT of decoder "
            f"layers {ks}: SGLang capture {layers.sglang_capture_ids(ks)})")
    readings = _readings(ks, n, arch)
    if readings:
        said += f"; {readings}"
    if default is not None and ks == layers.sglang_capture_ids(default):
        said += (f". It equals SGLang's default capture list for a {n}-layer target (canonical {default}, "
                 f"\"auto\"): keep it only to capture {layers.sglang_capture_ids(ks)}")
    return out + [Lint("warning", said)]


def output_layer_lints(ctx: EstimateContext, ks: list[int] | None) -> list[Lint]:
    """An output that holds other aux layers than this run would capture: the op
    refuses to resume it (after the model's load), so the plan says it first."""
    output = ctx.path("output")
    existing = read_data_config(output) if output is not None else None
    there = existing.get("layer_ids") if isinstance(existing, dict) else None
    if ks is None or not isinstance(there, list) or there == ks:
        return []
    return [Lint("error", f"{output / DATA_CONFIG}: the output holds aux layers {there} (canonical), this run "
                          f"would capture {ks}; a run keeps its layers: set layer_ids = {there} to resume it, or "
                          f"use another output", forceable=False)]
