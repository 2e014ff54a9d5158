"""Checks of single values of the pipeline file (and of `--set`): what each
returns is the problem in words, or None; config.py raises it as a
ConfigError naming the file and the key (exit 3).

Every number that enters through the pipeline file is bounded here where the
type alone lets nonsense through: a NaN backoff compares false with
everything (no wait at all), 1e300 seconds is a wait no clock reaches, a GPU
index of -1 or 99999999999 is passed to CUDA_VISIBLE_DEVICES as it is.
The `hosts` list (other nodes' exporters, read by monitor/hosts.py) is
checked here too: parse_hosts raises the EntryError that names hosts[i].
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterator

from eagle3_console.kernel.entry import EntryError, str_list
from eagle3_console.kernel.text import printable

# A day: longer than any backoff an operator means (and what `watch --interval` takes at most).
MAX_BACKOFF_S = 86400.0
# Restarts of one failure chain; a policy that needs more is a stage that never works.
MAX_RESTARTS = 100
# CUDA and NVML index devices from 0; no host has a thousand of them.
MAX_GPU_INDEX = 1023

# Levels from the top of the file (stages.x.params.y is 4): params are scalars and short lists;
# deeper is a mistake, and at some hundreds every recursive walk of them dies of RecursionError.
MAX_DEPTH = 32

# Other nodes' exporters a pipeline file lists (`hosts`): a cluster's nodes, not thousands.
MAX_HOSTS = 64
HOST_URL_RE = re.compile(r"https?://[A-Za-z0-9_.:\[\]-]+(:\d{1,5})?/?")
DEFAULT_PORT = {"http": 80, "https": 443}


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


def parse_hosts(raw: Any) -> list[str]:
    """The pipeline file's `hosts`: a list of exporter URLs (http://host:port), each once; EntryError when not."""
    urls = str_list("hosts", raw)
    if len(urls) > MAX_HOSTS:
        raise EntryError("hosts", f"{len(urls)} hosts; expected at most {MAX_HOSTS}")
    if not urls:
        return []
    from urllib.parse import urlsplit      # only where hosts are listed (status --json's import cost)
    seen: dict[tuple, int] = {}
    for i, url in enumerate(urls):
        if not HOST_URL_RE.fullmatch(url):
            raise EntryError(f"hosts[{i}]", f"{printable(url)!r}: expected an exporter's URL, e.g. "
                             "\"http://gpu-node-01:9457\"")
        parts = urlsplit(url)
        if not parts.hostname:
            raise EntryError(f"hosts[{i}]", f"{url!r}: no host name; expected e.g. \"http://gpu-node-01:9457\"")
        try:
            port = parts.port
        except ValueError:
            port = -1
        if port is None:
            port = DEFAULT_PORT[parts.scheme]
        elif not 1 <= port <= 65535:
            said = parts.netloc.rpartition(":")[2]
            raise EntryError(f"hosts[{i}]", f"{url!r}: port {said} out of range; expected 1 to 65535")
        key = (parts.scheme, (parts.hostname or "").lower(), port)
        if key in seen:
            raise EntryError(f"hosts[{i}]", f"{url!r} is listed twice (hosts[{seen[key]}] is the same "
                             "exporter); expected each host once")
        seen[key] = i
    return [u.rstrip("/") for u in urls]
