"""The output directory of extract (layout: shared/DESIGN.md, ops/formats.py).

Sits at the end of the extraction and the start of verify / train / the shard
monitor: `data_config.json` (status "running" first, "complete" at the end),
`sample_lengths.json`, `rows_<a>-<b>/data_<idx>.safetensors`. Also what a
resumed run needs: which samples exist, which temp files are stale, and
whether the existing output was made with the same layers and shapes.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from ops.common import TMP_SUFFIX, BadInput, write_json_atomic
from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, SAMPLE_RE, SHARD_DIR_RE, read_data_config

DATA_FORMAT_VERSION = 1
# Keys that must match between a resumed run and the output it continues.
_RESUME_KEYS = ("layer_ids", "hidden_size", "dtype", "format", "max_seq_len", "total_samples",
                "final_hidden_state", "data_format_version")
# What an output written before the key existed holds.
_RESUME_DEFAULTS = {"format": "bf16"}


def scan_existing(output: Path) -> tuple[set[int], list[Path]]:
    """(indices whose sample file exists, stale *.tmp files) under the shard dirs."""
    done: set[int] = set()
    tmps: list[Path] = []
    if not output.is_dir():
        return done, tmps
    with os.scandir(output) as top:
        shard_dirs = [e.path for e in top if e.is_dir() and SHARD_DIR_RE.match(e.name)]
    for shard in shard_dirs:
        with os.scandir(shard) as entries:
            for entry in entries:
                if entry.name.endswith(TMP_SUFFIX):
                    tmps.append(Path(entry.path))
                    continue
                m = SAMPLE_RE.match(entry.name)
                if m and m.group(2) == "safetensors":
                    done.add(int(m.group(1)))
    return done, tmps


def check_resumable(output: Path, planned: dict) -> dict | None:
    """The existing data_config, or None; BadInput if it describes other data."""
    path = output / DATA_CONFIG
    existing = read_data_config(output)
    if existing is None:
        if path.exists():
            raise BadInput(f"{path}: exists but is not a JSON object; move it away to start over")
        return None
    def there(k):
        return existing.get(k, _RESUME_DEFAULTS.get(k))

    diffs = [f"{k}: {there(k)!r} there, {planned.get(k)!r} now"
             for k in _RESUME_KEYS if there(k) is not None and k in planned and there(k) != planned.get(k)]
    if diffs:
        from ops.hidden_formats import BadFormat

        if any(d.startswith("format:") for d in diffs):
            raise BadFormat(f"{path}: the output holds another format than this run would write "
                            f"({'; '.join(diffs)}); a run keeps one format: resume with the output's, or use "
                            f"another output directory (nothing was rewritten)")
        raise BadInput(f"{path}: the output holds other data than this run would write "
                       f"({'; '.join(diffs)}); use another output directory or delete this one")
    return existing


def package_versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "transformers", "safetensors", "numpy"):
        module = sys.modules.get(name)
        if module is None:
            try:
                module = __import__(name)
            except ImportError:
                continue
        out[name] = getattr(module, "__version__", "unknown")
    return out


def write_data_config(output: Path, config: dict) -> None:
    output.mkdir(parents=True, exist_ok=True)
    write_json_atomic(output / DATA_CONFIG, config)


def rewrite_data_config(output: Path, config: dict) -> bool:
    """Write data_config.json on a full disk: atomically when a temp file still
    fits, else in place (the old file's blocks hold the new text: the status
    word changed, hardly the size). False when neither could be written."""
    path = output / DATA_CONFIG
    try:
        write_json_atomic(path, config)
        return True
    except OSError:
        Path(str(path) + TMP_SUFFIX).unlink(missing_ok=True)
    text = json.dumps(config, indent=2) + "\n"
    try:
        # Only into blocks the file already holds: a write that ran out of
        # space half-way would leave no readable data_config at all.
        if len(text.encode()) > os.stat(path).st_blocks * 512:
            return False
        with open(path, "r+") as fh:
            fh.write(text)
            fh.truncate()
            fh.flush()
            os.fsync(fh.fileno())
        return True
    except OSError:
        return False


def write_sample_lengths(output: Path, lengths: dict[int, int]) -> None:
    write_json_atomic(output / SAMPLE_LENGTHS, {str(i): int(n) for i, n in sorted(lengths.items())})
