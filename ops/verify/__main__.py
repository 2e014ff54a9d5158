"""`python -m ops.verify --input OUTPUT [--deep N [--target MODEL]] [--report PATH]`

The program of the verify stage (spec: ops/verify/spec.py). Header pass over
every sample (check.py), then optionally --deep (deep.py). Prints a summary
and `progress:` lines; the JSON report goes to --report or stdout. Exit 0 when
everything checks out, 1 with the list of bad files otherwise (`clean` takes
the report's bad_files), 2 on bad flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ops.common import BadInput, read_json, run_main, write_json_atomic
from ops.params import build_parser as spec_parser
from ops.formats import read_data_config
from ops.verify.check import Report, verify_headers
from ops.verify.spec import SPEC

_LIST_LIMIT = 50


def build_parser() -> argparse.ArgumentParser:
    return spec_parser(SPEC, target_required=False, target_help="the target model directory (used by --deep only)")


class _Ticker:
    """`progress: samples D/T tokens X errors N tok/s Y` every 2 s (tok/s = tokens checked per s)."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()

    def __call__(self, report: Report, n: int, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= 2.0:
            self.last = now
            total = report.total_samples if report.total_samples is not None else report.checked
            print(f"progress: samples {n}/{total} tokens {report.tokens} errors {len(report.bad_files)} "
                  f"tok/s {report.tokens / max(now - self.start, 1e-9):.1f}", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    output = Path(args.input)
    if not output.is_dir():
        raise BadInput(f"input {output}: not a directory (an extract output expected)")
    ticker = _Ticker()
    report = verify_headers(output, workers=args.workers, on_progress=ticker)
    ticker(report, report.checked, force=True)
    print(f"verify: headers of {report.checked} files checked in {report.seconds:.2f} s "
          f"({report.checked / max(report.seconds, 1e-9):.0f} files/s)", flush=True)

    if args.deep:
        _deep(args, output, report)

    _summary(report)
    data = report.as_json()
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)   # runs/ may not exist yet
        write_json_atomic(Path(args.report), data)
        print(f"verify: report written to {args.report}", flush=True)
    else:
        print(json.dumps(data, indent=2), flush=True)
    return 0 if report.ok else 1


def _deep(args, output: Path, report: Report) -> None:
    from ops.verify import deep
    from ops.verify.recompute import recompute

    config = read_data_config(output) or {}
    bad_paths = {b["path"] for b in report.bad_files}
    good = {i: p for i, p in _good_paths(output, report).items() if p not in bad_paths}
    chosen = deep.pick(list(good), args.deep, args.seed)
    vocab = None
    if args.target:
        vocab = (read_json(Path(args.target) / "config.json") or {}).get("vocab_size")
    found = deep.load_checks({i: good[i] for i in chosen}, vocab, config)
    info: dict = {"loaded": len(chosen), "samples": chosen[:100], "bad": len(found)}
    index = {p: i for i, p in good.items()}
    for b in found:
        report.demote(b["path"], index[b["path"]], b["reason"])
    if args.target and args.recompute:
        if not (Path(args.target) / "config.json").is_file():
            raise BadInput(f"target {args.target}: no config.json")
        bad_now = {b["path"] for b in found}
        redo = [i for i in chosen if good[i] not in bad_now][: args.recompute]
        print(f"verify: recomputing {len(redo)} samples with {args.target}", flush=True)
        records, wrong = recompute({i: good[i] for i in redo}, Path(args.target), config)
        info["recomputed"] = records
        for b in wrong:
            report.demote(b["path"], index[b["path"]], b["reason"])
    elif args.recompute and not args.target:
        info["recomputed"] = "skipped: no --target"
    report.deep = info


def _good_paths(output: Path, report: Report) -> dict[int, str]:
    from ops.formats import sample_path

    return {i: str(sample_path(output, i)) for i in report.lengths}


def _summary(report: Report) -> None:
    state = "OK" if report.ok else "FAILED"
    other = len(report.bad_files) - report.bad_samples
    # Each sample index is in one bucket: the three add up to the total.
    print(f"verify: {state}: {report.good + report.bad_samples + len(report.missing)} samples: "
          f"{report.good} good ({report.tokens} tokens), {report.bad_samples} bad, "
          f"{len(report.missing)} missing; {other} other bad files (not samples of this output), "
          f"{len(report.problems)} other problems; sample_lengths.json {report.sample_lengths}", flush=True)
    for problem in report.problems:
        print(f"verify: problem: {problem}", flush=True)
    for bad in report.bad_files[:_LIST_LIMIT]:
        print(f"verify: bad file: {bad['path']}: {bad['reason']}", flush=True)
    if len(report.bad_files) > _LIST_LIMIT:
        print(f"verify: ... and {len(report.bad_files) - _LIST_LIMIT} more bad files (see the report)",
              flush=True)
    if report.missing:
        from ops.verify.check import ranges
        print(f"verify: missing indices: {', '.join(ranges(report.missing)[:20])}", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main, prog="verify"))
