"""Online and streamed training against offline on the tiny target, on the CPU, in one invocation
(issue 35, item 4): the same prepared samples, seed and Params; prints each mode's held-out simulated
acceptance length and train tok/s, and the ratios against offline.

    python -m benchmarks.online_cpu [--epochs 6] [--repeats 2]

The toy's assets (ops/drafter/toy.py) are built once under --root. The streamed run's producer is a
real `python -m ops.extract --spool-bytes` subprocess. tok/s is the mean of the logged windows after
the first (the first holds the warm-up and, online, the target's load).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _argv(assets, out, epochs) -> list[str]:
    return ["--vocab", str(assets["vocab"]), "--target", str(assets["target"]), "--output", str(out),
            "--workers", "0", "--lr", "3e-3", "--token-budget", "256", "--ttt-steps", "3", "--log-every", "4",
            "--warmup-ratio", "0", "--epochs", str(epochs), "--holdout", "8", "--device", "cpu",
            "--save-every", "100000"]


def _train(argv: list[str], log: Path) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        subprocess.run([sys.executable, "-m", "ops.train", *argv], cwd=ROOT, env=env, stdout=fh,
                       stderr=subprocess.STDOUT, check=True)
    return time.perf_counter() - t0


def _figures(out: Path) -> dict:
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tok_s"] for r in recs[1:]] or [recs[0]["tok_s"]]
    return {"al": recs[-1]["simulated_acceptance_length"], "loss": recs[-1]["loss"],
            "tok_s": sum(rates) / len(rates)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="/tmp/eagle3-online-cpu")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--spool-bytes", type=int, default=1_000_000)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from ops.drafter import toy

    root = Path(args.root)
    assets = toy.toy_assets(root / "toy")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    rows: dict[str, list[dict]] = {"offline": [], "online": [], "streamed": []}
    for rep in range(args.repeats):
        for mode in rows:
            out = root / f"{mode}-{rep}"
            shutil.rmtree(out, ignore_errors=True)
            extra = {"offline": ["--data", str(assets["data"])],
                     "online": ["--mode", "online", "--samples", str(assets["samples"]), "--layer-ids", "0,1,2"],
                     "streamed": ["--mode", "streamed", "--samples", str(assets["samples"]), "--layer-ids", "0,1,2",
                                  "--spool", str(root / "spool")]}[mode]
            producer = None
            if mode == "streamed":
                shutil.rmtree(root / "spool", ignore_errors=True)
                producer = subprocess.Popen(
                    [sys.executable, "-m", "ops.extract", "--input", str(assets["samples"]), "--output",
                     str(root / "spool"), "--target", str(assets["target"]), "--spool-bytes", str(args.spool_bytes),
                     "--layer-ids", "0,1,2", "--device", "cpu", "--token-budget", "256"],
                    cwd=ROOT, env=env, stdout=open(root / f"producer-{rep}.log", "w"), stderr=subprocess.STDOUT)
            try:
                _train(_argv(assets, out, args.epochs) + extra, root / f"{mode}-{rep}.log")
            finally:
                if producer is not None:
                    producer.wait(120)
            rows[mode].append(_figures(out))
    base = rows["offline"]
    print(f"{'mode':<9} {'AL':>7} {'dAL':>7} {'tok/s':>9} {'x offline':>9}")
    for mode, figs in rows.items():
        al = sum(f["al"] for f in figs) / len(figs)
        rate = sum(f["tok_s"] for f in figs) / len(figs)
        base_al = sum(f["al"] for f in base) / len(base)
        base_rate = sum(f["tok_s"] for f in base) / len(base)
        print(f"{mode:<9} {al:7.3f} {al - base_al:+7.3f} {rate:9.0f} {rate / base_rate:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
