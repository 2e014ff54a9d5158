"""Extract's forward batches (plan_batches: the token-budget planner of
ops/batching.py, longest first), and its OOM retry that halves one batch's
budget.

Sits between the sample list (ops/prepared.py) and the forward pass (the engine's
Target, engine.py). The plan is a pure function of (indices, lengths, budget), so an interrupted
run re-plans the same batches and recomputes a half-written batch with the
same shapes: its files come out byte-identical to an uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ops.batching import token_batches


def plan_batches(indices: Sequence[int], lengths: Callable[[int], int] | Sequence[int],
                 budget: int) -> list[list[int]]:
    """Extract's plan: longest first (an OOM shows at the start, not at 90 %),
    as many samples a batch as fit `count x longest <= budget` (padded tokens)."""
    if budget <= 0:
        raise ValueError(f"token budget must be positive, got {budget}")
    length = lengths if callable(lengths) else lengths.__getitem__
    return token_batches(indices, length, budget, longest_first=True)


class SampleTooLarge(RuntimeError):
    """One sample alone does not fit in device memory."""

    def __init__(self, idx: int, tokens: int, cause: str) -> None:
        super().__init__(f"OOM: sample {idx} ({tokens} tokens) alone does not fit in device memory; "
                         f"lower max_seq_len or use more GPUs per replica. {cause}")
        self.idx, self.tokens = idx, tokens


def run_with_oom_retry(batch: list[int], lengths: Callable[[int], int], budget: int,
                       forward: Callable[[list[int]], None], oom_types: tuple[type, ...],
                       log: Callable[[str], None], on_oom: Callable[[], None] = lambda: None) -> None:
    """forward(batch); on an out-of-memory error, halve this batch's budget,
    re-plan it and run the pieces (recursively). Raises SampleTooLarge when
    one sample alone runs out of memory."""
    try:
        forward(batch)
        return
    except oom_types as exc:
        # Keep only the text: the exception's traceback pins the failed
        # forward's frames and so its device tensors (seen on an H200: the
        # halved retries ran out of memory on the leftovers).
        failure = str(exc)
    # Outside the except block, so the memory can actually be released.
    on_oom()
    if len(batch) == 1:
        raise SampleTooLarge(batch[0], lengths(batch[0]), failure)
    padded = len(batch) * max(lengths(i) for i in batch)
    half = max(1, min(budget, padded) // 2)
    log(f"OOM: halving token budget to {half} (batch of {len(batch)} samples, {padded} padded tokens)")
    pieces = plan_batches(batch, lengths, half)
    if len(pieces) < 2:  # the halved budget still fits all: split by count instead
        mid = len(batch) // 2
        pieces = [batch[:mid], batch[mid:]]
    for piece in pieces:
        run_with_oom_retry(piece, lengths, half, forward, oom_types, log, on_oom)
