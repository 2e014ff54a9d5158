"""The writers of extract: sample files written off the forward loop.

Sits after the forward pass (ops/target_model/forward.py) and before the disk. The loop puts
one job per sample into a bounded queue and goes on with the next forward;
`writers` threads wait for the device-to-host copy (a CUDA event) and write
`data_<idx>.safetensors.tmp` from the sample's file image (sample_file.py:
the copy lands in the image), then rename it: a file that exists is whole.
The loop blocks only when the queue is full. No metadata goes into a sample
file, so the bytes depend on the tensors alone (resume is byte-identical).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ops.common import DISK_FULL, TMP_SUFFIX
from ops.extract.sample_file import SampleImage, sample_image, write_image


@dataclass
class WriteJob:
    idx: int
    path: Path
    image: SampleImage | None     # the file's bytes; its hidden states may still be in flight
    ready: object | None = None   # a torch.cuda.Event recorded after the copy, or None
    tokens: int = 0


@dataclass
class WriterErrors:
    count: int = 0
    messages: list[str] = field(default_factory=list)
    disk_full: OSError | None = None      # the first ENOSPC/EDQUOT, with the path it hit


def write_sample(path: Path, data: SampleImage | dict, fsync: bool = False, direct: bool = False) -> None:
    """`data`: an image, or host tensors (laid out into one). `fsync`: the
    bytes are on disk before the name says whole (durable.py); `direct`:
    written with O_DIRECT, and fsynced."""
    image = data if isinstance(data, SampleImage) else sample_image(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    try:
        write_image(tmp, image, direct=direct, sync=fsync or direct)
    except BaseException as exc:
        # A half-written temp file holds the space a full disk needs for data_config.
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # os.write's error names no file: the disk-full line should.
            raise OSError(exc.errno, exc.strerror, str(tmp)) from exc
        raise
    os.replace(tmp, path)


class SampleWriter:
    """A bounded queue feeding `threads` writer threads."""

    def __init__(self, threads: int, queue_size: int,
                 on_written: Callable[[int, int], None], fsync: bool = False, direct: bool = False) -> None:
        if threads < 1:
            raise ValueError(f"writers must be at least 1, got {threads}")
        self._queue: queue.Queue[WriteJob | None] = queue.Queue(maxsize=max(1, queue_size))
        self._on_written = on_written
        self._fsync, self._direct = fsync, direct
        self.errors = WriterErrors()
        # Summed over the threads: waiting for a sample's device copy (the GPU
        # side) against writing its bytes (the disk side); loop.py's closing
        # line, which says which of the two bounds the run.
        self.copy_wait_s = 0.0
        self.write_s = 0.0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._work, name=f"extract-writer-{i}", daemon=True)
                         for i in range(threads)]
        for t in self._threads:
            t.start()

    @property
    def threads(self) -> int:
        return len(self._threads)

    def submit(self, job: WriteJob) -> None:
        self._queue.put(job)   # blocks only when the queue is full

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t0 = time.perf_counter()
            t1 = t2 = None
            try:
                if job.ready is not None:
                    job.ready.synchronize()
                t1 = time.perf_counter()
                write_sample(job.path, job.image, self._fsync, self._direct)
                t2 = time.perf_counter()
            except Exception as exc:  # noqa: BLE001 - one bad write must not stop the others
                with self._lock:
                    self.errors.count += 1
                    if isinstance(exc, OSError) and exc.errno in DISK_FULL and self.errors.disk_full is None:
                        self.errors.disk_full = exc
                    if len(self.errors.messages) < 20:
                        self.errors.messages.append(f"{job.path}: {type(exc).__name__}: {exc}")
            else:
                self._on_written(job.idx, job.tokens)
            finally:
                end = time.perf_counter()
                with self._lock:    # a failed wait or write: its time goes where it failed
                    self.copy_wait_s += (t1 or end) - t0
                    self.write_s += (t2 or end) - (t1 or end)
                if job.image is not None:
                    job.image.release()     # its slab's share may be reused (staging.py)
                job.image = None

    def close(self) -> None:
        """Wait for every queued sample to be written."""
        for _ in self._threads:
            self._queue.put(None)
        for t in self._threads:
            t.join()
