"""Test stage: prints `line N` for N in 0..count-1, one every --every seconds, then exits --exit.
With --hold-at N --until FILE it waits before line N until FILE exists (a test says when the
run goes on, no fixed duration)."""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--count", type=int, default=60)
p.add_argument("--every", type=float, default=0.1)
p.add_argument("--exit", type=int, default=0)
p.add_argument("--hold-at", type=int, default=None)
p.add_argument("--until", default=None)
a = p.parse_args()
for i in range(a.count):
    if i == a.hold_at:
        while not os.path.exists(a.until):
            time.sleep(0.02)
    print(f"line {i}", flush=True)
    time.sleep(a.every)
sys.exit(a.exit)
