"""The held-out acceptance: the drafter decoded as bench decodes, on the samples train held out.

Data flow: the held-out samples' extracted states (ops/drafter/data.py) + the
frozen target's head (TargetView) + the drafter being trained -> per answer
turn, the drafts a depth-K chain makes at every position and how many of them
the target's greedy picks accept -> ops/drafter/metrics.py's walk (bench's
count: completion tokens / verify steps, the first token of a turn from the
prefill) -> the `simulated_acceptance_length` of ops/train's metrics.jsonl
records. Called from ops/train/__main__.py at every logged window.

The chain is the training-time-test unroll in eval mode: step k at index n-1
reads the tokens up to n+k and predicts token n+k+1, which a chain drafting
after token n does as draft k+1 once drafts 1..k were accepted. Where the chain
reads its accepted drafts (the target's picks) the unroll reads the answer's
tokens: the same when the answer is the target's own greedy text, and then the
count is bench's (tests/test_sim_acceptance.py); on a corpus' answers it is off
by how far the target's own text is from them. The target's pick at position j
is the argmax over its whole vocabulary of its LM head on the final state, so a
pick outside the draft vocabulary is a miss, as it is for bench.
"""

from __future__ import annotations

from itertools import groupby

from ops.drafter.metrics import chain_verifies


def turns(mask: list[bool]) -> list[tuple[int, int]]:
    """(first, last) index of each run of loss-masked tokens: one answer turn each."""
    out, start = [], 0
    for masked, run in groupby(mask, bool):
        n = len(list(run))
        if masked:
            out.append((start, start + n - 1))
        start += n
    return out


class HeldOut:
    """The held-out samples' batches, and the drafter's acceptance on them."""

    def __init__(self, info, held: list[int], token_budget: int, max_len: int, bucket: int = 0):
        from ops.drafter.data import make_batches

        self.format, self.hidden = info.format, info.hidden_size
        # Training's batch shapes (its length buckets): the attention kernels built for them serve these.
        batches = make_batches({i: info.lengths[i] for i in held}, token_budget, max_len, bucket)
        self.dataset = info.dataset(batches, max_len, bucket, token_budget) if held else None

    def measure(self, model, view, steps: int, device, dtype) -> dict | None:
        """{acceptance_length, tokens, verifies, by_depth, acc} of the model on the
        held-out samples at depth K = steps (by_depth: the acceptance length of a
        chain of depth 1..K, for a bench whose draft_tokens is below ttt_steps;
        acc: the per-step accuracies there, counted as training counts); None
        without held-out samples or answer tokens."""
        import torch

        from ops.drafter.data import batch_keys, decode_batch

        if self.dataset is None:
            return None
        was_training, compiled = model.training, model.compile_step
        # Eager: compiled graphs are per shape and grad mode, and these batches are neither training's.
        model.eval()
        model.compile_step = False
        tokens = 0
        verifies = [0] * steps                  # [d - 1]: verify steps of a chain of depth d <= K
        correct, counted = torch.zeros(steps), torch.zeros(steps)
        try:
            with torch.no_grad():
                for i in range(len(self.dataset)):
                    batch = self.dataset[i]
                    ids = batch["input_ids"].to(device)
                    states = decode_batch({k: batch[k].to(device) for k in batch_keys(self.format)},
                                          self.format, self.hidden, dtype)
                    aux, final = states["aux"], states["final"]
                    mask, lengths = batch["loss_mask"].to(device), batch["lengths"]
                    _logits, ok = view.targets(final, mask, lengths)     # what training counts
                    picks = view.greedy(final)                          # [B, T]: the target's token after j
                    b, t = ids.shape
                    pad = torch.nn.functional.pad(picks, (0, steps + 1), value=-1)
                    ok_pad = torch.nn.functional.pad(ok, (0, steps + 1))
                    hits = []
                    for k, draft in model.unroll_drafts(ids, aux, view.embed, steps):
                        hits.append(draft == pad[:, k + 1:k + 1 + t])      # draft at t: for token t+k+2
                        # Training's accuracy (its positions: the pick in the draft vocabulary), for the record.
                        counts = ok_pad[:, k + 1:k + 1 + t]
                        correct[k] += float((hits[-1] & counts).sum())
                        counted[k] += float(counts.sum())
                    # accepted[b, t]: drafts the chain after token t+1 gets accepted (leading hits)
                    accepted = torch.stack(hits, 1).long().cumprod(1).sum(1).cpu().tolist()
                    for row in range(b):
                        n = int(lengths[row])
                        for first, last in turns(batch["loss_mask"][row, :n].tolist()):
                            if first == 0:
                                continue            # no prompt before it: nothing to draft from
                            tokens += last - first + 1
                            run = accepted[row][first - 1:last - 1]
                            for d in range(1, steps + 1):
                                verifies[d - 1] += chain_verifies([min(a, d) for a in run])
        finally:
            model.train(was_training)
            model.compile_step = compiled
        if tokens == 0:
            return None
        return {"acceptance_length": tokens / max(1, verifies[-1]), "tokens": tokens, "verifies": verifies[-1],
                "by_depth": [tokens / max(1, v) for v in verifies], "acc": (correct / counted.clamp(min=1)).tolist()}
