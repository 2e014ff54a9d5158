"""A serve stage's SGLang server: its state and live figures, read from the log and the server itself.

Where it sits: snapshot.collect() keeps one ServeMonitor per serve run and
calls sample() each pass with the run's parsed log; the ServeState lands on
the stage (status --json, the stages table, the progress pane).

States (what the operator waits through on a 22-minute load):
- loading: the port is closed (weight-load % from the log's tqdm bar);
- warming_up: the port accepts, but the server is not ready yet (SGLang's
  warm-up request compiles kernels for minutes on a first start);
- ready: the readiness endpoint says so (ops/readiness.py);
- unhealthy: after ready, not ready, a timeout, the port closed while the
  process lives, or the log says a child died (scheduler, detokenizer); before
  ready, only once ready_timeout_s (serve's param) passed since the start:
  loading and warming up are never an alert;
- stopped: the run is not running.

Readiness across SGLang versions (ops/readiness.py, which cites both
sources): `/ready` (0.5.23: 200 when Up, 503 else, at once); where it answers
404 (0.5.17 has none) `/health_generate`, asked with the same short timeout:
503 at once while Starting, and a pending answer means past Starting (it
sleeps a second, then generates a token), confirmed by `/model_info`
answering; once ready it is asked at most every HEALTH_EVERY_S, `/model_info`
in between. Where neither exists, `/model_info` 200 plus the log's "fired up"
line is ready. Not `/health` on 0.5.23: it is `/health_generate`'s handler.

Other endpoints, as sglang 0.5.23 defines them (python/sglang/srt/entrypoints/http_server.py):
- `/server_info` (`/get_server_info` is its deprecated alias, which logs a
  warning on every call): the resolved server args plus `version` and
  `internal_states`, one dict per DP rank with `last_gen_throughput` and,
  speculative, `avg_spec_accept_length`
  (python/sglang/srt/managers/scheduler_components/internal_state.py).
- `/metrics` (with --enable-metrics): Prometheus text; the gauges
  `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage`,
  `sglang:gen_throughput`, `sglang:spec_accept_length`
  (python/sglang/srt/observability/metrics_collector.py).

Every request has a short timeout (TIMEOUT_S) and the figures are read at
most every FIGURES_EVERY_S: a hung server costs a refresh a fraction of a
second, never a stall. Standard library only (status --json imports this).
"""

from __future__ import annotations

import json
import re
import time

from eagle3_console.kernel.model import LogState, ServeState, ServeStatus
from eagle3_console.monitor.logparse import line_time
from ops.readiness import HEALTH, SERVE_READY_TIMEOUT_S, Readiness
from ops.units import human_duration

TIMEOUT_S = 0.3
FIGURES_EVERY_S = 2.0
# Each /health_generate makes the server generate a token: after ready, one a while.
HEALTH_EVERY_S = 10.0

_SAMPLE = re.compile(r"^(sglang:[a-z_]+)(?:\{[^}]*\})?\s+(\S+)")


def port_problem(host: str, port: int, timeout: float = TIMEOUT_S) -> str | None:
    """None when the port accepts; else "closed" (refused: nothing listens) or, on a
    timeout, "not accepting connections": a listener whose backlog is full, a hung server."""
    import socket       # imported only once a serve run is sampled
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"not accepting connections within {timeout:g} s"
    except OSError:
        return "closed"


def http_get(host: str, port: int, path: str, timeout: float = TIMEOUT_S) -> tuple[int, bytes]:
    """(status, body); OSError (timeouts included) when there is no answer in time."""
    import http.client      # a costly import (ssl, email): only once a serve run is sampled
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    except http.client.HTTPException as exc:
        raise OSError(f"bad HTTP answer: {exc}") from exc
    finally:
        conn.close()


def parse_metrics(text: str) -> dict[str, float]:
    """SGLang's gauges from Prometheus text: request counts and throughput summed
    over the series (one per DP rank), usage the highest, accept length the mean."""
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            try:
                values.setdefault(m.group(1), []).append(float(m.group(2)))
            except ValueError:
                continue
    out: dict[str, float] = {}
    for name, how in (("sglang:num_running_reqs", sum), ("sglang:num_queue_reqs", sum),
                      ("sglang:gen_throughput", sum), ("sglang:token_usage", max),
                      ("sglang:spec_accept_length", lambda v: sum(v) / len(v))):
        if values.get(name):
            out[name] = how(values[name])
    return out


def connect_host(host: str) -> str:
    # A server bound to every interface is reached on loopback.
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def server_url(host: str, port: int) -> str:
    """Where a serve stage's server is reached: the monitor's URL, and the one
    the console gives a bench that names the stage (runs/params.py's bind_servers)."""
    return f"http://{connect_host(host)}:{int(port)}"


