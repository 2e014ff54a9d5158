"""Test stage: prints a line and sleeps (a long-running stage); on SIGTERM
exits 143 unless --ignore-term, or with --term-exit N (a stage that catches
SIGTERM and exits cleanly, as many trainers do after saving); with --until FILE it
ends as soon as FILE exists (a test says when, no fixed duration)."""
import argparse
import os
import signal
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--seconds", type=float, default=60)
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--term-exit", type=int, default=None)
p.add_argument("--until", default=None, help="end (exit 0) as soon as this file exists")
a = p.parse_args()
if a.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
elif a.term_exit is not None:
    signal.signal(signal.SIGTERM, lambda *_: (print("caught SIGTERM, exiting", flush=True), sys.exit(a.term_exit)))
print("sleeping", flush=True)
end = time.time() + a.seconds
while time.time() < end and not (a.until and os.path.exists(a.until)):
    time.sleep(0.05)
print("done", flush=True)
