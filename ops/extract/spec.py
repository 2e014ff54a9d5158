"""Spec of the extract stage: hidden states of the target's aux layers.

Disk estimate = tokens x (aux layers + 1) x hidden_size x dtype bytes
(17,285,548 x 4 x 7168 x 2 = 923 GiB; seen 924 GB by du -sh).
"""

from __future__ import annotations

from pathlib import Path

from ops.extract import sglang_args
from ops.extract.durable import DEFAULT as DURABLE
from ops.extract.durable import MODES as DURABLE_MODES
from ops.extract.estimate import extract_estimate, format_line
from ops.extract.format_plan import format_lints
from ops.extract.layer_plan import layer_line, layer_lints
from ops.extract.sizes import (MAX_SEQ_LEN, aux_layer_count, estimate_bytes,  # noqa: F401
                               expected_samples, expected_tokens)
from ops.hidden_formats import DEFAULT as DEFAULT_FORMAT
from ops.hidden_formats import FORMATS, stored_as
from ops.formats import DATA_CONFIG, partial_samples
from ops.spec import EstimateContext, OpSpec, Param
from ops.target_params import DEVICE, DTYPE, LAYER_IDS
from ops.units import human_bytes


def target_lints(ctx: EstimateContext) -> list:
    """[target].path must be there: every rank loads it (8 ranks started on a
    missing one only to fail, minutes later, each with its traceback)."""
    path = ctx.target.get("path")
    if not path:
        return []
    where = Path(str(path)).expanduser()
    where = where if where.is_absolute() else ctx.root / where
    if where.exists():
        return []
    from ops.spec import Lint
    return [Lint("error", f"[target].path {where}: no such checkpoint folder (extract loads the target from it)",
                 forceable=False)]


def spool_or_extract_estimate(ctx: EstimateContext):
    """A spool's producer holds at most spool_bytes on disk; else the extraction's estimate."""
    from ops.estimate import Estimate

    est = extract_estimate(ctx)
    cap = ctx.params.get("spool_bytes")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 and (est is None or est.bytes > cap):
        return Estimate(cap, "declared", "the spool's cap (spool_bytes): the consumer deletes what it read")
    return est


