"""Test stage: prints tqdm-style progress for N items, sleeping between."""
import argparse
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--n", type=int, default=10)
p.add_argument("--sleep", type=float, default=0.05)
p.add_argument("--exit", type=int, default=0)
a = p.parse_args()
for i in range(1, a.n + 1):
    time.sleep(a.sleep)
    sys.stderr.write(f"\rextract: {i * 100 // a.n:3d}%|####| {i}/{a.n} [00:{i:02d}<00:{a.n - i:02d}, {1 / a.sleep:.2f}it/s]")
    sys.stderr.flush()
sys.stderr.write("\n")
print(f"progress: samples {a.n}/{a.n} tokens {a.n * 100} errors 0 tok/s 100.0", flush=True)
sys.exit(a.exit)
