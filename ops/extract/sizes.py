"""extract's sizes from its params and prepare's summary: aux layers, tokens,
samples and the bytes they make (the spec's estimate_bytes, expected_*; the
estimate hook in estimate.py and the op's own disk preflight use them). No torch.

Disk estimate = tokens x (aux layers + 1) x hidden_size x the format's bytes
an element (bf16: the dtype's, 17,285,548 x 4 x 7168 x 2 = 923 GiB, seen 924 GB
by du -sh; fp8: 1 + 4 / hidden_size, 462 GiB; int4: 0.5, 231 GiB).
"""

from __future__ import annotations

from typing import Any

from ops import hidden_formats
from ops.spec import EstimateContext, dtype_bytes


# The max_seq_len param's default (its Param in spec.py), and the length the
# estimate's upper bound assumes where no params were merged with the defaults.
MAX_SEQ_LEN = 4096


def count(value: Any) -> int | None:
    """A non-negative integer from a param, a config or a summary; None for
    anything else (a bool, a string that is no number, a negative)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        return None
    return n if n >= 0 and not isinstance(value, bool) else None


def aux_layer_count(params: dict) -> int:
    ids = params.get("layer_ids", "auto")
    if isinstance(ids, (list, tuple)):
        return len(ids)
    if isinstance(ids, str) and ids not in ("", "auto"):
        return len([p for p in ids.split(",") if p.strip()])
    return 3


def _param_or_summary(ctx: EstimateContext, param: str, key: str) -> int | None:
    """The stage's own count (a param), else prepare's summary.json's; None when
    neither is a non-negative number (a summary cut short by a crash, a string)."""
    n = count(ctx.params.get(param))
    if n:
        return n
    summary = ctx.read_json("input", "summary.json")
    return count(summary.get(key)) if isinstance(summary, dict) else None


def expected_tokens(ctx: EstimateContext) -> int | None:
    return _param_or_summary(ctx, "tokens", "total_tokens")


def expected_samples(ctx: EstimateContext) -> int | None:
    return _param_or_summary(ctx, "num_samples", "samples")


def state_dtype(params: dict, target: dict) -> str:
    """The dtype the states are written in: the stage's, else the target's ("auto")."""
    dtype = params.get("dtype")
    return str(dtype if dtype not in (None, "auto") else target.get("dtype") or "bfloat16")


def state_format(params: dict) -> str:
    """The storage format of the states (the format param; an unknown one is the config check's to refuse)."""
    fmt = params.get("format") or hidden_formats.DEFAULT
    return fmt if fmt in hidden_formats.FORMATS else hidden_formats.DEFAULT


def states_bytes(params: dict, target: dict, tokens: int, states: int, hidden: int) -> int:
    """Bytes of `tokens` rows of `states` states in the stage's format and dtype."""
    return hidden_formats.state_bytes(state_format(params), tokens, states, hidden,
                                      dtype_bytes(state_dtype(params, target)))


def estimate_bytes(ctx: EstimateContext) -> int | None:
    tokens = expected_tokens(ctx)
    hidden = ctx.target.get("hidden_size")
    if tokens is None or not hidden:
        return None
    return states_bytes(ctx.params, ctx.target, tokens, aux_layer_count(ctx.params) + 1, int(hidden))
