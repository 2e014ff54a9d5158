"""The serve stage end to end on CPU: real supervisor, real subprocesses, the fake
`launch_server` (tests/fake_launch_server.py) printing SGLang's log lines and serving
the test double's endpoints. What is fake: SGLang itself (it cannot run here)."""

from __future__ import annotations

import json
import os
import socket

from tests.conftest import ROOT, wait_for


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pipeline(port: int, tp: int = 1, gpus: str = "[0]", env: str = "") -> str:
    return f"""
[target]
path = "models/target"
architecture = "DeepseekV3ForCausalLM"

[stages.serve]
op = "serve"
gpus = {gpus}
params = {{ tp = {tp}, port = {port}, launcher = "tests.fake_launch_server", mem_fraction_static = 0.85 }}
env = {{ PYTHONPATH = "{ROOT}", FAKE_SGLANG_LOAD_S = "1.5", FAKE_SGLANG_WARMUP_S = "0.5"{env} }}
"""


def serve_state(ws) -> tuple[dict, dict, int]:
    proc = ws.call("status", "--json", "--no-gpus")
    snap = json.loads(proc.stdout)
    st = next(s for s in snap["stages"] if s["name"] == "serve")
    return st, snap, proc.returncode


def test_serve_stage_loading_then_ready_then_stopped(ws):
    port = free_port()
    # The server loads until `loaded`, touched once status said loading (no 1.5 s window to sample).
    loaded = ws.root / "loaded"
    ws.write(pipeline(port, env=f', FAKE_SGLANG_LOAD_UNTIL = "{loaded}"'))
    ws.cli("run", "serve", check=0)
    seen = []

    def ready():
        st, _snap, _code = serve_state(ws)
        if st["serve"]:
            seen.append(st["serve"]["state"])
            if st["serve"]["state"] == "loading":
                loaded.touch()
        # Ready, and its figures read in the same sample (each one at most 0.3 s).
        sv = st["serve"]
        return st if sv and sv["state"] == "ready" and sv["version"] and sv["metrics"] else None
    st = wait_for(ready, timeout=60, poll=0.1)
    assert "loading" in seen                 # the port stays closed while the weights load
    serve = st["serve"]
    assert serve["url"] == f"http://127.0.0.1:{port}" and serve["version"] == "0.5.23"
    assert serve["load_pct"] == 100 and serve["metrics"] is True
    # A load of 1.5 s and more (until told) + 0.5 s warm-up, read from the "fired up" line's stamp
    # (whole seconds).
    assert 1.0 <= serve["time_to_ready_s"] < 20
    assert serve["running_reqs"] == 0 and serve["kv_usage"] == 0.0
    # Each status is one sample (0.3 s probes): wait for one that read it ready with its figures.
    text = wait_for(lambda: (t := ws.call("status", "--no-gpus").stdout)
                    and f"serve: server ready http://127.0.0.1:{port}, ready after " in t
                    and "; running 0, queued 0, KV 0%" in t and t, timeout=30, poll=0.2)
    assert f"serve: server ready http://127.0.0.1:{port}, ready after " in text
    assert "; running 0, queued 0, KV 0%" in text
    log = (ws.root / ".eagle3").glob("logs/*serve.log")
    text = next(log).read_text()
    assert "serve: exec" in text and "tests.fake_launch_server" in text and "--mem-fraction-static" in text
    import psutil
    leader = psutil.Process(ws.latest("serve").pid)
    workers = leader.children()
    assert len(workers) == 1 and os.getpgid(workers[0].pid) == ws.latest("serve").pgid
    ws.cli("stop", "serve", check=0)
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    st, _snap, _code = serve_state(ws)
    assert st["status"] == "killed" and st["serve"]["state"] == "stopped"
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0      # the server's process is gone


