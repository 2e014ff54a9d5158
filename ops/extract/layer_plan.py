"""extract's aux layer ids before a launch: the line `run` prints (the three
spellings that get mixed up, side by side) and the lints (ids the target
cannot have; the classic off-by-one). The spec's plan_lines and lint hooks;
the conversions are ops/layers.py's. No torch.
"""

from __future__ import annotations

from ops import layers
from ops.extract.sizes import count
from ops.spec import EstimateContext, Lint


def _layer_ids(ctx: EstimateContext) -> tuple[list[int] | None, int | None]:
    """(canonical ids, num_layers); ValueError for ids the target cannot have."""
    n = count(ctx.target.get("num_layers"))
    value = ctx.params.get("layer_ids", "auto")
    if n is None:
        if isinstance(value, str) and value.strip().lower() in ("", "auto"):
            return None, None
        return layers.parse_layer_ids(value, 1 << 30), None
    return layers.parse_layer_ids(value, n), n


def layer_line(ctx: EstimateContext) -> list[str]:
    """The aux layers in the three spellings, side by side."""
    try:
        ks, n = _layer_ids(ctx)
    except ValueError as exc:
        return [f"layers: {exc}"]
    if ks is None:
        return ["layers: auto ([target].num_layers is not set: the target's config.json decides at run time)"]
    final = f" + final {n - 1}" if n else ""
    return [f"layers ({n if n else '?'}-layer target): canonical {ks}{final} | SGLang capture / "
            f"eagle_aux_hidden_state_layer_ids {layers.sglang_capture_ids(ks)} | "
            f"HF hidden_states index {layers.hf_hidden_states_indices(ks)}"]


def layer_lints(ctx: EstimateContext) -> list[Lint]:
    """Ids the target cannot have (error), and the classic off-by-one: ids equal to
    the SGLang spelling of the default (warning naming both readings)."""
    try:
        ks, n = _layer_ids(ctx)
    except ValueError as exc:
        return [Lint("error", f"stages.{ctx.stage}.params.layer_ids: {exc}")]
    if ks is None or n is None:
        return []
    try:
        default = layers.default_aux_layers(n)
    except ValueError:
        return []
    sglang_default = layers.sglang_capture_ids(default)
    if ks != sglang_default or ks == default:
        return []
    return [Lint("warning", (
        f"stages.{ctx.stage}.params.layer_ids {ks} is read as canonical ids (the OUTPUT of decoder layers {ks}; "
        f"SGLang capture {layers.sglang_capture_ids(ks)}); it equals SGLang's default capture list "
        f"(layers_to_capture / eagle_aux_hidden_state_layer_ids) for a {n}-layer target, which is canonical "
        f"{default}: if you copied SGLang's list, write {default} (or \"auto\")"))]
