"""collect(workspace) -> Snapshot: the one truth that the TUI and `status --json` show.

Data flow: config + registry (runs) -> monitors (gpus, procs, shards, disk,
logs) -> alerts -> Snapshot. A Collector keeps its monitors between passes so
that a refresh is incremental (no re-walk of a terabyte, no re-read of a
gigabyte of log); with persist=True it saves their state under .eagle3/cache/
(savedmonitors.py) so that one-shot `status` processes continue where the
previous one stopped.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from eagle3_console.observe import alerts
from eagle3_console.kernel import config as cfg
from eagle3_console.runs import plan
from eagle3_console import runs as runs_mod
from eagle3_console.runs.liveness import as_recorded
from eagle3_console.runs.serve_deps import serve_monitor
from eagle3_console.kernel.model import DiskUsage, GpuReport, JobInfo, Snapshot, StageOnly, StageStatus
from eagle3_console.monitor.disk import DiskMonitor
from eagle3_console.monitor.logs import LogFollower
from eagle3_console.monitor.procs import ProcessTable, RunRef, attach_owners, orphans, process_alive
from eagle3_console.monitor.shards import ShardMonitor
from eagle3_console.monitor.shards import fraction as shard_fraction
from eagle3_console.observe.runprogress import disk_fraction, from_log, run_own_since
from eagle3_console.kernel.registry import ACTIVE, Registry, Run, RunStatus, id_path
from eagle3_console.observe.records import RecordReader
from eagle3_console.observe.savedmonitors import SavedMonitors
from eagle3_console.runs.vouch import vanished
from eagle3_console.kernel.workspace import Workspace

class Collector:
    def __init__(self, ws: Workspace, nvml: Any = None, persist: bool = False, gpus: bool = True,
                 curves: bool | None = None):
        self.ws = ws
        # Curves' history (the TUI's plots) by default where a collector lives on
        # (persist=False); one-shot `status`/`watch` processes (persist=True) skip it.
        self._curves = None
        if (not persist) if curves is None else curves:
            from eagle3_console.monitor.metrics import CurveTracker
            self._curves = CurveTracker()
        self.persist = persist
        self._registry_id = ""         # the registry of the last pass (where the runs' records are)
        self._nvml = nvml
        self._want_gpus = gpus
        self._shards: dict[tuple[str, str], ShardMonitor] = {}
        self._disks: dict[tuple[str, str], DiskMonitor] = {}
        self._logs: dict[int, LogFollower] = {}
        self._serves: dict[int, Any] = {}     # a serve run's ServeMonitor, by run id
        self._leftovers: tuple[float, tuple, dict[str, list[tuple[int, float]]]] = (0.0, (), {})
        self._table: ProcessTable | None = None       # this pass's process table, when one was needed
        self._records = RecordReader()    # each stage's record and what its op says of it
        self._saved = SavedMonitors(ws.cache_dir) if persist else None
        self._guarded: list | None = None      # Workspace.guarded(), taken once a pass

    # -------------------------------------------------------------- monitors
    def _shard_monitor(self, stage: str, root: str, expected: int | None, tokens: int | None,
                       sample_glob: str | None = None, now: float | None = None) -> ShardMonitor:
        key = (stage, root)
        mon = self._shards.get(key)
        if mon is None:
            if self._saved is not None:
                mon = self._saved.shard_monitor(stage, root, expected, tokens, sample_glob, now)
            mon = mon or ShardMonitor(root, expected_samples=expected, expected_tokens=tokens,
                                      sample_glob=sample_glob)
            self._shards[key] = mon
        mon.use_glob(sample_glob)
        mon.expected_samples = expected if expected is not None else mon.expected_samples
        mon.expected_tokens = tokens if tokens is not None else mon.expected_tokens
        return mon

    def _log_follower(self, run: Run) -> LogFollower:
        f = self._logs.get(run.id)
        if f is None:
            f = self._saved.log_follower(run.id) if self._saved is not None else None
            f = f or LogFollower(run.log_path)
            self._logs[run.id] = f
        return f

    def _serve_monitor(self, run: Run, spec: Any, params: dict[str, Any]) -> Any:
        mon = self._serves.get(run.id)
        if mon is None:
            mon = self._serves[run.id] = serve_monitor(spec, params, run)
        return mon

    def _nvml_instance(self) -> Any:
        if self._nvml is None:
            from eagle3_console.monitor.gpus import Nvml
            self._nvml = Nvml()
        return self._nvml

    def close(self) -> None:
        if self._nvml is not None and hasattr(self._nvml, "shutdown"):
            self._nvml.shutdown()

    # -------------------------------------------------------------- collect
    def collect(self, pipe: cfg.Pipeline | None = None) -> Snapshot:
        """The snapshot; `pipe`: the pipeline file as the caller's pass already read it."""
        self._table = None
        now = time.time()
        snap = Snapshot(workspace=str(self.ws.root), host=os.uname().nodename, time=now)
        pipe = pipe or cfg.load(self.ws.config_path)
        latest: dict[str, Run | None] = {}
        succeeded: dict[str, Run] = {}
        refs: list[RunRef] = []
        strays: dict[str, list[int]] = {}
        removed: dict[str, Run] = {}     # live runs of stages no longer in the pipeline file
        # A registry once created is always opened (it raises StateError when its
        # database vanished or was replaced); a workspace where none ever ran has none.
        if self.ws.db_path.exists() or id_path(self.ws.db_path).exists():
            with Registry(self.ws.db_path) as reg:
                runs_mod.reconcile(reg)
                for name in pipe.order():
                    latest[name] = as_recorded(reg.latest(name))
                    ok = latest_success(reg, latest[name])
                    if ok is not None:
                        succeeded[name] = ok
                recent = reg.runs(limit=50)
                self._registry_id = reg.registry_id
                for r in reg.live_runs() + [r for r in recent if r.status == RunStatus.LOST]:
                    if r.stage not in pipe.stages and (r.live or runs_mod.stage_alive(r)):
                        removed[r.stage] = r
                if reg.has_predecessor:
                    # Only in a registry started over an earlier one's logs: a walk a pass.
                    strays = orphans(self._process_table(), str(self.ws.root), reg.registry_id, reg.run_ids())
            refs = [RunRef.from_run(r) for r in recent if r.pid is not None]
        elif self.ws.logs_dir.is_dir() and any(self.ws.logs_dir.glob("*.log")):
            # No registry, but stages ran here: any of their processes alive is an orphan.
            strays = orphans(self._process_table(), str(self.ws.root), "")
        live_logs: set[int] = set()
        self._guarded = self.ws.guarded()       # once a pass, not once an output (two realpaths each)
        for name in pipe.order():
            stage = pipe.stages[name]
            st, disks = self._stage_status(pipe, stage, latest.get(name), now)
            if st.run_id is not None:
                live_logs.add(st.run_id)
            snap.stages.append(st)
            snap.disk.extend(disks)
        for run in removed.values():
            snap.stages.append(StageStatus(name=run.stage, op=None, status=run.status, run_id=run.id, pid=run.pid,
                                           started=run.started, params=dict(run.params), removed=True,
                                           alive=run.status == RunStatus.LOST, log=self._log_follower(run).refresh()))
            live_logs.add(run.id)
        for rid in list(self._logs):
            if rid not in live_logs:
                del self._logs[rid]
        for rid in list(self._serves):
            if rid not in live_logs:
                del self._serves[rid]
        mark_stale(snap.stages, succeeded)
        # Before the GPU owners: when this check walks the whole table, the
        # owners reuse that walk instead of reading a partial table as well.
        leftovers = self._leftover_workers(latest)
        snap.gpus = self._sample_gpus(refs)
        if pipe.hosts and self._want_gpus:
            from eagle3_console.monitor import hosts
            snap.hosts = hosts.read(pipe.hosts)
        snap.alerts = alerts.derive(snap)
        for name, pids in strays.items():
            alert = alerts.orphan_workers(name, pids)
            snap.alerts.append(alert)
            st = snap.stage(name)
            if st is not None:
                st.alerts.append(alert)
        for name, pids in leftovers.items():
            alert = alerts.leftover_workers(name, latest[name], pids)
            snap.alerts.append(alert)
            st = snap.stage(name)
            if st is not None:
                st.alerts.append(alert)
        if self._saved is not None:
            self._saved.save(self._shards, self._logs)
        return snap

    def _leftover_workers(self, latest: dict[str, Run | None]) -> dict[str, list[int]]:
        """Processes still alive from a stage whose latest run failed or was
        killed (workers that outlived their parent hold GPU memory and files).
        Walking the process table costs milliseconds: at most every
        LEFTOVER_CHECK_S, and only while such a run is the latest."""
        # Workers still tearing down right after the end are not leftovers yet.
        settled = time.time() - LEFTOVER_GRACE_S
        ended = {n: r for n, r in latest.items() if r is not None and r.status in (RunStatus.FAILED, RunStatus.KILLED)
                 and r.pid is not None and (r.ended or 0) <= settled}
        if not ended:
            return {}
        key = tuple(sorted((n, r.id) for n, r in ended.items()))
        at, last_key, cached = self._leftovers
        if last_key == key and time.monotonic() - at < LEFTOVER_CHECK_S:
            # Between walks, drop the ones that have exited (a kill shows at once).
            cached = {n: [p for p in procs if process_alive(*p)] for n, procs in cached.items()}
        else:
            owners = self._process_table().owners(tuple(RunRef.from_run(r) for r in ended.values()))
            cached = {}
            for pid, info in sorted(owners.items()):
                if info.stage in ended:
                    cached.setdefault(info.stage, []).append((pid, info.create_time))
            at = time.monotonic()
        self._leftovers = (at, key, cached)
        return {n: [pid for pid, _ct in procs] for n, procs in cached.items() if procs}

    def _process_table(self) -> ProcessTable:
        """One walk of the whole process table a pass, shared by orphans() and
        the leftover-workers check, which need every process, and by the GPU
        owners when it was walked already (collect() resets it)."""
        if self._table is None:
            self._table = ProcessTable.snapshot()
        return self._table

    def _sample_gpus(self, refs: list[RunRef]) -> GpuReport:
        if not self._want_gpus:
            return GpuReport(available=False, reason="GPU sampling disabled (--no-gpus)")
        report = self._nvml_instance().sample()
        if report.available and any(g.processes for g in report.gpus):
            # No walk yet this pass: the GPU pids' rows alone give the same owners
            # (ProcessTable.partial), 22 ms less on a GPU host.
            attach_owners(report, refs, self._table)
        return report

    def _stage_status(self, pipe: cfg.Pipeline, stage: cfg.Stage, run: Run | None,
                      now: float) -> tuple[StageStatus, list[DiskUsage]]:
        params = dict(run.params) if run else dict(stage.params)
        # What the run gets (its op's defaults under its own): JSON, the TUI and
        # watch's halve-after-OOM see the token_budget a stage left at its default.
        params = stage.spec.effective(params)
        st = StageStatus(name=stage.name, op=stage.op, status=run.status if run else StageOnly.NEVER,
                         depends_on=list(stage.depends_on), params=params, batch_param=stage.batch_param)
        try:
            outs = runs_mod.output_paths(self.ws, stage, params, self._guarded)
        except runs_mod.Refused:
            outs = []       # a recorded run's output that is no output (refused at launch since)
        st.outputs = outs
        still_running = False
        if run:
            st.run_id, st.pid, st.started, st.ended = run.id, run.pid, run.started, run.ended
            st.exit_code, st.signal = run.exit_code, run.signal
            if run.status == RunStatus.SUCCEEDED:
                st.vanished = vanished(self.ws, self._registry_id, run.id)
            if run.launcher == "slurm":
                st.job = JobInfo(run.job_id, run.job_state, run.job_reason, run.job_nodes, run.reason,
                                 bool(run.stop_requested))
            still_running = run.status in ACTIVE or (
                run.status == RunStatus.LOST and runs_mod.stage_alive(run))
            if run.status == RunStatus.LOST:
                st.alive = still_running
                st.outputs_complete = None if still_running else runs_mod.outputs_complete(self.ws, stage, run)
            st.log = self._log_follower(run).refresh()
        spec = stage.spec
        ctx = plan.context(self.ws, pipe, params)
        expected = stage.expected_samples
        if expected is None:
            expected = spec.expected_samples(ctx)
        est = plan.disk_estimate(self.ws, pipe, stage, params)
        estimate = None if est is None else est.bytes
        disks: list[DiskUsage] = []
        uses_shards = spec.shard_progress(expected)
        fraction: float | None = None
        if outs and uses_shards and (run or Path(outs[0]).exists()):
            tokens = spec.expected_tokens(ctx)
            mon = self._shard_monitor(stage.name, outs[0], expected, tokens, stage.sample_glob, now)
            mon.since_ns = run_own_since(spec, run)
            mon.run_started = run.started if run is not None else None
            sp = mon.refresh(now=now)
            # A custom stage whose files match neither its pattern nor a known
            # layout counts nothing: its log says how far it is (0/40 next to
            # the log's 21/40 was a count that disagreed).
            if spec.output_is_progress or sp.samples_done:
                st.shards = sp
                # In tokens once they are known (extract takes samples longest first): the
                # disk projection below and its disk_short alert follow the same fraction.
                fraction = shard_fraction(sp)
                st.rate, st.tokens_per_s, st.eta_s = sp.samples_per_s, sp.tokens_per_s, sp.eta_s
                st.rate_unit = "samples/s"
            disk_mon = self._disks.get((stage.name, outs[0]))
            if disk_mon is None or disk_mon.index is not mon.index:
                disk_mon = DiskMonitor(stage.name, outs[0], estimate, index=mon.index)
                self._disks[(stage.name, outs[0])] = disk_mon
            disk_mon.estimate_bytes = estimate
            disks.append(disk_mon.refresh(fraction_done=disk_fraction(fraction, mon), refresh_index=False))
        elif outs and run:
            for out in outs:
                disk_mon = self._disks.get((stage.name, out))
                if disk_mon is None:
                    disk_mon = DiskMonitor(stage.name, out, estimate if out == outs[0] else None)
                    self._disks[(stage.name, out)] = disk_mon
                disks.append(disk_mon.refresh())
        elif outs and est is not None:      # nothing written yet: the figure is known before the run
            disks.append(plan.unwritten_usage(stage.name, outs[0], estimate))
        plan.label_usages(disks, est)
        fraction = from_log(st, fraction, run.started if run else None, still_running, now)
        if st.status == RunStatus.SUCCEEDED and not (st.shards and st.shards.samples_expected):
            # Done is all; but a count shown says how much, and the percentage is that count's.
            fraction = 1.0
        if not still_running:
            # The last window of an ended run (or of a lost one whose processes are
            # gone) is no rate now, and nothing is coming.
            st.rate = st.tokens_per_s = st.rate_unit = st.eta_s = None
        st.progress = fraction
        if run and spec.serves(params) is not None:
            st.serve = self._serve_monitor(run, spec, params).sample(st.log, still_running, now)
        record = None
        if spec.result_file and outs:
            record = self._records.read(spec, Path(outs[0]) / spec.result_file)
        elif spec.result_path_param and params.get(spec.result_path_param):
            record = self._records.read(spec, self.ws.resolve(str(params[spec.result_path_param])))
        if record is not None:
            st.result, st.result_line, st.result_time = record.data, record.line, record.time
            st.view, st.gauges = record.view, record.gauges
        if self._curves is not None:
            st.curves = self._curves.curves(st, now, spec.curves)
        return st, disks