def test_a_crash_with_sglangs_oom_message_is_a_critical_oom_alert(ws):
    ws.write(pipeline(free_port(), env=', FAKE_SGLANG_FAIL = "oom"'))
    ws.cli("run", "serve", check=0)
    ws.wait_status("serve", ("failed",))
    st, snap, code = serve_state(ws)
    oom = [a for a in snap["alerts"] if a["code"] == "oom"]
    assert oom and oom[0]["level"] == "critical"
    assert oom[0]["line"].startswith("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static")
    assert "mem_fraction_static=0.85" in oom[0]["line"]
    assert any(a["code"] == "server_died" for a in snap["alerts"])
    assert code == 2 and st["serve"]["state"] == "stopped"


def test_a_lint_error_refuses_the_launch_with_its_reason(ws):
    ws.write(pipeline(free_port(), tp=2, gpus="[0]"))
    proc = ws.call("run", "serve", check=3)
    assert "lint error: tp 2 x dp 1 = 2 GPUs, but the stage's gpus list has 1 (0)" in proc.stderr
    assert ws.latest("serve") is None


def test_force_starts_the_server_despite_a_lint_error(ws):
    # README: a lint error refuses the launch "unless --force"; the op must not refuse it again.
    port = free_port()
    ws.write(pipeline(port, tp=2, gpus="[0]"))
    proc = ws.cli("run", "serve", "--force", check=0)
    assert "lint error: tp 2 x dp 1 = 2 GPUs" in proc.stderr
    try:
        st = wait_for(lambda: (lambda s: s if s["serve"] and s["serve"]["state"] == "ready" else None)(
            serve_state(ws)[0]), timeout=30, poll=0.2)
        assert st["status"] == "running"
        log = next((ws.root / ".eagle3").glob("logs/*serve.log")).read_text()
        assert "serve: lint error: tp 2 x dp 1 = 2 GPUs" in log
        assert "serve: --force: starting despite 1 lint error(s)" in log and "serve: exec" in log
    finally:
        ws.cli("stop", "serve", "--grace", "2")


def test_a_port_another_server_holds_is_refused_before_the_load(ws):
    # SGLang binds its HTTP port only after the weights loaded (22 minutes on the real
    # target); meanwhile the monitor would read the other server's /ready as this one's.
    from tests.sglang_double import Double
    other = Double(speculative=False).start()
    other.status = "Up"
    try:
        ws.write(pipeline(other.port))
        ws.cli("run", "serve", check=0)
        run = ws.wait_status("serve", ("failed", "succeeded"), timeout=20)
        assert run.exit_code == 2
        log = next((ws.root / ".eagle3").glob("logs/*serve.log")).read_text()
        assert (f"serve: error: port {other.port} on 127.0.0.1 is in use (another server?): "
                f"stop it or choose another port") in log
        assert "Load weight begin" not in log and "Traceback" not in log
    finally:
        other.stop()


def test_the_restart_plan_shows_the_lints_and_refuses_on_an_error(ws):
    port = free_port()
    ws.write(pipeline(port, env=', FAKE_SGLANG_FAIL = "oom"'))
    ws.cli("run", "serve", check=0)
    ws.wait_status("serve", ("failed",))
    plan = ws.cli("restart", "serve", "--set", 'extra_args=["--disable-cuda-graph"]', check=0)
    assert "lint warning: extra_args --disable-cuda-graph: deprecated in sglang 0.5.23" in plan.stdout
    plan = ws.call("restart", "serve", "--set", "tp=2", check=2)
    assert "refused: stage 'serve': tp 2 x dp 1 = 2 GPUs, but the stage's gpus list has 1 (0)" in plan.stdout


def test_kill_workers_reaches_workers_that_outlived_the_server(ws):
    ws.write(pipeline(free_port(), tp=2, gpus="[0, 1]", env=', FAKE_SGLANG_FAIL = "oom", FAKE_SGLANG_ORPHANS = "1"'))
    ws.cli("run", "serve", check=0)
    run = ws.wait_status("serve", ("failed",))
    left = _alive_in(run.pgid)
    assert len(left) == 2                       # the two "TP workers", their server gone
    plan = ws.cli("kill-workers", "serve", check=0)
    assert all(str(p.pid) in plan.stdout for p in left)
    ws.cli("kill-workers", "serve", "--yes", "--grace", "1")
    assert not _alive_in(run.pgid)


