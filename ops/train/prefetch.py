"""Batches fetched and copied to the GPU ahead of the step, by a thread of their
own, on a side CUDA stream.

Why a thread: a batch's host-to-device copy (at 8 x 2,048 tokens of an 8B
target: 400 MB of aux states and 134 MB of final states) on the compute
stream leaves the GPU idle for it every step; issued from the training thread
on a side stream, the copy still holds that thread while it waits on the
DataLoader (unpickling the worker's batch, mapping its shared memory) and in
the copy, which from pageable memory (ops.train passes no pin_memory: the pin
thread's extra copy of every batch costs more) holds the calling thread for
its length. Meanwhile it queues no kernels, so the GPU drains its queue and
waits; more workers do not help, as the workers are not what it waits on.

So a background thread does it all: next(source); the copy of each key into
one of two reused pinned slots, then a real asynchronous DMA on its own stream
(a pageable copy, staged by the driver, makes the step slower); an event after
them; the batch, its device tensors and the event into a bounded queue. The
training thread only takes from the queue and makes the compute stream wait on
the event (a device-side wait). The thread also drops the host copies of the
hidden states (HOST_DROPPED) once they are on the device: freed in the training
thread when the next batch replaced them (hundreds of MB of worker shared
memory to unmap), they would stall every step's start. benchmarks/RESULTS.md
has what this path costs against one batch kept on the device
(benchmarks/train_throughput.py --staging resident,pinned,inline).

The same thread runs on the CPU, where the copy is a plain .to(device) and
there are no streams or events (the tests exercise the threading there). The
lengths go too: TargetView's .to(device) of a CPU tensor would be a
synchronous copy, a device sync at the start of every micro-batch.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Iterator

DEVICE_KEYS = ("input_ids", "aux", "final", "loss_mask", "lengths")
# The host copies of the hidden states (534 MB a batch at 8 x 2,048 tokens of an
# 8B target, in the workers' shared memory) are dropped in this thread once on
# the device: freed in the training thread, unmapping them stalled the start of
# each step (the CPU batch next() returns keeps the small keys only).
HOST_DROPPED = ("aux", "final")
# How a batch reaches the device: "pinned" copies it (in this thread) into one
# of two reused page-locked slots, then a true asynchronous DMA; "pageable"
# copies straight from the workers' shared memory (the driver stages it).
STAGING = ("pinned", "pageable")

_END = object()      # the source ended


class _Failed:
    """The source (or a copy) raised: handed to the training thread to re-raise."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class _PinnedSlot:
    """Page-locked host buffers (one per batch key) a batch is staged in before
    its copy to the device, reused for the run; `event` marks the end of the
    last copy out of them (the slot is refilled only after it)."""

    def __init__(self, pin: bool = True) -> None:
        self.buffers: dict = {}
        self.event = None
        self.pin = pin          # False only in the CPU tests (pinning needs CUDA)

    def stage(self, key: str, t):
        import torch

        nbytes = t.numel() * t.element_size()
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < nbytes:
            # Grown (a longer length bucket) with a quarter to spare: pinning costs ~0.4 ms a MB.
            buf = torch.empty(nbytes + nbytes // 4, dtype=torch.uint8, pin_memory=self.pin)
            self.buffers[key] = buf
        view = buf[:nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        return view


def to_device(batch: dict, device, dtype, slot: _PinnedSlot | None = None, fmt: str = "bf16",
              hidden: int = 0) -> dict:
    """DEVICE_KEYS of `batch` on `device`, floating tensors in `dtype`, copied
    without blocking (through `slot`'s pinned buffers when given), on the
    current stream. States stored in an encoded format cross as they are
    stored (a quarter to a half of bf16's bytes) and are decoded there."""
    from ops.drafter.data import batch_keys, decode_batch

    encoded = fmt != "bf16"
    keys = [k for k in DEVICE_KEYS if not (encoded and k in HOST_DROPPED)] + (list(batch_keys(fmt)) if encoded else [])
    out = {}
    for key in keys:
        t = batch[key]
        # States computed on the device (online training) are not staged through the host.
        src = slot.stage(key, t) if slot is not None and t.device.type == "cpu" else t
        floating = t.is_floating_point() and not encoded
        out[key] = src.to(device, dtype=dtype if floating else t.dtype, non_blocking=True)
    if encoded:
        states = decode_batch(out, fmt, hidden, dtype)
        out = {k: v for k, v in out.items() if k not in batch_keys(fmt)}
        out.update(states)
    return out


class DevicePrefetcher:
    """next() -> (the CPU batch without HOST_DROPPED, its device tensors), in the source's order.

    `depth` bounds the queue of batches ready on the device. Memory: up to
    `depth` batches wait on the GPU in the queue and one more is being copied
    by the thread, beside the one the step uses (534 MB each at 8 x 2,048
    tokens of an 8B target): the source is read at most depth + 1 batches
    ahead of what next() returned. `wait_s` sums the time the training thread
    was blocked in next() waiting for data. close() stops and joins the thread;
    call it when training ends or fails."""

    def __init__(self, source: Iterator[dict], device, dtype, depth: int = 2, staging: str = "pinned",
                 fmt: str = "bf16", hidden: int = 0):
        import torch

        self.fmt, self.hidden = fmt, hidden
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        if staging not in STAGING:
            raise ValueError(f"staging must be one of {STAGING}, got {staging!r}")
        self.staging = staging
        self.slots = [_PinnedSlot(), _PinnedSlot()]
        self.turn = 0
        self.source, self.device, self.dtype = source, device, dtype
        self.cuda = device.type == "cuda"
        # The thread's current device is its own (CUDA's is per host thread):
        # resolved here, where the caller has set it, and set there once.
        self.index = ((device.index if device.index is not None else torch.cuda.current_device())
                      if self.cuda else None)
        self.stream = torch.cuda.Stream(self.index) if self.cuda else None
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.wait_s = 0.0
        self.finished = None        # _END or a _Failed once taken: next() gives it again
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="device-prefetch", daemon=True)
        self.thread.start()

    def _copy(self, batch: dict):
        """(device tensors, the event after their copies) on CUDA, (tensors, None) on the CPU."""
        import torch

        if not self.cuda:
            return to_device(batch, self.device, self.dtype, fmt=self.fmt, hidden=self.hidden), None
        slot = None
        if self.staging == "pinned":
            slot = self.slots[self.turn]
            self.turn = 1 - self.turn
            if slot.event is not None:
                slot.event.synchronize()    # its previous batch has left it (this thread waits, not the GPU)
        with torch.cuda.stream(self.stream):
            out = to_device(batch, self.device, self.dtype, slot, self.fmt, self.hidden)
            event = torch.cuda.Event()
            event.record(self.stream)
        if slot is not None:
            slot.event = event
        return out, event

    def _put(self, item) -> bool:
        """Into the queue unless close() asks the thread to stop (it may be
        blocked on a full queue that nobody will drain)."""
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        import torch

        try:
            if self.cuda:
                torch.cuda.set_device(self.index)
            while not self.stop.is_set():
                try:
                    batch = next(self.source)
                except StopIteration:
                    self._put(_END)
                    return
                dev, event = self._copy(batch)
                batch = {k: v for k, v in batch.items() if k not in HOST_DROPPED and not k.endswith("_scale")}
                if not self._put((batch, dev, event)):
                    return
        except BaseException as exc:    # a worker's error, a copy out of memory: the training thread raises it
            self._put(_Failed(exc))

    def next(self) -> tuple[dict, dict]:
        import torch

        if self.finished is None:
            t0 = time.perf_counter()
            item = self.queue.get()
            self.wait_s += time.perf_counter() - t0
            if item is _END or isinstance(item, _Failed):
                self.finished = item
        else:
            item = self.finished
        if item is _END:
            raise StopIteration
        if isinstance(item, _Failed):
            raise item.exc
        batch, dev, event = item
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in dev.values():
                # Made on the side stream, used (and freed) on this one: the
                # caching allocator must not hand the memory back to the side
                # stream before this stream is done with it.
                t.record_stream(current)
        return batch, dev

    def close(self, timeout: float = 60.0) -> bool:
        """Stop the thread and join it (it leaves a blocked put at once; one in
        next(source) when the source yields). Then the source is closed, if it
        is a generator: a DataLoader iterator suspended inside it is released
        and its workers shut down. True if the thread is gone."""
        self.stop.set()
        self.thread.join(timeout)
        # Nothing left in the queue keeps device memory (or worker shared memory) alive.
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        if self.thread.is_alive():
            return False
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
        return True
