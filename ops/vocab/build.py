"""The draft vocabulary from token counts under the loss mask (vocab's core).

Reads prepare's arrays, writes the mapping that train and export carry into
the drafter checkpoint (SGLang's `d2t` offsets and `t2d` mask, DESIGN.md).
Pure numpy: the selection rule lives here so tests can check it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class DraftVocab:
    ids: np.ndarray            # int64 [draft]: target ids of the draft vocab, ascending
    d2t: np.ndarray            # int64 [draft]: target_id = draft_id + d2t[draft_id]
    t2d: np.ndarray            # bool [target]: True where a target id is in the draft vocab
    coverage: float            # share of masked target tokens inside the draft vocab
    distinct: int              # distinct token ids seen under the mask
    padded: int                # ids added (lowest unused) because too few were seen
    masked_tokens: int


def masked_counts(input_ids: np.ndarray, loss_mask: np.ndarray, target_vocab: int) -> np.ndarray:
    """How often each target id occurs where the loss mask is 1."""
    return np.bincount(input_ids[loss_mask.astype(bool)].astype(np.int64), minlength=target_vocab)


def select(counts: np.ndarray, draft_size: int) -> DraftVocab:
    """Most frequent ids (ties by the lower id), padded with the lowest unused ids."""
    target_vocab = len(counts)
    draft_size = min(draft_size, target_vocab)
    seen = np.flatnonzero(counts)
    # lexsort's last key is the primary one: count descending, then id ascending
    order = seen[np.lexsort((seen, -counts[seen]))]
    chosen = order[:draft_size]
    padded = draft_size - len(chosen)
    if padded:
        unused = np.ones(target_vocab, dtype=bool)
        unused[chosen] = False
        chosen = np.concatenate([chosen, np.flatnonzero(unused)[:padded]])
    ids = np.sort(chosen).astype(np.int64)
    t2d = np.zeros(target_vocab, dtype=bool)
    t2d[ids] = True
    total = int(counts.sum())
    return DraftVocab(ids=ids, d2t=ids - np.arange(len(ids), dtype=np.int64), t2d=t2d,
                      coverage=float(counts[ids].sum()) / total if total else 0.0,
                      distinct=int(len(seen)), padded=int(padded), masked_tokens=total)
