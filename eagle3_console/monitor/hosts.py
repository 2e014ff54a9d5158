"""Other nodes' GPUs: the exporters a pipeline file's `hosts` lists, read in one bounded pass.

    hosts = ["http://gpu-node-01:9457", "http://gpu-node-02:9457"]

Each node runs `eagle3-console exporter --host 0.0.0.0` on its workspace (the
shared one); its `/snapshot.json` is the snapshot its sampler last took. One
thread a host, all started at once, each reading with a socket timeout, and
the pass waits for them together at most READ_TIMEOUT_S: a node that is down
(connection refused, no route) shows as `unreachable`, one that accepts and
then says nothing (a hung process, SIGSTOP) as `no_answer` once the time is
up, and a thread still stuck then is left behind (a daemon) so neither the
TUI's collector nor `status` waits longer than that.

What a host sends is outside input, bounded and checked before anything
shows it (a host that breaks a bound is `bad_answer`, with the first thing
wrong as its reason): at most MAX_BYTES of answer, nested at most MAX_DEPTH
levels (checked on the bytes, before the JSON parser recurses), JSON without
NaN or Infinity, at most MAX_GPUS GPUs and MAX_PROCESSES processes a GPU,
every field the type and range a snapshot's has (a byte count an integer in
0..MAX_BYTE_COUNT, util 0..100, ...). Only the fields read are kept (the
GpuInfo / GpuProcess model), so nothing else of the answer is relayed (by
status --json or this node's own exporter); text is cut to MAX_TEXT
characters and control characters are escaped as the console escapes logs
(text.py: ANSI sequences dropped, the rest as repr() writes them), so a
host's name never sets a terminal's title or clears it.

Data flow: config (`hosts`, its URLs checked at load by configchecks.py) ->
(this) -> Snapshot.hosts -> status --json, the GPU pane, alerts (host_unreachable).
"""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any, Callable

from eagle3_console.kernel.model import GpuInfo, GpuProcess, HostGpus
from eagle3_console.kernel.text import clip

READ_TIMEOUT_S = 2.0
MAX_BYTES = 8 << 20
MAX_GPUS = 64               # a host's GPUs (a node has 8 or 16)
MAX_PROCESSES = 256         # one GPU's processes
MAX_DEPTH = 64              # the GPUs nest 5 levels; a stage's params (up to 32 in eagle3.toml) and records more
MAX_TEXT = 200              # characters kept of a name, a reason
MAX_BYTE_COUNT = 1 << 50    # 1 PiB: no GPU holds more (and a float keeps it exact)
MAX_INDEX = 4095
PATH = "/snapshot.json"


class Bad(ValueError):
    """The answer breaks a bound or holds a field of the wrong type: the host's reason."""


