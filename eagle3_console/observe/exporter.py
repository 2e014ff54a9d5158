"""`eagle3-console exporter`: the snapshot as Prometheus metrics (prometheus-client).

Data flow: snapshot.Collector -> (a background thread, one collect() a refresh
interval) -> metric families built once from that snapshot and cached -> every
scrape yields the cached families. A scrape never samples: a dashboard that
scrapes every second costs one collect() an interval all the same, and a slow
NVML or disk never holds a scrape up.

Names follow Prometheus' conventions: the `eagle3_` prefix, base units in the
name (bytes, seconds, celsius, watts, ratio for 0..1), `_total` only on
counters. GPU series carry nvitop-exporter's label names (hostname, index,
devicename, uuid) so a dashboard's GPU panels join on them. The metric list is
in README ("Prometheus exporter").

Never imports textual or torch (tests/test_exporter.py checks it in the
exporter's own process).
"""

from __future__ import annotations

import json
import math
import signal
import threading
import time
from typing import Any, Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import CollectorRegistry

from eagle3_console.kernel.model import LEVEL_EXIT, Snapshot, StageOnly, StageStatus
from eagle3_console.kernel.registry import RunStatus

STATUSES = (StageOnly.NEVER, *RunStatus)       # a stage's: never ran, else its latest run's
HEALTH = ("ok", "warning", "critical", "unknown")


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


class _Families:
    """Gauges by name, created on first use; labels fixed per name."""

    def __init__(self) -> None:
        self._by_name: dict[str, Any] = {}

    def gauge(self, name: str, doc: str, labels: dict[str, str], value: Any) -> None:
        v = _num(value)
        if v is None:
            return                 # unknown is no sample, never a 0 that reads as a value
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = GaugeMetricFamily(name, doc, labels=list(labels))
        fam.add_metric([str(x) for x in labels.values()], v)

    def info(self, name: str, doc: str, info: dict[str, str], labels: dict[str, str] | None = None) -> None:
        """`name`_info{labels, info} 1 (the name is given without _info)."""
        labels = labels or {}
        fam = self._by_name.get(name)
        if fam is None:
            fam = self._by_name[name] = InfoMetricFamily(name, doc, labels=list(labels))
        fam.add_metric([str(x) for x in labels.values()], {k: str(v) for k, v in info.items()})

    def all(self) -> list[Any]:
        return list(self._by_name.values())


def families(snap: Snapshot) -> list[Any]:
    """Every metric family of one snapshot."""
    f = _Families()
    f.info("eagle3", "The console's workspace and host.",
           {"workspace": snap.workspace, "host": snap.host, "schema": str(snap.schema)})
    f.gauge("eagle3_snapshot_timestamp_seconds", "When the snapshot was taken (Unix time).", {}, snap.time)
    for level in HEALTH:
        f.gauge("eagle3_health", "1 for the workspace's health level (worst alert), 0 for the others.",
                {"level": level}, 1 if snap.health == level else 0)
    f.gauge("eagle3_health_exit_code", "status's exit code: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN.", {},
            LEVEL_EXIT[snap.health])
    _alerts(f, snap)
    _gpus(f, snap)
    for st in snap.stages:
        _stage(f, st)
    for d in snap.disk:
        lab = {"stage": d.stage, "path": d.path}
        f.gauge("eagle3_output_written_bytes", "Bytes written under the output so far.", lab, d.written_bytes)
        f.gauge("eagle3_output_files", "Files under the output.", lab, d.files)
        f.gauge("eagle3_output_estimate_bytes", "The stage's disk estimate before it ran.", lab, d.estimate_bytes)
        f.gauge("eagle3_output_projected_bytes", "Written bytes / fraction done: the size it is heading to.",
                lab, d.projected_bytes)
        f.gauge("eagle3_output_free_bytes", "Free bytes on the output's file system.", lab, d.free_bytes)
        f.gauge("eagle3_output_filesystem_size_bytes", "Size of the output's file system.", lab, d.total_bytes)
        if d.fits is not None:
            f.gauge("eagle3_output_fits", "1 when the projected remainder fits in the free space, 0 when short.",
                    lab, 1 if d.fits else 0)
    return f.all()


def _alerts(f: _Families, snap: Snapshot) -> None:
    counts: dict[tuple[str, str], int] = {}
    for a in snap.alerts:
        counts[(a.level, a.code)] = counts.get((a.level, a.code), 0) + 1
    for (level, code), n in sorted(counts.items()):
        f.gauge("eagle3_alerts", "Alerts now, by level and code (status --json's alerts).",
                {"level": level, "code": code}, n)
    for a in snap.alerts:
        if a.stage:
            f.gauge("eagle3_stage_alert", "1 per alert a stage has now, by level and code.",
                    {"stage": a.stage, "level": a.level, "code": a.code}, 1)


