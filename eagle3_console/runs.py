"""Runs: launch a stage through the supervisor, stop it, and reconcile liveness.

Data flow: config.Pipeline + registry -> (this) -> supervise.py (detached)
-> stage process group. snapshot.collect calls reconcile() so that a run whose
supervisor vanished shows as `lost`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_console import claims, exitrecord, plan
from eagle3_console.config import Pipeline, Stage
from eagle3_console.endclock import mark_end
from eagle3_console.monitor.disk import room_for
from eagle3_console.monitor.procs import ProcessTable, orphans, process_alive
from eagle3_console.monitor.tree import TreeIndex
from eagle3_console.registry import Registry, Run
from eagle3_console.units import human_bytes
from eagle3_console.workspace import Workspace
from ops.spec import EstimateContext, read_json_dict, value_type_error

PENDING_GRACE_S = 30.0


class Refused(Exception):
    """An action that was not taken, with the reason; `code` is the exit code."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


class NothingToDo(Refused):
    """Not taken because there is nothing to act on (stop with no live run):
    exit 0, since the state the operator asked for already holds."""

    def __init__(self, message: str):
        super().__init__(message, code=0)


@dataclass
class Preflight:
    estimate_bytes: int | None
    free_bytes: int | None
    path: str | None
    written_bytes: int = 0          # already under the outputs (a resume needs only the rest)
    fits: bool = True               # monitor.disk.room_for's verdict (True when nothing is estimated)
    estimate: plan.Estimate | None = None   # the figure with its kind (upper bound, exact, ...) and basis

    @property
    def remaining_bytes(self) -> int | None:
        return None if self.estimate_bytes is None else max(0, self.estimate_bytes - self.written_bytes)

    def shortfall(self) -> str:
        """The refusal's sentence, sizes in a unit that shows them."""
        already = f" ({human_bytes(self.written_bytes)} of {human_bytes(self.estimate_bytes)} already written)" \
            if self.written_bytes else ""
        kind = f" ({self.estimate.label}: {self.estimate.basis})" if self.estimate else ""
        return (f"needs about {human_bytes(self.remaining_bytes)} more{already}{kind} but only "
                f"{human_bytes(self.free_bytes)} is free at {self.path}")


def stage_params(stage: Stage, overrides: dict[str, Any] | None = None, base: dict | None = None,
                 pipe: Pipeline | None = None) -> dict[str, Any]:
    """A run's params: the stage's (or a base run's) with overrides, checked;
    with `pipe`, a param naming a serve stage (bench's server) binds its URL."""
    params = dict(stage.params if base is None else base)
    params.update(overrides or {})
    if not stage.spec:
        # A custom stage takes the params its pipeline entry declares (their
        # types are its program's business: a default of 3 may well take 1.5).
        unknown = sorted(set(overrides or {}) - set(stage.params))
        if unknown:
            raise Refused(f"stages.{stage.name}: no param(s) {unknown}; it takes {sorted(stage.params)} "
                          f"(declared in its params = {{...}})", code=3)
        # An override takes the type of the declared default (README): a typo
        # fails here, not minutes later in the program (and again on restart).
        for key, value in (overrides or {}).items():
            wrong = value_type_error(stage.params[key], value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3)
    else:
        unknown = sorted(set(params) - set(stage.spec.params))
        if unknown:
            raise Refused(f"op {stage.op!r} has no param(s) {unknown}; it takes {sorted(stage.spec.params)}", code=3)
        for key, value in params.items():
            wrong = stage.spec.param_type_error(key, value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3)
        if pipe is not None:
            bind_servers(pipe, stage, params, overrides or {})
    batch = (overrides or {}).get(stage.batch_param) if stage.batch_param else None
    if isinstance(batch, (int, float)) and not isinstance(batch, bool) and not batch >= 1:
        # A batch of 0 starts a run that does nothing (or divides by it); halving never goes below 1.
        # Only what --set gives: a pipeline file may use a sentinel (-1: "the program decides").
        raise Refused(f"stages.{stage.name}: param {stage.batch_param}: {batch!r}: expected a batch of at least 1 "
                      f"(it is the stage's batch_param)", code=3)
    return params


