"""Training figures derived from the logged ones (plain Python: no torch, so
the console, the exporter and the train spec can use them).

simulated_acceptance_length: what a window's per-step accuracies promise at
decode time. TTT step k reads the ground-truth tokens before it, as a chain
draft does once drafts 1..k-1 were accepted, so acc_k stands for "draft k is
accepted given drafts 1..k-1 were", and a verify of a depth-K chain yields

    1 + sum_{k=1..K} prod_{j<=k} acc_j

tokens (the 1 is the target's own token, the bonus), the quantity SpecForge
logs as its simulated accept length. It is on SGLang's scale: completion
tokens per verify step, between 1 and K + 1, the scale of bench's
acceptance_length.
"""

from __future__ import annotations

import math
from typing import Iterable


def simulated_acceptance_length(acc: Iterable[float]) -> float:
    """1 + sum_k prod_{j<=k} acc_j over the per-step accuracies (each in [0, 1])."""
    total, chain = 1.0, 1.0
    for k, a in enumerate(acc, 1):
        a = float(a)
        if not (0.0 <= a <= 1.0):      # also NaN
            raise ValueError(f"accuracy of step {k} is {a}, not in [0, 1]")
        chain *= a
        total += chain
    return total


def from_record(rec: dict) -> float | None:
    """The figure of one metrics.jsonl record: its own field, or computed from
    its `acc` (records written before the field existed); None without either."""
    value = rec.get("simulated_acceptance_length")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    acc = rec.get("acc")
    if isinstance(acc, list) and acc:
        try:
            return simulated_acceptance_length(acc)
        except (TypeError, ValueError):
            return None
    return None
