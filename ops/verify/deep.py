"""verify --deep: load some samples' tensors; with the target, recompute them.

Sits after the header pass (check.py), on files it found good. Loading
catches what a header cannot: NaN/Inf, a loss mask that is not 0/1, token ids
outside the vocabulary. Recomputing a few samples through Hugging Face's own
`output_hidden_states` (not the hooks extract used) catches the silent bug of
the wrong layer: each aux block must equal `hidden_states[k + 1]` for its
canonical id k (ops/layers.py) and the final state the post-norm output. On a
mismatch it says which layer the block does match.
"""

from __future__ import annotations

import random
from pathlib import Path

from ops.layers import hf_hidden_states_index

# Relative Frobenius error allowed between stored and recomputed states: the
# stored ones come from padded batches, so bf16 rounding differs a little.
_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 2e-2}


def pick(indices: list[int], n: int, seed: int) -> list[int]:
    if n >= len(indices):
        return sorted(indices)
    return sorted(random.Random(seed).sample(sorted(indices), n))


def load_sample(path: str, config: dict) -> dict:
    """A sample file's tensors, its states decoded from the output's format (float32)."""
    import torch
    from safetensors.torch import load_file

    from ops.hidden_codec import decode_states
    from ops.hidden_formats import STATE_KEYS, config_format

    data = load_file(path)
    fmt = config_format(config, "data_config.json")
    hidden = int(config.get("hidden_size") or data["final_hidden_states"].shape[-1])
    states = decode_states(fmt, data, STATE_KEYS, hidden, torch.float32)
    return {"input_ids": data["input_ids"], "loss_mask": data["loss_mask"], **states}


def load_checks(paths: dict[int, str], vocab_size: int | None, config: dict | None = None) -> list[dict]:
    """Bad files found by loading: [{"path", "reason"}]."""
    import torch

    bad = []
    for idx, path in paths.items():
        try:
            data = load_sample(path, config or {})
        except Exception as exc:  # noqa: BLE001 - any load failure is a bad file
            bad.append({"path": path, "reason": f"cannot load: {exc}"})
            continue
        for key in ("aux_hidden_states", "final_hidden_states"):
            finite = torch.isfinite(data[key].float())
            if not bool(finite.all()):
                bad.append({"path": path, "reason": f"{key}: {int((~finite).sum())} NaN/Inf values"})
                break
        else:
            mask = data["loss_mask"]
            if bool(((mask != 0) & (mask != 1)).any()):
                bad.append({"path": path, "reason": "loss_mask has values other than 0 and 1"})
                continue
            ids = data["input_ids"]
            if bool((ids < 0).any()) or (vocab_size is not None and bool((ids >= vocab_size).any())):
                bad.append({"path": path, "reason": f"input_ids outside the vocabulary 0..{vocab_size}"})
    return bad


def recompute(paths: dict[int, str], target: Path, config: dict) -> tuple[list[dict], list[dict]]:
    """(per-sample comparison records, bad files) for samples recomputed with the target."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from ops.hidden_formats import config_format, relative_error

    dtype = str(config.get("dtype") or "float32")
    layer_ids = list(config.get("layer_ids") or [])
    hidden = int(config["hidden_size"])
    # The engine's numerics plus what the storage format's round trip may add.
    tol = _TOLERANCE.get(dtype, 2e-2) + relative_error(config_format(config, "data_config.json"))
    kwargs: dict = {}
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    kwargs["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = getattr(torch, dtype)
    if torch.cuda.is_available():
        kwargs["device_map"] = "auto"
    model = AutoModelForCausalLM.from_pretrained(str(target), **kwargs).eval()
    device = model.get_input_embeddings().weight.device

    records, bad = [], []
    for idx, path in paths.items():
        data = load_sample(path, config)
        with torch.inference_mode():
            out = model.model(input_ids=data["input_ids"][None].to(device), output_hidden_states=True,
                              use_cache=False)
        states = [h[0].float().cpu() for h in out.hidden_states]
        record = {"sample": idx, "path": path, "blocks": []}
        problems = []
        aux = data["aux_hidden_states"].float()
        for j, k in enumerate(layer_ids):
            block = aux[:, j * hidden:(j + 1) * hidden]
            want = hf_hidden_states_index(k)
            if want >= len(states) - 1:
                # Hugging Face makes the last entry the post-norm state: the
                # last layer's raw output is not there to compare with.
                record["blocks"].append({"layer_id": k, "rel_error": None, "note": "not checkable"})
                continue
            err = _rel(block, states[want])
            # Which hidden_states index does this block match best? Names a wrong-layer bug.
            best = min(range(len(states)), key=lambda i: _rel(block, states[i]))
            record["blocks"].append({"layer_id": k, "rel_error": err, "best_hf_index": best})
            if err > tol:
                problems.append(f"aux block {j} (layer_ids[{j}]={k}) differs from hidden_states[{want}] "
                                f"by {err:.3g} (tolerance {tol:g}); it matches hidden_states[{best}], "
                                f"i.e. canonical layer {best - 1}")
        if config.get("final_hidden_state", "post_norm") == "post_norm":
            err = _rel(data["final_hidden_states"].float(), out.last_hidden_state[0].float().cpu())
            record["final_rel_error"] = err
            if err > tol:
                problems.append(f"final_hidden_states differs from the post-norm output by {err:.3g}")
        records.append(record)
        if problems:
            bad.append({"path": path, "reason": "recomputed with the target: " + "; ".join(problems)})
    return records, bad


def _rel(a, b) -> float:
    import torch

    if a.shape != b.shape:
        return float("inf")
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-12))
