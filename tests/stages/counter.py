"""Test stage: prints `line N` for N in 0..count-1, one every --every seconds, then exits --exit."""
import argparse
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--count", type=int, default=60)
p.add_argument("--every", type=float, default=0.1)
p.add_argument("--exit", type=int, default=0)
a = p.parse_args()
for i in range(a.count):
    print(f"line {i}", flush=True)
    time.sleep(a.every)
sys.exit(a.exit)
