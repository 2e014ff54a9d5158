"""python -m ops.train: fit the EAGLE-3 drafter on the extract op's hidden states.

Data flow: extract's shards (+ vocab's vocab.safetensors, + the target's
embedding / final norm / LM head, read tensor by tensor) -> this program ->
<output>/checkpoints/step_<N>/ (read by export) and <output>/metrics.jsonl;
its log lines (`progress: step S/T loss L acc [..] tok/s X lr Y`, tqdm) are
parsed by the console's log monitor.

Multi-GPU / multi-node: launch under torchrun; DDP with NCCL on GPU, gloo on
CPU. One optimizer step = W ranks x --grad-accum micro-batches, so the global
batch of W ranks with accumulation A equals 1 rank with accumulation W*A.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from ops.common import BadInput, exit_program, run_main
from ops.params import build_parser as spec_parser
from ops.train.spec import SPEC


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0],
                       target_help="the target's Hugging Face checkpoint directory")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv=None) -> int:
    """The program's exit code: bad input is 2 with its `error:` line (ops/common.run_main)."""
    return run_main(_main, argv, prog=None)


def _main(argv=None) -> int:
    from ops.drafter import checkpoint as ck
    from ops.drafter import diskio
    from ops.drafter.data import DataError
    from ops.train.loop import train

    args = parse_args(argv)
    # However training leaves (the end, an error's return, an exception), the
    # prefetcher's thread is stopped and joined, the loader's workers released.
    with contextlib.ExitStack() as cleanup:
        try:
            return train(args, cleanup)
        except OSError as exc:
            if not diskio.is_disk_full(exc):
                raise
            # A full disk (a checkpoint, metrics.jsonl): the file and ENOSPC in one
            # line, as extract ends; the torn checkpoint is gone, the whole ones stay.
            newest = ck.newest(Path(args.output))
            raise BadInput(f"{diskio.disk_full_text(exc, args.output)}; "
                           + (f"the checkpoints written before stay (newest {newest}); free space and run "
                              f"again with resume=true" if newest
                              else "no checkpoint was written; free space and run again")) from None
        except DataError as exc:
            # A sample file that read_data's header check passed but that cannot
            # be read when its batch comes (truncated, overwritten since): the
            # file's name and exit 2, as for bad data found at the start; the
            # checkpoints written so far stay.
            from ops.drafter.data import FormatError
            from ops.hidden_formats import BadFormat

            raise (BadFormat if isinstance(exc, FormatError) else BadInput)(_data_error_line(exc)) from None


def _data_error_line(exc: Exception) -> str:
    """The error's own line: raised in a DataLoader worker, its text is the
    worker's whole traceback ("Caught DataError in DataLoader worker process 0.
    Original Traceback ..."), ending in the line raised there."""
    last = str(exc).strip().splitlines()[-1] if str(exc).strip() else ""
    prefix = f"{type(exc).__module__}.{type(exc).__qualname__}: "
    return last[len(prefix):] if last.startswith(prefix) else last


if __name__ == "__main__":
    exit_program(main())
