"""An incremental index of one directory tree (a stage's output root).

Where it sits: monitor/disk.py (bytes written) and monitor/samplefiles.py (sample
files, new files whose headers to read) both read one TreeIndex per output;
snapshot.collect() refreshes it and persists its state under .eagle3/cache/.

How it stays cheap: a directory is re-listed only when its mtime changed (a
file was created, renamed or removed in it); an unchanged directory costs one
lstat. Inside a re-listed directory only names that are new, or whose inode
changed (renamed over), are stat'ed. Files that may still grow in place are
re-stat'ed on every refresh: names ending in `.tmp`, files seen growing at the
last refresh, and the newest few files (HOT_RECENT_PER_DIR) of a directory
whose mtime was within `hot_s` of the moment they were stat'ed. A file that
stops growing for longer than that and later grows in place without any
change to its directory is not seen until the directory changes; the pipeline
writes `*.tmp` then renames, so its outputs are exact.

Symlinks inside the tree are never followed nor counted (the root itself may
be a symlink: the operator named it). Sizes are apparent sizes (st_size), the
unit of the disk estimate. The root may not exist yet: the index is empty.

Directory mtimes have coarse granularity (a kernel tick), so a directory
listed in the same tick as a later change would look unchanged forever; like
git's "racy" entries, a directory whose mtime is within RACY_NS (50 ms; 2 s
on whole-second filesystems) of the moment it was listed is listed again at
the next refresh.
"""

from __future__ import annotations

import os
import stat as statmod
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eagle3_console.monitor.treedir import DirEntries, DirTotals, FileEntry, dir_columns
from ops.common import TMP_SUFFIX

# A directory's mtime ticks with the kernel clock (a few ms); on filesystems
# that keep whole seconds (mtime with no sub-second part), a whole second or two.
RACY_NS = 50_000_000
RACY_COARSE_NS = 2_000_000_000
HOT_RECENT_PER_DIR = 8
RECENT, ALWAYS = 1, 2


@dataclass
class TreeStats:
    """What one refresh found, and what it cost."""

    total_bytes: int = 0
    files: int = 0
    dirs: int = 0
    dirs_listed: int = 0            # os.scandir calls made by this refresh
    files_stated: int = 0           # lstat calls on files made by this refresh
    new_files: list[str] = field(default_factory=list)      # relative paths, new or replaced
    removed_files: list[str] = field(default_factory=list)
    exists: bool = False
    # Directories whose entries this refresh changed (listed, re-stat'ed or gone): their saved state is old.
    changed_dirs: set[str] = field(default_factory=set)
    dropped_dirs: set[str] = field(default_factory=set)


def _racy(mtime_ns: int, now_ns: int) -> bool:
    """Listed so soon after its last change that a later change may keep the same mtime."""
    window = RACY_COARSE_NS if mtime_ns % 1_000_000_000 == 0 else RACY_NS
    return now_ns - mtime_ns < window


def _join(rel: str, name: str) -> str:
    return name if not rel else f"{rel}/{name}"


