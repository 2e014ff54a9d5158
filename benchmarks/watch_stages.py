"""What one `watch --once --advance` pass costs at 200 stages against 10.

Builds, for each size N, a workspace of a chain of N custom stages (each its
own output folder, `depends_on` the one before): the first half succeeded,
the next one failed (no restart policy), the rest never ran, all recorded in
a real registry. A pass then reads everything and starts nothing, so every
pass is the same. It times, per size:
  pass:    watchloop.one_pass in-process (after a first one: its monitors'
           cache warm, as under cron), the median of --repeat;
  process: `eagle3-console watch --once --advance --no-gpus` as a whole
           process, the median of --repeat;
and counts config.load calls in one pass. Goal (issue 28, measured there as
whole processes: 0.37-0.52 s at 10 stages, 4.8-6.2 s at 200): the process at
200 stages within 2x of the one at 10. The in-process pass is printed beside
it: what each stage adds (the pipeline file's parse and each output's check,
linear), without the interpreter's start that dominates a process.
Usage: python benchmarks/watch_stages.py [--sizes 10 200] [--repeat 5] [--dir DIR]
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

from eagle3_console.kernel import config as cfg  # noqa: E402
from eagle3_console.cli import watchloop  # noqa: E402
from eagle3_console.cli.ctx import Ctx  # noqa: E402
from eagle3_console.kernel.workspace import Workspace  # noqa: E402


def build(root: Path, n: int) -> Workspace:
    root.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(n):
        lines += [f"[stages.s{i:03d}]", 'argv = ["true"]', f'outputs = ["out/s{i:03d}"]']
        if i:
            lines.append(f'depends_on = ["s{i - 1:03d}"]')
        lines.append("")
    (root / "eagle3.toml").write_text("\n".join(lines))
    ws = Workspace(root.resolve())
    ws.ensure_state()
    from eagle3_console.kernel.registry import Registry
    with Registry(ws.db_path) as reg:
        for i in range(n // 2 + 1):
            name = f"s{i:03d}"
            (root / "out" / name).mkdir(parents=True, exist_ok=True)
            run = reg.create_run(name, ["true"], {}, {}, str(root), lambda rid, s=name: ws.log_path(rid, s))
            Path(run.log_path).write_text("done\n")
            status = "failed" if i == n // 2 else "succeeded"
            # In chain order, each after its dependency's end: none is stale.
            started = time.time() - 3 * (n - i) - 10
            reg.update(run.id, started=started)
            reg.finish(run.id, status, ended=started + 1, exit_code=1 if status == "failed" else 0)
    return ws


def time_pass(ws: Workspace, repeat: int) -> tuple[float, int]:
    c = Ctx(ws.root)
    opts = watchloop.Options(once=True, no_gpus=True, advance=True)
    quiet = lambda _line: None  # noqa: E731
    watchloop.one_pass(c, opts, quiet)      # warm the monitors' cache
    loads = [0]
    real = cfg.load

    def counting(path):
        loads[0] += 1
        return real(path)
    cfg.load = counting
    try:
        watchloop.one_pass(c, opts, quiet)
    finally:
        cfg.load = real
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        watchloop.one_pass(c, opts, quiet)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), loads[0]


def time_process(ws: Workspace, repeat: int) -> float:
    cmd = [sys.executable, "-m", "eagle3_console.cli", "-w", str(ws.root), "watch", "--once", "--advance", "--no-gpus"]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    subprocess.run(cmd, capture_output=True, env=env)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, env=env, text=True)
        times.append(time.perf_counter() - t0)
        if proc.returncode not in (0, 1, 2):
            raise SystemExit(f"watch exited {proc.returncode}: {proc.stderr}")
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 200])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()
    base = args.dir or Path(tempfile.mkdtemp(prefix="watch-stages-"))
    rows = {}
    for n in args.sizes:
        ws = build(base / f"n{n}", n)
        passed, loads = time_pass(ws, args.repeat)
        process = time_process(ws, args.repeat)
        rows[n] = {"pass_s": round(passed, 4), "process_s": round(process, 4), "config_loads_per_pass": loads}
        print(f"{n:4d} stages: pass {passed * 1000:8.1f} ms, process {process * 1000:8.1f} ms, "
              f"config.load {loads} a pass", flush=True)
    lo, hi = min(args.sizes), max(args.sizes)
    ratio = {k: rows[hi][k] / rows[lo][k] for k in ("pass_s", "process_s")}
    print(f"ratio {hi}/{lo}: process {ratio['process_s']:.2f}x (goal <= 2x); in-process pass {ratio['pass_s']:.2f}x")
    print(json.dumps({"rows": rows, "ratio": ratio, "load_avg": os.getloadavg()}))


if __name__ == "__main__":
    main()
