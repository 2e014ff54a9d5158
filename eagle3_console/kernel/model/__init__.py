"""Plain data of a snapshot: what monitors return and the panes/JSON render.

No I/O here. Monitors (eagle3_console/monitor/*) fill these; snapshot.collect()
assembles them into a Snapshot, with what each op says of its record (its line,
view and gauges: observe/records.py); the TUI's panes, `status --json` and the
exporter read them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

# The GPUs' plain data has a module of its own; their names are the model's.
from eagle3_console.kernel.model.gpus import GpuInfo, GpuProcess, GpuReport, HostGpus  # noqa: F401

if TYPE_CHECKING:
    from ops.spec import Gauge, ResultView

SCHEMA_VERSION = 1


class RunStatus(StrEnum):
    """A run's status as the registry stores it (the SQLite value, the JSON
    string: a StrEnum member is that string). A stage's own: StageOnly."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    KILLED = "killed"
    LOST = "lost"


class StageOnly(StrEnum):
    """A stage's status that is no run's: NEVER, no run yet; STALE, its latest run
    succeeded but a stage it depends on has run again since (StageStatus.stale says which)."""

    NEVER = "never"
    STALE = "stale"


class ServeStatus(StrEnum):
    """A serve stage's server (ServeState.state), as monitor/serve.py reads it."""

    LOADING = "loading"
    WARMING_UP = "warming_up"
    READY = "ready"
    UNHEALTHY = "unhealthy"
    STOPPED = "stopped"


# No end recorded yet: its supervisor still watches it (one live run per stage).
ACTIVE = (RunStatus.PENDING, RunStatus.RUNNING)
# No end recorded, and lost: the supervisor is gone but the run's processes
# may live on (stop, the TUI's quit warning and a launch's refusal mean these).
MAY_BE_ALIVE = (*ACTIVE, RunStatus.LOST)
# An end the supervisor saw and recorded (the exit record's statuses).
EXITED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.KILLED)

# Alert levels map onto the monitoring exit codes (README: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN).
OK, WARNING, CRITICAL, UNKNOWN = "ok", "warning", "critical", "unknown"
LEVEL_EXIT = {OK: 0, WARNING: 1, CRITICAL: 2, UNKNOWN: 3}
LEVEL_RANK = {OK: 0, WARNING: 1, UNKNOWN: 2, CRITICAL: 3}


@dataclass
class Alert:
    level: str            # warning | critical | unknown
    code: str             # short machine name: oom, nccl, traceback, disk_short, stage_failed, gpu_lost, lost, ...
    message: str
    stage: str | None = None
    line: str | None = None   # the log line that triggered it, when one did


@dataclass
class ShardCount:
    name: str                       # e.g. rows_0-2000, or "." for a flat layout
    done: int
    expected: int | None = None     # rows in this shard when known


@dataclass
class ShardProgress:
    root: str
    layout: str                     # eagle3 | specforge | speculators_pt | speculators_hs | none
    samples_done: int = 0
    samples_expected: int | None = None
    tokens_done: int | None = None
    tokens_expected: int | None = None
    shards: list[ShardCount] = field(default_factory=list)
    tmp_files: int = 0
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    complete: bool = False          # data_config.json says complete
    bad_files: int = 0              # sample files whose safetensors header is unreadable
    error: str | None = None        # data_config.json / sample_lengths.json unreadable, and why
    format: str | None = None       # how the states are stored (data_config's format; ours without one: bf16)
    bytes_per_token: float | None = None    # the output's bytes / tokens done


@dataclass
class DiskUsage:
    stage: str
    path: str
    written_bytes: int = 0
    files: int = 0
    estimate_bytes: int | None = None
    projected_bytes: int | None = None   # written / fraction done
    free_bytes: int | None = None
    total_bytes: int | None = None
    fits: bool | None = None             # projected remainder fits in free space
    # How estimate_bytes was made (eagle3_console/runs/plan.py): exact | metadata | upper_bound |
    # declared | estimate, and its factors in words; final_kind: the figure `fits` judged
    # (measured: the projection from the files written so far).
    estimate_kind: str | None = None
    estimate_basis: str | None = None
    final_kind: str | None = None
    estimate_label: str | None = None    # estimate_kind in words (ops/estimate.py's); the panes', not the JSON's


@dataclass
class LogFinding:
    kind: str       # progress | loading | oom | nccl | traceback | errors | killed | ready | server_died
    line: str       # the line it matched
    at_offset: int = 0


