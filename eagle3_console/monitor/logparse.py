"""Parsers of a run log's lines: what an operator looks for, each kept with the line it matched.

Where it sits: monitor/logs.py (LogFollower) reads the bytes, splits lines and
hands each complete line to LineParser.parse(); the parser keeps the LogState
(progress, load %, counters, findings) that snapshot.collect() shows.

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
- SGLang's server (a serve stage; strings from sglang 0.5.23's source, each
  cited at its pattern below): ready (`The server is fired up and ready to
  roll!`, its `[YYYY-mm-dd HH:MM:SS]` prefix gives the time to ready) and
  server_died (a scheduler / detokenizer / tokenizer / DP controller that
  `hit an exception`, `Received sigquit from a child process`, a rank's
  scheduler that `died during initialization`); its out-of-memory messages
  are under oom, its weight loading under loading;
- traceback: `Traceback (most recent call last):`; the finding is replaced by
  the final exception line once it arrives (e.g. `RuntimeError: ...`);
- torchrun: a traceback ending in `ChildFailedError` (a rank failed) is kept
  as `launcher`, and the rank's own traceback stays the `traceback` finding;
- program_error: an op's one-line `PROG: error: ...` (ops/common.py run_main,
  bad input, exit 2) or a bare `error: ...`, with or without torchrun's `[rank0]:` prefix;
- errors: an `errors: N` (or `errors=N`) counter -> LogState.errors;
- our summary line, printed by the ops (ops/extract/progress.py):
      progress: samples 972/1000 tokens 502983 errors 0 tok/s 2910.5
  i.e. `progress:` then `key value` pairs: `samples|items|step(s)|prompt(s) D/T`,
  `tokens N`, `errors N`, `<unit>/s X` (`tok/s` -> tokens_per_s, others ->
  rate), `eta_s X`; a trailing `rank R/W` marks one rank's share, and ranks
  are summed.
Lines the supervisor writes (`[eagle3-console] ...`) are kept in the tail but
not parsed: the registry records how a run ended.
"""

from __future__ import annotations

import re
import time

from eagle3_console.kernel.model import LogFinding, LogState

SUPERVISOR_PREFIX = "[eagle3-console]"


_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}

_TQDM = re.compile(
    r"(?P<n>\d+(?:\.\d+)?[kMGTP]?)(?:/(?P<total>\d+(?:\.\d+)?[kMGTP]?))?[A-Za-z]*\s*"
    r"\[(?P<elapsed>[\d:]+)(?:<(?P<remaining>[\d:]+|\?))?,\s*"
    r"(?P<rate>\?|\d+(?:\.\d+)?[kMGTP]?)(?P<unit>[A-Za-z]*/[A-Za-z]+)")
# Weight loading: vLLM/SGLang ("Loading safetensors checkpoint shards:  86% Completed";
# SGLang: python/sglang/srt/model_loader/weight_utils.py, tqdm desc "Loading
# {safetensors,pt,np_cache} checkpoint shards" with BAR_FORMAT of
# python/sglang/srt/utils/common.py "{desc}: {percentage:3.0f}% Completed | ...")
# and transformers 5 ("Loading weights:  86%|...| 64/75").
_LOADING = re.compile(r"Loading (?:\w*\s*checkpoint shards|weights):\s*(\d+(?:\.\d+)?)%")
# SGLang's own: "Not enough memory. Please try to increase --mem-fraction-static."
# (python/sglang/srt/model_executor/pool_configurator.py, the KV pool gets no
# tokens), "Out of memory. Try to lower your batch size.", "Prefill out of
# memory. ...", "Decode out of memory. ..." (python/sglang/srt/mem_cache/allocation.py).
_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|Not enough memory"
    r"|(?:Prefill|Decode) out of memory|Out of memory\. Try to lower your batch size"
    r"|(?:HIP|XPU) out of memory")
# python/sglang/srt/entrypoints/http_server.py (_wait_and_warmup):
# logger.info("The server is fired up and ready to roll!").
_READY = "The server is fired up and ready to roll!"
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")
# A child of the server died: python/sglang/srt/managers/scheduler.py
# ("Scheduler hit an exception: {traceback}"), managers/detokenizer_manager.py
# ("DetokenizerManager hit an exception"), managers/tokenizer_manager.py
# ("TokenizerManager hit an exception"), managers/data_parallel_controller.py
# ("DataParallelController hit an exception"); python/sglang/srt/entrypoints/engine.py
# ("Received sigquit from a child process. It usually means the child failed.",
# "Rank {rank} scheduler died during initialization (exit code: ...)").
_SERVER_DIED = re.compile(
    r"\b(?:Scheduler|DetokenizerManager|TokenizerManager|DataParallelController|MultiDetokenizerRouter"
    r"|MultiTokenizerRouter) hit an exception"
    r"|Received sigquit from a child process|Rank \d+ scheduler died during initialization")
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
# torch/distributed/elastic/multiprocessing/errors/__init__.py: torchrun ends
# with `torch.distributed.elastic.multiprocessing.errors.ChildFailedError:` and
# a "Failures:" table when a rank exits non-zero; the rank's own error is above.
_LAUNCHER_FAILED = "ChildFailedError"
# ops/common.py run_main: `extract: error: <BadInput>` (exit 2), or a program's
# bare `error: ...` (a rank's own words under torchrun), optionally behind
# torchrun's `[rank0]:` / `[default0]:` prefix (--tee, --local-ranks-filter).
_PROGRAM_ERROR = re.compile(r"^(?:\[[\w-]+\]:\s*)?(?:[\w.-]+: )?error: \S")
_ERRORS = re.compile(r"\berrors?\s*[:=]\s*(\d+)")
_SUMMARY = re.compile(r"\bprogress:\s+(.*)$")
_PAIR = re.compile(r"(\S+)\s+(\S+)")


