"""Token-budget batches over length-sorted samples (token_batches: extract's
forward batches and train's, ops/drafter/data.py make_batches), and extract's
OOM retry that halves one batch's budget.

Sits between the sample list (samples.py) and the forward pass (the engine's
Target, engine.py). The plan is a pure function of (indices, lengths, budget), so an interrupted
run re-plans the same batches and recomputes a half-written batch with the
same shapes: its files come out byte-identical to an uninterrupted run's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def token_batches(indices: Iterable[int], length: Callable[[int], int], budget: int, *,
                  longest_first: bool, padded: Callable[[int], int] | None = None,
                  one_length: bool = False) -> list[list[int]]:
    """Samples sorted by length (ties by index), cut into batches whose padded
    tokens (count x the longest's `padded` length) stay within `budget`; a
    sample over the budget gets a batch of its own. `one_length`: a batch
    holds samples of one padded length only (train's length buckets)."""
    pad = padded or (lambda n: n)
    order = sorted(indices, key=lambda i: (-length(i) if longest_first else length(i), i))
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for idx in order:
        n = pad(length(idx))
        if current and ((len(current) + 1) * max(width, n) > budget or (one_length and n != width)):
            batches.append(current)
            current, width = [], 0
        current.append(idx)
        width = max(width, n)
    if current:
        batches.append(current)
    return batches


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
