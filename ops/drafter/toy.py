"""Tiny learnable targets and their extractions, for tests and smoke runs.

Builds what the pipeline's earlier stages would hand to train/export/bench, at
toy scale and on CPU: a small Llama target trained briefly on a corpus whose
continuations are predictable (arithmetic runs: a rule token fixes the stride),
the hidden-state layout of shared/DESIGN.md (written by a plain forward with
output_hidden_states, independent of ops.extract), and a vocab.safetensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ops.common import TMP_SUFFIX
from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, sample_path

VOCAB = 96
FIRST_CONTENT = 8
STRIDES = {4: 1, 5: 2, 6: 3, 7: 5}      # rule token -> stride
N_CONTENT = VOCAB - FIRST_CONTENT
BOS, EOS = 1, 2


def make_sample(rng, length: int) -> tuple[list[int], list[int]]:
    """[BOS, rule, start, ...run...]: the loss mask covers the run after the start."""
    rule = int(rng.choice(list(STRIDES)))
    x = FIRST_CONTENT + int(rng.integers(N_CONTENT))
    ids = [BOS, rule, x]
    for _ in range(length - 3):
        x = FIRST_CONTENT + (x - FIRST_CONTENT + STRIDES[rule]) % N_CONTENT
        ids.append(x)
    mask = [0, 0, 0] + [1] * (length - 3)
    return ids, mask


def make_corpus(n: int, seed: int, min_len: int = 12, max_len: int = 40):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [make_sample(rng, int(rng.integers(min_len, max_len + 1))) for _ in range(n)]


def build_target(out: Path, seed: int = 0, steps: int = 150, layers: int = 4, hidden: int = 64,
                 tie: bool = False) -> Path:
    """Train a tiny LlamaForCausalLM on the arithmetic corpus and save it (safetensors)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=hidden, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=layers, intermediate_size=2 * hidden, vocab_size=VOCAB,
                      max_position_embeddings=256, bos_token_id=BOS, eos_token_id=EOS,
                      tie_word_embeddings=tie)
    model = LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    corpus = make_corpus(steps * 16, seed + 1, 32, 32)
    for i in range(steps):
        batch = torch.tensor([ids for ids, _ in corpus[i * 16:(i + 1) * 16]])
        loss = model(batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    out = Path(out)
    model.save_pretrained(out, safe_serialization=True)
    (out / "toy_train.json").write_text(json.dumps({"final_loss": float(loss.detach()), "steps": steps}))
    return out


def extract(target: Path, samples, out: Path, layer_ids: list[int], dtype: str = "float32") -> Path:
    """Hidden states of `samples` in the DESIGN.md layout (post-norm final state)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype))
    model.eval()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"hidden_size": model.config.hidden_size, "layer_ids": list(layer_ids),
           "total_samples": len(samples), "dtype": dtype, "status": "running",
           "final_hidden_state": "post_norm"}
    (out / DATA_CONFIG).write_text(json.dumps(cfg))
    lengths = {}
    with torch.no_grad():
        for idx, (ids, mask) in enumerate(samples):
            hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            tensors = {
                "input_ids": torch.tensor(ids, dtype=torch.long),
                "loss_mask": torch.tensor(mask, dtype=torch.uint8),
                "aux_hidden_states": torch.cat([hs[k + 1][0] for k in layer_ids], -1).contiguous(),
                "final_hidden_states": hs[-1][0].contiguous(),
            }
            path = sample_path(out, idx)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + TMP_SUFFIX)
            save_file(tensors, str(tmp))
            os.replace(tmp, path)
            lengths[str(idx)] = len(ids)
    (out / SAMPLE_LENGTHS).write_text(json.dumps(lengths))
    cfg.update(status="complete", total_tokens=sum(lengths.values()))
    (out / DATA_CONFIG).write_text(json.dumps(cfg))
    return out


def write_prepared(samples, out: Path) -> Path:
    """`samples` as prepare writes them (samples.safetensors + summary.json,
    ops/prepared.py's layout): what extract and online training read."""
    import numpy as np
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    lengths = [len(ids) for ids, _ in samples]
    save_file({"input_ids": np.array([i for ids, _ in samples for i in ids], dtype=np.int32),
               "loss_mask": np.array([m for _, mask in samples for m in mask], dtype=np.uint8),
               "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)},
              str(out / "samples.safetensors"))
    (out / "summary.json").write_text(json.dumps({"status": "complete", "samples": len(samples),
                                                  "total_tokens": sum(lengths)}))
    return out


def build_vocab(samples, out: Path, size: int, target_vocab: int = VOCAB) -> Path:
    """The most frequent masked ids (ties by id), sorted ascending, padded with unused ids."""
    import torch
    from safetensors.torch import save_file

    counts = torch.zeros(target_vocab, dtype=torch.long)
    for ids, mask in samples:
        for i, m in zip(ids, mask):
            if m:
                counts[i] += 1
    order = sorted(range(target_vocab), key=lambda i: (-int(counts[i]), i))
    chosen = sorted(order[:size])
    d2t = torch.tensor(chosen, dtype=torch.long) - torch.arange(size)
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[chosen] = True
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({"d2t": d2t, "t2d": t2d}, str(out / "vocab.safetensors"))
    (out / "vocab.json").write_text(json.dumps({"draft_vocab_size": size, "target_vocab_size": target_vocab}))
    return out


def toy_assets(root: Path, n_samples: int = 64, draft_vocab: int = 80, layer_ids=(0, 1, 2)) -> dict[str, Path]:
    """target/, hidden_states/, vocab/ under root, built once (a stamp marks them whole)."""
    root = Path(root)
    stamp = root / "toy.json"
    paths = {"target": root / "target", "data": root / "hidden_states", "vocab": root / "vocab",
             "samples": root / "prepared"}
    if not stamp.exists():
        samples = make_corpus(n_samples, seed=7)
        build_target(paths["target"])
        extract(paths["target"], samples, paths["data"], list(layer_ids))
        build_vocab(samples, paths["vocab"], draft_vocab)
        write_prepared(samples, paths["samples"])
        stamp.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return paths
