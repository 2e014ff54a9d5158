"""GPUs through NVML (the `pynvml` module of nvidia-ml-py).

Where it sits: snapshot.collect() calls Nvml.sample() once a refresh (once a
second in the TUI) and hands the GpuReport to monitor/procs.attach_owners,
which names the run owning each GPU process; actions.kill-workers calls
Nvml.wait_memory_released() to prove that the memory of the workers it killed
came back. Nothing above this module imports pynvml.

Degrading, not failing: no driver (or no pynvml) gives GpuReport(available=
False, reason=...) with the specific cause; a call failing on one GPU degrades
that field (NotSupported: the field is None and listed in `unsupported`; other
errors: the field is None and `error` says why) or that GPU only (GPU lost:
`lost` and `error`, the other GPUs are still sampled).

Cheap: NVML is initialised once and kept; device handles, names and UUIDs
are read once; a field a GPU does not support is not asked again.
"""

from __future__ import annotations

import importlib
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

from eagle3_console.kernel.model import GpuInfo, GpuProcess, GpuReport

# NVML's "not available" marker for per-process memory (pynvml turns it into
# None, older versions and other wrappers pass the raw value through).
_NOT_AVAILABLE = (1 << 64) - 1

# Newest first: a driver older than the bindings lacks the newer entry points.
_PROC_FUNCS = {
    "compute": ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                "nvmlDeviceGetComputeRunningProcesses"),
    "graphics": ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2",
                 "nvmlDeviceGetGraphicsRunningProcesses"),
}

