"""The embedded demo workspace: real pipeline, laptop-sized.

Data flow: ops.demo.build_demo_assets (corpus, tokenizer, tiny target; cached)
-> this module writes eagle3.toml wiring prepare -> vocab -> extract -> verify
-> train -> export -> bench -> the console runs them as real runs.
`--model smollm2` or `--model qwen-coder-1.5b` puts a real pretrained target
there instead (the model's extra, converted once by ops.demo.realmodel;
demo_realmodel.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ops.demo.realmodel import MODELS as REAL_MODELS

TEMPLATE = """\
# The demo pipeline: the real ops on a tiny target ({num_layers} layers, hidden {hidden_size},
# vocab {vocab_size}) trained on a synthetic corpus. Built by `eagle3-console demo`.

[target]
path = "{target}"
num_layers = {num_layers}
hidden_size = {hidden_size}
dtype = "{dtype}"
vocab_size = {vocab_size}

[stages.prepare]
op = "prepare"
description = "tokenize the conversations with the chat template; loss mask on assistant turns"
params = {{ input = "{corpus}", output = "data/prepared", max_seq_len = {max_seq_len} }}

[stages.vocab]
op = "vocab"
depends_on = ["prepare"]
description = "draft vocabulary: the most frequent masked target tokens"
params = {{ input = "data/prepared", output = "data/vocab", draft_vocab_size = {draft_vocab_size} }}

[stages.extract]
op = "extract"
depends_on = ["prepare"]
description = "hidden states of the aux layers + the final state, one safetensors file a sample"
params = {{ input = "data/prepared", output = "data/hidden_states", max_seq_len = {max_seq_len}, token_budget = 4096, device = "cpu", writers = 2 }}
restart = {{ max = 2, backoff_s = 5 }}

[stages.verify]
op = "verify"
depends_on = ["extract"]
description = "every sample's header, indices and totals; a few samples recomputed with the target"
params = {{ input = "data/hidden_states", deep = 4, recompute = 2, report = "runs/verify.json" }}

[stages.train]
op = "train"
depends_on = ["verify", "vocab"]
description = "fit the drafter (training-time test over 3 steps)"
params = {{ data = "data/hidden_states", vocab = "data/vocab", output = "runs/drafter", epochs = 12, lr = 3e-3, ttt_steps = 3, token_budget = 4096, holdout = 24, workers = 0, device = "cpu", save_every = 100 }}

[stages.export]
op = "export"
depends_on = ["train"]
description = "SGLang and speculators/vLLM checkpoints, reloaded and checked"
params = {{ checkpoint = "runs/drafter", output = "runs/export", dtype = "float32", data = "data/hidden_states" }}

[stages.bench]
op = "bench"
depends_on = ["export"]
description = "speculative decoding vs greedy on held-out prompts: acceptance length, speed-up"
params = {{ drafter = "runs/export", data = "data/hidden_states", output = "runs/bench", num_prompts = 8, max_new_tokens = 48, draft_tokens = 3, device = "cpu" }}
"""


MODELS = ("tiny", *REAL_MODELS)        # the real ones: smollm2, qwen-coder-1.5b


def write_demo_workspace(root: Path, log: Callable[[str], None] | None = None, seed: int = 0,
                         model: str = "tiny") -> tuple[Path, dict]:
    """Build (or reuse) the assets under root/assets and write root/eagle3.toml
    unless one exists (an operator's edits are never overwritten). `model`:
    tiny (the trained toy target) or a real model of ops.demo.realmodel.MODELS
    (its MissingExtra without its extra, or with a part not as pinned)."""
    if model != "tiny":
        from eagle3_console.cli.demo_realmodel import write_realmodel_workspace
        return write_realmodel_workspace(root, model, log=log, seed=seed)
    from ops.demo import build_demo_assets

    root.mkdir(parents=True, exist_ok=True)
    assets = build_demo_assets(root / "assets", seed=seed, log=log)
    config = root / "eagle3.toml"
    if not config.exists():
        config.write_text(TEMPLATE.format(
            target="assets/" + assets["target"], corpus="assets/" + assets["corpus"],
            num_layers=assets["num_layers"], hidden_size=assets["hidden_size"], vocab_size=assets["vocab_size"],
            dtype=assets["dtype"], max_seq_len=assets["max_seq_len"], draft_vocab_size=assets["draft_vocab_size"]))
    return config, assets
