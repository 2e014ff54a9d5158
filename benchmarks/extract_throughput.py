"""Extraction throughput of the real `python -m ops.extract` against baselines
and floors measured in the same invocation (issue 11).

Builds a random target from a config in code (nothing downloaded) and random
prepared samples in prepare's format, then times:
  matmul    n^3 products in the target's dtype -> compute floor
            = rate / (2 x params a token), params = the decoder layers'
            (the embedding is a lookup; extract never runs the LM head;
            MoE: attention + shared experts + top-k of the routed ones)
  write     O_DIRECT writes on the output's filesystem, one stream per extract writer -> write floor
            = bandwidth / bytes a token ((aux + 1) x hidden x dtype + ids + mask)
  bare      the base model's forward at budget/seq and budget/(2 seq) samples
            of seq tokens: no capture, no copies, no writes
  naive     output_hidden_states=True, one sample a forward, torch.save + fsync
  extract   `python -m ops.extract` as a subprocess, once per --durable mode;
            timed from its "target loaded" line to its "complete" line (so the
            durability step counts), with the GPU busy share from NVML
Usage: python benchmarks/extract_throughput.py [--shape 8b|moe|tiny] [--samples N] [--seq T]
       [--out DIR] [--durable fsync,syncfs] [--layers N] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import bench_common as bc  # noqa: E402
from ops.extract.spec import SPEC as EXTRACT  # noqa: E402  (the writers default the probe mirrors)

SHAPES = {
    #        config class, config, dtype, samples, seq
    "8b": ("LlamaConfig", bc.LLAMA_8B, "bfloat16", 160, 2048),
    "moe": ("DeepseekV2Config", bc.DEEPSEEK_V2_LITE, "bfloat16", 64, 2048),
    "tiny": ("LlamaConfig", bc.LLAMA_TINY, "float32", 12, 64),
}
# Where DeepseekV2 is missing from the installed transformers: the nearest
# routed-expert model it has (said in the output).
MOE_FALLBACKS = (
    ("Qwen2MoeConfig", dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                            moe_intermediate_size=1408, shared_expert_intermediate_size=2816,
                            num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16,
                            num_experts=64, num_experts_per_tok=6, decoder_sparse_step=1,
                            max_position_embeddings=8192, tie_word_embeddings=False)),
)


def log(msg: str) -> None:
    print(msg, flush=True)


def build_config(shape: str, layers: int | None):
    import transformers

    cls_name, kwargs, dtype, _, _ = SHAPES[shape]
    note = ""
    if not hasattr(transformers, cls_name):
        for alt, alt_kwargs in MOE_FALLBACKS:
            if hasattr(transformers, alt):
                note = f"{cls_name} is not in transformers {transformers.__version__}; {alt} instead"
                cls_name, kwargs = alt, alt_kwargs
                break
        else:
            raise SystemExit(f"error: transformers {transformers.__version__} has no {cls_name} "
                             f"nor any of {[a for a, _ in MOE_FALLBACKS]}")
    kwargs = dict(kwargs)
    if layers:
        kwargs["num_hidden_layers"] = layers
    cfg = getattr(transformers, cls_name)(**kwargs)
    cfg.dtype = dtype
    return cfg, dtype, note


def build_target(cfg, dtype_name: str, path: Path, device):
    """A random-weight model of `cfg` on `device`, saved as a Hugging Face folder."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):   # initialised where it runs: minutes faster than on the CPU
            model = AutoModelForCausalLM.from_config(cfg)
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    model.save_pretrained(str(path))
    return model


def counted_params(model, cfg) -> tuple[int, int]:
    """(all parameters, those a token multiplies in the decoder layers)."""
    from ops.target_model.capture import decoder_layers

    total = sum(p.numel() for p in model.parameters())
    experts = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_experts", None)
    top_k = getattr(cfg, "num_experts_per_tok", None)
    active = 0.0
    for name, p in decoder_layers(model).named_parameters():
        # Routed experts (mlp.experts.*, fused or one module each): top_k of them a token.
        share = top_k / experts if experts and ".mlp.experts." in f".{name}" else 1.0
        active += p.numel() * share
    return total, int(active)


