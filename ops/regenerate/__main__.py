"""`python -m ops.regenerate`: the target answers the user turns of a prompts file.

Data flow: prompts JSONL (ops/prompts.py: conversations, messages or prompt
rows) -> each row's user turns answered in turn, the old assistant turns
dropped (engine.py), through SGLang's /v1/chat/completions at --url
(server.py, `concurrency` rows at once) or HF generate on --target (hf.py)
-> the journal (journal.py: resumable) -> <output>/conversations.jsonl in
input order (prepare's input) and <output>/regenerate.json.

Exit 0 when done (failed rows are counted and named, not dropped silently),
1 when more than max_failed_fraction of the rows failed, the server stopped
answering or the disk is full (one line naming the file; the rows done stay),
2 on bad input (a file:line, a key or a flag named).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from collections import Counter
from pathlib import Path

from ops.common import BadInput, run_main, write_json_atomic
from ops.params import build_parser as spec_parser
from ops.regenerate.spec import RESULT, SPEC, failed_words, samples_problem, url_problem

FAILED_ROWS_KEPT = 1000         # failed rows named one by one in regenerate.json (all are counted)


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, description=__doc__.splitlines()[0], target_required=False,
                       target_help="the target's Hugging Face folder (generates here when no --url is given)")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def say(line: str) -> None:
    print(line, flush=True)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main(argv=None) -> int:
    return run_main(_main, argv, prog="regenerate")


def refuse_benchmarks(rows, path) -> None:
    """BadInput naming the first row that is a public benchmark's prompt (ops/prompts.py BenchmarkGuard)."""
    from ops.prompts import BenchmarkGuard

    guard = BenchmarkGuard()
    for row in rows:
        found = guard.row_match(row)
        if found:
            raise BadInput(f"{path}:{row.line}: the prompt of a public benchmark, {found}: benchmark prompts "
                           f"never go into training data; drop that row (`python -m ops.regenerate.sources` "
                           f"drops them)")


def _main(argv=None) -> int:
    from ops.prompts import read_prompts
    from ops.regenerate.journal import DiskFull, Journal

    args = parse_args(argv)
    if args.url and url_problem(args.url):
        raise BadInput(f"--url {url_problem(args.url)}")
    if samples_problem(args.n, args.temperature):
        raise BadInput(f"--{samples_problem(args.n, args.temperature)}")
    t0 = time.time()
    rows = read_prompts(Path(args.input), args.limit)
    if not rows:
        raise BadInput(f"input {args.input}: no rows")
    refuse_benchmarks(rows, args.input)
    out = Path(args.output)
    engine_name = "sglang" if args.url else "hf"
    settings = {"input_sha256": sha256_of(Path(args.input)), "engine": engine_name,
                "model": args.model if args.url else str(Path(args.target or "").resolve()),
                "temperature": args.temperature, "top_p": args.top_p, "max_tokens": args.max_tokens,
                "seed": args.seed, **({"n": args.n} if args.n > 1 else {})}
    journal = Journal(out)
    done: dict[int, dict] = {}
    try:
        done.update(journal.open(settings))
        return _answer(args, rows, out, journal, done, settings, engine_name, t0)
    except DiskFull as exc:
        journal.close()
        kept = sum(1 for r in rows if r.index in done and not done[r.index].get("failed"))
        print(f"regenerate: error: {exc}; {kept} of {len(rows)} rows done and kept in {journal.journal_path}: "
              f"free space and run again to resume", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)                     # the pool's threads would hold the exit (see below)