def _gpus(f: _Families, snap: Snapshot) -> None:
    rep = snap.gpus
    f.gauge("eagle3_gpus_available", "1 when NVML answers, 0 when it is unavailable (see eagle3_gpus_unavailable_info).",
            {}, 1 if rep.available else 0)
    if not rep.available:
        f.info("eagle3_gpus_unavailable", "Why NVML is unavailable.", {"reason": rep.reason or ""})
        return
    for g in rep.gpus:
        lab = {"hostname": snap.host, "index": str(g.index), "devicename": g.name, "uuid": g.uuid}
        f.gauge("eagle3_gpu_memory_used_bytes", "GPU memory used.", lab, g.mem_used)
        f.gauge("eagle3_gpu_memory_total_bytes", "GPU memory total.", lab, g.mem_total)
        f.gauge("eagle3_gpu_utilization_ratio", "GPU utilization, 0..1.", lab,
                None if g.util_pct is None else g.util_pct / 100)
        f.gauge("eagle3_gpu_temperature_celsius", "GPU temperature.", lab, g.temp_c)
        f.gauge("eagle3_gpu_power_watts", "GPU power draw.", lab, g.power_w)
        f.gauge("eagle3_gpu_lost", "1 when NVML says the GPU is lost (fell off the bus).", lab, 1 if g.lost else 0)
        per_run: dict[tuple[str, str], list[int]] = {}
        for p in g.processes:
            key = (p.stage or "", "" if p.run_id is None else str(p.run_id))
            entry = per_run.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += p.used_bytes or 0
        for (stage, run_id), (n, used) in sorted(per_run.items()):
            rl = dict(lab, stage=stage, run_id=run_id)
            f.gauge("eagle3_gpu_processes", "Processes on the GPU by the run that owns them (stage and run_id "
                    "empty: no run of this workspace).", rl, n)
            f.gauge("eagle3_gpu_processes_memory_used_bytes", "GPU memory those processes hold.", rl, used)


def _stage(f: _Families, st: StageStatus) -> None:
    lab = {"stage": st.name}
    f.info("eagle3_stage", "The stage's op (empty: a custom argv stage), one series a stage.",
           {"op": st.op or ""}, lab)
    if st.job is not None:
        f.info("eagle3_stage_job", "A slurm run's job: its id, state, Slurm's reason and nodes.",
               {"job_id": st.job.id or "", "state": st.job.state or "", "reason": st.job.reason or "",
                "nodes": st.job.nodes or ""}, lab)
    for s in STATUSES:
        f.gauge("eagle3_stage_status", "1 for the stage's status (its latest run's), 0 for the others.",
                dict(lab, status=s), 1 if st.status == s else 0)
    f.gauge("eagle3_stage_run_id", "The latest run's id.", lab, st.run_id)
    f.gauge("eagle3_stage_started_timestamp_seconds", "When the latest run started (Unix time).", lab, st.started)
    f.gauge("eagle3_stage_ended_timestamp_seconds", "When the latest run ended (Unix time).", lab, st.ended)
    f.gauge("eagle3_stage_exit_code", "The latest run's exit code, once it ended with one.", lab, st.exit_code)
    f.gauge("eagle3_stage_signal", "The signal that ended the latest run, if one did.", lab, st.signal)
    f.gauge("eagle3_stage_progress_ratio", "Progress, 0..1.", lab, st.progress)
    if st.rate is not None:
        # The unit is the stage's own (samples from shard files, else the log's tqdm unit).
        f.gauge("eagle3_stage_rate_per_second", "Items per second, in the unit label (running runs only).",
                dict(lab, unit=(st.rate_unit or "it/s").removesuffix("/s")), st.rate)
    f.gauge("eagle3_stage_tokens_per_second", "Tokens per second (running runs only).", lab, st.tokens_per_s)
    f.gauge("eagle3_stage_eta_seconds", "Seconds left at the current rate.", lab, st.eta_s)
    sp, log = st.shards, st.log
    samples_done = sp.samples_done if sp is not None else None
    tokens_done = sp.tokens_done if sp is not None and sp.tokens_done is not None else (
        log.tokens_done if log is not None else None)
    f.gauge("eagle3_stage_samples_done", "Samples written (shard files).", lab, samples_done)
    f.gauge("eagle3_stage_samples_expected", "Samples expected.", lab, sp.samples_expected if sp else None)
    f.gauge("eagle3_stage_tokens_done", "Tokens done (an extraction's shard files, else its progress lines).",
            lab, tokens_done)
    f.gauge("eagle3_stage_tokens_expected", "Tokens expected.", lab, sp.tokens_expected if sp else None)
    if log is not None:
        f.gauge("eagle3_stage_log_errors", "The last `errors: N` counter in the log.", lab, log.errors)
    if st.result is None:
        return
    f.gauge("eagle3_stage_result_timestamp_seconds", "When the stage's result record was written "
            "(compare with started: an earlier run's record is older).", lab, st.result_time)
    # The op's own figures of its record (train's step and loss, bench's acceptance length),
    # as the snapshot's pass read them (observe/records.py).
    for g in st.gauges:
        f.gauge(g.name, g.doc, dict(lab, **dict(g.labels)), g.value)


