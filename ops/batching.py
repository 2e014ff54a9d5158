"""Token-budget batches over length-sorted samples: extract's forward batches
(ops/extract/batching.py, longest first) and train's (ops/drafter/data.py
make_batches, shortest first, optionally one length bucket a batch) are cut
by the same rule, so a token budget means the same in both stages.

A pure function of (indices, lengths, budget): an interrupted extract
re-plans the same batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


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
