"""A stand-in for the `pynvml` module at the NVML boundary (tests only: this
machine has no NVIDIA driver). It has the names eagle3_console/monitor/gpus.py
uses, with pynvml's signatures, return shapes (objects with .used/.total,
.gpu, .pid/.usedGpuMemory) and exception classes (NVMLError and one subclass
per error code, built from the same codes), and it is configurable: any
number of GPUs, a lost GPU, a field a board does not support, an error on one
call, missing versioned entry points, and a failed nvmlInit.

GPU processes are real pids: like the driver, which frees a process's memory
when it exits, the fake lists a process only while that pid runs (not a zombie).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import psutil

# Codes as in nvml.h / pynvml.
NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_UNKNOWN = 999
NVML_TEMPERATURE_GPU = 0

_STRINGS = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: "RM has detected an NVML/RM version mismatch.",
    NVML_ERROR_UNKNOWN: "Unknown Error",
}


class NVMLError(Exception):
    """As in pynvml: NVMLError(code) builds the subclass of that code."""

    _by_code: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._by_code.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _STRINGS.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name: str, code: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda c, *a: NVMLError.__new__(c, code),
                                    "__init__": lambda self, *a: NVMLError.__init__(self, code)})
    NVMLError._by_code[code] = cls
    return cls


NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)
NVMLError_InvalidArgument = _subclass("NVMLError_InvalidArgument", NVML_ERROR_INVALID_ARGUMENT)
NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_NoPermission = _subclass("NVMLError_NoPermission", NVML_ERROR_NO_PERMISSION)
NVMLError_DriverNotLoaded = _subclass("NVMLError_DriverNotLoaded", NVML_ERROR_DRIVER_NOT_LOADED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_FunctionNotFound = _subclass("NVMLError_FunctionNotFound", NVML_ERROR_FUNCTION_NOT_FOUND)
NVMLError_GpuIsLost = _subclass("NVMLError_GpuIsLost", NVML_ERROR_GPU_IS_LOST)
NVMLError_LibRmVersionMismatch = _subclass("NVMLError_LibRmVersionMismatch", NVML_ERROR_LIB_RM_VERSION_MISMATCH)
NVMLError_Unknown = _subclass("NVMLError_Unknown", NVML_ERROR_UNKNOWN)

GiB = 1 << 30


@dataclass
class FakeGpu:
    name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
    mem_total: int = 95 * GiB + 994 * (1 << 20)     # 97,887 MiB: 94.97 GiB as torch prints it
    mem_used: int = 0
    mem_reserved: int = 0                   # the driver's; v1's `used` counts it, v2's (nvidia-smi's) does not
    no_v2: bool = False                     # a driver without nvmlDeviceGetMemoryInfo_v2
    util: int = 0
    temp: int = 35
    power_mw: int = 75_000
    uuid: str = ""
    # Real pids and the bytes NVML reports for them (None: not available).
    compute: dict[int, int | None] = field(default_factory=dict)
    graphics: dict[int, int | None] = field(default_factory=dict)
    lost: bool = False                      # every call on this GPU raises GpuIsLost
    # Like a driver tearing a dead process's context down: a pid that has
    # exited is still listed by this many more listings of this GPU.
    linger: int = 0
    # Pids of another pid namespace (the host's, seen from a container): listed
    # whatever this machine has under that number.
    foreign: dict[int, int | None] = field(default_factory=dict)
    _dead_seen: dict[tuple[str, int], int] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)   # field -> NVML error code


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class FakeNvml:
    """An object to pass where the pynvml module goes: Nvml(module=FakeNvml(...))."""

    # Exception classes and constants reachable as module attributes.
    NVMLError = NVMLError
    NVMLError_Uninitialized = NVMLError_Uninitialized
    NVMLError_NotSupported = NVMLError_NotSupported
    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_LibRmVersionMismatch = NVMLError_LibRmVersionMismatch
    NVMLError_Unknown = NVMLError_Unknown
    NVML_TEMPERATURE_GPU = NVML_TEMPERATURE_GPU

    def __init__(self, gpus: int | list[FakeGpu] = 8, init_error: int | None = None,
                 missing: tuple[str, ...] = (), driver: str = "580.95.05") -> None:
        self.gpus = [FakeGpu() for _ in range(gpus)] if isinstance(gpus, int) else list(gpus)
        for i, g in enumerate(self.gpus):
            g.uuid = g.uuid or f"GPU-{i:08x}-fake-{i:04d}"
        self.init_error = init_error
        self.missing = set(missing)         # entry points this "driver" lacks
        self.driver = driver
        self.calls: Counter[str] = Counter()
        self.initialized = 0

    # -- helpers ---------------------------------------------------------

    def _enter(self, fn: str, handle: int | None = None, what: str | None = None) -> FakeGpu | None:
        self.calls[fn] += 1
        if fn in self.missing:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if fn not in ("nvmlInit", "nvmlShutdown") and self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return None
        gpu = self.gpus[handle]
        if gpu.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if what in gpu.fail:
            raise NVMLError(gpu.fail[what])
        return gpu

    # -- the pynvml API used by monitor/gpus.py --------------------------

    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        if self.initialized <= 0:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._enter("nvmlDeviceGetHandleByIndex", index, "handle")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._enter("nvmlDeviceGetName", handle, "name").name

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self._enter("nvmlDeviceGetUUID", handle, "uuid").uuid

    # pynvml: nvmlDeviceGetMemoryInfo(handle, version=None); with version=nvmlMemory_v2
    # it calls nvmlDeviceGetMemoryInfo_v2, whose `used` excludes `reserved`.
    nvmlMemory_v2 = 0x02000028

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int | None = None) -> SimpleNamespace:
        g = self._enter("nvmlDeviceGetMemoryInfo", handle, "memory")
        reserved = getattr(g, "mem_reserved", 0)
        if version:
            if getattr(g, "no_v2", False):
                raise self.NVMLError_FunctionNotFound("nvmlDeviceGetMemoryInfo_v2")
            return SimpleNamespace(total=g.mem_total, used=g.mem_used, reserved=reserved,
                                   free=g.mem_total - g.mem_used - reserved, version=version)
        return SimpleNamespace(total=g.mem_total, used=g.mem_used + reserved, free=g.mem_total - g.mem_used - reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        g = self._enter("nvmlDeviceGetUtilizationRates", handle, "utilization")
        return SimpleNamespace(gpu=g.util, memory=g.util // 2)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        g = self._enter("nvmlDeviceGetTemperature", handle, "temperature")
        if sensor != NVML_TEMPERATURE_GPU:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return g.temp

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return self._enter("nvmlDeviceGetPowerUsage", handle, "power").power_mw

    def _procs(self, fn: str, handle: int, kind: str) -> list[SimpleNamespace]:
        g = self._enter(fn, handle, f"{kind} processes")
        table = g.compute if kind == "compute" else g.graphics
        listed = []
        for pid, used in table.items():
            if not _alive(pid):
                seen = g._dead_seen[(kind, pid)] = g._dead_seen.get((kind, pid), 0) + 1
                if seen > g.linger:
                    continue
            listed.append(SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                          computeInstanceId=0xFFFFFFFF))
        if kind == "compute":
            listed += [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                       computeInstanceId=0xFFFFFFFF) for pid, used in g.foreign.items()]
        return listed

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: int) -> list[SimpleNamespace]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v3", handle, "compute")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses_v2", handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: int) -> list[SimpleNamespace]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v3", handle, "graphics")

    def nvmlDeviceGetGraphicsRunningProcesses_v2(self, handle: int) -> list[SimpleNamespace]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses_v2", handle, "graphics")