def bind_servers(pipe: Pipeline, stage: Stage, params: dict[str, Any], overrides: dict[str, Any]) -> None:
    """An op's `server_params` ({name param: (url param, the mode it needs)},
    bench's): a serve stage named there gives the URL its host and port make,
    each launch (a restart follows the serve stage's current port)."""
    for name_key, (url_key, mode) in (stage.spec.extra.get("server_params") or {}).items():
        name = params.get(name_key)
        if not name:
            continue
        where = f"stages.{stage.name}.params.{name_key}"
        serve = pipe.stages.get(name)
        if serve is None or serve.op != "serve":
            serves = [s.name for s in pipe.stages.values() if s.op == "serve"]
            raise Refused(f"{where}: {name!r} is not a serve stage (serve stages: {', '.join(serves) or 'none'})",
                          code=3)
        sp = {**serve.spec.params, **serve.params}
        if sp.get("mode") != mode:
            raise Refused(f"{where}: serve stage {name!r} has mode {sp.get('mode')!r}; {name_key} needs a "
                          f"{mode!r} server", code=3)
        if url_key in overrides:
            raise Refused(f"{where} names a serve stage and {url_key} is set too; set one of them", code=3)
        from eagle3_console.monitor.serve import server_url    # serve stages only
        params[url_key] = server_url(str(sp.get("host") or "127.0.0.1"), sp.get("port"))


def estimate_context(ws: Workspace, pipe: Pipeline, params: dict[str, Any]) -> EstimateContext:
    return EstimateContext(root=ws.root, params=params, target=pipe.target)


