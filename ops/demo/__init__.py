"""The embedded demo workspace's assets: corpus, tokenizer and tiny target.

`eagle3-console demo [DIR]` (eagle3_console/cli/demo.py) calls build_demo_assets()
and writes the workspace's eagle3.toml from what it returns; the demo's
prepare -> vocab -> extract -> ... stages then run on these files like on a
real server's. Layout under `dest`:

    data/conversations.jsonl    synthetic corpus (corpus.py), ShareGPT + OpenAI rows
    target/                     LlamaForCausalLM (safetensors) + its tokenizer and chat template
    demo_assets.json            the marker: version, seed, status "complete", the result

Deterministic for a seed and cached: a complete marker with the same version,
seed and sizes returns at once (tests build smaller sizes). Importing this
package imports no torch.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import time
from pathlib import Path
from typing import Callable

from ops.common import TMP_SUFFIX

DEMO_VERSION = 1
MARKER = "demo_assets.json"
LOCK = ".demo_assets.lock"
CORPUS = "data/conversations.jsonl"
TARGET = "target"
N_CONVERSATIONS = 400
TOKENIZER_VOCAB = 512
TRAIN_STEPS = 240
SUGGESTED_MAX_SEQ_LEN = 256          # the corpus' long rows (~300-500 tokens) get truncated
SUGGESTED_DRAFT_VOCAB = 128          # fewer than the ~160 ids the answers use: coverage < 100 %


def cached_assets(dest: Path, seed: int = 0, train_steps: int = TRAIN_STEPS,
                  n_conversations: int = N_CONVERSATIONS) -> dict | None:
    """The result of a complete earlier build with this version, seed and sizes, else None."""
    try:
        marker = json.loads((Path(dest) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    if (marker.get("status") == "complete" and marker.get("version") == DEMO_VERSION
            and marker.get("seed") == seed
            and marker.get("sizes") == _sizes(train_steps, n_conversations)
            and (Path(dest) / CORPUS).is_file()
            and (Path(dest) / TARGET / "config.json").is_file()):
        result = dict(marker["result"])
        result.update(cached=True, corpus_path=str(Path(dest).resolve() / CORPUS),
                      target_path=str(Path(dest).resolve() / TARGET))
        return result
    return None


def _sizes(train_steps: int, n_conversations: int) -> dict:
    return {"train_steps": train_steps, "conversations": n_conversations}


def _conversation_messages(row: dict) -> list[dict]:
    from ops.conversations import parse_row

    return parse_row(row, "demo corpus", 0).messages


def build_demo_assets(dest: Path, seed: int = 0, train_steps: int = TRAIN_STEPS,
                      n_conversations: int = N_CONVERSATIONS,
                      log: Callable[[str], None] | None = None) -> dict:
    """Build (or reuse) the demo assets under `dest` and describe them.

    Returns: root, corpus and target (paths relative to `dest`), corpus_path
    and target_path (absolute), num_layers, hidden_size, vocab_size, dtype,
    max_seq_len and draft_vocab_size (suggested stage params), layer_ids (the
    default canonical aux layers), conversations, train (loss and accuracy
    before/after, steps, seconds), build_seconds, seed, version, cached.
    `log`, when given, receives one line per step of the build (e.g. print).
    """
    dest = Path(dest)
    hit = cached_assets(dest, seed, train_steps, n_conversations)
    if hit is not None:
        return hit
    dest.mkdir(parents=True, exist_ok=True)
    # Two `demo` commands on one directory: the second waits, then reuses the build.
    with open(dest / LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached_assets(dest, seed, train_steps, n_conversations)
        if hit is not None:
            return hit
        return _build(dest, seed, train_steps, n_conversations, log)


def _build(dest: Path, seed: int, train_steps: int, n_conversations: int,
           log: Callable[[str], None] | None) -> dict:
    t0 = time.time()
    say = log or (lambda _m: None)
    from ops.demo.corpus import generate_rows, row_texts, write_corpus
    from ops.demo.target import HIDDEN, NUM_LAYERS, train_target
    from ops.demo.tokenizer import build_tokenizer, save_tokenizer

    try:
        (dest / MARKER).unlink()
    except FileNotFoundError:
        pass
    rows = generate_rows(seed=seed, n=n_conversations)
    write_corpus(dest / CORPUS, rows)
    say(f"corpus: {len(rows)} conversations (seed {seed}) -> {dest / CORPUS}")
    # Role names are in the template, not the corpus: teach them to the BPE too.
    texts = [t for r in rows for t in row_texts(r)] + ["system\nuser\nassistant\n"] * 50
    tokenizer = build_tokenizer(texts, vocab_size=TOKENIZER_VOCAB)
    say(f"tokenizer: byte-level BPE, {len(tokenizer)} tokens, chat template with <|im_end|>")
    rendered = [tokenizer.apply_chat_template(m, tokenize=False)
                for m in map(_conversation_messages, rows) if any(x["role"] == "assistant" for x in m)]

    building = dest / (TARGET + ".building")
    shutil.rmtree(building, ignore_errors=True)
    report = train_target(tokenizer, rendered, building, seed=seed, steps=train_steps, log=say)
    save_tokenizer(tokenizer, building)
    shutil.rmtree(dest / TARGET, ignore_errors=True)
    building.rename(dest / TARGET)

    result = {
        "root": str(dest.resolve()),
        "corpus": CORPUS,
        "target": TARGET,
        "num_layers": NUM_LAYERS,
        "hidden_size": HIDDEN,
        "vocab_size": len(tokenizer),
        "dtype": "float32",
        "max_seq_len": SUGGESTED_MAX_SEQ_LEN,
        "draft_vocab_size": SUGGESTED_DRAFT_VOCAB,
        "layer_ids": [1, NUM_LAYERS // 2 - 1, NUM_LAYERS - 4],
        "conversations": len(rows),
        "train": vars(report),
        "build_seconds": round(time.time() - t0, 2),
        "seed": seed,
        "version": DEMO_VERSION,
    }
    tmp = dest / (MARKER + TMP_SUFFIX)
    tmp.write_text(json.dumps({"version": DEMO_VERSION, "seed": seed, "status": "complete",
                               "sizes": _sizes(train_steps, n_conversations),
                               "result": result}, indent=2) + "\n")
    tmp.replace(dest / MARKER)
    say(f"demo assets built in {result['build_seconds']:.1f} s -> {dest}")
    result.update(cached=False, corpus_path=str(dest.resolve() / CORPUS),
                  target_path=str(dest.resolve() / TARGET))
    return result
