"""The serve readiness monitor against the SGLang test double (tests/sglang_double.py), real sockets."""

from __future__ import annotations

import socket
import time

import pytest

from eagle3_console.kernel.model import LogFinding, LogState
from eagle3_console.monitor.serve import ServeMonitor, parse_metrics
from tests.conftest import wait_for
from tests.sglang_double import Double

# The probes' timeout where it is not what a test is about: an in-process double on a loaded
# machine may take longer than TIMEOUT_S (0.3 s) to answer. The tests of that timeout keep it.
PATIENT_S = 5.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def double():
    d = Double(speculative=True, accept_length=3.2).start()
    yield d
    d.stop()


def ready_first(mon: ServeMonitor) -> None:
    """The monitor has seen the server ready (with the short timeout under test, a loaded
    machine may miss it once: a sample before ready leaves nothing behind, so ask again)."""
    wait_for(lambda: mon.sample(log_with(), running=True).state == "ready", timeout=30)


def log_with(**findings) -> LogState:
    st = LogState(path="x.log")
    for kind, line in findings.items():
        st.findings[kind] = LogFinding(kind=kind, line=line)
    return st


def test_loading_while_the_port_is_closed_with_the_load_percentage():
    log = log_with(loading="Loading safetensors checkpoint shards:  86% Completed | 55/64")
    log.load_pct = 86.0
    st = ServeMonitor("127.0.0.1", free_port(), True, started=time.time(), timeout=PATIENT_S).sample(log, running=True)
    assert st.state == "loading" and st.load_pct == 86.0
    assert "not open yet; weights 86% loaded" in st.reason
    assert st.running_reqs is None and st.time_to_ready_s is None


def test_warming_up_then_ready_with_live_figures(double):
    mon = ServeMonitor("0.0.0.0", double.port, True, started=time.time() - 100, timeout=PATIENT_S)
    st = mon.sample(log_with(), running=True)
    assert st.state == "warming_up" and st.reason == "/ready answered 503"
    double.status = "Up"
    double.running, double.last_gen_throughput = 2, 91.5
    st = mon.sample(log_with(), running=True)
    assert st.state == "ready" and st.url == f"http://127.0.0.1:{double.port}"
    assert (st.running_reqs, st.queued_reqs, st.kv_usage, st.gen_tok_s) == (2, 0, 0.25, 91.5)
    assert st.accept_length == 3.2 and st.speculative and st.metrics is True and st.version == "0.5.23"
    assert 99 <= st.time_to_ready_s < 105      # first seen ready: no "fired up" line in this log


def test_time_to_ready_comes_from_the_fired_up_line(double):
    double.status = "Up"
    started = time.mktime((2026, 12, 1, 10, 0, 5, 0, 0, -1))
    log = log_with(ready="[2026-12-01 10:29:52] The server is fired up and ready to roll!")
    st = ServeMonitor("127.0.0.1", double.port, True, started=started, timeout=PATIENT_S).sample(log, running=True)
    assert st.state == "ready" and st.time_to_ready_s == 29 * 60 + 47


def test_figures_without_metrics_come_from_server_info():
    d = Double(speculative=True, accept_length=2.5, metrics=False, dp=2).start()
    try:
        d.status, d.last_gen_throughput = "Up", 40.0
        st = ServeMonitor("127.0.0.1", d.port, True, started=None, timeout=PATIENT_S).sample(log_with(), running=True)
        assert st.state == "ready" and st.metrics is False
        assert st.gen_tok_s == 80.0 and st.accept_length == 2.5    # summed / averaged over the DP ranks
        assert st.running_reqs is None
    finally:
        d.stop()


def test_a_hung_server_is_unhealthy_within_the_timeout(double):
    double.status = "Up"
    mon = ServeMonitor("127.0.0.1", double.port, True, started=None)
    ready_first(mon)
    double.hang = True
    st = mon.sample(log_with(), running=True)
    assert st.state == "unhealthy" and "no answer within 0.3 s" in st.reason
    # The sample came back while the server still held its request (unanswered until the
    # double stops): the timeout ended the wait, not an answer. No wall clock to race.
    assert double.hanging >= 1


def test_unhealthy_after_ready_and_when_a_child_died(double):
    double.status = "Up"
    mon = ServeMonitor("127.0.0.1", double.port, False, started=None, timeout=PATIENT_S)
    assert mon.sample(log_with(), running=True).state == "ready"
    double.status = "UnHealthy"
    assert mon.sample(log_with(), running=True).reason == "/ready answered 503"
    double.stop()
    st = mon.sample(log_with(server_died="[2026-12-01 10:25:03] Received sigquit from a child process."),
                    running=True)
    assert st.state == "unhealthy" and "Received sigquit" in st.reason


