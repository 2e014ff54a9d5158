"""Runs: launch a stage through the supervisor, stop it, and reconcile liveness.

Data flow: config.Pipeline + registry -> (this) -> supervise.py (detached)
-> stage process group. snapshot.collect calls reconcile() so that a run whose
supervisor vanished shows as `lost`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_console.config import Pipeline, Stage
from eagle3_console.monitor.disk import free_space
from eagle3_console.monitor.procs import process_alive
from eagle3_console.registry import Registry, Run
from eagle3_console.units import gib
from eagle3_console.workspace import Workspace
from ops.spec import EstimateContext

PENDING_GRACE_S = 30.0


class Refused(Exception):
    """An action that was not taken, with the reason; `code` is the exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


@dataclass
class Preflight:
    estimate_bytes: int | None
    free_bytes: int | None
    path: str | None

    @property
    def fits(self) -> bool:
        return self.estimate_bytes is None or self.free_bytes is None or self.estimate_bytes <= self.free_bytes


def stage_params(stage: Stage, overrides: dict[str, Any] | None = None, base: dict | None = None) -> dict[str, Any]:
    params = dict(stage.params if base is None else base)
    params.update(overrides or {})
    if not stage.spec:
        # A custom stage takes the params its pipeline entry declares (their
        # types are its program's business: a default of 3 may well take 1.5).
        unknown = sorted(set(overrides or {}) - set(stage.params))
        if unknown:
            raise Refused(f"stages.{stage.name}: no param(s) {unknown}; it takes {sorted(stage.params)} "
                          f"(declared in its params = {{...}})", code=3)
    else:
        unknown = sorted(set(params) - set(stage.spec.params))
        if unknown:
            raise Refused(f"op {stage.op!r} has no param(s) {unknown}; it takes {sorted(stage.spec.params)}", code=3)
        for key, value in params.items():
            wrong = stage.spec.param_type_error(key, value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3)
    return params


def estimate_context(ws: Workspace, pipe: Pipeline, params: dict[str, Any]) -> EstimateContext:
    return EstimateContext(root=ws.root, params=params, target=pipe.target)


