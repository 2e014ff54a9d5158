"""How far a stored hidden state may be from its recomputation: numerics, not corruption.

Used by verify's recompute (ops/verify/recompute.py); no torch here. The
figures compared are per token row: e_t = |stored_t - recomputed_t| / |recomputed_t|,
summarised by their RMS over the rows and their maximum. Per row, because a
real model's few massive activations (SmolLM2-135M: 24,960 on the first
token from layer 12 on) carry most of a tensor's norm, so a tensor-wide norm
hides every other row: another sample with the same chat-template prefix is
3 % off at layer 15 by that measure, 104 % by the rows'.

Numerics: each decoder layer rounds its activations to the compute dtype
(unit roundoff u, 2^-8 for bfloat16) and accumulates its matmuls in float32
over the hidden size; those independent errors add up like a random walk,
so after `depth` layers the rows' RMS error is about u * sqrt(depth + 1).
Measured on SmolLM2-135M (bf16 sdpa vs bf16 eager vs float32 rounded to
bf16, CPU): 1.1 u at layer 1, 5.6 u at layer 29, 7.7 u for the post-norm
final state (sqrt(31) = 5.6). An engine's own kernels (fused norms,
another attention, other GEMM tiling) multiply that by a small factor; the
stored format adds its own rounding error (an input, so a format with a
per-format error bound plugs in). Corruption is far outside: a neighbouring
layer is 24-100 % away in the same measure (rows' RMS), another sample
68-86 %, a zeroed row 100 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Unit roundoff (half an ulp at 1.0) of each dtype a state is computed or stored in.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# float32 accumulation over the inner dimension of every matmul.
_ACCUMULATE = 2.0 ** -24
# Multiples of u * sqrt(depth + 1) allowed for the rows' RMS: the same
# engine as the recompute (only batching and padding differ; measured 1.1
# at most) or another (SGLang against HF on SmolLM2: 3.0 % final = 1.4).
ENGINE_FACTOR = {"same": 3.0, "other": 4.0}
# The worst row against the rows' RMS: measured up to 3.8x for numerics.
ROW_FACTOR = 5.0
# However deep the model, a row half off is not numerics.
ROW_CAP = 0.5
# The stored state must be this much nearer its own layer than either neighbour.
NEIGHBOUR_RATIO = 0.5


@dataclass(frozen=True)
class Bound:
    rms: float          # the rows' RMS relative error allowed
    row: float          # the worst row's allowed
    basis: str          # how it was made, in words
    stored: float = 0.0  # of that, the stored value's own error (its dtype's rounding + its format's)

    def as_json(self) -> dict:
        return {"rms": self.rms, "row": self.row, "basis": self.basis, "stored": self.stored}


def nearer_own(own: float, neighbour: float, stored: float) -> bool:
    """Whether a stored state is nearer its own layer's recomputation (`own`,
    the rows' RMS relative error) than a neighbouring layer's (`neighbour`), by
    NEIGHBOUR_RATIO once the stored value's own error is taken out of both.

    The format's noise (int4: 0.12-0.15 of a row) lies on both distances alike:
    own = sqrt(0 + e^2), neighbour = sqrt(d^2 + e^2) for layers d apart. A
    trained target's layers are 0.1-0.3 apart, so `own <= 0.5 x neighbour`
    failed 7 of 8 untouched int4 samples. Taken out in quadrature (what is left
    above `stored`), the check is the plain ratio for bf16 as written, and for a
    coarse format it stays that the state is strictly nearer its own layer: a
    neighbour's state stored in it (the off-by-one) is sqrt(d^2 + e^2) from the
    layer it is named after and e from its own.
    """
    def above(x: float) -> float:
        return math.sqrt(max(0.0, x * x - stored * stored))

    return own < neighbour and above(own) <= NEIGHBOUR_RATIO * above(neighbour) or own <= NEIGHBOUR_RATIO * neighbour


def format_error(fmt: str) -> float:
    """Relative rounding error of storing a value in `fmt` (a dtype name)."""
    try:
        return UNIT_ROUNDOFF[fmt]
    except KeyError:
        raise ValueError(f"no rounding error known for the stored format {fmt!r}") from None


def numeric_bound(compute_dtype: str, depth: int, engine: str, stored_error: float,
                  hidden_size: int) -> Bound:
    """The bound for a state after `depth` decoder layers (the final post-norm
    state: the model's depth + 1) computed in `compute_dtype` by `engine`
    ("same" as the recompute's, or "other"), stored with `stored_error`."""
    u = UNIT_ROUNDOFF.get(compute_dtype, UNIT_ROUNDOFF["bfloat16"])
    per_layer = u + _ACCUMULATE * math.sqrt(hidden_size)
    factor = ENGINE_FACTOR[engine]
    rms = stored_error + factor * per_layer * math.sqrt(depth + 1)
    row = min(ROW_CAP, ROW_FACTOR * rms)
    basis = (f"{compute_dtype} u={u:.3g}, depth {depth}, engine {engine} x{factor:g}: "
             f"{factor:g} x {per_layer:.3g} x sqrt({depth + 1}) + stored {stored_error:.3g}; "
             f"worst row {ROW_FACTOR:g}x, at most {ROW_CAP:g}")
    return Bound(rms=rms, row=row, basis=basis, stored=stored_error)
