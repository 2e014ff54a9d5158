"""Every node's GPUs in one view: two real exporters on 127.0.0.1 (two ports)
stand for two nodes, each serving its snapshot as JSON (/snapshot.json) with a
fake NVML at the driver boundary (tests/fake_pynvml.py; no driver here); a
third workspace's pipeline file lists them in `hosts`. One exporter killed,
the other hung (SIGSTOP): each is shown as such, and status still answers."""

from __future__ import annotations

import json
import signal
import textwrap
import urllib.request

import pytest

from tests.conftest import PY, ROOT, WS, stage_cmd, wait_for
from tests.procs import state
from tests.test_exporter import start, stop


def node(ws: WS, gib: int, pid_of_run: bool):
    """An exporter on a free port over `ws`, its GPU 0 holding the pid of the ws's running stage."""
    pid = ws.latest("sleep").pid if pid_of_run else None
    compute = f"{{{pid}: {gib} * 2**30}}" if pid else "{}"
    probe = textwrap.dedent(f"""
        import sys
        from tests.fake_pynvml import FakeGpu, FakeNvml
        from eagle3_console.observe import exporter
        from eagle3_console.monitor.gpus import Nvml
        from eagle3_console.observe.snapshot import Collector
        from eagle3_console.kernel.workspace import Workspace
        gpus = [FakeGpu(mem_used={gib} * 2**30, util=77, compute={compute}), FakeGpu()]
        col = Collector(Workspace.at({str(ws.root)!r}), nvml=Nvml(module=FakeNvml(gpus=gpus)))
        sys.exit(exporter.serve(col.collect, "127.0.0.1", 0, 1, say=lambda m: print(m, flush=True)))
    """)
    return start([PY, "-c", probe], ROOT, own_session=True)


@pytest.fixture
def two_nodes(tmp_path):
    a, b = WS(tmp_path / "a"), WS(tmp_path / "b")
    for w in (a, b):
        w.root.mkdir()
        w.write(f"""
[stages.sleep]
argv = {stage_cmd("sleeper.py", "--seconds", "120")}
""")
    a.cli("run", "sleep", check=0)
    a.wait_status("sleep", ("running",))
    procs = [node(a, 40, True), node(b, 10, False)]
    yield a, procs
    for proc, _port in procs:
        proc.send_signal(signal.SIGCONT)
        stop(proc)
    a.cli("stop", "sleep", "--grace", "1")


PATIENT_S = 30.0


def patient_hosts(monkeypatch) -> None:
    """hosts.read (which status's snapshot calls) with a 30 s timeout for the hosts that answer:
    a loaded machine's exporter may take longer than the 2 s kept for a hung one."""
    from eagle3_console.monitor import hosts
    read = hosts.read
    monkeypatch.setattr(hosts, "read", lambda urls, timeout=PATIENT_S, **kw: read(urls, timeout, **kw))


def console(tmp_path, ports) -> WS:
    c = WS(tmp_path / "console")
    c.root.mkdir()
    hosts = ", ".join(f'"http://127.0.0.1:{p}"' for p in ports)
    c.write(f"""
hosts = [{hosts}]

[stages.local]
argv = ["python", "-c", "print(1)"]
""")
    return c


def test_an_exporter_serves_its_snapshot_as_json(two_nodes):
    a, procs = two_nodes
    with urllib.request.urlopen(f"http://127.0.0.1:{procs[0][1]}/snapshot.json", timeout=10) as resp:
        doc = json.loads(resp.read())
    assert resp.headers["Content-Type"] == "application/json"
    assert doc["workspace"] == str(a.root) and doc["schema"] == 1
    assert doc["gpus"][0]["processes"][0]["stage"] == "sleep"


