"""Issue 36 item 3: online training swept on a real target at a fixed number of optimizer steps.

Every run is `python -m ops.train --mode online` (the real program, a subprocess) with the same seed,
vocabulary, held-out samples and `--max-steps S`, so that a change of data size is not a change of steps
(the earlier sweep varied both at once: 72 to 873 steps). Three axes, each against the base run:

  lr        --lrs 3e-4,1e-3,3e-3                   the peak learning rate
  data      --fractions 0.25,0.5,1                 the first share of the conversations (prepare --limit),
                                                   trained for the same S steps (more epochs on less data)
  width     --widths 8960,13440                    the drafter's MLP (--intermediate-size; SGLang reads
                                                   it from the exported config)

S defaults to one epoch of the whole data at the base settings (what train's plan says). The table: each
run's held-out simulated acceptance length (ops/train/heldout.py, the last record), its loss, steps and
train tok/s (the windows after the first), in one invocation, beside the base run.

    python benchmarks/train_sweep.py --target T --conversations C.jsonl --out DIR
        [--lrs ...] [--fractions ...] [--widths ...] [--max-steps S] [--train-args "..."]
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE_ARGS = ("--epochs 100 --lr 1e-3 --ttt-steps 7 --token-budget 16384 --max-len 2048 --holdout 200 --seed 0 "
             "--device auto --save-every 100000 --log-every 20 --workers 4")


def run(argv: list[str], log: Path) -> int:
    with open(log, "w") as fh:
        return subprocess.run(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT).returncode


def prepared(target: str, conversations: Path, out: Path, fraction: float, total_rows: int) -> Path:
    """prepare's output of the first `fraction` of the conversations (all of them at 1)."""
    folder = out / f"prepared-{fraction:g}"
    if (folder / "summary.json").is_file():
        return folder
    limit = max(1, round(total_rows * fraction))
    code = run([sys.executable, "-m", "ops.prepare", "--target", target, "--input", str(conversations),
                "--output", str(folder), "--max-seq-len", "2048", "--limit", str(limit)], out / f"prepare-{fraction:g}.log")
    if code != 0:
        raise SystemExit(f"error: prepare of {fraction:g} exited {code}: {out}/prepare-{fraction:g}.log")
    return folder


def figures(output: Path) -> dict:
    recs = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines() if x.strip()]
    recs = [r for r in recs if "step" in r]
    last = recs[-1]
    rates = [r["tok_s"] for r in recs[1:]] or [recs[0]["tok_s"]]
    return {"steps": last["step"], "loss": last.get("loss"), "simulated_al": last.get("simulated_acceptance_length"),
            "tok_s": sum(rates) / len(rates)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--conversations", type=Path, required=True, help="regenerate's conversations.jsonl")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lrs", default="3e-4,3e-3")
    ap.add_argument("--fractions", default="0.25,0.5")
    ap.add_argument("--widths", default="")
    ap.add_argument("--max-steps", type=int, default=0, help="S (0: one epoch of the whole data)")
    ap.add_argument("--train-args", default="", help="more ops.train arguments, after the base ones")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    total_rows = sum(1 for ln in a.conversations.open() if ln.strip())
    full = prepared(a.target, a.conversations, a.out, 1.0, total_rows)
    vocab = a.out / "vocab"
    if not (vocab / "vocab.safetensors").is_file():
        if run([sys.executable, "-m", "ops.vocab", "--target", a.target, "--input", str(full), "--output", str(vocab),
                "--draft-vocab-size", "32000"], a.out / "vocab.log") != 0:
            raise SystemExit(f"error: vocab failed: {a.out}/vocab.log")
    base = [*shlex.split(BASE_ARGS), *shlex.split(a.train_args)]
    steps = a.max_steps
    runs: list[tuple[str, Path, list[str]]] = [("base", full, [])]
    runs += [(f"lr {lr}", full, ["--lr", lr]) for lr in filter(None, a.lrs.split(","))]
    runs += [(f"data {f}", prepared(a.target, a.conversations, a.out, float(f), total_rows), [])
             for f in filter(None, a.fractions.split(","))]
    runs += [(f"width {w}", full, ["--intermediate-size", w]) for w in filter(None, a.widths.split(","))]
    table = []
    for name, samples, extra in runs:
        output = a.out / ("run-" + name.replace(" ", "-"))
        if steps == 0 and name != "base":
            raise SystemExit("error: the base run did not say its steps")
        argv = [sys.executable, "-m", "ops.train", "--mode", "online", "--target", a.target, "--samples", str(samples),
                "--vocab", str(vocab), "--output", str(output), "--replace-checkpoints", *base, *extra,
                "--max-steps", str(steps if steps else 0)]
        if name == "base" and not steps:
            argv[argv.index("--epochs") + 1] = "1"     # one epoch of the whole data sets S
        t0 = time.time()
        code = run(argv, a.out / f"{output.name}.log")
        if code != 0:
            print(f"{name}: exit {code} ({output}.log)", flush=True)
            continue
        row = {"run": name, "samples": str(samples.name), **figures(output), "wall_s": round(time.time() - t0, 1)}
        if name == "base" and not steps:
            steps = row["steps"]
        table.append(row)
        print(json.dumps(row), flush=True)
    (a.out / "sweep.json").write_text(json.dumps({"max_steps": steps, "runs": table}, indent=1))
    base_al = next((r["simulated_al"] for r in table if r["run"] == "base"), None)
    print(f"\n{'run':<16}{'samples':<18}{'steps':>7}{'loss':>9}{'sim AL':>9}{'vs base':>9}{'tok/s':>10}")
    for r in table:
        diff = f"{r['simulated_al'] - base_al:+.3f}" if base_al is not None and r["simulated_al"] is not None else "-"
        print(f"{r['run']:<16}{r['samples']:<18}{r['steps']:>7}{r['loss'] or 0:>9.4f}{r['simulated_al'] or 0:>9.3f}"
              f"{diff:>9}{r['tok_s']:>10,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
