"""The drafter's training loss: soft cross-entropy of its logits against the
target's, whole (one [B, T, draft vocab] fp32 logits tensor a step) or a chunk
of rows at a time (_ChunkedSoftCE: the logits of K steps never held at once).

Where it sits: under model.py's Eagle3Drafter.forward (loss "full" or
"chunked"), which compiles these functions when compile_step is on.
"""

from __future__ import annotations

import torch


def full_soft_ce(normed, lm_head, tgt, ok):
    logits = lm_head(normed).float()
    tgt = tgt.float()
    ce = -(torch.softmax(tgt, -1) * torch.log_softmax(logits, -1)).sum(-1)
    ce_sum = (ce * ok.float()).sum()
    right = ((logits.argmax(-1) == tgt.argmax(-1)) & ok).sum().float()
    return ce_sum, right


class _ChunkedSoftCE(torch.autograd.Function):
    """sum over counted rows of soft CE(target logits, x @ W^T), and the count of
    rows whose argmaxes agree, a chunk of rows at a time. The forward computes
    d(sum)/dx and d(sum)/dW (d CE / d logits = softmax(logits) - softmax(target)),
    so only [chunk, Vd] fp32 is ever live; backward scales them.
    Matmuls in the autocast dtype where autocast is on, as nn.Linear's would be.

    A chunk is whole samples (chunk_rows // T of them) or, for samples longer
    than chunk_rows, a run of rows of one sample: slices of the [B, T, ...]
    inputs as they are (the target logits are a strided view of the padded
    ones; flattening them would copy [B, T, Vd] each step). Each chunk writes
    its d CE / d logits into one [B, T, Vd] buffer in the matmul dtype, and the
    two gradient matmuls run once over all rows after the loop: two large
    matmuls accumulating in fp32 instead of two small ones and an fp32
    [Vd, H] read-modify-write per chunk."""

    @staticmethod
    def forward(ctx, x, weight, target, okf, chunk_rows, chunk=None):
        device = x.device.type
        mm = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
        b, t, h = x.shape
        w = weight.to(mm)
        chunk = chunk or soft_ce_chunk      # model.py passes the compiled one under compile_step
        per = max(1, chunk_rows // t)           # samples a chunk
        run = min(t, max(1, chunk_rows))        # rows of a sample a chunk
        with torch.autocast(device, enabled=False):
            grad_logits = torch.empty((b, t, w.shape[0]), dtype=mm, device=x.device)
            ce_sum = torch.zeros((), dtype=torch.float32, device=x.device)
            right = torch.zeros((), dtype=torch.float32, device=x.device)
            for b0 in range(0, b, per):
                for r0 in range(0, t, run):
                    rows = (slice(b0, b0 + per), slice(r0, r0 + run))
                    ce_c, right_c, g = chunk(x[rows], w, target[rows], okf[rows])
                    ce_sum += ce_c
                    right += right_c
                    grad_logits[rows] = g
            flat = grad_logits.view(-1, w.shape[0])
            grad_x = (flat @ w).view(b, t, h).to(x.dtype)
            grad_w = (flat.T @ x.reshape(-1, h).to(mm)).float()
        ctx.save_for_backward(grad_x, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(right)
        return ce_sum, right

    @staticmethod
    def backward(ctx, grad_sum, _grad_right):
        grad_x, grad_w = ctx.saved_tensors
        return (grad_x * grad_sum.to(grad_x.dtype), (grad_w * grad_sum).to(ctx.weight_dtype),
                None, None, None, None)


def soft_ce_chunk(x, w, target, okc):
    """One chunk of _ChunkedSoftCE ([n, r, ...] slices): (CE sum, argmax
    agreements, d CE / d logits in w's dtype); w is already in the matmul dtype."""
    logits = (x.to(w.dtype) @ w.T).float()
    tc = target.float()
    log_p = torch.log_softmax(logits, -1)
    p_t = torch.softmax(tc, -1)
    ce = (-(p_t * log_p).sum(-1) * okc).sum()
    right = ((logits.argmax(-1) == tc.argmax(-1)).float() * okc).sum()
    g = ((log_p.exp() - p_t) * okc[..., None]).to(w.dtype)
    return ce, right, g


# The loss's one entry: (CE sum, argmax agreements) of x @ weight^T against
# target over the okf rows; `chunk`: soft_ce_chunk, or its compiled self.
chunked_soft_ce = _ChunkedSoftCE.apply
