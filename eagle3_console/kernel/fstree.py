"""Walk, move and delete under one opened directory, never by a path string again.

An output is a folder that anyone may rearrange while clean (or the supervisor's
record of it) walks it: a sub-folder swapped for a symlink to elsewhere, and a
path string resolved a moment later leads outside. So every step here starts
from a directory fd opened with O_NOFOLLOW, descends with openat(O_NOFOLLOW),
checks each directory's (st_dev, st_ino) against what the walk saw, and
renames or unlinks relative to that fd: the kernel is never asked to follow a
link. Only the root's own path is resolved, once, when it is opened.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_DEPTH = 64

Ident = tuple[int, int]


def ident(st: os.stat_result) -> Ident:
    return st.st_dev, st.st_ino


class Changed(OSError):
    """The path is no longer what the walk saw (swapped, replaced, gone)."""


@dataclass(frozen=True)
class Entry:
    rel: tuple[str, ...]            # path parts under the root
    dev: int
    ino: int
    size: int
    mtime_ns: int
    is_dir: bool
    parents: tuple[Ident, ...]      # the root's and each directory's identity down to the parent

    @property
    def ident(self) -> Ident:
        return self.dev, self.ino


def _entry(rel: tuple[str, ...], st: os.stat_result, parents: tuple[Ident, ...]) -> Entry:
    return Entry(rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, stat.S_ISDIR(st.st_mode), parents)


class Root:
    """An output root opened once (O_NOFOLLOW: a root that is a symlink is refused)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.fd = os.open(self.path, O_DIR)
        self.ident = ident(os.fstat(self.fd))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Root":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def path_of(self, rel: tuple[str, ...]) -> Path:
        return self.path.joinpath(*rel)

    # ---------------------------------------------------------------- reading
    def walk(self) -> Iterator[Entry]:
        """Every regular file under the root; symlinks are never followed, and a
        directory swapped between its listing and its opening is skipped."""
        yield from self._walk(self.fd, (), (self.ident,))

    def _walk(self, fd: int, rel: tuple[str, ...], parents: tuple[Ident, ...]) -> Iterator[Entry]:
        subdirs = []
        with os.scandir(fd) as it:
            for e in it:
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    yield _entry(rel + (e.name,), st, parents)
                elif stat.S_ISDIR(st.st_mode) and len(rel) < MAX_DEPTH:
                    subdirs.append((e.name, ident(st)))
        for name, seen in subdirs:
            try:
                sub = os.open(name, O_DIR, dir_fd=fd)
            except OSError:
                continue        # gone, or a symlink now
            try:
                if ident(os.fstat(sub)) == seen:
                    yield from self._walk(sub, rel + (name,), parents + (seen,))
            finally:
                os.close(sub)

    def descend(self, rel: tuple[str, ...], expect: tuple[Ident, ...] | None = None
                ) -> tuple[int, tuple[Ident, ...]]:
        """A new fd of the directory holding `rel`, reached without following any
        link, and the identities on the way; with `expect`, each directory on the
        way must still be the one the walk saw (Changed otherwise)."""
        fd = os.dup(self.fd)
        ids = [self.ident]
        try:
            if expect is not None and expect[:1] != (self.ident,):
                raise Changed(0, "the output root was replaced")
            for depth, part in enumerate(rel[:-1], start=1):
                sub = os.open(part, O_DIR, dir_fd=fd)
                os.close(fd)
                fd = sub
                ids.append(ident(os.fstat(fd)))
                if expect is not None and expect[depth:depth + 1] != (ids[-1],):
                    raise Changed(0, f"{part}/ was replaced since it was listed")
            if expect is not None and len(expect) != len(ids):
                raise Changed(0, "the folders on the way changed since the listing")
            return fd, tuple(ids)
        except OSError:
            os.close(fd)
            raise

    def lookup(self, rel: tuple[str, ...], links: bool = False) -> Entry | None:
        """The file or directory at `rel` reached without following links, or None
        (missing, or some component on the way is a symlink or not a directory);
        with `links`, a symlink at `rel` itself too (the link, never its target)."""
        if not rel:
            return None
        try:
            fd, parents = self.descend(rel)
        except OSError:
            return None
        try:
            st = os.stat(rel[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None
        finally:
            os.close(fd)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or (links and stat.S_ISLNK(st.st_mode))):
            return None
        return _entry(rel, st, parents)

    def size(self, entry: Entry) -> int:
        """A file's bytes, or a directory's regular files summed (links not followed)."""
        if not entry.is_dir:
            return entry.size
        try:
            fd, _ids = self.descend(entry.rel, entry.parents)
        except OSError:
            return 0
        try:
            sub = os.open(entry.rel[-1], O_DIR, dir_fd=fd)
        except OSError:
            return 0
        finally:
            os.close(fd)
        try:
            return sum(e.size for e in self._walk(sub, entry.rel, entry.parents + (entry.ident,)))
        finally:
            os.close(sub)

    # ---------------------------------------------------------------- acting
    def _checked_parent(self, entry: Entry) -> int:
        fd, _ids = self.descend(entry.rel, entry.parents)
        try:
            st = os.stat(entry.rel[-1], dir_fd=fd, follow_symlinks=False)
        except OSError:
            os.close(fd)
            raise
        if ident(st) != entry.ident or stat.S_ISDIR(st.st_mode) != entry.is_dir:
            os.close(fd)
            raise Changed(0, "replaced since it was listed")
        return fd

    def remove(self, entry: Entry) -> None:
        """Delete the entry (a directory with everything in it, links not followed)."""
        fd = self._checked_parent(entry)
        try:
            if entry.is_dir:
                import shutil  # here, not at the top: status --json imports this module and not bz2/lzma
                # fd-based on Linux: rmtree never follows a link inside (nor `name` itself).
                shutil.rmtree(entry.rel[-1], dir_fd=fd)
            else:
                os.unlink(entry.rel[-1], dir_fd=fd)
        finally:
            os.close(fd)

    def move(self, entry: Entry, dest: "Dest", rel: tuple[str, ...]) -> Path:
        """Rename the entry to `rel` under `dest` (never onto an existing name);
        returns where it went."""
        fd = self._checked_parent(entry)
        try:
            dir_fd, name = dest.free_name(rel)
            os.rename(entry.rel[-1], name, src_dir_fd=fd, dst_dir_fd=dir_fd)
            return dest.path.joinpath(*rel[:-1], name)
        finally:
            os.close(fd)


class Dest:
    """A folder of our own (clean's fresh trash folder), filled through fds."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, O_DIR)
        self.dev = os.fstat(self.fd).st_dev
        self._dirs: dict[tuple[str, ...], int] = {(): self.fd}

    def _dir(self, parts: tuple[str, ...]) -> int:
        if parts in self._dirs:
            return self._dirs[parts]
        parent = self._dir(parts[:-1])
        try:
            os.mkdir(parts[-1], 0o755, dir_fd=parent)
        except FileExistsError:
            pass
        fd = os.open(parts[-1], O_DIR, dir_fd=parent)
        self._dirs[parts] = fd
        return fd

    def free_name(self, rel: tuple[str, ...]) -> tuple[int, str]:
        fd = self._dir(rel[:-1])
        name, n = rel[-1], 1
        while True:
            candidate = name if n == 1 else f"{name}.{n}"
            try:
                os.stat(candidate, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return fd, candidate
            n += 1

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs = {}
