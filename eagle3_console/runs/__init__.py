"""Runs: launch a stage through the supervisor, and stop it.

Data flow: config.Pipeline + registry -> (this) -> supervise.py (detached)
-> stage process group. A launch checks the params (binding a server param
to its serving stage: the spec's server_params and serves hooks), the op's
lint, the disk (plan.preflight) and the dependencies. Liveness and
reconcile() are liveness.py's, output roots outputs.py's, the stop
stopper.py's; runs still answers to their names.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_console.runs import claims
from eagle3_console.config import Pipeline, Stage
# The names callers know runs by: each lives in the module of its own job.
from eagle3_console.runs.liveness import (PENDING_GRACE_S, apply_exit_record, leftover_workers,  # noqa: F401
                                          reconcile, stage_alive)
from eagle3_console.runs.paramtypes import quoted_number
from eagle3_console.monitor.procs import ProcessTable, orphans
from eagle3_console.runs.outputs import check_outputs_apart, output_paths
from eagle3_console.runs.plan import Preflight, context, disk_estimate, preflight  # noqa: F401
from eagle3_console.refused import NothingToDo, Refused  # noqa: F401
from eagle3_console.model import ServeState
from eagle3_console.registry import Registry, Run, RunStatus
from eagle3_console.runs.handoff import Handoff
from eagle3_console.runs.vouch import records_files, vanished
from eagle3_console.slurmparams import SLURM
from eagle3_console.workspace import Workspace
from ops.common import read_json
from ops.spec import refusing, value_type_error


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
                          f"(declared in its params = {{...}})", code=3, kind="params")
        # An override takes the type of the declared default (README): a typo
        # fails here, not minutes later in the program (and again on restart).
        for key, value in (overrides or {}).items():
            wrong = value_type_error(stage.params[key], value) or quoted_number(stage.params[key], None, value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3, kind="params")
    else:
        unknown = sorted(set(params) - set(stage.spec.params))
        if unknown:
            raise Refused(f"op {stage.op!r} has no param(s) {unknown}; it takes {sorted(stage.spec.params)}", code=3,
                          kind="params")
        for key, value in params.items():
            wrong = stage.spec.param_type_error(key, value) or quoted_number(
                None, stage.spec.params.declared.get(key), value)
            if wrong:
                raise Refused(f"stages.{stage.name}: param {key}: {wrong}", code=3, kind="params")
        if pipe is not None:
            bind_servers(pipe, stage, params, overrides or {})
    batch = (overrides or {}).get(stage.batch_param) if stage.batch_param else None
    if isinstance(batch, (int, float)) and not isinstance(batch, bool) and not batch >= 1 and not stage.batch_share:
        # A batch of 0 starts a run that does nothing (or divides by it); halving never goes below 1.
        # Only what --set gives: a pipeline file may use a sentinel (-1: "the program decides").
        raise Refused(f"stages.{stage.name}: param {stage.batch_param}: {batch!r}: expected a batch of at least 1 "
                      f"(it is the stage's batch_param)", code=3, kind="params")
    return params


def bind_servers(pipe: Pipeline, stage: Stage, params: dict[str, Any], overrides: dict[str, Any]) -> None:
    """The op's server_params (bench's): a serving stage named there gives the
    URL its host and port make, each launch (a restart follows the serve
    stage's current port)."""
    for want in stage.spec.server_params:
        names = params.get(want.name_param)
        if not names:
            continue
        # Several serve stages, comma-separated (bench: one server per speculative setting): URLs alike.
        urls = [_server_url(pipe, stage, want, name.strip(), overrides) for name in str(names).split(",")]
        params[want.url_param] = ",".join(urls)


def _server_url(pipe: Pipeline, stage: Stage, want, name: str, overrides: dict[str, Any]) -> str:
    where = f"stages.{stage.name}.params.{want.name_param}"
    serve = pipe.stages.get(name)
    if serve is None or serve.spec is None or serve.spec.serves is None:
        serves = [s.name for s in pipe.stages.values() if s.spec is not None and s.spec.serves is not None]
        raise Refused(f"{where}: {name!r} is not a serve stage (serve stages: {', '.join(serves) or 'none'})",
                      code=3)
    server = serve.spec.serves(serve.spec.effective(serve.params))
    if server.mode != want.mode:
        raise Refused(f"{where}: serve stage {name!r} has mode {server.mode!r}; {want.name_param} needs a "
                      f"{want.mode!r} server", code=3)
    if want.url_param in overrides:
        raise Refused(f"{where} names a serve stage and {want.url_param} is set too; set one of them", code=3)
    from eagle3_console.monitor.serve import server_url    # serve stages only
    return server_url(server.host, server.port)


def lints(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> list:
    """What the op's own lint says about this launch (serve's: flags, tp x dp
    against the gpus list, the drafter's aux layers; extract's layer ids);
    items print as `error: ...` / `warning: ...`."""
    check = stage.spec.lint if stage.spec else None
    return list(check(context(ws, pipe, params, stage), stage.gpus)) if check else []


def serves(stage: Stage | None) -> bool:
    """Whether the stage is a server (its spec's serves hook): depending on it means "its server is ready"."""
    return stage is not None and stage.spec is not None and stage.spec.serves is not None


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


@contextmanager
def _recorded(reg: Registry, stage: Stage):
    """A launch refused here is in the audit log (`events`), as the disk and lint refusals are."""
    try:
        yield
    except Refused as exc:
        reg.record("run", f"refused: {exc.kind}" if exc.kind else "refused", stage=stage.name,
                   detail=exc.detail if exc.detail is not None else str(exc))
        raise


def missing_inputs(ws: Workspace, stage: Stage, params: dict[str, Any]) -> list[str]:
    """The op's input paths (OpSpec.input_params) that do not exist, as `param path`."""
    out = []
    for name in stage.spec.input_params if stage.spec else ():
        value = params.get(name)
        if value not in (None, ""):
            path = ws.resolve(str(value))
            if not os.path.lexists(path):
                out.append(f"params.{name} {path}")
    return out


def handoff(ws: Workspace, stage: Stage, params: dict[str, Any]) -> Handoff:
    """What this launch's supervisor needs of the stage, resolved now."""
    return Handoff(output_paths(ws, stage, params), records_files(stage),
                   dataclasses.asdict(stage.slurm) if stage.slurm is not None else None)


def launch_argv(stage: Stage, params: dict[str, Any], pipe: Pipeline, force: bool, ignore_disk: bool) -> list[str]:
    """The argv a launch runs. The op repeats its own checks (serve's lints, extract's
    disk preflight): a launch past them (ignore_disk, or force over lint errors) says so
    in the argv, or the op would refuse at once. Not in the recorded params: a later
    restart is forced only when asked again. KeyError/ValueError: params it cannot fill."""
    forced = stage.spec is not None and "force" in stage.spec.params and (ignore_disk or force)
    params = dict(params, force=True) if forced else params
    if stage.slurm is None:
        return stage.command(params, pipe.target)
    # A slurm stage runs the same command inside the job (under srun).
    from eagle3_console.runs.slurm.command import job_argv
    return job_argv(stage, params, lambda p: stage.command(p, pipe.target))


@dataclass
class Prelaunch:
    """A launch's params, the op's lint and the disk preflight, computed once: `run`
    prints them as its plan and hands them to launch, which acts on the same figures.
    `preflight_error`: what computing the preflight raised (launch raises it in turn)."""

    stage: Stage
    params: dict[str, Any]
    lints: list
    preflight: Preflight | None
    preflight_error: Exception | None = None


def prelaunch(ws: Workspace, pipe: Pipeline, stage_name: str, overrides: dict[str, Any] | None = None,
              base_params: dict[str, Any] | None = None) -> Prelaunch:
    stage = pipe.stage(stage_name)
    params = stage_params(stage, overrides, base_params, pipe)
    found = lints(ws, pipe, stage, params)
    try:
        return Prelaunch(stage, params, found, preflight(ws, pipe, stage, params))
    except (Refused, OSError) as exc:
        return Prelaunch(stage, params, found, None, exc)


def first_checks(ws: Workspace, pipe: Pipeline, reg: Registry | None, pre: Prelaunch, force: bool,
                 ignore_disk: bool, serve_states: dict[int, ServeState] | None = None) -> list[str]:
    """What a launch checks before it takes the lock (`run --dry-run` too, which
    records nothing; without a registry, `reg` None: no run to check against);
    the argv it would run. Refused as the launch is."""
    stage, params = pre.stage, pre.params
    if reg is not None:
        check_can_start(reg, pipe, stage, force, ws=ws, strays=False, serve_states=serve_states)
    elif stage.depends_on and not force:
        raise Refused(f"stage {stage.name!r} depends on {', '.join(stage.depends_on)}, which never ran; "
                      f"run it first or pass --force", kind="dependencies")
    check_outputs_apart(ws, pipe, stage, params)
    owned = claims.owned_elsewhere(output_paths(ws, stage, params), reg.registry_id if reg else "", stage.name)
    if owned:
        raise Refused(f"stage {stage.name!r}: {owned}", kind="owned elsewhere")
    bad = [x for x in pre.lints if x.level == "error"]
    refused = refusing(pre.lints, force)
    if refused:
        said = "; ".join(x.message for x in refused) + (" (--force skips dependencies, never a param that "
                                                        "cannot work)" if force else "")
        raise Refused(f"stage {stage.name!r}: " + said, code=3, kind="lint", detail=said)
    missing = missing_inputs(ws, stage, params)
    if missing:
        # Even with --force: the op would only start (N torchrun ranks, a model load) to fail on it.
        raise Refused(f"stage {stage.name!r}: {'; '.join(missing)} does not exist", kind="input")
    if pre.preflight_error is not None:
        raise pre.preflight_error
    pf = pre.preflight
    if not pf.fits and not ignore_disk:
        raise Refused(f"stage {stage.name!r} {pf.shortfall()}; free space or pass --ignore-disk", kind="disk",
                      detail=f"remaining {pf.remaining_bytes} > free {pf.free_bytes} at {pf.path}")
    try:
        return launch_argv(stage, params, pipe, force=force and bool(bad), ignore_disk=ignore_disk)
    except (KeyError, ValueError) as exc:
        raise Refused(str(exc.args[0]), code=3, kind="params") from None


def dry_run(ws: Workspace, pipe: Pipeline, pre: Prelaunch, force: bool = False, ignore_disk: bool = False
            ) -> tuple[list[str] | None, Refused | None]:
    """`run --dry-run`: the argv a launch would run (None where the params cannot
    make one) and what would refuse it now (None: nothing); nothing is created,
    started or recorded (a workspace without a state database keeps none)."""
    try:
        if not ws.db_path.exists():
            return first_checks(ws, pipe, None, pre, force, ignore_disk), None
        with Registry(ws.db_path) as reg:
            return first_checks(ws, pipe, reg, pre, force, ignore_disk), None
    except Refused as exc:
        try:
            argv = launch_argv(pre.stage, pre.params, pipe, force=False, ignore_disk=False)
        except (KeyError, ValueError):
            argv = None
        return argv, exc


def launch(ws: Workspace, pipe: Pipeline, stage_name: str, overrides: dict[str, Any] | None = None,
           force: bool = False, restart_of: int | None = None, reason: str | None = None,
           base_params: dict[str, Any] | None = None, ignore_disk: bool = False,
           pre: Prelaunch | None = None, serve_states: dict[int, ServeState] | None = None) -> Run:
    """force overrides the dependency check (and lint errors), ignore_disk the disk check.
    `pre`: this launch's checks as its caller just computed and showed them (`run`);
    otherwise computed here. `serve_states`: the serve runs' states in the caller's
    snapshot (watch --advance), so a server is not probed again."""
    serve_states = dict(serve_states or {})     # the launch's two checks probe a server once
    pre = pre or prelaunch(ws, pipe, stage_name, overrides, base_params)
    stage, params = pre.stage, pre.params
    ws.ensure_state()
    with Registry(ws.db_path) as reg:
        # First without the lock, for the refusal a user expects first (a live
        # run before a short disk); the check that counts is repeated below.
        with _recorded(reg, stage):
            argv = first_checks(ws, pipe, reg, pre, force, ignore_disk, serve_states)
        # "No live run of this stage" and "its run exists" as one step: every
        # launcher (CLI, TUI, watch, restart) takes the database's write lock
        # here, so of N racing launches exactly one creates a run; the others
        # see its pending run and are refused.
        # Recorded outside the transaction, which the refusal rolls back.
        with _recorded(reg, stage), reg.immediate():
            check_can_start(reg, pipe, stage, force, ws=ws, serve_states=serve_states)
            # clean takes its hold in a transaction too: it is either seen here or sees this run.
            held = claims.held_by_action(output_paths(ws, stage, params))
            if held:
                raise Refused(f"stage {stage.name!r}: {held}", kind="clean running")
            run = reg.create_run(stage.name, argv, params, stage.environment(), str(ws.root),
                                 lambda rid: ws.log_path(rid, stage.name), restart_of=restart_of, reason=reason,
                                 launcher=stage.launcher)
        # The launcher returns as soon as the supervisor has daemonized.
        import subprocess       # here only: status imports this module and never launches
        try:
            subprocess.run([sys.executable, "-m", "eagle3_console.runs.supervise", str(ws.root), str(run.id),
                            handoff(ws, stage, params).to_arg()],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True, check=True, cwd=str(ws.root))
        except (OSError, subprocess.CalledProcessError) as exc:
            reg.finish(run.id, RunStatus.FAILED, ended=time.time(), reason=f"supervisor did not start: {exc}")
            raise Refused(f"stage {stage.name!r}: the supervisor of run {run.id} did not start: {exc}") from None
        deadline = time.time() + 10
        while time.time() < deadline:
            run = reg.get(run.id)
            if run.status != RunStatus.PENDING or run.job_id:     # a job may wait in Slurm's queue
                break
            time.sleep(0.02)
        # One target, the run (`events` counts targets): its argv goes with it.
        reg.record("run", run.status, stage=stage.name, run_id=run.id, targets=[{"run": run.id, "argv": argv}],
                   detail=reason or ", ".join(w for w, on in (("forced", force), ("disk ignored", ignore_disk)) if on)
                   or None)
        return run


def stop(ws: Workspace, stage_name: str, grace_s: float = 10.0) -> Run:
    """SIGTERM the run's process group, SIGKILL after the grace; the whole group
    verified gone (stopper.py; Refused, exit 2, names what outlived SIGKILL)."""
    from eagle3_console.runs.stopper import stop as stop_group
    return stop_group(ws, stage_name, grace_s)
