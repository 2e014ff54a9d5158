"""monitor/gpus.py: NVML sampling that degrades per GPU, through the fake
pynvml (tests/fake_pynvml.py) at the driver boundary and the real pynvml on
this driverless machine; GPU processes are real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys

import pynvml
import pytest

from eagle3_console.monitor.gpus import MemoryRelease, Nvml, NvmlUnavailable
from eagle3_console.monitor.procs import RunRef, attach_owners
from eagle3_console.kernel.workspace import ENV_RUN_ID, ENV_WORKSPACE
from tests.fake_pynvml import (GiB, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIB_RM_VERSION_MISMATCH,
                               NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNKNOWN,
                               FakeNvml)


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []

    def start(*, env_run_id: str | None = None) -> subprocess.Popen:
        env = dict(os.environ)
        if env_run_id is not None:
            env[ENV_RUN_ID] = env_run_id
            env[ENV_WORKSPACE] = "/ws/gpu-test"
        p = subprocess.Popen(["sleep", "60"], env=env, start_new_session=env_run_id is not None)
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def test_fake_matches_real_pynvml_names():
    # The fake must not drift from the real module: every name it offers exists there.
    for name in dir(FakeNvml):
        if name.startswith(("nvml", "NVML")):
            assert hasattr(pynvml, name), name
    for code in (NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_NOT_SUPPORTED):
        assert type(pynvml.NVMLError(code)).__name__ == type(FakeNvml.NVMLError(code)).__name__


@pytest.mark.parametrize("count", [8, 16])
def test_every_gpu_sampled(count, procs):
    fake = FakeNvml(count)
    worker = procs()
    fake.gpus[count - 1].mem_used = 91 * GiB
    fake.gpus[count - 1].util = 97
    fake.gpus[count - 1].compute[worker.pid] = 90 * GiB
    report = Nvml(module=fake).sample()
    assert report.available and report.reason is None and report.driver == "580.95.05"
    assert [g.index for g in report.gpus] == list(range(count))
    assert len({g.uuid for g in report.gpus}) == count
    last = report.gpus[-1]
    assert (last.mem_used, last.util_pct, last.temp_c, last.power_w) == (91 * GiB, 97, 35, 75.0)
    assert last.mem_total == fake.gpus[-1].mem_total
    assert [(p.pid, p.used_bytes, p.type) for p in last.processes] == [(worker.pid, 90 * GiB, "compute")]
    assert all(g.error is None and not g.lost and g.unsupported == [] for g in report.gpus)
    assert all(g.processes == [] for g in report.gpus[:-1])


def test_memory_is_nvidia_smis_v2_reading_falling_back_to_v1():
    """On an H200 the v1 call read 616 MiB more than nvidia-smi (the driver's reserved
    memory; benchmarks/gpu_fleet.py step 1): v2 where the driver has it, else v1, asked once."""
    fake = FakeNvml(2)
    for g in fake.gpus:
        g.mem_used, g.mem_reserved = 4 * GiB, 616 << 20
    fake.gpus[1].no_v2 = True
    nvml = Nvml(module=fake)
    first = nvml.sample()
    assert first.gpus[0].mem_used == 4 * GiB                   # v2: what nvidia-smi shows
    assert first.gpus[1].mem_used == 4 * GiB + (616 << 20)     # v1 on the old driver, no error
    assert first.gpus[1].error is None
    assert nvml.sample().gpus[1].mem_used == 4 * GiB + (616 << 20)


def test_lost_gpu_degrades_only_itself(procs):
    fake = FakeNvml(8)
    worker = procs()
    fake.gpus[5].compute[worker.pid] = 4 * GiB
    nvml = Nvml(module=fake)
    first = nvml.sample()
    assert first.gpus[3].error is None
    fake.gpus[3].lost = True            # falls off the bus while we watch
    report = nvml.sample()
    lost = report.gpus[3]
    assert lost.lost and "GPU is lost" in lost.error and "NVMLError_GpuIsLost" in lost.error
    assert lost.uuid == first.gpus[3].uuid       # still says which board it is
    assert (lost.mem_used, lost.util_pct, lost.processes) == (None, None, [])
    for g in report.gpus[:3] + report.gpus[4:]:
        assert g.error is None and not g.lost and g.mem_total is not None and g.temp_c == 35
    assert report.gpus[5].processes[0].pid == worker.pid
    # Lost from the start: the handle itself cannot be had.
    fresh = Nvml(module=fake).sample()
    assert fresh.available and fresh.gpus[3].lost and "handle" in fresh.gpus[3].error
    assert sum(g.lost for g in fresh.gpus) == 1


def test_not_supported_field_is_none_and_not_asked_again():
    fake = FakeNvml(8)
    fake.gpus[1].fail["power"] = NVML_ERROR_NOT_SUPPORTED
    nvml = Nvml(module=fake)
    for _ in range(3):
        report = nvml.sample()
    gpu = report.gpus[1]
    assert gpu.power_w is None and gpu.unsupported == ["power"] and gpu.error is None
    assert gpu.mem_used is not None and gpu.temp_c == 35
    assert all(g.power_w == 75.0 for g in report.gpus if g.index != 1)
    # 8 GPUs x 1 call for the first sample, then only the 7 that report power.
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 8 + 7 + 7
    # Handles, names and UUIDs are read once.
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 8
    assert fake.calls["nvmlDeviceGetUUID"] == 8
    assert fake.calls["nvmlInit"] == 1


def test_unknown_error_on_one_field_is_reported_on_that_gpu():
    fake = FakeNvml(8)
    fake.gpus[6].fail["utilization"] = NVML_ERROR_UNKNOWN
    report = Nvml(module=fake).sample()
    gpu = report.gpus[6]
    assert gpu.util_pct is None and gpu.error == "utilization: NVMLError_Unknown: Unknown Error"
    assert gpu.mem_used is not None and gpu.power_w == 75.0 and not gpu.lost
    assert all(g.error is None for g in report.gpus if g.index != 6)


def test_gpu_without_a_handle_degrades_only_itself():
    fake = FakeNvml(8)
    fake.gpus[2].fail["handle"] = NVML_ERROR_UNKNOWN
    report = Nvml(module=fake).sample()
    gpu = report.gpus[2]
    assert gpu.error == "handle: NVMLError_Unknown: Unknown Error" and not gpu.lost
    assert gpu.mem_total is None and gpu.processes == []
    assert all(g.error is None and g.mem_total for g in report.gpus if g.index != 2)


def test_process_memory_unavailable_and_graphics_merge(procs):
    a, b = procs(), procs()
    fake = FakeNvml(2)
    fake.gpus[0].compute[a.pid] = None              # pynvml's translation of "not available"
    fake.gpus[0].compute[b.pid] = (1 << 64) - 1     # the raw marker
    fake.gpus[1].compute[a.pid] = 1 * GiB
    fake.gpus[1].graphics[a.pid] = 3 * GiB
    report = Nvml(module=fake).sample()
    assert {(p.pid, p.used_bytes) for p in report.gpus[0].processes} == {(a.pid, None), (b.pid, None)}
    [merged] = report.gpus[1].processes
    assert (merged.pid, merged.used_bytes, merged.type) == (a.pid, 3 * GiB, "compute+graphics")


def test_old_driver_without_v3_falls_back_to_v2(procs):
    worker = procs()
    fake = FakeNvml(8, missing=("nvmlDeviceGetComputeRunningProcesses_v3",
                                "nvmlDeviceGetGraphicsRunningProcesses_v3"))
    fake.gpus[2].compute[worker.pid] = 2 * GiB
    nvml = Nvml(module=fake)
    nvml.sample()
    report = nvml.sample()
    assert [p.pid for p in report.gpus[2].processes] == [worker.pid]
    assert all(g.error is None for g in report.gpus)
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1   # given up after the first miss
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 16


@pytest.mark.parametrize("code, words", [
    (NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml.so.1"),
    (NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
    (NVML_ERROR_LIB_RM_VERSION_MISMATCH, "different versions"),
])
def test_no_driver_is_unavailable_with_the_reason(code, words):
    nvml = Nvml(module=FakeNvml(8, init_error=code), retry_s=None)
    report = nvml.sample()
    assert not report.available and report.gpus == []
    assert words in report.reason
    with pytest.raises(NvmlUnavailable, match=words):
        nvml.wait_memory_released([os.getpid()], timeout_s=0)


def test_failed_init_is_retried_after_retry_s():
    fake = FakeNvml(8, init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    never = Nvml(module=fake, retry_s=None)
    retry = Nvml(module=fake, retry_s=0.0)
    assert not never.sample().available and not retry.sample().available
    fake.init_error = None              # the operator loaded the driver
    assert not never.sample().available
    assert retry.sample().available and len(retry.sample().gpus) == 8


def test_real_pynvml_without_driver_says_why():
    nvml = Nvml()
    report = nvml.sample()
    if report.available:
        pytest.skip("this machine has a working NVIDIA driver; tests/gpu/ covers it")
    assert report.reason.startswith("no NVIDIA driver: the NVML library libnvidia-ml.so.1 could not be loaded")
    assert "NVMLError_LibraryNotFound" in report.reason
    nvml.shutdown()


def test_missing_pynvml_module_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)    # what an absent package looks like to import
    report = Nvml().sample()
    assert not report.available and "install nvidia-ml-py" in report.reason


def test_shutdown_then_sample_reinitialises():
    fake = FakeNvml(8)
    with Nvml(module=fake) as nvml:
        assert nvml.sample().available
        nvml.shutdown()
        assert fake.initialized == 0
        assert nvml.sample().available and fake.initialized == 1
    assert fake.initialized == 0


def test_wait_memory_released_after_real_kill(procs):
    worker, other = procs(env_run_id="7"), procs()
    fake = FakeNvml(8)
    for i in range(8):                  # a TP-8 worker group: one pid holds memory everywhere
        fake.gpus[i].compute[worker.pid] = 91 * GiB
    fake.gpus[0].compute[other.pid] = 1 * GiB
    nvml = Nvml(module=fake)
    ref = RunRef(run_id=7, stage="extract", pid=None, create_time=None, workspace="/ws/gpu-test")
    report = attach_owners(nvml.sample(), [ref])
    mine = [p for g in report.gpus for p in g.processes if p.run_id == 7]
    assert len(mine) == 8 and {p.how for p in mine} == {"env"}
    assert [p.run_id for p in report.gpus[0].processes if p.pid == other.pid] == [None]

    held = nvml.wait_memory_released([worker.pid], timeout_s=0.0, poll_s=0.01)
    assert not held.released and held.unreadable == {}
    assert held.held == {worker.pid: [(i, 91 * GiB) for i in range(8)]}

    for g in fake.gpus:
        g.linger = 3                    # the driver frees a dead worker's memory a little later
    worker.kill()
    worker.wait()
    early = nvml.wait_memory_released([worker.pid], timeout_s=0.0, poll_s=0.01)
    assert early.held == {worker.pid: [(i, 91 * GiB) for i in range(8)]} and not early.released
    done = nvml.wait_memory_released([worker.pid], timeout_s=30.0, poll_s=0.01)
    assert isinstance(done, MemoryRelease) and done.released and done.held == {}
    assert done.polls == 3              # two more listings still showed it, the third did not
    # The unrelated process still holds its memory, untouched.
    assert nvml.holders()[0][other.pid] == [(0, 1 * GiB)]


def test_wait_memory_released_cannot_prove_on_a_lost_gpu(procs):
    worker = procs()
    fake = FakeNvml(8)
    fake.gpus[4].compute[worker.pid] = 8 * GiB
    nvml = Nvml(module=fake)
    worker.kill()
    worker.wait()
    fake.gpus[7].lost = True
    result = nvml.wait_memory_released([worker.pid], timeout_s=0.0, poll_s=0.01)
    assert result.held == {} and not result.released
    assert "GPU is lost" in result.unreadable[7] and list(result.unreadable) == [7]


def test_gpu_memory_no_visible_process_explains_is_one_warning(ws, procs):
    # A container sees no host pid (nothing listed, or pids it does not have):
    # kill-workers cannot reach that memory, and the snapshot says so once.
    from eagle3_console.observe.snapshot import collect
    from eagle3_console.kernel.workspace import Workspace

    ws.write('[stages.noop]\nargv = ["true"]\n')
    fake = FakeNvml(4)
    worker = procs()
    fake.gpus[0].mem_used, fake.gpus[0].compute[worker.pid] = 10 * GiB, 9 * GiB + 2**29   # explained
    fake.gpus[1].mem_used = 91 * GiB                                                      # nothing listed
    missing_pid = 2**22 + 12345                                                           # above pid_max
    fake.gpus[2].mem_used, fake.gpus[2].foreign[missing_pid] = 7 * GiB, 6 * GiB
    fake.gpus[3].mem_used = 600 * 2**20                                                   # a driver's reserve
    snap = collect(Workspace.at(ws.root), nvml=Nvml(module=fake))
    [alert] = [a for a in snap.alerts if a.code == "gpu_memory_unaccounted"]
    assert alert.level == "warning" and snap.exit_code == 1
    assert "GPU 1 91.0 GiB" in alert.message and f"GPU 2 7.0 GiB (pid {missing_pid} not visible here)" \
        in alert.message, alert.message
    assert "GPU 0" not in alert.message and "GPU 3" not in alert.message
    gpu2 = snap.to_dict()["gpus"][2]
    assert gpu2["processes"][0]["visible"] is False and gpu2["processes"][0]["run_id"] is None
    # A GPU that cannot list its processes (NotSupported) proves nothing either way.
    fake.gpus[1].fail["compute processes"] = NVML_ERROR_NOT_SUPPORTED
    again = collect(Workspace.at(ws.root), nvml=Nvml(module=fake))
    [alert] = [a for a in again.alerts if a.code == "gpu_memory_unaccounted"]
    assert "GPU 1" not in alert.message and "GPU 2" in alert.message
    fake.gpus[1].mem_used = fake.gpus[2].mem_used = 0
    fake.gpus[2].foreign.clear()
    assert not [a for a in collect(Workspace.at(ws.root), nvml=Nvml(module=fake)).alerts
                if a.code == "gpu_memory_unaccounted"]
