"""Print-side log tailing for `eagle3-console logs`: the last N lines without
reading the file from the start, then follow. (The monitor's LogFollower
parses; this only prints.)"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

BLOCK = 64 * 1024


def last_lines(path: Path, n: int) -> list[str]:
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        return []
    with fh:
        fh.seek(0, os.SEEK_END)
        pos = fh.tell()
        data = b""
        while pos > 0 and data.count(b"\n") <= n:
            step = min(BLOCK, pos)
            pos -= step
            fh.seek(pos)
            data = fh.read(step) + data
    text = data.decode("utf-8", "replace").replace("\r\n", "\n")
    # tqdm rewrites its line with \r: show the latest state of each line.
    out = [line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r")
           for line in text.split("\n")]
    if out and out[-1] == "":
        out.pop()
    return out[-n:] if n else []


def follow_file(path: Path, poll_s: float = 0.25) -> Iterator[str]:
    """New text as it is appended; reopens on rotation, restarts on truncation."""
    fh = open(path, "rb")
    fh.seek(0, os.SEEK_END)
    inode = os.fstat(fh.fileno()).st_ino
    while True:
        chunk = fh.read(BLOCK)
        if chunk:
            yield chunk.decode("utf-8", "replace")
            continue
        time.sleep(poll_s)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_ino != inode:
            fh.close()
            fh = open(path, "rb")
            inode = os.fstat(fh.fileno()).st_ino
        elif st.st_size < fh.tell():
            fh.seek(0)
