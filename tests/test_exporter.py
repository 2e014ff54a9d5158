"""`eagle3-console exporter` (issue 12, s1): a real exporter process on a free
port against a real workspace (runs started through the CLI, records in the
SQLite registry, op records on disk), scraped over HTTP with urllib and read
back with prometheus-client's own text parser."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import PY, ROOT, stage_cmd, wait_for

parser = pytest.importorskip("prometheus_client.parser")

TRAIN_RECORDS = [
    {"step": 10, "total": 40, "epoch": 0, "loss": 3.5, "step_loss": [1.2, 1.4, 1.6], "acc": [0.5, 0.4, 0.3],
     "counted": [900, 880, 860], "simulated_acceptance_length": 1.76, "tok_s": 1200.0, "lr": 1e-4,
     "grad_norm": 0.9},
    # An older writer's record (no simulated field): the exporter computes it from acc.
    {"step": 20, "total": 40, "epoch": 0, "loss": 2.25, "step_loss": [0.8, 1.0, 1.2], "acc": [0.8, 0.5, 0.25],
     "counted": [900, 880, 860], "tok_s": 1500.0, "lr": 9e-5, "grad_norm": 0.7},
]
BENCH = {"acceptance_length": 2.71, "draft_tokens": 3, "accept_rate_per_position": [0.81, 0.62, 0.5],
         "speedup": 1.4, "outputs_match": True, "tokens": 384}


def pipeline() -> str:
    return f"""
[target]
path = "assets/target"
num_layers = 8
hidden_size = 64
dtype = "float32"
vocab_size = 512

[stages.hs]
argv = {stage_cmd("shards.py", "--output", "out/hs", "--n", "{n}", "--rows", "5")}
params = {{ n = 10 }}
outputs = ["out/hs"]
expected_samples = 1000000000000

[stages.oomer]
argv = {stage_cmd("shards.py", "--output", "out/oom", "--n", "30", "--rows", "10", "--crash-at", "12")}
outputs = ["out/oom"]
expected_samples = 30

[stages.train]
op = "train"
params = {{ data = "data/hs", vocab = "data/vocab", output = "runs/train", ttt_steps = 3 }}

