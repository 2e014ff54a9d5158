"""Run examples/slurm-demo.toml end to end as Slurm jobs under `watch --advance --until-done`.

    python benchmarks/slurm_pipeline.py [--workspace DIR] [--out benchmarks/results/slurm_<date>]

Starts the tests' one-node Slurm (tests/slurm_cluster.py: munged, slurmctld, slurmd from the
distribution's packages, as root), builds the demo workspace where DIR has no assets yet
(`eagle3-console demo DIR --no-open`), writes the three-stage pipeline, runs watch, and
saves under --out: watch's output, `status` and `status --json` after, `scontrol show job`
of every job, squeue while the pipeline ran (sampled each second), `events --json`,
`runs --json` and each run's log. Stops the cluster at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.slurm_cluster import Cluster, why_not  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workspace", default="/tmp/eagle3-slurm-demo")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / f"slurm_{time.strftime('%Y-%m-%d')}"))
    args = ap.parse_args()
    why = why_not()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    ws, out = Path(args.workspace), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cli = [sys.executable, "-m", "eagle3_console.cli", "-w", str(ws)]
    if not (ws / "assets" / "demo_assets.json").exists():
        subprocess.run([sys.executable, "-m", "eagle3_console.cli", "demo", str(ws), "--no-open"], check=True)
    shutil.rmtree(ws / ".eagle3", ignore_errors=True)
    for d in ("data", "out"):
        shutil.rmtree(ws / d, ignore_errors=True)
    shutil.copy(ROOT / "examples" / "slurm-demo.toml", ws / "eagle3.toml")
    cluster = Cluster(Path(tempfile.mkdtemp(prefix="eagle3-slurm-")))
    cluster.start()
    env = dict(os.environ, SLURM_CONF=str(cluster.conf))
    try:
        seen: list[str] = []
        done = threading.Event()

        def sample_squeue() -> None:
            while not done.is_set():
                q = cluster.run("squeue", "-h", "-o", "%i %j %T %r %N %M", check=False).stdout.strip()
                if q:
                    seen.append(f"{time.strftime('%H:%M:%S')} {q}")
                time.sleep(1.0)

        sampler = threading.Thread(target=sample_squeue, daemon=True)
        sampler.start()
        t0 = time.time()
        watch = subprocess.run([*cli, "watch", "--advance", "--until-done", "--interval", "2", "--no-gpus"],
                               capture_output=True, text=True, env=env, timeout=900)
        took = time.time() - t0
        done.set()
        sampler.join()
        (out / "watch.txt").write_text(f"$ eagle3-console watch --advance --until-done --interval 2 --no-gpus\n"
                                       f"exit {watch.returncode} after {took:.1f} s\n{watch.stdout}{watch.stderr}")
        (out / "squeue.txt").write_text("\n".join(seen) + "\n")
        for name, extra in (("status.txt", ["status", "--no-gpus"]), ("status.json", ["status", "--json", "--no-gpus"]),
                            ("events.json", ["events", "--json"]), ("runs.json", ["runs", "--json"])):
            proc = subprocess.run([*cli, *extra], capture_output=True, text=True, env=env)
            (out / name).write_text(proc.stdout + proc.stderr)
        runs = json.loads((out / "runs.json").read_text())
        jobs = [cluster.run("scontrol", "show", "job", r["job_id"], check=False).stdout for r in runs if r["job_id"]]
        (out / "scontrol_jobs.txt").write_text("\n".join(jobs))
        for r in runs:
            shutil.copy(r["log_path"], out / Path(r["log_path"]).name)
        print(f"watch exit {watch.returncode} in {took:.1f} s; captures in {out}")
        return watch.returncode
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
