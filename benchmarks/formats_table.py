"""The storage formats side by side: the same samples extracted in each format
(ops/hidden_formats.py), the same training on each (same seed, same held-out
samples), one table: bytes a token on disk, extraction tok/s, train tok/s and
train's held-out simulated acceptance length (the figure bench would measure,
ops/train/heldout.py) per format and seed.

Each extraction and training is the real program (`python -m ops.extract`,
`python -m ops.train`) in a subprocess, its own figures read from what it
writes: extract's closing line (tok/s) and `extract: time:` line (what bounds
it), the sample files' bytes over data_config.json's total_tokens, train's
metrics.jsonl (tok/s of its logged windows after the first, the last record's
simulated_acceptance_length and its held-out tokens / verify steps).

Two more figures in the same invocation, each optional:
  --floors      the target's bare forward (no capture, no copies, no writes; random ids at the
                extraction's batch shape) and the writers' own rate on the output's filesystem
                (benchmarks/extract_throughput.py's probes), so each format's extraction tok/s
                stands against the forward it runs and the write floor of its bytes a token;
  --sweep N,..  acceptance against the number of training samples: the first format extracted
                with --num-samples N and trained (first seed) for each N, the held-out samples
                (--holdout) taken from those N.

Usage:
  python benchmarks/formats_table.py --toy [--out DIR] [--toy-dir DIR]   # CPU: the toy target, a few minutes
  python benchmarks/formats_table.py --target T --prepared P --vocab V --out DIR
      [--formats bf16,fp8,int4] [--seeds 0,1,2] [--holdout 32]
      [--extract-args "--token-budget 16384 --writers 8"] [--train-args "--epochs 10 --ttt-steps 3"]
      [--bench-args "--draft-tokens 3 --max-new-tokens 256 --num-prompts 32"] [--export-args "--dtype bfloat16"]
      [--floors] [--sweep 1000,2000,4000] [--reuse]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TOY_TRAIN = "--lr 3e-3 --epochs 12 --token-budget 256 --ttt-steps 3 --workers 0 --log-every 5 --save-every 100000"
TOY_EXTRACT = "--layer-ids 0,1,2 --token-budget 512 --progress-interval 5"
_TOK_S = re.compile(r"samples, (\d+) tokens extracted in [\d.]+ minutes\. [\d.]+ samples/s, (\d+) tok/s\.")


def log(msg: str) -> None:
    print(msg, flush=True)


def toy_inputs(root: Path) -> tuple[Path, Path, Path]:
    """(target, prepared, vocab) for the toy target: its corpus in prepare's output contract."""
    import numpy as np
    from safetensors.numpy import save_file

    from ops.drafter import toy

    target, prepared, vocab = root / "target", root / "prepared", root / "vocab"
    if not (root / "toy.json").exists():
        samples = toy.make_corpus(64, seed=7)
        toy.build_target(target)
        toy.build_vocab(samples, vocab, 80)
        lengths = [len(ids) for ids, _mask in samples]
        prepared.mkdir(parents=True, exist_ok=True)
        save_file({"input_ids": np.concatenate([np.array(ids, np.int32) for ids, _ in samples]),
                   "loss_mask": np.concatenate([np.array(mask, np.uint8) for _, mask in samples]),
                   "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)},
                  str(prepared / "samples.safetensors"))
        (prepared / "summary.json").write_text(json.dumps({"status": "complete", "samples": len(samples),
                                                           "total_tokens": sum(lengths)}))
        (root / "toy.json").write_text("{}")
    return target, prepared, vocab


def _run(argv: list[str], log_path: Path) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with open(log_path, "w") as fh:
        proc = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)
    text = log_path.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} exited {proc.returncode}; its log: {log_path}\n{text[-2000:]}")
    return text


def _reused(done: Path, key: str, args: str, reuse: bool) -> dict | None:
    """An earlier invocation's figures, when `reuse` and they were made with the same arguments
    (`key` of the record); else None, and the stale record is gone before the work runs again."""
    if reuse and done.exists():
        prior = json.loads(done.read_text())
        if prior.get(key) == args:
            return prior
    done.unlink(missing_ok=True)
    return None


