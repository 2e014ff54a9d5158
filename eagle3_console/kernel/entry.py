"""Checks of one pipeline-file entry for the modules that parse their own part
of it (slurmparams.py, configchecks.py's `hosts`), without importing config
(which calls them): an EntryError names the key and what was expected;
config.py makes it the ConfigError that names the file (exit 3)."""

from __future__ import annotations

from typing import Any

NAMES = {str: "a string", int: "an integer", list: "a list", dict: "a table", bool: "true or false"}


class EntryError(ValueError):
    def __init__(self, key: str, message: str):
        self.key, self.message = key, message
        super().__init__(f"{key}: {message}")


def expect(key: str, value: Any, t: type) -> Any:
    if not isinstance(value, t) or (t is int and isinstance(value, bool)):
        raise EntryError(key, f"expected {NAMES.get(t, t.__name__)}, got {type(value).__name__} {value!r}")
    return value


def str_list(key: str, value: Any) -> list[str]:
    expect(key, value, list)
    for i, v in enumerate(value):
        expect(f"{key}[{i}]", v, str)
    return list(value)