def bare_forward(model, batch: int, seq: int, vocab: int, device, reps: int, with_mask: bool = True) -> float:
    """The forward alone on device-resident ids; with an all-ones mask (what
    a padded batch passes) or none (what ops.extract passes an unpadded one)."""
    import torch
    from ops.target_model.capture import base_model

    base = base_model(model)
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    mask = torch.ones_like(ids) if with_mask else None
    with torch.inference_mode():
        base(input_ids=ids, attention_mask=mask, use_cache=False)
        bc.sync(device)
        t0 = time.perf_counter()
        for _ in range(reps):
            base(input_ids=ids, attention_mask=mask, use_cache=False)
        bc.sync(device)
    return reps * batch * seq / (time.perf_counter() - t0)


def writer_rate(out: Path, samples: int, seq: int, aux_width: int, hidden: int, threads: int,
                mode: str) -> float:
    """tok/s of ops.extract's writers alone (SampleWriter from one file image
    of the sample's shape, durable as `mode` makes the op): the bound the disk
    path puts on extraction, with no GPU in it."""
    import numpy as np
    import torch
    from ops.extract.sample_file import sample_image
    from ops.extract.writer import SampleWriter, WriteJob
    from ops.formats import sample_path

    image = sample_image({"input_ids": torch.from_numpy(np.zeros(seq, dtype=np.int64)),
                          "loss_mask": torch.ones(seq, dtype=torch.uint8),
                          "aux_hidden_states": torch.randn(seq, aux_width).to(torch.bfloat16),
                          "final_hidden_states": torch.randn(seq, hidden).to(torch.bfloat16)})
    writer = SampleWriter(threads, 32, on_written=lambda idx, n: None,
                          fsync=mode in ("fsync", "direct"), direct=mode == "direct")
    t0 = time.perf_counter()
    for idx in range(samples):
        writer.submit(WriteJob(idx, sample_path(out, idx), image, None, seq))
    writer.close()
    dt = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return samples * seq / dt


