"""Host memory for extract's batches: a few pinned slabs, each holding one
batch's sample file images, reused for the whole run.

Sits between the forward (run.py carves a batch's images out of a slab and
copies the states from the device into them) and the writers (writer.py
releases each image once its file is written; the slab is free again when
all of its batch's are). Why not allocate per sample: torch's caching host
allocator rounds every pinned block up to a power of two (a 64 MiB sample
takes a 128 MiB block) and pins each new block with cudaHostAlloc, which costs
seconds of a short run before the cache is warm. Here pinning
happens `count` times in all, and the slabs bound the host memory: when
every slab is in flight the forward waits for the writers.
"""

from __future__ import annotations

import threading
import time

from ops.extract.sample_file import SampleImage, aligned_buffer


class Slab:
    def __init__(self, pool: "SlabPool | None", nbytes: int, pin: bool) -> None:
        self.buffer = aligned_buffer(nbytes, pin)
        self._pool = pool
        self._pending = 0
        self._lock = threading.Lock()

    def carve(self, layouts: list[dict], sizes: list[int], metadata: dict | None = None) -> list[SampleImage]:
        """One image per layout (SampleImage's specs) of its padded size,
        consecutive and aligned, each with the header `metadata`."""
        images, at = [], 0
        for specs, size in zip(layouts, sizes):
            images.append(SampleImage(specs, buffer=self.buffer[at:at + size], on_release=self._release_one,
                                      metadata=metadata))
            at += size
        self._pending = len(images)
        if not images:
            self._give_back()
        return images

    def _release_one(self) -> None:
        with self._lock:
            self._pending -= 1
            done = self._pending == 0
        if done:
            self._give_back()

    def _give_back(self) -> None:
        if self._pool is not None:
            self._pool._put(self)


class SlabPool:
    """`count` slabs of `nbytes`, made on first need; `take(layouts)` blocks
    while all are in flight. A batch larger than a slab (one sample over the
    token budget) gets a block of its own, freed with its images."""

    def __init__(self, count: int, nbytes: int, pin: bool) -> None:
        if count < 1:
            raise ValueError(f"host slabs must be at least 1, got {count}")
        self.count, self.nbytes, self.pin = count, nbytes, pin
        self._free: list[Slab] = []
        self._made = 0
        self._cond = threading.Condition()
        # Seconds take() blocked with every slab in flight: the forward waiting
        # for the writers (loop.py's closing time line); making a slab is not waiting.
        self.waited_s = 0.0

    def take(self, layouts: list[dict], metadata: dict | None = None) -> list[SampleImage]:
        sizes = [SampleImage.padded_size(s, metadata) for s in layouts]
        need = sum(sizes)
        if need > self.nbytes:
            return Slab(None, need, self.pin).carve(layouts, sizes, metadata)
        with self._cond:
            if not self._free and self._made >= self.count:
                t0 = time.perf_counter()
                while not self._free:
                    self._cond.wait()
                self.waited_s += time.perf_counter() - t0
            if self._free:
                slab = self._free.pop()
            else:
                self._made += 1
                slab = None
        if slab is None:
            slab = Slab(self, self.nbytes, self.pin)
        return slab.carve(layouts, sizes, metadata)

    def _put(self, slab: Slab) -> None:
        with self._cond:
            self._free.append(slab)
            self._cond.notify()
