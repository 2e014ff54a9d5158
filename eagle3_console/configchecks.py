"""Checks of single values of the pipeline file (and of `--set`): what each
returns is the problem in words, or None; config.py raises it as a
ConfigError naming the file and the key (exit 3).

Every number that enters through the pipeline file is bounded here where the
type alone lets nonsense through: a NaN backoff compares false with
everything (no wait at all), 1e300 seconds is a wait no clock reaches, a GPU
index of -1 or 99999999999 is passed to CUDA_VISIBLE_DEVICES as it is.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

# A day: longer than any backoff an operator means (and what `watch --interval` takes at most).
MAX_BACKOFF_S = 86400.0
# Restarts of one failure chain; a policy that needs more is a stage that never works.
MAX_RESTARTS = 100
# CUDA and NVML index devices from 0; no host has a thousand of them.
MAX_GPU_INDEX = 1023

# Levels from the top of the file (stages.x.params.y is 4): params are scalars and short lists;
# deeper is a mistake, and at some hundreds every recursive walk of them dies of RecursionError.
MAX_DEPTH = 32


def too_deep(value: Any, key: str = "", depth: int = 0) -> str | None:
    """The key of the first value nested deeper than MAX_DEPTH, or None. A
    600-deep array parsed here would fail later in every recursive walk of
    params (json.dumps, the type checks) with a RecursionError."""
    if depth > MAX_DEPTH:
        return key or "(value)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = too_deep(v, f"{key}.{k}" if isinstance(k, str) and key else (k if isinstance(k, str) else key),
                         depth + 1)
        if found:
            return found
    return None


def nul_key(value: Any, key: str = "") -> str | None:
    """The key of the first string (value or key) holding a NUL, or None.
    A NUL cannot cross exec() (argv, the environment): a run started with one
    dies in its supervisor before its stage starts, with nothing said."""
    if isinstance(value, str):
        return (key or "(value)") if "\x00" in value else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        here = f"{key}.{k}" if key else str(k)
        if isinstance(k, str) and "\x00" in k:
            return here
        found = nul_key(v, here if isinstance(k, str) else f"{key}[{k}]")
        if found:
            return found
    return None


def gpu_problems(gpus: list[int]) -> Iterator[tuple[int, str]]:
    """(position, what is wrong) for each index of a stage's `gpus` that is
    negative, absurd or named twice (CUDA_VISIBLE_DEVICES stops at the first
    invalid index, and a device listed twice is one device)."""
    seen: set[int] = set()
    for i, g in enumerate(gpus):
        if not 0 <= g <= MAX_GPU_INDEX:
            yield i, f"expected a GPU index from 0 to {MAX_GPU_INDEX}, got {g}"
        elif g in seen:
            yield i, f"GPU {g} is listed twice; expected each GPU once"
        seen.add(g)


def restart_max_problem(value: int) -> str | None:
    if not 0 <= value <= MAX_RESTARTS:
        return f"expected a number of restarts from 0 to {MAX_RESTARTS}, got {value}"
    return None


def backoff_problem(value: float) -> str | None:
    if not (math.isfinite(value) and 0 <= value <= MAX_BACKOFF_S):
        return f"expected a finite number of seconds from 0 to {MAX_BACKOFF_S:g}, got {value!r}"
    return None