def test_status_shows_each_hosts_gpus_with_their_runs_and_a_dead_or_hung_host_as_such(two_nodes, tmp_path,
                                                                                      monkeypatch):
    a, procs = two_nodes
    (pa, port_a), (pb, port_b) = procs
    c = console(tmp_path, [port_a, port_b])
    with monkeypatch.context() as patient:      # the hosts answer: no 2 s window; the hung one keeps it
        patient_hosts(patient)
        snap = json.loads(c.call("status", "--json", check=0).stdout)
        text = c.call("status", check=0).stdout
    first, second = snap["hosts"]
    assert first["state"] == "ok" and first["url"] == f"http://127.0.0.1:{port_a}"
    run = a.latest("sleep")
    gpu0 = first["gpus"][0]
    assert gpu0["mem_used"] == 40 * 2**30 and gpu0["util_pct"] == 77
    assert [(p["stage"], p["run_id"], p["pid"]) for p in gpu0["processes"]] == [("sleep", run.id, run.pid)]
    assert second["state"] == "ok" and second["gpus"][0]["mem_used"] == 10 * 2**30
    assert not second["gpus"][0]["processes"]
    assert "GPU 0 " in text
    assert "runs: sleep run" in text
    # One node's exporter dies; the other hangs (stopped, its socket still accepting into the backlog).
    pa.kill()
    pa.wait()
    pb.send_signal(signal.SIGSTOP)
    wait_for(lambda: state(pb.pid) == "T", timeout=30)      # the kernel says it stopped
    proc = c.call("status", "--json", timeout=30)
    snap = json.loads(proc.stdout)
    first, second = snap["hosts"]
    assert first["state"] == "unreachable" and "refused" in first["reason"].lower(), first
    # Once (a loaded CI run) the stopped exporter answered `ok`: only a SIGCONT from outside the
    # test can do that, so its state after the read is part of the message.
    assert second["state"] == "no_answer" and "no answer within 2 s" in second["reason"], \
        (second, f"exporter's state now: {state(pb.pid)}")
    alerts = [x for x in snap["alerts"] if x["code"] == "host_unreachable"]
    assert len(alerts) == 2 and all(x["level"] == "warning" for x in alerts)
    assert proc.returncode == 1
    text = c.call("status", timeout=30).stdout
    assert f"http://127.0.0.1:{port_a}: unreachable" in text and "no answer" in text


@pytest.mark.parametrize("hosts, said", [
    ('"http://a:9457"', "expected a list"),
    ('["gpu-node-01"]', "expected an exporter's URL"),
    ('["http://a:9457/metrics x"]', "expected an exporter's URL"),
])
def test_bad_hosts_are_refused_at_load(ws, hosts, said):
    ws.write(f"hosts = {hosts}\n[stages.x]\nargv = [\"true\"]\n")
    proc = ws.call("status", "--json", check=3)
    assert "hosts" in proc.stderr and said in proc.stderr and "Traceback" not in proc.stderr


def test_the_gpu_pane_shows_the_other_hosts_and_a_dead_one_as_such(two_nodes, tmp_path):
    from tests.test_tui_helpers import make_app, pane_text, run, wait_until
    a, procs = two_nodes
    (pa, port_a), (_pb, port_b) = procs
    c = console(tmp_path, [port_a, port_b])
    sleep_run = a.latest("sleep")

    async def main():
        app = make_app(c.root, refresh_s=0.2)
        async with app.run_test(size=(160, 48)) as pilot:
            await wait_until(pilot, lambda: f"runs: sleep run {sleep_run.id}" in pane_text(app, "gpus"))
            text = pane_text(app, "gpus")
            assert f"http://127.0.0.1:{port_a}" in text and f"http://127.0.0.1:{port_b}" in text
            assert "GPUs (2" in str(app.query_one("#gpus").border_title)     # this host's own, as before
            pa.kill()
            await wait_until(pilot, lambda: f"127.0.0.1:{port_a}): unreachable" in pane_text(app, "gpus")
                             or f"127.0.0.1:{port_a}: unreachable" in pane_text(app, "gpus"))
    run(main())