def estimate_bytes(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> int | None:
    if stage.estimate_bytes is not None:
        return stage.estimate_bytes
    if stage.spec:
        return stage.spec.estimate_bytes(estimate_context(ws, pipe, params))
    return None


def output_paths(ws: Workspace, stage: Stage, params: dict[str, Any]) -> list[str]:
    if stage.spec:
        outs = [str(params[p]) for p in stage.spec.output_params if params.get(p)]
    else:
        outs = list(stage.outputs)
    return [str(ws.resolve(o)) for o in outs]


def check_outputs_apart(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> None:
    """The pipeline file's rule (separate output roots) for the outputs a
    `--set` or a restart actually gives: clean and the shard monitor trust
    that a root belongs to one stage."""
    # normpath: `out/x/../keep` is `out/keep` (the paths need not exist yet).
    mine = [Path(os.path.normpath(p)) for p in output_paths(ws, stage, params)]
    for other in pipe.stages.values():
        if other.name == stage.name:
            continue
        for q in output_paths(ws, other, other.params):
            q = Path(os.path.normpath(q))
            for p in mine:
                if p == q or q in p.parents or p in q.parents:
                    raise Refused(f"stages.{stage.name}: output {p} overlaps stage {other.name!r}'s output {q}; "
                                  f"expected separate output roots", code=3)


def preflight(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Preflight:
    est = estimate_bytes(ws, pipe, stage, params)
    outs = output_paths(ws, stage, params)
    if est is None or not outs:
        return Preflight(est, None, outs[0] if outs else None)
    free, _total = free_space(outs[0])
    return Preflight(est, free, outs[0])


def reconcile(reg: Registry) -> list[Run]:
    """Mark runs whose supervisor is gone as lost; returns the ones it changed."""
    changed = []
    now = time.time()
    for run in reg.live_runs():
        if run.supervisor_pid is None:
            if now - run.created > PENDING_GRACE_S:
                if reg.finish(run.id, "lost", reason="supervisor never started"):
                    changed.append(run)
            continue
        if not process_alive(run.supervisor_pid, run.supervisor_create_time):
            # The supervisor may have recorded the exit between our read and now.
            # ended = when the loss was noticed: watch's backoff counts from it.
            if reg.finish(run.id, "lost", ended=now, reason="supervisor gone without recording an exit"):
                reg.record("lost", "supervisor gone", stage=run.stage, run_id=run.id, actor="reconcile")
                changed.append(run)
    return changed


def stage_alive(run: Run) -> bool:
    """Whether the stage's leader process still runs (pid trusted with its create_time)."""
    return run.pid is not None and process_alive(run.pid, run.create_time)


def check_can_start(reg: Registry, pipe: Pipeline, stage: Stage, force: bool) -> None:
    reconcile(reg)
    latest = reg.latest(stage.name)
    if latest and (latest.live or (latest.status == "lost" and stage_alive(latest))):
        raise Refused(f"stage {stage.name!r} already has a live run {latest.id} ({latest.status}, pid {latest.pid}); "
                      f"stop it first or use `restart --kill`")
    if force:
        return
    for dep in stage.depends_on:
        dep_run = reg.latest(dep)
        if dep_run is None or dep_run.status != "succeeded":
            state = "never ran" if dep_run is None else f"run {dep_run.id} is {dep_run.status}"
            raise Refused(f"stage {stage.name!r} depends on {dep!r}, which has not succeeded ({state}); "
                          f"run it first or pass --force")


def launch(ws: Workspace, pipe: Pipeline, stage_name: str, overrides: dict[str, Any] | None = None,
           force: bool = False, restart_of: int | None = None, reason: str | None = None,
           base_params: dict[str, Any] | None = None) -> Run:
    stage = pipe.stage(stage_name)
    params = stage_params(stage, overrides, base_params)
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        check_can_start(reg, pipe, stage, force)
        check_outputs_apart(ws, pipe, stage, params)
        pf = preflight(ws, pipe, stage, params)
        if not pf.fits and not force:
            reg.record("run", "refused: disk", stage=stage.name,
                       detail=f"estimate {pf.estimate_bytes} > free {pf.free_bytes} at {pf.path}")
            raise Refused(f"stage {stage.name!r} needs about {gib(pf.estimate_bytes)} but only "
                          f"{gib(pf.free_bytes)} is free at {pf.path}; free space or pass --force")
        try:
            argv = stage.command(params, pipe.target)
        except (KeyError, ValueError) as exc:
            raise Refused(str(exc.args[0]), code=3) from None
        run = reg.create_run(stage.name, argv, params, stage.environment(), str(ws.root),
                             lambda rid: ws.log_path(rid, stage.name), restart_of=restart_of, reason=reason)
        # The launcher returns as soon as the supervisor has daemonized.
        subprocess.run([sys.executable, "-m", "eagle3_console.supervise", str(ws.root), str(run.id)],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       start_new_session=True, check=True, cwd=str(ws.root))
        deadline = time.time() + 10
        while time.time() < deadline:
            run = reg.get(run.id)
            if run.status != "pending":
                break
            time.sleep(0.02)
        reg.record("run", run.status, stage=stage.name, run_id=run.id, targets=argv,
                   detail=reason or ("forced" if force else None))
        return run


def signal_run(run: Run, sig: int) -> bool:
    """Signal the run's process group, trusting the leader pid only with its create_time."""
    if run.pgid is None or not stage_alive(run):
        return False
    try:
        os.killpg(run.pgid, sig)
        return True
    except ProcessLookupError:
        return False


def stop(ws: Workspace, stage_name: str, grace_s: float = 10.0) -> Run:
    with Registry(ws.db_path) as reg:
        reconcile(reg)
        run = reg.latest(stage_name)
        if run is None or not (run.live or stage_alive(run)):
            raise Refused(f"stage {stage_name!r} has no live run to stop")
        reg.update(run.id, stop_requested=1)
        # A pending run has no pid yet: its supervisor either sees stop_requested and
        # never starts the stage, or records the pid we then signal.
        deadline = time.time() + 10
        while run.status == "pending" and time.time() < deadline:
            time.sleep(0.05)
            run = reg.get(run.id)
        sent = signal_run(run, signal.SIGTERM)
        deadline = time.time() + grace_s
        while sent and stage_alive(run) and time.time() < deadline:
            time.sleep(0.1)
        killed = False
        if stage_alive(run):
            killed = signal_run(run, signal.SIGKILL)
        deadline = time.time() + 5
        while time.time() < deadline and reg.get(run.id).live:
            time.sleep(0.05)
        if reg.get(run.id).live and not stage_alive(run):
            reg.finish(run.id, "killed", ended=time.time(), reason="stopped (supervisor did not record)")
        outcome = "SIGKILL after grace" if killed else ("SIGTERM" if sent else "nothing to signal")
        reg.record("stop", outcome, stage=stage_name, run_id=run.id, targets=[run.pgid])
        return reg.get(run.id)
