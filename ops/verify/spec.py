"""Spec of the verify stage: checks a hidden-state output from headers alone.

Reads what extract wrote (shared/DESIGN.md "Hidden-state data format") and
reports bad files; `--deep N` loads N samples, and with the target recomputes
a few. It writes nothing into the output except a rebuilt sample_lengths.json
when that is missing; the report goes to `--report PATH` (which the console
reads for the stage's result line) or the log.
"""

from __future__ import annotations

from pathlib import Path

from ops.spec import BadFiles, OpSpec, Param
from ops.verify.reported import ReportError, reported_bad_files

def reported_bad(report: Path, output: Path, base: Path) -> list:
    """The report's bad files still there unchanged (ops/verify/reported.py); [] when it cannot be read."""
    try:
        return reported_bad_files(report, output, base=base)
    except ReportError:
        return []


class Verify(OpSpec):
    name = "verify"
    summary = "check every sample file of an extract output from its safetensors header; --deep loads some"
    params = (
        Param("input", help="extract's output directory"),
        Param("deep", 0, "load N random samples and check them (NaN/Inf, mask, ids; 0: headers only)", low=0),
        Param("recompute", 2, "with --deep and --target: recompute this many of them with the target", low=0),
        Param("report", None, "write the JSON report here (default: the log)", type=str),
        Param("seed", 0, "which random samples --deep picks"),
        Param("workers", 8, "threads reading headers (helps on network filesystems)", low=1),
    )
    input_params = ("input",)
    # The target is only read with --deep (to recompute samples).
    uses_target = True
    result_path_param = "report"
    # clean offers the files its report names bad under extract's output, even after extract succeeded.
    bad_files = BadFiles(output_param="input", report_param="report", read=reported_bad)

    def result_line(self, report: dict) -> str | None:
        """The report in a line: whether every sample file checks out, and what
        --deep loaded and recomputed (the check "errors: 0" alone never was)."""
        if "ok" not in report:
            return None
        bad_files = report.get("bad_files") or []
        # Reports before the buckets were counted apart: every bad file was a sample.
        bad = report.get("bad_samples", len(bad_files))
        other = report.get("other_bad_files", 0)
        line = (f"{'OK' if report['ok'] else 'FAILED'}: {report.get('good', 0):,} good sample files of "
                f"{report.get('total_samples') or report.get('checked', 0):,}, {report.get('tokens', 0):,} tokens; "
                f"{bad} bad, {report.get('missing_count', 0)} missing"
                + (f"; {other} other bad files" if other else ""))
        deep = report.get("deep")
        if isinstance(deep, dict):
            line += f"; deep: {deep.get('loaded', 0)} loaded"
            redo = deep.get("recomputed")
            if isinstance(redo, list):
                line += f", {len(redo)} recomputed with the target"
        return line


SPEC = Verify()
