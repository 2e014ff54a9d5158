"""Whether a stage may start now: no live run of it, no workers its last run
left alive, no processes of an earlier registry's run, and its dependencies
done (a serve dependency: its server ready). check_can_start raises the
Refused that says which; `force` skips only the dependencies.

Data flow: registry (the latest runs) + the process table (monitor.procs) +
the outputs' manifests (vouch) -> (this) -> launch's two checks (launching.py),
`run --dry-run`, watch --advance (serves, dependency_done).
"""

from __future__ import annotations

from pathlib import Path

from eagle3_console.kernel.config import Pipeline, Stage
from eagle3_console.kernel.model import ServeState
from eagle3_console.monitor.procs import ProcessTable, orphans
from eagle3_console.kernel.refused import Refused
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.runs.liveness import leftover_workers, reconcile, stage_alive
from eagle3_console.runs.outputs import output_paths
from eagle3_console.runs.vouch import vanished
from eagle3_console.kernel.slurmparams import SLURM
from eagle3_console.kernel.workspace import Workspace
from ops.common import read_json


def serves(stage: Stage | None) -> bool:
    """Whether the stage is a server (its spec's serves hook): depending on it means "its server is ready"."""
    return stage is not None and stage.spec.serves(stage.spec.effective(stage.params)) is not None


def outputs_complete(ws: Workspace, stage: Stage, run: Run) -> bool:
    """Whether a run whose end was never recorded (lost: its supervisor died, its
    processes went on and have ended) finished its work, judged by its outputs:
    the op's record, written once at its end, by this run (mtime after its
    start), and not saying it is still running or incomplete. A custom stage,
    or an op whose record grows as it goes (train's metrics.jsonl), cannot
    tell: False, and the policies treat the run as failed."""
    spec = stage.spec
    if not spec.result_file or spec.result_file.endswith(".jsonl"):
        return False
    try:
        outs = output_paths(ws, stage, run.params)
    except Refused:
        return False
    if not outs:
        return False
    record = Path(outs[0]) / spec.result_file
    try:
        if record.stat().st_mtime < (run.started or run.created) - 1.0:
            return False
    except OSError:
        return False
    data = read_json(record)
    return data is not None and data.get("status", "complete") == "complete"


def dependency_done(ws: Workspace, stage: Stage, run: Run | None) -> bool:
    """A dependency counts as done when its latest run succeeded, or was lost
    and its processes ended with its outputs complete (outputs_complete)."""
    if run is None:
        return False
    if run.status == RunStatus.SUCCEEDED:
        return True
    return run.status == RunStatus.LOST and not stage_alive(run) and outputs_complete(ws, stage, run)


def check_can_start(reg: Registry, pipe: Pipeline, stage: Stage, force: bool, ws: Workspace | None = None,
                    strays: bool = True, serve_states: dict[int, ServeState] | None = None) -> None:
    """`serve_states`: serve dependencies' states by run id as the caller saw them
    (serve_deps.not_ready probes the ones missing and adds them)."""
    reconcile(reg)
    latest = reg.latest(stage.name)
    if latest and (latest.live or (latest.status == RunStatus.LOST and stage_alive(latest))):
        raise Refused(f"stage {stage.name!r} already has a live run {latest.id} ({latest.status}, pid {latest.pid}); "
                      f"stop it first or use `restart --kill`", kind="live run")
    table = ProcessTable.snapshot() if ws is not None else None
    if latest is not None and table is not None and latest.launcher != SLURM:     # a job's processes: Slurm's
        # Workers that outlived the last run (one in a session of its own survives `stop`)
        # hold its GPU memory and may write its outputs: a run beside them races them,
        # as `restart` says (it refuses them too).
        left = leftover_workers(latest, table)
        if left:
            raise Refused(f"stage {stage.name!r}: worker(s) {left} of run {latest.id} ({latest.status}) are still "
                          f"alive: they hold its GPU memory and may write its outputs; `kill-workers {stage.name}` "
                          f"ends them (or `restart {stage.name} --kill`)", kind="leftover workers")
    if ws is not None and strays:
        strays = orphans(table, str(ws.root), reg.registry_id, reg.run_ids()).get(stage.name)
        if strays:
            raise Refused(f"stage {stage.name!r} still has processes {strays} from a run of an earlier registry "
                          f"(its state database was replaced); they may write its outputs: kill them first "
                          f"(kill {' '.join(map(str, strays))})", kind="strays")
    if force:
        return
    for dep in stage.depends_on:
        dep_run = reg.latest(dep)
        if serves(pipe.stages.get(dep)):
            # A server never succeeds: depending on one means "its server is ready".
            from eagle3_console.runs.serve_deps import not_ready
            problem = not_ready(pipe.stages[dep], dep_run, dep_run is not None and stage_alive(dep_run),
                                {} if serve_states is None else serve_states)
            if problem:
                raise Refused(f"stage {stage.name!r} depends on serve stage {dep!r}, {problem}; a dependency on a "
                              f"serve stage means its server is ready: wait for it (`status` shows its state), "
                              f"or pass --force", kind="dependencies")
            continue
        gone = vanished(ws, reg.registry_id, dep_run.id) \
            if ws is not None and dep_run is not None and dep_run.status == RunStatus.SUCCEEDED else []
        if gone:
            raise Refused(f"stage {stage.name!r} depends on {dep!r}, whose output {', '.join(gone)} (left by its "
                          f"succeeded run {dep_run.id}) is gone: moved or deleted since; put it back, run {dep!r} "
                          f"again, or pass --force", kind="dependencies")
        if ws is not None and dep in pipe.stages and dependency_done(ws, pipe.stages[dep], dep_run):
            continue
        if dep_run is None or dep_run.status != RunStatus.SUCCEEDED:
            state = "never ran" if dep_run is None else f"run {dep_run.id} is {dep_run.status}"
            raise Refused(f"stage {stage.name!r} depends on {dep!r}, which has not succeeded ({state}); "
                          f"run it first or pass --force", kind="dependencies")
