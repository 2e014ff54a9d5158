"""Batches copied to the GPU one step ahead, on a side CUDA stream (issue 11).

Without it each step begins with its batch's host-to-device copy (at 8 x 2,048
tokens of an 8B target: 400 MB of aux states and 134 MB of final states,
~20 ms over PCIe from pinned memory) on the compute stream, after the previous
step's end-of-step sync: the GPU idles for the copy every step, and no
host-side timer sees it. Here the next batch's copy is issued on its own
stream while the current step computes; the compute stream waits on it only
when the batch is taken. The batch comes from the workers' shared memory, not
pinned (ops.train passes no pin_memory): the copy then holds this thread for
its length, but the GPU goes on with the step queued before it, and the pin
thread's extra copy of every batch cost more (benchmarks/RESULTS.md). On the
CPU it is a plain .to(device). The lengths
go too: TargetView's .to(device) of a CPU tensor would be a synchronous copy,
a device sync at the start of every micro-batch.
"""

from __future__ import annotations

import time
from typing import Iterator

DEVICE_KEYS = ("input_ids", "aux", "final", "loss_mask", "lengths")


class DevicePrefetcher:
    """next() -> (the CPU batch, its device tensors); prefetch() starts the next
    copy (call it once the current step's work is queued). `wait_s` sums the
    time spent blocked on `source` (the data loader)."""

    def __init__(self, source: Iterator[dict], device, dtype):
        import torch

        self.source, self.device, self.dtype = source, device, dtype
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pending: tuple[dict, dict] | None = None
        self.wait_s = 0.0

    def _copy(self, batch: dict) -> dict:
        out = {}
        for key in DEVICE_KEYS:
            t = batch[key]
            dtype = self.dtype if t.is_floating_point() else t.dtype
            out[key] = t.to(self.device, dtype=dtype, non_blocking=True)
        return out

    def prefetch(self) -> None:
        if self.pending is not None:
            return
        import torch

        t0 = time.perf_counter()
        batch = next(self.source)
        self.wait_s += time.perf_counter() - t0
        if self.cuda:
            with torch.cuda.stream(self.stream):
                dev = self._copy(batch)
        else:
            dev = self._copy(batch)
        self.pending = (batch, dev)

    def next(self) -> tuple[dict, dict]:
        import torch

        self.prefetch()
        batch, dev = self.pending
        self.pending = None
        if self.cuda:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for t in dev.values():
                # Made on the side stream, used (and freed) on this one: the
                # caching allocator must not hand the memory back to the side
                # stream before this stream is done with it.
                t.record_stream(current)
        return batch, dev
