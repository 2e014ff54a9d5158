"""Print-side log tailing for `eagle3-console logs`: the last N lines, then follow.

Bounded whatever the log holds: the tail reads one window of at most WINDOW
bytes from the end (a 2 GiB log without a newline costs one 8 MiB read, not a
walk to its start), and a line longer than MAX_LINE bytes keeps its head and
its end around a `[line cut: ...]` marker. Everything printed is printable:
control bytes come out escaped the way repr() writes
them (`\\x07`), undecodable bytes as `\\xff`; tabs stay; ANSI colour and cursor
sequences are dropped (as the monitor's tail drops them).

Following is the monitor's LogFollower (monitor/logs.py): one reader for
rotation, truncation and bursts; here its new lines get the same caps and
escaping, and following ends when the run does (`tail --pid`).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Callable, TextIO

WINDOW = 8 << 20
MAX_LINE = 8 << 10
CUT = "[line cut: "


# ANSI control sequences (colours, cursor moves): dropped, as the monitor's tail does.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def printable(text: str) -> str:
    """`text` without ANSI control sequences, every other non-printable
    character but the tab escaped the way repr() writes it."""
    if text.isprintable():
        return text
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return "".join(c if c.isprintable() or c == "\t" else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _decode(data: bytes, mid_char: bool = False) -> str:
    if mid_char:
        # Cut inside a UTF-8 character: drop its continuation bytes (at most 3).
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
            skip += 1
        data = data[skip:]
    return printable(data.decode("utf-8", "backslashreplace"))


def _render(seg: bytes, partial: bool) -> str:
    """One line's bytes as printable text; `partial`: the line began before the window read."""
    # tqdm rewrites its line with \r: show the latest state of the line (also drops a \r\n's \r).
    body = seg[:-1] if seg.endswith(b"\r") else seg
    cr = body.rfind(b"\r")
    if cr >= 0:
        body, partial = body[cr + 1:], False
    if partial:
        return f"{CUT}longer than {len(body):,} bytes, its end shown] " + _decode(body[-MAX_LINE:], True)
    if len(body) <= MAX_LINE:
        return _decode(body)
    half = MAX_LINE // 2
    return (_decode(body[:half]) + f" {CUT}{len(body) - 2 * half:,} bytes not shown] "
            + _decode(body[-half:], True))


def last_lines(path: Path, n: int, window: int = WINDOW, upto: int | None = None) -> list[str]:
    """The last `n` lines of `path` (of its first `upto` bytes), printable,
    from at most `window` bytes of its end."""
    if n <= 0:
        return []
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return []
    with fh:
        size = os.fstat(fh.fileno()).st_size
        size = size if upto is None else min(size, upto)
        begin = max(0, size - window)
        fh.seek(begin)
        data = fh.read(size - begin)
    if not data:
        return []
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    # n rfinds at C speed: only the bytes of the lines shown are ever decoded.
    first, found = end, 0
    while found < n:
        nl = data.rfind(b"\n", 0, first)
        if nl < 0:
            first = 0
            break
        first, found = nl, found + 1
    else:
        first += 1
    segs = data[first:end].split(b"\n")
    # Without n line ends in the window, its first line began before it (unless the file did).
    return [_render(seg, i == 0 and first == 0 and begin > 0)
            for i, seg in enumerate(segs)]


def tail(path: Path, n: int, window: int = WINDOW) -> tuple[list[str], int]:
    """(the last `n` lines, the file size they were read up to): following starts there."""
    try:
        size = os.stat(path).st_size
    except OSError:
        size = 0
    return last_lines(path, n, window, upto=size), size


def follow(path: Path, out: TextIO, ended: Callable[[], str | None] = lambda: None,
           start: int | None = None, poll_s: float = 0.25,
           sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Print each new line of `path` to `out` until `ended()` returns a line
    (the run's status line: printed after the log's last lines, then returned),
    like `tail --pid`. Starts at byte `start` (default: the current end);
    survives rotation and truncation."""
    from eagle3_console.monitor.logs import LogFollower

    follower = LogFollower.at_end(path, start)
    while True:
        final = ended()
        for line in follower.read_new(flush=final is not None):
            out.write(_render(line.encode("utf-8"), False) + "\n")
        out.flush()
        if final is not None:
            out.write(printable(final) + "\n")
            out.flush()
            return final
        sleep(poll_s)


def run_ended(db_path: Path, run_id: int) -> Callable[[], str | None]:
    """For follow(): None while run `run_id` (or, when its supervisor is lost,
    its stage process) lives, then its status line."""
    from eagle3_console.registry import Registry
    from eagle3_console.runs import reconcile, stage_alive

    def ended() -> str | None:
        with Registry(db_path) as reg:
            reconcile(reg)
            run = reg.get(run_id)
        if run.live or (run.status == "lost" and stage_alive(run)):
            return None
        return status_line(run)
    return ended


def status_line(run) -> str:
    """`run 7 (extract) failed: exit 1 (reason)`: how a followed run ended."""
    if run.signal:
        import signal as _signal
        try:
            how = f"signal {_signal.Signals(run.signal).name}"
        except ValueError:
            how = f"signal {run.signal}"
    else:
        how = "exit ?" if run.exit_code is None else f"exit {run.exit_code}"
    return f"run {run.id} ({run.stage}) {run.status}: {how}" + (f" ({run.reason})" if run.reason else "")