class TreeIndex:
    def __init__(self, root: str | os.PathLike, hot_s: float = 1.0) -> None:
        self.root = Path(root)
        self.hot_ns = int(hot_s * 1e9)
        self._dirs: dict[str, DirEntries] = {}
        # Frozen directories (their totals only) and how to load one (its saved entries, or None:
        # it is listed as new). Loaded when its mtime changes or a query needs its files.
        self._frozen: dict[str, DirTotals] = {}
        self.thaw: Callable[[str], "DirEntries | None"] | None = None
        self.last: TreeStats = TreeStats()

    # ---- queries -------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        return sum(d.bytes for d in self._dirs.values()) + sum(f.bytes for f in self._frozen.values())

    @property
    def file_count(self) -> int:
        return sum(len(d.files) for d in self._dirs.values()) + sum(f.files for f in self._frozen.values())

    def dirs(self) -> list[str]:
        """Relative paths of the loaded directories ("" is the root); frozen_dirs() are the others."""
        return list(self._dirs)

    def frozen_dirs(self) -> dict[str, DirTotals]:
        return dict(self._frozen)

    def files_in(self, rel: str = "") -> dict[str, FileEntry]:
        """Files of one directory (relative path, "" for the root): name -> entry."""
        d = self._loaded(rel)
        return dict(d.files) if d else {}

    def names_in(self, rel: str = "") -> list[str]:
        """File names of one directory (a list: safe to change the index meanwhile)."""
        d = self._loaded(rel)
        return list(d.files) if d else []

    def settled(self) -> dict[str, int] | None:
        """Each directory's mtime when nothing in the tree may still change
        unseen (no racy directory, no file re-stat'ed at every refresh), else
        None. With these mtimes unchanged, a refresh would find nothing new."""
        if any(d.racy or d.hot for d in self._dirs.values()):
            return None
        out = {rel: d.mtime_ns for rel, d in self._dirs.items()}
        out.update((rel, f.mtime_ns) for rel, f in self._frozen.items())
        return out

    def newest_mtime_ns(self) -> int | None:
        newest = max((f.mtime_ns for d in self._dirs.values() for f in d.files.values()), default=None)
        for f in self._frozen.values():
            if f.newest_ns is not None and (newest is None or f.newest_ns > newest):
                newest = f.newest_ns
        return newest

    def entry(self, relpath: str) -> FileEntry | None:
        rel, _, name = relpath.rpartition("/")
        d = self._loaded(rel)
        return d.files.get(name) if d else None

    # ---- frozen directories --------------------------------------------
    def freeze(self, rel: str, frozen: DirTotals) -> None:
        """Hold `rel` as frozen (no entries in memory) until it changes."""
        self._dirs.pop(rel, None)
        self._frozen[rel] = frozen

    def _loaded(self, rel: str) -> "DirEntries | None":
        if rel in self._frozen:
            return self._thaw(rel)
        return self._dirs.get(rel)

    def _thaw(self, rel: str) -> "DirEntries | None":
        if self._frozen.pop(rel, None) is None:
            return self._dirs.get(rel)
        d = self.thaw(rel) if self.thaw is not None else None
        if d is not None:
            self._dirs[rel] = d
        return d

    def load(self, rel: str) -> None:
        """Load a directory's saved entries through `thaw` now (none: it is listed as new)."""
        self._frozen.pop(rel, None)
        d = self.thaw(rel) if self.thaw is not None else None
        if d is not None:
            self._dirs[rel] = d

    def thaw_all(self) -> None:
        for rel in list(self._frozen):
            self._thaw(rel)

    def dir_columns(self, rel: str) -> list:
        """One loaded directory's saved form (monitor/treedir.py)."""
        return dir_columns(self._dirs[rel])

    def dir_info(self, rel: str) -> tuple[DirTotals, bool]:
        """A loaded directory's totals (its frozen form), and whether it may be frozen
        (settled: not racy, nothing re-stat'ed at every refresh)."""
        d = self._dirs[rel]
        newest = max((f.mtime_ns for f in d.files.values()), default=None)
        return DirTotals(d.mtime_ns, list(d.subdirs), d.bytes, len(d.files), newest), not (d.racy or d.hot)

    # ---- refresh -------------------------------------------------------
    def refresh(self) -> TreeStats:
        stats = TreeStats()
        now_ns = time.time_ns()
        root = os.fspath(self.root)
        try:
            st = os.stat(root)      # the root may be a symlink the operator chose
            is_dir = statmod.S_ISDIR(st.st_mode)
        except OSError:
            is_dir = False
        if not is_dir:
            self.thaw_all()
            for rel in list(self._dirs):
                self._drop(rel, stats)
            self.last = stats
            return stats
        stats.exists = True
        seen: set[str] = set()
        stack: list[tuple[str, os.stat_result]] = [("", st)]
        while stack:
            rel, dst = stack.pop()
            path = root if not rel else os.path.join(root, rel)
            fz = self._frozen.get(rel)
            if fz is not None and fz.mtime_ns == dst.st_mtime_ns:
                seen.add(rel)
                subdirs = fz.subdirs
                for sub in subdirs:
                    self._descend(stack, path, _join(rel, sub), sub)
                continue
            d = self._thaw(rel) if fz is not None else self._dirs.get(rel)
            if d is None or d.racy or d.mtime_ns != dst.st_mtime_ns:
                d = self._list(rel, path, d, dst, now_ns, stats)
                if d is None:       # vanished between lstat and scandir
                    continue
            elif d.hot:
                self._restat_hot(rel, path, d, now_ns, stats)
            seen.add(rel)
            for sub in d.subdirs:
                self._descend(stack, path, _join(rel, sub), sub)
        for rel in [r for r in (*self._dirs, *self._frozen) if r not in seen]:
            self._thaw(rel)
            self._drop(rel, stats)
        stats.dirs = len(self._dirs) + len(self._frozen)
        stats.total_bytes = self.total_bytes
        stats.files = self.file_count
        self.last = stats
        return stats

    @staticmethod
    def _descend(stack: list, path: str, srel: str, sub: str) -> None:
        try:
            sst = os.lstat(os.path.join(path, sub))
        except OSError:
            return
        if statmod.S_ISDIR(sst.st_mode):
            stack.append((srel, sst))

    def _hot(self, name: str, size: int, mtime_ns: int, now_ns: int, prev: FileEntry | None) -> int:
        """0: settled; RECENT: written just now, may still grow; ALWAYS: a .tmp, or seen growing."""
        if name.endswith(TMP_SUFFIX):
            return ALWAYS
        if prev is not None and (prev.size != size or prev.mtime_ns != mtime_ns):
            return ALWAYS
        return RECENT if now_ns - mtime_ns < self.hot_ns else 0

    def _list(self, rel: str, path: str, old: DirEntries | None, dst: os.stat_result,
              now_ns: int, stats: TreeStats) -> DirEntries | None:
        old_files = old.files if old else {}
        files: dict[str, FileEntry] = {}
        subdirs: list[str] = []
        recent: list[tuple[int, str]] = []
        try:
            it = os.scandir(path)
        except OSError:
            if old is not None:
                self._drop(rel, stats)
            return None
        stats.dirs_listed += 1
        stats.changed_dirs.add(rel)
        with it:
            for e in it:
                name = e.name
                try:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(name)
                        continue
                    if not e.is_file(follow_symlinks=False):
                        continue        # symlinks, sockets, fifos
                    ino = e.inode()
                except OSError:
                    continue
                prev = old_files.get(name)
                if prev is not None and prev.ino == ino and not prev.hot:
                    files[name] = prev
                    continue
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                stats.files_stated += 1
                same = prev is not None and prev.ino == ino
                hot = self._hot(name, s.st_size, s.st_mtime_ns, now_ns, prev if same else None)
                if hot == RECENT:
                    recent.append((s.st_mtime_ns, name))
                files[name] = FileEntry(s.st_size, s.st_mtime_ns, ino, hot == ALWAYS)
                if not same:
                    stats.new_files.append(_join(rel, name))
        # Of the files written just now, only the newest few can still be
        # growing in place (one per writer); a freshly built tree of
        # thousands of whole files must not be re-stat'ed in full.
        recent.sort(reverse=True)
        for _mtime, name in recent[:HOT_RECENT_PER_DIR]:
            files[name] = files[name]._replace(hot=True)
        for name in old_files:
            if name not in files:
                stats.removed_files.append(_join(rel, name))
        d = DirEntries(dst.st_mtime_ns, _racy(dst.st_mtime_ns, now_ns), files, subdirs)
        self._dirs[rel] = d
        return d

    def _restat_hot(self, rel: str, path: str, d: DirEntries, now_ns: int, stats: TreeStats) -> None:
        stats.changed_dirs.add(rel)
        for name in list(d.hot):
            prev = d.files[name]
            try:
                s = os.lstat(os.path.join(path, name))
            except OSError:
                # Removed without a directory mtime change is impossible;
                # the directory is re-listed next time anyway.
                continue
            stats.files_stated += 1
            if s.st_ino != prev.ino:
                d.racy = True       # replaced: let the next listing sort it out
                continue
            entry = FileEntry(s.st_size, s.st_mtime_ns, prev.ino,
                              self._hot(name, s.st_size, s.st_mtime_ns, now_ns, prev) > 0)
            if entry != prev:
                d.files[name] = entry
                d.bytes += entry.size - prev.size
            if not entry.hot:
                d.hot.discard(name)

    def _drop(self, rel: str, stats: TreeStats) -> None:
        d = self._dirs.pop(rel, None)
        if d is not None:
            stats.removed_files.extend(_join(rel, n) for n in d.files)
            stats.changed_dirs.add(rel)
            stats.dropped_dirs.add(rel)