LEFTOVER_CHECK_S = 5.0
LEFTOVER_GRACE_S = 10.0

def latest_success(reg: Registry, latest: Run | None) -> Run | None:
    """The stage's latest succeeded run (its latest run, most often)."""
    if latest is None or latest.status == RunStatus.SUCCEEDED:
        return latest
    return next((r for r in reg.runs(latest.stage, limit=200) if r.status == RunStatus.SUCCEEDED), None)


def mark_stale(stages: list[StageStatus], succeeded: dict[str, Run]) -> None:
    """A succeeded stage whose run started before a dependency's latest
    success, or whose dependency is itself stale, becomes `stale`. `stages`
    is in pipeline order (dependencies first), so staleness flows downstream
    in one pass."""
    by_name = {st.name: st for st in stages}
    for st in stages:
        if st.status != RunStatus.SUCCEEDED or st.started is None:
            continue
        for dep in st.depends_on:
            dep_ok = succeeded.get(dep)
            if dep_ok is not None and dep_ok.ended is not None and dep_ok.ended > st.started:
                st.stale = f"{dep} succeeded again (run {dep_ok.id}) after run {st.run_id} started"
            elif dep in by_name and by_name[dep].status == StageOnly.STALE:
                st.stale = f"{dep} is stale"
            if st.stale:
                st.status = StageOnly.STALE
                break


def collect(ws: Workspace, nvml: Any = None, persist: bool = False) -> Snapshot:
    c = Collector(ws, nvml=nvml, persist=persist)
    try:
        return c.collect()
    finally:
        c.close()