class SnapshotExporter:
    """A prometheus-client collector that serves the families of the last
    snapshot; refresh() (the sampler thread's) replaces them."""

    def __init__(self, sample: Callable[[], Snapshot]) -> None:
        self._sample = sample
        self._lock = threading.Lock()
        self._families: list[Any] = []
        self._json = b'{"error": "no snapshot taken yet"}'
        self._errors = 0
        self._last_error = ""
        self._last_ok: float | None = None
        self._duration: float | None = None
        self.samples = 0

    def refresh(self) -> None:
        t0 = time.monotonic()
        try:
            snap = self._sample()
            fams = families(snap)
            doc = json.dumps(snap.to_dict(), default=str).encode()
        except Exception as exc:  # noqa: BLE001 - a pass that failed keeps the last snapshot, counted and said
            with self._lock:
                self._errors += 1
                self._last_error = f"{type(exc).__name__}: {exc}"
            return
        with self._lock:
            self._families = fams
            self._json = doc
            self._last_ok = time.time()
            self._duration = time.monotonic() - t0
            self.samples += 1

    def snapshot_json(self) -> bytes:
        """The last snapshot as status --json prints it (what another node's console reads: monitor/hosts.py)."""
        with self._lock:
            return self._json

    def app(self, metrics_app: Callable) -> Callable:
        """WSGI: /snapshot.json from the cache, everything else prometheus-client's /metrics."""
        def serve(environ: dict, start_response: Callable) -> list[bytes]:
            if environ.get("PATH_INFO") == "/snapshot.json":
                body = self.snapshot_json()
                start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
                return [body]
            return metrics_app(environ, start_response)
        return serve

    def collect(self) -> Iterator[Any]:
        with self._lock:
            fams, errors, last_error = self._families, self._errors, self._last_error
            last_ok, duration, samples = self._last_ok, self._duration, self.samples
        yield from fams
        yield CounterMetricFamily("eagle3_exporter_snapshots", "Snapshots taken (one a refresh interval, "
                                  "whatever the scrape rate).", value=samples)
        yield CounterMetricFamily("eagle3_exporter_collect_errors", "Snapshot passes that failed (the last "
                                  "good snapshot is served meanwhile).", value=errors)
        if last_error:
            info = InfoMetricFamily("eagle3_exporter_last_error", "The last failed pass's error.")
            info.add_metric([], {"error": last_error[:500]})
            yield info
        if last_ok is not None:
            yield GaugeMetricFamily("eagle3_exporter_last_collect_timestamp_seconds",
                                    "When the served snapshot was taken.", value=last_ok)
        if duration is not None:
            yield GaugeMetricFamily("eagle3_exporter_collect_duration_seconds",
                                    "How long the served snapshot took to collect.", value=duration)


def sampler(exporter: SnapshotExporter, interval_s: float, stop: threading.Event) -> threading.Thread:
    """Refresh every interval, resting at least as long as a refresh took:
    a short interval on a slow workspace never keeps a core busy."""
    def loop() -> None:
        rest = interval_s
        while not stop.wait(rest):
            began = time.monotonic()
            exporter.refresh()
            rest = max(interval_s, time.monotonic() - began)
    t = threading.Thread(target=loop, name="eagle3-exporter-sampler", daemon=True)
    t.start()
    return t


def serve(sample: Callable[[], Snapshot], host: str, port: int, interval_s: float,
          say: Callable[[str], None] = print, ready: Callable[[], None] | None = None,
          request_timeout_s: float | None = None) -> int:
    """Sample once, listen, then sample every interval until SIGTERM / SIGINT.
    `request_timeout_s`: a connection's time from its acceptance to its whole request
    head (exporter_http.REQUEST_TIMEOUT_S when None). Raises OSError when the address
    cannot be bound."""
    from prometheus_client import make_wsgi_app

    from eagle3_console.observe.exporter_http import REQUEST_TIMEOUT_S, start_server

    exporter = SnapshotExporter(sample)
    exporter.refresh()          # the first scrape already has a snapshot
    registry = CollectorRegistry(auto_describe=False)
    registry.register(exporter)
    # Not prometheus-client's start_http_server: its backlog of 5 and thread per
    # connection lost scrapes in a storm (exporter_http.py).
    server, _thread = start_server(exporter.app(make_wsgi_app(registry)), host, port,
                                   REQUEST_TIMEOUT_S if request_timeout_s is None else request_timeout_s)
    stop = threading.Event()

    def on_signal(_sig: int, _frame: Any) -> None:
        stop.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    sampler(exporter, interval_s, stop)
    bound = server.server_address
    say(f"exporter: serving http://{bound[0]}:{bound[1]}/metrics, a snapshot every {interval_s:g} s")
    if ready is not None:
        ready()
    while not stop.wait(1.0):
        pass
    server.shutdown()
    server.server_close()
    return 0