def extract(fmt: str, target: Path, prepared: Path, out: Path, extra: str, name: str | None = None,
            reuse: bool = False) -> dict:
    """`reuse`: an earlier invocation's figures (extract.json, written once its extraction completed)
    stand, so a table can be finished over several calls of a machine that keeps its disk."""
    hs = out / (name or fmt) / "hidden_states"
    done = out / (name or fmt) / "extract.json"
    prior = _reused(done, "extract_args", extra, reuse)
    if prior is not None:
        return prior
    if hs.exists():
        import shutil
        shutil.rmtree(hs)
    t0 = time.perf_counter()
    text = _run(["-m", "ops.extract", "--target", str(target), "--input", str(prepared), "--output", str(hs),
                 "--format", fmt, *shlex.split(extra)], out / (name or fmt) / "extract.log")
    wall = time.perf_counter() - t0
    config = json.loads((hs / "data_config.json").read_text())
    files = sum(p.stat().st_size for p in hs.rglob("data_*.safetensors"))
    m = _TOK_S.search(text)
    timing = next((ln for ln in text.splitlines() if ln.startswith("extract: time:")), "")
    row = {"data": str(hs), "samples": config["total_samples"], "tokens": config["total_tokens"], "bytes": files,
           "bytes_per_token": files / config["total_tokens"], "extract_tok_s": float(m.group(2)) if m else None,
           "extract_wall_s": wall, "extract_time_line": timing, "extract_args": extra}
    done.write_text(json.dumps(row, indent=1))
    return row


def train(fmt: str, seed: int, data: str, target: Path, vocab: Path, out: Path, holdout: int, extra: str,
          reuse: bool = False) -> dict:
    """`fmt` names the folder under `out` (a format, or a sweep point's folder); `reuse` as extract's."""
    run = out / fmt / f"train-seed{seed}"
    done = out / fmt / f"train-seed{seed}.json"
    prior = _reused(done, "train_args", extra, reuse)
    if prior is not None:
        return prior
    if run.exists():
        import shutil
        shutil.rmtree(run)
    _run(["-m", "ops.train", "--data", data, "--vocab", str(vocab), "--target", str(target), "--output", str(run),
          "--seed", str(seed), "--holdout", str(holdout), *shlex.split(extra)], out / fmt / f"train-seed{seed}.log")
    records = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    last = records[-1]
    windows = [r["tok_s"] for r in records[1:]] or [records[0]["tok_s"]]     # the first pays the warm-up
    held = last.get("heldout") or {}
    result = {"seed": seed, "run": str(run), "train_tok_s": statistics.mean(windows),
              "heldout_al": last["simulated_acceptance_length"], "heldout_tokens": held.get("tokens"),
              "heldout_verifies": held.get("verifies"), "loss": last["loss"], "train_args": extra}
    done.write_text(json.dumps(result, indent=1))
    return result


def bench(t: dict, target: Path, out: Path, fmt: str, export_args: str, bench_args: str) -> dict:
    """export then the reference bench (ops.bench: greedy, the target verifying) of one training run."""
    run = Path(t["run"])
    _run(["-m", "ops.export", "--checkpoint", str(run), "--output", str(run / "export"), *shlex.split(export_args)],
         out / fmt / f"export-seed{t['seed']}.log")
    _run(["-m", "ops.bench", "--drafter", str(run / "export"), "--target", str(target), "--output", str(run / "bench"),
          *shlex.split(bench_args)], out / fmt / f"bench-seed{t['seed']}.log")
    result = json.loads((run / "bench" / "bench.json").read_text())
    return {"bench_al": result["acceptance_length"], "bench_tokens": result.get("completion_tokens"),
            "bench_verifies": result.get("verify_forwards")}