def naive_extract(model, prepared: Path, out: Path, n: int, layer_ids: list[int], device) -> tuple[float, int]:
    """What a first script does: every hidden state, one sample a forward, torch.save + fsync."""
    import torch
    from safetensors.numpy import load_file

    arrays = load_file(str(prepared / "samples.safetensors"))
    ids, offsets = arrays["input_ids"], arrays["offsets"]
    out.mkdir(parents=True, exist_ok=True)
    tokens = 0
    with torch.inference_mode():
        x = torch.from_numpy(ids[offsets[0]:offsets[1]].astype("int64"))[None].to(device)
        model(x, output_hidden_states=True)     # warm-up, as the other figures have one
        bc.sync(device)
        t0 = time.perf_counter()
        for i in range(n):
            x = torch.from_numpy(ids[offsets[i]:offsets[i + 1]].astype("int64"))[None].to(device)
            hs = model(x, output_hidden_states=True).hidden_states
            path = out / f"data_{i}.pt"
            with open(path, "wb") as fh:
                torch.save({"input_ids": x[0].cpu(),
                            "aux_hidden_states": torch.cat([hs[k + 1][0] for k in layer_ids], -1).cpu(),
                            "final_hidden_states": hs[-1][0].cpu()}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            tokens += x.shape[1]
    return tokens / (time.perf_counter() - t0), tokens


class BusySampler:
    """NVML's GPU utilisation every 0.1 s; mean over a window. None without NVML."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._handle = None
        try:
            import pynvml
            pynvml.nvmlInit()
            index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVML (CPU, no driver): no busy figure
            return
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
            except Exception:  # noqa: BLE001
                return
            self.samples.append((time.monotonic(), int(util)))

    def mean(self, t0: float, t1: float) -> float | None:
        vals = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(vals) / len(vals) / 100 if vals else None

    def stop(self) -> None:
        self._stop.set()


TOKS_RE = re.compile(r"(\d+) samples, (\d+) tokens extracted in .*?([\d.]+) tok/s\.")
PROGRESS_RE = re.compile(r"progress: samples \d+/\d+ tokens (\d+) ")
DURABLE_RE = re.compile(r"extract: durable: (.*) in ([\d.]+) s")
TIME_RE = re.compile(r"extract: time: .*")      # ops/extract/loop.py time_line: what bounds the run


def run_extract(target: Path, prepared: Path, out: Path, mode: str, token_budget: int,
                busy: BusySampler, extra: tuple[str, ...] = ()) -> dict:
    argv = [sys.executable, "-m", "ops.extract", "--target", str(target), "--input", str(prepared),
            "--output", str(out), "--token-budget", str(token_budget), "--durable", mode,
            "--progress-interval", "1", *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(bc.ROOT), os.environ.get("PYTHONPATH")])))
    t_start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=bc.ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    loaded = complete = None
    lines: list[str] = []
    own = durable = where = None
    ticks: list[tuple[float, int]] = []     # (time, tokens) of each `progress:` line
    for line in proc.stdout:
        now = time.monotonic()
        lines.append(line.rstrip("\n"))
        if (m := PROGRESS_RE.match(line)):
            ticks.append((now, int(m.group(1))))
        if line.startswith("target loaded"):
            loaded = now
        elif line.startswith("extract: complete:"):
            complete = now
        if (m := TOKS_RE.search(line)):
            own = (int(m.group(1)), int(m.group(2)), float(m.group(3)))
        if (m := DURABLE_RE.search(line)):
            durable = (m.group(1), float(m.group(2)))
        if (m := TIME_RE.search(line)):
            where = m.group(0)
    code = proc.wait()
    if code != 0 or loaded is None or complete is None or own is None:
        tail = "\n".join(lines[-30:])
        raise SystemExit(f"error: ops.extract --durable {mode} exited {code}:\n{tail}")
    window = complete - loaded
    written = bc.dir_bytes(out)
    # Steady state: from the first progress line with tokens written (the
    # first batch's one-off costs behind it: lazy kernel loading, autotuning,
    # pinning the slabs) to the end. A run of hours is this rate.
    first = next(((t, n) for t, n in ticks if n > 0), None)
    steady = ((own[1] - first[1]) / (complete - first[0])
              if first is not None and complete - first[0] > 0.5 and own[1] > first[1] else None)
    return {"mode": mode, "samples": own[0], "tokens": own[1], "tok_s": own[1] / window,
            "program_tok_s": own[2], "window_s": window, "steady_tok_s": steady, "load_s": loaded - t_start,
            "bytes": written, "mb_s": written / window / 1e6, "durable_step": durable,
            "gpu_busy": busy.mean(loaded, complete),
            "steady_gpu_busy": busy.mean(first[0], complete) if first is not None else None, "time": where}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--samples", type=int, default=None, help="prepared samples (default: by shape)")
    ap.add_argument("--seq", type=int, default=None, help="tokens a sample (default: by shape)")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers (a cheaper MoE run)")
    ap.add_argument("--out", type=Path, default=None,
                    help="working folder on the filesystem to measure (default: a new temp folder)")
    ap.add_argument("--durable", default=None,
                    help="comma-separated ops.extract --durable modes to run, each a full extraction "
                         "(default: the program's default only)")
    ap.add_argument("--token-budget", type=int, default=16384)
    ap.add_argument("--naive-samples", type=int, default=32)
    ap.add_argument("--write-gib", type=float, default=None, help="direct-write probe size (default by device)")
    ap.add_argument("--keep", action="store_true", help="keep the target and outputs")
    ap.add_argument("--compile", action="store_true",
                    help="also: the bare forward with its decoder layers compiled, and ops.extract --compile "
                         "(with the first --durable mode)")
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here (default $OUT/...)")
    a = ap.parse_args()

    import torch
    from ops.extract import durable as durable_mod
    from ops.layers import parse_layer_ids

    _, _, _, samples_default, seq_default = SHAPES[a.shape]
    samples, seq = a.samples or samples_default, a.seq or seq_default
    modes = [m.strip() for m in (a.durable or durable_mod.DEFAULT).split(",") if m.strip()]
    for m in modes:
        if m not in durable_mod.MODES:
            raise SystemExit(f"error: --durable {m!r}: expected {', '.join(durable_mod.MODES)}")
    root = a.out or Path(tempfile.mkdtemp(prefix="extract-throughput-"))
    root.mkdir(parents=True, exist_ok=True)
    work = root / f"extract-throughput-{a.shape}"
    shutil.rmtree(work, ignore_errors=True)
    device = bc.torch_device()
    log(bc.device_line())

    if a.layers is not None and a.layers < 8:
        raise SystemExit(f"error: --layers {a.layers}: the default aux layers [1, N//2-1, N-4] need N >= 8")
    cfg, dtype_name, note = build_config(a.shape, a.layers)
    t0 = time.perf_counter()
    model = build_target(cfg, dtype_name, work / "target", device)
    total_params, active = counted_params(model, cfg)
    layer_ids = parse_layer_ids("auto", cfg.num_hidden_layers)
    dtype = getattr(torch, dtype_name)
    elem = torch.tensor([], dtype=dtype).element_size()
    bytes_token = (len(layer_ids) + 1) * cfg.hidden_size * elem + 8 + 1
    log(f"shape {a.shape}: {type(cfg).__name__} {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, "
        f"vocab {cfg.vocab_size}, {dtype_name}; {total_params / 1e6:,.1f} M params, "
        f"{active / 1e6:,.1f} M multiplied a token in the decoder layers (the floor's count)"
        + (f"; {note}" if note else "") + f"; built and saved in {time.perf_counter() - t0:.0f} s")
    tokens = bc.write_prepared(work / "prepared", samples, seq, cfg.vocab_size)
    log(f"data: {samples} samples x {seq} tokens = {tokens:,} tokens; aux layers {layer_ids} + final; "
        f"{bytes_token / 1024:.1f} KiB written a token")

    rate, what = bc.matmul_rate(device, dtype)
    compute_floor = rate / (2 * active)
    log(f"matmul {what}: {rate / 1e12:.1f} TFLOP/s -> compute floor {compute_floor:,.0f} tok/s "
        f"(2 x {active / 1e6:,.1f} M FLOPs a token)")
    write_gib = a.write_gib or (4.0 if device.type == "cuda" else 0.0625)
    bw, how = bc.direct_write_rate(work / "probe", int(write_gib * 2**30), streams=EXTRACT.params["writers"])
    write_floor = bw / bytes_token
    log(f"direct write ({how}) in {work}: {bw / 1e6:,.0f} MB/s -> write floor {write_floor:,.0f} tok/s")
    floor = min(compute_floor, write_floor)
    writers = {}
    for wmode in ("fsync", "direct"):
        for threads in (4, 8):
            key = f"{wmode}-{threads}"
            writers[key] = writer_rate(work / "writer-probe", min(samples, 64), seq,
                                       len(layer_ids) * cfg.hidden_size, cfg.hidden_size, threads, wmode)
            log(f"ops.extract's writers alone ({threads} threads, --durable {wmode}): "
                f"{writers[key]:,.0f} tok/s = {writers[key] * bytes_token / 1e6:,.0f} MB/s")
    floor_name = "compute" if compute_floor <= write_floor else "write"

    reps = 3 if device.type == "cuda" else 2
    bare = {}
    for batch in sorted({max(1, a.token_budget // seq), max(1, a.token_budget // (2 * seq))}, reverse=True):
        for with_mask in (True, False):
            key = f"{batch}" if with_mask else f"{batch}-nomask"
            bare[key] = bare_forward(model, batch, seq, cfg.vocab_size, device, reps, with_mask)
            log(f"bare forward {batch} x {seq} {'with an all-ones mask' if with_mask else 'without a mask'}: "
                f"{bare[key]:,.0f} tok/s = {bare[key] / compute_floor:.2f} of the compute floor")
    best_bare = max(bare.values())     # the ratios below are against the fastest bare forward
    naive_n = min(a.naive_samples, samples)
    naive, _ = naive_extract(model, work / "prepared", work / "naive", naive_n, layer_ids, device)
    log(f"naive extractor ({naive_n} samples, output_hidden_states, torch.save + fsync): {naive:,.0f} tok/s")
    shutil.rmtree(work / "naive", ignore_errors=True)
    if a.compile:
        from ops.target_model.capture import compile_layers

        compile_layers(model)
        for batch in sorted({max(1, a.token_budget // seq)}):
            t0 = time.perf_counter()
            bare_forward(model, batch, seq, cfg.vocab_size, device, 1, False)     # compiles
            log(f"bare forward {batch} x {seq} compiled: the compile took {time.perf_counter() - t0:.0f} s")
            key = f"{batch}-compiled"
            bare[key] = bare_forward(model, batch, seq, cfg.vocab_size, device, reps, False)
            log(f"bare forward {batch} x {seq} without a mask, decoder layers compiled: {bare[key]:,.0f} tok/s = "
                f"{bare[key] / compute_floor:.2f} of the compute floor")
        best_bare = max(bare.values())
    # The program loads its own copy; ours is not needed any more.
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()

    busy = BusySampler()
    runs = []
    plan = [(mode, ()) for mode in modes] + ([(modes[0], ("--compile",))] if a.compile else [])
    for mode, extra in plan:
        out = work / f"out-{mode}{'-compiled' if extra else ''}"
        r = run_extract(work / "target", work / "prepared", out, mode, a.token_budget, busy, extra)
        mode = r["mode"] = " ".join([mode, *extra])
        runs.append(r)
        gpu = f"GPU busy {r['gpu_busy']:.0%}; " if r["gpu_busy"] is not None else ""
        step = f"durability step {r['durable_step'][1]:.2f} s ({r['durable_step'][0]}); " if r["durable_step"] else ""
        log(f"ops.extract --durable {mode}: {r['tok_s']:,.0f} tok/s "
            f"(load {r['load_s']:.0f} s, then {r['tokens']:,} tokens in {r['window_s']:.1f} s) = "
            f"{r['tok_s'] / best_bare:.2f} of the bare forward, {r['tok_s'] / floor:.2f} of the lower floor "
            f"({floor_name}); {r['tok_s'] / compute_floor:.2f} of compute, {r['tok_s'] / write_floor:.2f} of write; "
            f"{r['tok_s'] / naive:.1f}x the naive extractor; {gpu}{step}"
            f"{r['mb_s']:,.0f} MB/s written; its own line said {r['program_tok_s']:,.0f} tok/s")
        if r["steady_tok_s"]:
            st = r["steady_tok_s"]
            log(f"ops.extract --durable {mode} steady state (after the first batch): {st:,.0f} tok/s = "
                f"{st / best_bare:.2f} of the bare forward, {st / floor:.2f} of the lower floor ({floor_name})")
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
    busy.stop()
    if len(runs) > 1:
        best = max(runs, key=lambda r: r["tok_s"])
        log(f"durable: {best['mode']} cost least here ("
            + ", ".join(f"{r['mode']} {r['tok_s']:,.0f}" for r in runs) + " tok/s)")
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    bc.save_json({"shape": a.shape, "device": bc.device_line(), "note": note, "samples": samples, "seq": seq,
                  "params": total_params, "active_params": active, "matmul_flops": rate, "matmul": what,
                  "compute_floor_tok_s": compute_floor, "write_bytes_s": bw, "write_probe": how,
                  "write_floor_tok_s": write_floor, "bytes_per_token": bytes_token,
                  "writers_alone_tok_s": writers,
                  "bare_tok_s": {str(k): v for k, v in bare.items()}, "naive_tok_s": naive,
                  "extract": runs}, a.json or bc.default_json(f"extract_throughput_{a.shape}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
