"""Where `ops.extract`'s time goes: the real program in this process under
torch.profiler, on the shapes of benchmarks/extract_throughput.py (issue 11).

Prints the top operators by device time and by host time, the share of the
run's wall time the device spent in kernels, and, beside it in the same
invocation, the program's tok/s at 4 (the default) and 8 writer threads
without the profiler. Run on a GPU machine from the repository root:

    python3 benchmarks/profile_extract.py --shape 8b --samples 64

`--shape tiny` runs on the CPU (a smoke run; the figures mean nothing there).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402
from benchmarks.extract_throughput import SHAPES, build_config, build_target  # noqa: E402

TOKS_RE = re.compile(r"([\d,]+) tokens? .*?([\d,.]+) tok/s")


def extract(target: Path, prepared: Path, out: Path, *extra: str) -> float:
    """The program in this process; its wall time from call to return, seconds."""
    from ops.common import run_main
    from ops.extract.__main__ import main
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    code = run_main(main, ["--target", str(target), "--input", str(prepared), "--output", str(out),
                           "--progress-interval", "30", *extra])
    if code != 0:
        raise SystemExit(f"error: ops.extract exited {code}")
    return time.perf_counter() - t0


def sync_sites(device, call) -> collections.Counter | None:
    """Run `call` with CUDA's sync debug mode on; where each synchronizing
    call came from (the innermost frames in ops/ or transformers/), counted."""
    import traceback
    import warnings

    import torch

    if device.type != "cuda":
        return None
    sites: collections.Counter = collections.Counter()
    real_show = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return real_show(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-2]
                  if "/ops/" in f.filename or "transformers/" in f.filename]
        sites[" <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:][::-1])
              or f"{filename}:{lineno}"] += 1

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():     # restores showwarning and the filters on the way out
            warnings.simplefilter("always")
            warnings.showwarning = show
            call()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sites


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp folder)")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (a cheaper MoE run)")
    ap.add_argument("--durable", default=None, help="ops.extract's --durable (default: its own)")
    ap.add_argument("--cold", action="store_true",
                    help="profile the first call in this process (cold kernels, as a fresh `python -m ops.extract`) "
                         "instead of a warm one; both loop times are printed")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    device = bc.torch_device()
    print(bc.device_line(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="profile-extract-", dir=args.out))
    try:
        cfg, dtype, note = build_config(args.shape, args.layers)
        model = build_target(cfg, dtype, work / "target", device)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        seq = min(args.seq, 64) if args.shape == "tiny" else args.seq
        tokens = bc.write_prepared(work / "prepared", args.samples, seq, cfg.vocab_size)
        extra = ("--durable", args.durable) if args.durable else ()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        # Only the extraction loop is profiled: the target's load (a 15 GB
        # pageable host-to-device copy) would otherwise fill the tables.
        from ops.extract import loop as loop_mod
        real_run, box = loop_mod.Loop.run, {}

        def timed_run(self, mine):
            # Every call's loop time (load excluded); the profiler only on the chosen call.
            t0 = time.perf_counter()
            if box.pop("profile_next", False):
                with profile(activities=acts) as prof:
                    result = real_run(self, mine)
                    bc.sync(device)
                box["prof"] = prof
            else:
                result = real_run(self, mine)
                bc.sync(device)
            box.setdefault("loops", []).append(time.perf_counter() - t0)
            return result

        real_forward = loop_mod.Loop._forward

        def stamped_forward(self, batch):
            # When each batch's forward was launched, per call: one-off costs show as long first intervals.
            box.setdefault("stamps", {}).setdefault(len(box.get("loops", [])), []).append(time.perf_counter())
            return real_forward(self, batch)

        loop_mod.Loop.run = timed_run
        loop_mod.Loop._forward = stamped_forward
        try:
            # The first call in this process: load + first kernels of every shape
            # (what a fresh `python -m ops.extract` pays); profiled with --cold.
            box["profile_next"] = args.cold
            first = extract(work / "target", work / "prepared", work / "out", *extra)
            timed = {}
            for writers in (4, 8):      # warm, without the profiler
                timed[writers] = extract(work / "target", work / "prepared", work / "out", "--writers", str(writers),
                                         *extra)
            if not args.cold:
                box["profile_next"] = True
                wall = extract(work / "target", work / "prepared", work / "out", *extra)
            else:
                wall = first
        finally:
            loop_mod.Loop.run = real_run
            loop_mod.Loop._forward = real_forward
        box["loop"] = box["loops"][0] if args.cold else box["loops"][-1]
        syncs = sync_sites(device, lambda: extract(work / "target", work / "prepared", work / "out", *extra))
        prof = box["prof"]
        events = prof.key_averages()
        dev_attr = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        print(f"shape {args.shape}: {args.samples} samples x {seq} tokens = {tokens:,} tokens {note}")
        loops = box["loops"]
        print(f"extraction loop, first call in this process (cold): {loops[0]:.2f} s = {tokens / loops[0]:,.0f} tok/s"
              + (" (profiled)" if args.cold else "") + "; warm calls: "
              + ", ".join(f"{t:.2f} s = {tokens / t:,.0f} tok/s" for t in loops[1:3]))
        for call, stamps in sorted(box.get("stamps", {}).items())[:2]:
            gaps = [b - a for a, b in zip(stamps, stamps[1:])]
            if len(gaps) >= 6:
                rest = sorted(gaps[5:])[len(gaps[5:]) // 2]
                print(f"call {call + 1}: {len(stamps)} batches; seconds between forward launches, first five: "
                      + ", ".join(f"{g:.3f}" for g in gaps[:5]) + f"; median of the rest {rest:.3f}")
        for writers, t in timed.items():
            print(f"ops.extract --writers {writers} (no profiler, load included): {t:.1f} s, "
                  f"{tokens / t:,.0f} tok/s over the whole call")
        # The tables' footers give the self host and device totals to set against this wall time.
        print(f"profiled call ({'the first, cold' if args.cold else 'warm'}): {wall:.1f} s wall (load included); "
              f"the profiled extraction loop: "
              f"{box['loop']:.2f} s = {tokens / box['loop']:,.0f} tok/s under the profiler")
        if syncs is not None:
            print(f"-- host-device syncs in the loop's thread (torch.cuda.set_sync_debug_mode): "
                  f"{sum(syncs.values())} in all" + ("" if syncs else ", none"))
            for where, n in syncs.most_common(8):
                print(f"{n:6d} x {where}")
        if device.type == "cuda":
            print(f"-- top {args.top} by device time")
            print(events.table(sort_by=dev_attr, row_limit=args.top, max_name_column_width=60))
        print(f"-- top {args.top} by host time")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.top, max_name_column_width=60))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
