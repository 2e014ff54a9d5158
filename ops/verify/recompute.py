"""verify --recompute: a few samples through the target again, stored vs recomputed.

Sits under deep.py (on files the header and load checks found good); reads
the target with Hugging Face's own `output_hidden_states` (not the hooks
extract used) plus the final norm's input. Each aux block and the final
state is held to three checks, each reported with its figure and bound:
  rms        the rows' RMS relative error within the numerics bound (bounds.py)
  row        the worst row within the row bound (a zeroed or overwritten row)
  neighbour  much nearer its own layer than the layers beside it (the
             classic off-by-one: the state of layer k-1 or k+1 recorded as k)
A sample's states taken from another sample fail the first two.
"""

from __future__ import annotations

from pathlib import Path

from ops.common import BadInput
from ops.hidden_formats import config_format, relative_error
from ops.layers import hf_hidden_states_index
from ops.verify.bounds import NEIGHBOUR_RATIO, Bound, format_error, nearer_own, numeric_bound


def engine_kind(config: dict) -> str:
    """"same" when extract ran the target in Hugging Face as this recompute does."""
    return "same" if str(config.get("extraction_method") or "hf").startswith("hf") else "other"


def load_target(target: Path, dtype: str):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    kwargs: dict = {}
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    kwargs["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = getattr(torch, dtype)
    if torch.cuda.is_available():
        kwargs["device_map"] = "auto"
    return AutoModelForCausalLM.from_pretrained(str(target), **kwargs).eval()


def layer_states(model, input_ids) -> tuple[list, object, object, object]:
    """(output of each decoder layer by canonical id, the embeddings, the
    post-norm output, the final norm applied to the layer before the last)."""
    import torch

    seen: dict = {}

    def keep_input(_module, args, _output) -> None:     # returning None keeps the norm's output
        seen.setdefault("pre", args[0])

    handle = model.model.norm.register_forward_hook(keep_input)
    device = model.get_input_embeddings().weight.device
    try:
        with torch.inference_mode():
            out = model.model(input_ids=input_ids[None].to(device), output_hidden_states=True, use_cache=False)
            # hidden_states: the embeddings, then layers 0..N-2's outputs, then
            # the post-norm output; the last layer's own output is the norm's input.
            prev_post = model.model.norm(out.hidden_states[-2])[0].float().cpu()
    finally:
        handle.remove()
    hs = [h[0].float().cpu() for h in out.hidden_states]
    layers = hs[1:-1] + [seen["pre"][0].float().cpu()]
    return layers, hs[0], out.last_hidden_state[0].float().cpu(), prev_post


def row_errors(stored, ref) -> tuple[float, float, int]:
    """(rows' RMS relative error, the worst row's, its index)."""
    import torch

    if stored.shape != ref.shape:
        return float("inf"), float("inf"), -1
    e = torch.linalg.norm(stored - ref, dim=1) / torch.linalg.norm(ref, dim=1).clamp_min(1e-12)
    worst = int(torch.argmax(e))
    return float(e.pow(2).mean().sqrt()), float(e[worst]), worst


def judge(name: str, stored, own, own_label: str, neighbours: dict, bound: Bound) -> tuple[dict, list[str]]:
    """The record of one state against its recomputation, and its failed checks in words."""
    rms, worst, row = row_errors(stored, own)
    near = {label: row_errors(stored, ref)[0] for label, ref in neighbours.items()}
    record = {"rms_rel": rms, "max_row_rel": worst, "worst_row": row, "bound": bound.as_json(),
              "neighbours": near, "failed": []}
    problems = []
    if not rms <= bound.rms:
        record["failed"].append("rms")
        problems.append(f"{name}: rows' RMS relative error {rms:.3g} from {own_label} > numerics bound "
                        f"{bound.rms:.3g}")
    if not worst <= bound.row:
        record["failed"].append("row")
        problems.append(f"{name}: row {row}'s relative error {worst:.3g} > row bound {bound.row:.3g}")
    if near:
        label, gap = min(near.items(), key=lambda kv: kv[1])
        # The stored value's own error (int4's 0.12-0.15) lies on both distances: taken out of both.
        if not nearer_own(rms, gap, bound.stored):
            record["failed"].append("neighbour")
            without = (f", the stored value's own error {bound.stored:.3g} taken out of both"
                       if bound.stored >= 1e-3 else "")
            problems.append(f"{name}: not nearer {own_label} ({rms:.3g}) than {NEIGHBOUR_RATIO:g} x its "
                            f"distance from {label} ({gap:.3g}){without}")
    return record, problems


def recompute(paths: dict[int, str], target: Path, config: dict) -> tuple[list[dict], list[dict]]:
    """(per-sample comparison records, bad files) for samples recomputed with the target."""
    from ops.verify.deep import load_sample

    dtype = str(config.get("dtype") or "float32")
    layer_ids = [int(k) for k in config.get("layer_ids") or []]
    hidden = int(config["hidden_size"])
    # The stored value's error: its dtype's rounding plus what the output's format
    # (bf16 as written, fp8, int4) adds in its round trip; an unknown format is BadFormat.
    try:
        stored_error = format_error(dtype) + relative_error(config_format(config, "data_config.json"))
    except ValueError as exc:
        raise BadInput(f"data_config.json dtype: {exc}") from None
    engine = engine_kind(config)
    model = load_target(target, dtype)
    n_layers = int(model.config.num_hidden_layers)

    records, bad = [], []
    for idx, path in paths.items():
        data = load_sample(path, config)
        layers, embeddings, post, prev_post = layer_states(model, data["input_ids"])
        record = {"sample": idx, "path": path, "engine": engine, "blocks": []}
        problems: list[str] = []
        aux = data["aux_hidden_states"].float()
        for j, k in enumerate(layer_ids):
            name = f"aux block {j} (layer_ids[{j}]={k})"
            if not 0 <= k < n_layers:
                problems.append(f"{name}: the target has layers 0..{n_layers - 1}")
                continue
            block = aux[:, j * hidden:(j + 1) * hidden]
            neighbours = {(f"layer {k - 1}" if k else "the embeddings"): (layers[k - 1] if k else embeddings)}
            if k + 1 < n_layers:
                neighbours[f"layer {k + 1}"] = layers[k + 1]
            bound = numeric_bound(dtype, k + 1, engine, stored_error, hidden)
            rec, found = judge(name, block, layers[k], f"layer {k}", neighbours, bound)
            nearest = min(range(n_layers), key=lambda i: row_errors(block, layers[i])[0])
            rec.update(layer_id=k, hf_index=hf_hidden_states_index(k), nearest_layer=nearest)
            if found and nearest != k:
                found.append(f"{name}: it matches layer {nearest} best (hidden_states[{nearest + 1}])")
            record["blocks"].append(rec)
            problems += found
        final = data["final_hidden_states"].float()
        bound = numeric_bound(dtype, n_layers, engine, stored_error, hidden)
        last = f"layer {n_layers - 1}"
        if config.get("final_hidden_state", "post_norm") == "post_norm":
            rec, found = judge("final_hidden_states", final, post, "the post-norm output",
                               {f"the pre-norm output of {last}": layers[-1],
                                f"the post-norm output of layer {n_layers - 2}": prev_post}, bound)
        else:
            rec, found = judge("final_hidden_states", final, layers[-1], f"the pre-norm output of {last}",
                               {"the post-norm output": post, f"layer {n_layers - 2}": layers[-2]}, bound)
        record["final"] = rec
        record["final_rel_error"] = rec["rms_rel"]
        problems += found
        records.append(record)
        if problems:
            bad.append({"path": path, "reason": "recomputed with the target: " + "; ".join(problems)})
    return records, bad