[stages.bench]
op = "bench"
params = {{ drafter = "runs/export", output = "runs/bench" }}
"""


def seed(ws) -> None:
    """hs succeeds 10 of 10^12 expected samples (projected far beyond any disk),
    oomer fails with an out-of-memory, train and bench have runs and records."""
    from eagle3_console.kernel.registry import Registry
    from eagle3_console.kernel.workspace import Workspace

    ws.write(pipeline())
    ws.cli("run", "hs", "--force", check=0)
    ws.cli("run", "oomer", check=0)
    ws.wait_status("hs", ("succeeded",))
    ws.wait_status("oomer", ("failed",))
    train_out = ws.root / "runs" / "train"
    train_out.mkdir(parents=True)
    (train_out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN_RECORDS))
    (ws.root / "runs" / "bench").mkdir(parents=True)
    (ws.root / "runs" / "bench" / "bench.json").write_text(json.dumps(BENCH))
    w = Workspace.at(ws.root)
    now = time.time()
    with Registry(w.db_path) as reg:
        for stage, params in (("train", {"data": "data/hs", "vocab": "data/vocab", "output": "runs/train",
                                         "ttt_steps": 3}),
                              ("bench", {"drafter": "runs/export", "output": "runs/bench"})):
            r = reg.create_run(stage, ["python", "-m", f"ops.{stage}"], params, {}, str(ws.root),
                               lambda rid, s=stage: w.log_path(rid, s))
            Path(r.log_path).write_text("done\n")
            reg.update(r.id, status="running", started=now - 120, pid=None)
            reg.finish(r.id, "succeeded", ended=now - 60, exit_code=0)


def start(argv: list[str], cwd: Path, own_session: bool = False) -> tuple[subprocess.Popen, int]:
    """An exporter and its port. `own_session`: out of the test run's process group, so that
    nothing signalled to that group (nor the kernel's SIGHUP + SIGCONT to a stopped member of a
    group left orphaned) reaches it: for a test that stops it on purpose."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("EAGLE3_WORKSPACE", None)
    proc = subprocess.Popen(argv, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=own_session)
    line = proc.stdout.readline()
    m = re.search(r"http://127\.0\.0\.1:(\d+)/metrics", line)
    if not m:
        proc.kill()
        raise AssertionError(f"no serving line: {line!r} {proc.stderr.read()}")
    return proc, int(m.group(1))


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def scrape(port: int) -> dict[str, list]:
    """Sample name -> [(labels, value)], parsed by prometheus-client's parser."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        text = resp.read().decode()
    out: dict[str, list] = {}
    for fam in parser.text_string_to_metric_families(text):
        assert fam.name.startswith("eagle3"), fam.name
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples: dict, name: str, **labels) -> float:
    hits = [v for lab, v in samples.get(name, []) if all(lab.get(k) == str(x) for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, samples.get(name))
    return hits[0]


def test_scraped_over_http_and_parsed(ws):
    seed(ws)
    proc, port = start([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "exporter", "--port", "0",
                        "--interval", "30"], ws.root)
    try:
        m = scrape(port)
    finally:
        stop(proc)
    assert proc.returncode == 0, proc.stderr.read()
    with ws.registry() as reg:
        oom_run, hs_run = reg.latest("oomer"), reg.latest("hs")
    # Stages: one-hot status, run id, exit code.
    assert value(m, "eagle3_stage_status", stage="oomer", status="failed") == 1
    assert value(m, "eagle3_stage_status", stage="oomer", status="running") == 0
    assert value(m, "eagle3_stage_status", stage="hs", status="succeeded") == 1
    assert value(m, "eagle3_stage_run_id", stage="oomer") == oom_run.id
    assert value(m, "eagle3_stage_exit_code", stage="oomer") == 1
    assert value(m, "eagle3_stage_info", stage="train", op="train") == 1
    # The count decides the ratio, after success too (never "100% (10/10^12)"; issue 9).
    assert value(m, "eagle3_stage_progress_ratio", stage="hs") == pytest.approx(10 / 10**12)
    assert value(m, "eagle3_stage_samples_done", stage="hs") == 10
    assert value(m, "eagle3_stage_tokens_done", stage="hs") == 10 * 16
    # Alerts by level and code; health.
    assert value(m, "eagle3_alerts", level="critical", code="oom") == 1
    assert value(m, "eagle3_alerts", level="critical", code="stage_failed") == 1
    assert value(m, "eagle3_alerts", level="warning", code="disk_short") == 1
    assert value(m, "eagle3_health", level="critical") == 1 and value(m, "eagle3_health_exit_code") == 2
    # Disk, in bytes: written, projected far beyond free, does not fit.
    hs_path = str(ws.root / "out" / "hs")
    written = value(m, "eagle3_output_written_bytes", stage="hs", path=hs_path)
    assert written > 10 * 16 * 8
    assert value(m, "eagle3_output_projected_bytes", stage="hs", path=hs_path) > value(
        m, "eagle3_output_free_bytes", stage="hs", path=hs_path)
    assert value(m, "eagle3_output_fits", stage="hs", path=hs_path) == 0
    assert value(m, "eagle3_output_fits", stage="oomer", path=str(ws.root / "out" / "oom")) == 1
    # Training: the last record's loss, per-step accuracy, simulated acceptance length (computed
    # from acc when the record predates the field: 1 + .8 + .4 + .1).
    assert value(m, "eagle3_train_loss", stage="train") == 2.25
    assert value(m, "eagle3_train_step", stage="train") == 20
    assert [value(m, "eagle3_train_step_accuracy_ratio", stage="train", ttt_step=k) for k in (1, 2, 3)] == [
        0.8, 0.5, 0.25]
    assert value(m, "eagle3_train_simulated_acceptance_length", stage="train") == pytest.approx(2.3)
    assert value(m, "eagle3_train_tokens_per_second", stage="train") == 1500.0
    # Bench.
    assert value(m, "eagle3_bench_acceptance_length", stage="bench") == 2.71
    assert value(m, "eagle3_bench_accept_rate_ratio", stage="bench", position=2) == 0.62
    assert value(m, "eagle3_bench_outputs_match", stage="bench") == 1
    # No NVIDIA driver here: said, not faked.
    assert value(m, "eagle3_gpus_available") == 0 and "eagle3_gpu_memory_used_bytes" not in m
    assert value(m, "eagle3_exporter_collect_errors_total") == 0
    assert hs_run.id != oom_run.id


def test_sampling_is_off_the_request_path(ws):
    """Scrapes read the last snapshot: a burst of scrapes takes no snapshot;
    the interval does."""
    ws.write(pipeline())
    proc, port = start([PY, "-m", "eagle3_console.cli", "-w", str(ws.root), "exporter", "--port", "0",
                        "--interval", "1", "--no-gpus"], ws.root)
    try:
        first = scrape(port)
        taken = value(first, "eagle3_exporter_snapshots_total")
        t0 = time.monotonic()
        burst = [scrape(port) for _ in range(30)]
        elapsed = time.monotonic() - t0
        after_burst = value(burst[-1], "eagle3_exporter_snapshots_total")
        # At most the interval's own snapshots during the burst, never one a scrape.
        assert after_burst - taken <= elapsed / 1.0 + 1, (taken, after_burst, elapsed)
        wait_for(lambda: value(scrape(port), "eagle3_exporter_snapshots_total") >= after_burst + 2, timeout=15)
    finally:
        stop(proc)


def test_gpu_series_carry_nvitop_exporters_labels_and_the_owning_run(ws):
    """A fake NVML (tests/fake_pynvml.py) whose GPU 0 lists the pid of a real,
    running stage: the exporter ties it to its run."""
    ws.write(f"""
