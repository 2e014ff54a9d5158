"""One sample file's bytes laid out in one page-aligned host buffer, and its write.

Sits between the forward (run.py copies each sample's hidden states from the
device straight into its image) and the disk (writer.py threads write the
image). The bytes are exactly what `safetensors.torch.save_file` writes for the
same tensors (tests/test_sample_file.py compares them), so readers, verify and
resume see the format of DESIGN.md unchanged.

Why not save_file: it writes through buffered I/O from tensors it is given,
so a sample crosses host memory twice (device copy, then the page cache) and a
durable file pays the write-back at fsync. Here the device copy lands in the
file image itself, and "direct" writes that image with O_DIRECT (page cache
bypassed; durable with one fsync for the metadata): the disk sees one DMA from
the buffer the GPU filled. O_DIRECT wants the buffer, the file offset and the
length aligned to the logical block; the image is page-aligned and padded to
ALIGN, and the file is cut to its real size after the write.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path

import torch

ALIGN = 4096

# safetensors writes the tensors sorted by dtype (its Dtype enum, largest
# first) then by name (safetensors/src/tensor.rs, `prepare`); these are the
# dtypes a sample file holds, in that enum's order.
_ST_DTYPES = {torch.uint8: "U8", torch.float8_e4m3fn: "F8_E4M3", torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32",
              torch.float32: "F32", torch.int64: "I64"}
_ENUM_ORDER = ["U8", "F8_E4M3", "F16", "BF16", "I32", "F32", "I64"]


class SampleImage:
    """The file image of one sample: header, then each tensor at its offset.

    `views[name]` is a tensor over the image's bytes of that name's shape and
    dtype: copy into it (from the device, non_blocking, when the image is
    pinned) and the file is ready once the copy has landed. `buffer`: an
    ALIGN-aligned uint8 tensor of padded_size(specs) bytes to lay it in (a
    slab's share, staging.py); by default one of its own. `release()` hands
    the bytes back once written.
    """

    def __init__(self, specs: dict[str, tuple[torch.dtype, tuple[int, ...]]], pin: bool = False,
                 buffer: torch.Tensor | None = None, on_release=None, metadata: dict | None = None) -> None:
        raw, offsets, data = _layout(specs, metadata)
        start = 8 + len(raw)
        self.size = start + data
        padded = self.size + (-self.size % ALIGN)
        if buffer is None:
            buffer = aligned_buffer(padded, pin)
        elif buffer.numel() < padded:
            raise ValueError(f"buffer of {buffer.numel()} bytes for a {padded}-byte sample image")
        self.buffer = buffer[:padded]
        self._on_release = on_release
        self.buffer[:8] = torch.frombuffer(bytearray(struct.pack("<Q", len(raw))), dtype=torch.uint8)
        self.buffer[8:start] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        self.views = {}
        for name, (off, n) in offsets.items():
            dtype, shape = specs[name]
            self.views[name] = self.buffer[start + off:start + off + n].view(dtype).view(shape)

    @staticmethod
    def padded_size(specs: dict, metadata: dict | None = None) -> int:
        raw, _offsets, data = _layout(specs, metadata)
        size = 8 + len(raw) + data
        return size + (-size % ALIGN)

    def aligned(self) -> bool:
        return self.buffer.data_ptr() % ALIGN == 0

    def memory(self) -> memoryview:
        """The padded image (ALIGN-sized), as bytes for os.write."""
        return memoryview(self.buffer.numpy()).cast("B")

    def release(self) -> None:
        """The file is written (or given up): its bytes may be reused."""
        self.views = {}
        callback, self._on_release = self._on_release, None
        if callback is not None:
            callback()


def _layout(specs: dict, metadata: dict | None = None) -> tuple[bytes, dict[str, tuple[int, int]], int]:
    """(header JSON padded to 8 bytes, name -> (offset, nbytes), data bytes).
    safetensors puts `__metadata__` first; one key at most, as its map's order is not fixed."""
    order = sorted(specs, key=lambda k: (-_ENUM_ORDER.index(_ST_DTYPES[specs[k][0]]), k))
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offsets: dict[str, tuple[int, int]] = {}
    at = 0
    for name in order:
        dtype, shape = specs[name]
        n = _nbytes(dtype, shape)
        header[name] = {"dtype": _ST_DTYPES[dtype], "shape": list(shape), "data_offsets": [at, at + n]}
        offsets[name] = (at, n)
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    return raw + b" " * (-len(raw) % 8), offsets, at


def aligned_buffer(nbytes: int, pin: bool) -> torch.Tensor:
    """`nbytes` of uint8 starting at an ALIGN-aligned address, as O_DIRECT
    wants: the CPU allocator aligns to 64 bytes only, so ALIGN more are taken
    and the view starts at the first aligned byte."""
    block = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=pin)
    skip = -block.data_ptr() % ALIGN
    return block[skip:skip + nbytes]


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = dtype.itemsize
    for d in shape:
        n *= int(d)
    return n


def sample_image(tensors: dict[str, torch.Tensor], pin: bool = False, metadata: dict | None = None) -> SampleImage:
    """An image holding copies of host `tensors` (the CPU path and tests)."""
    image = SampleImage({k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}, pin=pin, metadata=metadata)
    for k, v in tensors.items():
        image.views[k].copy_(v)
    return image


def write_image(tmp: Path, image: SampleImage, direct: bool = False, sync: bool = False) -> bool:
    """Write the image to `tmp`, fsynced before close when `sync`. Returns
    whether O_DIRECT was used; a filesystem that refuses it (tmpfs: EINVAL)
    gets a buffered write of the same bytes."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    if direct and image.aligned() and hasattr(os, "O_DIRECT") and _write_direct(tmp, image, flags, sync):
        return True
    fd = os.open(tmp, flags, 0o644)
    try:
        _write_all(fd, image.memory()[:image.size])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return False


def _write_direct(tmp: Path, image: SampleImage, flags: int, sync: bool) -> bool:
    """The padded image with O_DIRECT, then cut to its size; False when the
    filesystem refuses O_DIRECT (EINVAL at the open or at the first write)."""
    try:
        fd = os.open(tmp, flags | os.O_DIRECT, 0o644)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        return False
    try:
        try:
            _write_all(fd, image.memory())
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            return False
        os.ftruncate(fd, image.size)
        if sync:    # the data is on disk already; this makes the size and blocks durable
            os.fsync(fd)
        return True
    finally:
        os.close(fd)


def _write_all(fd: int, data: memoryview) -> None:
    while data:
        n = os.write(fd, data)
        data = data[n:]
