"""What the throughput benchmarks share: the device line, the matmul rate,
a direct-write probe, prepare-format inputs and the target shapes.

Each figure here is measured in the invocation that prints it (no constants
from elsewhere): the floors a benchmark compares against come from these.
"""

from __future__ import annotations

import json
import mmap
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Llama-3.1-8B as its config.json says (weights random: nothing is downloaded).
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                rms_norm_eps=1e-5, tie_word_embeddings=False)
# DeepSeek-V2-Lite as its config.json says: MLA (kv_lora_rank 512, no q LoRA),
# 64 routed experts top-6, 2 shared, the first layer dense.
DEEPSEEK_V2_LITE = dict(vocab_size=102400, hidden_size=2048, intermediate_size=10944,
                        moe_intermediate_size=1408, num_hidden_layers=27, num_attention_heads=16,
                        num_key_value_heads=16, n_routed_experts=64, num_experts_per_tok=6,
                        n_shared_experts=2, first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, topk_method="greedy",
                        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
                        max_position_embeddings=8192, rms_norm_eps=1e-6, tie_word_embeddings=False,
                        # In DeepSeek-V2-Lite's config.json; transformers' DeepseekV2Config drops them,
                        # SGLang's deepseek_v2.py reads them (_is_layer_sparse, the router).
                        moe_layer_freq=1, scoring_func="softmax")
# Small enough for a CPU test: the same code paths, seconds not minutes.
LLAMA_TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False)


def torch_device():
    import torch

    return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")


def device_line() -> str:
    import torch

    versions = f"torch {torch.__version__}"
    try:
        import transformers
        versions += f", transformers {transformers.__version__}"
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        return (f"device: {p.name} (cuda:0, {p.total_memory / 2**30:.0f} GiB, "
                f"{p.multi_processor_count} SMs; {versions})")
    return f"device: CPU ({os.cpu_count()} cores visible; {versions})"


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device, dtype) -> tuple[float, str]:
    """(FLOP/s, what was timed): n x n x n products, the mean of the timed ones
    after warm-ups, on random data (zeros run faster on Hopper)."""
    import torch

    n, warm, reps = (8192, 3, 10) if device.type == "cuda" else (768, 1, 3)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(warm):
        a @ b
    sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    dt = (time.perf_counter() - t0) / reps
    del a, b
    return 2 * n ** 3 / dt, f"{str(dtype).replace('torch.', '')} {n}x{n}x{n}"


def direct_write_rate(directory: Path, total_bytes: int, block: int = 16 << 20, streams: int = 1) -> tuple[float, str]:
    """(bytes/s, how) for writing `total_bytes` (at least one block a stream)
    into `directory` with O_DIRECT (the page cache bypassed, as a full disk
    sees it), fsync included, as `streams` concurrent writers of a file each:
    extract's writer threads, which on the H200's disk got more than one
    stream's probe (RESULTS.md, session 20). Where the filesystem refuses
    O_DIRECT (tmpfs), buffered writes + fsync, said so. A write error is raised."""
    from concurrent.futures import ThreadPoolExecutor

    directory.mkdir(parents=True, exist_ok=True)
    buf = mmap.mmap(-1, block)          # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(1 << 20) * (block >> 20))
    paths = [directory / f"direct-write-probe-{i}.bin" for i in range(streams)]
    share = max(block, total_bytes // streams)
    refused: list[str] = []
    fds: list[int] = []

    def open_one(path: Path) -> int:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_DIRECT", 0), 0o644)
            try:
                os.write(fd, buf)       # some filesystems refuse only at the first write
            except OSError:
                os.close(fd)
                raise
        except OSError as exc:
            refused.append(exc.strerror)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.lseek(fd, 0, os.SEEK_SET)
        return fd

    def write_one(fd: int) -> int:
        written = 0
        while written < share:
            written += os.write(fd, buf)    # releases the GIL: the streams overlap
        os.fsync(fd)
        return written

    try:
        for p in paths:
            fds.append(open_one(p))
        with ThreadPoolExecutor(streams) as pool:
            t0 = time.perf_counter()
            total = sum(f.result() for f in [pool.submit(write_one, fd) for fd in fds])
            dt = time.perf_counter() - t0
    finally:
        for fd in fds:
            os.close(fd)
        for p in paths:
            p.unlink(missing_ok=True)
    how = (f"buffered + fsync (O_DIRECT refused: {refused[0]})" if refused
           else f"O_DIRECT, {block >> 20} MiB blocks")
    return total / dt, f"{how}, {streams} stream{'s' if streams > 1 else ''}, {total / 2**30:.2f} GiB"


def write_prepared(path: Path, samples: int, seq: int, vocab: int, seed: int = 0) -> int:
    """prepare's output contract (ops/prepare/output.py) with random token ids,
    every sample `seq` tokens; returns the token count."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    total = samples * seq
    path.mkdir(parents=True, exist_ok=True)
    save_file({"input_ids": rng.integers(0, vocab, size=total).astype(np.int32),
               "loss_mask": np.ones(total, dtype=np.uint8),
               "offsets": (np.arange(samples + 1, dtype=np.int64) * seq),
               "source_line": np.arange(1, samples + 1, dtype=np.int64)},
              str(path / "samples.safetensors"), metadata={"format": "eagle3-prepare/1"})
    (path / "summary.json").write_text(json.dumps({"status": "complete", "samples": samples,
                                                   "total_tokens": total, "max_seq_len": seq}))
    return total


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def default_json(name: str) -> Path | None:
    """$OUT/<name> when OUT is set (the GPU machine's folder that comes back)."""
    return Path(os.environ["OUT"]) / name if os.environ.get("OUT") else None


def save_json(result: dict, path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {path}")