def _said(v: Any) -> str:
    """A value as a reason quotes it: its type and a short, escaped repr."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        try:
            return f"a {len(str(abs(v))):,}-digit integer"
        except ValueError:          # past Python's int-to-text limit (the parser refuses those)
            return f"an integer of about {int(v.bit_length() * 0.30103) + 1:,} digits"
    return f"{type(v).__name__} {clip(repr(v), 40)}"


def _text(v: Any, where: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str):
        raise Bad(f"{where}: expected a string, got {_said(v)}")
    return clip(v, MAX_TEXT)


def _opt_text(v: Any, where: str) -> str | None:
    return None if v is None else _text(v, where)


def _num(x: float) -> str:
    return "2^50" if x == MAX_BYTE_COUNT else f"{x:,}" if isinstance(x, int) else f"{x:g}"


def _number(v: Any, where: str, lo: float, hi: float, integer: bool = True) -> Any:
    if v is None:
        return None
    ok = isinstance(v, int) if integer else isinstance(v, (int, float))
    what = f"{'an integer' if integer else 'a number'} from {_num(lo)} to {_num(hi)}"
    if isinstance(v, bool) or not ok:
        raise Bad(f"{where}: expected {what}, got {_said(v)}")
    if not (lo <= v <= hi) or (isinstance(v, float) and not math.isfinite(v)):
        raise Bad(f"{where}: {_said(v)} out of range; expected {what}")
    return v


def _needed(d: dict, key: str, where: str) -> Any:
    if d.get(key) is None:
        raise Bad(f"{where}: no {key}")
    return d[key]


def _flag(v: Any, where: str) -> bool:
    if v is None:
        return False
    if not isinstance(v, bool):
        raise Bad(f"{where}: expected true or false, got {_said(v)}")
    return v


def _items(v: Any, where: str, most: int, noun: str = "entries") -> list:
    if v is None:
        return []
    if not isinstance(v, list):
        raise Bad(f"{where}: expected a list, got {_said(v)}")
    if len(v) > most:
        raise Bad(f"{where}: {len(v):,} {noun}; at most {most:,} are read")
    return v


def _process(p: Any, where: str) -> GpuProcess:
    if not isinstance(p, dict):
        raise Bad(f"{where}: expected an object, got {_said(p)}")
    return GpuProcess(
        pid=_number(_needed(p, "pid", where), f"{where}.pid", 0, 1 << 31),
        used_bytes=_number(p.get("used_bytes"), f"{where}.used_bytes", 0, MAX_BYTE_COUNT),
        name=_text(p.get("name"), f"{where}.name"),
        run_id=_number(p.get("run_id"), f"{where}.run_id", 0, 1 << 62),
        stage=_opt_text(p.get("stage"), f"{where}.stage"),
        how=_opt_text(p.get("how"), f"{where}.how"),
        type=_text(p.get("type", "compute"), f"{where}.type"),
        create_time=_number(p.get("create_time"), f"{where}.create_time", 0, 1e11, integer=False),
        visible=True if p.get("visible") is None else _flag(p.get("visible"), f"{where}.visible"))


def _gpu(g: Any, i: int) -> GpuInfo:
    if not isinstance(g, dict):
        raise Bad(f"gpus[{i}]: expected an object, got {_said(g)}")
    index = _number(_needed(g, "index", f"gpus[{i}]"), f"gpus[{i}].index", 0, MAX_INDEX)
    at = f"GPU {index}"
    unsupported = [_text(u, f"{at} unsupported") for u in _items(g.get("unsupported"), f"{at} unsupported", 32)]
    return GpuInfo(
        index=index, name=_text(g.get("name"), f"{at} name"), uuid=_text(g.get("uuid"), f"{at} uuid"),
        mem_used=_number(g.get("mem_used"), f"{at} mem_used", 0, MAX_BYTE_COUNT),
        mem_total=_number(g.get("mem_total"), f"{at} mem_total", 0, MAX_BYTE_COUNT),
        util_pct=_number(g.get("util_pct"), f"{at} util_pct", 0, 100, integer=False),
        temp_c=_number(g.get("temp_c"), f"{at} temp_c", -100, 300, integer=False),
        power_w=_number(g.get("power_w"), f"{at} power_w", 0, 1e5, integer=False),
        processes=[_process(p, f"{at} processes[{j}]")
                   for j, p in enumerate(_items(g.get("processes"), f"{at} processes", MAX_PROCESSES,
                                                                  "processes"))],
        error=_opt_text(g.get("error"), f"{at} error"), lost=_flag(g.get("lost"), f"{at} lost"),
        unsupported=unsupported)


def host_from(url: str, doc: Any) -> HostGpus:
    """The host as its parsed answer says it: every field checked (see the module's doc)."""
    if not isinstance(doc, dict) or "gpus" not in doc:
        return HostGpus(url, "bad_answer", reason="no snapshot in the answer (expected status --json's object)")
    try:
        raw = _items(doc.get("gpus"), "gpus", MAX_GPUS, "GPUs")
        gpus = [_gpu(g, i) for i, g in enumerate(raw)]
        host = _text(doc.get("host"), "host") or None
        reason = _opt_text(doc.get("gpus_unavailable"), "gpus_unavailable")
        when = _number(doc.get("time"), "time", 0, 1e11, integer=False)
    except Bad as exc:
        return HostGpus(url, "bad_answer", reason=clip(str(exc), 300))
    return HostGpus(url, "ok", host=host, gpus=gpus, reason=reason, time=when)


def nesting(body: bytes, most: int = MAX_DEPTH) -> int | None:
    """How deep the JSON in `body` nests when deeper than `most`, else None;
    at C speed (strings dropped, then a pass per level that removes the
    innermost bracket pairs), before the parser recurses."""
    if body.count(b"[") + body.count(b"{") <= most:
        return None
    if b'"' in body:
        # Strings dropped: escaped backslashes, then escaped quotes, then every
        # other quoted run (split keeps what lies between the strings).
        body = b"".join(body.replace(b"\\\\", b"").replace(b'\\"', b"").split(b'"')[::2])
    brackets = body.translate(None, _NOT_BRACKET)
    for _level in range(most):
        if not brackets:
            return None
        shorter = _PAIR.sub(b"", brackets)      # one level a pass: "{[]}" loses "[]" only
        if len(shorter) == len(brackets):
            return None         # unbalanced: the parser says what is wrong
        brackets = shorter
    return most + 1 if brackets else None


_PAIR = re.compile(rb"\[\]|\{\}")
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def _no_constant(name: str) -> Any:
    raise Bad(f"{name} in the answer: JSON has no NaN or Infinity")


def parse_answer(url: str, body: bytes) -> HostGpus:
    """A host's /snapshot.json answer as the host it says (bad_answer, with why, when it breaks a bound)."""
    if len(body) > MAX_BYTES:
        return HostGpus(url, "bad_answer", reason=f"answer over {MAX_BYTES:,} bytes; at most {MAX_BYTES:,} are read")
    deep = nesting(body)
    if deep is not None:
        return HostGpus(url, "bad_answer", reason=f"answer nested more than {MAX_DEPTH} levels deep; "
                        f"at most {MAX_DEPTH} are read")
    try:
        doc = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        return HostGpus(url, "bad_answer", reason=clip(f"not a snapshot: {exc}", 300))
    return host_from(url, doc)


def fetch(url: str, timeout: float) -> HostGpus:
    import http.client
    import socket
    import urllib.error
    try:
        with _opener().open(url + PATH, timeout=timeout) as resp:
            body = resp.read(MAX_BYTES + 1)
    except (socket.timeout, TimeoutError):
        return HostGpus(url, "no_answer", reason=f"no answer within {timeout:g} s")
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            to = clip(str(exc.headers.get("Location") or "nowhere"), 120)
            return HostGpus(url, "bad_answer", reason=f"HTTP {exc.code} from {url + PATH}, a redirect to {to} "
                            "(not followed)")
        return HostGpus(url, "bad_answer", reason=f"HTTP {exc.code} from {url + PATH} (an exporter too old?)")
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, (socket.timeout, TimeoutError)):
            return HostGpus(url, "no_answer", reason=f"no answer within {timeout:g} s")
        return HostGpus(url, "unreachable", reason=clip(str(getattr(why, "strerror", None) or why), MAX_TEXT))
    except http.client.HTTPException as exc:     # BadStatusLine, a broken chunk, too many headers...
        return HostGpus(url, "bad_answer", reason=clip(f"not HTTP: {type(exc).__name__} {exc}", MAX_TEXT))
    return parse_answer(url, body)


def _opener() -> Any:
    """urllib without its redirect handler: an exporter answers /snapshot.json itself, and a
    redirect (to another host, another port) is said as the listed host's answer, not followed."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *_args: Any, **_kw: Any) -> None:
            return None
    return urllib.request.build_opener(NoRedirect)


def read(urls: list[str], timeout: float = READ_TIMEOUT_S,
         fetch_one: Callable[[str, float], HostGpus] = fetch) -> list[HostGpus]:
    """Every host's report, in the listed order, within `timeout` in all."""
    import threading        # only where hosts are listed: status --json without them never pays for it
    found: dict[str, HostGpus] = {}

    def one(url: str) -> None:
        try:
            found[url] = fetch_one(url, timeout)
        except Exception as exc:  # noqa: BLE001 - whatever a host sends ends as its reason, never a thread's traceback
            found[url] = HostGpus(url, "bad_answer",
                                  reason=clip(f"reading it failed: {type(exc).__name__}: {exc}", MAX_TEXT))

    threads = [threading.Thread(target=one, args=(u,), name=f"eagle3-host-{i}", daemon=True)
               for i, u in enumerate(urls)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 0.5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [found.get(u) or HostGpus(u, "no_answer", reason=f"no answer within {timeout:g} s") for u in urls]
