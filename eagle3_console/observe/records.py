"""A stage's record (its op's result file) read and interpreted once a pass.

The snapshot is the one place that asks an op what its record says: its line
(`status`, the JSON), its view (the TUI's panes) and its gauges (the exporter)
are made here, when the file changes, and carried on the StageStatus; the
panes, the JSON and the exporter render them and never look an op up.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.common import read_json
from ops.spec import Gauge, OpSpec, ResultView


@dataclass(frozen=True)
class Record:
    data: dict[str, Any] | None
    line: str | None
    time: float                                 # the file's mtime: whose run wrote it
    view: ResultView | None = None
    gauges: list[Gauge] = field(default_factory=list)


def interpret(spec: OpSpec, data: dict[str, Any] | None, time: float) -> Record:
    """What the op says of its record; a record it cannot read (another version's)
    is shown raw in the JSON, with no line, view or gauges."""
    if data is None:
        return Record(None, None, time)
    try:
        line = spec.result_line(data)
    except Exception:  # noqa: BLE001 - a record of another version: its words are none of ours
        line = None
    try:
        view, gauges = spec.result_view(data), list(spec.gauges(data))
    except Exception:  # noqa: BLE001 - as above: shown raw, no view, no figures
        view, gauges = None, []
    return Record(data, line, time, view, gauges)


class RecordReader:
    """The records of a collector's stages, re-read only when their file changed."""

    def __init__(self) -> None:
        self._cache: dict[Path, tuple[tuple[int, int], OpSpec, Record]] = {}

    def read(self, spec: OpSpec, path: Path) -> Record | None:
        """The op's record at `path` as it says it; None when there is no such file."""
        try:
            stat = path.stat()
        except OSError:
            return None
        key = (stat.st_mtime_ns, stat.st_size)
        cached = self._cache.get(path)
        if cached is not None and cached[0] == key and cached[1] is spec:
            return cached[2]
        data = last_json_line(path) if path.suffix == ".jsonl" else read_json(path)
        record = interpret(spec, data if isinstance(data, dict) else None, stat.st_mtime)
        self._cache[path] = (key, spec, record)
        return record


def last_json_line(path: Path, tail_bytes: int = 65536) -> dict | None:
    """The last complete line of a JSON-lines file, reading only its end."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - tail_bytes))
            lines = fh.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        try:
            value = json.loads(raw)
            return value if isinstance(value, dict) else None
        except ValueError:
            continue        # a line being written, or cut by the seek
    return None
