"""The demo's tiny target model: a Llama-family LM trained briefly on the demo corpus.

Feeds the demo workspace's extract / train / bench stages exactly like a real
target directory: LlamaForCausalLM saved with save_pretrained (safetensors,
config.json) next to its tokenizer. Trained on CPU for a few hundred steps so
its next-token predictions follow the corpus' rules; the loss and the
next-token accuracy on held-out conversations, before and after training,
are returned so the build can report them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# 8 layers so that the default aux layers [1, N//2 - 1, N - 4] = [1, 3, 4] are distinct.
NUM_LAYERS = 8
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 192
MAX_POSITIONS = 512


@dataclass
class TrainReport:
    steps: int
    loss_before: float
    loss_after: float
    accuracy_before: float      # top-1 next-token accuracy on held-out tokens
    accuracy_after: float
    seconds: float


def model_config(tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=NUM_LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-6, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _batches(token_lists, pad_id: int, batch: int, max_len: int):
    import torch

    for i in range(0, len(token_lists), batch):
        chunk = [t[:max_len] for t in token_lists[i:i + batch]]
        width = max(len(t) for t in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        for r, t in enumerate(chunk):
            ids[r, :len(t)] = torch.tensor(t)
            attn[r, :len(t)] = 1
        labels = ids.masked_fill(attn == 0, -100)
        yield ids, attn, labels


def _evaluate(model, batches) -> tuple[float, float]:
    import torch

    model.eval()
    loss_sum, n, correct = 0.0, 0, 0
    with torch.no_grad():
        for ids, attn, labels in batches:
            logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
            target = labels[:, 1:]
            valid = target != -100
            loss_sum += torch.nn.functional.cross_entropy(
                logits[valid], target[valid], reduction="sum").item()
            correct += (logits.argmax(-1)[valid] == target[valid]).sum().item()
            n += int(valid.sum())
    model.train()
    return loss_sum / n, correct / n


def train_target(tokenizer, texts: list[str], out_dir: Path, seed: int = 0, steps: int = 300,
                 batch: int = 16, max_len: int = 192, lr: float = 3e-3,
                 log: Callable[[str], None] | None = None) -> TrainReport:
    """Train a fresh tiny Llama on the rendered conversations `texts`; save it to `out_dir`."""
    import torch

    t0 = time.time()
    threads = torch.get_num_threads()
    # Matrices this small are all dispatch overhead: extra threads only
    # contend, by an order of magnitude on busy cores.
    torch.set_num_threads(1)
    try:
        return _train(tokenizer, texts, out_dir, seed, steps, batch, max_len, lr, t0, log or (lambda _m: None))
    finally:
        torch.set_num_threads(threads)


def _train(tokenizer, texts, out_dir, seed, steps, batch, max_len, lr, t0, log) -> TrainReport:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    tokens = tokenizer(texts, add_special_tokens=False)["input_ids"]
    n_eval = max(1, min(32, len(tokens) // 5))
    held_out, train = tokens[-n_eval:], tokens[:-n_eval]
    eval_batches = list(_batches(held_out, tokenizer.pad_token_id, 32, max_len))

    model = LlamaForCausalLM(model_config(tokenizer))
    loss_before, acc_before = _evaluate(model, eval_batches)
    log(f"target: {NUM_LAYERS} layers, hidden {HIDDEN}, vocab {len(tokenizer)}; "
        f"held-out loss {loss_before:.3f} before training")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    step = 0
    while step < steps:
        # sort shuffled windows of 8 batches by length so batches carry little
        # padding, then shuffle the batches themselves
        order = torch.randperm(len(train), generator=gen).tolist()
        window = batch * 8
        epoch = []
        for w in range(0, len(order), window):
            epoch += sorted((train[i] for i in order[w:w + window]), key=len)
        batches = list(_batches(epoch, tokenizer.pad_token_id, batch, max_len))
        for b in torch.randperm(len(batches), generator=gen).tolist():
            ids, attn, labels = batches[b]
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step % 50 == 0 or step == steps:
                log(f"target: step {step}/{steps} loss {loss.item():.3f}")
            if step >= steps:
                break
    loss_after, acc_after = _evaluate(model, eval_batches)
    log(f"target: held-out loss {loss_after:.3f}, next-token accuracy {acc_before:.1%} -> {acc_after:.1%}")
    out_dir.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()   # no "Writing model shards" bar in the demo's output
    try:
        model.save_pretrained(str(out_dir))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return TrainReport(steps=steps, loss_before=round(loss_before, 4), loss_after=round(loss_after, 4),
                       accuracy_before=round(acc_before, 4), accuracy_after=round(acc_after, 4),
                       seconds=round(time.time() - t0, 2))
