"""The bad files a verify report names, as they stand now: what `clean` may offer.

Sits after verify (its --report JSON, e.g. runs/verify.json; check.py's
Report.as_json) and before the console's clean action, which can offer them
even under a succeeded extract run. A report is an old file that anyone can
edit, so an entry is only returned when its path lies inside the output the
report is about (no `..`, no folder linked out of it; a sample replaced by a
symlink is the link itself, never its target) and the file is still the
one verify judged (same size and mtime, where the report recorded them): a
file resume rewrote since, or a stray path, is never offered. No torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ReportedBad:
    path: Path              # absolute, inside the output
    reason: str             # verify's words
    sample: int | None      # the sample index, or None for a file that is no sample (temp, stray)
    size: int               # bytes now


class ReportError(ValueError):
    """The report cannot be read: names the file and what is wrong."""


def reported_bad_files(report_path: str | os.PathLike, output: str | os.PathLike | None = None,
                       base: str | os.PathLike | None = None) -> list[ReportedBad]:
    """The bad files of verify's report at `report_path` that still exist
    unchanged inside `output` (default: the report's own "output"; when given,
    the report must be about that directory). The report's relative paths are
    relative to `base`, the directory verify ran in (default: the cwd). Raises
    ReportError naming the file when the report is missing, not JSON or not a
    verify report."""
    report_path = Path(report_path)
    try:
        data = json.loads(report_path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{report_path}: no verify report there (has verify run with --report?)") from None
    except (OSError, ValueError) as exc:
        raise ReportError(f"{report_path}: not a readable JSON report ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("bad_files"), list) \
            or not isinstance(data.get("output"), str):
        raise ReportError(f"{report_path}: not a verify report (expected keys 'output' and 'bad_files')")
    def real(p: str) -> Path:
        return Path(os.path.realpath(os.path.join(base, p) if base is not None else p))

    def real_parent(p: str) -> Path:
        # The entry itself is not resolved: a sample replaced by a symlink is the link (inside the output).
        joined = Path(os.path.join(base, p) if base is not None else p)
        return real(str(joined.parent)) / joined.name

    root = real(data["output"])
    if output is not None and Path(os.path.realpath(output)) != root:
        raise ReportError(f"{report_path}: reports on {data['output']}, not on {output}")
    out: list[ReportedBad] = []
    for entry in data["bad_files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        path = real_parent(entry["path"])
        if root not in path.parents:
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue        # gone already (cleaned, or rewritten under another name)
        if not (os.path.isfile(path) or os.path.islink(path)):
            continue
        if ("size" in entry and entry["size"] != st.st_size) or \
                ("mtime_ns" in entry and entry["mtime_ns"] != st.st_mtime_ns):
            continue        # changed since verify judged it (a resume rewrote it)
        sample = entry.get("sample")
        out.append(ReportedBad(path=path, reason=str(entry.get("reason", "")),
                               sample=sample if isinstance(sample, int) else None, size=st.st_size))
    return out
