"""verify --deep: load some samples' tensors; with the target, recompute them.

Sits after the header pass (check.py), on files it found good. Loading
catches what a header cannot: NaN/Inf, a loss mask that is not 0/1, token ids
outside the vocabulary. Recomputing a few samples with the target is
recompute.py's.
"""

from __future__ import annotations

import random



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
