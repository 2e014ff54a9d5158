"""`python -m ops.vocab`: prepare's samples -> the draft vocabulary mapping.

Second stage (prepare -> vocab -> extract ...). Counts the token ids under
the loss mask, keeps the most frequent (build.py) and writes
<output>/vocab.safetensors (`d2t` int64 [draft], `t2d` bool [target]) and
<output>/vocab.json (sizes, coverage, status "complete" written last).
Exit 0 ok, 2 bad input, 1 other failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ops.common import TMP_SUFFIX, BadInput, read_json, resolve_target_vocab, run_main, write_json_atomic
from ops.params import build_parser as spec_parser
from ops.vocab.spec import SPEC

VOCAB = "vocab.safetensors"
VOCAB_JSON = "vocab.json"


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the target model directory (config.json vocab_size)")


def parse_args(argv):
    # The bounds (both sizes >= 1) are the spec's Params'.
    return build_parser().parse_args(argv)


def target_vocab_size(args, summary: dict) -> tuple[int, str]:
    """The target vocabulary size and where it came from."""
    if args.target_vocab_size:
        return args.target_vocab_size, "--target-vocab-size"
    if args.target:
        if not Path(args.target).is_dir():
            raise BadInput(f"target directory {args.target}: no such directory")
        size = resolve_target_vocab(args.target)
        if size:
            return size, f"{args.target}/config.json"
    tok = summary.get("tokenizer")
    if tok and Path(tok).is_dir():
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(tok)), f"tokenizer {tok}"
    raise BadInput("cannot tell the target vocabulary size: pass --target-vocab-size, or --target "
                   "with a config.json holding vocab_size")


def main(argv=None) -> int:
    args = parse_args(argv)
    from safetensors.numpy import load_file, save_file

    from ops.vocab.build import masked_counts, select

    t0 = time.time()
    src = Path(args.input)
    summary = read_json(src / "summary.json")
    if not summary or summary.get("status") != "complete":
        raise BadInput(f"input {src}: no complete prepare output (summary.json with status "
                       "\"complete\"); run prepare first")
    try:
        arrays = load_file(str(src / "samples.safetensors"))
    except Exception as exc:  # noqa: BLE001 - OSError, or safetensors' own error types
        raise BadInput(f"input {src / 'samples.safetensors'}: unreadable ({exc})") from exc
    for key in ("input_ids", "loss_mask"):
        if key not in arrays:
            raise BadInput(f"input {src / 'samples.safetensors'}: no '{key}' tensor (has {sorted(arrays)})")
    ids, mask = arrays["input_ids"], arrays["loss_mask"]
    if ids.shape != mask.shape:
        raise BadInput(f"input {src / 'samples.safetensors'}: input_ids {ids.shape} and loss_mask "
                       f"{mask.shape} differ in shape")
    vocab_size, source = target_vocab_size(args, summary)
    top = int(ids.max()) if ids.size else -1
    if top >= vocab_size:
        raise BadInput(f"input {src}: token id {top} is outside the target vocabulary of {vocab_size} "
                       f"(from {source}); was prepare run with this target's tokenizer?")
    draft = min(args.draft_vocab_size, vocab_size)
    if draft < args.draft_vocab_size:
        print(f"vocab: draft_vocab_size {args.draft_vocab_size} capped at the target's {vocab_size}", flush=True)
    counts = masked_counts(ids, mask, vocab_size)
    dv = select(counts, draft)
    if dv.masked_tokens == 0:
        raise BadInput(f"input {src}: no token has loss mask 1")

    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    try:
        (out / VOCAB_JSON).unlink()   # an interrupted rerun must not look complete
    except FileNotFoundError:
        pass
    tmp = out / (VOCAB + TMP_SUFFIX)
    save_file({"d2t": dv.d2t, "t2d": dv.t2d}, str(tmp))
    os.replace(tmp, out / VOCAB)
    info = {
        "status": "complete",
        "input": str(src),
        "draft_vocab_size": int(len(dv.ids)),
        "target_vocab_size": int(vocab_size),
        "target_vocab_source": source,
        "coverage": round(dv.coverage, 6),
        "distinct_masked_ids": dv.distinct,
        "padded": dv.padded,
        "masked_tokens": dv.masked_tokens,
        "elapsed_s": round(time.time() - t0, 3),
    }
    write_json_atomic(out / VOCAB_JSON, info)
    # The same line the console shows for this stage (the spec reads vocab.json).
    print(f"vocab: {SPEC.result_line(info)} -> {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, prog="vocab"))
