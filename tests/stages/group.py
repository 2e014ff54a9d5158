"""Test stage: a leader that dies of SIGTERM and a worker in its process group
that ignores SIGTERM (a data-loader or NCCL helper that outlives its parent)."""
import subprocess
import sys
import time

worker = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "print('worker up', flush=True); time.sleep(300)"])
print(f"worker pid {worker.pid}", flush=True)
time.sleep(300)
