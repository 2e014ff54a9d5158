"""`python -m ops.prepare`: conversations JSONL -> tokenized samples with a loss mask.

First stage of the pipeline (prepare -> vocab -> extract -> ...). Reads the
JSONL (ops/conversations.py), renders + tokenizes + masks in batches (mask.py, in
worker processes when the input is large), truncates to max_seq_len and
writes samples.safetensors + summary.json (output.py). Progress goes to
stdout as tqdm lines; exit 0 ok, 2 bad input, 1 other failure.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ops.common import BadInput, progress, run_main
from ops.params import build_parser as spec_parser
from ops.prepare.spec import SPEC

CHUNK = 256                 # conversations per tokenizer batch call / worker task
PARALLEL_FROM = 4096        # below this many rows, worker start-up costs more than it saves


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the target model directory (its tokenizer unless --tokenizer)")


def parse_args(argv):
    # The bounds (max_seq_len >= 1, limit >= 1, workers >= 0) are the spec's Params'.
    return build_parser().parse_args(argv)


def auto_workers(n_rows: int) -> int:
    """One process below PARALLEL_FROM rows; else one worker per core but the
    parent's (it reads, truncates and collects). On a host of two cores the
    workers' start and pickling cost more than they save, so it stays at 1."""
    cpus = os.cpu_count() or 1
    if n_rows < PARALLEL_FROM or cpus <= 2:
        return 1
    return max(1, min(cpus - 1, 16, n_rows // CHUNK))


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np

    from ops.prepare import output as out
    from ops.prepare.mask import encode_in_worker, init_worker
    from ops.conversations import read_conversations

    t0 = time.time()
    tok_path = args.tokenizer or args.target
    if not tok_path:
        raise BadInput("no tokenizer: pass --tokenizer DIR or --target DIR")
    convs = read_conversations(Path(args.input), args.limit)
    if not convs:
        raise BadInput(f"input {args.input}: no rows")
    dropped: dict[str, int] = {}
    todo = []
    for c in convs:
        if c.drop:
            dropped[c.drop] = dropped.get(c.drop, 0) + 1
        else:
            todo.append((c.line, c.messages))
    workers = args.workers or auto_workers(len(todo))
    print(f"prepare: {len(convs)} rows from {args.input}, {len(todo)} to tokenize, "
          f"tokenizer {tok_path}, max_seq_len {args.max_seq_len}, workers {workers}", flush=True)
    # Fail on a bad tokenizer before any worker starts (and before touching the output).
    init_worker(tok_path, args.trust_remote_code)
    output = Path(args.output)
    out.start_output(output)

    chunks = [todo[i:i + CHUNK] for i in range(0, len(todo), CHUNK)]
    ids, masks, lines = [], [], []
    before, after = [], []
    truncated = tokens_cut = 0
    template_error = None
    bar = progress(total=len(todo), desc="prepare", unit="conv")
    pool = None
    try:
        if workers > 1 and len(chunks) > 1:
            import multiprocessing as mp

            # spawn, not fork: forking after the tokenizer's Rust thread pool
            # has run deadlocks the children. Each worker tokenizes one batch
            # at a time single-threaded; the processes are the parallelism.
            ctx = mp.get_context("spawn")
            pool = ctx.Pool(workers, initializer=init_worker,
                            initargs=(tok_path, args.trust_remote_code, False))
            results = pool.imap(encode_in_worker, chunks)
        else:
            results = map(encode_in_worker, chunks)
        for res in results:
            for item in res.items:
                if item.drop:
                    dropped[item.drop] = dropped.get(item.drop, 0) + 1
                    template_error = template_error or item.error
                    continue
                n = len(item.ids)
                n_masked = int(item.mask.sum())
                if n_masked == 0:
                    dropped["no_masked_tokens"] = dropped.get("no_masked_tokens", 0) + 1
                    continue
                before.append(n)
                if n > args.max_seq_len:
                    kept_mask = item.mask[:args.max_seq_len]
                    if not kept_mask.any():
                        before.pop()
                        dropped["assistant_truncated_away"] = dropped.get("assistant_truncated_away", 0) + 1
                        continue
                    truncated += 1
                    tokens_cut += n - args.max_seq_len
                    item.ids, item.mask = item.ids[:args.max_seq_len], kept_mask
                after.append(len(item.ids))
                ids.append(item.ids)
                masks.append(item.mask)
                lines.append(item.line)
            bar.update(len(res.items))
    finally:
        bar.close()
        if pool is not None:
            pool.close()
            pool.join()

    if not ids:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(dropped.items()))
        detail = f" (first template error: {template_error})" if template_error else ""
        raise BadInput(f"input {args.input}: all {len(convs)} conversations were dropped ({reasons}){detail}")

    out.write_samples(output, ids, masks, lines)
    before_a, after_a = np.asarray(before, np.int64), np.asarray(after, np.int64)
    total_tokens = int(after_a.sum())
    masked_tokens = int(sum(int(m.sum()) for m in masks))
    edges = out.histogram_edges(args.max_seq_len)
    summary = {
        "status": "complete",
        "format": "eagle3-prepare",
        "format_version": out.FORMAT_VERSION,
        "input": str(args.input),
        "tokenizer": str(tok_path),
        "max_seq_len": args.max_seq_len,
        "rows": len(convs),
        "samples": len(ids),
        "dropped": {"count": sum(dropped.values()), "reasons": dict(sorted(dropped.items()))},
        "truncated": truncated,
        "tokens_cut": tokens_cut,
        "total_tokens": total_tokens,
        "tokens_before_truncation": int(before_a.sum()),
        "masked_tokens": masked_tokens,
        # counts[i]: edges[i-1] < length <= edges[i]; the last count: length > edges[-1]
        "length_histogram": {"edges": edges, "before": out.histogram(before_a, edges),
                             "after": out.histogram(after_a, edges)},
        "length_stats": {"before": out.length_stats(before_a), "after": out.length_stats(after_a)},
        "workers": workers,
        "elapsed_s": round(time.time() - t0, 3),
    }
    if template_error:
        summary["first_template_error"] = template_error
    out.write_summary(output, summary)
    # The same line the console shows for this stage (the spec reads summary.json).
    print(f"prepare: {SPEC.result_line(summary)} -> {output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, prog="prepare"))
