"""CPU cost of the console at rest: the app's CPU use over 60 s at the default
refresh, watching a 10-shard x 2,000-sample extraction output while the
running stage keeps writing to its log. Goal: at most 2 % of one core.

How: build the workspace (20,000 sample files in rows_<a>-<b>/ shards, a
pipeline whose `extract` stage is a real supervised process printing progress
lines twice a second), start the real `eagle3-console -w WS` in tmux at the
given size, let it settle, then read the console process's CPU times with
psutil from outside over the measurement window.

    python benchmarks/tui_idle.py [--seconds 60] [--size 160x48] [--keep]

Prints one line per figure; the last one is the result in % of one core.

Measured (2 shared cores, textual 8.2.8, 160x48): 3.28-3.50 % before the
repaint work of the panes (whole stage table and log redrawn every second);
1.62-1.75 % after (a changed row, cached log lines, titles set only when
changed, a minute clock); 1.27 % at 80x24.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eagle3_console.kernel import config as cfg  # noqa: E402
from eagle3_console import runs  # noqa: E402
from eagle3_console.kernel.workspace import Workspace  # noqa: E402

STAGE = '''\
import sys, time
n = int(sys.argv[1])
# The backlog of a stage that has run for a while (model loading, earlier
# progress): the console watches a full tail, as it does for hours.
for k in range(1, 65):
    print(f"Loading safetensors checkpoint shards: {k * 100 // 64:3d}% Completed | {k}/64 [00:{k:02d}<00:00, 27.0s/it]")
for k in range(1, 400):
    print(f"progress: samples {k}/{n} tokens {k * 512} errors 0 tok/s 2910.5")
sys.stdout.flush()
i = 400
while True:
    i += 1
    done = min(n, i)
    print(f"progress: samples {done}/{n} tokens {done * 512} errors 0 tok/s 2910.5", flush=True)
    time.sleep(0.5)
'''


def sample_bytes(idx: int, tokens: int = 16) -> bytes:
    # A minimal safetensors file: the shard monitor reads only the header.
    header = {"input_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [0, tokens * 8]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes([idx % 256]) * (tokens * 8)


def build(root: Path, shards: int, per_shard: int) -> None:
    out = root / "data" / "hidden_states"
    out.mkdir(parents=True)
    total = shards * per_shard
    (out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": total}))
    for s in range(shards):
        d = out / f"rows_{s * per_shard}-{(s + 1) * per_shard}"
        d.mkdir()
        for i in range(s * per_shard, (s + 1) * per_shard):
            (d / f"data_{i}.safetensors").write_bytes(sample_bytes(i))
    (root / "stage.py").write_text(STAGE)
    (root / "eagle3.toml").write_text(f"""
[stages.extract]
argv = ["python", "{root / 'stage.py'}", "{total}"]
outputs = ["data/hidden_states"]
expected_samples = {total}
""")


def tmux(sock: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["tmux", "-S", sock, *args], capture_output=True, text=True, check=check)


def console_process(pane_pid: int) -> psutil.Process:
    pane = psutil.Process(pane_pid)
    for p in [pane, *pane.children(recursive=True)]:
        if any("eagle3" in part for part in p.cmdline()):
            return p
    raise SystemExit(f"no console process under tmux pane {pane_pid}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds before measuring (startup, first passes)")
    ap.add_argument("--size", default="160x48")
    ap.add_argument("--shards", type=int, default=10)
    ap.add_argument("--per-shard", type=int, default=2000)
    ap.add_argument("--keep", action="store_true", help="keep the workspace")
    a = ap.parse_args()
    if shutil.which("tmux") is None:
        raise SystemExit("tmux is required")
    cols, rows = (int(v) for v in a.size.split("x"))
    root = Path(tempfile.mkdtemp(prefix="eagle3-tui-idle-"))
    sock = str(root / "tmux.sock")
    ws = Workspace.at(root)
    try:
        t0 = time.time()
        build(root, a.shards, a.per_shard)
        print(f"workspace: {root} ({a.shards} shards x {a.per_shard} samples, built in {time.time() - t0:.1f} s)")
        run = runs.launch(ws, cfg.load(ws.config_path), "extract")
        print(f"stage: run {run.id} pid {run.pid} ({run.status}), log {run.log_path}")
        exe = Path(sys.executable).parent / "eagle3-console"
        cmd = f"{exe if exe.exists() else sys.executable + ' -m eagle3_console.cli'} -w {root}"
        env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
        env["TERM"] = "xterm-256color"
        subprocess.run(["tmux", "-S", sock, "new-session", "-d", "-s", "idle", "-x", str(cols), "-y", str(rows),
                        cmd], check=True, env=env)
        pane = int(tmux(sock, "list-panes", "-t", "idle", "-F", "#{pane_pid}").stdout.split()[0])
        time.sleep(1.0)
        proc = console_process(pane)
        time.sleep(a.settle)
        screen = tmux(sock, "capture-pane", "-p", "-t", "idle").stdout
        if "Stages" not in screen or "extract" not in screen:
            raise SystemExit("the console did not come up:\n" + screen)
        log_before = os.path.getsize(run.log_path)
        c0, w0 = proc.cpu_times(), time.monotonic()
        time.sleep(a.seconds)
        c1, w1 = proc.cpu_times(), time.monotonic()
        wall = w1 - w0
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        grown = os.path.getsize(run.log_path) - log_before
        samples_line = next((ln for ln in tmux(sock, "capture-pane", "-p", "-t", "idle").stdout.splitlines()
                             if "samples" in ln), "").strip()
        print(f"terminal: {cols}x{rows}; measured {wall:.1f} s; log grew {grown} bytes")
        print(f"screen: {samples_line[:100]}")
        print(f"console cpu: user {c1.user - c0.user:.2f} s, system {c1.system - c0.system:.2f} s")
        print(f"console CPU use at rest: {100 * cpu / wall:.2f} % of one core (goal <= 2 %)")
    finally:
        tmux(sock, "kill-server", check=False)
        try:
            runs.stop(ws, "extract", grace_s=2)
        except runs.Refused:
            pass
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