def estimate_bytes(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> int | None:
    est = plan.disk_estimate(ws, pipe, stage, params)
    return None if est is None else est.bytes


def output_paths(ws: Workspace, stage: Stage, params: dict[str, Any]) -> list[str]:
    """The stage's output roots for these params, normalised (Workspace.resolve);
    an output that is the workspace or its state folder is refused (exit 3),
    whether it came from the pipeline file, a `--set` or a recorded run."""
    if stage.spec:
        outs = [str(params[p]) for p in stage.spec.output_params if params.get(p)]
    else:
        outs = list(stage.outputs)
    paths = [ws.resolve(o) for o in outs]
    for raw, p in zip(outs, paths):
        problem = ws.output_problem(p)
        if problem:
            raise Refused(f"stages.{stage.name}: output {raw!r}: {problem}", code=3)
    return [str(p) for p in paths]


def check_outputs_apart(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> None:
    """The pipeline file's rule (separate output roots) for the outputs a
    `--set` or a restart actually gives: clean and the shard monitor trust
    that a root belongs to one stage."""
    mine = [Path(p) for p in output_paths(ws, stage, params)]
    for other in pipe.stages.values():
        if other.name == stage.name:
            continue
        for q in output_paths(ws, other, other.params):
            q = Path(q)
            for p in mine:
                if p == q or q in p.parents or p in q.parents:
                    raise Refused(f"stages.{stage.name}: output {p} overlaps stage {other.name!r}'s output {q}; "
                                  f"expected separate output roots", code=3)


def preflight(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Preflight:
    estimate = plan.disk_estimate(ws, pipe, stage, params)
    est = None if estimate is None else estimate.bytes
    outs = output_paths(ws, stage, params)
    if est is None or not outs:
        return Preflight(est, None, outs[0] if outs else None, estimate=estimate)
    # One listing of what is there (the monitors' own index; a resume's outputs
    # are thousands of files, not millions): the estimate counts the whole output.
    written = 0
    for o in outs:
        if os.path.isdir(o):
            index = TreeIndex(o)
            index.refresh()
            written += index.total_bytes
    fits, free = room_for(outs[0], est, written)
    return Preflight(est, free, outs[0], written, fits=fits is not False, estimate=estimate)


def lints(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> list:
    """What the op's own lint says about this launch (the serve op's: flags,
    tp x dp against the gpus list, the drafter's aux layers); items print as
    `error: ...` / `warning: ...`."""
    check = stage.spec.extra.get("lint") if stage.spec else None
    found = list(check(estimate_context(ws, pipe, params), stage.gpus)) if check else []
    return found + plan.layer_lints(pipe, stage, params)


def reconcile(reg: Registry) -> list[Run]:
    """Mark runs whose supervisor is gone as lost; returns the ones it changed."""
    changed = []
    now = time.time()
    for run in reg.live_runs():
        if apply_exit_record(reg, run):
            changed.append(run)
            continue
        if run.supervisor_pid is None:
            if now - run.created > PENDING_GRACE_S:
                if reg.finish(run.id, "lost", reason="supervisor never started"):
                    changed.append(run)
            continue
        if not process_alive(run.supervisor_pid, run.supervisor_create_time):
            # The supervisor may have recorded the exit between our read and now.
            # ended = when the loss was noticed: watch's backoff counts from it.
            if reg.finish(run.id, "lost", ended=now, reason="supervisor gone without recording an exit"):
                mark_end(reg, run.id)
                reg.record("lost", "supervisor gone", stage=run.stage, run_id=run.id, actor="reconcile")
                changed.append(run)
    return changed


def apply_exit_record(reg: Registry, run: Run) -> bool:
    """A live run whose supervisor wrote its exit to the exit record (the
    registry was full, exitrecord.py) gets that exit; True when it did."""
    rec = exitrecord.read(run.log_path)
    if rec is None:
        return False
    if not rec.get("error") and process_alive(run.supervisor_pid, run.supervisor_create_time):
        return False    # it is writing the registry itself (or retrying while the disk is full)
    how = (f"the supervisor could not write {rec['error']}" if rec.get("error")
           else "the supervisor ended before it wrote state.db")
    values = {k: rec[k] for k in ("ended", "exit_code", "signal", "reason") if rec.get(k) is not None}
    values["reason"] = "; ".join(filter(None, [values.get("reason"),
                                               f"recorded from {exitrecord.path_for(run.log_path).name}: {how}"]))
    done = reg.finish(run.id, rec["status"], **values)
    if done:
        mark_end(reg, run.id, rec.get("boottime") if isinstance(rec.get("boottime"), dict) else None)
        reg.record("exit-record", rec["status"], stage=run.stage, run_id=run.id, actor="reconcile",
                   detail=rec.get("error"))
    try:
        exitrecord.path_for(run.log_path).unlink()
    except OSError:
        pass
    return done


def stage_alive(run: Run) -> bool:
    """Whether the stage's leader process still runs (pid trusted with its create_time)."""
    return run.pid is not None and process_alive(run.pid, run.create_time)


def outputs_complete(ws: Workspace, stage: Stage, run: Run) -> bool:
    """Whether a run whose end was never recorded (lost: its supervisor died, its
    processes went on and have ended) finished its work, judged by its outputs:
    the op's record, written once at its end, by this run (mtime after its
    start), and not saying it is still running or incomplete. A custom stage,
    or an op whose record grows as it goes (train's metrics.jsonl), cannot
    tell: False, and the policies treat the run as failed."""
    spec = stage.spec
    if spec is None or not spec.result_file or spec.result_file.endswith(".jsonl"):
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
    data = read_json_dict(record)
    return data is not None and data.get("status", "complete") == "complete"


def dependency_done(ws: Workspace, stage: Stage, run: Run | None) -> bool:
    """A dependency counts as done when its latest run succeeded, or was lost
    and its processes ended with its outputs complete (outputs_complete)."""
    if run is None:
        return False
    if run.status == "succeeded":
        return True
    return run.status == "lost" and not stage_alive(run) and outputs_complete(ws, stage, run)


def check_can_start(reg: Registry, pipe: Pipeline, stage: Stage, force: bool, ws: Workspace | None = None,
                    strays: bool = True) -> None:
    reconcile(reg)
    latest = reg.latest(stage.name)
    if latest and (latest.live or (latest.status == "lost" and stage_alive(latest))):
        raise Refused(f"stage {stage.name!r} already has a live run {latest.id} ({latest.status}, pid {latest.pid}); "
                      f"stop it first or use `restart --kill`")
    if ws is not None and strays:
        table = ProcessTable.snapshot()
        strays = orphans(table, str(ws.root), reg.registry_id, reg.run_ids()).get(stage.name)
        if strays:
            raise Refused(f"stage {stage.name!r} still has processes {strays} from a run of an earlier registry "
                          f"(its state database was replaced); they may write its outputs: kill them first "
                          f"(kill {' '.join(map(str, strays))})")
    if force:
        return
    for dep in stage.depends_on:
        dep_run = reg.latest(dep)
        if dep in pipe.stages and pipe.stages[dep].op == "serve":
            # A server never succeeds: depending on one means "its server is ready".
            from eagle3_console.serve_deps import not_ready
            problem = not_ready(pipe.stages[dep], dep_run, dep_run is not None and stage_alive(dep_run))
            if problem:
                raise Refused(f"stage {stage.name!r} depends on serve stage {dep!r}, {problem}; a dependency on a "
                              f"serve stage means its server is ready: wait for it (`status` shows its state), "
                              f"or pass --force")
            continue
        if ws is not None and dep in pipe.stages and dependency_done(ws, pipe.stages[dep], dep_run):
            continue
        if dep_run is None or dep_run.status != "succeeded":
            state = "never ran" if dep_run is None else f"run {dep_run.id} is {dep_run.status}"
            raise Refused(f"stage {stage.name!r} depends on {dep!r}, which has not succeeded ({state}); "
                          f"run it first or pass --force")


def launch(ws: Workspace, pipe: Pipeline, stage_name: str, overrides: dict[str, Any] | None = None,
           force: bool = False, restart_of: int | None = None, reason: str | None = None,
           base_params: dict[str, Any] | None = None, ignore_disk: bool = False) -> Run:
    """force overrides the dependency check (and lint errors), ignore_disk the disk check."""
    stage = pipe.stage(stage_name)
    params = stage_params(stage, overrides, base_params, pipe)
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        # First without the lock, for the refusal a user expects first (a live
        # run before a short disk); the check that counts is repeated below.
        check_can_start(reg, pipe, stage, force, ws=ws, strays=False)
        check_outputs_apart(ws, pipe, stage, params)
        owned = claims.owned_elsewhere(output_paths(ws, stage, params), reg.registry_id, stage.name)
        if owned:
            raise Refused(f"stage {stage.name!r}: {owned}")
        bad = [x for x in lints(ws, pipe, stage, params) if x.level == "error"]
        if bad and not force:
            reg.record("run", "refused: lint", stage=stage.name, detail="; ".join(x.message for x in bad))
            raise Refused(f"stage {stage.name!r}: " + "; ".join(x.message for x in bad), code=3)
        pf = preflight(ws, pipe, stage, params)
        if not pf.fits and not ignore_disk:
            reg.record("run", "refused: disk", stage=stage.name,
                       detail=f"remaining {pf.remaining_bytes} > free {pf.free_bytes} at {pf.path}")
            raise Refused(f"stage {stage.name!r} {pf.shortfall()}; free space or pass --ignore-disk")
        try:
            # The op repeats its own checks (serve's lints, extract's disk preflight):
            # a launch past them says so in the argv, or the op would refuse at once. Not in
            # the recorded params: a later restart is forced only when asked again.
            forced = stage.spec is not None and "force" in stage.spec.params and (ignore_disk or (force and bool(bad)))
            argv = stage.command(dict(params, force=True) if forced else params, pipe.target)
        except (KeyError, ValueError) as exc:
            raise Refused(str(exc.args[0]), code=3) from None
        # "No live run of this stage" and "its run exists" as one step: every
        # launcher (CLI, TUI, watch, restart) takes the database's write lock
        # here, so of N racing launches exactly one creates a run; the others
        # see its pending run and are refused.
        with reg.immediate():
            check_can_start(reg, pipe, stage, force, ws=ws)
            run = reg.create_run(stage.name, argv, params, stage.environment(), str(ws.root),
                                 lambda rid: ws.log_path(rid, stage.name), restart_of=restart_of, reason=reason)
        # The launcher returns as soon as the supervisor has daemonized.
        import subprocess       # here only: status imports this module and never launches
        try:
            subprocess.run([sys.executable, "-m", "eagle3_console.supervise", str(ws.root), str(run.id)],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, check=True, cwd=str(ws.root))
        except (OSError, subprocess.CalledProcessError) as exc:
            reg.finish(run.id, "failed", ended=time.time(), reason=f"supervisor did not start: {exc}")
            raise Refused(f"stage {stage.name!r}: the supervisor of run {run.id} did not start: {exc}") from None
        deadline = time.time() + 10
        while time.time() < deadline:
            run = reg.get(run.id)
            if run.status != "pending":
                break
            time.sleep(0.02)
        reg.record("run", run.status, stage=stage.name, run_id=run.id, targets=argv,
                   detail=reason or ", ".join(w for w, on in (("forced", force), ("disk ignored", ignore_disk)) if on)
                   or None)
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
    """SIGTERM the run's process group, SIGKILL after the grace; the whole group
    verified gone (stopper.py; Refused, exit 2, names what outlived SIGKILL)."""
    from eagle3_console.stopper import stop as stop_group
    return stop_group(ws, stage_name, grace_s)
