"""A stage's progress beside its output's count: what the snapshot asks of a run.

Where it sits: snapshot._stage_status() takes its progress, rate and ETA from the
shard monitor (monitor/shards.py: in tokens once they are known) or the log; these
are the pieces that depend on the run itself: which files are its own (a custom
stage's rerun), the disk projection of such a count, and the rate of a plain
counter that prints none.
"""

from __future__ import annotations

from typing import Any

from eagle3_console.kernel.model import StageStatus
from eagle3_console.monitor.shards import ShardMonitor
from eagle3_console.kernel.registry import Run, RunStatus


def disk_fraction(fraction: float | None, mon: ShardMonitor) -> float | None:
    """The fraction the disk projection divides the output's bytes by. A run's own
    count (files since its start) is not one of the folder's bytes, which hold the
    previous run's files too (9/40 projected 178 KiB for 40 KiB): this run's bytes
    / its fraction, at least what is there (a rerun overwrites the same names)."""
    if mon.since_ns is None or not fraction:
        return fraction
    written = mon.index.total_bytes
    final = max(written, mon.own_bytes / fraction)
    return written / final if final else None


def from_log(st: StageStatus, fraction: float | None, started: float | None, still_running: bool,
             now: float) -> float | None:
    """The fraction done, with the stage's rate and ETA, from its log where the
    output's count gave none; tok/s from the run's own `progress:` line where the
    files gave none (null next to the log's 692.9 tok/s, before)."""
    log = st.log
    if fraction is None and log and log.progress_total:
        fraction = min(1.0, (log.progress_done or 0) / log.progress_total)
        st.rate, st.eta_s = log.rate, log.eta_s
        st.rate_unit = log.rate_unit if log.rate is not None else None
        if st.rate is None and still_running:
            st.rate, st.eta_s = counter_rate(log.progress_done, log.progress_total, started, now)
            st.rate_unit = "it/s" if st.rate is not None else None
    if st.tokens_per_s is None and log and log.tokens_per_s is not None:
        st.tokens_per_s = log.tokens_per_s
    return fraction


def counter_rate(done: int | None, total: int, started: float | None,
                 now: float) -> tuple[float | None, float | None]:
    """(rate, ETA) of a plain `N/M` counter that prints neither (`progress: samples
    9/40`): its count over the run's time so far (progress, but no rate or ETA,
    before). None while nothing is counted yet."""
    if not done or started is None or now <= started:
        return None, None
    rate = done / (now - started)
    return rate, max(0, total - done) / rate


def run_own_since(spec: Any, run: Run | None) -> int | None:
    """For a custom stage's run that has not succeeded: count only the files it
    wrote (ns since its start). Its output may hold a previous run's files (an
    OOM restart, a rerun): they read 100 % (41/40) from the first second, and
    a failed run 100 %. An op's own output is its progress (extract resumes)."""
    if spec.output_is_progress or run is None or run.started is None or run.status == RunStatus.SUCCEEDED:
        return None
    return int(run.started * 1e9)
