"""Spec of the export stage: the trained drafter in SGLang's and speculators/vLLM's formats.

Output: <output>/sglang/, <output>/speculators/ (config.json + model.safetensors
each; speculators' also holds the target's embedding, and verifier/ the
target's config, embedding, final norm and LM head: ops/export/verifier.py) and
<output>/export_info.json, built in <output>.tmp-<pid> beside it and switched
in whole (ops/export/switch.py). Disk estimate: drafter params x dtype bytes x
formats written, plus for speculators the embedding in that dtype and the
verifier's embedding, LM head and norm in the target's (an upper bound: a
tied target's LM head is not stored).
"""

from __future__ import annotations

from pathlib import Path

from ops.drafter.sizes import drafter_params
from ops.spec import EstimateContext, OpSpec, Param, dtype_bytes

DTYPES = ("bfloat16", "float16", "float32")


class Export(OpSpec):
    name = "export"
    summary = "write the drafter for SGLang (LlamaForCausalLMEagle3) and speculators/vLLM (Eagle3Speculator)"
    params = (
        Param("checkpoint", help="train's output directory (newest checkpoint) or a step_<N> directory"),
        Param("output", help="output directory (sglang/, speculators/, export_info.json)"),
        Param("format", "both", "which formats to write", choices=("both", "sglang", "speculators")),
        Param("dtype", "bfloat16", "dtype of the exported weights", choices=DTYPES),
        Param("speculative_tokens", 0, "written into the speculators config (0: the training unroll depth)",
              low=0),
        Param("check", True, "reload what was written and compare its logits with the checkpoint's"),
        Param("check_samples", 4, "samples the check runs over", low=0),
        Param("data", None, "hidden states for --check (default: training's)", type=str),
        # The check's unrolls (and, after an online run, the target forward that makes its states) on the
        # CPU in float32 took most of a Qwen2.5-1.5B export's 195 s on an H100 machine (RESULTS.md).
        Param("device", "auto", "where --check computes: auto (CUDA when available) | cpu | cuda",
              choices=("auto", "cpu", "cuda")),
    )
    output_params = ("output",)
    input_params = ("checkpoint",)
    uses_target = True
    result_file = "export_info.json"
    estimate_rule = "drafter parameters x dtype bytes x formats"

    def estimate_bytes(self, ctx: EstimateContext) -> int | None:
        params = drafter_params(ctx)
        if params is None:
            return None
        fmt = ctx.params.get("format", self.params["format"])
        n_formats = 2 if fmt == "both" else 1
        out_bytes = dtype_bytes(ctx.params.get("dtype", self.params["dtype"]))
        if fmt not in ("both", "speculators"):
            return params * n_formats * out_bytes
        hidden = int(ctx.target.get("hidden_size") or 0)
        embed = int(ctx.target.get("vocab_size") or 0) * hidden
        verifier = (2 * embed + hidden) * dtype_bytes(ctx.target.get("dtype") or ctx.params.get("dtype"))
        return (params * n_formats + embed) * out_bytes + verifier

    def partial_files(self, root: Path) -> list[Path]:
        """Format directories left half-written (<format>.tmp-<pid>) by exports
        before the whole-folder switch; the staging folder beside the output that a
        killed export leaves is removed by the next export (switch.recover)."""
        root = Path(root)
        if not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if ".tmp-" in p.name)

    def result_line(self, info: dict) -> str | None:
        formats = ", ".join(sorted(info.get("formats") or {}))
        check = info.get("check")
        verdict = ("reload check passed" if check.get("ok") else "RELOAD CHECK FAILED") \
            if isinstance(check, dict) else "not checked"
        return f"{formats or 'no format'} from step {info.get('step')}; {verdict}"


SPEC = Export()
