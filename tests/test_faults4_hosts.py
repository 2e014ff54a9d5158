"""Fault battery 4 (issue 37): other hosts and the exporter. Each listed host is
a real TCP server on 127.0.0.1 that answers /snapshot.json with what a broken or
hostile exporter sends (wrong types, a 4,000-digit integer, NaN, 150,000 GPUs,
200,000 nested brackets, terminal escapes, no HTTP at all); the console under
test is the real CLI (its reads in this process), the real TUI, the real exporter."""

from __future__ import annotations

import json
import select
import socket
import socketserver
import threading
import urllib.request
from typing import Callable, Iterator

import pytest

from tests.conftest import PY, WS, wait_for
from tests.test_exporter import start, stop


def http_ok(body: bytes) -> bytes:
    return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


GOOD_GPU = {"index": 0, "name": "H100", "uuid": "GPU-1", "mem_used": 10 << 30, "mem_total": 80 << 30,
            "util_pct": 50, "processes": []}
BADTYPES = json.dumps({"host": "evil", "gpus": [{
    "index": 0, "name": ["x"], "mem_used": "lots", "mem_total": {"a": 1}, "util_pct": "99", "temp_c": [1],
    "power_w": "x", "processes": [{"pid": 1, "used_bytes": "x", "stage": 5, "run_id": "r"}]}]}).encode()
BIGINT = b'{"host":"b","gpus":[{"index": 0, "mem_used": ' + b"9" * 4000 + b', "mem_total": 1e400}]}'
NAN = b'{"host": "n", "gpus": [{"index": 0, "mem_used": NaN, "mem_total": Infinity, "util_pct": -Infinity}]}'
NEGATIVE = json.dumps({"host": "neg", "gpus": [{"index": -5, "mem_used": -1 << 40, "mem_total": -1}]}).encode()
HUGE = b'{"host":"h","gpus":[' + b",".join(
    b'{"index":%d,"name":"G","mem_used":1,"mem_total":2}' % i for i in range(150000)) + b"]}"
DEEP = b"[" * 200000 + b"]" * 200000
DEEP_IN_GPUS = b'{"gpus": ' + b"[" * 100000 + b"]" * 100000 + b"}"
ESCAPES = json.dumps({"host": "\x1b]0;PWNED\x07\x1b[2Jevil\nnewline", "gpus": [
    {"index": 0, "name": "\x1b[31mRED", "mem_used": 1, "mem_total": 2, "error": "\x1b[5mblink"}]}).encode()


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.settimeout(10)
        head = b""
        try:
            while b"\r\n\r\n" not in head:
                got = self.request.recv(4096)
                if not got:
                    return
                head += got
            self.request.sendall(self.server.answer)
        except OSError:
            pass


class _HostServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@pytest.fixture
def host() -> Iterator[Callable[[bytes], str]]:
    """host(raw HTTP answer) -> the URL of a server on 127.0.0.1 that sends it to every request."""
    servers: list[_HostServer] = []

    def serve(answer: bytes) -> str:
        srv = _HostServer(("127.0.0.1", 0), _Answer)
        srv.answer = answer
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        yield serve
    finally:
        for srv in servers:
            srv.shutdown()
            srv.server_close()


@pytest.fixture(autouse=True)
def patient(monkeypatch):
    """No host here hangs (a hung one is tests/test_hosts.py's): status reads them with 30 s, not
    the 2 s a loaded machine's answer (150,000 GPUs, 200,000 brackets) could take longer than."""
    from tests.test_hosts import patient_hosts
    patient_hosts(monkeypatch)


def listing(ws: WS, *urls: str) -> WS:
    hosts = ", ".join(f'"{u}"' for u in urls)
    ws.write(f'hosts = [{hosts}]\n[stages.w]\nargv = ["true"]\noutputs = ["out/w"]\n')
    return ws


def status(ws: WS) -> tuple[str, dict]:
    """status's text and status --json's object; neither with a traceback (the exit: 1, a warning)."""
    text = ws.call("status", timeout=60)
    assert "Traceback" not in text.stderr + text.stdout and "Exception in thread" not in text.stderr, text
    assert text.returncode == 1, (text.returncode, text.stdout, text.stderr)
    js = ws.call("status", "--json", timeout=60)
    assert "Traceback" not in js.stderr and "Exception in thread" not in js.stderr, js.stderr
    assert js.returncode == 1, (js.returncode, js.stderr)
    return text.stdout, json.loads(js.stdout)