# Causes of a failed nvmlInit, worded for the operator.
_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "no NVIDIA driver: the NVML library libnvidia-ml.so.1 could not be loaded",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to use NVML (check /dev/nvidia* access)",
    "NVMLError_LibRmVersionMismatch": ("the NVML library and the loaded kernel driver are different versions "
                                       "(driver upgraded without reload: reload the module or reboot)"),
    "NVMLError_Uninitialized": "NVML is not initialised",
}


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used on this machine; str() is the reason."""


@dataclass
class MemoryRelease:
    """What wait_memory_released found at its last poll."""

    held: dict[int, list[tuple[int, int | None]]]   # pid -> [(gpu index, used bytes or None)]
    unreadable: dict[int, str] = field(default_factory=dict)   # gpu index -> why its processes could not be listed
    polls: int = 0

    @property
    def released(self) -> bool:
        """True only when no given pid holds memory on any GPU that could be read,
        and every GPU could be read (a lost GPU proves nothing)."""
        return not self.held and not self.unreadable


class _GpuDown(Exception):
    """This GPU cannot be sampled now: lost (needs a reset), or no handle."""

    def __init__(self, what: str, exc: Exception, lost: bool = True):
        super().__init__(what)
        self.what, self.exc, self.lost = what, exc, lost

    def describe(self) -> str:
        if self.lost:
            return f"GPU is lost ({type(self.exc).__name__} on {self.what}); it needs a reset or a reboot"
        return f"{self.what}: {type(self.exc).__name__}: {self.exc}"


@dataclass
class _Device:
    index: int
    handle: Any = None
    name: str = ""
    uuid: str = ""
    unsupported: set[str] = field(default_factory=set)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """One NVML session, degraded per GPU. Thread-safe; call from one poller."""

    def __init__(self, module: Any = None, retry_s: float | None = 60.0) -> None:
        # `module` is the pynvml module or a stand-in with the same names (tests).
        self._module = module
        self._m: Any = None
        self._lock = threading.RLock()
        self._ready = False
        self._reason: str | None = None
        self._failed_at: float | None = None
        # A failed init is retried after retry_s (a driver reloaded under a
        # long-running console); None: never.
        self._retry_s = retry_s
        self._driver: str | None = None
        self._devices: list[_Device] = []
        self._proc_funcs = {kind: list(names) for kind, names in _PROC_FUNCS.items()}

    # -- lifecycle -------------------------------------------------------

    def init(self) -> bool:
        """Initialise NVML once; True when usable, else `reason` says why."""
        with self._lock:
            if self._ready:
                return True
            if self._failed_at is not None and (
                    self._retry_s is None or time.monotonic() - self._failed_at < self._retry_s):
                return False
            self._reason = self._init()
            self._ready = self._reason is None
            self._failed_at = None if self._ready else time.monotonic()
            return self._ready

    def _init(self) -> str | None:
        if self._m is None:
            try:
                self._m = self._module if self._module is not None else importlib.import_module("pynvml")
            except ImportError as exc:
                return f"pynvml is not importable (install nvidia-ml-py): {exc}"
        m = self._m
        try:
            m.nvmlInit()
        except m.NVMLError as exc:
            name = type(exc).__name__
            return f"{_INIT_REASONS.get(name, 'NVML initialisation failed')} ({name}: {exc})"
        try:
            count = m.nvmlDeviceGetCount()
        except m.NVMLError as exc:
            self._safe_shutdown()
            return f"NVML cannot count the GPUs ({type(exc).__name__}: {exc})"
        if count == 0:
            self._safe_shutdown()
            return "NVML works but reports no GPUs"
        try:
            self._driver = _text(m.nvmlSystemGetDriverVersion())
        except m.NVMLError:
            self._driver = None
        self._devices = [_Device(i) for i in range(count)]
        return None

    def _safe_shutdown(self) -> None:
        try:
            self._m.nvmlShutdown()
        except self._m.NVMLError:
            pass

    def shutdown(self) -> None:
        """Release NVML; a later sample() initialises it again."""
        with self._lock:
            if self._ready:
                self._safe_shutdown()
            self._ready = False
            self._failed_at = None
            self._reason = None
            self._devices = []

    def __enter__(self) -> "Nvml":
        self.init()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def available(self) -> bool:
        return self.init()

    @property
    def reason(self) -> str | None:
        self.init()
        return self._reason

    # -- sampling --------------------------------------------------------

    def sample(self) -> GpuReport:
        """Every GPU's memory, utilisation, temperature, power and processes."""
        with self._lock:
            if not self.init():
                return GpuReport(available=False, reason=self._reason)
            return GpuReport(available=True, driver=self._driver,
                             gpus=[self._sample_gpu(dev) for dev in self._devices])

    def _sample_gpu(self, dev: _Device) -> GpuInfo:
        m = self._m
        info = GpuInfo(index=dev.index, name=dev.name, uuid=dev.uuid)
        errors: list[str] = []
        try:
            self._open(dev)
            info.name, info.uuid = dev.name, dev.uuid
            mem = self._memory(dev, errors)
            if mem is not None:
                info.mem_used, info.mem_total = int(mem.used), int(mem.total)
            util = self._field(dev, "utilization", errors, m.nvmlDeviceGetUtilizationRates, dev.handle)
            if util is not None:
                info.util_pct = int(util.gpu)
            temp = self._field(dev, "temperature", errors, m.nvmlDeviceGetTemperature,
                               dev.handle, m.NVML_TEMPERATURE_GPU)
            if temp is not None:
                info.temp_c = int(temp)
            power_mw = self._field(dev, "power", errors, m.nvmlDeviceGetPowerUsage, dev.handle)
            if power_mw is not None:
                info.power_w = power_mw / 1000.0
            info.processes = self._processes(dev, errors)
        except _GpuDown as down:
            info.lost = down.lost
            dev.handle = None       # ask for a fresh handle next time (after a reset it may work)
            errors.append(down.describe())
        info.unsupported = sorted(dev.unsupported)
        info.error = "; ".join(errors) or None
        return info

    def _open(self, dev: _Device) -> None:
        m = self._m
        if dev.handle is None:
            try:
                dev.handle = m.nvmlDeviceGetHandleByIndex(dev.index)
            except m.NVMLError_GpuIsLost as exc:
                raise _GpuDown("handle", exc) from exc
            except m.NVMLError as exc:     # e.g. NoPermission, Unknown: nothing to sample on it
                raise _GpuDown("handle", exc, lost=False) from exc
        for attr, fn in (("name", m.nvmlDeviceGetName), ("uuid", m.nvmlDeviceGetUUID)):
            if not getattr(dev, attr) and attr not in dev.unsupported:
                value = self._field(dev, attr, [], fn, dev.handle)
                if value is not None:
                    setattr(dev, attr, _text(value))

    def _memory(self, dev: _Device, errors: list[str]) -> Any:
        """Memory in nvidia-smi's terms: nvmlDeviceGetMemoryInfo_v2, whose `used`
        leaves out the driver's reserved memory (on an H200 the v1 call read 616
        MiB more than nvidia-smi beside it: benchmarks/gpu_fleet.py, step 1).
        Drivers or bindings without v2 get the v1 call, asked once."""
        m = self._m
        if getattr(dev, "memory_v1", False) or not hasattr(m, "nvmlMemory_v2"):
            return self._field(dev, "memory", errors, m.nvmlDeviceGetMemoryInfo, dev.handle)
        try:
            return m.nvmlDeviceGetMemoryInfo(dev.handle, version=m.nvmlMemory_v2)
        except m.NVMLError_GpuIsLost as exc:
            raise _GpuDown("memory", exc) from exc
        except (m.NVMLError, TypeError):
            dev.memory_v1 = True    # FunctionNotFound (an older driver) and the like: v1 from now on
            return self._field(dev, "memory", errors, m.nvmlDeviceGetMemoryInfo, dev.handle)

    def _field(self, dev: _Device, what: str, errors: list[str], fn: Any, *args: Any) -> Any:
        m = self._m
        if what in dev.unsupported:
            return None
        try:
            return fn(*args)
        except m.NVMLError_GpuIsLost as exc:
            raise _GpuDown(what, exc) from exc
        except m.NVMLError_NotSupported:
            dev.unsupported.add(what)   # a property of the board: do not ask again
            return None
        except m.NVMLError as exc:
            errors.append(f"{what}: {type(exc).__name__}: {exc}")
            return None

    def _processes(self, dev: _Device, errors: list[str]) -> list[GpuProcess]:
        by_pid: dict[int, GpuProcess] = {}
        for kind in ("compute", "graphics"):
            for p in self._list(dev, kind, errors):
                used = getattr(p, "usedGpuMemory", None)
                used = None if used is None or used >= _NOT_AVAILABLE else int(used)
                pid = int(p.pid)
                seen = by_pid.get(pid)
                if seen is None:
                    by_pid[pid] = GpuProcess(pid=pid, used_bytes=used, type=kind)
                else:
                    seen.type = "compute+graphics"
                    if used is not None and (seen.used_bytes is None or used > seen.used_bytes):
                        seen.used_bytes = used
        return sorted(by_pid.values(), key=lambda gp: gp.pid)

    def _list(self, dev: _Device, kind: str, errors: list[str]) -> list[Any]:
        m = self._m
        what = f"{kind} processes"
        if what in dev.unsupported:
            return []
        mismatch = getattr(m, "NVMLLibraryMismatchError", None)
        missing = (m.NVMLError_FunctionNotFound,) + ((mismatch,) if mismatch else ())
        names = self._proc_funcs[kind]
        while names:
            fn = getattr(m, names[0], None)
            if fn is None:
                names.pop(0)
                continue
            try:
                return list(fn(dev.handle))
            except missing:
                names.pop(0)     # the driver lacks this version: use the next, for every GPU
            except m.NVMLError_GpuIsLost as exc:
                raise _GpuDown(what, exc) from exc
            except m.NVMLError_NotSupported:
                dev.unsupported.add(what)
                return []
            except m.NVMLError as exc:
                errors.append(f"{what}: {type(exc).__name__}: {exc}")
                return []
        errors.append(f"{what}: this NVML has no function to list them")
        return []

    # -- memory held by given pids (kill-workers' proof) -----------------

    def holders(self) -> tuple[dict[int, list[tuple[int, int | None]]], dict[int, str]]:
        """pid -> [(gpu index, used bytes)] over all GPUs, and the GPUs that
        could not be listed (index -> why). Raises NvmlUnavailable."""
        with self._lock:
            if not self.init():
                raise NvmlUnavailable(self._reason)
            held: dict[int, list[tuple[int, int | None]]] = {}
            unreadable: dict[int, str] = {}
            for dev in self._devices:
                errors: list[str] = []
                try:
                    self._open(dev)
                    procs = self._processes(dev, errors)
                except _GpuDown as down:
                    dev.handle = None
                    unreadable[dev.index] = down.describe()
                    continue
                if errors:
                    unreadable[dev.index] = "; ".join(errors)
                for gp in procs:
                    held.setdefault(gp.pid, []).append((dev.index, gp.used_bytes))
            return held, unreadable

    def wait_memory_released(self, pids: Iterable[int], timeout_s: float = 30.0,
                             poll_s: float = 0.5) -> MemoryRelease:
        """Poll NVML until none of `pids` holds GPU memory, or until timeout_s.

        The driver frees a process's memory some time after it dies (its
        context is torn down after the last reference), so a kill is only
        proven by NVML no longer listing the pid. Raises NvmlUnavailable when
        there is no NVML to ask."""
        wanted = set(pids)
        deadline = time.monotonic() + timeout_s
        polls = 0
        while True:
            held, unreadable = self.holders()
            polls += 1
            mine = {pid: where for pid, where in held.items() if pid in wanted}
            if (not mine and not unreadable) or time.monotonic() >= deadline:
                return MemoryRelease(held=mine, unreadable=unreadable, polls=polls)
            time.sleep(poll_s)
