"""Test stage: spawns a child that outlives this process (an orphaned worker),
writes the child's pid to --pidfile, then exits with --exit."""
import argparse
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--pidfile", required=True)
p.add_argument("--exit", type=int, default=1)
p.add_argument("--child-seconds", type=float, default=60)
a = p.parse_args()
child = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({a.child_seconds})"])
with open(a.pidfile, "w") as fh:
    fh.write(str(child.pid))
print(f"worker {child.pid} started", flush=True)
time.sleep(0.2)
sys.exit(a.exit)
