"""Writes of train's checkpoints and export's files that name the file on a full disk.

torch.save into a path fails on ENOSPC with PyTorch's own RuntimeError
(`[enforce fail at inline_container.cc:672] . unexpected pos`), safetensors'
save_file with a SafetensorError (`... (os error 28)`), and a buffered
Python write with an OSError that names no file: none says which file or
that the disk is full. Here every byte goes through a Python write whose
OSError is kept and re-raised with the file's name, so train and export can
end with one line (`<file>: No space left on device (ENOSPC)`) and exit 2,
as extract does (ops/extract/run.py).
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from ops.common import DISK_FULL, disk_full_text  # noqa: F401 - train's names for them


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


@contextlib.contextmanager
def naming(path: Path):
    """An OSError raised inside that names no file is re-raised naming `path`."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


class _KeepError(io.RawIOBase):
    """A raw file whose first OSError is kept: torch.save turns it into its own RuntimeError."""

    def __init__(self, fh) -> None:
        self.fh, self.error = fh, None

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        try:
            return self.fh.write(b)
        except OSError as exc:
            self.error = self.error or exc
            raise


def _sync(fh) -> None:
    fh.flush()
    os.fsync(fh.fileno())


def write_bytes(path: Path, data: bytes | memoryview) -> None:
    """`data` into `path`, fsynced."""
    with naming(path), open(path, "wb") as fh:
        fh.write(data)
        _sync(fh)


def write_text(path: Path, text: str) -> None:
    write_bytes(path, text.encode())


def torch_save(obj, path: Path) -> None:
    """torch.save into `path`, fsynced; a write's OSError comes out as itself, naming the file."""
    import torch

    with naming(path), open(path, "wb", buffering=0) as raw:
        keep = _KeepError(raw)
        try:
            with io.BufferedWriter(keep, buffer_size=1 << 20) as fh:
                torch.save(obj, fh)
        except (RuntimeError, OSError):
            if keep.error is not None:
                raise OSError(keep.error.errno, keep.error.strerror, str(path)) from None
            raise
        os.fsync(raw.fileno())


def save_safetensors(tensors: dict, path: Path, metadata: dict | None = None) -> None:
    """safetensors' bytes for `tensors` (safetensors.torch.save: the same bytes
    save_file writes), written by Python so that a full disk names the file."""
    from safetensors.torch import save

    data = save({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, metadata=metadata)
    write_bytes(path, data)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
