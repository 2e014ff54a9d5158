"""Where a drafter training step's time goes: ops.train's step (the target's
128k-vocab head once a batch, the K-step unroll, backward, clip, AdamW) under
torch.profiler, for the path --levers picks (issue 11).

Random inputs made on the device (no disk, no loader: benchmarks/
train_throughput.py measures those). Warm-up steps first (every compile
happens there, timed apart), then --steps profiled steps. Prints the step
time and MFU (the issue's useful-FLOP count against a matmul rate measured
in the same run), kernel launches a step, the device's busy share of the
wall time, and the top operators by device time and by host time. Run from
the repository root on the GPU machine:

    python3 benchmarks/profile_train.py --shape 8b --seq 2048 [--levers default|old|flex,chunked,...]

`--shape tiny` runs on the CPU: the timings mean little there, the operator
counts of the unroll (launches a step, old path against the compiled one) do.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402
from benchmarks.train_throughput import SHAPES, apply_levers, flops_per_token, lever_config  # noqa: E402


def build(shape: str, seq: int, device, budget: int | None):
    import torch

    from ops.drafter.config import DrafterConfig
    from ops.drafter.model import Eagle3Drafter
    from ops.train.targets import TargetView

    target_cfg, vd, k, default_budget, *_ = SHAPES[shape]
    h, v = target_cfg["hidden_size"], target_cfg["vocab_size"]
    nh, nkv = target_cfg["num_attention_heads"], target_cfg["num_key_value_heads"]
    cfg = DrafterConfig(hidden_size=h, num_attention_heads=nh, num_key_value_heads=nkv, head_dim=h // nh,
                        intermediate_size=target_cfg["intermediate_size"], draft_vocab_size=vd,
                        target_vocab_size=v, max_position_embeddings=max(8192, 2 * seq))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    head = SimpleNamespace(embed=(torch.randn(v, h, generator=g, device=device) * 0.02).to(dtype),
                           lm_head=(torch.randn(v, h, generator=g, device=device) * 0.02).to(dtype),
                           norm=torch.ones(h, device=device), eps=1e-5)
    ids = torch.randperm(v, device=device, generator=g)[:vd].sort().values
    t2d = torch.zeros(v, dtype=torch.bool, device=device)
    t2d[ids] = True
    vocab = SimpleNamespace(draft_to_target=ids, t2d=t2d)
    view = TargetView(head, vocab, device, dtype, post_norm=True)
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    model.init_from_target(head.lm_head.float(), ids - torch.arange(vd, device=device), t2d)
    model.to(device)
    b = max(1, (budget or default_budget) // seq)
    batch = {"input_ids": torch.randint(0, v, (b, seq), generator=g, device=device),
             "aux": torch.randn(b, seq, 3 * h, generator=g, device=device).to(dtype),
             "final": torch.randn(b, seq, h, generator=g, device=device).to(dtype),
             "loss_mask": torch.ones(b, seq, dtype=torch.bool, device=device),
             "lengths": torch.full((b,), seq)}
    return cfg, k, model, view, batch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--token-budget", type=int, default=None)
    ap.add_argument("--levers", default="default", help="as benchmarks/train_throughput.py's")
    ap.add_argument("--compile-mode", default=None,
                    help="torch.compile mode of the compiled step, e.g. max-autotune-no-cudagraphs (default: none)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace", type=Path, default=None, help="also write a Chrome trace here")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    device = bc.torch_device()
    if args.compile_mode:
        from ops.drafter import model as model_mod
        model_mod.COMPILE_MODE = args.compile_mode
    cuda = device.type == "cuda"
    print(bc.device_line(), flush=True)
    seq = args.seq or int(SHAPES[args.shape][4].split(",")[0])
    rate, what = bc.matmul_rate(device, torch.bfloat16 if cuda else torch.float32)
    cfg, k, model, view, batch = build(args.shape, seq, device, args.token_budget)
    levers = lever_config(args.levers, cuda)
    apply_levers(model, levers)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95),
                            **({"fused": True} if levers.fused_adamw else {}))
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def one_step():
        tgt, ok = view.targets(batch["final"], batch["loss_mask"], batch["lengths"])
        with autocast:
            loss, *_ = model(batch["input_ids"], batch["aux"], view.embed, tgt, ok, k, 0.8)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    t0 = time.perf_counter()
    for _ in range(args.warmup):
        one_step()
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(args.steps):
        one_step()
    step_s = (time.perf_counter() - t0) / args.steps
    b = batch["input_ids"].shape[0]
    mfu = b * seq * flops_per_token(cfg, k, seq) / step_s / rate
    print(f"shape {args.shape}: {b} x {seq} tokens, K={k}; levers {args.levers} ({levers.describe()})")
    print(f"matmul {what}: {rate / 1e12:.1f} TFLOP/s; step {step_s * 1000:.1f} ms unprofiled = {mfu:.1%} MFU; "
          f"warm-up {args.warmup} steps {warm:.1f} s (~{max(0.0, warm - args.warmup * step_s):.1f} s compiling)")
    if cuda:
        # One step with CUDA's sync debugging on: every host-device sync inside
        # the step warns with its stack (the last, the loss's float(), is by design).
        import warnings

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                one_step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
        print(f"host-device syncs in one step: {len(syncs)}")
        for w in syncs[:8]:
            print(f"  {w.filename}:{w.lineno}: {str(w.message).splitlines()[0][:120]}")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            one_step()
        wall = time.perf_counter() - t0
    if args.trace:
        prof.export_chrome_trace(str(args.trace))
    events = prof.key_averages()
    host_ops = sum(e.count for e in events if not e.key.startswith("ProfilerStep"))
    line = f"profiled: {wall / args.steps * 1000:.1f} ms a step; {host_ops / args.steps:,.0f} host operator calls a step"
    if cuda:
        dev_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        kernels = [e for e in prof.events() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        busy = sum(getattr(e, dev_attr, 0) for e in events) / 1e6
        line += (f"; {len(kernels) / args.steps:,.0f} kernels a step; device busy {busy / wall:.0%} of the wall "
                 f"time (sum of kernel times {busy / args.steps * 1000:.1f} ms a step)")
    print(line)
    if cuda:
        print(f"-- top {args.top} by device time")
        print(events.table(sort_by=dev_attr, row_limit=args.top, max_name_column_width=70))
    print(f"-- top {args.top} by host time")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=70))
    return 0


if __name__ == "__main__":
    sys.exit(main())
