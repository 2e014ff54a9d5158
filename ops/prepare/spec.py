"""Spec of the prepare stage: conversations JSONL -> tokenized samples + loss mask.

Output (ops/prepare/output.py): <output>/samples.safetensors and
<output>/summary.json (status "complete" last). No torch imported here.
"""

from __future__ import annotations

from pathlib import Path

from ops.common import unvouched_files
from ops.spec import EstimateContext, OpSpec, Param

# samples.safetensors holds 5 bytes a token (int32 id + uint8 mask); English
# text runs ~4 bytes a token, JSON adds its keys: ~1.25 x the input, rounded up.
BYTES_PER_INPUT_BYTE = 1.5
SUMMARY = "summary.json"
SAMPLES = "samples.safetensors"


SAMPLE_BYTES = 1 << 20   # the head read to guess the line length when --limit is set


class Prepare(OpSpec):
    name = "prepare"
    summary = "tokenize conversations with the chat template; loss mask on assistant turns"
    params = (
        Param("input", help="conversations JSONL (ShareGPT `conversations` or OpenAI `messages` rows)"),
        Param("output", help="output directory"),
        Param("tokenizer", None, "tokenizer directory (default: --target)", type=str),
        Param("max_seq_len", 4096, "tokens kept of each conversation (the rest is cut)", low=1),
        Param("workers", 0, "tokenizer processes (0 = auto: 1 below 4096 rows)", low=0),
        Param("limit", None, "read only the first N rows", type=int, low=1),
        Param("trust_remote_code", False, "let the tokenizer run its repository's code"),
    )
    output_params = ("output",)
    input_params = ("input",)
    uses_target = True
    result_file = SUMMARY
    estimate_rule = "about 1.5 x the input file's size"

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        path = ctx.path("input")
        try:
            size = path.stat().st_size if path else None
            if size is None:
                return None
            if ctx.params.get("limit") and size:
                # scale by the share of rows kept, guessing rows from the file's head
                with open(path, "rb") as fh:
                    head = fh.read(SAMPLE_BYTES)
                rows = max(1, head.count(b"\n")) * size / max(1, len(head))
                size = int(size * min(1.0, int(ctx.params["limit"]) / rows))
        except OSError:
            return None
        return int(size * BYTES_PER_INPUT_BYTE)

    def expected_samples(self, ctx: EstimateContext) -> int | None:
        summary = ctx.read_json("output", SUMMARY)
        if summary and summary.get("status") == "complete" and "samples" in summary:
            return int(summary["samples"])
        if ctx.params.get("limit"):
            return int(ctx.params["limit"])
        return None

    def expected_tokens(self, ctx: EstimateContext) -> int | None:
        summary = ctx.read_json("output", SUMMARY)
        if summary and summary.get("status") == "complete" and "total_tokens" in summary:
            return int(summary["total_tokens"])
        return None

    def partial_files(self, root: Path) -> list[Path]:
        return unvouched_files(root, SUMMARY, SAMPLES)

    def result_line(self, summary: dict) -> str | None:
        """summary.json in a line: what was kept, dropped and cut (the numbers an
        operator otherwise digs out of the histograms)."""
        if summary.get("status") != "complete":
            return None
        dropped = summary.get("dropped") or {}
        reasons = ", ".join(f"{k} {v}" for k, v in sorted((dropped.get("reasons") or {}).items()))
        return (f"{summary.get('samples', 0):,} samples, {summary.get('total_tokens', 0):,} tokens "
                f"({summary.get('masked_tokens', 0):,} masked); dropped {dropped.get('count', 0)}"
                + (f" ({reasons})" if reasons else "")
                + f"; truncated {summary.get('truncated', 0)} at {summary.get('max_seq_len')} "
                f"(-{summary.get('tokens_cut', 0):,} tokens)")


SPEC = Prepare()