def floors(target: Path, out: Path, extract_args: str) -> dict:
    """The bare forward of the target (tok/s) at the extraction's batch shape and the writers'
    rate in bytes/s on `out`'s filesystem (direct writes, as extract's default durability)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from benchmarks.extract_throughput import bare_forward, writer_rate

    args = shlex.split(extract_args)

    def flag(name: str, default: int) -> int:
        return int(args[args.index(name) + 1]) if name in args else default

    budget, seq = flag("--token-budget", 16384), flag("--max-seq-len", 1024)
    writers = flag("--writers", 4)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = AutoConfig.from_pretrained(str(target))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=dtype).to(device).eval()
    batch = max(1, budget // seq)
    bare = bare_forward(model, batch, seq, cfg.vocab_size, device, reps=20, with_mask=False)
    del model
    n_aux = 3
    hidden = cfg.hidden_size
    probe = out / "write-probe"
    samples = 256
    tok_s = writer_rate(probe, samples, seq, n_aux * hidden, hidden, writers, "direct")
    # The probe's file image: bf16 aux + final, int64 ids, uint8 mask (sample_image's layout).
    image_bytes = seq * ((n_aux + 1) * hidden * 2 + 8 + 1)
    return {"bare_tok_s": bare, "bare_shape": f"{batch} x {seq}", "device": device.type,
            "write_bytes_s": tok_s * image_bytes / seq, "writers": writers}


def _num_samples(extract_args: str) -> int | None:
    args = shlex.split(extract_args)
    return int(args[args.index("--num-samples") + 1]) if "--num-samples" in args else None


def sweep(points: list[int], fmt: str, seed: int, a, holdout: int, first: dict | None) -> list[dict]:
    """`first`: the table's row of `fmt`; the point of its own sample count is that row's training
    (same data, seed and arguments), not a second run of it."""
    rows = []
    for n in points:
        if first is not None and _num_samples(a.extract_args or "") == n:
            ext, t = first, next(t for t in first["trains"] if t["seed"] == seed)
        else:
            name = f"sweep-{n}"
            (a.out / name).mkdir(parents=True, exist_ok=True)
            extra = re.sub(r"--num-samples\s+\d+", "", a.extract_args or "")
            ext = extract(fmt, a.target, a.prepared, a.out, f"{extra} --num-samples {n}", name, a.reuse)
            t = train(name, seed, ext["data"], a.target, a.vocab, a.out, holdout, a.train_args or "", a.reuse)
        row = {"samples": ext["samples"], "trained": ext["samples"] - holdout, "tokens": ext["tokens"], **t}
        log(f"sweep {ext['samples']} samples ({row['trained']} trained, {ext['tokens']:,} tokens): held-out simulated AL "
            f"{t['heldout_al']:.3f} ({t['heldout_tokens']} / {t['heldout_verifies']}), {t['train_tok_s']:,.0f} tok/s")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    base = rows[0]
    lines = [f"{'format':<7} {'B/token':>9} {'x ' + base['format']:>8} {'extract tok/s':>14} {'train tok/s':>12} "
             f"{'held-out sim. AL (per seed)':<30} {'mean':>6} {'vs ' + base['format']:>8}"]
    for r in rows:
        als = [t["heldout_al"] for t in r["trains"]]
        mean = statistics.mean(als)
        r["heldout_al_mean"] = mean
        r["heldout_al_delta"] = mean - statistics.mean(t["heldout_al"] for t in base["trains"])
        ext = f"{r['extract_tok_s']:,.0f}" if r["extract_tok_s"] else "?"
        lines.append(f"{r['format']:<7} {r['bytes_per_token']:>9,.0f} {r['bytes_per_token'] / base['bytes_per_token']:>8.3f} "
                     f"{ext:>14} {statistics.mean(t['train_tok_s'] for t in r['trains']):>12,.0f} "
                     f"{' '.join(f'{a:.3f}' for a in als):<30} {mean:>6.3f} {r['heldout_al_delta']:>+8.3f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--toy", action="store_true", help="the toy target on CPU (builds target, corpus, vocab)")
    ap.add_argument("--toy-dir", type=Path, default=None, help="where the toy's inputs are built once (default: OUT/toy)")
    ap.add_argument("--target", type=Path)
    ap.add_argument("--prepared", type=Path, help="prepare's output (samples.safetensors, summary.json)")
    ap.add_argument("--vocab", type=Path, help="vocab's output (vocab.safetensors)")
    ap.add_argument("--out", type=Path, default=Path("formats-table"))
    ap.add_argument("--formats", default="bf16,fp8,int4")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--holdout", type=int, default=None, help="held-out samples (toy: 8; else 32)")
    ap.add_argument("--extract-args", default=None, help="more flags for ops.extract (one string)")
    ap.add_argument("--train-args", default=None, help="more flags for ops.train (one string)")
    ap.add_argument("--bench-args", default=None,
                    help="also export each run and measure it with ops.bench (reference engine), e.g. "
                         "\"--draft-tokens 3 --max-new-tokens 256 --num-prompts 32\"")
    ap.add_argument("--export-args", default="--dtype bfloat16", help="flags for ops.export (with --bench-args)")
    ap.add_argument("--floors", action="store_true", help="also the bare forward and the write floor")
    ap.add_argument("--sweep", default="", help="sample counts: the first format trained on each (first seed)")
    ap.add_argument("--reuse", action="store_true",
                    help="keep what an earlier invocation into the same --out completed (extract.json, "
                         "train-seedN.json) instead of running it again")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if a.toy:
        a.target, a.prepared, a.vocab = toy_inputs(a.toy_dir or a.out / "toy")
        a.extract_args = TOY_EXTRACT if a.extract_args is None else a.extract_args
        a.train_args = TOY_TRAIN if a.train_args is None else a.train_args
        a.holdout = 8 if a.holdout is None else a.holdout
    elif not (a.target and a.prepared and a.vocab):
        ap.error("--target, --prepared and --vocab are needed (or --toy)")
    holdout = 32 if a.holdout is None else a.holdout
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    formats = [f for f in a.formats.split(",") if f.strip()]
    result: dict = {}
    if a.floors:
        result["floors"] = fl = floors(a.target, a.out, a.extract_args or "")
        log(f"floors: bare forward {fl['bare_tok_s']:,.0f} tok/s ({fl['bare_shape']}, {fl['device']}); writers "
            f"({fl['writers']}, direct) {fl['write_bytes_s'] / 1e9:.2f} GB/s")
    rows = []
    for fmt in formats:
        (a.out / fmt).mkdir(parents=True, exist_ok=True)
        row = {"format": fmt, **extract(fmt, a.target, a.prepared, a.out, a.extract_args or "", reuse=a.reuse)}
        log(f"extract {fmt}: {row['bytes_per_token']:,.0f} B a token, {row['extract_tok_s']} tok/s; "
            f"{row['extract_time_line']}")
        row["trains"] = []
        for seed in seeds:
            t = train(fmt, seed, row["data"], a.target, a.vocab, a.out, holdout, a.train_args or "", a.reuse)
            if a.bench_args is not None:
                t.update(bench(t, a.target, a.out, fmt, a.export_args, a.bench_args))
                log(f"bench {fmt} seed {seed}: acceptance length {t['bench_al']:.3f} "
                    f"({t['bench_tokens']} / {t['bench_verifies']})")
            log(f"train {fmt} seed {seed}: {t['train_tok_s']:,.0f} tok/s, held-out simulated AL {t['heldout_al']:.3f} "
                f"({t['heldout_tokens']} / {t['heldout_verifies']}), loss {t['loss']:.4f}")
            row["trains"].append(t)
        rows.append(row)
    for line in table(rows):
        log(line)
    if a.floors:
        fl = result["floors"]
        for r in rows:
            r["write_floor_tok_s"] = fl["write_bytes_s"] / r["bytes_per_token"]
            ext = r["extract_tok_s"] or 0
            log(f"{r['format']}: extraction {ext:,.0f} tok/s = {ext / fl['bare_tok_s']:.2f} of the bare forward, "
                f"{ext / r['write_floor_tok_s']:.2f} of its write floor ({r['write_floor_tok_s']:,.0f} tok/s at "
                f"{r['bytes_per_token']:,.0f} B a token)")
    if a.sweep:
        result["sweep"] = sweep([int(n) for n in a.sweep.split(",") if n.strip()], formats[0], seeds[0], a, holdout,
                                rows[0] if rows else None)
        log(f"acceptance against training samples ({formats[0]}, seed {seeds[0]}, {holdout} held out of each):")
        for r in result["sweep"]:
            log(f"  {r['trained']:>6} trained  {r['tokens']:>10,} tokens  held-out sim. AL {r['heldout_al']:.3f}")
    for r in rows:
        als = [t["bench_al"] for t in r["trains"] if "bench_al" in t]
        if als:
            log(f"bench {r['format']}: acceptance length per seed {' '.join(f'{x:.3f}' for x in als)}, "
                f"mean {statistics.mean(als):.3f}")
    result["formats"] = rows
    (a.out / "formats_table.json").write_text(json.dumps(result, indent=1))
    log(f"results: {a.out / 'formats_table.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
