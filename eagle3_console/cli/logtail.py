"""Print-side log tailing for `eagle3-console logs`: the last N lines, then follow.

Bounded whatever the log holds: the tail reads one window of at most WINDOW
bytes from the end (a 2 GiB log without a newline costs one 8 MiB read, not a
walk to its start), and a line longer than MAX_LINE bytes keeps its head and
its end around a `[line cut: ...]` marker. Everything printed is printable:
control bytes come out escaped the way repr() writes
them (`\\x07`), undecodable bytes as `\\xff`; tabs stay; ANSI colour and cursor
sequences are dropped (as the monitor's tail drops them).

Following reads the open file descriptor (a log moved aside mid-run is read
on, and a new file at the path from its start; nothing is skipped), with the
same caps and escaping, and ends when the run does (`tail --pid`).
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import BinaryIO, Callable, TextIO

from eagle3_console.kernel.text import printable as text_printable

WINDOW = 8 << 20
MAX_LINE = 8 << 10
CUT = "[line cut: "


def printable(text: str) -> str:
    """`text` without ANSI control sequences, every other non-printable
    character but the tab escaped the way repr() writes it."""
    return text_printable(text, keep="\t")


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


# Bytes read from one file per pass: a burst is printed over a few passes, never skipped.
READ_BUDGET = 8 << 20
FOLLOWED_FILES = 4      # rotated files still read (their writer may hold them open)


class _OpenLog:
    """One log file followed through its open descriptor: a file renamed aside
    (logrotate without copytruncate, `mv`) keeps its inode, and the run's
    stage keeps writing there, so its lines are read on from the descriptor,
    not lost. Lines are capped as last_lines() caps them; memory is bounded
    (a line without an end keeps only its head and its end)."""

    def __init__(self, fh, offset: int) -> None:
        self.fh = fh
        info = os.fstat(fh.fileno())
        self.ident = (info.st_dev, info.st_ino)
        self.offset = offset            # bytes consumed, the unfinished line's included
        self.partial = b""              # the unfinished line (its end, once cut)
        self.head: bytes | None = None  # a cut line's first MAX_LINE // 2 bytes
        self.dropped = 0                # bytes of the cut line between head and partial

    def read(self, flush: bool) -> tuple[list[str], bool]:
        """(new lines, whether more is waiting); `flush`: the unfinished line too."""
        size = os.fstat(self.fh.fileno()).st_size
        if size < self.offset:
            # Truncated in place (copytruncate): what it holds now is new.
            self.offset, self.partial, self.head, self.dropped = 0, b"", None, 0
        self.fh.seek(self.offset)
        data = self.fh.read(min(READ_BUDGET, size - self.offset))
        self.offset += len(data)
        lines = []
        pieces = data.split(b"\n")
        for piece in pieces[:-1]:
            lines.append(self._line(self.partial + piece))
        self._keep(pieces[-1])
        if flush and self.offset >= size and (self.partial or self.head is not None):
            lines.append(self._line(self.partial))
        return lines, self.offset < size

    def _keep(self, rest: bytes) -> None:
        self.partial += rest
        half = MAX_LINE // 2
        if len(self.partial) > 4 * MAX_LINE:
            if self.head is None:
                self.head, self.partial = self.partial[:half], self.partial[half:]
            self.dropped += len(self.partial) - half
            self.partial = self.partial[-half:]

    def _line(self, body: bytes) -> str:
        head, dropped = self.head, self.dropped
        self.partial, self.head, self.dropped = b"", None, 0
        if head is None or b"\r" in body:
            return _render(body, False)
        return _decode(head) + f" {CUT}{dropped:,} bytes not shown] " + _decode(body, True)

    def close(self) -> None:
        self.fh.close()


def _open_at(path: Path, offset: int | None) -> _OpenLog | None:
    try:
        fh = open(path, "rb")
    except OSError:
        return None
    size = os.fstat(fh.fileno()).st_size
    return _OpenLog(fh, size if offset is None else min(offset, size))


def follow(path: Path, out: TextIO, ended: Callable[[], str | None] = lambda: None,
           start: int | None = None, poll_s: float = 0.25,
           sleep: Callable[[float], None] = time.sleep, first=None) -> str | None:
    """Print each new line of `path` to `out` until `ended()` returns a line
    (the run's status line: printed after the log's last lines, then returned),
    like `tail --pid`. Starts at byte `start` (default: the current end).

    Moved aside or rotated: the file already open is read on (its writer
    still writes there) and a new file at the path is read from its start;
    truncated in place: read again from its start. `first`: the log already
    open (open_log()), so nothing written between the tail and this is lost."""
    files: list[_OpenLog] = []
    if first is not None:
        size = os.fstat(first.fileno()).st_size
        files.append(_OpenLog(first, size if start is None else min(start, size)))
    else:
        opened = _open_at(path, start)
        if opened is not None:
            files.append(opened)
    try:
        while True:
            final = ended()
            try:
                info = os.stat(path)
                ident = (info.st_dev, info.st_ino)
            except OSError:
                ident = None
            if ident is not None and all(f.ident != ident for f in files):
                new = _open_at(path, 0)
                if new is not None:
                    files.append(new)
                    if len(files) > FOLLOWED_FILES:
                        files.pop(0).close()
            busy = False
            for f in files:
                lines, more = f.read(flush=final is not None)
                busy = busy or more
                for line in lines:
                    out.write(line + "\n")
            out.flush()
            if busy:
                continue
            if final is not None:
                out.write(printable(final) + "\n")
                out.flush()
                return final
            sleep(poll_s)
    finally:
        for f in files:
            f.close()


def _append_fd(pid: int) -> int | None:
    """The supervisor's log descriptor: its one regular file open for appending."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as fh:
                flags = next((int(line.split()[1], 8) for line in fh if line.startswith("flags:")), 0)
            if flags & os.O_APPEND and stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):
                return int(fd)
        except (OSError, ValueError):
            continue
    return None


def open_log(run) -> tuple[BinaryIO, str | None] | None:
    """(the run's log open for reading, where it lies now when that is not its
    path), or None when it is gone. A live run's log moved or deleted before
    this is still the file its supervisor writes: it is opened through the
    supervisor's descriptor (/proc/PID/fd)."""
    try:
        return open(run.log_path, "rb"), None
    except FileNotFoundError:
        pass
    from eagle3_console.monitor.procs import process_alive
    if not run.live or not process_alive(run.supervisor_pid, run.supervisor_create_time):
        return None
    fd = _append_fd(run.supervisor_pid)
    if fd is None:
        return None
    link = f"/proc/{run.supervisor_pid}/fd/{fd}"
    try:
        return open(link, "rb"), os.readlink(link)
    except OSError:
        return None


def gone_message(run, path: Path) -> str:
    """What `logs` says of a run whose log file is not at its path."""
    rotated = sorted(p.name for p in path.parent.glob(path.name + "*") if p != path) if path.parent.is_dir() else []
    where = f"; rotated copies beside it: {', '.join(rotated[:5])}" if rotated else ""
    return f"the log of run {run.id} ({run.stage}) is gone: {path} (deleted or moved){where}"


def run_ended(db_path: Path, run_id: int) -> Callable[[], str | None]:
    """For follow(): None while run `run_id` (or, when its supervisor is lost,
    its stage process) lives, then its status line."""
    from eagle3_console.kernel.registry import Registry, RunStatus
    from eagle3_console.runs import reconcile, stage_alive

    def ended() -> str | None:
        with Registry(db_path) as reg:
            reconcile(reg)
            run = reg.get(run_id)
        if run.live or (run.status == RunStatus.LOST and stage_alive(run)):
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
