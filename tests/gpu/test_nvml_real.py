"""The real driver: a subprocess that holds ~2 GiB through torch.cuda must be
listed by Nvml.sample() on the GPU it uses, be tied to its run, and after a
SIGKILL wait_memory_released must prove its memory came back."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from eagle3_console.monitor.procs import RunRef, attach_owners
from eagle3_console.observe.alerts import unaccounted_gpu_memory as _unaccounted_gpu_memory
from eagle3_console.kernel.workspace import ENV_RUN_ID, ENV_WORKSPACE

GiB = 1 << 30
HOLD = 2 * GiB

# Allocates and touches HOLD bytes on its only visible GPU, then waits for stdin.
WORKER = r"""
import sys
try:
    import torch
except ImportError as exc:
    print("skip torch is not importable:", exc, flush=True); sys.exit(0)
if not torch.cuda.is_available():
    print("skip torch.cuda.is_available() is False", flush=True); sys.exit(0)
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
print("ready", torch.cuda.get_device_name(0), flush=True)
sys.stdin.read()
"""


def _find(report, pid):
    return [(g.index, p) for g in report.gpus for p in g.processes if p.pid == pid]


def test_worker_memory_is_seen_owned_and_released(nvml):
    report = nvml.sample()
    usable = [g for g in report.gpus if not g.lost and g.mem_total and g.mem_used is not None
              and g.mem_total - g.mem_used >= HOLD + GiB]
    if not usable:
        pytest.skip(f"no GPU has {HOLD // GiB + 1} GiB free: "
                    + ", ".join(f"GPU {g.index}: {g.error or g.mem_used}" for g in report.gpus))
    gpu = max(usable, key=lambda g: g.mem_total - g.mem_used)
    # NVML ignores CUDA_VISIBLE_DEVICES; pinning the worker by UUID makes
    # "the right GPU" unambiguous whatever the enumeration order.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu.uuid, **{ENV_RUN_ID: "9001", ENV_WORKSPACE: "/ws/gpu-test"})
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(HOLD)], env=env, start_new_session=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = worker.stdout.readline().strip()
        if line.startswith("skip "):
            pytest.skip(line[5:])
        assert line.startswith("ready"), f"worker did not start: {line!r} (exit {worker.poll()})"
        ct = psutil.Process(worker.pid).create_time()

        # NVML lists a new context within moments; poll rather than assume.
        deadline = time.monotonic() + 60
        while True:
            report = nvml.sample()
            found = _find(report, worker.pid)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        listed = sorted({p.pid for g in report.gpus for p in g.processes})
        assert found, (f"NVML does not list worker pid {worker.pid}; it lists {listed} "
                       "(pids of another pid namespace? NVML reports the host's)")
        assert [i for i, _ in found] == [gpu.index], f"worker seen on GPUs {[i for i, _ in found]}, expected {gpu.index}"
        proc = found[0][1]
        assert proc.used_bytes is None or proc.used_bytes >= HOLD, proc
        assert proc.type in ("compute", "compute+graphics")
        assert report.gpus[gpu.index].error is None

        leader = RunRef(run_id=9001, stage="gpu-test", pid=worker.pid, create_time=ct,
                        pgid=worker.pid, sid=worker.pid)
        attach_owners(report, [leader])
        proc = _find(report, worker.pid)[0][1]
        assert (proc.run_id, proc.stage, proc.how) == (9001, "gpu-test", "leader") and proc.visible
        # The real driver's own reserve plus a listed worker: nothing unaccounted.
        assert _unaccounted_gpu_memory(report.gpus) is None, _unaccounted_gpu_memory(report.gpus).message
        assert proc.create_time == pytest.approx(ct, abs=0.01)
        # An orphan whose leader record is gone is still found by its environment.
        report = nvml.sample()
        attach_owners(report, [RunRef(run_id=9001, stage="gpu-test", pid=None, create_time=None, workspace="/ws/gpu-test")])
        assert [(p.run_id, p.how) for _, p in _find(report, worker.pid)] == [(9001, "env")]

        held = nvml.wait_memory_released([worker.pid], timeout_s=0, poll_s=0.1)
        assert not held.released and [i for i, _ in held.held[worker.pid]] == [gpu.index]
    finally:
        worker.kill()
        worker.wait()
    result = nvml.wait_memory_released([worker.pid], timeout_s=60, poll_s=0.2)
    assert result.released, f"still held after SIGKILL: {result.held}, unreadable GPUs: {result.unreadable}"
    after = nvml.sample()
    assert _unaccounted_gpu_memory(after.gpus) is None, _unaccounted_gpu_memory(after.gpus).message
