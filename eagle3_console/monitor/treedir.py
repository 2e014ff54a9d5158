"""One directory of a TreeIndex (monitor/tree.py): its file entries, its
totals when frozen, and its saved form.

Where it sits: TreeIndex holds a DirEntries per loaded directory and a
DirTotals per frozen one; monitor/samplefiles.py saves and reloads a folder's
entries as columns (dir_columns / dir_from_columns) in .eagle3/cache/.
"""

from __future__ import annotations

from typing import NamedTuple


class FileEntry(NamedTuple):
    size: int
    mtime_ns: int
    ino: int
    hot: bool       # re-stat at the next refresh: may still be growing in place


class DirTotals(NamedTuple):
    """A settled directory whose per-file entries are not loaded (a one-shot
    `status` restoring a big output): what the totals need, and its mtime,
    which says whether a listing would find the same files."""

    mtime_ns: int
    subdirs: list[str]
    bytes: int
    files: int
    newest_ns: int | None


class DirEntries:
    """One loaded directory: its mtime, files, subdirectories, bytes and the
    names to re-stat at each refresh."""

    __slots__ = ("mtime_ns", "racy", "files", "subdirs", "bytes", "hot")

    def __init__(self, mtime_ns: int, racy: bool, files: dict[str, FileEntry],
                 subdirs: list[str]) -> None:
        self.mtime_ns = mtime_ns
        self.racy = racy
        self.files = files
        self.subdirs = subdirs
        self.bytes = sum(f.size for f in files.values())
        # Names to re-stat at each refresh, so an unchanged directory costs O(hot), not O(files).
        self.hot = {n for n, f in files.items() if f.hot}


def dir_columns(d: DirEntries) -> list:
    """A directory's saved form: [mtime_ns, racy, subdirs, names, sizes,
    mtimes, inodes, hot names]; flat lists of ints keep a 20,000-file state
    quick to dump and load."""
    fs = list(d.files.values())
    return [d.mtime_ns, d.racy, d.subdirs, list(d.files),
            [f.size for f in fs], [f.mtime_ns for f in fs], [f.ino for f in fs], sorted(d.hot)]


def dir_from_columns(rel: str, columns: list) -> DirEntries:
    """A directory from TreeIndex.dir_columns(); raises TypeError or ValueError when damaged."""
    mtime_ns, racy, subdirs, names, sizes, mtimes, inos, hot = columns
    if not (len(names) == len(sizes) == len(mtimes) == len(inos)):
        raise ValueError(f"directory {rel!r}: lists of different lengths")
    hot = set(hot)
    # JSON gives ints already; a damaged state only needs telling
    # apart from a sound one (one check a column, not one a value):
    # 20,000 files load in a third of the time of an int() each.
    for column in (sizes, mtimes, inos):
        if not all(type(v) is int for v in column):
            raise ValueError(f"directory {rel!r}: a size, mtime or inode that is no integer")
    files = dict(zip(names, map(FileEntry, sizes, mtimes, inos, [n in hot for n in names])))
    return DirEntries(int(mtime_ns), bool(racy), files, [str(x) for x in subdirs])
