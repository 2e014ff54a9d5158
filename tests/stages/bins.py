"""Test stage: a custom program writing its own sample files (sample_<i>.bin,
not hidden-state files) and a `progress: samples i/N` line per file; after
--pause-at files it waits for <output>/go before writing the rest."""
import argparse
import os
import time

p = argparse.ArgumentParser()
p.add_argument("--output", required=True)
p.add_argument("--n", type=int, default=40)
p.add_argument("--pause-at", type=int, default=-1)
a = p.parse_args()
os.makedirs(a.output, exist_ok=True)
for i in range(a.n):
    if i == a.pause_at:
        while not os.path.exists(os.path.join(a.output, "go")):
            time.sleep(0.02)
    with open(os.path.join(a.output, f"sample_{i}.bin"), "wb") as fh:
        fh.write(b"x" * 16)
    print(f"progress: samples {i + 1}/{a.n}", flush=True)
