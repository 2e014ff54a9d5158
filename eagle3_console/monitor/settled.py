"""A settled output's compact summary: what a one-shot `status` keeps instead
of 20,000 files' state.

Where it sits: snapshot.Collector (persist=True) saves summary(mon) of each
ShardMonitor beside the full state, and on the next process builds the
monitor from the summary alone (ShardMonitor.from_summary); the per-folder state
(.eagle3/cache/shards-*.json, ShardMonitor.from_folders) is read only when
the summary no longer holds, and then only for the folders that changed.

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
from typing import TYPE_CHECKING, Any, Callable

from eagle3_console.monitor.tree import TreeStats
from ops.formats import SAMPLE_LENGTHS

if TYPE_CHECKING:
    from eagle3_console.monitor.shards import ShardMonitor

SUMMARY_VERSION = 1


class IndexTotals:
    """Stands in for the TreeIndex a DiskMonitor shares (bytes and files only)."""

    def __init__(self, total_bytes: int, file_count: int) -> None:
        self.total_bytes = total_bytes
        self.file_count = file_count
        self.last = TreeStats()


def summary(mon: "ShardMonitor") -> dict | None:
    """The compact state of a settled monitor, or None while its tree may change unseen."""
    if mon._summary is not None:
        return mon._summary
    if not mon._synced or mon._restored_tokens is not None:
        return None
    dirs = mon.index.settled()
    if dirs is None:
        return None
    done, per_dir, per_layout, tmp, bad = mon._totals()
    return {
        "version": SUMMARY_VERSION, "root": os.fspath(mon.root), "glob": mon.sample_glob,
        "dirs": dirs, "config_key": mon._config_key, "config": mon._config,
        "lengths_key": mon._lengths_key, "errors": dict(mon._errors),
        "done": done, "per_dir": {k: n for k, n in per_dir.items() if n > 0},
        "layout": mon._layout(done, per_layout), "tmp": tmp, "bad": bad,
        "tokens": mon._tokens_done(), "token_source": mon._token_source(),
        "newest_ns": mon.index.newest_mtime_ns(),
        "bytes": mon.index.total_bytes, "files": mon.index.file_count,
    }


def valid(state: Any, root: str, sample_glob: str | None) -> bool:
    return (isinstance(state, dict) and state.get("version") == SUMMARY_VERSION
            and state.get("root") == root and state.get("glob") == sample_glob)


def holds(mon: "ShardMonitor", now: float) -> bool:
    """Whether the summary still describes the tree: every directory's mtime as
    it was, sample_lengths.json the same, nothing written inside the rate window."""
    s = mon._summary
    newest = s["newest_ns"]
    if newest is not None and newest >= (now - mon.window_s) * 1e9:
        return False
    if mon._root_file(SAMPLE_LENGTHS)[1] != s["lengths_key"]:
        return False
    root = os.fspath(mon.root)
    dirs = s["dirs"]
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


def install(mon: "ShardMonitor", state: Any, full_state: Callable[[float], Any], obs: Any) -> bool:
    """Make a fresh monitor answer from summary `state`; False when the state
    is of another version, root or pattern, or damaged (then: the full state)."""
    if not valid(state, os.fspath(mon.root), mon.sample_glob):
        return False
    try:
        mon._config_key = state["config_key"]
        mon._config = dict(state["config"] or {})
        mon._lengths_key = state["lengths_key"]
        mon._errors = {str(k): str(v) for k, v in state["errors"].items()}
        mon.index = IndexTotals(int(state["bytes"]), int(state["files"]))
        mon.set_observations(obs or ())
        for key in ("done", "per_dir", "layout", "tmp", "bad", "tokens", "token_source", "newest_ns", "dirs"):
            state[key]
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    mon._summary = state
    mon._full_state = full_state
    mon.dirty = False
    return True


def leave(mon: "ShardMonitor", now: float) -> None:
    """The summary no longer holds: continue from the saved per-folder state
    (only its changed folders loaded), or from scratch."""
    if mon._summary is None:
        return
    mon._summary = None
    loader, mon._full_state = mon._full_state, None
    obs = mon._obs
    full = loader(now) if loader is not None else None
    if full is None:
        full = type(mon)(mon.root, mon.expected_samples, mon.expected_tokens,
                         window_s=mon.window_s, sample_glob=mon.sample_glob)
    mon.__dict__.update(full.__dict__)
    if mon.index.thaw is not None:
        mon.index.thaw = mon._thaw_dir      # bound to this monitor, not to the one copied from
    mon._obs = obs      # this process's observations are newer than the saved ones
