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

Parsers (each finding keeps the line it matched; LogState.findings holds the
latest per kind):
- progress: tqdm `972/1000 [02:48<00:04, 5.80it/s]` (any description prefix,
  `s/it` rates turned into items/s, `972it [02:48, 5.80it/s]` without total);
- loading: `Loading safetensors checkpoint shards:  86% Completed | 55/64` ->
  load_pct 86 (a loading bar is never taken as the stage's progress);
- oom: `CUDA out of memory`, `torch.OutOfMemoryError`,
  `torch.cuda.OutOfMemoryError`, SGLang's `Not enough memory`,
  `Prefill out of memory`, `Out of memory. Try to lower your batch size`,
  `CUDA error: out of memory`;
- killed: a process killed with signal 9 (`Killed`, `exited with code -9`,
  `exitcode: -9`, `signal 9`, `Signals.SIGKILL`): the host's OOM killer sends
  SIGKILL, so such a line is also stored under findings["oom"] (its kind says
  "killed"), which is what the halve-the-batch policy looks for;
- nccl: `NCCL error`, `ncclInternalError` (and the other nccl*Error codes),
  `NCCL WARN`, ProcessGroupNCCL / watchdog timeouts;
- traceback: `Traceback (most recent call last):`; the finding is replaced by
  the final exception line once it arrives (e.g. `RuntimeError: ...`);
- errors: an `errors: N` (or `errors=N`) counter -> LogState.errors;
- our summary line, printed by the ops (ops/extract/progress.py):
      progress: samples 972/1000 tokens 502983 errors 0 tok/s 2910.5
  i.e. `progress:` then `key value` pairs: `samples|items|steps D/T`,
  `tokens N`, `errors N`, `<unit>/s X` (`tok/s` -> tokens_per_s, others ->
  rate), `eta_s X`; a trailing `rank R/W` marks one rank's share, and ranks
  are summed.
Lines the supervisor writes (`[eagle3-console] ...`) are kept in the tail but
not parsed: the registry records how a run ended.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections import deque
from dataclasses import replace
from itertools import accumulate
from pathlib import Path

from eagle3_console.model import LogFinding, LogState

CHUNK = 1 << 20
FIRST_OPEN_BYTES = 1 << 20
MAX_READ_BYTES = 4 << 20
MAX_SCAN_BYTES = 16 << 20
TAIL_PRIME_BYTES = 64 << 10
MAX_LINE = 256 << 10
STATE_VERSION = 1
SUPERVISOR_PREFIX = "[eagle3-console]"

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}

_TQDM = re.compile(
    r"(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTP]?))?[A-Za-z]*\s*"
    r"\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:]+|\?))?,\s*"
    r"(?P<rate>\?|\d+(?:\.\d+)?[kMGTP]?)(?P<unit>[A-Za-z]*/[A-Za-z]+)")
# Weight loading: vLLM/SGLang ("Loading safetensors checkpoint shards:  86% Completed")
# and transformers 5 ("Loading weights:  86%|...| 64/75").
_LOADING = re.compile(r"Loading (?:\w*\s*checkpoint shards|weights):\s*(\d+(?:\.\d+)?)%")
_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|Not enough memory"
    r"|Prefill out of memory|Out of memory\. Try to lower your batch size"
    r"|(?:HIP|XPU) out of memory")
_KILLED = re.compile(
    r"^\s*Killed\s*$|\d\s+Killed\s+\S"
    r"|\bexit(?:ed)?\s*(?:with\s+)?(?:exit\s*)?code\s*[:=]?\s*-9\b"
    r"|\bexitcode\s*[:=]?\s*-9\b|\breturn\s*code\s*[:=]?\s*-9\b"
    r"|\b[Ss]ignal\s*9\b|Signals\.SIGKILL"
    r"|\b(?:killed|terminated|died)\s+(?:by|with)\s+(?:signal\s+)?SIGKILL\b")
_NCCL = re.compile(
    r"NCCL error|nccl\w*Error|NCCL WARN|ProcessGroupNCCL.*(?:[Tt]imeout|timed out)"
    r"|Watchdog caught collective operation timeout")
_TRACEBACK = "Traceback (most recent call last):"
_ERRORS = re.compile(r"\berrors?\s*[:=]\s*(\d+)")
_SUMMARY = re.compile(r"\bprogress:\s+(.*)$")
_PAIR = re.compile(r"(\S+)\s+(\S+)")
# Every line a parser can match holds one of these (found chunk-wide, see _hits);
# tqdm's rate is `X<unit>/s]`, `X<unit>/s, <postfix>]` or, below 1/s, `Xs/<unit>`.
_KEYS = (b"/s]", b"/s,", b"s/it", b"s/sample", b"s/step", b"s/batch", b"checkpoint shards",
         b"memory", b"Memory", b"Killed", b"-9", b"ignal", b"SIGKILL", b"NCCL", b"nccl",
         b"Watchdog", b"Traceback", b"rror", b"progress:")
