"""Test stage: prints a line and sleeps (a long-running stage); on SIGTERM
exits 143 unless --ignore-term."""
import argparse
import signal
import time

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=60)
p.add_argument("--ignore-term", action="store_true")
a = p.parse_args()
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("sleeping", flush=True)
end = time.time() + a.seconds
while time.time() < end:
    time.sleep(0.05)
print("done", flush=True)
