"""Test stage: writes --n files <prefix><i>.bin under <output>[/<sub>], one
every --every seconds, then exits --exit. --skew-s dates each file that many
seconds ahead (a file server whose clock runs ahead: NFS sets mtimes by the
server's clock, not the writer's). With --until FILE it stays alive after its
files until FILE exists (a test says when the run may end, no fixed duration)."""
import argparse
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--output", required=True)
p.add_argument("--sub", default="")
p.add_argument("--n", type=int, default=10)
p.add_argument("--prefix", default="f")
p.add_argument("--every", type=float, default=0.0)
p.add_argument("--skew-s", type=float, default=0.0)
p.add_argument("--exit", type=int, default=0)
p.add_argument("--until", default="", help="after the files, wait until this file exists")
a = p.parse_args()
where = os.path.join(a.output, a.sub) if a.sub else a.output
os.makedirs(where, exist_ok=True)
for i in range(a.n):
    path = os.path.join(where, f"{a.prefix}{i}.bin")
    with open(path, "wb") as fh:
        fh.write(b"x" * 64)
    if a.skew_s:
        t = time.time() + a.skew_s
        os.utime(path, (t, t))
    print(f"wrote {path}", flush=True)
    time.sleep(a.every)
while a.until and not os.path.exists(a.until):
    time.sleep(0.05)
sys.exit(a.exit)
