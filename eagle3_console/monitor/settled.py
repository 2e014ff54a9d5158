"""A settled output's compact summary: what a one-shot `status` keeps instead
of 20,000 files' state.

Where it sits: snapshot.Collector (persist=True) saves ShardMonitor.summary()
of each output beside its per-folder state, and on the next process builds
the monitor from the summary alone (ShardMonitor.from_summary); the
per-folder state (.eagle3/cache/shards-*.json, ShardMonitor.from_folders) is
read only when the summary no longer holds, and then only for the folders
that changed. This module is the summary's format and the test of whether it
holds; it knows nothing of the monitor.

When a summary holds: it was taken from a monitor whose index was settled
(no racy directory, no file re-stat'ed at every refresh: TreeIndex.settled)
and every directory of the tree still has the mtime it had then. A file
created, removed or renamed in any directory changes that directory's mtime,
and a directory added or removed changes its parent's, so one stat per
directory (11 for a 10-shard output) proves that a listing would find the
same files. Files rewritten in place are not seen by the index either (see
monitor/tree.py), except sample_lengths.json and data_config.json, which are
stat'ed every time as before. The files' mtimes must also lie outside the
rate window: a rate from the mtimes of recently finished files needs them.
"""

from __future__ import annotations

import os
import stat as statmod
from typing import Any

from eagle3_console.monitor.tree import TreeStats

SUMMARY_VERSION = 1
_KEYS = ("dirs", "config_key", "config", "lengths_key", "errors", "done", "per_dir", "layout", "tmp", "bad",
         "tokens", "token_source", "newest_ns", "bytes", "files")


class IndexTotals:
    """Stands in for the TreeIndex a DiskMonitor shares (bytes and files only)."""

    def __init__(self, total_bytes: int, file_count: int) -> None:
        self.total_bytes = total_bytes
        self.file_count = file_count
        self.last = TreeStats()


def make(root: str, sample_glob: str | None, **values: Any) -> dict:
    """A summary of the output at `root`: values has each of _KEYS."""
    if set(values) != set(_KEYS):
        raise TypeError(f"a summary has {sorted(_KEYS)}, got {sorted(values)}")
    return {"version": SUMMARY_VERSION, "root": root, "glob": sample_glob, **values}


def checked(state: Any, root: str, sample_glob: str | None) -> dict | None:
    """`state` when it is a sound summary of this root and pattern, else None
    (another version, root or pattern, or damaged: then the full state)."""
    if not (isinstance(state, dict) and state.get("version") == SUMMARY_VERSION
            and state.get("root") == root and state.get("glob") == sample_glob):
        return None
    if not all(k in state for k in _KEYS) or not isinstance(state["errors"], dict):
        return None
    return state


def holds(summary: dict, root: str, window_s: float, lengths_key: list[int] | None, now: float) -> bool:
    """Whether the summary still describes the tree: every directory's mtime as
    it was, sample_lengths.json the same (lengths_key: its stat now), nothing
    written inside the rate window."""
    newest = summary["newest_ns"]
    if newest is not None and newest >= (now - window_s) * 1e9:
        return False
    if lengths_key != summary["lengths_key"]:
        return False
    dirs = summary["dirs"]
    if not dirs:
        try:
            return not statmod.S_ISDIR(os.stat(root).st_mode)
        except OSError:
            return True
    for rel, mtime_ns in dirs.items():
        try:
            # The root may be a symlink the operator chose; inside, links are not followed.
            st = os.stat(root) if rel == "" else os.lstat(os.path.join(root, rel))
        except OSError:
            return False
        if not statmod.S_ISDIR(st.st_mode) or st.st_mtime_ns != mtime_ns:
            return False
    return True
