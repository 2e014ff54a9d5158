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

Data flow: config (hosts) -> (this) -> Snapshot.hosts -> status --json, the
GPU pane, alerts (host_unreachable).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from eagle3_console.entry import EntryError, str_list
from eagle3_console.model import GpuInfo, GpuProcess, HostGpus

READ_TIMEOUT_S = 2.0
MAX_BYTES = 8 << 20
MAX_HOSTS = 64
PATH = "/snapshot.json"
URL_RE = re.compile(r"https?://[A-Za-z0-9_.:\[\]-]+(:\d{1,5})?/?")


def parse(raw: Any) -> list[str]:
    """The pipeline file's `hosts`: a list of exporter URLs (http://host:port); EntryError when not."""
    urls = str_list("hosts", raw)
    if len(urls) > MAX_HOSTS:
        raise EntryError("hosts", f"{len(urls)} hosts; expected at most {MAX_HOSTS}")
    for i, url in enumerate(urls):
        if not URL_RE.fullmatch(url):
            raise EntryError(f"hosts[{i}]", f"{url!r}: expected an exporter's URL, e.g. "
                              "\"http://gpu-node-01:9457\"")
    return [u.rstrip("/") for u in urls]


def _fields(cls: type, d: dict) -> dict:
    names = cls.__dataclass_fields__
    return {k: v for k, v in d.items() if k in names}


def host_from(url: str, doc: Any) -> HostGpus:
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        return HostGpus(url, "bad_answer", reason="no snapshot in the answer (expected status --json's object)")
    gpus = []
    for g in doc["gpus"]:
        if not isinstance(g, dict) or not isinstance(g.get("index"), int):
            continue
        procs = [GpuProcess(**_fields(GpuProcess, p)) for p in g.get("processes") or []
                 if isinstance(p, dict) and isinstance(p.get("pid"), int)]
        gpus.append(GpuInfo(**dict(_fields(GpuInfo, g), processes=procs)))
    return HostGpus(url, "ok", host=str(doc.get("host") or "") or None, gpus=gpus,
                    reason=doc.get("gpus_unavailable"), time=doc.get("time"))


def fetch(url: str, timeout: float) -> HostGpus:
    import socket
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url + PATH, timeout=timeout) as resp:
            body = resp.read(MAX_BYTES + 1)
    except (socket.timeout, TimeoutError):
        return HostGpus(url, "no_answer", reason=f"no answer within {timeout:g} s")
    except urllib.error.HTTPError as exc:
        return HostGpus(url, "bad_answer", reason=f"HTTP {exc.code} from {url + PATH} (an exporter too old?)")
    except (urllib.error.URLError, OSError) as exc:
        why = getattr(exc, "reason", exc)
        if isinstance(why, (socket.timeout, TimeoutError)):
            return HostGpus(url, "no_answer", reason=f"no answer within {timeout:g} s")
        return HostGpus(url, "unreachable", reason=str(getattr(why, "strerror", None) or why))
    if len(body) > MAX_BYTES:
        return HostGpus(url, "bad_answer", reason=f"answer over {MAX_BYTES:,} bytes")
    try:
        return host_from(url, json.loads(body))
    except (ValueError, TypeError) as exc:
        return HostGpus(url, "bad_answer", reason=f"not a snapshot: {exc}")


def read(urls: list[str], timeout: float = READ_TIMEOUT_S) -> list[HostGpus]:
    """Every host's report, in the listed order, within `timeout` in all."""
    import threading        # only where hosts are listed: status --json without them never pays for it
    found: dict[str, HostGpus] = {}

    def one(url: str) -> None:
        found[url] = fetch(url, timeout)

    threads = [threading.Thread(target=one, args=(u,), name=f"eagle3-host-{i}", daemon=True)
               for i, u in enumerate(urls)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout + 0.5
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [found.get(u) or HostGpus(u, "no_answer", reason=f"no answer within {timeout:g} s") for u in urls]