def only_host(doc: dict) -> dict:
    (h,) = doc["hosts"]
    alerts = [a for a in doc["alerts"] if a["code"] == "host_unreachable"]
    assert len(alerts) == 1 and alerts[0]["level"] == "warning", doc["alerts"]
    assert h["url"] in alerts[0]["message"]
    return h


# ------------------------------------------------------------------ Q50 / Q51: wrong types, a huge integer
def test_q50_a_hosts_fields_of_the_wrong_type_make_it_a_bad_answer_not_a_traceback(ws, host):
    url = host(http_ok(BADTYPES))
    text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["gpus"] == [], h
    assert "GPU 0 name: expected a string, got list ['x']" == h["reason"], h
    assert f"{url}: bad answer: GPU 0 name: expected a string" in text
    assert "lots" not in json.dumps(h)              # nothing of the bad answer is passed through


def test_q51_a_4000_digit_integer_is_a_bad_answer(ws, host):
    url = host(http_ok(BIGINT))
    text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer", h
    assert "GPU 0 mem_used: a 4,000-digit integer out of range" in h["reason"], h
    assert len(h["reason"]) < 300 and f"{url}: bad answer: GPU 0 mem_used" in text


def test_q50_the_tui_shows_a_bad_answer_and_keeps_running(ws, host):
    from tests.test_tui_helpers import make_app, pane_text, run, wait_until
    good = host(http_ok(json.dumps({"host": "fine", "gpus": [GOOD_GPU]}).encode()))
    url = host(http_ok(BADTYPES))
    listing(ws, url, good)

    async def main():
        app = make_app(ws.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: "bad answer" in pane_text(app, "gpus"))
            text = pane_text(app, "gpus")
            assert f"{url}: bad answer: GPU 0 name: expected a string" in text, text
            assert f"fine ({good}): 1 GPU(s)" in text, text
            samples = app.main_screen.snapshot.time
            await wait_until(pilot, lambda: app.main_screen.snapshot.time > samples)   # still sampling
            assert app.is_running
    run(main())


# ------------------------------------------------------------------ Q49 / Q58: deep JSON, no HTTP
@pytest.mark.parametrize("body", [DEEP, DEEP_IN_GPUS], ids=["deep-list", "deep-in-gpus"])
def test_q49_deeply_nested_json_is_a_bad_answer_at_once(ws, host, body):
    url = host(http_ok(body))
    text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["reason"] == ("answer nested more than 64 levels deep; "
                                                          "at most 64 are read"), h
    assert "no answer" not in text


def test_q49_the_exporter_relays_a_deep_answer_as_bad_without_tracebacks(ws, host):
    url = host(http_ok(DEEP))
    listing(ws, url)
    proc, port = start([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "exporter", "--port", "0",
                        "--interval", "0.2"], ws.root)
    try:
        def relayed() -> dict | None:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshot.json", timeout=10) as resp:
                doc = json.loads(resp.read())
            return doc if doc["hosts"] and doc["hosts"][0]["state"] == "bad_answer" else None
        doc = wait_for(relayed, timeout=30)
        assert "nested more than 64 levels" in doc["hosts"][0]["reason"]
        first = doc["time"]
        wait_for(lambda: relayed() and relayed()["time"] > first + 0.5, timeout=30)   # several passes
    finally:
        stop(proc)
    err = proc.stderr.read()
    assert "Traceback" not in err and "Exception in thread" not in err, err[:2000]


def test_q58_a_reply_that_is_not_http_is_a_bad_answer(ws, host):
    url = host(b"NOT HTTP AT ALL\r\n\r\n")
    _text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["reason"].startswith("not HTTP: BadStatusLine"), h


# ------------------------------------------------------------------ Q53: a bound on GPUs
def test_q53_a_host_reporting_150000_gpus_is_a_bad_answer_in_a_line(ws, host):
    url = host(http_ok(HUGE))
    text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["reason"] == "gpus: 150,000 GPUs; at most 64 are read", h
    assert len(text.splitlines()) < 40, len(text.splitlines())
    assert len(json.dumps(doc)) < 20000


# ------------------------------------------------------------------ Q56: terminal escapes
def test_q56_a_hosts_names_reach_the_terminal_escaped(ws, host):
    url = host(http_ok(ESCAPES))
    stdout, doc = status_ok(listing(ws, url))
    assert "\x1b" not in stdout and "\x07" not in stdout, repr(stdout)
    assert "\\x1b]0;PWNED\\x07evil\\nnewline (" + url + "): 1 GPU(s)" in stdout, stdout
    assert "GPU 0 RED:" in stdout and "[blink]" in stdout, stdout     # colour sequences dropped, as in logs
    (h,) = doc["hosts"]
    assert h["host"] == "\\x1b]0;PWNED\\x07evil\\nnewline" and h["gpus"][0]["name"] == "RED", h


