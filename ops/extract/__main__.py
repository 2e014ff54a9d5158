"""`python -m ops.extract --target MODEL --input PREPARED --output DIR [...]`

The program of the extract stage (its spec: ops/extract/spec.py; the loop:
ops/extract/run.py; the engines: ops/extract/engine.py, engines.py). Under torchrun each
rank takes samples r::WORLD_SIZE; with --engine sglang
(ops/extract/sglang_run.py) the ranks are one TP group:
`torchrun --nproc-per-node TP -m ops.extract --engine sglang --tp TP ...`.
Exit codes: 0 complete, 1 failure or incomplete (re-run resumes), 2 bad input
or the disk preflight refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ops.common import run_main, spec_defaults
from ops.extract.durable import MODES
from ops.extract.engines import ENGINES, open_engine
from ops.extract.sglang_engine import PINNED_SGLANG
from ops.extract.spec import SPEC


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m ops.extract", description=SPEC.summary)
    p.add_argument("--target", required=True, help="local Hugging Face model directory")
    p.add_argument("--input", help="prepare's output directory (samples.safetensors)")
    p.add_argument("--output", help="hidden-state output directory")
    p.add_argument("--layer-ids",
                   help="canonical aux layers (0-indexed layer whose OUTPUT is captured), "
                        "e.g. 2,30,58; auto = [1, N//2-1, N-4]")
    p.add_argument("--max-seq-len", type=int)
    p.add_argument("--token-budget", type=int,
                   help="padded tokens per forward batch; halved for a batch that runs out of memory")
    p.add_argument("--num-samples", type=int, help="only the first N samples")
    p.add_argument("--device", help="auto, cpu, cuda, cuda:N, balanced (device_map=auto)")
    p.add_argument("--dtype", help="auto (the checkpoint's), bfloat16, float16, float32")
    p.add_argument("--writers", type=int, help="writer threads")
    p.add_argument("--queue-size", type=int,
                   help="samples waiting for a writer before the forward loop waits")
    p.add_argument("--host-batches", type=int,
                   help="batches of sample files held in (pinned) host memory at once; then the forward waits")
    p.add_argument("--progress-interval", type=float,
                   help="seconds between `progress:` lines")
    p.add_argument("--memory-fraction", type=float,
                   help="cap on the share of each GPU's memory this process takes (leaves room for others)")
    p.add_argument("--tokens", type=int,
                   help="token count for the disk estimate (default: the input's)")
    p.add_argument("--durable", choices=MODES,
                   help="how sample files reach the disk before data_config.json says complete: "
                        "fsync each file before its rename (direct: written with O_DIRECT), "
                        "or one syncfs of the filesystem at the end")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each decoder layer (fuses the eager forward's small kernels; "
                        "the first batches pay the compile)")
    p.add_argument("--force", action="store_true", help="start even if the disk estimate exceeds free space")
    p.add_argument("--engine", choices=tuple(ENGINES),
                   help="hf: transformers forward with hooks; sglang: the target in SGLang "
                        f"(pinned {PINNED_SGLANG}) with tp/ep, one process per TP rank under torchrun")
    p.add_argument("--tp", type=int, help="sglang: tensor parallel size (= WORLD_SIZE)")
    p.add_argument("--ep", type=int, help="sglang: expert parallel size (MoE; divides tp)")
    p.add_argument("--mem-fraction-static", type=float,
                   help="sglang: share of each GPU for weights and KV cache (default: SGLang's)")
    p.add_argument("--extra-args",
                   help="sglang: JSON list of SGLang server flags added to the engine's own, "
                        "e.g. [\"--attention-backend\", \"triton\"] (checked by SGLang's parser)")
    return spec_defaults(p, SPEC)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    engine = open_engine(args)      # SGLang's version before torch and the target
    from ops.extract.run import extract

    return extract(args, engine, argv)


if __name__ == "__main__":
    sys.exit(run_main(main, prog="extract"))