def line_time(line: str) -> float | None:
    """The local time SGLang's log format `[%Y-%m-%d %H:%M:%S...] ` puts first
    (python/sglang/srt/utils/common.py configure_logger), as a Unix time."""
    m = _STAMP.match(line)
    if not m:
        return None
    try:
        return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None


def _num(text: str) -> float:
    """tqdm's numbers, with unit_scale suffixes: `972`, `5.80`, `1.20k`."""
    if text and text[-1] in _SCALE:
        return float(text[:-1]) * _SCALE[text[-1]]
    return float(text)


def _clock(text: str | None) -> float | None:
    if not text or text == "?":
        return None
    secs = 0.0
    for part in text.split(":"):
        if not part.isdigit():
            return None
        secs = secs * 60 + int(part)
    return secs


class LineParser:
    """The parsed state of one log: fed lines in order, never re-reads anything."""

    def __init__(self, state: LogState) -> None:
        self.state = state
        self.tb: dict | None = None     # an open traceback: {"prefix": str}
        self.ranks: dict[str, dict] = {}  # per-rank summary fields, summed into state

    def _find(self, kind: str, line: str, offset: int, key: str | None = None) -> None:
        self.state.findings[key or kind] = LogFinding(kind=kind, line=line, at_offset=offset)

    def parse(self, text: str, offset: int, signatures_only: bool = False) -> None:
        """One complete line (ANSI already stripped), found at byte `offset`."""
        if text.startswith(SUPERVISOR_PREFIX):
            return
        if self.tb is not None:
            prefix = self.tb["prefix"]
            body = text[len(prefix):] if prefix and text.startswith(prefix) else text
            if not body.strip() or body[0] in " \t":
                return          # a frame, its source line, a caret line
            before = self.tb.get("before")
            self.tb = None     # the final exception line
            if _LAUNCHER_FAILED in text:
                # torchrun's own report that a rank failed: the rank said why
                # earlier (its traceback, or the op's one-line `error:`), so
                # that stays the finding; the launcher's line is kept apart.
                self._find("launcher", text.strip(), offset)
                if before is not None:
                    self.state.findings["traceback"] = before
                else:
                    self.state.findings.pop("traceback", None)
            else:
                self._find("traceback", text.strip(), offset)
        # Each parser runs behind a substring test: most lines pay a few `in`s.
        stripped = text.strip()
        if "Traceback" in text:
            idx = text.find(_TRACEBACK)
            if idx >= 0:
                self.tb = {"prefix": text[:idx], "before": self.state.findings.get("traceback")}
                self._find("traceback", stripped, offset)
        m = _LOADING.search(text) if ("checkpoint shards" in text or "Loading weights" in text) else None
        if signatures_only:
            how = None
        elif m:
            self.state.load_pct = float(m.group(1))
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
        if "fired up" in text and _READY in text:
            self._find("ready", stripped, offset)
        if ("hit an exception" in text or "sigquit" in text or "died during" in text) \
                and _SERVER_DIED.search(text):
            self._find("server_died", stripped, offset)
        if "error: " in text and _PROGRAM_ERROR.match(stripped):
            self._find("program_error", stripped, offset)
        if how == "summary":            # a summary line's errors are summed over ranks
            if " errors " in text:
                self._find("errors", stripped, offset)
        elif "rror" in text:
            m = _ERRORS.search(text)
            if m:
                self.state.errors = int(m.group(1))
                self._find("errors", stripped, offset)

    def peek_progress(self, text: str) -> None:
        """A partial last line: tqdm's latest update has no terminator yet."""
        m = _LOADING.search(text)
        if m:
            self.state.load_pct = float(m.group(1))
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
        st = self.state
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
                elif key in ("samples", "items", "step", "steps", "prompt", "prompts"):
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
        self.ranks[rank or ""] = fields
        if rank is None:
            self.ranks = {"": fields}      # a single-process line supersedes per-rank ones
        else:
            self.ranks.pop("", None)
        parts = list(self.ranks.values())

        def total(key):
            if len(parts) == 1:
                return parts[0].get(key)
            vals = [p.get(key) for p in parts]
            return sum(vals) if all(v is not None for v in vals) else None

        st = self.state
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
