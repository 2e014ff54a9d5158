"""A batch's states out of the target: the aux layers' outputs and the final post-norm state.

Where it sits: what every forward of the target returns (forward.py's HFTarget here, extract's SGLang
engine in ops/extract/sglang_run.py); extract's loop, train's online mode and export's check read it.
Importing this stays cheap (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TargetOutput:
    """One planned batch through the target."""

    aux: Any                            # the batch's aux-layer states, [.., n_aux * hidden]
    final: Any                          # the batch's final post-norm states, [.., hidden]
    samples: list[tuple[Any, Any]]      # each sample's own (aux, final) rows, in batch order, no padding

    @classmethod
    def packed(cls, aux: Any, final: Any, lengths: Sequence[int]) -> "TargetOutput":
        """A packed batch (its samples' tokens back to back, in batch order,
        no padding), cut back into samples by their lengths."""
        samples, start = [], 0
        for n in lengths:
            samples.append((aux[start:start + n], final[start:start + n]))
            start += n
        return cls(aux, final, samples)
