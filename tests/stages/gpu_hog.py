"""GPU test stage: the leader takes --leader-gib of GPU memory, starts --workers
worker processes that take --worker-gib each and outlive it (like vLLM/SGLang
workers after their parent died), prints an out-of-memory traceback and exits 1."""
import argparse
import subprocess
import sys
import time

WORKER = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
print("worker holds", sys.argv[1], "GiB", flush=True)
time.sleep(3600)
"""

p = argparse.ArgumentParser()
p.add_argument("--leader-gib", type=float, default=2)
p.add_argument("--worker-gib", type=float, default=6)
p.add_argument("--workers", type=int, default=1)
p.add_argument("--hold-s", type=float, default=8)
a = p.parse_args()
import torch  # noqa: E402

x = torch.empty(int(a.leader_gib * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(a.worker_gib)]) for _ in range(a.workers)]
print(f"leader holds {a.leader_gib} GiB; workers {[w.pid for w in workers]}", flush=True)
time.sleep(a.hold_s)
print("Traceback (most recent call last):", flush=True)
print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. "
      "GPU 0 has a total capacity of 139.80 GiB of which 3.12 GiB is free.", flush=True)
sys.exit(1)
