"""The training-time-test attention of the drafter: which keys a TTT step's
queries may see, as a boolean mask (SDPA) or a FlexAttention block mask, and
the FlexAttention kernel itself (compiled on CUDA).

Where it sits: under ops/drafter/layer.py (Eagle3Attention.attend_flex) and
model.py's unroll (ops.train's forward). Step 0 attends causally to its own
keys; step k to step 0's keys causally and to each later step's key at the
query's own index (its chain), so the mask over the concatenated keys is
[causal | eye | eye ...].
"""

from __future__ import annotations

import torch

# Each compiled function (and compiled FlexAttention) sees one shape per batch
# shape: one a length bucket, 16 at max_len 4,096 and bucket 256 (more
# without buckets: a shape per distinct batch).
# Dynamo's default of 8 recompiles a function would then run the rest eagerly
# (FlexAttention eagerly materialises the whole score matrix), silently.
RECOMPILE_LIMIT = 128


def raise_recompile_limit() -> None:
    import torch._dynamo

    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = max(cfg.accumulated_recompile_limit, 4 * RECOMPILE_LIMIT)


def ttt_mask(t: int, step: int, device) -> torch.Tensor:
    """[t, (step+1)*t] bool, True = may attend: causal over step 0's keys, then
    for each later step only the same index (the query's own chain)."""
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    eye = torch.eye(t, dtype=torch.bool, device=device)
    return torch.cat([causal] + [eye] * step, dim=1)


def ttt_block_mask(t: int, step: int, slots: int, device):
    """The BlockMask of ttt_mask(t, step) over `slots` x t key positions
    (slots > step + 1 leaves the later steps' slots empty, so every step of one
    length shares one compiled kernel; `step` is a tensor for the same reason)."""
    from torch.nn.attention.flex_attention import create_block_mask

    k = torch.tensor(step, device=device)

    def mask_mod(b, h, q_idx, kv_idx):
        slot = kv_idx // t
        return ((slot == 0) & (kv_idx <= q_idx)) | ((slot >= 1) & (slot <= k) & (kv_idx - slot * t == q_idx))

    return create_block_mask(mask_mod, None, None, t, slots * t, device=device)


def flex_kernels():
    """FlexAttention, compiled on first use where it can be (CUDA)."""
    global _FLEX
    if _FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        raise_recompile_limit()
        _FLEX = {"eager": flex_attention, "compiled": torch.compile(flex_attention, dynamic=False)}
    return _FLEX


_FLEX = None
