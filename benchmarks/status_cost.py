"""What one refresh of collect() costs against the loop operators run today.

Builds a workspace with a 10-shard x 2,000-sample output and a 1 GB log (the
log of a real registered run), then in the same invocation times:
  baseline: `du -sh DIR; ls DIR | head; tail -n 50 LOG` (one shell, as typed)
  refresh:  Collector.collect() after the first (the TUI's steady state)
  process:  `eagle3-console status --json` as a whole process (after a first
            one, so its persisted cache is warm, as under cron)
and prints the ratios. Goals: refresh <= 1/10 of baseline; process <= 0.5 s.
On a GPU machine, --gpu-worker also starts a supervised stage holding 2 GiB
of GPU memory and times `status --json` with NVML live against
`nvidia-smi --query-gpu=memory.used,memory.total --format=csv` (issue 11's
goal: <= 0.15 s); --profile DIR writes `-X importtime` and a cProfile of one
such process there. Both modes print where the time of one process goes, by
phase (imports, registry, monitors, cache, NVML, processes, JSON out: medians
of --repeat processes of benchmarks/status_phases.py, the real entry point
with timers around each phase). Timed processes run with bytecode caching on
(PYTHONDONTWRITEBYTECODE unset), as an installed package has it.
It also times, in-process, the whole ProcessTable.snapshot() against the
ProcessTable.partial() that names the GPU processes' owners (--tables: that alone).
Usage: python benchmarks/status_cost.py [--dir DIR] [--log-gb 1] [--repeat 5] [--gpu-worker] [--profile DIR] [--tables]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_console.kernel.registry import Registry  # noqa: E402
from eagle3_console.observe.snapshot import Collector  # noqa: E402
from eagle3_console.kernel.workspace import Workspace  # noqa: E402


def sample_bytes(idx: int, tokens: int = 64) -> bytes:
    import struct
    data = bytes([idx % 256]) * (tokens * 8)
    header = json.dumps({"input_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [0, tokens * 8]}}).encode()
    header += b" " * (-len(header) % 8)
    return struct.pack("<Q", len(header)) + header + data


def build(root: Path, log_gb: float) -> tuple[Path, Path]:
    out = root / "data" / "hidden_states"
    if not (out / "rows_18000-20000").exists():
        for i in range(20000):
            shard = out / f"rows_{i // 2000 * 2000}-{i // 2000 * 2000 + 2000}"
            shard.mkdir(parents=True, exist_ok=True)
            (shard / f"data_{i}.safetensors").write_bytes(sample_bytes(i))
        (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": 20000}))
        # Written an hour ago, as the finished shards of a long extraction are: 20,000
        # files written in the last seconds (all inside the rate window) is no state
        # a real output is in, and would time that instead. grow() adds the live file.
        old = time.time() - 3600
        for dirpath, _dirs, files in os.walk(out):
            for name in files:
                os.utime(os.path.join(dirpath, name), (old, old))
        for dirpath, _dirs, _files in sorted(os.walk(out), key=lambda t: -len(t[0])):
            os.utime(dirpath, (old, old))
    (root / "eagle3.toml").write_text(
        '[stages.extract]\nargv = ["python", "-c", "pass"]\noutputs = ["data/hidden_states"]\n'
        "expected_samples = 20000\n")
    ws = Workspace(root)
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        run = reg.latest("extract")
        if run is None:
            run = reg.create_run("extract", ["python"], {}, {}, str(root), lambda _rid: root / "big.log")
            reg.finish(run.id, "failed", started=time.time() - 3600, ended=time.time(), exit_code=1)
    # The run's own log (the registry names a fresh file when big.log exists
    # already): a log no follower reads would time nothing.
    log = Path(run.log_path)
    want = int(log_gb * 2**30)
    if not log.exists() or log.stat().st_size < want:
        line = ("extract: 48%|####      | 9600/20000 [40:00<43:20, 4.00it/s] "
                "progress: samples 9600/20000 tokens 4915200 errors 0 tok/s 2048.0\n").encode()
        block = line * (8 * 2**20 // len(line))
        with open(log, "wb") as fh:
            written = 0
            while written < want:
                fh.write(block)
                written += len(block)
    return out, log


# Compiling every module from source on each call is no installed console's cost.
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
PHASES = Path(__file__).resolve().parent / "status_phases.py"


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=ENV, **kw)


def phases(root: Path, repeat: int, no_gpus: bool, out: Path | None = None) -> None:
    """Median milliseconds of each phase over `repeat` whole processes; with
    `out`, a sample file is added or removed before each (the live path)."""
    samples: list[dict] = []
    walls: list[float] = []
    for _ in range(repeat):
        if out is not None:
            grow(out)
        t0 = time.perf_counter()
        proc = run([sys.executable, str(PHASES), str(root)] + (["--no-gpus"] if no_gpus else []),
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        line = next((x for x in proc.stderr.splitlines() if x.startswith("PHASES=")), None)
        if line is None:
            print(f"phase breakdown failed: {proc.stderr.strip()[-500:]}")
            return
        walls.append((time.perf_counter() - t0) * 1000)
        samples.append(json.loads(line[len("PHASES="):])["ms"])
    names = list(dict.fromkeys(k for s in samples for k in s))
    label = (" --no-gpus" if no_gpus else "") + (" (output growing)" if out is not None else "")
    print(f"where one status --json{label} process goes "
          f"(ms, median of {repeat}, after interpreter start):")
    medians = {name: statistics.median(s.get(name, 0.0) for s in samples) for name in names}
    for name, ms in medians.items():
        print(f"  {name:42s} {ms:8.1f}")
    # What the timers cannot see: interpreter start, module teardown, exit.
    print(f"  {'the same process seen from outside (wall)':42s} {statistics.median(walls):8.1f}")
    # One line for gpu_session.sh's summary.
    print(f"status phases{label} (ms): "
          + ", ".join(f"{name.split(' (')[0]} {ms:.1f}" for name, ms in medians.items()))


def grow(out: Path) -> None:
    """One sample file more or less in the last shard, as a live extraction
    changes one shard folder between two cron ticks."""
    extra = out / "rows_18000-20000" / "data_99999.safetensors"
    if extra.exists():
        extra.unlink()
    else:
        extra.write_bytes(sample_bytes(99999))
    time.sleep(0.06)        # past the racy-listing margin (monitor/tree.py), as one cron tick is


def settle(cmd: list[str], out: Path) -> None:
    extra = out / "rows_18000-20000" / "data_99999.safetensors"
    if extra.exists():
        extra.unlink()
    run(cmd, stdout=subprocess.DEVNULL)     # settled again for what follows


def live_status(cmd: list[str], out: Path, repeat: int) -> float:
    """status --json with the output changing between calls, as under a live
    extraction (each call finds one shard folder with a new mtime)."""
    times = []
    for i in range(repeat):
        grow(out)
        t0 = time.perf_counter()
        run(cmd, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    settle(cmd, out)
    return statistics.median(times)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def table_cost(repeat: int = 20) -> tuple[float, float]:
    """In-process: the whole machine's ProcessTable.snapshot() against the
    partial table that names the owners of a few GPU processes (issue 11: the
    walk was 22 ms of one status process on an H200 host). A leader in its
    own group with a worker, and an unrelated process, stand in for the GPU
    processes; both tables must give the same owners. Runs on any machine."""
    import psutil
    from eagle3_console.monitor.procs import ProcessTable, RunRef
    leader = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "w = subprocess.Popen(['sleep', '60']); print(w.pid, flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, process_group=0)
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)     # not in the run's session
    try:
        worker = int(leader.stdout.readline())
        ref = RunRef(run_id=1, stage="gpuworker", pid=leader.pid, create_time=psutil.Process(leader.pid).create_time(),
                     pgid=leader.pid, sid=os.getsid(leader.pid), workspace="/ws/bench")
        pids = {worker, leader.pid, other.pid}
        full_owners = ProcessTable.snapshot().owners([ref], only=pids)
        part = ProcessTable.partial(pids, [ref])
        assert {p: i.how for p, i in part.owners([ref], only=pids).items()} \
            == {p: i.how for p, i in full_owners.items()} == {worker: "tree", leader.pid: "leader"}
        full_s = timed(ProcessTable.snapshot, repeat)
        part_s = timed(lambda: ProcessTable.partial(pids, [ref]), repeat)
        rows = len(ProcessTable.snapshot().rows)
    finally:
        for p in (other, leader):
            p.kill()
            p.wait()
    print(f"ProcessTable.snapshot() ({rows} processes, median of {repeat}): {full_s * 1000:8.2f} ms")
    print(f"ProcessTable.partial({len(pids)} pids, {len(part.rows)} rows read):     {part_s * 1000:8.2f} ms  "
          f"ratio partial/snapshot = {part_s / full_s:.3f}")
    return full_s, part_s


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--log-gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gpu-worker", action="store_true",
                    help="GPU machine: time status --json with NVML live while a stage holds GPU memory")
    ap.add_argument("--worker-python", default=sys.executable,
                    help="the interpreter (with torch) of the GPU worker stage (default: this one)")
    ap.add_argument("--profile", type=Path, default=None, help="write importtime and cProfile output here")
    ap.add_argument("--tables", action="store_true",
                    help="only time ProcessTable.snapshot() against ProcessTable.partial() (no workspace)")
    a = ap.parse_args()
    if a.tables:
        table_cost()
        return 0
    root = a.dir or Path(tempfile.mkdtemp(prefix="status-cost-"))
    root.mkdir(parents=True, exist_ok=True)
    out, log = build(root, a.log_gb)
    shell = f"du -sh {out}; ls {out} | head; tail -n 50 {log}"
    baseline = timed(lambda: subprocess.run(["bash", "-c", shell], stdout=subprocess.DEVNULL, check=True), a.repeat)

    col = Collector(Workspace(root), gpus=False)
    t0 = time.perf_counter()
    first = col.collect()
    first_s = time.perf_counter() - t0
    refresh = timed(col.collect, a.repeat)
    snap = col.collect()
    st = snap.stages[0]
    assert st.shards and st.shards.samples_done == 20000, st.shards

    cmd = [sys.executable, "-m", "eagle3_console.cli", "-w", str(root), "status", "--json", "--no-gpus"]
    run(cmd, stdout=subprocess.DEVNULL)     # warms .eagle3/cache (and bytecode) like a previous cron tick
    process = timed(lambda: run(cmd, stdout=subprocess.DEVNULL), a.repeat)
    bare = timed(lambda: run([sys.executable, "-c", "pass"]), a.repeat)
    live = live_status(cmd, out, a.repeat)

    print(f"workspace: {root} (20,000 samples in 10 shards, log {log.stat().st_size / 2**30:.2f} GiB)")
    print(f"baseline du+ls+tail loop:     {baseline * 1000:8.1f} ms")
    print(f"collect() first pass:         {first_s * 1000:8.1f} ms  (samples seen: {first.stages[0].shards.samples_done})")
    print(f"collect() refresh (median):   {refresh * 1000:8.1f} ms  ratio refresh/baseline = {refresh / baseline:.3f} "
          f"(goal <= 0.100: {'PASS' if refresh <= baseline / 10 else 'FAIL'})")
    print(f"python -c pass (interpreter): {bare * 1000:8.1f} ms")
    print(f"status --json whole process:  {process * 1000:8.1f} ms  (goal <= 500 ms: {'PASS' if process <= 0.5 else 'FAIL'}; "
          f"--no-gpus, cache warm)")
    print(f"status --json, output growing:{live * 1000:8.1f} ms  (a sample file added or removed before each call: "
          "its shard's folder changed, so the output's per-file state is read and rewritten)")
    table_cost()
    phases(root, a.repeat, no_gpus=True)
    phases(root, a.repeat, no_gpus=True, out=out)
    settle(cmd, out)
    if a.gpu_worker:
        gpu_status(root, a.repeat, a.profile, a.worker_python)
    elif a.profile:
        profile(cmd, a.profile, "status_no_gpus")
    return 0


def profile(cmd: list[str], directory: Path, name: str) -> None:
    """One process under -X importtime and one under cProfile (both stdlib)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{name}_importtime.txt", "w") as fh:
        run([cmd[0], "-X", "importtime", *cmd[1:]], stdout=subprocess.DEVNULL, stderr=fh)
    # What the interpreter imports before any of ours (site, .pth files): `python -c pass`'s share.
    with open(directory / "interpreter_importtime.txt", "w") as fh:
        run([cmd[0], "-X", "importtime", "-c", "pass"], stderr=fh)
    prof = directory / f"{name}.prof"
    run([cmd[0], "-m", "cProfile", "-o", str(prof), *cmd[1:]], stdout=subprocess.DEVNULL)
    import pstats
    with open(directory / f"{name}_profile.txt", "w") as fh:
        pstats.Stats(str(prof), stream=fh).sort_stats("cumulative").print_stats(40)
    print(f"profiles: {directory}/{name}_importtime.txt, {name}_profile.txt")


