"""Drafter training throughput on shards read from disk through the real data
loader, with MFU against a matmul rate measured in the same run (issue 11).

Writes, for each --seq, a hidden-state output in extract's layout
(ops.extract.writer.write_sample: random states, random ids), a draft vocab
(vocab.safetensors) and a target folder holding only what ops.train reads of
it (config.json; embedding, final norm, LM head), then loads them through
ops.train's own readers (read_data, load_target_head, load_vocab,
from_target, make_batches, BatchDataset in a DataLoader with ops.train's
arguments) and runs ops.train's step (TargetView.targets, the drafter's K-step
unroll under bf16 autocast, backward, clip, AdamW), batches reaching the GPU
through ops.train's DevicePrefetcher (its own thread fetches the batches ahead
and copies them on a side stream). Per step it times the host's wait for its
batch, the GPU's idle time for it (CUDA events either side of taking it) and
the whole step (the step ends with a device sync).

MFU counts useful FLOPs only (the issue's formula), per token of a T-token sample:
  3 x (fc 2*3H*H + K x (q 2*2H*NH*D + k,v 2*2*2H*NKV*D + o 2*H*H
       + MLP 3*2*H*I + LM head 2*H*Vd + causal attention 4*(T/2)*NH*D))
--program SEQS also runs `python -m ops.train` itself on the same data (for
those sample lengths) and prints its progress lines' tok/s beside ours.
--levers picks the speed levers (ops/drafter/model.py, ops/train/levers.py):
"default" (ops.train's defaults on this device: on CUDA flex + chunked loss +
fused AdamW + compile + length buckets), "old" (none: the explicit mask, the
full loss, plain AdamW, no compile, no buckets) or a list of flex, chunked,
fused-adamw, compile, bucket (those on, the rest off). --check-levers first
compares one batch's loss, accuracies and gradients against the old path at
this shape (the CPU tests cannot: FlexAttention has no CPU backward).
Compiles (flex, torch.compile) happen in the warm-up steps: their count (dynamo's
graphs) and the warm-up's time beyond its steps' steady time are printed
apart; tok/s and MFU are the timed steps' only. --lengths mixed writes samples
of many lengths (up to --seq) instead, to count the compiles a real corpus costs.
--formats bf16,fp8,int4 writes the same states in each storage format
(ops/hidden_formats.py; encoded by ops/hidden_codec.py as extract encodes them)
and times each in the same invocation: the loader reads the format's bytes,
the prefetcher decodes them on the device; a line per format gives its tok/s
against bf16's.
Usage: python benchmarks/train_throughput.py [--shape 8b|tiny] [--seq 2048,4096] [--steps N] [--out DIR]
       [--program 2048] [--levers default|old|flex,chunked,fused-adamw,compile,bucket] [--check-levers]
       [--lengths fixed|mixed] [--formats bf16,fp8,int4] [--compile-mode MODE] [--compile-backend eager]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402

SHAPES = {
    #       target config, draft vocab, K, token budget, seqs, warm-up steps, timed steps
    "8b": (bc.LLAMA_8B, 32000, 7, 16384, "2048,4096", 3, 10),
    "tiny": (bc.LLAMA_TINY, 200, 3, 256, "64,128", 1, 3),
}
AUX_IDS = [1, 3, 4]   # any three layers: the ids only label the data
LEVERS = ("flex", "chunked", "fused-adamw", "compile", "bucket")


def log(msg: str) -> None:
    print(msg, flush=True)


def flops_per_token(cfg, k: int, t: int) -> float:
    h, nh, nkv, d, i, vd = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.head_dim, cfg.intermediate_size, cfg.draft_vocab_size)
    step = (2 * 2 * h * nh * d + 2 * 2 * 2 * h * nkv * d + 2 * h * h + 3 * 2 * h * i + 2 * h * vd
            + 4 * (t / 2) * nh * d)
    return 3 * (2 * 3 * h * h + k * step)


def write_target(path: Path, target_cfg: dict, device) -> None:
    """config.json + the three tensors ops.train reads (a 16 GB body is never read)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    path.mkdir(parents=True, exist_ok=True)
    cfg = LlamaConfig(**target_cfg)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(str(path))
    v, h = target_cfg["vocab_size"], target_cfg["hidden_size"]
    g = torch.Generator(device=device).manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    save_file({"model.embed_tokens.weight": (torch.randn(v, h, generator=g, device=device) * 0.02).to(dtype).cpu(),
               "lm_head.weight": (torch.randn(v, h, generator=g, device=device) * 0.02).to(dtype).cpu(),
               "model.norm.weight": torch.ones(h, dtype=dtype)}, str(path / "model.safetensors"))


