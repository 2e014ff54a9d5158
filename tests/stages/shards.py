"""Test stage: writes N sample files (safetensors) into rows_a-b/ shards,
tmp then rename, like extract; --crash-at K leaves a tmp file and a truncated
sample and exits 1 after printing an out-of-memory traceback."""
import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path


def sample_bytes(idx: int, tokens: int) -> bytes:
    data = bytes([idx % 256]) * (tokens * 8)
    header = {"input_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [0, tokens * 8]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


p = argparse.ArgumentParser()
p.add_argument("--output", required=True)
p.add_argument("--n", type=int, default=20)
p.add_argument("--rows", type=int, default=10)
p.add_argument("--tokens", type=int, default=16)
p.add_argument("--sleep", type=float, default=0.0)
p.add_argument("--crash-at", type=int, default=-1)
# Seconds between the OOM message and the exit, as a launcher tearing down its
# other ranks takes: the console sees the OOM while the stage still runs.
p.add_argument("--linger", type=float, default=0.0)
a = p.parse_args()
out = Path(a.output)
out.mkdir(parents=True, exist_ok=True)
(out / "data_config.json").write_text(json.dumps({"status": "running", "total_samples": a.n}))
for i in range(a.n):
    shard = out / f"rows_{i // a.rows * a.rows}-{i // a.rows * a.rows + a.rows}"
    shard.mkdir(exist_ok=True)
    final = shard / f"data_{i}.safetensors"
    if final.exists():
        continue
    blob = sample_bytes(i, a.tokens)
    if i == a.crash_at:
        (shard / f"data_{i}.safetensors.tmp").write_bytes(blob[: len(blob) // 2])
        (shard / f"data_{i + 1}.safetensors").write_bytes(blob[: len(blob) // 3])
        print("Traceback (most recent call last):", flush=True)
        print('  File "extract.py", line 1, in <module>', flush=True)
        print("RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 896.00 MiB. "
              "GPU 0 has a total capacity of 94.97 GiB of which 3.12 GiB is free.'", flush=True)
        time.sleep(a.linger)
        sys.exit(1)
    tmp = final.with_name(final.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, final)
    print(f"progress: samples {i + 1}/{a.n} tokens {(i + 1) * a.tokens} errors 0 tok/s 1000.0", flush=True)
    time.sleep(a.sleep)
(out / "data_config.json").write_text(json.dumps({"status": "complete", "total_samples": a.n,
                                                 "total_tokens": a.n * a.tokens}))