class ServeMonitor:
    def __init__(self, host: str, port: int, speculative: bool, started: float | None,
                 timeout: float = TIMEOUT_S, figures_every_s: float = FIGURES_EVERY_S,
                 ready_timeout_s: float | None = SERVE_READY_TIMEOUT_S, health_every_s: float = HEALTH_EVERY_S):
        self.host, self.port = connect_host(host), int(port)
        self.speculative = speculative
        self.started = started
        self.timeout = timeout
        self.figures_every_s = figures_every_s
        self.ready_timeout_s = ready_timeout_s
        self.health_every_s = health_every_s
        self.ever_ready = False
        self.first_ready_at: float | None = None
        self._last: ServeState | None = None
        self._health_at: float | None = None
        self.readiness = Readiness(lambda path, t: http_get(self.host, self.port, path, t)[0], timeout)

    @property
    def url(self) -> str:
        return server_url(self.host, self.port)

    def sample(self, log: LogState | None, running: bool, now: float | None = None) -> ServeState:
        now = time.time() if now is None else now
        findings = log.findings if log else {}
        st = ServeState(state=ServeStatus.STOPPED, url=self.url, load_pct=log.load_pct if log else None,
                        speculative=self.speculative)
        if "ready" in findings:
            self.ever_ready = True
        st.time_to_ready_s = self._time_to_ready(findings)
        if not running:
            st.reason = "the run is not running"
            self._last = None
            return st
        died = findings.get("server_died")
        problem = port_problem(self.host, self.port, self.timeout)
        if problem is not None:
            if self.ever_ready:
                st.state, st.reason = ServeStatus.UNHEALTHY, f"port {self.port} {problem} after the server was ready"
            else:
                st.state = ServeStatus.LOADING
                st.reason = f"port {self.port} not open yet" + (
                    f"; weights {log.load_pct:.0f}% loaded" if log and log.load_pct is not None else "")
        else:
            self._ask(st, now, findings)
        self._deadline(st, now)
        if died and st.state != ServeStatus.READY:
            st.state, st.reason = ServeStatus.UNHEALTHY, died.line
        return st

    def _ask(self, st: ServeState, now: float, findings: dict) -> None:
        health = not (self.ever_ready and self._health_at is not None and now - self._health_at < self.health_every_s)
        ans = self.readiness.probe(health=health)
        if ans.endpoint == HEALTH:
            self._health_at = now
        st.readiness = ans.endpoint
        # /model_info alone says the HTTP server answers, which it does while warming up too.
        ready = ans.state == "ready" or (ans.state == "answering" and self.ever_ready)
        if ready:
            st.state, st.reason = ServeStatus.READY, ans.reason + (
                "" if ans.state == "ready" else (f"; {HEALTH} checked {human_duration(now - self._health_at)} ago"
                                                 if self._health_at is not None else "; the log said fired up"))
            if self.first_ready_at is None:
                self.first_ready_at = now     # when the log has no "fired up" line (yet)
            self.ever_ready = True
            st.time_to_ready_s = self._time_to_ready(findings)
            self._figures(st, now)
        elif self.ever_ready:
            st.state, st.reason = ServeStatus.UNHEALTHY, ans.reason
        else:
            st.state, st.reason = ServeStatus.WARMING_UP, ans.reason + (
                "; not fired up yet (no such line in the log)" if ans.state == "answering" else "")

    def _deadline(self, st: ServeState, now: float) -> None:
        """Loading and warming up are no alert until serve's ready_timeout_s passed."""
        if st.state not in (ServeStatus.LOADING, ServeStatus.WARMING_UP) or self.started is None or self.ready_timeout_s is None:
            return
        waited = now - self.started
        if waited > self.ready_timeout_s:
            st.state = ServeStatus.UNHEALTHY
            st.reason = (f"not ready {human_duration(waited)} after the start (ready_timeout_s "
                         f"{self.ready_timeout_s:g} s): {st.reason}")

    def _time_to_ready(self, findings: dict) -> float | None:
        if self.started is None:
            return None
        ready = findings.get("ready")
        at = line_time(ready.line) if ready else None
        at = at if at is not None else self.first_ready_at
        return max(0.0, at - self.started) if at is not None else None

    def _figures(self, st: ServeState, now: float) -> None:
        last = self._last
        if last is not None and last.sampled_at is not None and now - last.sampled_at < self.figures_every_s:
            for key in ("running_reqs", "queued_reqs", "kv_usage", "gen_tok_s", "accept_length",
                        "version", "metrics", "sampled_at"):
                setattr(st, key, getattr(last, key))
            return
        st.sampled_at = now
        try:
            code, body = http_get(self.host, self.port, "/server_info", self.timeout)
            if code == 404:     # a server older than the alias' deprecation
                code, body = http_get(self.host, self.port, "/get_server_info", self.timeout)
            info = json.loads(body) if code == 200 else {}
        except (OSError, ValueError):
            info = {}
        if isinstance(info, dict):
            st.version = info.get("version")
            states = [s for s in info.get("internal_states") or [] if isinstance(s, dict)]
            thr = [s["last_gen_throughput"] for s in states if isinstance(s.get("last_gen_throughput"), (int, float))]
            acc = [s["avg_spec_accept_length"] for s in states
                   if isinstance(s.get("avg_spec_accept_length"), (int, float))]
            st.gen_tok_s = sum(thr) if thr else None
            st.accept_length = sum(acc) / len(acc) if acc else None
            if info.get("speculative_algorithm"):
                st.speculative = True
        try:
            code, body = http_get(self.host, self.port, "/metrics", self.timeout)
            metrics = parse_metrics(body.decode("utf-8", "replace")) if code == 200 else None
        except OSError:
            metrics = None
        st.metrics = metrics is not None and bool(metrics)
        if metrics:
            st.running_reqs = metrics.get("sglang:num_running_reqs")
            st.queued_reqs = metrics.get("sglang:num_queue_reqs")
            st.kv_usage = metrics.get("sglang:token_usage")
            if "sglang:gen_throughput" in metrics:
                st.gen_tok_s = metrics["sglang:gen_throughput"]
            if "sglang:spec_accept_length" in metrics and st.speculative:
                st.accept_length = metrics["sglang:spec_accept_length"]
        self._last = st
