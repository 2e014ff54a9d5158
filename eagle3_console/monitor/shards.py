"""Shard progress of a hidden-state output: samples and tokens done, rate, ETA.

Where it sits: snapshot.collect() keeps one ShardMonitor per output of a stage
whose spec says `progress = "shards"`, refreshes it, and puts the returned
ShardProgress on the stage (its DiskMonitor shares `monitor.index`).
to_state()/from_state() carry everything (the tree index included) so a
one-shot `status` continues incrementally from .eagle3/cache/; a settled
output is carried by summary()/from_summary() alone (monitor/settled.py)
until a folder of it changes.

Layouts (shared/DESIGN.md), told apart by where the sample files are:
- eagle3:          rows_<a>-<b>/data_<i>.safetensors   (ours)
- specforge:       rows_<a>-<b>/data_<i>.pt or .ckpt    (the seed's and SpecForge's)
- speculators_pt:  data_<i>.pt in the root              (speculators)
- speculators_hs:  hs_<i>.safetensors in the root        (speculators)
A mix is counted in full and named after the layout holding most samples.
- glob:            a custom stage's own `sample_glob` (e.g. `sample_*.bin`),
                   matched against each file's path under the root (fnmatch:
                   `*` also crosses `/`); then only those files count.

Tokens: sample_lengths.json ({"idx": n_tokens}) when present, else the
`input_ids` shape in the safetensors header of each sample, read once per new
file (a few hundred bytes; tensor data is never read). `.pt` samples without
sample_lengths.json have no known token count. A safetensors sample whose
header cannot be read counts as done (it exists, like in `ls`) and as a bad
file; it is retried when its size or mtime changes.

Rate: samples/s and tokens/s over a sliding window of the observations this
monitor made. With no earlier observation inside the window (a first refresh,
a one-shot status long after the previous one), the rate comes from the mtimes
of the sample files finished inside the window, so it is still a rate of the
last `window_s` seconds. ETA = samples left / samples per second.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
from collections import Counter, deque
from pathlib import Path
from typing import Callable

from eagle3_console.model import ShardCount, ShardProgress
from eagle3_console.monitor import settled
from eagle3_console.monitor.tree import Frozen, TreeIndex, dir_from_columns
from ops.formats import (DATA_CONFIG, SAMPLE_LENGTHS, SAMPLE_RE, SHARD_DIR_RE, TMP_SUFFIX,
                         BadSampleFile, read_safetensors_header, tokens_in_header)

STATE_VERSION = 1
EAGLE3, SPECFORGE, SPEC_PT, SPEC_HS, NONE = (
    "eagle3", "specforge", "speculators_pt", "speculators_hs", "none")
GLOB = "glob"
_LAST_INT = re.compile(r"(\d+)(?!.*\d)")


def _classify(rel_dir: str, name: str) -> tuple[str, int, str] | None:
    """(layout, sample index, extension) of a sample file, None for other files."""
    m = SAMPLE_RE.match(name)
    if m is None:
        return None
    ext = m.group(2)
    if rel_dir == "":
        return (SPEC_HS if ext == "safetensors" else SPEC_PT), int(m.group(1)), ext
    if "/" not in rel_dir and SHARD_DIR_RE.match(rel_dir):
        return (EAGLE3 if ext == "safetensors" else SPECFORGE), int(m.group(1)), ext
    return None


class ShardMonitor:
    def __init__(self, root: str | os.PathLike, expected_samples: int | None = None,
                 expected_tokens: int | None = None, index: TreeIndex | None = None,
                 window_s: float = 60.0, sample_glob: str | None = None) -> None:
        self.root = Path(root)
        self.sample_glob = sample_glob
        self.expected_samples = expected_samples
        self.expected_tokens = expected_tokens
        self.index = index if index is not None else TreeIndex(self.root)
        self.window_s = window_s
        # relpath -> (shard dir rel, layout, sample idx)
        self._samples: dict[str, tuple[str, str, int]] = {}
        self._per_dir: Counter[str] = Counter()
        self._per_layout: Counter[str] = Counter()
        self._tmp: set[str] = set()
        self._header_tokens: dict[str, int] = {}        # relpath -> tokens from its header
        self._bad: dict[str, list[int]] = {}            # relpath -> [size, mtime_ns] when it failed
        self._lengths: dict[int, int] | None = None     # sample idx -> tokens; None: not read yet
        self._lengths_key: list[int] | None = None
        self._config: dict = {}
        self._config_key: list[int] | None = None
        self._errors: dict[str, str] = {}               # file -> why it could not be read
        self._obs: deque[tuple[float, int, int | None]] = deque()
        self._synced = False
        self._tokens_cache: tuple[int | None] | None = None   # (tokens done,) while valid
        self._idx_sum = 0                               # with the count: a fingerprint of the sample set
        self._restored_tokens: tuple[list, int | None] | None = None
        self._restored_lengths_error: str | None = None
        # A settled output's summary stands in for the per-file state until it
        # no longer holds; then _full_state(now) (a monitor of the saved per-folder state, or None) continues.
        self._summary: dict | None = None
        self._full_state: Callable[[float], "ShardMonitor | None"] | None = None
        # Per-file state changed since it was built or loaded: worth saving again.
        self.dirty = True
        # Frozen folders (TreeIndex.freeze): their counts only, until one changes;
        # then _dir_loader(rel) gives its saved per-file state (folder_state()).
        self._frozen: dict[str, dict] = {}
        self._dir_loader: Callable[[str], dict | None] | None = None
        self._dirty_dirs: set[str] = set()      # folders whose saved per-file state is old
        self._gone_dirs: set[str] = set()       # folders gone: their saved state is of no use

    def use_glob(self, sample_glob: str | None) -> None:
        """Count the files matching this pattern instead (None: the known layouts)."""
        if sample_glob != self.sample_glob:
            self._leave_summary()
            self.sample_glob = sample_glob
            self._synced = False

    def _glob_sample(self, rel: str) -> int | None:
        """The index of a file the custom pattern names (its last number, else 0); None if it does not."""
        if not fnmatch.fnmatchcase(rel, self.sample_glob):
            return None
        m = _LAST_INT.search(rel.rpartition("/")[2])
        return int(m.group(1)) if m else 0

    # ---- refresh -------------------------------------------------------
    def refresh(self, now: float | None = None, refresh_index: bool = True) -> ShardProgress:
        now = time.time() if now is None else now
        if self._summary is not None:
            if settled.holds(self, now):
                self._load_config()
                return self._progress(now)
            self._leave_summary(now)
        if refresh_index:
            self.index.refresh()
        stats = self.index.last
        new, removed = stats.new_files, stats.removed_files
        if new or removed or stats.dirs_listed or stats.files_stated:
            self.dirty = True
        self._dirty_dirs |= stats.changed_dirs
        self._gone_dirs |= stats.dropped_dirs
        if not self._synced:
            self._resync()
        else:
            for rel in removed:
                self._forget(rel)
            for rel in new:
                self._add(rel)
        self._retry_bad()
        self._load_config()
        self._load_lengths()
        if self._restored_tokens is not None:
            # A restored monitor whose samples and sample_lengths.json did not
            # change keeps its token sum: no 20,000-entry JSON to read again.
            fp, value = self._restored_tokens
            self._restored_tokens = None
            if fp == self._fingerprint():
                self._tokens_cache = (value,)
                if self._restored_lengths_error:
                    self._errors[SAMPLE_LENGTHS] = self._restored_lengths_error
        return self._progress(now)

    def _fingerprint(self) -> list:
        return [self._lengths_key, len(self._samples), self._idx_sum,
                sum(self._header_tokens.values())]

    def _resync(self) -> None:
        """Rebuild the sample set from the index (a fresh monitor, or restored
        state). A tight loop: this runs over every loaded file once per process;
        a frozen folder keeps its counts."""
        self._samples.clear()
        self._idx_sum = 0
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
        if rel_dir == "":
            layouts = {"safetensors": SPEC_HS, "pt": SPEC_PT, "ckpt": SPEC_PT}
        elif "/" not in rel_dir and SHARD_DIR_RE.match(rel_dir):
            layouts = {"safetensors": EAGLE3, "pt": SPECFORGE, "ckpt": SPECFORGE}
        else:
            layouts = None
        prefix = f"{rel_dir}/" if rel_dir else ""
        samples, tokens, bad = self._samples, self._header_tokens, self._bad
        n, idx_sum, per_layout = 0, 0, Counter()
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
            idx_sum += idx
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
        self._idx_sum += idx_sum
        self._per_layout.update(per_layout)

    def _thaw_dir(self, rel_dir: str):
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

    def _resync_glob(self, rel_dir: str) -> None:
        prefix = f"{rel_dir}/" if rel_dir else ""
        for name in self.index.files_in(rel_dir):
            self._add(prefix + name)

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
            cls = _classify(rel_dir, name)
        if cls is None:
            return
        layout, idx, ext = cls
        self._forget(rel)           # a file renamed over an existing sample
        self._tokens_cache = None
        self._samples[rel] = (rel_dir, layout, idx)
        self._idx_sum += idx
        self._per_dir[rel_dir] += 1
        self._per_layout[layout] += 1
        if ext == "safetensors" and read_header:
            self._read_header(rel)

    def _forget(self, rel: str) -> None:
        self._tmp.discard(rel)
        info = self._samples.pop(rel, None)
        if info is not None:
            self._tokens_cache = None
            self._idx_sum -= info[2]
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

    def _root_file(self, name: str) -> tuple[Path, list[int] | None]:
        # Stat'ed every time rather than taken from the index: other tools
        # rewrite these small files in place, which no directory mtime shows.
        path = self.root / name
        try:
            st = os.stat(path)
        except OSError:
            return path, None
        return path, [st.st_size, st.st_mtime_ns, st.st_ino]

    def _read_json(self, path: Path) -> dict | None:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            self._errors[path.name] = f"{path}: unreadable ({exc.strerror})"
            return None
        except ValueError as exc:
            self._errors[path.name] = f"{path}: not valid JSON ({exc})"
            return None
        if not isinstance(data, dict):
            self._errors[path.name] = f"{path}: expected a JSON object, got {type(data).__name__}"
            return None
        self._errors.pop(path.name, None)
        return data

    def _load_config(self) -> None:
        path, key = self._root_file(DATA_CONFIG)
        if key == self._config_key:
            return
        self._config_key = key
        self._config = {}
        self._errors.pop(DATA_CONFIG, None)
        if key is not None:
            self._config = self._read_json(path) or {}

    def _load_lengths(self) -> None:
        path, key = self._root_file(SAMPLE_LENGTHS)
        if key == self._lengths_key:
            return
        # A frozen folder's token count was taken with the lengths as they were.
        self.index.thaw_all()
        self._lengths_key = key
        self._lengths = None        # read when a token count needs it
        self._tokens_cache = None
        self._errors.pop(SAMPLE_LENGTHS, None)

    def _get_lengths(self) -> dict[int, int]:
        if self._lengths is not None:
            return self._lengths
        self._lengths = {}
        if self._lengths_key is None:
            return self._lengths
        path = self.root / SAMPLE_LENGTHS
        data = self._read_json(path)
        if data:
            try:
                self._lengths = {int(k): int(v) for k, v in data.items()}
            except (TypeError, ValueError):
                self._errors[SAMPLE_LENGTHS] = (
                    f"{path}: expected {{\"<sample idx>\": <n tokens>}} with integers")
        return self._lengths

    def _config_int(self, key: str) -> int | None:
        """An integer data_config.json records: `total_samples` (ours, the
        seed's) or, in a speculators tree, its `data.num_samples`."""
        value = self._config.get(key)
        data = self._config.get("data")
        if value is None and key == "total_samples" and isinstance(data, dict):
            key, value = "data.num_samples", data.get("num_samples")
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            self._errors[DATA_CONFIG + ":" + key] = (
                f"{self.root / DATA_CONFIG}: {key} should be an integer, got {value!r}")
            return None

    def _tokens_done(self) -> int | None:
        if self._tokens_cache is None:
            value = self._sum_tokens()
            for agg in self._frozen.values():
                if agg["tokens"] is not None:
                    value = (value or 0) + agg["tokens"]
            self._tokens_cache = (value,)
        return self._tokens_cache[0]

    def _token_source(self) -> bool:
        return bool(self._header_tokens or self._lengths_key or any(a["htok"] for a in self._frozen.values()))

    def _totals(self) -> tuple[int, Counter, Counter, int, int]:
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

    def _sum_tokens(self) -> int | None:
        lengths = self._get_lengths()
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

    def _sample_tokens(self, rel: str) -> int | None:
        n = self._get_lengths().get(self._samples[rel][2])
        return n if n is not None else self._header_tokens.get(rel)

    # ---- progress, rate, ETA ------------------------------------------
    def _progress(self, now: float) -> ShardProgress:
        s = self._summary
        if s is not None:
            done, per_dir, layout, tmp, bad, tokens = (
                s["done"], s["per_dir"], s["layout"], s["tmp"], s["bad"], s["tokens"])
        else:
            done, per_dir, per_layout, tmp, bad = self._totals()
            layout = self._layout(done, per_layout)
            tokens = self._tokens_done()
        expected = self.expected_samples
        if expected is None:
            expected = self._config_int("total_samples")
        tokens_expected = self.expected_tokens
        if tokens_expected is None:
            tokens_expected = self._config_int("total_tokens")
        if "status" in self._config:
            complete = self._config.get("status") == "complete"
        else:       # the seed's data_config.json has no status: complete when all are there
            total = self._config_int("total_samples")
            complete = bool(self._config) and total is not None and done >= total
        shards: list[ShardCount] = []
        for rel_dir, n in per_dir.items():
            if n <= 0:
                continue
            m = SHARD_DIR_RE.match(rel_dir)
            if rel_dir == "" or m is None:       # flat, or a custom pattern's own folders
                shards.append(ShardCount(rel_dir or ".", n, expected if rel_dir == "" else None))
                continue
            a, b = int(m.group(1)), int(m.group(2))
            rows = (min(b, expected) if expected is not None else b) - a
            shards.append(ShardCount(rel_dir, n, max(rows, 0)))
        shards.sort(key=lambda s: (-1, 0, "") if s.name == "." else
                    (int(m.group(1)), 0, "") if (m := SHARD_DIR_RE.match(s.name)) else (0, 1, s.name))

        sps, tps = self._rate(now, done, tokens)
        eta: float | None = None
        if complete:
            eta = 0.0
        elif expected is not None and sps:
            eta = max(0, expected - done) / sps
        return ShardProgress(
            root=str(self.root), layout=layout, samples_done=done, samples_expected=expected,
            tokens_done=tokens, tokens_expected=tokens_expected, shards=shards,
            tmp_files=tmp, samples_per_s=sps, tokens_per_s=tps, eta_s=eta,
            complete=complete, bad_files=bad,
            error="; ".join(self._errors[k] for k in sorted(self._errors)) or None)

    def _layout(self, done: int, per_layout: Counter) -> str:
        if not done:
            return NONE
        return max(per_layout.items(), key=lambda kv: kv[1])[0]

    def _rate(self, now: float, done: int, tokens: int | None) -> tuple[float | None, float | None]:
        if self._obs and (done < self._obs[-1][1] or now < self._obs[-1][0]):
            self._obs.clear()       # samples removed (clean, restart) or the clock went back
        start = now - self.window_s
        while self._obs and self._obs[0][0] < start:
            self._obs.popleft()
        self._obs.append((now, done, tokens))
        if len(self._obs) >= 2 and now > self._obs[0][0]:
            t0, d0, k0 = self._obs[0]
            dt = now - t0
            tps = (tokens - k0) / dt if tokens is not None and k0 is not None else None
            return (done - d0) / dt, tps
        return self._rate_from_mtimes(now, done)

    def _rate_from_mtimes(self, now: float, done: int) -> tuple[float | None, float | None]:
        if not done:
            return None, None
        if self._summary is not None:
            # settled.holds(): no file of the tree is inside the window.
            return 0.0, 0.0 if self._summary["token_source"] else None
        start_ns = int((now - self.window_s) * 1e9)
        recent: list[tuple[int, str]] = []
        for rel in self._samples:
            entry = self.index.entry(rel)
            if entry is not None and entry.mtime_ns >= start_ns:
                recent.append((entry.mtime_ns, rel))
        # A frozen folder has no file inside the window (from_folders).
        if not recent:
            return 0.0, 0.0 if self._token_source() else None
        recent.sort()
        span = (recent[-1][0] - recent[0][0]) / 1e9
        if len(recent) < 2 or span <= 0:
            return None, None
        # The first file marks the start of the span; the others finished inside it.
        sps = (len(recent) - 1) / span
        toks = [self._sample_tokens(rel) for _t, rel in recent[1:]]
        tps = sum(toks) / span if all(t is not None for t in toks) else None
        return sps, tps

    # ---- persistence ---------------------------------------------------
    def to_state(self) -> dict:
        self._leave_summary()
        self.index.thaw_all()
        return {
            "version": STATE_VERSION,
            "root": os.fspath(self.root),
            "glob": self.sample_glob,
            "index": self.index.to_state(),
            "header_tokens": self._header_tokens,
            "bad": self._bad,
            "obs": list(self._obs),
            "tokens": [self._fingerprint(), self._tokens_done()] if self._synced else None,
            "errors": self._errors,
        }

    # ---- per-folder persistence (a one-shot `status` under a live output) ----
    def folders(self) -> dict:
        """Each folder's counts, for the next process (monitors.json): a folder
        still as it was then is not loaded (from_folders); only a changed one's
        per-file state (folder_state()) is read and rewritten."""
        per: dict[str, dict] = {}
        for rel in self.index.dirs():
            info, settled_ok = self.index.dir_info(rel)
            per[rel] = {"n": 0, "idx_sum": 0, "layouts": {}, "tmp": 0, "bad": 0, "tokens": None,
                        "htok": False, "mtime": info.mtime_ns, "subdirs": info.subdirs, "bytes": info.bytes,
                        "files": info.files, "newest": info.newest_ns, "settled": settled_ok}
        for rel, (rel_dir, layout, idx) in self._samples.items():
            agg = per[rel_dir]
            agg["n"] += 1
            agg["idx_sum"] += idx
            agg["layouts"][layout] = agg["layouts"].get(layout, 0) + 1
        for rel in self._tmp:
            per[rel.rpartition("/")[0]]["tmp"] += 1
        for rel in self._bad:
            per[rel.rpartition("/")[0]]["bad"] += 1
        for rel in self._header_tokens:
            per[rel.rpartition("/")[0]]["htok"] = True
        lengths = self._get_lengths()
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

    @classmethod
    def from_folders(cls, entry: dict, root: str | os.PathLike, loader: Callable[[str], dict | None],
                     now: float, expected_samples: int | None = None, expected_tokens: int | None = None,
                     window_s: float = 60.0, sample_glob: str | None = None) -> "ShardMonitor | None":
        """A monitor from folders() (entry: {"root", "glob", "folders", "lengths_key",
        "errors", "obs"}): a folder saved settled and with no file inside the rate
        window at `now` stays frozen; the others are loaded at once through
        loader(rel) (folder_state(), or None: listed as new). None when the entry
        is of another root or pattern, or damaged."""
        mon = cls(root, expected_samples, expected_tokens, window_s=window_s, sample_glob=sample_glob)
        if (not isinstance(entry, dict) or entry.get("root") != os.fspath(mon.root)
                or entry.get("glob") != sample_glob):
            return None
        mon._dir_loader = loader
        mon.index.thaw = mon._thaw_dir
        start_ns = int((now - window_s) * 1e9)
        try:
            eager = []
            for rel, agg in entry["folders"].items():
                rel = str(rel)
                newest = agg["newest"]
                if agg["settled"] and (newest is None or int(newest) < start_ns):
                    mon._frozen[rel] = {"n": int(agg["n"]), "idx_sum": int(agg["idx_sum"]),
                                        "layouts": {str(k): int(v) for k, v in agg["layouts"].items()},
                                        "tmp": int(agg["tmp"]), "bad": int(agg["bad"]),
                                        "tokens": None if agg["tokens"] is None else int(agg["tokens"]),
                                        "htok": bool(agg["htok"])}
                    mon.index.freeze(rel, Frozen(int(agg["mtime"]), [str(x) for x in agg["subdirs"]],
                                                 int(agg["bytes"]), int(agg["files"]),
                                                 None if newest is None else int(newest)))
                else:
                    eager.append(rel)
            mon._lengths_key = entry["lengths_key"]
            mon._errors = {str(k): str(v) for k, v in (entry.get("errors") or {}).items()}
            mon.set_observations(entry.get("obs") or ())
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        for rel in eager:
            mon.index.load(rel)
        mon._synced = False
        mon.dirty = False
        return mon

    @property
    def summarized(self) -> bool:
        """Answering from a settled output's summary (no per-file state loaded)."""
        return self._summary is not None

    def observations(self) -> list:
        """The rate window's (time, samples, tokens) observations, for the next process."""
        return list(self._obs)

    def set_observations(self, obs) -> None:
        """Raises TypeError or ValueError for anything but observations()'s list."""
        self._obs = deque((float(t), int(d), None if k is None else int(k)) for t, d, k in obs)

    def summary(self) -> dict | None:
        """A compact state for a settled output (monitor/settled.py), else None."""
        return settled.summary(self)

    @classmethod
    def from_summary(cls, summary: dict, root: str | os.PathLike,
                     full_state: Callable[[float], "ShardMonitor | None"],
                     expected_samples: int | None = None, expected_tokens: int | None = None,
                     window_s: float = 60.0, sample_glob: str | None = None,
                     obs: list | None = None) -> "ShardMonitor | None":
        """A monitor answering from `summary` while it holds, continuing as
        full_state(now) (a monitor of the saved per-folder state, or None:
        start over) once it does not. None when the summary is of another
        version, root or pattern."""
        mon = cls(root, expected_samples, expected_tokens, window_s=window_s, sample_glob=sample_glob)
        return mon if settled.install(mon, summary, full_state, obs) else None

    def _leave_summary(self, now: float | None = None) -> None:
        """The summary no longer holds: continue from the full state (or from scratch)."""
        settled.leave(self, time.time() if now is None else now)

    def _restore(self, state: dict) -> bool:
        if (not isinstance(state, dict) or state.get("version") != STATE_VERSION
                or state.get("root") != os.fspath(self.root) or state.get("glob") != self.sample_glob):
            return False
        try:
            self.index = TreeIndex.from_state(state["index"], self.root)
            tokens_state = state["header_tokens"]
            # From JSON: keys are strings; the values only need checking (20,000 of them).
            if not isinstance(tokens_state, dict) or not all(type(v) is int for v in tokens_state.values()):
                raise ValueError("header_tokens: expected {relpath: int}")
            self._header_tokens = dict(tokens_state)
            self._bad = {str(k): [int(a), int(b)] for k, (a, b) in state["bad"].items()}
            self.set_observations(state["obs"])
            tokens = state.get("tokens")
            if tokens is not None:
                fp, value = tokens
                self._restored_tokens = (list(fp), None if value is None else int(value))
            self._errors = {str(k): str(v) for k, v in (state.get("errors") or {}).items()}
            self._restored_lengths_error = self._errors.get(SAMPLE_LENGTHS)
        except (KeyError, TypeError, ValueError):
            return False
        self._synced = False
        self.dirty = False
        return True

    @classmethod
    def from_state(cls, state: dict, root: str | os.PathLike, expected_samples: int | None = None,
                   expected_tokens: int | None = None, window_s: float = 60.0,
                   sample_glob: str | None = None) -> "ShardMonitor":
        """Rebuild from to_state(); another version, root or pattern gives a fresh monitor."""
        mon = cls(root, expected_samples, expected_tokens, window_s=window_s, sample_glob=sample_glob)
        if not mon._restore(state):
            return cls(root, expected_samples, expected_tokens, window_s=window_s, sample_glob=sample_glob)
        return mon
