"""Spec of the extract stage: hidden states of the target's aux layers.

Disk estimate = tokens x (aux layers + 1) x hidden_size x dtype bytes
(17,285,548 x 4 x 7168 x 2 = 923 GiB; seen 924 GB by du -sh).
"""

from __future__ import annotations

from pathlib import Path

from ops.extract import sglang_args
from ops.extract.durable import DEFAULT as DURABLE
from ops.extract.estimate import extract_estimate
from ops.extract.layer_plan import layer_line, layer_lints
from ops.extract.sizes import aux_layer_count, estimate_bytes, expected_samples, expected_tokens  # noqa: F401
from ops.formats import SAMPLE_RE, TMP_SUFFIX, BadSampleFile, check_whole
from ops.spec import REQUIRED, EstimateContext, OpSpec


def partial_files(root: Path) -> list[Path]:
    """Temp files and sample files that are truncated or unreadable."""
    out: list[Path] = []
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        if path.name.endswith(TMP_SUFFIX):
            out.append(path)
            continue
        m = SAMPLE_RE.match(path.name)
        if m and m.group(2) == "safetensors":
            try:
                check_whole(path)
            except BadSampleFile:
                out.append(path)
    return out


def result_line(config: dict) -> str | None:
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
            f"(SGLang capture {config.get('sglang_layers_to_capture')}), {config.get('dtype')}")

def lint(ctx: EstimateContext, gpus: list[int] | None) -> list:
    """SGLang's flags against the gpus, then the aux layer ids against the target."""
    return list(sglang_args.lint(ctx.params, gpus)) + layer_lints(ctx)


SPEC = OpSpec(
    name="extract",
    summary="hidden states of the target's aux layers + final state, one safetensors file a sample",
    params={
        "input": REQUIRED,          # prepare's output directory
        "output": REQUIRED,
        "layer_ids": "auto",        # canonical ids (0-indexed layer whose OUTPUT is captured)
        "max_seq_len": 4096,
        "token_budget": 16384,      # tokens per forward batch; halved on OOM
        "num_samples": None,
        "device": "auto",
        "dtype": "auto",
        "writers": 4,               # writer threads
        "queue_size": 32,           # samples queued for the writers before the forward waits
        "host_batches": 3,          # batches of file images in host (pinned) memory; then the forward waits
        "progress_interval": 5.0,   # seconds between `progress:` lines
        "memory_fraction": None,    # cap on each GPU's memory this process may take (0..1]
        "tokens": None,             # override for the estimate when no summary exists
        "durable": DURABLE,         # "fsync" / "direct" (each file; O_DIRECT) or "syncfs" (once, at the end): durable.py
        "compile": False,           # torch.compile each decoder layer (capture.compile_layers)
        "force": False,
        "engine": "hf",             # "hf" (transformers forward + hooks) or "sglang" (ops/extract/sglang_run.py)
        "tp": 1,                    # sglang: tensor parallel ranks = processes (torchrun --nproc-per-node)
        "ep": 1,                    # sglang: expert parallel size (divides tp)
        "mem_fraction_static": None,    # sglang: its weights + KV share of each GPU (None: SGLang's)
        "extra_args": None,         # sglang: a list of SGLang server flags (ops/extract/sglang_args.py)
    },
    output_params=("output",),
    uses_target=True,
    uses_gpu=True,
    batch_param="token_budget",
    progress="shards",
    estimate_bytes=estimate_bytes,
    expected_samples=expected_samples,
    expected_tokens=expected_tokens,
    partial_files=partial_files,
    result_file="data_config.json",
    result_line=result_line,
    json_params=("extra_args",),
    launch=sglang_args.launch,
    lint=lint,
    estimate=extract_estimate,
    plan_lines=layer_line,
)