[stages.sleep]
argv = {stage_cmd("sleeper.py", "--seconds", "60")}
""")
    ws.cli("run", "sleep", check=0)
    run = ws.wait_status("sleep", ("running",))
    probe = textwrap.dedent(f"""
        import sys
        from tests.fake_pynvml import FakeGpu, FakeNvml
        from eagle3_console.observe import exporter
        from eagle3_console.monitor.gpus import Nvml
        from eagle3_console.observe.snapshot import Collector
        from eagle3_console.kernel.workspace import Workspace
        gpus = [FakeGpu(mem_used=40 * 2**30, util=93, temp=61, power_mw=412_000, compute={{{run.pid}: 39 * 2**30}}),
                FakeGpu()]
        col = Collector(Workspace.at({str(ws.root)!r}), nvml=Nvml(module=FakeNvml(gpus=gpus)))
        sys.exit(exporter.serve(col.collect, "127.0.0.1", 0, 30, say=lambda m: print(m, flush=True)))
    """)
    proc, port = start([PY, "-c", probe], ROOT)
    try:
        m = scrape(port)
    finally:
        stop(proc)
        ws.cli("stop", "sleep", "--grace", "1")
    assert proc.returncode == 0, proc.stderr.read()
    labels, used = next((lab, v) for lab, v in m["eagle3_gpu_memory_used_bytes"] if lab["index"] == "0")
    assert set(labels) == {"hostname", "index", "devicename", "uuid"}     # nvitop-exporter's names
    assert used == 40 * 2**30 and labels["uuid"].startswith("GPU-")
    assert value(m, "eagle3_gpu_utilization_ratio", index=0) == 0.93
    assert value(m, "eagle3_gpu_temperature_celsius", index=0) == 61
    assert value(m, "eagle3_gpu_power_watts", index=0) == 412
    assert value(m, "eagle3_gpu_processes", index=0, stage="sleep", run_id=run.id) == 1
    assert value(m, "eagle3_gpu_processes_memory_used_bytes", index=0, stage="sleep", run_id=run.id) == 39 * 2**30
    assert not [lab for lab, _ in m.get("eagle3_gpu_processes", []) if lab["index"] == "1"]
    assert value(m, "eagle3_gpus_available") == 1


def test_exporter_process_imports_neither_textual_nor_torch(ws):
    """After a real snapshot and a real scrape, in the exporter's own process."""
    ws.write(pipeline())
    probe = textwrap.dedent(f"""
        import os, signal, socket, sys, threading, time, urllib.request
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        def scrape_then_stop():
            for _ in range(200):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{{port}}/metrics", timeout=5).read()
                    break
                except OSError:
                    time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=scrape_then_stop, daemon=True).start()
        sys.argv = ["eagle3-console", "-w", {str(ws.root)!r}, "exporter", "--port", str(port), "--no-gpus"]
        from eagle3_console import cli
        try:
            cli.app()
        except SystemExit as exc:
            sys.stderr.write(f"EXIT={{exc.code}}\\n")
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "torch", "transformers"))
        sys.stderr.write("HEAVY=" + ",".join(heavy) + "\\n")
        sys.stderr.write("PROM=" + str("prometheus_client" in sys.modules) + "\\n")
    """)
    proc = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    lines = dict(l.split("=", 1) for l in proc.stderr.splitlines() if re.match(r"^(EXIT|HEAVY|PROM)=", l))
    assert lines.get("EXIT") == "0" and lines.get("PROM") == "True", proc.stderr
    assert lines["HEAVY"] == "", lines["HEAVY"]


def test_a_port_in_use_is_one_line_exit_3(ws):
    import socket

    ws.write(pipeline())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = ws.cli("exporter", "--port", str(port), "--no-gpus", timeout=30)
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert proc.stderr.strip() == f"error: cannot listen on 127.0.0.1:{port}: Address already in use", proc.stderr
