"""What one refresh of collect() costs against the loop operators run today.

Builds a workspace with a 10-shard x 2,000-sample output and a 1 GB log (the
log of a real registered run), then in the same invocation times:
  baseline: `du -sh DIR; ls DIR | head; tail -n 50 LOG` (one shell, as typed)
  refresh:  Collector.collect() after the first (the TUI's steady state)
  process:  `eagle3-console status --json` as a whole process (after a first
            one, so its persisted cache is warm, as under cron)
and prints the ratios. Goals: refresh <= 1/10 of baseline; process <= 0.5 s.
Usage: python benchmarks/status_cost.py [--dir DIR] [--log-gb 1] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle3_console.registry import Registry  # noqa: E402
from eagle3_console.snapshot import Collector  # noqa: E402
from eagle3_console.workspace import Workspace  # noqa: E402


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
    log = root / "big.log"
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
    (root / "eagle3.toml").write_text(
        '[stages.extract]\nargv = ["python", "-c", "pass"]\noutputs = ["data/hidden_states"]\n'
        "expected_samples = 20000\n")
    ws = Workspace(root)
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        if reg.latest("extract") is None:
            run = reg.create_run("extract", ["python"], {}, {}, str(root), lambda _rid: log)
            reg.finish(run.id, "failed", started=time.time() - 3600, ended=time.time(), exit_code=1)
    return out, log


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--log-gb", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
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
    subprocess.run(cmd, stdout=subprocess.DEVNULL)     # warms .eagle3/cache like a previous cron tick
    process = timed(lambda: subprocess.run(cmd, stdout=subprocess.DEVNULL), a.repeat)

    print(f"workspace: {root} (20,000 samples in 10 shards, log {log.stat().st_size / 2**30:.2f} GiB)")
    print(f"baseline du+ls+tail loop:     {baseline * 1000:8.1f} ms")
    print(f"collect() first pass:         {first_s * 1000:8.1f} ms  (samples seen: {first.stages[0].shards.samples_done})")
    print(f"collect() refresh (median):   {refresh * 1000:8.1f} ms  ratio refresh/baseline = {refresh / baseline:.3f} "
          f"(goal <= 0.100: {'PASS' if refresh <= baseline / 10 else 'FAIL'})")
    print(f"status --json whole process:  {process * 1000:8.1f} ms  (goal <= 500 ms: {'PASS' if process <= 0.5 else 'FAIL'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
