"""Follow a run's log like `tail -F` and parse what an operator looks for.

Where it sits: snapshot.collect() keeps one LogFollower per run log
(.eagle3/logs/<run>-<stage>.log, written by the supervisor), refreshes it and
puts the LogState on the stage; alerts and the watch policy read its findings.
to_state()/from_state() let a one-shot `status` continue from the last offset.

Reading: only bytes not read before, in chunks of CHUNK; never the whole file.
- The first open of a file larger than `first_open_bytes` (1 MiB) parses
  only that much of its end, not the file from the beginning; more than
  `max_read_bytes` (4 MiB) of new bytes since the last refresh is treated the
  same way. Before that part, up to `max_scan_bytes` (16 MiB) are scanned for
  error signatures only (keywords found with bytes.find, the parsers run on
  those lines alone), so an old OOM is still seen but old progress lines are
  not parsed. Bytes beyond that, on a 1 GB log, are neither: they are counted
  in LogState.skipped_bytes.
- Rotation (another inode at the path) and truncation (size below what was
  read) restart from byte 0 of the file now at the path; findings and
  counters are kept: they are the history of what the program printed.
- Lines end at `\\n`, `\\r\\n` or a lone `\\r` (tqdm rewrites its line with
  `\\r`); in the tail a `\\r` update replaces the line it rewrote. A partial
  last line waits for its end, except that progress is read from it at once
  (tqdm's latest update has no terminator yet), and so is a loading percentage.
  Memory is bounded: a deque of
  `tail_lines` lines, a partial line of at most MAX_LINE bytes.

Parsing is monitor/logparse.py's (LineParser); this module reads bytes.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections import deque
from dataclasses import replace
from itertools import accumulate
from pathlib import Path

from eagle3_console.kernel.model import LogFinding, LogState
from eagle3_console.monitor.logparse import LineParser
from eagle3_console.kernel.text import ANSI

CHUNK = 1 << 20
FIRST_OPEN_BYTES = 1 << 20
MAX_READ_BYTES = 4 << 20
MAX_SCAN_BYTES = 16 << 20
TAIL_PRIME_BYTES = 64 << 10
MAX_LINE = 256 << 10
STATE_VERSION = 1

# Every line a parser can match holds one of these (found chunk-wide, see _hits);
# tqdm's rate is `X<unit>/s]`, `X<unit>/s, <postfix>]` or, below 1/s, `Xs/<unit>`.
_KEYS = (b"/s]", b"/s,", b"s/it", b"s/sample", b"s/step", b"s/batch", b"checkpoint shards",
         b"memory", b"Memory", b"Killed", b"-9", b"ignal", b"SIGKILL", b"NCCL", b"nccl",
         b"Watchdog", b"Traceback", b"rror", b"progress:", b"fired up", b"hit an exception", b"sigquit",
         b"died during")
# For the signature-only scan: no progress, and no `errors` counter (a busy
# progress line carries one; the latest value comes from the parsed end).
_SIGNATURE_KEYS = (b"memory", b"Memory", b"Killed", b"-9", b"ignal", b"SIGKILL", b"NCCL", b"nccl",
                   b"Watchdog", b"Traceback", b"fired up", b"hit an exception", b"sigquit", b"died during")




def _line_end(data: bytes, i: int, cut: int) -> int:
    """The index just past the line end at or after i (or cut)."""
    ends = [e for e in (data.find(b"\n", i, cut), data.find(b"\r", i, cut)) if e >= 0]
    return min(ends) + 1 if ends else cut




class LogFollower:
    def __init__(self, path: str | os.PathLike, tail_lines: int = 200,
                 first_open_bytes: int = FIRST_OPEN_BYTES,
                 max_read_bytes: int = MAX_READ_BYTES,
                 max_scan_bytes: int = MAX_SCAN_BYTES) -> None:
        self.path = Path(path)
        self.first_open_bytes = first_open_bytes
        self.max_read_bytes = max_read_bytes
        self.max_scan_bytes = max_scan_bytes
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._cr_last = False           # the last tail line ended with a lone \r: replace it next
        self._offset = 0                # bytes consumed: the start of the partial line
        self._partial = b""
        self._ident: tuple[int, int] | None = None     # (st_dev, st_ino) of the file read
        self._primed = True             # False after from_state: re-read the tail's bytes
        self._parser = LineParser(LogState(path=str(self.path)))

    # ---- refresh -------------------------------------------------------
    def refresh(self) -> LogState:
        st = self._parser.state
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            st.size = 0
            return self._snapshot()
        except OSError as exc:
            st.error = f"{self.path}: cannot stat ({exc.strerror})"
            return self._snapshot()
        ident = (info.st_dev, info.st_ino)
        first = self._ident is None
        if not first and (ident != self._ident or info.st_size < self._offset + len(self._partial)):
            # Rotated or truncated: what is at the path now is read from byte 0.
            self._offset, self._partial, self._cr_last, self._parser.tb = 0, b"", False, None
            self._primed = True
        self._ident = ident
        st.size = info.st_size
        try:
            fh = open(self.path, "rb")
        except OSError as exc:
            st.error = f"{self.path}: cannot open ({exc.strerror})"
            return self._snapshot()
        st.error = None
        with fh:
            if not self._primed:
                self._prime(fh)
            start = self._offset + len(self._partial)
            limit = self.first_open_bytes if first else self.max_read_bytes
            if info.st_size - start > limit:
                parse_from = info.st_size - limit
                scan_from = max(start, parse_from - self.max_scan_bytes)
                st.skipped_bytes += scan_from - start
                if scan_from < parse_from:
                    self._scan(fh, scan_from, parse_from)
                self._jump(fh, parse_from)
                start = self._offset
            fh.seek(start)
            remaining = info.st_size - start
            while remaining > 0:
                chunk = fh.read(min(CHUNK, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                self._feed(chunk)
        if self._partial:
            self._parser.peek_progress(self._text(self._partial))
        return self._snapshot()

    def _jump(self, fh, pos: int) -> None:
        """Go to `pos`, then to the start of the next line (unless pos is one);
        the bytes before `pos` were scanned or counted as skipped already."""
        fh.seek(pos - 1)
        before = fh.read(1)
        skipped = 0
        self._partial, self._cr_last, self._parser.tb = b"", False, None
        self._offset = pos
        if before not in (b"\n", b"\r"):
            while True:
                chunk = fh.read(CHUNK)
                if not chunk:
                    break
                cut = min((i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0), default=-1)
                if cut >= 0:
                    self._offset += cut + 1
                    skipped += cut + 1
                    break
                self._offset += len(chunk)
                skipped += len(chunk)
        self._parser.state.skipped_bytes += skipped

    def _scan(self, fh, begin: int, end: int) -> None:
        """Signatures only over [begin, end): their keywords are found with
        bytes.find (C speed, no line splitting), the parsers run on those lines
        alone (plus the frames of a traceback); no progress, no tail. So a
        burst or a first open skips the progress of old lines but not an OOM,
        NCCL error or traceback in them."""
        fh.seek(begin)
        pos, carry = begin, b""
        while pos < end:
            chunk = fh.read(min(CHUNK, end - pos))
            if not chunk:
                break
            data, base = carry + chunk, pos - len(carry)
            pos += len(chunk)
            cut = len(data) if pos >= end else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            carry = data[cut:] if len(data) - cut <= MAX_LINE else b""
            if cut <= 0:
                continue
            hits: set[int] = set()
            for key in _SIGNATURE_KEYS:
                i = data.find(key, 0, cut)
                while i >= 0:
                    hits.add(i)
                    i = data.find(key, i + 1, cut)
            free = 0                # lines before this were parsed already
            for h in sorted(hits):
                if h < free:
                    continue
                start = max(data.rfind(b"\n", 0, h), data.rfind(b"\r", 0, h)) + 1
                free = _line_end(data, h, cut)
                self._parser.parse(self._text(data[start:free]), base + start, signatures_only=True)
                while self._parser.tb is not None and free < cut:
                    nxt = _line_end(data, free, cut)
                    self._parser.parse(self._text(data[free:nxt]), base + free, signatures_only=True)
                    free = nxt

    def _prime(self, fh) -> None:
        """Restored from state: rebuild the tail from the bytes before the offset, unparsed."""
        self._primed = True
        begin = max(0, self._offset - TAIL_PRIME_BYTES)
        fh.seek(begin)
        data = fh.read(self._offset - begin)
        lines = data.splitlines(keepends=True)
        if begin > 0 and lines:
            lines = lines[1:]       # starts mid-line
        for seg in lines:
            self._to_tail(seg, self._text(seg))

    def _feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        base = self._offset
        segs = data.splitlines(keepends=True)
        last = segs[-1] if segs else b""
        if last and last[-1:] not in (b"\n", b"\r"):
            segs.pop()
            self._partial = last
        else:
            self._partial = b""
        starts = list(accumulate(map(len, segs), initial=base))
        hits = self._hits(data, starts, base)
        for i, seg in enumerate(segs):
            text = self._text(seg)
            self._to_tail(seg, text)
            if text and (i in hits or self._parser.tb is not None):
                self._parser.parse(text, starts[i])
        self._offset = starts[-1]
        if len(self._partial) > MAX_LINE:   # no line end in sight: cut it, keep memory bounded
            self._line(self._partial, self._offset)
            self._offset += len(self._partial)
            self._partial = b""

    @staticmethod
    def _hits(data: bytes, starts: list[int], base: int, keys: tuple[bytes, ...] = ()) -> set[int]:
        """Indexes of the lines holding a keyword: bytes.find over the whole
        chunk is C speed, so most lines of a busy log never meet a regex."""
        end = starts[-1] - base
        hits: set[int] = set()
        for key in keys or _KEYS:
            i = data.find(key, 0, end)
            while i >= 0:
                hits.add(bisect_right(starts, base + i) - 1)
                i = data.find(key, i + 1, end)
        return hits

    @staticmethod
    def _text(seg: bytes) -> str:
        text = seg.rstrip(b"\r\n").decode("utf-8", "replace")
        return ANSI.sub("", text) if "\x1b" in text else text

    def _to_tail(self, seg: bytes, text: str) -> None:
        if text:
            if self._cr_last and self._tail:
                self._tail[-1] = text
            else:
                self._tail.append(text)
            self._cr_last = seg.endswith(b"\r")
        elif seg.endswith(b"\n"):
            self._cr_last = False   # "\r" then "\n": the rewritten line is final

    def _line(self, seg: bytes, offset: int) -> None:
        text = self._text(seg)
        self._to_tail(seg, text)
        if text:
            self._parser.parse(text, offset)

    # ---- parsers -------------------------------------------------------

    # ---- output and persistence ---------------------------------------
    def _snapshot(self) -> LogState:
        return replace(self._parser.state, findings=dict(self._parser.state.findings), tail=list(self._tail))

    @property
    def offset(self) -> int:
        """Bytes of the file consumed (complete lines)."""
        return self._offset

    def to_state(self) -> dict:
        st = self._parser.state
        return {
            "version": STATE_VERSION,
            "path": str(self.path),
            "tail_lines": self._tail.maxlen,
            "offset": self._offset,
            "ident": list(self._ident) if self._ident else None,
            "tb": self._parser.tb,
            "ranks": self._parser.ranks,
            "parsed": {k: getattr(st, k) for k in (
                "progress_done", "progress_total", "rate", "rate_unit", "eta_s", "load_pct",
                "errors", "tokens_done", "tokens_per_s", "skipped_bytes")},
            "findings": {k: [f.kind, f.line, f.at_offset] for k, f in st.findings.items()},
        }

    @classmethod
    def from_state(cls, state: dict) -> "LogFollower":
        """Rebuild from to_state(): reading resumes at the saved offset (a partial
        line is re-read); the tail is rebuilt from the bytes before it. Raises
        ValueError naming the key when the state is not a LogFollower state."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"log follower state: expected version {STATE_VERSION}, "
                             f"got {state.get('version') if isinstance(state, dict) else state!r}")
        try:
            f = cls(state["path"], tail_lines=int(state.get("tail_lines") or 200))
            f._offset = int(state["offset"])
            ident = state.get("ident")
            f._ident = (int(ident[0]), int(ident[1])) if ident else None
            f._parser.tb = state.get("tb")
            f._parser.ranks = dict(state.get("ranks") or {})
            for key, value in state["parsed"].items():
                if hasattr(f._parser.state, key):
                    setattr(f._parser.state, key, value)
            f._parser.state.findings = {k: LogFinding(kind=str(v[0]), line=str(v[1]), at_offset=int(v[2]))
                                 for k, v in state["findings"].items()}
        except KeyError as exc:
            raise ValueError(f"log follower state: missing key {exc.args[0]!r}") from None
        except (TypeError, IndexError) as exc:
            raise ValueError(f"log follower state: malformed ({exc})") from None
        f._primed = f._offset == 0
        return f
