"""The GPUs of a snapshot: what the NVML sampler (monitor/gpus.py) returns, and
another node's as its exporter said them (monitor/hosts.py). Plain data, no I/O."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GpuProcess:
    pid: int
    used_bytes: int | None          # None when NVML does not report it
    name: str = ""
    run_id: int | None = None       # the run that owns this process, if any
    stage: str | None = None
    how: str | None = None          # how it was tied: leader, tree, pgid, session, env
    type: str = "compute"           # compute | graphics | compute+graphics (NVML's lists)
    create_time: float | None = None   # psutil's, when the pid is visible here: trust pid only with it
    visible: bool = True            # False: no such pid here (another pid namespace, or exiting)


@dataclass
class GpuInfo:
    index: int
    name: str = ""
    uuid: str = ""
    mem_used: int | None = None
    mem_total: int | None = None
    util_pct: int | None = None
    temp_c: int | None = None
    power_w: float | None = None
    processes: list[GpuProcess] = field(default_factory=list)
    error: str | None = None        # this GPU degraded (lost, NotSupported...) and why
    lost: bool = False              # NVML says the GPU is lost (fell off the bus): critical
    unsupported: list[str] = field(default_factory=list)   # fields this GPU does not report (NotSupported)


@dataclass
class GpuReport:
    available: bool
    reason: str | None = None       # why NVML is unavailable
    driver: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)


@dataclass
class HostGpus:
    """Another node's GPUs, as its exporter's /snapshot.json said them (hosts.py)."""
    url: str
    state: str                          # ok | unreachable | no_answer | bad_answer
    host: str | None = None             # the node's own name (its snapshot's host)
    reason: str | None = None           # why not ok; or why its NVML is unavailable
    gpus: list[GpuInfo] = field(default_factory=list)
    time: float | None = None           # when its exporter took the snapshot

    def lines(self) -> list[str]:
        """The host in lines: a head line, then one a GPU with the runs on it."""
        from ops.units import human_bytes
        name = f"{self.host} ({self.url})" if self.host else self.url
        if self.state != "ok":
            return [f"{name}: {self.state.replace('_', ' ')}: {self.reason}"]
        if not self.gpus:
            return [f"{name}: no GPUs ({self.reason or 'none reported'})"]
        used = sum(g.mem_used or 0 for g in self.gpus)
        total = sum(g.mem_total or 0 for g in self.gpus)
        out = [f"{name}: {len(self.gpus)} GPU(s), {human_bytes(used)} / {human_bytes(total)}"]
        for g in self.gpus:
            runs = ", ".join(f"{p.stage} run {p.run_id}" for p in g.processes if p.stage) or "-"
            util = "-" if g.util_pct is None else f"{g.util_pct}%"
            out.append(f"  GPU {g.index} {g.name}: {human_bytes(g.mem_used)} / {human_bytes(g.mem_total)}, "
                       f"util {util}, runs: {runs}" + (f" [{g.error}]" if g.error else ""))
        return out
