"""The hidden-state data format (shared/DESIGN.md), readable without torch.

<output>/data_config.json, <output>/sample_lengths.json,
<output>/rows_<a>-<b>/data_<idx>.safetensors (one sample, written *.tmp then renamed).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from ops.common import TMP_SUFFIX

SHARD_ROWS = 2000
DATA_CONFIG = "data_config.json"
SAMPLE_LENGTHS = "sample_lengths.json"
SHARD_DIR_RE = re.compile(r"^rows_(\d+)-(\d+)$")
SAMPLE_RE = re.compile(r"^(?:data|hs)_(\d+)\.(safetensors|pt|ckpt)$")
# A header larger than this is not a sample file (safetensors caps at 100 MB).
MAX_HEADER = 100_000_000


def shard_dir_name(idx: int, rows: int = SHARD_ROWS) -> str:
    start = (idx // rows) * rows
    return f"rows_{start}-{start + rows}"


def sample_path(output: Path, idx: int) -> Path:
    return output / shard_dir_name(idx) / f"data_{idx}.safetensors"


class BadDataConfig(ValueError):
    """data_config.json missing, unreadable, not JSON or not a JSON object; the
    message names the file and why."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def read_data_config(output: Path, strict: bool = False) -> dict | None:
    """<output>/data_config.json, the one reader of it. Not strict: None when the
    file is missing, unreadable, not JSON or not an object (readers that only
    consult it); strict: BadDataConfig saying which instead."""
    path = Path(output) / DATA_CONFIG
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        why, missing = f"{path}: unreadable ({exc.strerror})", isinstance(exc, FileNotFoundError)
    except ValueError as exc:
        why, missing = f"{path}: not valid JSON ({exc})", False
    else:
        if isinstance(data, dict):
            return data
        why, missing = f"{path}: expected a JSON object, got {type(data).__name__}", False
    if strict:
        raise BadDataConfig(why, missing)
    return None


class BadSampleFile(ValueError):
    """A sample file that is truncated, unreadable or not safetensors."""


def read_safetensors_header(path: Path) -> tuple[dict, int]:
    """(header, expected file size) from the first bytes only; no tensor data read."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise BadSampleFile(f"{path}: {len(head)} bytes, shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER:
                raise BadSampleFile(f"{path}: header length {n} is not plausible")
            raw = fh.read(n)
    except OSError as exc:
        raise BadSampleFile(f"{path}: unreadable ({exc.strerror})") from exc
    if len(raw) < n:
        raise BadSampleFile(f"{path}: truncated inside its header")
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise BadSampleFile(f"{path}: header is not JSON ({exc})") from exc
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            end = max(end, int(info["data_offsets"][1]))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise BadSampleFile(f"{path}: tensor {key!r} has no data_offsets") from exc
    return header, 8 + n + end


def check_whole(path: Path, size: int | None = None) -> dict:
    """The header of a whole safetensors file; BadSampleFile if it is truncated."""
    header, expected = read_safetensors_header(path)
    actual = path.stat().st_size if size is None else size
    if actual < expected:
        raise BadSampleFile(f"{path}: truncated ({actual} of {expected} bytes)")
    return header


def partial_samples(root: Path) -> list[Path]:
    """The partial leftovers of a sample output: temp files, and sample files
    that are truncated or unreadable (extract's, and a custom stage's that
    writes this layout: what `clean` moves; a whole sample is a resume point)."""
    out: list[Path] = []
    if not root.is_dir():
        return out
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            continue
        if path.name.endswith(TMP_SUFFIX):
            out.append(path)
            continue
        m = SAMPLE_RE.match(path.name)
        if m and m.group(2) == "safetensors":
            try:
                check_whole(path)
            except BadSampleFile:
                out.append(path)
    return out


def tokens_in_header(header: dict) -> int | None:
    """A sample's token count: its `input_ids` length, else speculators' `token_ids`
    (its hs_<i>.safetensors: hidden_states [T, layers, H] and token_ids [T])."""
    for key in ("input_ids", "token_ids"):
        info = header.get(key)
        if isinstance(info, dict) and info.get("shape"):
            return int(info["shape"][0])
    return None