# For the signature-only scan: no progress, and no `errors` counter (a busy
# progress line carries one; the latest value comes from the parsed end).
_SIGNATURE_KEYS = (b"memory", b"Memory", b"Killed", b"-9", b"ignal", b"SIGKILL", b"NCCL", b"nccl",
                   b"Watchdog", b"Traceback")


def _num(text: str) -> float:
    """tqdm's numbers, with unit_scale suffixes: `972`, `5.80`, `1.20k`."""
    if text and text[-1] in _SCALE:
        return float(text[:-1]) * _SCALE[text[-1]]
    return float(text)


def _line_end(data: bytes, i: int, cut: int) -> int:
    """The index just past the line end at or after i (or cut)."""
    ends = [e for e in (data.find(b"\n", i, cut), data.find(b"\r", i, cut)) if e >= 0]
    return min(ends) + 1 if ends else cut


def _clock(text: str | None) -> float | None:
    if not text or text == "?":
        return None
    secs = 0.0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        secs = secs * 60 + int(part)
    return secs


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
        self._state = LogState(path=str(self.path))
        self._tb: dict | None = None    # an open traceback: {"prefix": str}
        self._ranks: dict[str, dict] = {}

    # ---- refresh -------------------------------------------------------
    def refresh(self) -> LogState:
        st = self._state
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
            self._offset, self._partial, self._cr_last, self._tb = 0, b"", False, None
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
            self._peek_progress(self._partial)
        return self._snapshot()

    def _jump(self, fh, pos: int) -> None:
        """Go to `pos`, then to the start of the next line (unless pos is one);
        the bytes before `pos` were scanned or counted as skipped already."""
        fh.seek(pos - 1)
        before = fh.read(1)
        skipped = 0
        self._partial, self._cr_last, self._tb = b"", False, None
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
        self._state.skipped_bytes += skipped

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
                self._parse(self._text(data[start:free]), base + start, signatures_only=True)
                while self._tb is not None and free < cut:
                    nxt = _line_end(data, free, cut)
                    self._parse(self._text(data[free:nxt]), base + free, signatures_only=True)
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
            if text and (i in hits or self._tb is not None):
                self._parse(text, starts[i])
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
        return _ANSI.sub("", text) if "\x1b" in text else text

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
            self._parse(text, offset)

    # ---- parsers -------------------------------------------------------
    def _find(self, kind: str, line: str, offset: int, key: str | None = None) -> None:
        self._state.findings[key or kind] = LogFinding(kind=kind, line=line, at_offset=offset)

    def _parse(self, text: str, offset: int, signatures_only: bool = False) -> None:
        if text.startswith(SUPERVISOR_PREFIX):
            return
        if self._tb is not None:
            prefix = self._tb["prefix"]
            body = text[len(prefix):] if prefix and text.startswith(prefix) else text
            if not body.strip() or body[0] in " \t":
                return          # a frame, its source line, a caret line
            self._tb = None     # the final exception line
            self._find("traceback", text.strip(), offset)
        # Each parser runs behind a substring test: most lines pay a few `in`s.
        stripped = text.strip()
        if "Traceback" in text:
            idx = text.find(_TRACEBACK)
            if idx >= 0:
                self._tb = {"prefix": text[:idx]}
                self._find("traceback", stripped, offset)
        m = _LOADING.search(text) if ("checkpoint shards" in text or "Loading weights" in text) else None
        if signatures_only:
            how = None
        elif m:
            self._state.load_pct = float(m.group(1))
            self._find("loading", stripped, offset)
            how = None
        else:
            how = self._progress(text)
            if how:
                self._find("progress", stripped, offset)
        if ("emory" in text or "out of memory" in text) and _OOM.search(text):
            self._find("oom", stripped, offset)
        if ("Killed" in text or "-9" in text or "ignal" in text or "SIGKILL" in text) \
                and _KILLED.search(text):
            self._find("killed", stripped, offset)
            self._find("killed", stripped, offset, key="oom")
        if ("NCCL" in text or "nccl" in text or "Watchdog" in text) and _NCCL.search(text):
            self._find("nccl", stripped, offset)
        if how == "summary":            # a summary line's errors are summed over ranks
            if " errors " in text:
                self._find("errors", stripped, offset)
        elif "rror" in text:
            m = _ERRORS.search(text)
            if m:
                self._state.errors = int(m.group(1))
                self._find("errors", stripped, offset)

    def _peek_progress(self, partial: bytes) -> None:
        text = self._text(partial)
        m = _LOADING.search(text)
        if m:
            self._state.load_pct = float(m.group(1))
        else:
            self._progress(text)

    def _progress(self, text: str) -> str | None:
        """Update progress from a summary or tqdm line: which one matched, or None."""
        m = _SUMMARY.search(text) if "progress:" in text else None
        if m:
            return "summary" if self._summary(m.group(1)) else None
        m = _TQDM.search(text) if "[" in text else None
        if not m:
            return None
        st = self._state
        st.progress_done = int(_num(m.group("n")))
        st.progress_total = int(_num(m.group("total"))) if m.group("total") else None
        rate, unit = m.group("rate"), m.group("unit")
        if rate == "?":
            st.rate = None
        else:
            value = _num(rate)
            if unit.startswith("s/"):       # tqdm prints s/it below 1 it/s
                st.rate, unit = (1.0 / value if value else None), unit[2:] + "/s"
            else:
                st.rate = value
        st.rate_unit = unit
        st.eta_s = _clock(m.group("remaining"))
        return "tqdm"

    def _summary(self, body: str) -> bool:
        fields: dict = {}
        rank = None
        for key, value in _PAIR.findall(body):
            try:
                if key == "rank":
                    rank = value.split("/")[0]
                elif key in ("samples", "items", "steps", "prompt", "prompts"):
                    done, _, total = value.partition("/")
                    fields["unit"] = key
                    fields["done"] = int(done)
                    fields["total"] = int(total) if total else None
                elif key == "tokens":
                    fields["tokens"] = int(value.partition("/")[0])
                elif key == "errors":
                    fields["errors"] = int(value)
                elif key == "eta_s":
                    fields["eta_s"] = float(value)
                elif key.endswith("/s"):
                    fields["tok/s" if key == "tok/s" else "rate"] = float(value)
                    if key != "tok/s":
                        fields["rate_unit"] = key
            except ValueError:
                continue        # one odd value does not spoil the line
        if "done" not in fields and "tokens" not in fields:
            return False
        self._ranks[rank or ""] = fields
        if rank is None:
            self._ranks = {"": fields}      # a single-process line supersedes per-rank ones
        else:
            self._ranks.pop("", None)
        parts = list(self._ranks.values())

        def total(key):
            if len(parts) == 1:
                return parts[0].get(key)
            vals = [p.get(key) for p in parts]
            return sum(vals) if all(v is not None for v in vals) else None

        st = self._state
        if "done" in fields:
            st.progress_done, st.progress_total = total("done"), total("total")
        st.tokens_done = total("tokens")
        if "tok/s" in fields:
            st.tokens_per_s = total("tok/s")
        if "rate" in fields:
            st.rate, st.rate_unit = total("rate"), fields["rate_unit"]
        if "eta_s" in fields:
            st.eta_s = fields["eta_s"]
        if "errors" in fields:
            st.errors = total("errors")
        return True

    # ---- output and persistence ---------------------------------------
    def _snapshot(self) -> LogState:
        return replace(self._state, findings=dict(self._state.findings), tail=list(self._tail))

    @property
    def offset(self) -> int:
        """Bytes of the file consumed (complete lines)."""
        return self._offset

    def to_state(self) -> dict:
        st = self._state
        return {
            "version": STATE_VERSION,
            "path": str(self.path),
            "tail_lines": self._tail.maxlen,
            "offset": self._offset,
            "ident": list(self._ident) if self._ident else None,
            "tb": self._tb,
            "ranks": self._ranks,
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
            f._tb = state.get("tb")
            f._ranks = dict(state.get("ranks") or {})
            for key, value in state["parsed"].items():
                if hasattr(f._state, key):
                    setattr(f._state, key, value)
            f._state.findings = {k: LogFinding(kind=str(v[0]), line=str(v[1]), at_offset=int(v[2]))
                                 for k, v in state["findings"].items()}
        except KeyError as exc:
            raise ValueError(f"log follower state: missing key {exc.args[0]!r}") from None
        except (TypeError, IndexError) as exc:
            raise ValueError(f"log follower state: malformed ({exc})") from None
        f._primed = f._offset == 0
        return f


def scan_for_oom(path: str | os.PathLike, window_bytes: int = 64 << 20) -> str | None:
    """The latest out-of-memory signature line (CUDA OOM, SGLang's messages, a
    worker killed with -9) in the last `window_bytes` of a log, or None."""
    f = LogFollower(path, tail_lines=1, first_open_bytes=window_bytes)
    found = f.refresh().findings.get("oom")
    return found.line if found else None
