"""The monitors' state saved under .eagle3/cache/ between one-shot processes.

Data flow: snapshot.Collector (persist=True) asks SavedMonitors for the
monitors a previous `status`/`watch` process left (a ShardMonitor from its
summary or per-folder state, a LogFollower at its offset) and saves its own
at the end of each pass, so that the next process continues incrementally
instead of listing a terabyte or reading a gigabyte of log again.
"""

from __future__ import annotations

import json
import os
import time
from _thread import get_ident    # threading's, without threading's import
from pathlib import Path
from typing import Any, Mapping

from eagle3_console.monitor.logs import LogFollower
from eagle3_console.monitor.shards import ShardMonitor

CACHE_NAME = "monitors.json"
CACHE_VERSION = 3


class SavedMonitors:
    def __init__(self, cache_dir: Path) -> None:
        self.cache_dir = cache_dir
        self._cache: dict[str, Any] = self._load_cache()

    def _cache_path(self) -> Path:
        return self.cache_dir / CACHE_NAME

    def _load_cache(self) -> dict[str, Any]:
        try:
            data = json.loads(self._cache_path().read_text())
        except (OSError, ValueError):
            return {}
        return data if data.get("version") == CACHE_VERSION else {}

    def _folder_path(self, key: str, rel: str) -> Path:
        """Where one folder of an output keeps its per-file state (named after
        the stage, the root and the folder, so every process uses the same one)."""
        import hashlib      # 3 ms of import, only for an output whose summary no longer holds
        out = hashlib.sha1(key.encode()).hexdigest()[:16]
        return self.cache_dir / f"shards-{out}-{hashlib.sha1(rel.encode()).hexdigest()[:12]}.json"

    def _load_folder(self, key: str, rel: str) -> dict | None:
        try:
            data = json.loads(self._folder_path(key, rel).read_text())
        except (OSError, ValueError):
            return None
        if (not isinstance(data, dict) or data.get("version") != CACHE_VERSION or data.get("key") != key
                or data.get("rel") != rel):
            return None
        return data.get("state")

    def _from_folders(self, ckey: str, entry: dict, root: str, now: float, expected: int | None,
                      tokens: int | None, sample_glob: str | None) -> ShardMonitor | None:
        if not isinstance(entry.get("folders"), dict):
            return None
        return ShardMonitor.from_folders(entry["folders"], root, lambda rel: self._load_folder(ckey, rel), now,
                                         expected_samples=expected, expected_tokens=tokens,
                                         sample_glob=sample_glob)

    def shard_monitor(self, stage: str, root: str, expected: int | None, tokens: int | None,
                      sample_glob: str | None, now: float | None) -> ShardMonitor | None:
        """The monitor of this stage's output as the last process left it, or None."""
        ckey = f"{stage}\0{root}"
        entry = self._cache.get("shards", {}).get(ckey)
        if not isinstance(entry, dict):
            entry = {}
        mon = None
        if entry.get("summary"):
            mon = ShardMonitor.from_summary(
                entry["summary"], root,
                lambda at: self._from_folders(ckey, entry, root, at, expected, tokens, sample_glob),
                expected_samples=expected, expected_tokens=tokens, sample_glob=sample_glob,
                obs=entry.get("obs"))
        if mon is None:
            mon = self._from_folders(ckey, entry, root, time.time() if now is None else now,
                                     expected, tokens, sample_glob)
            if mon is not None:
                try:
                    if entry.get("obs") is not None:
                        mon.set_observations(entry["obs"])
                except (TypeError, ValueError):
                    pass
        return mon

    def log_follower(self, run_id: int) -> LogFollower | None:
        """The follower of this run's log at the offset the last process reached, or None."""
        state = self._cache.get("logs", {}).get(str(run_id))
        if state:
            try:
                return LogFollower.from_state(state)
            except (KeyError, TypeError, ValueError):
                return None
        return None

    def save(self, shards: Mapping[tuple[str, str], ShardMonitor], logs: Mapping[int, LogFollower]) -> None:
        """Write the monitors' state for the next one-shot process. monitors.json
        is small (logs, each output's summary and last observations) and written
        every pass; an output's per-file state (20,000 entries for 20,000
        samples) is written only when it changed. A settled output has a summary
        (monitor/settled.py), and the next process reads its per-file state only
        once that summary no longer holds. Many write at once (cron, loops of
        `status`, the TUI, watch): each file through a temp file of its own,
        renamed over it, so the last writer wins whole; a summary and a full
        state from different writers need not agree, since each is checked
        against the tree on its own. The cache only saves work: one that cannot
        be written (a read-only or full state folder) means the next process
        starts from scratch, never a failure."""
        saved = {}
        for (stage, root), mon in shards.items():
            key = f"{stage}\0{root}"
            if mon.summarized:
                # Answered from the summary: the saved folders are as they were.
                folders = (self._cache.get("shards", {}).get(key) or {}).get("folders")
            else:
                dirty, gone = mon.take_dirty_dirs()
                for rel in dirty:
                    if not self._write(self._folder_path(key, rel), {"version": CACHE_VERSION, "key": key,
                                                                   "rel": rel, "state": mon.folder_state(rel)}):
                        mon.mark_dirty(rel)
                for rel in gone:
                    try:
                        self._folder_path(key, rel).unlink()
                    except OSError:
                        pass
                folders = mon.folders()
            saved[key] = {"summary": mon.summary(), "obs": mon.observations(), "folders": folders}
        self._write(self._cache_path(), {"version": CACHE_VERSION, "shards": saved,
                                         "logs": {str(rid): f.to_state() for rid, f in logs.items()}})

    def _write(self, path: Path, data: dict) -> bool:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{get_ident()}.tmp")
        replaced = False
        try:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(data))
            os.replace(tmp, path)
            replaced = True
        except OSError:
            pass
        finally:
            # Also when a signal ends the process here (watch's SIGTERM is raised as an exception,
            # kernel/interrupts.py): a temp name of a dead pid would stay in the cache for good.
            if not replaced:
                try:
                    tmp.unlink()
                except OSError:
                    pass
        return replaced