def test_stopped_when_the_run_is_not_running(double):
    double.status = "Up"
    mon = ServeMonitor("127.0.0.1", double.port, False, started=None, timeout=PATIENT_S)
    st = mon.sample(log_with(), running=False)
    assert st.state == "stopped"


def test_figures_are_read_at_most_every_interval(double):
    double.status = "Up"
    mon = ServeMonitor("127.0.0.1", double.port, True, started=None, figures_every_s=60, timeout=PATIENT_S)
    double.running = 1
    assert mon.sample(log_with(), running=True).running_reqs == 1
    double.running = 5
    assert mon.sample(log_with(), running=True).running_reqs == 1     # cached
    assert mon.sample(log_with(), running=True, now=time.time() + 61).running_reqs == 5


def test_parse_metrics_sums_requests_over_dp_ranks_and_takes_the_highest_usage():
    text = "\n".join([
        "# HELP sglang:num_running_reqs The number of running requests.",
        "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{dp_rank="0",engine_type="unified",model_name="m",tp_rank="0"} 3.0',
        'sglang:num_running_reqs{dp_rank="1",engine_type="unified",model_name="m",tp_rank="0"} 4.0',
        'sglang:token_usage{dp_rank="0"} 0.5', 'sglang:token_usage{dp_rank="1"} 0.75',
        'sglang:spec_accept_length{dp_rank="0"} 2.0', 'sglang:spec_accept_length{dp_rank="1"} 3.0',
        'sglang:gen_throughput{dp_rank="0"} NaN-ish'])
    m = parse_metrics(text)
    assert m == {"sglang:num_running_reqs": 7.0, "sglang:token_usage": 0.75, "sglang:spec_accept_length": 2.5}


def test_a_server_that_stopped_accepting_is_not_reported_as_closed(double):
    # A server stuck (SIGSTOP, a wedged event loop) stops accepting once its listen
    # backlog is full: the connect times out. "closed" would say its process is gone.
    double.status = "Up"
    mon = ServeMonitor("127.0.0.1", double.port, True, started=None)
    ready_first(mon)
    double.stop()
    full = socket.socket()
    full.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    full.bind(("127.0.0.1", double.port))
    full.listen(0)                        # one pending connection, never accepted
    held = socket.create_connection(("127.0.0.1", double.port), timeout=1)
    try:
        st = mon.sample(log_with(), running=True)
        assert st.state == "unhealthy"
        assert st.reason == f"port {double.port} not accepting connections within 0.3 s after the server was ready"
    finally:
        held.close()
        full.close()
    st = mon.sample(log_with(), running=True)
    assert st.reason == f"port {double.port} closed after the server was ready"


# --- SGLang releases without /ready (0.5.17: the double's ready_route=False) ---------------

@pytest.fixture
def old_double():
    d = Double(speculative=True, accept_length=2.4, version="0.5.17", ready_route=False).start()
    yield d
    d.stop()


def test_without_ready_the_state_comes_from_health_generate(old_double):
    # The short timeout is the subject (a pending /health_generate is past Starting): a sample a
    # loaded machine answered late is taken again (it leaves nothing behind), as are the figures.
    mon = ServeMonitor("127.0.0.1", old_double.port, True, started=time.time() - 30, figures_every_s=0)
    st = wait_for(lambda: (st := mon.sample(log_with(), running=True)).readiness == "/health_generate" and st,
                  timeout=30)
    assert st.state == "warming_up" and st.readiness == "/health_generate"
    assert st.reason == "/health_generate answered 503 (this server has no /ready)"
    old_double.status = "Up"
    st = wait_for(lambda: (st := mon.sample(log_with(), running=True)).state == "ready" and st.version and st,
                  timeout=30)
    # Past Starting, /health_generate sleeps a second before it answers: its pending answer
    # and /model_info's 200 are what 0.5.23's /ready would have said.
    assert st.state == "ready" and st.version == "0.5.17" and st.accept_length == 2.4
    assert st.reason.startswith("/health_generate past Starting (no 503 within 0.3 s") and "/model_info answered 200" in st.reason
    assert 29 <= st.time_to_ready_s < 40


def test_the_fired_up_line_on_a_server_without_ready_is_ready_not_unhealthy(old_double):
    # The run on 0.5.17: `unhealthy ... ready after 2m46s (/ready answered 404)`, CRITICAL.
    old_double.status = "Up"
    log = log_with(ready="[2026-12-01 10:02:51] The server is fired up and ready to roll!")
    st = ServeMonitor("127.0.0.1", old_double.port, True, started=time.time(),
                      timeout=PATIENT_S).sample(log, running=True)
    assert st.state == "ready" and "404" not in st.reason


