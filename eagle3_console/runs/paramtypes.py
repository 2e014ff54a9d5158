"""A param's value against its type where the op's own check is lenient:
a quoted number (`tp = "8"`) for a numeric param. runs.stage_params asks it
for every param of an op stage and every override of a custom one.
"""

from __future__ import annotations

from typing import Any


def quoted_number(default: Any, param: Any, value: Any) -> str | None:
    """A string where a number is wanted (`tp = "8"` in the pipeline file, `--set tp='"8"'`):
    the op's argparse would take "8", but the console would carry and compare a
    string (the plan, tp x dp against the GPUs, a restart's halving). Said with the
    fix; None when `value` is no quoted number or the param takes text."""
    if param is not None:
        if param.convert is not None or param.const is not None:
            return None
        kind = param.kind
        default = param.default
    else:
        kind = type(default) if isinstance(default, (int, float)) and not isinstance(default, bool) else None
    if kind not in (int, float) or not isinstance(value, str):
        return None
    return (f"expected {'an integer' if kind is int else 'a number'} (default {default!r}), got the string "
            f"{value!r}: write it without quotes")
