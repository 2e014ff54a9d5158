"""Reference EAGLE-3 speculative decoding (greedy, chain drafting, top-1), in torch.

Used by ops.bench over the Hugging Face target and an exported drafter. Batch
1, KV caches on both sides:

1. the target prefills the prompt (positions 0..n-1) and picks x_n; its aux
   states a_0..a_{n-1} (hidden_states[k+1], ops.layers) go to the drafter,
   which pairs a_t with token x_{t+1} at position t (the pairing training used);
2. the drafter chains K drafts from its last state: draft i is fed back with
   the drafter's own output state at position n-1+i (its chain keys are
   dropped after drafting);
3. the target verifies [x_n, d_1..d_K] in one forward: drafts are accepted
   while each equals the target's greedy choice, and the target's choice after
   the last accepted one is the bonus token; m accepted drafts = m + 1 tokens
   for one target forward;
4. the target's cache is cropped to the accepted tokens, the drafter's
   prefix is extended with the target's aux states of those positions.

Greedy speculative output equals greedy decoding token for token (up to
floating-point ties, which the bench reports as mismatches).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ops.drafter.model import DraftCache


@dataclass
class SpecStats:
    verify_forwards: int = 0
    accepted_at: list[int] = field(default_factory=list)    # [K]: steps whose draft i was accepted
    reached: list[int] = field(default_factory=list)        # [K]: steps where draft i was examined

    def add(self, other: "SpecStats") -> None:
        self.verify_forwards += other.verify_forwards
        n = max(len(self.accepted_at), len(other.accepted_at))
        self.accepted_at = [a + b for a, b in zip(self.accepted_at + [0] * (n - len(self.accepted_at)),
                                                  other.accepted_at + [0] * (n - len(other.accepted_at)))]
        self.reached = [a + b for a, b in zip(self.reached + [0] * (n - len(self.reached)),
                                              other.reached + [0] * (n - len(other.reached)))]


class TargetRunner:
    """The HF target with its cache kwarg and output names across transformers versions."""

    def __init__(self, model, aux_hidden_indices: list[int]):
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.cache_kw = "cache" if "cache" in params else "past_key_values"
        self.aux_idx = aux_hidden_indices

    def __call__(self, ids: torch.Tensor, cache, want_aux: bool):
        kwargs = {"input_ids": ids, "use_cache": True, "output_hidden_states": want_aux}
        if cache is not None:
            kwargs[self.cache_kw] = cache
        out = self.model(**kwargs)
        new_cache = out.get("cache") if out.get("cache") is not None else out.get("past_key_values")
        aux = torch.cat([out.hidden_states[i] for i in self.aux_idx], -1) if want_aux else None
        return out.logits, new_cache, aux


def crop(cache, keep: int) -> None:
    remove = cache.get_seq_length() - keep
    if remove > 0:
        cache.crop(-remove)          # negative = tokens to drop, in old and new transformers alike


@torch.no_grad()
def greedy(target: TargetRunner, prompt: list[int], max_new: int, eos: set[int]) -> tuple[list[int], int]:
    """Plain greedy decoding: (tokens, target forwards)."""
    dev = target.model.device
    logits, cache, _ = target(torch.tensor([prompt], device=dev), None, False)
    out = [int(logits[0, -1].argmax())]
    forwards = 1
    while len(out) < max_new and out[-1] not in eos:
        logits, cache, _ = target(torch.tensor([[out[-1]]], device=dev), cache, False)
        out.append(int(logits[0, -1].argmax()))
        forwards += 1
    return out, forwards


@torch.no_grad()
def speculative(target: TargetRunner, drafter, embed: torch.Tensor, prompt: list[int], max_new: int,
                k: int, eos: set[int], stats: SpecStats) -> tuple[list[int], int]:
    """Speculative greedy decoding: (tokens, target forwards incl. prefill)."""
    dev = target.model.device
    if not stats.accepted_at:
        stats.accepted_at, stats.reached = [0] * k, [0] * k
    dtype = next(drafter.parameters()).dtype

    def emb(tokens: list[int]) -> torch.Tensor:
        return F.embedding(torch.tensor([tokens], device=dev), embed).to(dtype)

    logits, cache, aux = target(torch.tensor([prompt], device=dev), None, True)
    nxt = int(logits[0, -1].argmax())
    out = [nxt]
    forwards = 1
    n = len(prompt)                       # target cache = positions 0..n-1; nxt sits at n
    dcache = DraftCache()
    d_out, d_logits = drafter.extend(emb(prompt[1:] + [nxt]), aux.to(dtype), 0, dcache, fuse=True)
    while len(out) < max_new and out[-1] not in eos:
        base = dcache.length
        hidden, logit = d_out[:, -1:], d_logits[:, -1]
        drafts: list[int] = []
        for i in range(k):
            drafts.append(int(drafter.draft_to_target(logit.argmax(-1))[0]))
            if i + 1 < k:
                hidden, lg = drafter.extend(emb(drafts[-1:]), hidden, n - 1 + i + 1, dcache, fuse=False)
                logit = lg[:, -1]
        dcache.truncate(base)
        logits, cache, aux = target(torch.tensor([[nxt] + drafts], device=dev), cache, True)
        forwards += 1
        choice = logits[0].argmax(-1).tolist()          # choice[i]: the target's token after position n+i
        m = 0
        while m < k and drafts[m] == choice[m]:
            m += 1
        for i in range(min(m + 1, k)):
            stats.reached[i] += 1
        for i in range(m):
            stats.accepted_at[i] += 1
        stats.verify_forwards += 1
        new = drafts[:m] + [choice[m]]
        crop(cache, n + 1 + m)                         # keep nxt and the accepted drafts
        d_out, d_logits = drafter.extend(emb(new), aux[:, : m + 1].to(dtype), n, dcache, fuse=True)
        n += m + 1
        nxt = new[-1]
        for tok in new:
            out.append(tok)
            if tok in eos or len(out) >= max_new:
                break
    return out[:max_new], forwards
