"""The SGLang server flags an operator adds (`extra_args`), as two stages take
them: serve (`python -m sglang.launch_server`, ops/serve/command.py) and
extract's engine sglang (ops/extract/sglang_args.py). One reading of the
param and of a flag's name, below both stages.
"""

from __future__ import annotations

import json
from typing import Any, Sequence


def extra_args_of(value: Any) -> list[str]:
    """The extra_args param: a list of strings, or the JSON of one (as the argv carries it)."""
    if value in (None, ""):
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise ValueError(f"extra_args: expected a list of strings (JSON), got {value!r}") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"extra_args: expected a list of strings, got {value!r}")
    return list(value)


def flags(args: Sequence[str]) -> list[str]:
    """The flag names of argv words (`--x 2` and `--x=2` both give `--x`)."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]