class Extract(OpSpec):
    name = "extract"
    summary = "hidden states of the target's aux layers + final state, one safetensors file a sample"
    params = (
        Param("input", help="prepare's output directory (samples.safetensors)"),
        Param("output", help="hidden-state output directory"),
        LAYER_IDS,
        Param("max_seq_len", MAX_SEQ_LEN, "tokens kept of each sample", low=1),
        Param("token_budget", 16384, "padded tokens per forward batch; halved for a batch that runs out of "
              "memory", low=1),
        Param("num_samples", None, "only the first N samples", type=int, low=1),
        DEVICE,
        DTYPE,
        Param("format", DEFAULT_FORMAT, "how the states are stored: bf16 (as computed, in dtype), fp8 (e4m3, a "
              "float32 scale per token row of each layer: ~1 B an element), int4 (4-bit codes with an 8-bit "
              "scale per 32 elements: 0.5 B an element); encoded on the GPU (ops/hidden_formats.py)",
              choices=FORMATS),
        Param("writers", 4, "writer threads", low=1),
        Param("queue_size", 32, "samples waiting for a writer before the forward loop waits", low=1),
        Param("host_batches", 3, "batches of sample files held in (pinned) host memory at once; then the "
              "forward waits", low=1),
        Param("progress_interval", 5.0, "seconds between `progress:` lines"),
        Param("memory_fraction", None, "cap on the share of each GPU's memory this process takes (leaves room "
              "for others)", type=float, low=0, low_open=True, high=1),
        Param("tokens", None, "token count for the disk estimate (default: the input's)", type=int, low=1),
        Param("durable", DURABLE, "how sample files reach the disk before data_config.json says complete: "
              "fsync each file before its rename (direct: written with O_DIRECT), or one syncfs of the "
              "filesystem at the end (ops/extract/durable.py)", choices=DURABLE_MODES),
        Param("compile", False, "torch.compile each decoder layer (fuses the eager forward's small kernels; "
              "the first batches pay the compile)"),
        Param("force", False, "start even if the disk estimate exceeds free space"),
        Param("spool_bytes", None, "produce into a spool of at most this many bytes for a train run with mode "
              "streamed (output = the spool; ops/spool.py): the consumer's plan decides what is extracted, "
              "the producer blocks at the cap until the consumer read half of it", type=int, low=1),
        Param("engine", "hf", "hf: transformers forward with hooks; sglang: the target in SGLang with tp/ep, "
              "one process per TP rank under torchrun (ops/extract/sglang_run.py)", choices=("hf", "sglang")),
        Param("tp", 1, "sglang: tensor parallel size (= WORLD_SIZE: torchrun --nproc-per-node)", low=1),
        Param("ep", 1, "sglang: expert parallel size (MoE; divides tp)", low=1),
        Param("mem_fraction_static", None, "sglang: share of each GPU for weights and KV cache (default: "
              "SGLang's)", type=float, low=0, low_open=True, high=1, high_open=True),
        Param("extra_args", None, "sglang: JSON list of SGLang server flags added to the engine's own, e.g. "
              '["--attention-backend", "triton"] (ops/extract/sglang_args.py)', json=True),
    )
    output_params = ("output",)
    input_params = ("input",)
    uses_target = True
    batch_param = "token_budget"
    progress = "shards"
    result_file = DATA_CONFIG

    # The sizes (ops/extract/sizes.py), the estimate with its kind, the torchrun argv of tp > 1.
    estimate_bytes = staticmethod(estimate_bytes)
    expected_samples = staticmethod(expected_samples)
    expected_tokens = staticmethod(expected_tokens)
    estimate = staticmethod(spool_or_extract_estimate)
    launch = staticmethod(sglang_args.launch)

    def spreads(self, params: dict) -> str | None:
        return "sglang" if params.get("engine") == "sglang" else "torchrun"

    def partial_files(self, root: Path) -> list[Path]:
        """Temp files and sample files that are truncated or unreadable (ops/formats.py)."""
        return partial_samples(root)

    def result_line(self, config: dict) -> str | None:
        """data_config.json once complete: the counts and the layers, in the
        canonical and SGLang conventions (the classic off-by-one, said twice)."""
        if config.get("status") == "incomplete":
            # Said where the stage is shown (status, TUI), not only inside the file.
            missing = config.get("missing_samples")
            count = f"{missing} of {config.get('total_samples', '?')} samples missing" if missing is not None else ""
            reason = config.get("incomplete_reason") or ""
            return "incomplete: " + "; ".join(x for x in (count, reason) if x) if count or reason else "incomplete"
        if config.get("status") != "complete":
            return None
        return (f"{config.get('total_samples', 0):,} samples, {config.get('total_tokens', 0):,} tokens; "
                f"aux layers {config.get('layer_ids')} + final {config.get('final_layer_id')} "
                f"(SGLang capture {config.get('sglang_layers_to_capture')}), {config.get('dtype')}; "
                f"format {stored_as(config)}")

    def lint(self, ctx: EstimateContext, gpus: list[int] | None) -> list:
        """The target's folder, SGLang's flags against the gpus, the aux layer ids
        against the target and the output's, the format against the output's and
        the hidden size."""
        return (target_lints(ctx) + list(sglang_args.lint(self.effective(ctx.params), gpus)) + layer_lints(ctx)
                + format_lints(ctx))

    def plan_lines(self, ctx: EstimateContext) -> list[str]:
        cap = ctx.params.get("spool_bytes")
        spool = ([f"spool: at most {human_bytes(int(cap))} on disk at once (spool_bytes), whatever the "
                  f"extraction's size: a train run with mode streamed reads and deletes it (ops/spool.py)"]
                 if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else [])
        return layer_line(ctx) + format_line(ctx) + spool


SPEC = Extract()
# The record's line under a name of the module's own (the tests import it).
result_line = SPEC.result_line
