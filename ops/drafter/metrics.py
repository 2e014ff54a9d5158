"""Training figures derived from the logged ones (plain Python: no torch, so
the console, the exporter and the train spec can use them).

simulated_acceptance_length (a metrics.jsonl record's field): the acceptance
length bench would measure, on bench's scale (SGLang's: completion tokens /
verify steps, the bonus token and each answer's first token, the prefill's,
included; between 1 and K + 1 at depth K = ttt_steps). With held-out samples
(train's `holdout`) it is bench's count over their answer turns
(ops/train/heldout.py): the drafter chains K drafts after each token, the
target's greedy picks accept a leading run of them, and chain_verifies walks
each turn as bench's decoder does. The record's `heldout` holds its tokens,
verify steps, the count at each depth 1..K and the per-step accuracies there. On answers the target wrote
itself that count is bench's exactly (tests/test_sim_acceptance.py); on a
corpus' answers it is off by how much the target's own continuation differs.

Without held-out samples it falls back to SpecForge's simulated accept length
on the window's per-step accuracies, 1 + sum_{k=1..K} prod_{j<=k} acc_j, which
reads high against bench: the window is a batch the drafter is fitted on;
acc_k is over every position, not draft k given drafts 1..k-1 accepted; and a
decode's answers end: the last verify of each is cut at its end, its first
token comes from the prefill. What is left between the walk and bench is
which prompts bench decodes and the corpus' answers against the target's
own, within bench's own spread over a few dozen verify steps
(tests/test_sim_acceptance.py holds the walk to bench).
Compare at one depth: the figure is at K = ttt_steps, bench at its draft_tokens
(the record's heldout.by_depth[d - 1]: the held-out count at depth d <= K).
"""

from __future__ import annotations

import math
from typing import Iterable, Sequence


def simulated_acceptance_length(acc: Iterable[float]) -> float:
    """1 + sum_k prod_{j<=k} acc_j over the per-step accuracies (each in [0, 1]):
    the figure of a record without held-out samples."""
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


def chain_verifies(accepted: Sequence[int]) -> int:
    """Verify steps bench's decoder takes over one answer turn of len(accepted) + 1
    tokens, its first from the prefill: accepted[i] is how many drafts the chain
    made after token i gets accepted; each verify yields those plus the bonus
    token, and the next verify drafts after the last of them."""
    n = verifies = 0
    while n < len(accepted):
        verifies += 1
        n += int(accepted[n]) + 1
    return verifies