def _alive_in(pgid: int) -> list:
    import psutil
    out = []
    for p in psutil.process_iter():
        try:
            if _pgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:   # a zombie is dead, unreaped
                out.append(p)
        except psutil.Error:
            continue
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def bench_pipeline(spec_port: int, base_port: int, bench_params: str) -> str:
    return f"""
[target]
path = "models/target"
architecture = "LlamaForCausalLM"

[stages.serve_spec]
op = "serve"
gpus = [0]
params = {{ port = {spec_port}, mode = "speculative", drafter = "runs/export", launcher = "tests.fake_launch_server" }}

[stages.serve_base]
op = "serve"
gpus = [1]
params = {{ port = {base_port}, host = "127.0.0.2", launcher = "tests.fake_launch_server" }}

[stages.bench_sglang]
op = "bench"
params = {{ engine = "sglang", prompts_file = "prompts.jsonl", output = "runs/bench_sglang", {bench_params} }}
"""


def test_bench_names_its_servers_by_serve_stage_and_the_console_binds_their_urls(ws):
    """params.server / baseline_server name serve stages; the launch's argv (the
    plan shown is the plan run) carries the URLs their host and port make."""
    ws.write(bench_pipeline(31001, 31002, 'server = "serve_spec", baseline_server = "serve_base", '
                                          'ready_timeout_s = 1'))
    (ws.root / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3, 4]}\n')
    ws.cli("run", "bench_sglang", check=0)
    run = ws.latest("bench_sglang")
    argv = run.argv
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:31001"
    assert argv[argv.index("--baseline-url") + 1] == "http://127.0.0.2:31002"
    assert argv[argv.index("--server") + 1] == "serve_spec"
    run = ws.wait_status("bench_sglang", ("failed", "succeeded"), timeout=30)
    log = next((ws.root / ".eagle3").glob("logs/*bench_sglang.log")).read_text()
    assert run.status == "failed" and run.exit_code == 2, log
    assert "http://127.0.0.1:31001 (serve stage serve_spec)" in log   # no server up: the op says so and ends
    assert "error: http://127.0.0.1:31001: not ready within ready_timeout_s 1 s: /ready: connection refused" in log


def test_a_server_param_that_names_no_serve_stage_or_the_wrong_mode_is_refused(ws):
    ws.write(bench_pipeline(31001, 31002, 'server = "bench_sglang"'))
    proc = ws.call("run", "bench_sglang", check=3)
    assert "stages.bench_sglang.params.server: 'bench_sglang' is not a serve stage " \
           "(serve stages: serve_spec, serve_base)" in proc.stderr
    ws.write(bench_pipeline(31001, 31002, 'server = "serve_base"'))
    proc = ws.call("run", "bench_sglang", check=3)
    assert "serve stage 'serve_base' has mode 'target'; server needs a 'speculative' server" in proc.stderr
    ws.write(bench_pipeline(31001, 31002, 'server = "serve_spec"'))
    proc = ws.call("run", "bench_sglang", "--set", "url=http://x:1", check=3)
    assert "names a serve stage and url is set too; set one of them" in proc.stderr
    assert ws.latest("bench_sglang") is None


def test_a_server_bound_to_every_interface_is_reached_on_loopback(ws):
    """The URL the console gives bench is the one its serve monitor polls."""
    ws.write(bench_pipeline(31003, 31004, 'server = "serve_spec", ready_timeout_s = 1').replace(
        'port = 31003, mode', 'port = 31003, host = "0.0.0.0", mode'))
    (ws.root / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3, 4]}\n')
    ws.cli("run", "bench_sglang", check=0)
    argv = ws.latest("bench_sglang").argv
    assert argv[argv.index("--url") + 1] == "http://127.0.0.1:31003"
    run = ws.wait_status("bench_sglang", ("failed", "succeeded"), timeout=30)
    log = next((ws.root / ".eagle3").glob("logs/*bench_sglang.log")).read_text()
    # No server is up: the op polls the loopback URL it was given and says so.
    assert run.status == "failed" and run.exit_code == 2, log
    assert "http://127.0.0.1:31003 (serve stage serve_spec)" in log, log


