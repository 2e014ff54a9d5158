"""verify's header pass: every sample of an extract output, no tensor data read.

Sits after extract (it reads the layout of shared/DESIGN.md through
ops/formats.py) and before train and `clean` (which takes `bad_files`).
Per file (ops/sample_check.py's check_files, which a resumed extract runs
too): the header parses, the file is as long as the header says, the keys,
dtypes and shapes agree with each other and with data_config.json, the token
count with sample_lengths.json. Over the directory: indices complete
0..total-1, each file in its shard directory, no leftover temp files, totals
equal data_config's.

Counting: every index 0..total-1 is exactly one of good, bad or missing, so
good + bad + missing = total; files that are no sample of the output (temp
files, strays, misplaced or beyond total) are listed among bad_files as
"other", never counted as samples.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ops import hidden_formats
from ops.common import TMP_SUFFIX, read_json, write_json_atomic
from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, SAMPLE_RE, SHARD_DIR_RE, SHARD_ROWS, read_data_config
from ops.sample_check import FORMAT_MISMATCH, check_files, expected_from


@dataclass
class Report:
    output: str
    status: str | None = None
    total_samples: int | None = None       # data_config's
    expected_tokens: int | None = None     # data_config's
    checked: int = 0                       # sample files whose header was read
    good: int = 0
    tokens: int = 0                        # in the good files
    # {"path", "reason", "sample" (its index, or None: no sample of this
    # output), "size", "mtime_ns" (when verify saw it)}; `clean` removes these.
    bad_files: list[dict] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)     # not tied to one file
    sample_lengths: str = ""
    deep: dict | None = None
    seconds: float = 0.0
    lengths: dict[int, int] = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return not (self.bad_files or self.missing or self.problems)

    @property
    def bad_samples(self) -> int:
        return sum(1 for b in self.bad_files if b.get("sample") is not None)

    def bad(self, path: Path | str, reason: str, sample: int | None = None) -> None:
        """A bad file, once: a second finding on the same file joins its reason."""
        for b in self.bad_files:
            if b["path"] == str(path):
                b["reason"] += f"; {reason}"
                return
        entry = {"path": str(path), "reason": reason, "sample": sample}
        try:
            st = os.lstat(path)      # a symlink is judged as the link: clean removes the link, not its target
            entry.update(size=st.st_size, mtime_ns=st.st_mtime_ns)
        except OSError:
            pass
        self.bad_files.append(entry)

    def demote(self, path: str, sample: int, reason: str) -> None:
        """A sample the header pass found good, found bad later (by --deep)."""
        if sample in self.lengths and not any(b["path"] == path for b in self.bad_files):
            self.good -= 1
            self.tokens -= self.lengths[sample]
        self.bad(path, reason, sample)

    def as_json(self) -> dict:
        return {
            "ok": self.ok, "output": self.output, "status": self.status,
            "total_samples": self.total_samples, "expected_tokens": self.expected_tokens,
            "checked": self.checked, "good": self.good, "tokens": self.tokens,
            "bad_samples": self.bad_samples, "other_bad_files": len(self.bad_files) - self.bad_samples,
            "bad_files": self.bad_files, "missing_indices": ranges(self.missing),
            "missing_count": len(self.missing), "problems": self.problems,
            "sample_lengths": self.sample_lengths, "deep": self.deep,
            "seconds": round(self.seconds, 3),
        }


def ranges(indices: list[int]) -> list[str]:
    """[1, 2, 3, 7] -> ["1-3", "7"]: a million missing indices stay readable."""
    out: list[str] = []
    start = prev = None
    for i in sorted(indices):
        if start is None:
            start = prev = i
        elif i == prev + 1:
            prev = i
        else:
            out.append(f"{start}-{prev}" if prev != start else str(start))
            start = prev = i
    if start is not None:
        out.append(f"{start}-{prev}" if prev != start else str(start))
    return out


def scan(output: Path, report: Report) -> dict[int, str]:
    """idx -> path of every sample file; temp, misplaced and stray files are bad."""
    found: dict[int, str] = {}
    with os.scandir(output) as top:
        entries = sorted(top, key=lambda e: e.name)
    for entry in entries:
        if entry.name.endswith(TMP_SUFFIX):
            report.bad(entry.path, "leftover temp file")
            continue
        m = SHARD_DIR_RE.match(entry.name)
        if not (m and entry.is_dir()):
            continue
        lo, hi = int(m.group(1)), int(m.group(2))
        with os.scandir(entry.path) as shard:
            for f in shard:
                if f.name.endswith(TMP_SUFFIX):
                    report.bad(f.path, "leftover temp file (an interrupted write)")
                    continue
                sm = SAMPLE_RE.match(f.name)
                if not sm or sm.group(2) != "safetensors":
                    report.bad(f.path, "not a sample file of this layout")
                    continue
                idx = int(sm.group(1))
                if not lo <= idx < hi:
                    report.bad(f.path, f"sample {idx} in shard directory {entry.name}")
                    continue
                if idx in found:
                    report.bad(f.path, f"a second file for sample {idx} (also {found[idx]})")
                    continue
                found[idx] = f.path
    return found


def verify_headers(output: Path, workers: int = 8,
                   on_progress: Callable[[Report, int], None] | None = None) -> Report:
    start = time.monotonic()
    output = Path(output)
    report = Report(output=str(output))
    if not output.is_dir():
        report.problems.append(f"{output}: not a directory")
        return report
    config = read_data_config(output)
    if config is None:
        report.problems.append(f"{output / DATA_CONFIG}: missing or not JSON (was this written by extract?)")
    else:
        report.status = config.get("status")
        report.total_samples = config.get("total_samples")
        report.expected_tokens = config.get("total_tokens")
        if report.status != "complete":
            report.problems.append(f"{output / DATA_CONFIG}: status {report.status!r}, not 'complete' "
                                   f"(the extraction did not finish; run it again to resume)")
        if config.get("shard_rows", SHARD_ROWS) != SHARD_ROWS:
            report.problems.append(f"{output / DATA_CONFIG}: shard_rows {config.get('shard_rows')}, "
                                   f"this verify knows {SHARD_ROWS}")
    exp = expected_from(config, str(output / DATA_CONFIG))
    lengths_path = output / SAMPLE_LENGTHS
    recorded = read_json(lengths_path)
    if recorded is not None and not all(isinstance(v, int) for v in recorded.values()):
        report.problems.append(f"{lengths_path}: values must be integer token counts; rebuilding it")
        recorded = None
    found = scan(output, report)
    total = report.total_samples
    if total is None and recorded is not None:
        total = len(recorded)
    if total is None:
        total = max(found) + 1 if found else 0
    extra = sorted(i for i in found if i >= total)
    if extra:
        report.problems.append(f"{len(extra)} sample(s) beyond total_samples={total}: {ranges(extra)[:10]}")
        for i in extra:
            report.bad(found.pop(i), f"sample {i} beyond total_samples={total}")
    want = {int(k): int(v) for k, v in recorded.items() if k.isdigit()} if recorded is not None else None
    mixed: list[tuple[str, str]] = []
    for n, (idx, path, tokens, reason) in enumerate(check_files(found, exp, want, workers), 1):
        report.checked += 1
        if reason is not None and reason.startswith(FORMAT_MISMATCH):
            # Not damage for `clean` to take: another run's data in this output.
            mixed.append((path, reason))
        elif reason is None:
            report.good += 1
            report.tokens += tokens
            report.lengths[idx] = tokens
        else:
            report.bad(path, reason, idx)
        if on_progress is not None:
            on_progress(report, n)
    if mixed:
        raise hidden_formats.BadFormat(f"{mixed[0][0]}: {mixed[0][1]}" + (
            f" (and {len(mixed) - 1} more files)" if len(mixed) > 1 else "")
            + "; the output mixes formats: nothing was written")
    report.missing = [i for i in range(total) if i not in found]
    if not report.missing and not report.bad_files and report.expected_tokens is not None \
            and report.tokens != report.expected_tokens:
        report.problems.append(f"{report.tokens} tokens in the files, data_config total_tokens says "
                               f"{report.expected_tokens}")

    if recorded is None:
        write_json_atomic(lengths_path, {str(i): n for i, n in sorted(report.lengths.items())})
        report.sample_lengths = f"rebuilt from {len(report.lengths)} good files"
    else:
        stray = sorted(int(k) for k in recorded if k.isdigit() and int(k) >= total)
        report.sample_lengths = "present" + (f"; {len(stray)} entries beyond total" if stray else "")
        if len(recorded) != total:
            report.problems.append(f"{lengths_path}: {len(recorded)} entries, expected {total}")
    report.seconds = time.monotonic() - start
    return report