@dataclass
class LogState:
    path: str
    size: int = 0
    progress_done: int | None = None
    progress_total: int | None = None
    rate: float | None = None           # items/s as the program printed it
    rate_unit: str | None = None
    eta_s: float | None = None
    load_pct: float | None = None       # weight loading
    errors: int | None = None           # the last "errors: N" counter
    findings: dict[str, LogFinding] = field(default_factory=dict)   # latest per kind
    tail: list[str] = field(default_factory=list)
    tokens_done: int | None = None      # from our `progress:` summary line
    tokens_per_s: float | None = None   # from our `progress:` summary line
    skipped_bytes: int = 0              # log bytes never parsed (a huge first open, a burst)
    error: str | None = None            # the log exists but cannot be read, and why

    @property
    def oom(self) -> LogFinding | None:
        return self.findings.get("oom")


@dataclass
class JobInfo:
    """A slurm run's job (eagle3_console/runs/slurm/) as its run last recorded it."""
    id: str | None                      # None while the supervisor is still submitting
    state: str | None = None            # Slurm's JobState: PENDING, RUNNING, COMPLETED, TIMEOUT, NODE_FAIL, ...
    reason: str | None = None           # Slurm's Reason (why it waits, why it ended)
    nodes: str | None = None            # NodeList once allocated
    said: str | None = None             # the run's reason: how the console read the job's end
    stop_requested: bool = False        # the console asked for its end (stop, kill-workers)

    def line(self) -> str:
        """The job in a few words: `job 7 PENDING (Resources)`, `job 7 RUNNING on gpu-[01-02]`, `job: not submitted`."""
        if self.id is None:    # NOT_SUBMITTED: slurmparams.JOB_NOT_SUBMITTED, sbatch refused it (the reason says why)
            return f"job: not submitted ({self.reason})" if self.state == "NOT_SUBMITTED" else "job: being submitted"
        return (f"slurm job {self.id} {self.state or 'unknown'}" + (f" on {self.nodes}" if self.nodes else "")
                + (f" ({self.reason})" if self.reason else ""))


@dataclass
class ServeState:
    """A serve stage's SGLang server as eagle3_console/monitor/serve.py last saw it."""
    state: ServeStatus
    url: str
    reason: str = ""                    # why this state (port closed, /ready 503, a timeout, ...)
    load_pct: float | None = None       # weight loading, from the log
    time_to_ready_s: float | None = None    # from the run's start to "fired up" / first ready
    running_reqs: float | None = None
    queued_reqs: float | None = None
    kv_usage: float | None = None       # 0..1: sglang:token_usage
    gen_tok_s: float | None = None      # generation throughput
    accept_length: float | None = None  # speculative: SGLang's average accept length
    speculative: bool = False
    version: str | None = None          # the server's own (from /server_info)
    metrics: bool | None = None         # whether /metrics answered
    readiness: str | None = None        # the endpoint that said ready or not: /ready, /health_generate, /model_info
    sampled_at: float | None = None     # when the figures were read

    def figures(self) -> list[str]:
        """A ready server's live figures, said once for `status` and the Progress pane.
        The accept length is said as what it is: SGLang's own figure over its last log
        interval (/metrics' sglang:spec_accept_length) or since the server started
        (/server_info), not a bench's measurement over its prompts."""
        out = [f"running {self.running_reqs:.0f}, queued {self.queued_reqs or 0:.0f}"] \
            if self.running_reqs is not None else []
        if self.kv_usage is not None:
            out.append(f"KV {100 * self.kv_usage:.0f}%")
        if self.gen_tok_s is not None:
            out.append(f"{self.gen_tok_s:.1f} tok/s")
        if self.accept_length is not None:
            over = "last log interval" if self.metrics else "since the server started"
            out.append(f"SGLang accept length {self.accept_length:.2f} ({over}; bench's AL is per bench run)")
        return out


@dataclass
class Curves:
    """A stage's history for the console's plots (the TUI's collector only; never in
    status --json): train's metrics.jsonl windows, an extraction's tok/s samples."""
    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    acc: list[list[float]] = field(default_factory=list)       # acc[k-1]: TTT step k over the windows
    sim_al: list[float] = field(default_factory=list)
    tok_s: list[float] = field(default_factory=list)           # tokens/s, one a sampling pass while running
    tok_s_times: list[float] = field(default_factory=list)


