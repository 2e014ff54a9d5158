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

from ops import params
from ops.common import exit_program, run_main
from ops.extract.engines import open_engine
from ops.extract.spec import SPEC


def build_parser() -> argparse.ArgumentParser:
    # Every flag is a Param of SPEC (ops/extract/spec.py): types, bounds and
    # choices are declared there once, and `run` checks the same before launch.
    return params.build_parser(SPEC)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    engine = open_engine(args)      # SGLang's version before torch and the target
    from ops.extract.run import extract

    return extract(args, engine, argv)


if __name__ == "__main__":
    exit_program(run_main(main, prog="extract"))