def status_ok(ws: WS) -> tuple[str, dict]:
    text = ws.call("status", timeout=60)
    assert "Traceback" not in text.stderr, text.stderr
    js = ws.call("status", "--json", timeout=60)
    return text.stdout, json.loads(js.stdout)


# ------------------------------------------------------------------ Q52: NaN, Infinity, negatives
@pytest.mark.parametrize("body, reason", [
    (NAN, "not a snapshot: NaN in the answer: JSON has no NaN or Infinity"),
    (NEGATIVE, "gpus[0].index: int -5 out of range; expected an integer from 0 to 4,095"),
    (json.dumps({"host": "u", "gpus": [dict(GOOD_GPU, util_pct=250)]}).encode(),
     "GPU 0 util_pct: int 250 out of range; expected a number from 0 to 100"),
    (json.dumps({"host": "m", "gpus": [dict(GOOD_GPU, mem_used=-1)]}).encode(),
     "GPU 0 mem_used: int -1 out of range; expected an integer from 0 to 2^50"),
], ids=["nan", "negative-index", "util-250", "negative-bytes"])
def test_q52_impossible_gpu_values_are_a_bad_answer_with_a_warning(ws, host, body, reason):
    url = host(http_ok(body))
    text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["reason"] == reason, h
    assert "GPU(s)" not in text and "PiB" not in text and "%" not in text, text     # no GPU of it shown
    assert "WARNING" in text and f"host {url}: bad answer" in text


# ------------------------------------------------------------------ Q59: the list itself
@pytest.mark.parametrize("hosts, key, said", [
    ('"http://127.0.0.1:19701", "http://127.0.0.1:19701/"', "hosts[1]",
     "'http://127.0.0.1:19701/' is listed twice (hosts[0] is the same exporter); expected each host once"),
    ('"http://Node-1:9457", "http://node-1:9457"', "hosts[1]", "is listed twice (hosts[0]"),
    ('"http://node-1", "http://node-1:80"', "hosts[1]", "is listed twice (hosts[0]"),
    ('"http://127.0.0.1:19701", "http://127.0.0.1:99999"', "hosts[1]",
     "'http://127.0.0.1:99999': port 99999 out of range; expected 1 to 65535"),
    ('"http://127.0.0.1:0"', "hosts[0]", "port 0 out of range; expected 1 to 65535"),
    ('"http://:9457"', "hosts[0]", "'http://:9457': no host name"),
])
def test_q59_a_host_listed_twice_or_a_port_out_of_range_is_refused_at_load(ws, hosts, key, said):
    ws.write(f'hosts = [{hosts}]\n[stages.w]\nargv = ["true"]\n')
    for args in (("status",), ("status", "--json")):
        proc = ws.call(*args, check=3)
        (line,) = proc.stderr.strip().splitlines()
        assert f"eagle3.toml: {key}: " in line and said in line and "Traceback" not in line, line


def test_q59_the_same_host_twice_is_not_counted_twice_once_fixed(ws, host):
    """The fix in eagle3.toml is to list it once: its GPUs show once."""
    url = host(http_ok(json.dumps({"host": "n", "gpus": [GOOD_GPU]}).encode()))
    ws.write(f'hosts = ["{url}"]\n[stages.w]\nargv = ["true"]\n')
    doc = json.loads(ws.call("status", "--json", check=0).stdout)
    assert [h["state"] for h in doc["hosts"]] == ["ok"]


# ------------------------------------------------------------------ Q62: clients that never read
BIG = b"x" * (24 << 20)


