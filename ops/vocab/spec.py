"""Spec of the vocab stage: the draft vocabulary (d2t / t2d) from prepare's samples.

Output: <output>/vocab.safetensors (d2t int64 [draft], t2d bool [target]) and
<output>/vocab.json (status "complete", written last). No torch imported here.
"""

from __future__ import annotations

import json
from pathlib import Path

from ops.common import unvouched_files
from ops.spec import EstimateContext, OpSpec, Param

VOCAB = "vocab.safetensors"
VOCAB_JSON = "vocab.json"
HEADER_BYTES = 256   # the safetensors header of two tensors, rounded up


def _target_vocab(ctx: EstimateContext) -> int | None:
    if ctx.params.get("target_vocab_size"):
        return int(ctx.params["target_vocab_size"])
    if ctx.target.get("vocab_size"):
        return int(ctx.target["vocab_size"])
    path = ctx.target.get("path")
    if path:
        p = Path(str(path)).expanduser()
        p = p if p.is_absolute() else ctx.root / p
        try:
            return int(json.loads((p / "config.json").read_text())["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None


class Vocab(OpSpec):
    name = "vocab"
    summary = "draft vocabulary: the most frequent token ids under the loss mask (d2t, t2d)"
    params = (
        Param("input", help="prepare's output directory"),
        Param("output", help="output directory"),
        Param("draft_vocab_size", 32000, "token ids of the draft vocabulary (the most frequent under the mask)",
              low=1),
        Param("target_vocab_size", None, "default: the target's config.json vocab_size, else the tokenizer's size",
              type=int, low=1),
    )
    output_params = ("output",)
    input_params = ("input",)
    uses_target = True
    result_file = VOCAB_JSON
    estimate_rule = "the draft/target id maps"

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        target = _target_vocab(ctx)
        if not target:
            return None
        draft = min(int(ctx.params.get("draft_vocab_size") or self.params["draft_vocab_size"]), target)
        return draft * 8 + target + HEADER_BYTES

    def partial_files(self, root: Path) -> list[Path]:
        return unvouched_files(root, VOCAB_JSON, VOCAB)

    def result_line(self, info: dict) -> str | None:
        if info.get("status") != "complete":
            return None
        cov = info.get("coverage")
        return (f"draft vocabulary {info.get('draft_vocab_size')} of {info.get('target_vocab_size')} ids"
                + (f" ({info['distinct_masked_ids']:,} distinct under the mask)" if "distinct_masked_ids" in info
                   else "")
                + (f", coverage {cov:.2%} of {info.get('masked_tokens', 0):,} masked target tokens"
                   if isinstance(cov, (int, float)) else "")
                + (f", {info['padded']} padded" if info.get("padded") else ""))


SPEC = Vocab()