def write_vocab(path: Path, target_vocab: int, draft_vocab: int) -> None:
    import torch
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    ids = torch.randperm(target_vocab, generator=torch.Generator().manual_seed(0))[:draft_vocab].sort().values
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    save_file({"d2t": ids - torch.arange(draft_vocab), "t2d": t2d}, str(path / "vocab.safetensors"))


def mixed_lengths(samples: int, seq: int) -> list[int]:
    """Lengths spread over [seq / 8, seq] (seeded): a corpus's many distinct lengths."""
    import random

    rng = random.Random(seq)
    return [rng.randint(max(1, seq // 8), seq) for _ in range(samples)]


def write_data(path: Path, samples: int, seq: int, hidden: int, vocab: int, device,
               lengths: list[int] | None = None, fmt: str = "bf16") -> int:
    """extract's layout, written by extract's own writer, states in `fmt`; returns the bytes.
    `lengths`: each sample's (default: all `seq`)."""
    import torch
    from ops import hidden_formats
    from ops.extract.sample_file import sample_image
    from ops.extract.writer import write_sample
    from ops.formats import DATA_CONFIG, SAMPLE_LENGTHS, sample_path
    from ops.hidden_codec import encode_states

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(seq)
    # A few distinct states, reused: generating 7 GB of normals on the CPU would
    # take longer than the training it feeds. The bytes on disk are all written.
    pool = [torch.randn(seq, 4 * hidden, generator=g, device=device).to(dtype) for _ in range(4)]
    lengths = lengths or [seq] * samples
    for idx in range(samples):
        n = lengths[idx]
        states = pool[idx % len(pool)][:n]
        encoded = encode_states(fmt, {"aux_hidden_states": states[:, :3 * hidden],
                                      "final_hidden_states": states[:, 3 * hidden:]}, hidden)
        write_sample(sample_path(path, idx), sample_image({
            "input_ids": torch.randint(0, vocab, (n,), dtype=torch.int64),
            "loss_mask": torch.ones(n, dtype=torch.uint8),
            **{k: v.contiguous().cpu() for k, v in encoded.items()}}, metadata=hidden_formats.file_metadata(fmt)))
    (path / SAMPLE_LENGTHS).write_text(json.dumps({str(i): lengths[i] for i in range(samples)}))
    (path / DATA_CONFIG).write_text(json.dumps({
        "status": "complete", "hidden_size": hidden, "layer_ids": AUX_IDS, "final_hidden_state": "post_norm",
        "dtype": str(dtype).replace("torch.", ""), "total_samples": samples, "total_tokens": sum(lengths),
        "format": fmt, "format_params": hidden_formats.format_params(fmt, hidden)}))
    return bc.dir_bytes(path)


def lever_config(spec: str, cuda: bool, bucket: int | None = None):
    """ops.train.levers.Levers for --levers (module docstring); `bucket`
    overrides the length bucket's tokens where buckets are on."""
    import dataclasses

    from ops.train.levers import DEFAULT_BUCKET, resolve

    if spec == "default":
        lv = resolve(cuda)
        return dataclasses.replace(lv, length_bucket=bucket) if bucket and lv.length_bucket else lv
    names = [] if spec == "old" else [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in names if x not in LEVERS]
    if bad:
        raise SystemExit(f"error: --levers {','.join(bad)}: expected default, old or some of {', '.join(LEVERS)}")
    on = lambda name: "on" if name in names else "off"   # noqa: E731
    return resolve(cuda, "flex" if "flex" in names else "mask", "chunked" if "chunked" in names else "full",
                   on("fused-adamw"), on("compile"), str(bucket or DEFAULT_BUCKET) if "bucket" in names else "0")


def apply_levers(model, lv) -> None:
    model.ttt_attention, model.loss, model.compile_step = lv.ttt_attention, lv.loss, lv.compile


def dynamo_graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def check_levers(model, view, batch, k: int, levers, device, dtype) -> str:
    """One batch through the old path and the levers' path, same weights."""
    import copy

    import torch

    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()
    input_ids = batch["input_ids"].to(device)
    aux = batch["aux"].to(device, dtype=dtype)
    tgt, ok = view.targets(batch["final"].to(device, dtype=dtype), batch["loss_mask"].to(device), batch["lengths"])
    def one(variant, lv):
        apply_levers(variant, lv)
        variant.zero_grad(set_to_none=True)
        try:
            with autocast:
                loss, losses, correct, counts = variant(input_ids, aux, view.embed, tgt, ok, k, 0.8)
                loss.backward()
        except torch.OutOfMemoryError as exc:
            return str(exc).splitlines()[0]     # the text only: the traceback would pin the memory
        grads = torch.cat([p.grad.float().flatten() for p in variant.parameters() if p.grad is not None])
        variant.zero_grad(set_to_none=True)
        return float(loss), (correct / counts.clamp(min=1)).tolist(), grads

    old = copy.deepcopy(model)
    out = [one(old, lever_config("old", device.type == "cuda"))]
    del old
    if device.type == "cuda":
        torch.cuda.empty_cache()
    out.append(one(model, levers))
    name = levers.describe()
    if isinstance(out[0], str) or isinstance(out[1], str):
        which = "the old path" if isinstance(out[0], str) else "the levers"
        return f"levers ({name}) not compared: {which} ran out of memory on one batch ({out[0] if isinstance(out[0], str) else out[1]})"
    (l0, a0, g0), (l1, a1, g1) = out
    cos = float(torch.nn.functional.cosine_similarity(g0, g1, 0))
    rel = float((g1 - g0).norm() / g0.norm().clamp(min=1e-30))
    return (f"levers ({name}) vs the old path on one batch: loss {l1:.5f} vs {l0:.5f} "
            f"(rel {abs(l1 - l0) / max(abs(l0), 1e-30):.1e}); acc max diff {max(abs(x - y) for x, y in zip(a0, a1)):.4f}; "
            f"gradient cosine {cos:.6f}, rel norm of the difference {rel:.1e}")


class InlinePrefetcher:
    """The baseline: ops.train's previous prefetcher (before the thread), kept
    here to be measured beside the current one in the same invocation. The
    training thread itself takes the next batch from the loader and issues its
    copy on a side stream, once the step's backward is queued (prefetch())."""

    def __init__(self, source, device, dtype):
        import torch

        self.source, self.device, self.dtype = source, device, dtype
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.pending, self.wait_s = None, 0.0

    def prefetch(self) -> None:
        import torch

        from ops.train.prefetch import to_device

        if self.pending is not None:
            return
        t0 = time.perf_counter()
        batch = next(self.source)
        self.wait_s += time.perf_counter() - t0
        with torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext():
            dev = to_device(batch, self.device, self.dtype)
        self.pending = (batch, dev)

    def next(self):
        import torch

        self.prefetch()
        (batch, dev), self.pending = self.pending, None
        if self.stream is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(self.stream)
            for t in dev.values():
                t.record_stream(current)
        return batch, dev

    def close(self) -> bool:
        return True


class ResidentBatch:
    """The floor: one batch copied to the device once and trained on every
    step, so no loader, no copy and no wait; the step time of a data path
    against this one's is what that path costs."""

    def __init__(self, source, device, dtype):
        from ops.train.prefetch import DevicePrefetcher

        first = DevicePrefetcher(source, device, dtype)
        try:
            self.batch, self.dev = first.next()
        finally:
            first.close()
        self.wait_s = 0.0

    def next(self):
        return self.batch, self.dev

    def close(self) -> bool:
        return True


def measure(work: Path, seq: int, k: int, budget: int, warmup: int, steps: int, workers: int,
            device, rate: float, levers, check: bool = False, mixed: bool = False, pin: bool = False,
            staging: str = "pinned", data: str | None = None) -> dict:
    """ops.train's step on ops.train's data path; per-step wait and step times.
    mixed: the warm-up is one pass over every batch (every shape compiles there),
    the timed steps a second pass from the start."""
    import torch

    from ops.drafter.config import from_target
    from ops.drafter.data import BatchDataset, batch_loader, make_batches, padded_shape, read_data
    from ops.drafter.model import Eagle3Drafter
    from ops.drafter.target_head import load_target_head
    from ops.drafter.vocab import load_vocab
    from ops.train.targets import TargetView

    use_cuda = device.type == "cuda"
    info = read_data(work / (data or f"data-{seq}"))
    head = load_target_head(work / "target")
    vocab = load_vocab(work / "vocab", target_vocab_size=head.lm_head.shape[0])
    cfg = from_target(work / "target", vocab.size, info.layer_ids)
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    model.init_from_target(head.lm_head, vocab.d2t, vocab.t2d)
    model.to(device)
    dtype = torch.bfloat16 if use_cuda else torch.float32
    view = TargetView(head, vocab, device, dtype, info.final_post_norm)
    del head
    batches = make_batches(dict(info.lengths), budget, max(seq, 4096), levers.length_bucket)
    dataset = BatchDataset(info, batches, max(seq, 4096), levers.length_bucket, budget)
    loader = batch_loader(dataset, list(range(len(batches))), workers, pin=use_cuda and pin,
                          persistent=mixed and workers > 0)
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.dim() < 2 else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.0}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), **({"fused": True} if levers.fused_adamw else {}))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if use_cuda else contextlib.nullcontext()
    if use_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    if mixed:
        warmup, steps = len(batches), min(steps, len(batches))

    def cycle():
        while True:
            yield from loader

    from ops.train.prefetch import DevicePrefetcher
    if staging == "inline":
        it = InlinePrefetcher(cycle(), device, dtype)
    elif staging == "resident":
        it = ResidentBatch(cycle(), device, dtype)
    else:
        it = DevicePrefetcher(cycle(), device, dtype, staging=staging, fmt=info.format, hidden=info.hidden_size)
    waits, times, tokens, flops, warm_times, gaps = [], [], [], [], [], []
    model.train()
    checked = None
    graphs0 = dynamo_graphs()
    t_check = time.perf_counter()
    if check:
        checked = check_levers(model, view, dataset[0], k, levers, device, dtype)
        log(checked)
    t_check = time.perf_counter() - t_check
    graphs_check = dynamo_graphs()
    apply_levers(model, levers)
    try:
        for step in range(warmup + steps):
            if step == warmup:
                graphs_warm = dynamo_graphs()
            t0 = time.perf_counter()
            wait0 = it.wait_s
            # Events either side of taking the batch: the step before ended synced,
            # so the device time between them is what the GPU waited for its data
            # (the prefetcher's thread fetches and copies it meanwhile).
            if use_cuda:
                before = torch.cuda.Event(enable_timing=True)
                before.record()
            batch, dev = it.next()
            if use_cuda:
                after = torch.cuda.Event(enable_timing=True)
                after.record()
            # Time the host was blocked waiting for the batch (ops/train/prefetch.py).
            t_data = it.wait_s - wait0
            tgt, ok = view.targets(dev["final"], dev["loss_mask"], dev["lengths"])
            with autocast:
                loss, losses, correct, counts = model(dev["input_ids"], dev["aux"], view.embed, tgt, ok, k, 0.8)
                loss.backward()
            if isinstance(it, InlinePrefetcher):
                # The baseline fetches here, beside the queued step: its wait is timed the same way.
                if use_cuda:
                    mid0 = torch.cuda.Event(enable_timing=True)
                    mid0.record()
                wait1 = it.wait_s
                it.prefetch()
                t_data += it.wait_s - wait1
                if use_cuda:
                    mid1 = torch.cuda.Event(enable_timing=True)
                    mid1.record()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            opt.zero_grad(set_to_none=True)
            float(loss.detach())        # ops.train's finiteness check: the step ends synced
            if step < warmup:
                warm_times.append(time.perf_counter() - t0)
            if step >= warmup:
                waits.append(t_data)
                if use_cuda:
                    gaps.append(before.elapsed_time(after) / 1000
                            + (mid0.elapsed_time(mid1) / 1000 if isinstance(it, InlinePrefetcher) else 0.0))  # the step ended synced: both have run
                times.append(time.perf_counter() - t0)
                lengths = batch["lengths"].tolist()
                tokens.append(sum(lengths))
                flops.append(sum(n * flops_per_token(cfg, k, n) for n in lengths))
    finally:
        it.close()
    peak = (torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)) if use_cuda else None
    total = sum(times)
    if warmup == 0:
        graphs_warm = graphs_check
    compile_info = {"graphs_check": graphs_check - graphs0, "graphs_warmup": graphs_warm - graphs_check,
                    "graphs_timed": dynamo_graphs() - graphs_warm, "check_s": t_check,
                    "warmup_steps": warmup, "warmup_s": sum(warm_times),
                    # what the warm-up took beyond its steps at the steady rate: compiling, mostly
                    "compile_s": max(0.0, sum(warm_times) - len(warm_times) * total / max(1, steps)),
                    "batch_shapes": len({padded_shape([info.lengths[i] for i in b_], levers.length_bucket,
                                                      max(seq, 4096), budget) for b_ in batches})}
    return {"seq": seq, "batch_samples": len(batches[0]), "steps": steps, "tok_s": sum(tokens) / total,
            "compile": compile_info,
            "mfu": sum(flops) / total / rate, "data_wait": sum(waits) / total, "step_s": total / steps,
            "gpu_idle_for_data": sum(gaps) / total if gaps else None,
            "peak_alloc": peak[0] if peak else None, "peak_reserved": peak[1] if peak else None,
            "flops_per_token": flops_per_token(cfg, k, seq), "loss": float(loss.detach()),
            "levers": levers.describe(), "check": checked, "staging": staging}