def test_without_ready_unhealthy_after_ready_when_it_stops_answering(old_double):
    old_double.status = "Up"
    mon = ServeMonitor("127.0.0.1", old_double.port, True, started=None)
    ready_first(mon)
    old_double.hang = True
    st = mon.sample(log_with(), running=True, now=time.time() + 60)
    assert st.state == "unhealthy" and "/model_info: no answer within 0.3 s" in st.reason


def test_after_ready_health_generate_is_asked_at_most_every_interval(old_double):
    # Each /health_generate makes the server generate a token; /model_info is free.
    old_double.status = "Up"
    mon = ServeMonitor("127.0.0.1", old_double.port, True, started=None, health_every_s=60, timeout=PATIENT_S)
    t = time.time()
    for i in range(4):
        assert mon.sample(log_with(), running=True, now=t + i).state == "ready"
    assert old_double.paths.count("/health_generate") == 1 and old_double.paths.count("/ready") == 1
    st = mon.sample(log_with(), running=True, now=t + 61)
    assert st.state == "ready" and old_double.paths.count("/health_generate") == 2


def test_with_only_model_info_ready_needs_the_fired_up_line():
    d = Double(ready_route=False, health_route=False).start()
    try:
        mon = ServeMonitor("127.0.0.1", d.port, False, started=time.time(), timeout=PATIENT_S)
        st = mon.sample(log_with(), running=True)
        assert st.state == "warming_up" and st.readiness == "/model_info"
        assert st.reason == ("/model_info answered 200 (this server has neither /ready nor /health_generate); "
                             "not fired up yet (no such line in the log)")
        log = log_with(ready="[2026-12-01 10:02:51] The server is fired up and ready to roll!")
        assert mon.sample(log, running=True).state == "ready"
    finally:
        d.stop()


# --- the readiness deadline: warming up is never CRITICAL before it --------------------

def test_warming_up_for_long_is_not_unhealthy_before_the_deadline(double):
    started = time.time() - 40 * 60       # a 22-minute load, then minutes of kernel compiles
    mon = ServeMonitor("127.0.0.1", double.port, True, started=started, timeout=PATIENT_S)
    st = mon.sample(log_with(), running=True)
    assert st.state == "warming_up" and st.reason == "/ready answered 503"


def test_not_ready_by_ready_timeout_s_is_unhealthy(double):
    started = time.time() - 100
    st = ServeMonitor("127.0.0.1", double.port, True, started=started, timeout=PATIENT_S,
                      ready_timeout_s=60).sample(log_with(), running=True)
    assert st.state == "unhealthy"
    assert st.reason == "not ready 1m40s after the start (ready_timeout_s 60 s): /ready answered 503"
    st = ServeMonitor("127.0.0.1", free_port(), True, started=started, timeout=PATIENT_S,
                      ready_timeout_s=60).sample(log_with(), running=True)
    assert st.state == "unhealthy" and st.reason.endswith("(ready_timeout_s 60 s): port "
                                                          f"{st.url.rsplit(':', 1)[1]} not open yet")
    assert ServeMonitor("127.0.0.1", double.port, True, started=started, timeout=PATIENT_S,
                        ready_timeout_s=600).sample(log_with(), running=True).state == "warming_up"


@pytest.mark.parametrize("metrics,over", [(True, "last log interval"), (False, "since the server started")])
def test_the_servers_accept_length_is_said_as_sglangs_own_figure(metrics, over):
    """SGLang's sglang:spec_accept_length gauge covers its last log interval
    (metrics_reporter.py: spec_num_accept_tokens / spec_num_forward_ct, reset each
    log); /server_info's avg_spec_accept_length covers the server's life
    (internal_state.py). Beside a bench's AL on screen, each says which it is."""
    from rich.console import Console

    from eagle3_console.kernel.model import StageStatus
    from eagle3_console.observe.report import serve_line
    from eagle3_console.tui.panes.progress import serve_text
    d = Double(speculative=True, accept_length=2.9, metrics=metrics).start()
    try:
        d.status = "Up"
        mon = ServeMonitor("127.0.0.1", d.port, True, started=time.time() - 10, timeout=PATIENT_S)
        sv = mon.sample(log_with(), running=True)
        assert sv.state == "ready" and sv.accept_length == 2.9, sv
    finally:
        d.stop()
    st = StageStatus(name="serve_spec", op="serve", status="running", serve=sv)
    said = f"SGLang accept length 2.90 ({over}; bench's AL is per bench run)"
    assert said in serve_line(st)
    console = Console(width=200, color_system=None)
    with console.capture() as cap:
        console.print(serve_text(st))
    assert said in cap.get()
