"""The two JSON files at the root of a hidden-state output: data_config.json
(the expected count, `status`) and sample_lengths.json ({"idx": n_tokens}).

Where it sits: monitor/shards.py keeps one OutputJson per ShardMonitor; the
config gives the expected samples and tokens and whether the output is
complete, the lengths give token counts without reading sample headers.
Both files are stat'ed at every refresh rather than taken from the tree index:
other tools rewrite these small files in place, which no directory mtime
shows. A file that cannot be read is reported in `errors` (file -> why).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, BadDataConfig, read_data_config


class OutputJson:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.config: dict = {}
        self.config_key: list[int] | None = None
        self.lengths_key: list[int] | None = None
        self._lengths: dict[int, int] | None = None     # sample idx -> tokens; None: not read yet
        self.errors: dict[str, str] = {}                # file -> why it could not be read

    def restore(self, config_key: list[int] | None, config: dict, lengths_key: list[int] | None,
                errors: dict) -> None:
        """As a previous process left them (their keys say whether to read them again)."""
        self.config_key, self.config, self.lengths_key = config_key, config, lengths_key
        self.errors = {str(k): str(v) for k, v in errors.items()}

    def stat_key(self, name: str) -> list[int] | None:
        """[size, mtime_ns, inode] of a root file, None when there is none."""
        try:
            st = os.stat(self.root / name)
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns, st.st_ino]

    def _read_json(self, path: Path) -> dict | None:
        try:
            data = json.loads(path.read_text())
        except OSError as exc:
            self.errors[path.name] = f"{path}: unreadable ({exc.strerror})"
            return None
        except ValueError as exc:
            self.errors[path.name] = f"{path}: not valid JSON ({exc})"
            return None
        if not isinstance(data, dict):
            self.errors[path.name] = f"{path}: expected a JSON object, got {type(data).__name__}"
            return None
        self.errors.pop(path.name, None)
        return data

    def load_config(self) -> None:
        key = self.stat_key(DATA_CONFIG)
        if key == self.config_key:
            return
        self.config_key = key
        self.config = {}
        self.errors.pop(DATA_CONFIG, None)
        if key is not None:
            try:
                self.config = read_data_config(self.root, strict=True) or {}
            except BadDataConfig as exc:
                self.errors[DATA_CONFIG] = str(exc)

    def lengths_changed(self) -> bool:
        """Whether sample_lengths.json changed since it was last looked at
        (then it is read again when a token count needs it)."""
        key = self.stat_key(SAMPLE_LENGTHS)
        if key == self.lengths_key:
            return False
        self.lengths_key = key
        self._lengths = None
        self.errors.pop(SAMPLE_LENGTHS, None)
        return True

    def lengths(self) -> dict[int, int]:
        if self._lengths is not None:
            return self._lengths
        self._lengths = {}
        if self.lengths_key is None:
            return self._lengths
        path = self.root / SAMPLE_LENGTHS
        data = self._read_json(path)
        if data:
            try:
                self._lengths = {int(k): int(v) for k, v in data.items()}
            except (TypeError, ValueError):
                self.errors[SAMPLE_LENGTHS] = (
                    f"{path}: expected {{\"<sample idx>\": <n tokens>}} with integers")
        return self._lengths

    def config_int(self, key: str) -> int | None:
        """An integer data_config.json records: `total_samples` (ours, the
        seed's) or, in a speculators tree, its `data.num_samples`."""
        value = self.config.get(key)
        data = self.config.get("data")
        if value is None and key == "total_samples" and isinstance(data, dict):
            key, value = "data.num_samples", data.get("num_samples")
        if value is None:
            return None
        try:
            return int(value)
        except (TypeError, ValueError):
            self.errors[DATA_CONFIG + ":" + key] = (
                f"{self.root / DATA_CONFIG}: {key} should be an integer, got {value!r}")
            return None

    def complete(self, done: int) -> bool:
        if "status" in self.config:
            return self.config.get("status") == "complete"
        # The seed's data_config.json has no status: complete when all are there.
        total = self.config_int("total_samples")
        return bool(self.config) and total is not None and done >= total

    def error_text(self) -> str | None:
        return "; ".join(self.errors[k] for k in sorted(self.errors)) or None
