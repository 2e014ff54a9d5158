"""The frozen target's side of a training step: its logits over the draft ids
from the extracted final states, and the check that a batch's token ids fit its
embedding; what the loop (ops/train/loop.py) asks of the target each step.
"""

from __future__ import annotations


class TargetView:
    """The frozen target pieces on the training device, and the per-batch targets."""

    def __init__(self, head, vocab, device, dtype, post_norm: bool):
        import torch

        self.embed = head.embed.to(device=device, dtype=dtype)
        self.lm_head = head.lm_head.to(device=device, dtype=dtype)
        self.norm = head.norm.to(device=device, dtype=torch.float32)
        self.eps = head.eps
        self.post_norm = post_norm
        self.draft_ids = vocab.draft_to_target.to(device)
        self.t2d = vocab.t2d.to(device)

    def targets(self, final, loss_mask, lengths):
        """(logits over the draft ids [B,T,Vd], counted [B,T]) from the target's final states."""
        import torch

        with torch.no_grad():
            if not self.post_norm:
                x = final.float()
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
                final = x
            b, t, h = final.shape
            flat = final.reshape(-1, h).to(self.lm_head.dtype)
            rows = max(1, (1 << 27) // self.lm_head.shape[0])
            restricted, in_vocab = [], []
            for i in range(0, flat.shape[0], rows):
                logits = flat[i:i + rows] @ self.lm_head.T
                in_vocab.append(self.t2d[logits.argmax(-1)])
                restricted.append(logits[:, self.draft_ids])
            restricted = torch.cat(restricted).view(b, t, -1)
            in_vocab = torch.cat(in_vocab).view(b, t)
            pos = torch.arange(t, device=final.device)
            next_exists = (pos + 1).unsqueeze(0) < lengths.to(final.device).unsqueeze(1)
            next_masked = torch.nn.functional.pad(loss_mask[:, 1:], (0, 1))
            return restricted, in_vocab & next_exists & next_masked

    def greedy(self, final):
        """The target's greedy pick [B,T] over its whole vocabulary at every position."""
        import torch

        with torch.no_grad():
            x = final.float()
            if not self.post_norm:
                x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
            b, t, h = x.shape
            flat = x.reshape(-1, h).to(self.lm_head.dtype)
            rows = max(1, (1 << 27) // self.lm_head.shape[0])
            return torch.cat([(flat[i:i + rows] @ self.lm_head.T).argmax(-1)
                              for i in range(0, flat.shape[0], rows)]).view(b, t)


def out_of_vocab(batch: dict, info, vocab_size: int, target: str) -> str | None:
    """What is wrong when a batch holds a token id the target's embedding has
    no row for (negative or >= vocab_size): the file, sample, position, id."""
    ids = batch["input_ids"]
    bad = (ids < 0) | (ids >= vocab_size)
    if not bool(bad.any()):
        return None
    row, col = (int(v) for v in bad.nonzero()[0])
    idx = int(batch["samples"][row])
    return (f"{info.samples[idx]}: sample {idx} holds token id {int(ids[row, col])} at position {col}, "
            f"outside the target's vocabulary of {vocab_size} ids ({target}); "
            f"the hidden states were extracted with another tokenizer or target")
