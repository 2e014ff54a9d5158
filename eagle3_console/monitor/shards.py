"""Shard progress of a hidden-state output: samples and tokens done, rate, ETA.

Where it sits: snapshot.collect() keeps one ShardMonitor per output of a stage
whose spec says `progress = "shards"`, refreshes it, and puts the returned
ShardProgress on the stage (its DiskMonitor shares `monitor.index`). The
monitor joins four parts: the output's tree index (monitor/tree.py), its
sample files (monitor/samplefiles.py; layouts: monitor/layouts.py), its root
JSON files (monitor/outputjson.py) and the rate window (monitor/rate.py).

A one-shot `status` continues where the previous process stopped, from
.eagle3/cache/: a settled output from its summary alone (summary() /
from_summary(), monitor/settled.py) until a folder of it changes, then from
its per-folder state (folders() / folder_state() / from_folders()), in which
only the folders that changed are loaded.

Tokens: sample_lengths.json ({"idx": n_tokens}) when present, else the
`input_ids` (speculators: `token_ids`) shape in the safetensors header of each sample. `.pt` samples
without sample_lengths.json have no known token count.

Rate: samples/s and tokens/s over a sliding window (monitor/rate.py).
Progress (fraction()) and ETA follow tokens once both the tokens done and
expected are known (prepare's summary, extract's own count): extract takes
samples longest first, so at 13 % of the samples a run is far more than 13 %
done, and a count in samples made the ETA, the disk projection and its
disk_short alert 2.4-4x too large. Else samples: ETA = samples left / samples/s.

A run's own files: with `since_ns` set (a custom stage's run: the output
may hold a previous run's files), only the sample files written since then
count; a rerun read 100 % (41/40) from its first second.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from eagle3_console.kernel.model import ShardCount, ShardProgress
from eagle3_console.monitor import rate, settled
from eagle3_console.monitor.layouts import layout_of
from eagle3_console.monitor.outputjson import OutputJson
from eagle3_console.monitor.samplefiles import SampleFiles
from eagle3_console.monitor.tree import TreeIndex
from ops.formats import SAMPLE_LENGTHS, SHARD_DIR_RE
from ops.hidden_formats import stored_as


class ShardMonitor:
    def __init__(self, root: str | os.PathLike, expected_samples: int | None = None,
                 expected_tokens: int | None = None, index: TreeIndex | None = None,
                 window_s: float = 60.0, sample_glob: str | None = None) -> None:
        self.root = Path(root)
        self.expected_samples = expected_samples
        self.expected_tokens = expected_tokens
        self.window_s = window_s
        self.files = SampleFiles(self.root, index if index is not None else TreeIndex(self.root), sample_glob)
        self.root_json = OutputJson(self.root)
        self.window = rate.RateWindow(window_s)
        # A settled output's summary stands in for the files until it no longer
        # holds; then _full_state(now) (a monitor of the saved per-folder state,
        # or None: start over) continues.
        self._summary: dict | None = None
        self._summary_index: settled.IndexTotals | None = None
        self._full_state: Callable[[float], "ShardMonitor | None"] | None = None
        # Count only the sample files written since (ns; None: all of them).
        self.since_ns: int | None = None
        # The run writing it started then (s): the rate window holds nothing older.
        self.run_started: float | None = None
        self.own_bytes = 0          # bytes of the files written since since_ns (last refresh)

    @property
    def index(self) -> "TreeIndex | settled.IndexTotals":
        """The tree index (a DiskMonitor shares it); its totals alone while summarized."""
        return self._summary_index if self._summary is not None else self.files.index

    @property
    def sample_glob(self) -> str | None:
        return self.files.sample_glob

    @property
    def errors(self) -> dict[str, str]:
        """file -> why it could not be read (saved with the per-folder state)."""
        return dict(self.root_json.errors)

    def use_glob(self, sample_glob: str | None) -> None:
        """Count the files matching this pattern instead (None: the known layouts)."""
        if sample_glob != self.sample_glob:
            self._leave_summary()
            self.files.use_glob(sample_glob)

    # ---- refresh -------------------------------------------------------
    def refresh(self, now: float | None = None, refresh_index: bool = True) -> ShardProgress:
        now = time.time() if now is None else now
        if self._summary is not None and self.since_ns is not None:
            self._leave_summary(now)        # a summary has totals, not the files of a run
        if self._summary is not None:
            if settled.holds(self._summary, os.fspath(self.root), self.window_s,
                             self.root_json.stat_key(SAMPLE_LENGTHS), now):
                self.root_json.load_config()
                return self._progress(now)
            self._leave_summary(now)
        if refresh_index:
            self.files.index.refresh()
        self.files.sync(self.files.index.last)
        self.root_json.load_config()
        if self.root_json.lengths_changed():
            self.files.lengths_changed()
        return self._progress(now)

    def _tokens_done(self) -> int | None:
        return self.files.tokens_done(self.root_json.lengths)

    def _token_source(self) -> bool:
        return self.files.token_source(bool(self.root_json.lengths_key))

    # ---- progress, rate, ETA ------------------------------------------
    def _progress(self, now: float) -> ShardProgress:
        s = self._summary
        if s is not None:
            done, per_dir, layout, tmp, bad, tokens = (
                s["done"], s["per_dir"], s["layout"], s["tmp"], s["bad"], s["tokens"])
        else:
            done, per_dir, per_layout, tmp, bad = self.files.totals()
            layout = layout_of(done, per_layout)
            tokens = self._tokens_done()
            if self.since_ns is not None:
                done, per_dir, tokens = self._run_own(self.since_ns)
        expected = self.expected_samples
        if expected is None:
            expected = self.root_json.config_int("total_samples")
        tokens_expected = self.expected_tokens
        if tokens_expected is None and (self.expected_samples is None
                                        or self.expected_samples == self.root_json.config_int("total_samples")):
            # data_config's tokens are of its own samples: no figure for the caller's other count.
            tokens_expected = self.root_json.config_int("total_tokens")
        complete = self.root_json.complete(done)
        sps, tps = self._rate(now, done, tokens)
        eta: float | None = None
        if complete:
            eta = 0.0
        elif tokens_expected and tokens is not None and tps is not None:
            eta = max(0, tokens_expected - tokens) / tps if tps > 0 else None
        elif expected is not None and sps:
            eta = max(0, expected - done) / sps
        return ShardProgress(
            root=str(self.root), layout=layout, samples_done=done, samples_expected=expected,
            tokens_done=tokens, tokens_expected=tokens_expected, shards=_shard_counts(per_dir, expected),
            tmp_files=tmp, samples_per_s=sps, tokens_per_s=tps, eta_s=eta,
            complete=complete, bad_files=bad, error=self.root_json.error_text(),
            format=self._format(layout), bytes_per_token=self.index.total_bytes / tokens if tokens else None)

    def _run_own(self, since_ns: int) -> tuple[int, dict[str, int], int | None]:
        """(samples, per folder, tokens) of the sample files written since since_ns."""
        recent = self.files.written_since(since_ns)
        per_dir: dict[str, int] = {}
        tokens: int | None = None
        lengths = self.root_json.lengths()
        self.own_bytes = 0
        for _mtime, rel in recent:
            entry = self.files.index.entry(rel)
            self.own_bytes += entry.size if entry is not None else 0
            rel_dir = rel.rpartition("/")[0]
            per_dir[rel_dir] = per_dir.get(rel_dir, 0) + 1
            n = self.files.sample_tokens(rel, lengths)
            if n is not None:
                tokens = (tokens or 0) + n
        return len(recent), per_dir, tokens

    def _format(self, layout: str) -> str | None:
        """What the states are stored as, in words (ops/hidden_formats.py stored_as:
        bf16 names the run's dtype where that is not bfloat16); an eagle3 output
        whose data_config.json names no format holds bf16, another says nothing."""
        config = self.root_json.config
        if config.get("format") is None and not (layout == "eagle3" and config):
            return None
        return stored_as(config)

    def _rate(self, now: float, done: int, tokens: int | None) -> rate.Rate:
        if self.run_started is not None:
            self.window.drop_before(self.run_started)
        observed = self.window.observe(now, done, tokens)
        if observed is not None:
            return observed
        if not done:
            return None, None
        if self._summary is not None:
            # settled.holds(): no file of the tree is inside the window.
            return 0.0, 0.0 if self._summary["token_source"] else None
        start_ns = int((now - self.window_s) * 1e9)
        if self.since_ns is not None:
            start_ns = max(start_ns, self.since_ns)
        if self.run_started is not None:
            start_ns = max(start_ns, int(self.run_started * 1e9))
        recent = self.files.recent(start_ns)
        return rate.from_mtimes(recent, lambda rel: self.files.sample_tokens(rel, self.root_json.lengths()),
                                self._token_source())

    # ---- per-folder persistence (a one-shot `status` under a live output) ----
    def folders(self) -> dict:
        """The output's per-folder counts, for the next process (monitors.json;
        from_folders() reads it back): a folder still as it was then is not
        loaded; only a changed one's per-file state (folder_state()) is read
        and rewritten."""
        return {"root": os.fspath(self.root), "glob": self.sample_glob,
                "folders": self.files.folders(self.root_json.lengths()),
                "lengths_key": self.root_json.lengths_key, "errors": self.errors}

    def folder_state(self, rel_dir: str) -> dict:
        """One loaded folder's per-file state (its index entries, header tokens, bad files)."""
        return self.files.folder_state(rel_dir)

    def mark_dirty(self, rel_dir: str) -> None:
        """Its saved state could not be written: try again at the next save."""
        self.files.mark_dirty(rel_dir)

    def take_dirty_dirs(self) -> tuple[list[str], list[str]]:
        """(loaded folders whose saved state is old, folders gone), forgotten once taken."""
        return self.files.take_dirty_dirs()

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
        try:
            eager = mon.files.freeze_saved(entry["folders"], int((now - window_s) * 1e9), loader)
            mon.root_json.restore(None, {}, entry["lengths_key"], entry.get("errors") or {})
            mon.window.set_observations(entry.get("obs") or ())
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        for rel in eager:
            mon.files.index.load(rel)
        return mon

    def observations(self) -> list:
        """The rate window's (time, samples, tokens) observations, for the next process."""
        return self.window.observations()

    def set_observations(self, obs) -> None:
        """Raises TypeError or ValueError for anything but observations()'s list."""
        self.window.set_observations(obs)

    # ---- a settled output's summary (monitor/settled.py) ---------------
    @property
    def summarized(self) -> bool:
        """Answering from a settled output's summary (no per-file state loaded)."""
        return self._summary is not None

    def summary(self) -> dict | None:
        """A compact state for a settled output, else None while its tree may change unseen."""
        if self._summary is not None:
            return self._summary
        if not self.files.synced:
            return None
        index = self.files.index
        dirs = index.settled()
        if dirs is None:
            return None
        done, per_dir, per_layout, tmp, bad = self.files.totals()
        return settled.make(
            os.fspath(self.root), self.sample_glob, dirs=dirs, config_key=self.root_json.config_key,
            config=self.root_json.config, lengths_key=self.root_json.lengths_key, errors=self.errors,
            done=done, per_dir={k: n for k, n in per_dir.items() if n > 0}, layout=layout_of(done, per_layout),
            tmp=tmp, bad=bad, tokens=self._tokens_done(), token_source=self._token_source(),
            newest_ns=index.newest_mtime_ns(), bytes=index.total_bytes, files=index.file_count)

    @classmethod
    def from_summary(cls, summary: dict, root: str | os.PathLike,
                     full_state: Callable[[float], "ShardMonitor | None"],
                     expected_samples: int | None = None, expected_tokens: int | None = None,
                     window_s: float = 60.0, sample_glob: str | None = None,
                     obs: list | None = None) -> "ShardMonitor | None":
        """A monitor answering from `summary` while it holds, continuing as
        full_state(now) (a monitor of the saved per-folder state, or None:
        start over) once it does not. None when the summary is of another
        version, root or pattern, or damaged."""
        mon = cls(root, expected_samples, expected_tokens, window_s=window_s, sample_glob=sample_glob)
        s = settled.checked(summary, os.fspath(mon.root), sample_glob)
        if s is None:
            return None
        try:
            mon.root_json.restore(s["config_key"], dict(s["config"] or {}), s["lengths_key"], s["errors"])
            mon._summary_index = settled.IndexTotals(int(s["bytes"]), int(s["files"]))
            mon.window.set_observations(obs or ())
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        mon._summary, mon._full_state = s, full_state
        return mon

    def _leave_summary(self, now: float | None = None) -> None:
        """The summary no longer holds: continue from the saved per-folder state
        (only its changed folders loaded), or from scratch; this process's rate
        window is newer than the saved one, and is kept."""
        if self._summary is None:
            return
        loader, self._full_state = self._full_state, None
        self._summary = self._summary_index = None
        full = loader(time.time() if now is None else now) if loader is not None else None
        if full is None:
            full = type(self)(self.root, self.expected_samples, self.expected_tokens,
                              window_s=self.window_s, sample_glob=self.sample_glob)
        self.files, self.root_json = full.files, full.root_json


def fraction(sp: ShardProgress) -> float | None:
    """How far an output is, 0..1: in tokens where both the tokens done and
    expected are known (samples come longest first), else in samples; None
    when nothing says how many are expected."""
    if sp.tokens_expected and sp.tokens_done is not None:
        return min(1.0, sp.tokens_done / sp.tokens_expected)
    if sp.samples_expected:
        return min(1.0, sp.samples_done / sp.samples_expected)
    return None


def _shard_counts(per_dir, expected: int | None) -> list[ShardCount]:
    """Each folder's count, with the rows its name promises (rows_<a>-<b>), root first."""
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
    return shards
