"""Disk usage of a stage output against its estimate and the free space.

Where it sits: snapshot.collect() builds one DiskMonitor per stage output
(sharing the output's TreeIndex with the ShardMonitor), passes the fraction
done when shard progress knows it, and turns `fits is False` into a
disk_short alert; `run` calls room_for() before starting a stage.

Bytes written come from the incremental TreeIndex (apparent sizes); free and
total come from the filesystem of the nearest existing ancestor, since an
output directory usually does not exist before its stage starts.
"""

from __future__ import annotations

import os
from pathlib import Path

from eagle3_console.kernel.model import DiskUsage
from eagle3_console.monitor.tree import TreeIndex


def nearest_existing(path: str | os.PathLike) -> Path:
    """`path` or its closest ancestor that exists (the filesystem it will land on)."""
    p = Path(os.path.abspath(path))
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_space(path: str | os.PathLike) -> tuple[int, int]:
    """(free bytes, total bytes) of the filesystem that holds or will hold `path`.
    Free is what an unprivileged writer can use (statvfs f_bavail)."""
    # shutil.disk_usage's own arithmetic, without shutil's import (bz2, lzma, fnmatch: `status` pays for it).
    st = os.statvfs(nearest_existing(path))
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def room_for(path: str | os.PathLike, estimate_bytes: int | None,
             written_bytes: int = 0) -> tuple[bool | None, int]:
    """Whether the rest of an estimate (estimate - already written, e.g. on a
    resume) fits in the free space at `path`: (fits or None when no estimate, free)."""
    free, _ = free_space(path)
    if estimate_bytes is None:
        return None, free
    return max(0, estimate_bytes - written_bytes) <= free, free


class DiskMonitor:
    def __init__(self, stage: str, path: str | os.PathLike, estimate_bytes: int | None = None,
                 index: TreeIndex | None = None) -> None:
        self.stage = stage
        self.path = Path(path)
        self.estimate_bytes = estimate_bytes
        self.index = index if index is not None else TreeIndex(self.path)

    def refresh(self, fraction_done: float | None = None, refresh_index: bool = True) -> DiskUsage:
        """Pass refresh_index=False when the shared index was already refreshed
        in this cycle (by the ShardMonitor)."""
        if refresh_index:
            self.index.refresh()
        written = self.index.total_bytes
        try:
            free, total = free_space(self.path)
        except OSError:
            free = total = None
        projected: int | None = None
        if fraction_done is not None and fraction_done > 0:
            projected = written if fraction_done >= 1 else int(written / fraction_done)
        target = projected if projected is not None else self.estimate_bytes
        fits: bool | None = None
        if target is not None and free is not None:
            fits = max(0, target - written) <= free
        return DiskUsage(stage=self.stage, path=str(self.path), written_bytes=written,
                         files=self.index.file_count, estimate_bytes=self.estimate_bytes,
                         projected_bytes=projected, free_bytes=free, total_bytes=total, fits=fits)