PROGRESS_RE = re.compile(r"progress: step (\d+)/(\d+) .* tok/s (\d+)")


def run_program(work: Path, seq: int, k: int, budget: int, warmup: int, steps: int) -> float:
    """`python -m ops.train` on the same data: its progress lines every `warmup`
    steps; the mean tok/s of the windows after the first (the warm-up)."""
    out = work / f"train-out-{seq}"
    every = max(1, warmup)
    total = every * max(2, (warmup + steps) // every)
    argv = [sys.executable, "-m", "ops.train", "--data", str(work / f"data-{seq}"), "--vocab", str(work / "vocab"),
            "--target", str(work / "target"), "--output", str(out), "--max-steps", str(total),
            "--log-every", str(every), "--token-budget", str(budget), "--ttt-steps", str(k),
            "--warmup-ratio", "0", "--save-every", str(10 ** 9), "--keep", "1"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(bc.ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(argv, cwd=bc.ROOT, env=env, capture_output=True, text=True)
    shutil.rmtree(out, ignore_errors=True)
    found = [float(m[2]) for m in PROGRESS_RE.findall(proc.stdout)]
    if proc.returncode != 0 or len(found) < 2:
        raise SystemExit(f"error: ops.train exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return sum(found[1:]) / len(found[1:])


def measure_formats(work: Path, formats: list[str], seq: int, n: int, lengths, target_cfg: dict, device, k: int,
                    budget: int, warmup: int, steps: int, workers: int, rate: float, levers, pin: bool,
                    keep: bool) -> list[dict]:
    """The same states (the same generator) in each format, each timed through ops.train's data path."""
    out, base = [], None
    for fmt in formats:
        name = f"data-{seq}-{fmt}"
        written = write_data(work / name, n, seq, target_cfg["hidden_size"], target_cfg["vocab_size"], device,
                             lengths, fmt)
        tokens = sum(lengths) if lengths else n * seq
        r = measure(work, seq, k, budget, warmup, steps, workers, device, rate, levers, pin=pin,
                    mixed=lengths is not None, data=name)
        r.update(format=fmt, bytes_per_token=written / tokens)
        base = base or r
        log(f"format {fmt} {seq}-token samples: {written / tokens:,.0f} B a token on disk "
            f"({written / tokens / (base['bytes_per_token']):.2f}x {base['format']}'s), train {r['tok_s']:,.0f} tok/s "
            f"({r['tok_s'] / base['tok_s']:.2f}x {base['format']}'s), {r['data_wait']:.1%} of step time waiting "
            f"for data; {r['step_s'] * 1000:.0f} ms a step")
        out.append(r)
        if not keep:
            shutil.rmtree(work / name, ignore_errors=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--seq", default=None, help="comma-separated sample lengths (default: by shape)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: by shape)")
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--token-budget", type=int, default=None)
    ap.add_argument("--ttt-steps", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers (ops.train's default)")
    ap.add_argument("--pin", action="store_true",
                    help="DataLoader pin_memory on (ops.train has it off: the batch goes to the GPU from the "
                         "workers' shared memory)")
    ap.add_argument("--program", default="", help="comma-separated lengths at which to also run python -m ops.train")
    ap.add_argument("--levers", default="default",
                    help=f"default (ops.train's), old, or comma-separated of {', '.join(LEVERS)}")
    ap.add_argument("--check-levers", action="store_true", help="compare one batch against the old path first")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of the compiled step, e.g. max-autotune-no-cudagraphs (default: none)")
    ap.add_argument("--compile-backend", default=None,
                    help="torch.compile backend of the compiled step (default: ops/drafter/model.py's, inductor); "
                         "eager runs dynamo's capture alone: the same graphs and recompiles, no code generation")
    ap.add_argument("--length-bucket", type=int, default=None,
                    help="tokens of a length bucket where buckets are on (default: ops.train's)")
    ap.add_argument("--lengths", choices=("fixed", "mixed"), default="fixed",
                    help="every sample --seq tokens, or lengths spread up to --seq (counts a corpus's compiles)")
    ap.add_argument("--out", type=Path, default=None, help="working folder (default: a new temp folder)")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for the run (seconds; Python's default 0.005): how long the "
                         "training thread may wait for the GIL while the prefetch thread holds it")
    ap.add_argument("--staging", default="pinned",
                    help="comma-separated: how batches reach the GPU (ops/train/prefetch.py STAGING: pinned, "
                         "pageable), inline for the previous prefetcher (the baseline), resident for one batch "
                         "kept on the device (the floor: no data path at all); each measured in turn")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--formats", default="",
                    help="comma-separated storage formats (bf16,fp8,int4) to time on the same states, after the rest")
    a = ap.parse_args()

    import torch

    target_cfg, draft_vocab, k, budget, seqs, warmup, steps = SHAPES[a.shape]
    k = a.ttt_steps or k
    budget = a.token_budget or budget
    warmup = a.warmup if a.warmup is not None else warmup
    steps = a.steps or steps
    seqs = [int(s) for s in (a.seq or seqs).split(",")]
    program_seqs = {int(s) for s in a.program.split(",") if s.strip()}
    root = a.out or Path(tempfile.mkdtemp(prefix="train-throughput-"))
    work = root / f"train-throughput-{a.shape}"
    shutil.rmtree(work, ignore_errors=True)
    device = bc.torch_device()
    from ops.drafter import model as model_mod
    model_mod.COMPILE_MODE = a.compile_mode or model_mod.COMPILE_MODE
    model_mod.COMPILE_BACKEND = a.compile_backend or model_mod.COMPILE_BACKEND
    levers = lever_config(a.levers, device.type == "cuda", a.length_bucket)
    log(bc.device_line())
    if a.switch_interval is not None:
        sys.setswitchinterval(a.switch_interval)
    log(f"GIL switch interval {sys.getswitchinterval() * 1000:g} ms")
    rate, what = bc.matmul_rate(device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    log(f"matmul {what}: {rate / 1e12:.1f} TFLOP/s (the MFU denominator)")
    write_target(work / "target", target_cfg, device)
    write_vocab(work / "vocab", target_cfg["vocab_size"], draft_vocab)
    log(f"shape {a.shape}: hidden {target_cfg['hidden_size']}, intermediate {target_cfg['intermediate_size']}, "
        f"heads {target_cfg['num_attention_heads']}/{target_cfg['num_key_value_heads']}, draft vocab {draft_vocab}, "
        f"target vocab {target_cfg['vocab_size']}, K={k}, token budget {budget}")
    results = []
    for seq in seqs:
        per_batch = max(1, budget // seq)
        n = per_batch * (warmup + steps)
        lengths = None
        if a.lengths == "mixed":
            # Twice the samples at about half the length: as many tokens.
            lengths = mixed_lengths(2 * n, seq)
            n = len(lengths)
        t0 = time.perf_counter()
        written = write_data(work / f"data-{seq}", n, seq, target_cfg["hidden_size"], target_cfg["vocab_size"], device,
                             lengths)
        log(f"data {seq}: {n} samples x " + (f"{seq} tokens" if lengths is None else
                                             f"{len(set(lengths))} distinct lengths {min(lengths)}-{seq} tokens")
            + f", {written / 2**30:.2f} GiB on disk (written in {time.perf_counter() - t0:.0f} s)")
        for staging in a.staging.split(","):
            try:
                r = measure(work, seq, k, budget, warmup, steps, a.workers, device, rate, levers,
                            a.check_levers and staging == a.staging.split(",")[0],
                            mixed=lengths is not None, pin=a.pin, staging=staging)
            except torch.OutOfMemoryError as exc:
                log(f"train {seq}-token samples, K={k}: does not fit ({str(exc).splitlines()[0]})")
                results.append({"seq": seq, "oom": str(exc).splitlines()[0]})
                torch.cuda.empty_cache()
                continue
            except Exception as exc:     # e.g. a compile failing: say so and go on with the next length
                import traceback

                traceback.print_exc()
                first = (str(exc).strip().splitlines() or [""])[0][:300]
                log(f"train {seq}-token samples, K={k}, levers {a.levers}: failed ({type(exc).__name__}: {first})")
                results.append({"seq": seq, "error": f"{type(exc).__name__}: {first}"})
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            mem = (f"; peak memory {r['peak_alloc'] / 2**30:.1f} GiB allocated, {r['peak_reserved'] / 2**30:.1f} GiB "
                   f"reserved" if r["peak_alloc"] is not None else "")
            if seq in program_seqs and staging == a.staging.split(",")[0]:
                r["program_tok_s"] = run_program(work, seq, k, budget, warmup, steps)
                mem += f"; python -m ops.train said {r['program_tok_s']:,.0f} tok/s"
            c = r["compile"]
            log(f"compile {seq} (backend {model_mod.COMPILE_BACKEND}): {c['graphs_warmup']} graphs built in the "
                f"{c['warmup_steps']} warm-up steps "
                f"({c['warmup_s']:.1f} s, ~{c['compile_s']:.1f} s beyond the steady step time), "
                f"{c['graphs_check']} in the check ({c['check_s']:.1f} s), {c['graphs_timed']} in the timed steps; "
                f"{c['batch_shapes']} batch shapes; excluded from tok/s and MFU")
            log(f"train {seq}-token samples ({r['batch_samples']} a batch), K={k}, levers {a.levers} "
                f"({levers.describe()}), batches {staging}: {r['tok_s']:,.0f} tok/s = "
                f"{r['mfu']:.1%} MFU ({r['flops_per_token'] / 1e6:,.1f} MFLOP a token counted); "
                f"{r['data_wait']:.1%} of step time waiting for data (the host blocked taking its batch)"
                + (f", GPU idle for it {r['gpu_idle_for_data']:.1%}" if r.get("gpu_idle_for_data") is not None else "")
                + f"; {r['step_s'] * 1000:.0f} ms a step{mem}")
            results.append(r)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        floor = next((x for x in results if x.get("seq") == seq and x.get("staging") == "resident"
                      and "step_s" in x), None)
        if floor is not None:
            for x in results:
                if x.get("seq") == seq and x.get("staging") not in (None, "resident") and "step_s" in x:
                    x["data_cost"] = 1 - floor["step_s"] / x["step_s"]
                    log(f"data path {seq}, batches {x['staging']}: {x['step_s'] * 1000:.0f} ms a step against "
                        f"{floor['step_s'] * 1000:.0f} ms with one batch resident on the device = "
                        f"{x['data_cost']:.1%} of the step spent on data")
        if not a.keep:
            shutil.rmtree(work / f"data-{seq}", ignore_errors=True)
        formats = [f for f in a.formats.split(",") if f.strip()]
        if formats:
            results += measure_formats(work, formats, seq, n, lengths, target_cfg, device, k, budget, warmup, steps,
                                       a.workers, rate, levers, a.pin, a.keep)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    suffix = "" if a.levers == "default" else "_" + a.levers.replace(",", "_")
    suffix += "_mixed" if a.lengths == "mixed" else ""
    bc.save_json({"shape": a.shape, "device": bc.device_line(), "matmul_flops": rate, "matmul": what, "k": k,
                  "token_budget": budget, "levers": a.levers, "levers_resolved": levers.describe(),
                  "lengths": a.lengths, "results": results},
                 a.json or bc.default_json(f"train_throughput_{a.shape}{suffix}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