WORKER = ("import time, torch; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); "
          "torch.cuda.synchronize(); print('worker holds 2 GiB', flush=True); time.sleep(900)")


def gpu_status(root: Path, repeat: int, profile_dir: Path | None, worker_python: str) -> None:
    """status --json with NVML live and a supervised stage on the GPU, beside nvidia-smi."""
    toml = root / "eagle3.toml"
    text = toml.read_text()
    if "[stages.gpuworker]" not in text:
        # An absolute path: a stage's bare "python" is the console's own interpreter,
        # which in a venv of the console's own has no torch.
        toml.write_text(text + f"\n[stages.gpuworker]\nargv = [{json.dumps(worker_python)}, \"-c\", "
                        f"{json.dumps(WORKER)}]\n")
    cli = [sys.executable, "-m", "eagle3_console.cli", "-w", str(root)]
    run([*cli, "run", "gpuworker", "--force"], check=True, stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        seen = False
        while time.monotonic() < deadline and not seen:
            snap = json.loads(run([*cli, "status", "--json"], capture_output=True, text=True).stdout)
            seen = any(p.get("stage") == "gpuworker"
                       for g in snap.get("gpus", []) for p in g.get("processes", []))
            time.sleep(0.5)
        print(f"GPU worker on the GPU and tied to its stage: {seen}")
        smi = ["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv"]
        smi_s = timed(lambda: subprocess.run(smi, stdout=subprocess.DEVNULL, check=True), repeat)
        cmd = [*cli, "status", "--json"]
        run(cmd, stdout=subprocess.DEVNULL)
        status_s = timed(lambda: run(cmd, stdout=subprocess.DEVNULL), repeat)
        bare = timed(lambda: run([sys.executable, "-c", "pass"]), repeat)
        print(f"nvidia-smi --query-gpu (median):       {smi_s * 1000:8.1f} ms")
        print(f"python -c pass (interpreter start):    {bare * 1000:8.1f} ms")
        print(f"status --json, NVML live, worker on:   {status_s * 1000:8.1f} ms  "
              f"(goal <= 150 ms: {'PASS' if status_s <= 0.15 else 'FAIL'}; {status_s / smi_s:.1f}x nvidia-smi)")
        phases(root, repeat, no_gpus=False)
        # NVML's own cost as a whole process, beside `python -c pass`: what is
        # left to cut once the console's part is gone.
        for label, code in (("import pynvml", "import pynvml"),
                            ("import pynvml; init; shutdown",
                             "import pynvml; pynvml.nvmlInit(); pynvml.nvmlShutdown()"),
                            ("import pynvml; init (no shutdown)", "import pynvml; pynvml.nvmlInit()"),
                            ("import psutil", "import psutil"),
                            ("import psutil; process_iter", "import psutil; list(psutil.process_iter(['ppid']))")):
            ms = timed(lambda: run([sys.executable, "-c", code]), repeat) * 1000
            print(f"python -c '{label}': {ms:8.1f} ms")
        if profile_dir:
            profile(cmd, profile_dir, "status_gpu")
    finally:
        run([*cli, "stop", "gpuworker", "--grace", "5"], stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    sys.exit(main())
