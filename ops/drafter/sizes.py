"""Parameter counts of the drafter, for the specs' disk estimates (no torch)."""

from __future__ import annotations

from ops.spec import EstimateContext


def draft_vocab_size(ctx: EstimateContext, default: int = 32000) -> int:
    info = ctx.read_json("vocab", "vocab.json")
    if info is None:
        # export and bench name no vocab: the checkpoint's train_config.json says which.
        trained = ctx.read_json("checkpoint", "train_config.json") or {}
        vocab = (trained.get("drafter_config") or {}).get("draft_vocab_size")
        if isinstance(vocab, int):
            return vocab
        info = {}
    for key in ("draft_vocab_size", "size", "draft_vocab"):
        if isinstance(info.get(key), int):
            return int(info[key])
    return default


def drafter_params(ctx: EstimateContext) -> int | None:
    """fc 3H*H + q/k/v 3*2H*H (upper bound: as many kv heads as heads) + o H*H
    + MLP 3*H*I + head Vd*H; I defaults to the Llama ratio 8/3 H."""
    h = ctx.target.get("hidden_size")
    if not h:
        return None
    h = int(h)
    inter = int(ctx.target.get("intermediate_size") or (8 * h) // 3)
    return 3 * h * h + 6 * h * h + h * h + 3 * h * inter + draft_vocab_size(ctx) * h
