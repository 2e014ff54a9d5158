"""Which files of an output tree are samples: their layout, folder, index,
token count from the safetensors header, and the files that could not be read.

Where it sits: monitor/shards.py keeps one SampleFiles per ShardMonitor and
hands it each refresh's TreeIndex changes (sync()); the counts, per folder and
per layout, become the stage's ShardProgress. Folders of a one-shot `status`
restored from .eagle3/cache/ may stay frozen (TreeIndex.freeze): only their
counts are held until one changes; then thaw_dir() loads its saved per-file
state (folder_state()).

Layouts (which names are samples, where): monitor/layouts.py.

Tokens from headers: the `input_ids` (speculators: `token_ids`) shape in the safetensors header of each
sample, read once per new file (a few hundred bytes; tensor data is never
read). A safetensors sample whose header cannot be read counts as done (it
exists, like in `ls`) and as a bad file; it is retried when its size or mtime
changes.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from pathlib import Path
from typing import Callable

from eagle3_console.monitor.layouts import EAGLE3, GLOB, SPEC_HS, classify, folder_layouts, last_int
from eagle3_console.monitor.tree import TreeIndex, TreeStats
from eagle3_console.monitor.treedir import DirTotals, dir_from_columns
from ops.common import TMP_SUFFIX
from ops.formats import SAMPLE_RE, BadSampleFile, read_safetensors_header, tokens_in_header

class SampleFiles:
    def __init__(self, root: Path, index: TreeIndex, sample_glob: str | None = None) -> None:
        self.root = root
        self.index = index
        self.sample_glob = sample_glob
        # relpath -> (shard dir rel, layout, sample idx)
        self._samples: dict[str, tuple[str, str, int]] = {}
        self._per_dir: Counter[str] = Counter()
        self._per_layout: Counter[str] = Counter()
        self._tmp: set[str] = set()
        self._header_tokens: dict[str, int] = {}        # relpath -> tokens from its header
        self._bad: dict[str, list[int]] = {}            # relpath -> [size, mtime_ns] when it failed
        self._synced = False
        self._tokens_cache: tuple[int | None] | None = None   # (tokens done,) while valid
        # Frozen folders (TreeIndex.freeze): their counts only, until one changes;
        # then _dir_loader(rel) gives its saved per-file state (folder_state()).
        self._frozen: dict[str, dict] = {}
        self._dir_loader: Callable[[str], dict | None] | None = None
        self._dirty_dirs: set[str] = set()      # folders whose saved per-file state is old
        self._gone_dirs: set[str] = set()       # folders gone: their saved state is of no use

    def use_glob(self, sample_glob: str | None) -> None:
        self.sample_glob = sample_glob
        self._synced = False

    def _glob_sample(self, rel: str) -> int | None:
        """The index of a file the custom pattern names (its last number, else 0); None if it does not."""
        if not fnmatch.fnmatchcase(rel, self.sample_glob):
            return None
        return last_int(rel.rpartition("/")[2])

    # ---- following the index ---------------------------------------------
    def sync(self, stats: TreeStats) -> None:
        """Take in what the index's last refresh found."""
        self._dirty_dirs |= stats.changed_dirs
        self._gone_dirs |= stats.dropped_dirs
        if not self._synced:
            self._resync()
        else:
            for rel in stats.removed_files:
                self._forget(rel)
            for rel in stats.new_files:
                self._add(rel)
        self._retry_bad()

    def _resync(self) -> None:
        """Rebuild the sample set from the index (a fresh monitor, or restored
        state). A tight loop: this runs over every loaded file once per process;
        a frozen folder keeps its counts."""
        self._samples.clear()
        self._per_dir.clear()
        self._per_layout.clear()
        self._tmp.clear()
        keep_tokens, keep_bad = self._header_tokens, self._bad
        self._header_tokens, self._bad = {}, {}
        for rel_dir in self.index.dirs():
            self._sync_dir(rel_dir, self.index.names_in(rel_dir), keep_tokens.get, keep_bad.get)
        self._tokens_cache = None
        self._synced = True

    def _sync_dir(self, rel_dir: str, names: list[str], kept_tokens, kept_bad) -> None:
        """Add one folder's files (kept_tokens/kept_bad: what is known of them already)."""
        if self.sample_glob:
            prefix = f"{rel_dir}/" if rel_dir else ""
            for name in names:
                self._add(prefix + name)
            return
        match = SAMPLE_RE.match
        layouts = folder_layouts(rel_dir)
        prefix = f"{rel_dir}/" if rel_dir else ""
        samples, tokens, bad = self._samples, self._header_tokens, self._bad
        n, per_layout = 0, Counter()
        for name in names:
            rel = prefix + name
            if name.endswith(TMP_SUFFIX):
                self._tmp.add(rel)
                continue
            if layouts is None:
                continue
            m = match(name)
            if m is None:
                continue
            number, ext = m.groups()
            layout = layouts[ext]
            idx = int(number)
            samples[rel] = (rel_dir, layout, idx)
            n += 1
            per_layout[layout] += 1
            value = kept_tokens(rel)
            if value is not None:
                tokens[rel] = value
                continue
            value = kept_bad(rel)
            if value is not None:
                bad[rel] = value
            elif layout in (EAGLE3, SPEC_HS):
                self._read_header(rel)
        if n:
            self._per_dir[rel_dir] += n
        self._per_layout.update(per_layout)

    def thaw_dir(self, rel_dir: str):
        """TreeIndex.thaw: a frozen folder changed (or is needed): its saved
        per-file state replaces its counts. None (no sound saved state): the
        index lists it as new, and every file in it is added again."""
        self._frozen.pop(rel_dir, None)
        self._tokens_cache = None
        self._dirty_dirs.add(rel_dir)
        state = self._dir_loader(rel_dir) if self._dir_loader is not None else None
        try:
            d = dir_from_columns(rel_dir, state["dir"])
            prefix = f"{rel_dir}/" if rel_dir else ""
            tokens = {prefix + str(k): v for k, v in state["tokens"].items()}
            if not all(type(v) is int for v in tokens.values()):
                raise ValueError("tokens: expected {name: int}")
            bad = {prefix + str(k): [int(a), int(b)] for k, (a, b) in state["bad"].items()}
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        self._dirty_dirs.discard(rel_dir)
        if self._synced:
            self._sync_dir(rel_dir, list(d.files), tokens.get, bad.get)
        else:       # _resync() keeps them
            self._header_tokens.update(tokens)
            self._bad.update(bad)
        return d

    def _add(self, rel: str, read_header: bool = True) -> None:
        rel_dir, _, name = rel.rpartition("/")
        if name.endswith(TMP_SUFFIX):
            self._tmp.add(rel)
            return
        if self.sample_glob:
            idx = self._glob_sample(rel)
            if idx is None:
                return
            # Not a hidden-state file: no header to read, no token count.
            cls: tuple[str, int, str] | None = (GLOB, idx, "")
        else:
            cls = classify(rel_dir, name)
        if cls is None:
            return
        layout, idx, ext = cls
        self._forget(rel)           # a file renamed over an existing sample
        self._tokens_cache = None
        self._samples[rel] = (rel_dir, layout, idx)
        self._per_dir[rel_dir] += 1
        self._per_layout[layout] += 1
        if ext == "safetensors" and read_header:
            self._read_header(rel)

    def _forget(self, rel: str) -> None:
        self._tmp.discard(rel)
        info = self._samples.pop(rel, None)
        if info is not None:
            self._tokens_cache = None
            self._per_dir[info[0]] -= 1
            self._per_layout[info[1]] -= 1
        self._header_tokens.pop(rel, None)
        self._bad.pop(rel, None)

    def _read_header(self, rel: str) -> None:
        self._tokens_cache = None
        self._dirty_dirs.add(rel.rpartition("/")[0])
        try:
            header, _size = read_safetensors_header(self.root / rel)
        except BadSampleFile:
            entry = self.index.entry(rel)
            self._bad[rel] = [entry.size, entry.mtime_ns] if entry else [-1, -1]
            self._header_tokens.pop(rel, None)
            return
        self._bad.pop(rel, None)
        tokens = tokens_in_header(header)
        if tokens is not None:
            self._header_tokens[rel] = tokens

    def _retry_bad(self) -> None:
        for rel, key in list(self._bad.items()):
            entry = self.index.entry(rel)
            if entry is None:
                self._bad.pop(rel, None)
            elif [entry.size, entry.mtime_ns] != key:
                self._read_header(rel)

    # ---- counts --------------------------------------------------------
    @property
    def synced(self) -> bool:
        """The sample set follows the index (false until the first refresh)."""
        return self._synced

    def lengths_changed(self) -> None:
        """sample_lengths.json changed: a frozen folder's token count was
        taken with the lengths as they were, and so was the sum."""
        self.index.thaw_all()
        self._tokens_cache = None

    def tokens_done(self, lengths: Callable[[], dict[int, int]]) -> int | None:
        """Tokens of all samples: from lengths() (sample_lengths.json, read only
        when the sum must be taken again), else from their headers."""
        if self._tokens_cache is None:
            value = self._sum_tokens(lengths())
            for agg in self._frozen.values():
                if agg["tokens"] is not None:
                    value = (value or 0) + agg["tokens"]
            self._tokens_cache = (value,)
        return self._tokens_cache[0]

    def token_source(self, has_lengths: bool) -> bool:
        return bool(self._header_tokens or has_lengths or any(a["htok"] for a in self._frozen.values()))

    def totals(self) -> tuple[int, Counter, Counter, int, int]:
        """Samples, per folder, per layout, tmp files and bad files: the loaded
        folders' and the frozen ones' together."""
        done, per_dir, per_layout = len(self._samples), self._per_dir, self._per_layout
        tmp, bad = len(self._tmp), len(self._bad)
        if self._frozen:
            per_dir, per_layout = Counter(per_dir), Counter(per_layout)
            for rel, agg in self._frozen.items():
                done += agg["n"]
                per_dir[rel] += agg["n"]
                per_layout.update(agg["layouts"])
                tmp += agg["tmp"]
                bad += agg["bad"]
        return done, per_dir, per_layout, tmp, bad

    def _sum_tokens(self, lengths: dict[int, int]) -> int | None:
        if not lengths:
            return sum(self._header_tokens.values()) if self._header_tokens else None
        total, known = 0, False
        for rel, (_d, _l, idx) in self._samples.items():
            n = lengths.get(idx)
            if n is None:
                n = self._header_tokens.get(rel)
            if n is not None:
                total += n
                known = True
        return total if known else None

    def sample_tokens(self, rel: str, lengths: dict[int, int]) -> int | None:
        n = lengths.get(self._samples[rel][2])
        return n if n is not None else self._header_tokens.get(rel)

    def recent(self, start_ns: int) -> list[tuple[int, str]]:
        """(mtime_ns, relpath) of the samples written since start_ns (a frozen
        folder has none: from_saved() freezes only folders older than that)."""
        recent: list[tuple[int, str]] = []
        for rel in self._samples:
            entry = self.index.entry(rel)
            if entry is not None and entry.mtime_ns >= start_ns:
                recent.append((entry.mtime_ns, rel))
        return recent

    def written_since(self, since_ns: int) -> list[tuple[int, str]]:
        """(mtime_ns, relpath) of the samples written since since_ns (a run's own
        files): a frozen folder written to since then is loaded first."""
        for rel, totals in self.index.frozen_dirs().items():
            if totals.newest_ns is not None and totals.newest_ns >= since_ns:
                self.index.names_in(rel)        # thaws it: its files join the sample set
        return self.recent(since_ns)

    # ---- per-folder saved state (a one-shot `status` under a live output) ----
    def folders(self, lengths: dict[int, int]) -> dict:
        """Each folder's counts, for the next process: a folder still as it was
        then stays frozen (freeze_saved); only a changed one's per-file state
        (folder_state()) is read and rewritten."""
        per: dict[str, dict] = {}
        for rel in self.index.dirs():
            info, settled_ok = self.index.dir_info(rel)
            per[rel] = {"n": 0, "layouts": {}, "tmp": 0, "bad": 0, "tokens": None,
                        "htok": False, "mtime": info.mtime_ns, "subdirs": info.subdirs, "bytes": info.bytes,
                        "files": info.files, "newest": info.newest_ns, "settled": settled_ok}
        for rel, (rel_dir, layout, _idx) in self._samples.items():
            agg = per[rel_dir]
            agg["n"] += 1
            agg["layouts"][layout] = agg["layouts"].get(layout, 0) + 1
        for rel in self._tmp:
            per[rel.rpartition("/")[0]]["tmp"] += 1
        for rel in self._bad:
            per[rel.rpartition("/")[0]]["bad"] += 1
        for rel in self._header_tokens:
            per[rel.rpartition("/")[0]]["htok"] = True
        for rel, (rel_dir, _layout, idx) in self._samples.items():
            n = lengths.get(idx) if lengths else None
            if n is None:
                n = self._header_tokens.get(rel)
            if n is not None:
                agg = per[rel_dir]
                agg["tokens"] = (agg["tokens"] or 0) + n
        for rel, fz in self.index.frozen_dirs().items():
            per[rel] = {**self._frozen[rel], "mtime": fz.mtime_ns, "subdirs": fz.subdirs, "bytes": fz.bytes,
                        "files": fz.files, "newest": fz.newest_ns, "settled": True}
        return per

    def freeze_saved(self, folders: dict, start_ns: int, loader: Callable[[str], dict | None]) -> list[str]:
        """Hold the folders of folders() saved settled and with no file written
        since start_ns as counts only (loader(rel) gives one's per-file state
        once it is needed); the others' names, to load at once. Raises
        KeyError, TypeError, ValueError or AttributeError when damaged."""
        self._dir_loader = loader
        self.index.thaw = self.thaw_dir
        eager = []
        for rel, agg in folders.items():
            rel = str(rel)
            newest = agg["newest"]
            if agg["settled"] and (newest is None or int(newest) < start_ns):
                self._frozen[rel] = {"n": int(agg["n"]),
                                     "layouts": {str(k): int(v) for k, v in agg["layouts"].items()},
                                     "tmp": int(agg["tmp"]), "bad": int(agg["bad"]),
                                     "tokens": None if agg["tokens"] is None else int(agg["tokens"]),
                                     "htok": bool(agg["htok"])}
                self.index.freeze(rel, DirTotals(int(agg["mtime"]), [str(x) for x in agg["subdirs"]],
                                                 int(agg["bytes"]), int(agg["files"]),
                                                 None if newest is None else int(newest)))
            else:
                eager.append(rel)
        return eager

    def folder_state(self, rel_dir: str) -> dict:
        """One loaded folder's per-file state (its index entries, header tokens, bad files)."""
        prefix = f"{rel_dir}/" if rel_dir else ""
        names = self.index.names_in(rel_dir)
        tokens = {n: self._header_tokens[prefix + n] for n in names if prefix + n in self._header_tokens}
        bad = {n: self._bad[prefix + n] for n in names if prefix + n in self._bad}
        return {"dir": self.index.dir_columns(rel_dir), "tokens": tokens, "bad": bad}

    def mark_dirty(self, rel_dir: str) -> None:
        """Its saved state could not be written: try again at the next save."""
        self._dirty_dirs.add(rel_dir)

    def take_dirty_dirs(self) -> tuple[list[str], list[str]]:
        """(loaded folders whose saved state is old, folders gone), forgotten once taken."""
        dirty = [r for r in self._dirty_dirs if r in self.index.dirs()]
        gone = [r for r in self._gone_dirs if r not in self.index.dirs() and r not in self._frozen]
        self._dirty_dirs, self._gone_dirs = set(), set()
        return dirty, gone
