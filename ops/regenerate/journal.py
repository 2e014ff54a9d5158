"""regenerate's resumable output: an append-only journal and its done-index.

Each finished row (answered or failed) is one JSON line appended to
journal.jsonl in the order rows finish, and then one line
`<row> <offset> <length>` appended to journal.idx: a row counts as done once
its index line is there and points at a whole journal line of that row. A run
killed at any byte leaves at most a torn tail, which the next run cuts off
(that row is asked again); answered rows are never asked again. Failed rows are
asked again by a resumed run (a timeout or a server error may pass).

The final conversations.jsonl is written from the journal in input order
(temp name, then rename), so a resumed run's file is the same as an
uninterrupted run's. settings.json pins what the answers were made with: a
run with other settings on the same output is refused rather than mixed in.
One run at a time writes an output (an exclusive lock on .regenerate.lock).
A full disk (ENOSPC, EDQUOT) on any of these files is DiskFull naming the
file: the rows journaled before stay, the torn line is cut off next time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from ops.common import DISK_FULL, TMP_SUFFIX, BadInput, disk_full_text, write_json_atomic
from ops.regenerate.spec import INDEX, JOURNAL, OUTPUT, SETTINGS

LOCK = ".regenerate.lock"
FSYNC_EVERY_S = 2.0
class DiskFull(Exception):
    """A write of `path` found the disk (or the quota) full: `<path>: No space left on device (ENOSPC)`."""

    def __init__(self, path: Path, exc: OSError):
        super().__init__(disk_full_text(exc, path))
        self.path = path


@contextlib.contextmanager
def writing(path: Path):
    """An OSError of a full disk inside is DiskFull naming `path`."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise DiskFull(Path(exc.filename or path), exc) from None
        raise


class Journal:
    def __init__(self, out_dir: Path):
        self.dir = Path(out_dir)
        self.journal_path = self.dir / JOURNAL
        self.index_path = self.dir / INDEX
        self._lock = None
        self._journal = None
        self._index = None
        self._end = 0
        self._synced = time.monotonic()

    def open(self, settings: dict) -> dict[int, dict]:
        """Take the output (BadInput while another run holds it, or when its answers were
        made with other settings) and return the done rows: {row: its last record}."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.dir / LOCK, "a")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BadInput(f"output {self.dir}: another regenerate run is writing it") from None
        with writing(self.dir / SETTINGS):
            self._check_settings(settings)
        done, end, index_end = self._valid_prefix()
        with writing(self.journal_path), open(self.journal_path, "ab") as fh:
            fh.truncate(end)            # a torn or unindexed tail: that row is asked again
        with writing(self.index_path), open(self.index_path, "ab") as fh:
            fh.truncate(index_end)
        self._journal = open(self.journal_path, "ab")
        self._index = open(self.index_path, "ab")
        self._end = end
        return done

    def _check_settings(self, settings: dict) -> None:
        path = self.dir / SETTINGS
        if path.is_file():
            try:
                old = json.loads(path.read_text())
            except ValueError:
                old = None
            if not isinstance(old, dict):
                raise BadInput(f"{path}: not a JSON object; clean the stage's output or choose another output")
            for key in sorted(set(old) | set(settings)):
                if old.get(key) != settings.get(key):
                    raise BadInput(f"output {self.dir} holds answers made with {key} = {old.get(key)!r}; this run "
                                   f"has {settings.get(key)!r} ({path}): remove that output (or `clean` the stage) or choose "
                                   f"another output")
            return
        if self.journal_path.is_file() and self.journal_path.stat().st_size:
            raise BadInput(f"output {self.dir} holds a journal without {SETTINGS}: clean the stage or choose "
                           f"another output")
        write_json_atomic(path, settings)

    def _valid_prefix(self) -> tuple[dict[int, dict], int, int]:
        """The done rows, the journal's valid length and the index's."""
        done: dict[int, dict] = {}
        try:
            index = self.index_path.read_bytes()
            journal = self.journal_path.read_bytes()
        except FileNotFoundError:
            return {}, 0, 0
        end = index_end = 0
        for raw in index.split(b"\n")[:-1]:        # the last piece is "" or a torn line
            try:
                row, offset, length = (int(x) for x in raw.split())
            except ValueError:
                break
            line = journal[offset:offset + length]
            if offset != end or len(line) != length or not line.endswith(b"\n"):
                break
            try:
                record = json.loads(line)
            except ValueError:
                break
            if not isinstance(record, dict) or record.get("row") != row:
                break
            done[row] = record
            end, index_end = offset + length, index_end + len(raw) + 1
        return done, end, index_end

    def append(self, record: dict) -> None:
        try:
            text = json.dumps(record, ensure_ascii=False)
            text.encode()
        except UnicodeEncodeError:      # a lone surrogate in a server's error text: escaped, still one line
            text = json.dumps(record)
        line = (text + "\n").encode()
        with writing(self.journal_path):
            self._journal.write(line)
            self._journal.flush()       # the line is whole in the file before the index names it
        with writing(self.index_path):
            self._index.write(f"{record['row']} {self._end} {len(line)}\n".encode())
            self._index.flush()
        self._end += len(line)
        if time.monotonic() - self._synced >= FSYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        for fh, path in ((self._journal, self.journal_path), (self._index, self.index_path)):
            if fh is not None:
                with writing(path):
                    os.fsync(fh.fileno())
        self._synced = time.monotonic()

    def close(self) -> None:
        """Sync and close; a full disk here is said by whoever failed first, not raised again."""
        try:
            self.sync()
        except (DiskFull, OSError):
            pass
        for fh in (self._journal, self._index, self._lock):
            if fh is not None:
                try:
                    fh.close()
                except OSError:
                    pass                # a buffered tail the full disk refused: cut off next time
        self._journal = self._index = self._lock = None


def write_conversations(out_dir: Path, done: dict[int, dict]) -> tuple[int, int]:
    """conversations.jsonl from the answered rows, in input order (a row's samples one after
    the other, each `{"id", "sample": k, "messages"}`): (conversations, bytes)."""
    path = Path(out_dir) / OUTPUT
    tmp = path.with_name(path.name + TMP_SUFFIX)
    rows = 0
    with writing(path), open(tmp, "w", encoding="utf-8") as fh:
        for row in sorted(done):
            record = done[row]
            if record.get("failed"):
                continue
            head = {"id": record["id"]} if record.get("id") is not None else {}
            if "samples" not in record:
                fh.write(json.dumps({**head, "messages": record["messages"]}, ensure_ascii=False) + "\n")
                rows += 1
                continue
            for k, messages in enumerate(record["samples"]):
                fh.write(json.dumps({**head, "sample": k, "messages": messages}, ensure_ascii=False) + "\n")
                rows += 1
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return rows, path.stat().st_size
