"""History for the console's curves: a stage's step records (its spec's
curves, which the snapshot hands over: train's metrics.jsonl) read incrementally, and an extraction's
tokens/s sampled pass by pass.

MetricsReader keeps a byte offset into metrics.jsonl and parses only what was
appended since the last refresh (never the file again); a file cut shorter or
replaced starts over, and a step lower than the last one (train appends, so a
fresh run into the same output writes step 1 after the old run's last) starts
the series over. Series are bounded: past MAX_POINTS, every other point goes
(the newest always stays), so a 100,000-step run costs the same as a short one.

No textual import: the collector (snapshot.py) owns these.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from eagle3_console.kernel.model import Curves, StageStatus
from eagle3_console.kernel.registry import RunStatus
from ops.spec import CurvePoint, CurveSource

MAX_POINTS = 512
READ_CHUNK = 4 << 20        # bytes parsed a pass at most: a huge first open is spread over passes


def _thin(series: list) -> None:
    """Drop every other point, keeping the last."""
    last = series[-1]
    del series[1::2]
    if series[-1] is not last:
        series.append(last)


class MetricsReader:
    def __init__(self, path: str | Path, point: Callable[[dict], CurvePoint | None],
                 max_points: int = MAX_POINTS):
        self.path = Path(path)
        self.point = point          # a record as a curve point (the spec's CurveSource.point)
        self.max_points = max_points
        self.offset = 0
        self._ino: int | None = None
        self._partial = b""
        self.curves = Curves()
        self.reads = 0              # bytes read in all (tests: never the file twice)

    def _reset(self) -> None:
        self.offset, self._partial, self.curves = 0, b"", Curves()

    def refresh(self) -> Curves:
        try:
            st = os.stat(self.path)
        except OSError:
            return self.curves
        if self._ino is not None and (st.st_ino != self._ino or st.st_size < self.offset):
            self._reset()
        self._ino = st.st_ino
        if st.st_size == self.offset:
            return self.curves
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(READ_CHUNK)
        except OSError:
            return self.curves
        self.offset += len(data)
        self.reads += len(data)
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()         # a line still being written
        for raw in lines:
            try:
                rec = json.loads(raw)
            except ValueError:
                continue
            if isinstance(rec, dict):
                self._add(rec)
        return self.curves

    def _add(self, rec: dict) -> None:
        p = self.point(rec)
        if p is None:
            return
        c = self.curves
        if c.steps and p.step <= c.steps[-1]:
            c = self.curves = Curves()      # another run's records from step 1
        if len(p.acc) != len(c.acc):
            if c.steps:                     # a different depth K: another run
                c = self.curves = Curves()
            c.acc = [[] for _ in p.acc]
        c.steps.append(p.step)
        c.loss.append(p.loss)
        for series, a in zip(c.acc, p.acc):
            series.append(a)
        c.sim_al.append(float("nan") if p.sim_al is None else p.sim_al)
        if len(c.steps) > self.max_points:
            for series in (c.steps, c.loss, c.sim_al, *c.acc):
                _thin(series)


class RateHistory:
    """tokens/s of one run, a sample a pass, bounded like the readers' series."""

    def __init__(self, max_points: int = MAX_POINTS):
        self.max_points = max_points
        self.curves = Curves()

    def add(self, t: float, value: float) -> Curves:
        c = self.curves
        if c.tok_s_times and t <= c.tok_s_times[-1]:
            return c
        c.tok_s.append(value)
        c.tok_s_times.append(t)
        if len(c.tok_s) > self.max_points:
            _thin(c.tok_s)
            _thin(c.tok_s_times)
        return c


class CurveTracker:
    """The collector's readers and histories, one per stage output / run."""

    def __init__(self) -> None:
        self._readers: dict[tuple[str, str], MetricsReader] = {}
        self._rates: dict[tuple[str, int], RateHistory] = {}

    def curves(self, st: StageStatus, now: float, source: CurveSource | None = None) -> Curves | None:
        """The stage's history: its op's step records (`source`: the spec's curves, which
        the snapshot passes) under its first output, else its run's tokens/s."""
        if source is not None and st.outputs:
            key = (st.name, str(Path(st.outputs[0]) / source.file))
            reader = self._readers.get(key)
            if reader is None:
                reader = self._readers[key] = MetricsReader(key[1], point=source.point)
            return reader.refresh()
        if st.run_id is None:
            return None
        hist = self._rates.get((st.name, st.run_id))
        if st.tokens_per_s is not None and st.status == RunStatus.RUNNING:
            if hist is None:
                # Only the latest run of a stage is plotted.
                for k in [k for k in self._rates if k[0] == st.name]:
                    del self._rates[k]
                hist = self._rates[(st.name, st.run_id)] = RateHistory()
            hist.add(now, st.tokens_per_s)
        return hist.curves if hist is not None else None
