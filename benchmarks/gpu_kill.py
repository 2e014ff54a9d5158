"""On a GPU machine: the seed scenario's recovery, for real, through the CLI.

A stage (tests/stages/gpu_hog.py) takes GPU memory, leaves a worker holding
more after it exits with an out-of-memory traceback. Then, as an operator:
  status --json      -> the GPU processes are tied to the run; OOM alert; exit 2
  kill-workers --yes -> the orphaned worker is killed; NVML shows the memory back
  status --json      -> no process of the run on the GPU; memory back to baseline
Prints a JSON summary (and writes it to $OUT/gpu_kill.json when OUT is set).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def cli(ws: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "eagle3_console.cli", "-w", str(ws), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def status(ws: Path) -> tuple[int, dict, float]:
    t0 = time.perf_counter()
    p = cli(ws, "status", "--json")
    return p.returncode, json.loads(p.stdout), time.perf_counter() - t0


def main() -> int:
    ws = Path(tempfile.mkdtemp(prefix="gpu-kill-"))
    (ws / "eagle3.toml").write_text(
        f'[stages.hog]\nargv = ["python", "{ROOT}/tests/stages/gpu_hog.py", "--worker-gib", "{{gib}}"]\n'
        'params = { gib = 6 }\nbatch_param = "gib"\n')
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    base = pynvml.nvmlDeviceGetMemoryInfo(h).used
    res: dict = {"baseline_used_gib": base / 2**30}
    p = cli(ws, "run", "hog")
    res["run"] = p.stdout.strip()
    # Wait until the leader has exited (OOM) with its worker still holding memory.
    deadline = time.time() + 120
    while time.time() < deadline:
        code, snap, _ = status(ws)
        st = snap["stages"][0]
        procs = [q for g in snap["gpus"] for q in g["processes"]]
        if st["status"] == "failed" and procs:
            break
        time.sleep(1)
    res["status_exit_after_oom"] = code
    res["alerts"] = [a["code"] for a in snap["alerts"]]
    res["gpu_processes_after_oom"] = [{k: q[k] for k in ("pid", "used_bytes", "run_id", "stage", "how", "visible")} for q in procs]
    res["gpu_used_after_oom_gib"] = snap["gpus"][0]["mem_used"] / 2**30
    times = [status(ws)[2] for _ in range(3)]
    res["status_json_process_s"] = sorted(times)[1]
    plan = cli(ws, "kill-workers", "hog")
    res["kill_plan"] = plan.stdout
    t0 = time.time()
    k = cli(ws, "kill-workers", "hog", "--yes", "--grace", "5")
    res["kill_exit"] = k.returncode
    res["kill_output"] = k.stdout + k.stderr
    res["kill_wall_s"] = time.time() - t0
    code, snap, _ = status(ws)
    res["gpu_processes_after_kill"] = [q["pid"] for g in snap["gpus"] for q in g["processes"]]
    res["gpu_used_after_kill_gib"] = snap["gpus"][0]["mem_used"] / 2**30
    res["alerts_after_kill"] = [a["code"] for a in snap["alerts"]]
    res["memory_back"] = abs(pynvml.nvmlDeviceGetMemoryInfo(h).used - base) < 256 * 2**20
    tied = all(q["run_id"] is not None for q in res["gpu_processes_after_oom"])
    res["ok"] = bool(res["gpu_processes_after_oom"]) and tied and res["kill_exit"] == 0 and res["memory_back"] \
        and not res["gpu_processes_after_kill"] and "oom" in res["alerts"] \
        and "gpu_memory_unaccounted" not in res["alerts"] + res["alerts_after_kill"]
    text = json.dumps(res, indent=2)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu_kill.json").write_text(text)
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