def test_a_server_without_ready_warms_up_then_is_ready_and_never_critical(ws):
    """SGLang 0.5.17 has no /ready (404): the issue's console said CRITICAL `unhealthy ...
    (/ready answered 404)` on a healthy server. The fake serves that release's endpoints."""
    port = free_port()
    ws.write(pipeline(port, env=', FAKE_SGLANG_VERSION = "0.5.17"').replace(
        'FAKE_SGLANG_WARMUP_S = "0.5"', 'FAKE_SGLANG_WARMUP_S = "2.5"'))
    ws.cli("run", "serve", check=0)
    seen, alerts = [], []

    def ready():
        st, snap, _code = serve_state(ws)
        alerts.extend(a for a in snap["alerts"] if a["stage"] == "serve")
        if st["serve"]:
            seen.append((st["serve"]["state"], st["serve"]["reason"]))
        return st if st["serve"] and st["serve"]["state"] == "ready" else None
    try:
        st = wait_for(ready, timeout=40, poll=0.1)
        for _ in range(5):          # and it stays ready, the "fired up" line in the log
            st = ready() or serve_state(ws)[0]
        assert st["serve"]["state"] == "ready" and st["serve"]["version"] == "0.5.17"
        assert st["serve"]["readiness"] == "/health_generate"
        assert ("warming_up", "/health_generate answered 503 (this server has no /ready)") in seen
        assert alerts == [] and not any(s == "unhealthy" for s, _ in seen)
    finally:
        ws.cli("stop", "serve", "--grace", "2")


def test_bench_started_with_its_serve_stage_waits_for_it(ws):
    """The issue's bench gave up after its 10 s probe while the server was still starting."""
    port = free_port()
    export = ws.root / "runs" / "export"
    (export / "sglang").mkdir(parents=True)
    (export / "sglang" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}))
    (ws.root / "prompts.jsonl").write_text('{"input_ids": [1, 2, 3, 4]}\n{"input_ids": [5, 6, 7]}\n')
    # The server loads until `loaded`, touched once bench says it waits (not a 5 s load that a
    # loaded machine could spend before bench started).
    loaded = ws.root / "loaded"
    ws.write(f"""
[target]
path = "models/target"
architecture = "LlamaForCausalLM"

[stages.serve_spec]
op = "serve"
gpus = [0]
params = {{ port = {port}, mode = "speculative", drafter = "runs/export", launcher = "tests.fake_launch_server" }}
env = {{ PYTHONPATH = "{ROOT}", FAKE_SGLANG_LOAD_S = "0.5", FAKE_SGLANG_LOAD_UNTIL = "{loaded}", FAKE_SGLANG_WARMUP_S = "2", FAKE_SGLANG_VERSION = "0.5.17" }}

[stages.bench_sglang]
op = "bench"
params = {{ engine = "sglang", server = "serve_spec", prompts_file = "prompts.jsonl", output = "runs/bench_sglang", max_new_tokens = 16, ready_timeout_s = 60 }}
""")
    ws.cli("run", "serve_spec", check=0)
    waiting = f"bench: waiting for http://127.0.0.1:{port} to be ready: /ready: "
    try:
        ws.cli("run", "bench_sglang", check=0)

        def bench_waits() -> bool:
            logs = (ws.root / ".eagle3").glob("logs/*bench_sglang.log")
            return any(waiting in p.read_text() for p in logs) or not ws.latest("bench_sglang").live
        wait_for(bench_waits, timeout=60)
        loaded.touch()
        run = ws.wait_status("bench_sglang", ("succeeded", "failed"), timeout=60)
        log = next((ws.root / ".eagle3").glob("logs/*bench_sglang.log")).read_text()
        assert run.status == "succeeded", log
        assert waiting in log, log
        assert f"bench: http://127.0.0.1:{port} ready after " in log
        r = json.loads((ws.root / "runs" / "bench_sglang" / "bench.json").read_text())
        assert r["server"]["version"] == "0.5.17" and r["acceptance_length"] > 1
    finally:
        ws.cli("stop", "serve_spec", "--grace", "2")