@dataclass
class StageStatus:
    name: str
    op: str | None
    status: str                     # a RunStatus, or a StageOnly (never, stale)
    run_id: int | None = None
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    progress: float | None = None   # 0..1
    rate: float | None = None       # per second, in rate_unit
    rate_unit: str | None = None    # "samples/s" (shard files), else the log's tqdm unit ("step/s", ...)
    tokens_per_s: float | None = None
    eta_s: float | None = None
    depends_on: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    batch_param: str | None = None
    shards: ShardProgress | None = None
    log: LogState | None = None
    alerts: list[Alert] = field(default_factory=list)
    result: dict[str, Any] | None = None   # the op's own record (bench.json, summary.json, ...)
    result_line: str | None = None         # that record in one line
    result_time: float | None = None       # when the record was written (its mtime)
    # What the op says of its record beside its line (observe/records.py, once a pass): the
    # panes' view and the exporter's gauges; neither in the JSON.
    view: ResultView | None = None
    gauges: list[Gauge] = field(default_factory=list)
    # A lost run (supervisor gone): whether its stage's processes still run, and,
    # once they ended, whether its outputs say it finished (runs.outputs_complete).
    alive: bool = False
    outputs_complete: bool | None = None
    serve: ServeState | None = None        # a serve stage's server state and live figures
    job: JobInfo | None = None             # a slurm run's job
    curves: Curves | None = None           # plots' history (monitor/metrics.py), TUI only
    # Why a succeeded run is `stale`: a dependency succeeded again after it
    # started, so its outputs no longer follow from its inputs.
    stale: str | None = None
    # Output folders the latest (succeeded) run left that are gone since: its
    # dependents would start on nothing, so it no longer counts as done.
    vanished: list[str] = field(default_factory=list)
    # Removed from the pipeline file while its run lives: shown, and stoppable by name, until it ends.
    removed: bool = False

    @property
    def done(self) -> bool:
        """Counts as done for its dependents: succeeded, or lost with complete outputs;
        a serve stage (which never succeeds) once its server is ready."""
        if self.serve is not None and self.serve.state == ServeStatus.READY:
            return True
        if self.vanished:
            return False
        return self.status == RunStatus.SUCCEEDED or (self.status == RunStatus.LOST and bool(self.outputs_complete))

    def result_is_latest_runs(self) -> bool:
        """Whether the latest run wrote the record (it is read from the output
        folder, where an earlier run's may still lie)."""
        return (self.result_time is not None and self.started is not None
                and self.result_time >= self.started - 1.0)

    def result_whose(self) -> str:
        """Whose the record is, as a prefix ("" for the latest, succeeded run's)."""
        if self.status == StageOnly.NEVER:
            return "no run recorded here; found on disk: "
        if not self.result_is_latest_runs():
            return f"an earlier run's result (latest run {self.run_id}: {self.status}): "
        if self.status in MAY_BE_ALIVE:
            return "so far: "
        if self.status == StageOnly.STALE:
            return f"stale ({self.stale}): "
        return "" if self.status == RunStatus.SUCCEEDED else f"run {self.run_id} {self.status}: "

    def result_said(self) -> str | None:
        """result_line as the console says it, with whose it is."""
        return self.result_whose() + self.result_line if self.result_line else None


def oom_finding(st: StageStatus) -> LogFinding | None:
    """The out-of-memory line of the stage's latest run (its log, as the snapshot
    read it), or None: the one test of "this run ran out of memory" (the alert,
    watch's halving, the stages pane); a slurm job ended OUT_OF_MEMORY counts too."""
    if st.job is not None and st.job.state == "OUT_OF_MEMORY":
        return LogFinding("oom", f"slurm: job {st.job.id} OUT_OF_MEMORY ({st.job.said or 'killed by Slurm'})")
    return st.log.oom if st.log is not None else None


@dataclass
class Snapshot:
    workspace: str
    host: str
    time: float
    stages: list[StageStatus] = field(default_factory=list)
    gpus: GpuReport = field(default_factory=lambda: GpuReport(available=False, reason="not sampled"))
    disk: list[DiskUsage] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    hosts: list[HostGpus] = field(default_factory=list)    # the pipeline file's `hosts` (other nodes' exporters)
    schema: int = SCHEMA_VERSION

    @property
    def health(self) -> str:
        worst = OK
        for a in self.alerts:
            if LEVEL_RANK.get(a.level, 0) > LEVEL_RANK[worst]:
                worst = a.level
        return worst

    @property
    def exit_code(self) -> int:
        return LEVEL_EXIT[self.health]

    def stage(self, name: str) -> StageStatus | None:
        return next((s for s in self.stages if s.name == name), None)

    def downstream(self, name: str) -> list[str]:
        """The stages that depend on `name`, directly or through others, in pipeline order."""
        found: set[str] = {name}
        for st in self.stages:          # pipeline order: a dependency comes before its dependents
            if found & set(st.depends_on):
                found.add(st.name)
        return [st.name for st in self.stages if st.name in found and st.name != name]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["health"] = self.health
        for st, sd in zip(self.stages, d["stages"]):
            for key in ("curves", "view", "gauges"):    # the TUI's and the exporter's: no part of the JSON contract
                sd.pop(key, None)
            sd["result_said"] = st.result_said()     # whose the record is (stale, an earlier run's...)
        for dd in d["disk"]:
            dd.pop("estimate_label", None)
        gpus = d.pop("gpus")
        if gpus["available"]:
            d["gpus"] = gpus["gpus"]
            d["gpu_driver"] = gpus["driver"]
        else:
            d["gpus"] = []
            d["gpus_unavailable"] = gpus["reason"]
        return d