def _answer(args, rows, out: Path, journal, done: dict, settings: dict, engine_name: str, t0: float) -> int:
    from ops.regenerate.engine import ConnectionLost
    from ops.regenerate.journal import write_conversations, writing
    from ops.regenerate.run import ServerGone, run_rows

    gone = False
    try:
        if args.url:
            from ops.regenerate.server import ChatServer
            engine = ChatServer(args.url, args.model, args.temperature, args.top_p, args.max_tokens, args.seed,
                                args.timeout_s)
            try:
                engine.wait_ready(args.ready_timeout_s, say)
            except ConnectionLost as exc:
                print(f"regenerate: error: {exc}", file=sys.stderr, flush=True)
                return 1
            concurrency = args.concurrency
            note = engine.graph_note(concurrency) if concurrency > 1 else None
            if note:
                say(f"regenerate: warning: {note}")
        else:
            from ops.regenerate.hf import HFGenerator
            engine = HFGenerator(args.target, args.device, args.dtype, args.temperature, args.top_p,
                                 args.max_tokens, args.seed)
            concurrency = 1
        answered_before = sum(1 for r in rows if r.index in done and not done[r.index].get("failed"))
        sampling = "greedy" if args.temperature == 0 else f"temperature {args.temperature:g}, top_p {args.top_p:g}"
        sampling += f", {args.n} samples a row" if args.n > 1 else ""
        say(f"regenerate: {len(rows)} rows of {args.input} ({answered_before} answered before, resumed), engine "
            f"{engine_name}" + (f" {args.url}" + (f" (serve stage {args.server})" if args.server else "")
                                + f", {concurrency} at once" if args.url else f" on {args.target}")
            + f", {sampling}, max_tokens {args.max_tokens}")
        try:
            progress = run_rows(engine, rows, journal, done, concurrency, say, args.n)
        except ServerGone as exc:
            answered = sum(1 for r in done.values() if not r.get("failed"))
            again = len(done) - answered
            print(f"regenerate: error: the server stopped answering: {exc}; the {answered} answered rows are "
                  f"kept in {journal.journal_path}" + (f" ({again} failed rows are asked again)" if again else "")
                  + ": run again to resume", file=sys.stderr, flush=True)
            gone = True
    finally:
        journal.close()
    if gone:
        # The pool's threads are joined at exit: requests still hanging on a hung server
        # would hold the exit for up to timeout_s after the failure was said.
        sys.stdout.flush()
        os._exit(1)

    mine = {r.index: done[r.index] for r in rows if r.index in done}
    written, nbytes = write_conversations(out, mine)
    failed = [r for r in mine.values() if r.get("failed")]
    dropped = sum(int(r.get("dropped_samples") or 0) for r in mine.values() if not r.get("failed"))
    result = {
        "status": "complete", "engine": engine_name, "url": args.url, "server": args.server,
        "input": str(args.input), "output": str(out / "conversations.jsonl"), "rows": len(rows),
        "answered": len(mine) - len(failed), "conversations": written, "samples": args.n,
        "answered_before": answered_before,
        "turns": sum(int(r.get("turns") or 0) for r in mine.values() if not r.get("failed")),
        "completion_tokens": sum(int(r.get("completion_tokens") or 0) for r in mine.values() if not r.get("failed")),
        "failed": dict(sorted(Counter(r["failed"] for r in failed).items())),
        "failed_rows": [{"row": r["row"], "id": r.get("id"), "kind": r["failed"], "turn": r.get("turn"),
                         "detail": r.get("detail")} for r in sorted(failed, key=lambda r: r["row"])][:FAILED_ROWS_KEPT],
        "seconds": round(time.time() - t0, 3),
        "tok_s": progress.tokens / max(time.monotonic() - progress.t0, 1e-9),
        "dropped_samples": dropped, "bytes": nbytes, **{k: settings[k] for k in ("model", "temperature", "top_p", "max_tokens", "seed")},
    }
    with writing(out / RESULT):
        write_json_atomic(out / RESULT, result)
    say(f"regenerate: {result['answered']} of {len(rows)} rows answered"
        + (f" ({written} conversations, {dropped} samples dropped)" if args.n > 1 else "")
        + f", {result['completion_tokens']} tokens, "
        f"{result['tok_s']:.1f} tok/s; {failed_words(result)} -> {out / 'conversations.jsonl'}")
    if len(failed) > args.max_failed_fraction * len(rows):
        print(f"regenerate: error: {len(failed)} of {len(rows)} rows failed, more than max_failed_fraction "
              f"{args.max_failed_fraction:g}: {failed_words(result)}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
