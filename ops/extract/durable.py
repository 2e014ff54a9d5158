"""Extract's sample files reach the disk before data_config.json says complete.

Sits between the writers (writer.py: temp name, then rename) and the closing
data_config.json (run.py). A renamed file is whole in the page cache only: a
machine crash can leave it empty or missing while the config says complete.
Two ways to close that gap (param `durable`):
- "fsync": each writer fsyncs its file before the rename (the write-back
  overlaps the forwards of later batches); at the end one fsync of each
  shard directory and of the output directory makes the renames durable;
- "direct": each file written with O_DIRECT (sample_file.py: the page cache
  bypassed, so no write-back to wait for) and fsynced for its metadata, then
  the directories as for "fsync";
- "syncfs": nothing per file; one syncfs(2) of the output's filesystem at the
  end (cheaper per file, but the whole write-back waits at the end and it
  also flushes other processes' dirty data on that filesystem).
benchmarks/extract_throughput.py --durable fsync,direct,syncfs measures them in one
invocation; DEFAULT is whichever cost less on the GPU machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time
from pathlib import Path

from ops.formats import SHARD_DIR_RE

MODES = ("fsync", "direct", "syncfs")
DEFAULT = "direct"   # H200, ext4: 31,717 vs 31,243-31,327 tok/s for fsync (benchmarks/RESULTS.md)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by name (O_RDONLY works for both on Linux)."""
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(path: Path) -> str:
    """syncfs(2) of the filesystem holding `path`; os.sync() where libc has none."""
    libc_name = ctypes.util.find_library("c")
    fn = getattr(ctypes.CDLL(libc_name, use_errno=True), "syncfs", None) if libc_name else None
    if fn is None:
        os.sync()
        return "sync"
    fd = os.open(str(path), os.O_RDONLY)
    try:
        if fn(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"syncfs({path}): {os.strerror(err)}")
    finally:
        os.close(fd)
    return "syncfs"


def finish(out_dir: Path, mode: str) -> str:
    """Make every sample file under `out_dir` and its name durable; a log line."""
    t0 = time.monotonic()
    if mode in ("fsync", "direct"):
        with os.scandir(out_dir) as top:
            shards = [Path(e.path) for e in top if e.is_dir() and SHARD_DIR_RE.match(e.name)]
        for shard in shards:
            fsync_path(shard)
        fsync_path(out_dir)
        how = (f"files {'written with O_DIRECT and ' if mode == 'direct' else ''}fsynced before rename, "
               f"{len(shards)} shard dirs fsynced")
    elif mode == "syncfs":
        how = f"one {_syncfs(out_dir)} of the output's filesystem"
    else:
        raise ValueError(f"durable {mode!r}: expected one of {', '.join(MODES)}")
    return f"extract: durable: {how} in {time.monotonic() - t0:.2f} s"