def _app(environ, start_response):
    body = BIG if environ.get("PATH_INFO") == "/snapshot.json" else b"eagle3_up 1\n"
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def pool_server(monkeypatch):
    """The exporter's own HTTP server (exporter_http.PoolServer) in this process, serving
    a 24 MiB /snapshot.json; a slow writer's deadline made long (60 s), so the test tells
    a held handler from a free one by the event, not by a race with that deadline."""
    from eagle3_console.observe import exporter_http
    monkeypatch.setattr(exporter_http._QuietHandler, "timeout", 60.0)
    monkeypatch.setattr(exporter_http, "WRITE_TIMEOUT_S", 60.0, raising=False)
    server, _thread = exporter_http.start_server(_app, "127.0.0.1", 0)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _non_readers(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET /snapshot.json HTTP/1.1\r\nHost: x\r\n\r\n")
        out.append(s)
    return out


def test_q62_clients_that_never_read_a_large_answer_do_not_hold_the_handlers(pool_server):
    from eagle3_console.observe.exporter_http import WORKERS
    port = pool_server
    idle = _non_readers(port, 4 * WORKERS)
    try:
        # Their answers have begun (as many as there are handlers, at least): the handlers met them.
        def started() -> bool:
            ready, _w, _x = select.select(idle, [], [], 0.2)
            return len(ready) >= WORKERS
        wait_for(started, timeout=30)
        for _ in range(3 * WORKERS):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as resp:
                assert resp.status == 200 and resp.read() == b"eagle3_up 1\n"
        # A client that reads gets the whole large answer meanwhile.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshot.json", timeout=20) as resp:
            assert len(resp.read()) == len(BIG)
    finally:
        for s in idle:
            s.close()


def test_q50_a_bad_value_that_reads_as_rich_markup_is_printed_as_it_is(ws, host):
    """The reason quotes the bad value; status prints alerts through rich's markup:
    a closing tag in a host's answer must not end status with a MarkupError."""
    url = host(http_ok(json.dumps({"host": "m", "gpus": [dict(GOOD_GPU, name=["[/x] [bold]b"])]}).encode()))
    text, doc = status(listing(ws, url))
    assert only_host(doc)["reason"] == "GPU 0 name: expected a string, got list ['[/x] [bold]b']"
    assert f"WARNING host {url}: bad answer (GPU 0 name: expected a string, got list ['[/x] [bold]b'])" in text


def test_q49_the_depth_check_reads_json_as_the_parser_does():
    """Brackets inside strings (escaped quotes and backslashes too) are no nesting; 64 levels pass, 65 do not
    (a real snapshot nests a stage's params, up to 32 levels in eagle3.toml, below its own 4)."""
    from eagle3_console.monitor.hosts import nesting, parse_answer

    def doc(levels: int) -> bytes:
        v: object = 1
        for i in range(levels - 1):
            v = [v] if i % 2 else {'k\\"[{': v, "s": ']]]}}\\\\"[['}
        return json.dumps({"gpus": [], "x": v}).encode()
    assert nesting(doc(64)) is None and nesting(doc(65)) == 65
    assert parse_answer("http://h:1", doc(64)).state == "ok"
    assert parse_answer("http://h:1", doc(65)).state == "bad_answer"
    # Unclosed brackets past the parser's own limit: a bad answer too, never a RecursionError.
    assert parse_answer("http://h:1", b"[" * 100000).state == "bad_answer"


def test_a_redirect_is_a_bad_answer_not_followed(ws, host):
    """A host's exporter answers /snapshot.json itself: a redirect (to a dead port, or to another
    host's good answer) is said as such, not followed (before: 'unreachable (Connection refused)')."""
    elsewhere = host(http_ok(json.dumps({"host": "other", "gpus": [GOOD_GPU]}).encode()))
    url = host(b"HTTP/1.0 302 Found\r\nLocation: " + elsewhere.encode() + b"/snapshot.json\r\n"
               b"Content-Length: 0\r\n\r\n")
    _text, doc = status(listing(ws, url))
    h = only_host(doc)
    assert h["state"] == "bad_answer" and h["reason"] == (
        f"HTTP 302 from {url}/snapshot.json, a redirect to {elsewhere}/snapshot.json (not followed)"), h


def test_a_real_exporter_whose_stage_params_nest_deep_is_read_ok(tmp_path):
    """The depth bound leaves room for what a real snapshot holds: a stage's params nested
    as deep as eagle3.toml allows (32 levels) appear in the node's snapshot below its own 3."""
    from tests.test_hosts import node
    b = WS(tmp_path / "b")
    b.root.mkdir()
    deep = "1"
    for _ in range(28):
        deep = "{ a = " + deep + " }"
    b.write(f'[stages.w]\nargv = ["true"]\nparams = {{ p = {deep} }}\n')
    b.call("status", "--json", "--no-gpus", check=0)        # the file loads: within the TOML bound
    proc, port = node(b, 10, False)
    try:
        c = WS(tmp_path / "c")
        c.root.mkdir()
        listing(c, f"http://127.0.0.1:{port}")
        doc = json.loads(c.call("status", "--json", timeout=60).stdout)
        (h,) = doc["hosts"]
        assert h["state"] == "ok" and h["gpus"][0]["mem_used"] == 10 * 2**30, h
    finally:
        stop(proc)
