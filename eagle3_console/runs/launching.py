"""Launch a stage through the supervisor: the params, the op's lint and the
disk preflight computed once (prelaunch, which `run` prints as its plan), the
checks before the lock (first_checks, also `run --dry-run`'s), then the
check that counts and the run's creation as one step, and the supervisor
started detached (runs/supervise.py).

Data flow: config.Pipeline + registry -> (this) -> supervise.py (detached)
-> stage process group. A refusal is recorded in the audit log (`events`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from eagle3_console.kernel.config import Pipeline, Stage
from eagle3_console.kernel.model import ServeState
from eagle3_console.kernel.refused import Refused
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.runs import claims
from eagle3_console.runs.handoff import Handoff
from eagle3_console.runs.outputs import check_outputs_apart, output_paths
from eagle3_console.runs.params import stage_params
from eagle3_console.runs.plan import Preflight, context, preflight
from eagle3_console.runs.startcheck import check_can_start
from eagle3_console.runs.vouch import records_files
from eagle3_console.kernel.workspace import Workspace
from ops.spec import refusing


def lints(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> list:
    """What the op's own lint says about this launch (serve's: flags, tp x dp
    against the gpus list, the drafter's aux layers; extract's layer ids);
    items print as `error: ...` / `warning: ...`."""
    return list(stage.spec.lint(context(ws, pipe, params, stage), stage.gpus))


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
    for name in stage.spec.input_params:
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
    forced = "force" in stage.spec.params and (ignore_disk or force)
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
