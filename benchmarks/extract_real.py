"""Issue 36 item 6: HF-engine extraction of real conversations against the target's bare forward over the
very same batches, in one invocation (the ratio is the figure; goal >= 0.7).

    python benchmarks/extract_real.py --target DIR --prepared DIR [--out DIR] [--token-budget 16384]
        [--max-seq-len 2048] [--num-samples N] [--reps 2] [--extract-args "..."]

bare     the base model (no LM head) over extract's own plan of the samples (ops/extract/batching.py
         plan_batches: longest first, count x longest <= budget), each batch right-padded with its
         attention mask (none where its samples are of one length, as extract passes them), the ids
         already on the device: no capture, no copies to the host, no writes. Real tokens / seconds.
extract  `python -m ops.extract --engine hf` on the same samples and budget, timed by
         benchmarks/extract_throughput.run_extract from its 'target loaded' line to 'complete' (and its
         steady state from the first batch written); its 'extract: time:' line says what bounded it
         (the forward, the device copy, the writers).
A real target and prepare's output of real conversations: on the device, the Qwen folder that
benchmarks/gpu_qwen.sh converts and the prepared data of its pipeline; here, any target (the demo's tiny
one for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402
from benchmarks.extract_throughput import BusySampler, run_extract  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def device_batches(samples, plan: list[list[int]], device) -> list[tuple[object, object, int]]:
    """Each planned batch as (ids, mask or None, real tokens), on the device before the clock starts."""
    import torch

    out = []
    for batch in plan:
        rows = [samples.get(i)[0] for i in batch]
        width = max(len(r) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r)] = torch.from_numpy(r.astype("int64"))
            mask[k, : len(r)] = 1
        same = all(len(r) == width for r in rows)
        out.append((ids.to(device), None if same else mask.to(device), sum(len(r) for r in rows)))
    return out


def bare_rate(model, batches, device, reps: int) -> tuple[float, float]:
    """(real tokens / s, seconds a pass) of the base model's forward over `batches`; one pass warms."""
    import torch

    from ops.target_model.capture import base_model

    base = base_model(model)
    tokens = sum(n for _, _, n in batches)
    with torch.inference_mode():
        for ids, mask, _ in batches:
            base(input_ids=ids, attention_mask=mask, use_cache=False)
        bc.sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            for ids, mask, _ in batches:
                base(input_ids=ids, attention_mask=mask, use_cache=False)
        bc.sync(device)
        seconds = (time.perf_counter() - t0) / reps
    return tokens / seconds, seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, required=True, help="a Hugging Face folder")
    ap.add_argument("--prepared", type=Path, required=True, help="prepare's output (samples.safetensors)")
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp folder)")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--max-seq-len", type=int, default=2048)
    ap.add_argument("--num-samples", type=int, default=None, help="the first N samples (default: all)")
    ap.add_argument("--reps", type=int, default=2, help="timed passes of the bare forward")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--durable", default="fsync", help="ops.extract's --durable")
    ap.add_argument("--extract-args", default="", help="more ops.extract arguments (quoted)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from ops.extract.batching import plan_batches
    from ops.prepared import load_samples

    device = bc.torch_device()
    log(bc.device_line())
    samples = load_samples(a.prepared, max_seq_len=a.max_seq_len, limit=a.num_samples)
    lengths = samples.lengths()
    plan = plan_batches(range(len(samples)), lengths, a.token_budget)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in plan)
    log(f"data: {len(samples):,} samples, {sum(lengths):,} tokens (max_seq_len {a.max_seq_len}), "
        f"{len(plan)} batches of budget {a.token_budget}: {padded:,} padded tokens "
        f"({sum(lengths) / padded:.1%} real)")

    dtype = getattr(torch, a.dtype) if device.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(a.target), dtype=dtype).to(device).eval()
    log(f"target {a.target}: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:,.1f} M "
        f"params, {dtype} on {device}, loaded in {time.perf_counter() - t0:.1f} s")
    batches = device_batches(samples, plan, device)
    bare, seconds = bare_rate(model, batches, device, a.reps)
    log(f"bare forward over extract's batches: {bare:,.0f} tok/s ({seconds:.2f} s a pass)")
    del batches, model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    root = a.out or Path(tempfile.mkdtemp(prefix="extract-real-"))
    out = root / "hidden_states"
    shutil.rmtree(out, ignore_errors=True)
    busy = BusySampler()
    extra = ("--engine", "hf", "--max-seq-len", str(a.max_seq_len), "--dtype", a.dtype,
             *(("--num-samples", str(a.num_samples)) if a.num_samples else ()), *shlex.split(a.extract_args))
    ext = run_extract(a.target, a.prepared, out, a.durable, a.token_budget, busy, extra)
    busy.stop()
    ratio = ext["tok_s"] / bare
    steady = ext["steady_tok_s"] / bare if ext["steady_tok_s"] else None
    log(f"extract (--engine hf --durable {a.durable}): {ext['tok_s']:,.0f} tok/s over its window "
        f"({ext['window_s']:.1f} s), steady {ext['steady_tok_s'] or 0:,.0f} tok/s; GPU busy "
        f"{ext['gpu_busy'] if ext['gpu_busy'] is not None else '-'}")
    log(f"extract / bare forward: {ratio:.2f} (steady {steady:.2f})" if steady else
        f"extract / bare forward: {ratio:.2f}")
    log(ext["time"] or "extract printed no time line")
    result = {"device": bc.device_line(), "target": str(a.target), "samples": len(samples),
              "tokens": sum(lengths), "batches": len(plan), "padded_tokens": padded,
              "token_budget": a.token_budget, "bare_tok_s": bare, "extract": ext, "ratio": ratio,
              "steady_ratio": steady}
    if a.json:
        a.json.write_text(json.dumps(result, indent=1, default=str))
    if a.out is None:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
