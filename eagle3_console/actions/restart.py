"""restart: a new run with the last run's params plus overrides, linked to it;
after an out-of-memory the batch param halved. Leftover workers go through kill.

Data flow: config + registry + the caller's snapshot (its OOM finding) -> RestartPlan ->
(confirm) -> [execute_kill] -> runs.launch -> events.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.actions.kill import KillPlan, execute_kill, plan_kill
from eagle3_console.monitor.procs import ProcessTable, RunRef
from eagle3_console.runs.plan import disk_line
from eagle3_console.kernel.model import StageStatus, oom_finding
from eagle3_console.kernel.registry import Registry, Run, RunStatus
from eagle3_console.kernel.workspace import Workspace
from ops.spec import refusing


@dataclass
class RestartPlan:
    stage: str
    last: Run | None
    params: dict[str, Any]
    argv: list[str]
    kill: KillPlan | None
    oom_line: str | None = None
    halved: tuple[str, Any, Any] | None = None     # (param, old, new) applied
    suggestion: tuple[str, Any, Any] | None = None  # offered after an OOM, not applied
    refusal: str | None = None
    refusal_kind: str | None = None                # what the audit log says of it: "refused: <kind>"
    not_halved: str | None = None                  # --halve-batch asked, and why nothing was halved
    force: bool = False
    ignore_disk: bool = False
    disk: str | None = None                        # the disk estimate's line (plan.disk_line)
    lints: list = field(default_factory=list)      # the op's lint (serve: flags, GPUs, drafter layers)

    def lines(self) -> list[str]:
        if self.refusal:
            return [f"refused: {self.refusal}"]
        out = []
        if self.kill:
            out += self.kill.lines()
        if self.last:
            out.append(f"restart {self.stage} (last run {self.last.id}: {self.last.status})")
            if self.last.status == RunStatus.SUCCEEDED:
                out.append("its outputs are complete: the stage runs again into them (an op that resumes, like "
                           "extract, skips what is there; others rewrite their files)")
        else:
            out.append(f"start {self.stage}")
        if self.oom_line:
            out.append(f"out of memory seen: {self.oom_line.strip()[:120]}")
        if self.halved:
            out.append(f"{self.halved[0]}: {self.halved[1]} -> {self.halved[2]} (halved after the OOM)")
        elif self.suggestion:
            out.append(f"suggested: --set {self.suggestion[0]}={self.suggestion[2]} (halved after the OOM)")
        if self.not_halved:
            out.append(self.not_halved)
        out += [f"lint {x}" for x in self.lints]
        out += [self.disk] if self.disk else []
        out.append("argv: " + " ".join(self.argv))
        return out


# The smallest share of a GPU a halving gives: below it no target's weights fit
# (SGLang's mem_fraction_static holds them), and a halving without a floor
# never ends.
SHARE_FLOOR = 0.05


def halve(value: Any, share: bool = False) -> Any:
    """The batch param after an OOM: a count halved (at least 1), or with `share`
    (config.Stage.batch_share) a share of the GPU in (0, 1) halved, never below SHARE_FLOOR."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"cannot halve {value!r}: not a number")
    if share:
        if not 0 < value < 1:
            raise ValueError(f"it is {value!r}, and a share is halved only within (0, 1)")
        if value / 2 < SHARE_FLOOR:
            raise ValueError(f"it is {value!r}, and a share is not halved below {SHARE_FLOOR}")
        return value / 2
    if not value > 1:
        # "1 -> 1 (halved)" restarted the very run that failed: say so instead.
        raise ValueError(f"it is {value!r}, and a batch cannot be halved below 1")
    return max(1, int(value) // 2) if isinstance(value, int) else max(1.0, value / 2)


def can_halve(value: Any, share: bool = False) -> bool:
    try:
        halve(value, share)
    except ValueError:
        return False
    return True


def oom_line(seen: StageStatus | None, run: Run | None) -> str | None:
    """The out-of-memory line of `run` as the snapshot found it (model.oom_finding: the one
    decision that the alert, watch's halving, the TUI and this restart share), or None when
    the snapshot is of another run (a run started since it was taken)."""
    if seen is None or run is None or seen.run_id != run.id:
        return None
    found = oom_finding(seen)
    return found.line if found else None


def plan_restart(ws: Workspace, stage_name: str, seen: StageStatus | None, overrides: dict[str, Any] | None = None,
                 kill: bool = False, halve_batch: bool = False, force: bool = False, nvml: Any = None,
                 ignore_disk: bool = False, pipe: cfg.Pipeline | None = None) -> RestartPlan:
    """`seen`: the stage in the caller's snapshot, whose out-of-memory finding decides the halving."""
    pipe = pipe or cfg.load(ws.config_path)
    stage = pipe.stage(stage_name)
    with Registry(ws.db_path) as reg:
        runs.reconcile(reg)
        last = reg.latest(stage_name)
    if halve_batch and not stage.batch_param:
        raise runs.Refused(f"stages.{stage_name}: --halve-batch needs a batch_param, and this stage declares none "
                           f"(add `batch_param = \"<param>\"` to it, or pass --set <param>=<value>)", code=3)
    params = runs.stage_params(stage, overrides, base=last.params if last else None, pipe=pipe)
    plan = RestartPlan(stage=stage_name, last=last, params=params, argv=[], kill=None, force=force,
                       ignore_disk=ignore_disk)
    if last and last.status in (RunStatus.FAILED, RunStatus.KILLED, RunStatus.LOST):
        plan.oom_line = oom_line(seen, last)
    if plan.oom_line and stage.batch_param and stage.batch_param not in params \
            and stage.spec.params.get(stage.batch_param) is not None:
        # Left at the op's default (its Param): that default is what ran out of memory.
        params[stage.batch_param] = stage.spec.params[stage.batch_param]
    if plan.oom_line and stage.batch_param and stage.batch_param in params \
            and stage.batch_param not in (overrides or {}):
        try:
            new = halve(params[stage.batch_param], stage.batch_share)
            if halve_batch:
                plan.halved = (stage.batch_param, params[stage.batch_param], new)
                params[stage.batch_param] = new
            else:
                plan.suggestion = (stage.batch_param, params[stage.batch_param], new)
        except ValueError as exc:
            plan.suggestion = None
            if halve_batch:
                plan.refusal = f"--halve-batch: cannot halve {stage.batch_param}: {exc}"
                plan.refusal_kind = "halve batch"
                return plan
            plan.oom_line += f" (cannot halve: {exc})"
    if halve_batch and not plan.halved and plan.refusal is None:
        why = ("its last run did not run out of memory (no OOM in its log)" if not plan.oom_line else
               f"{stage.batch_param} is set by --set" if stage.batch_param in (overrides or {}) else
               f"{stage.batch_param} has no value to halve")
        plan.not_halved = f"--halve-batch: nothing halved: {why}; {stage.batch_param} stays as it was"
    try:
        plan.argv = stage.command(params, pipe.target)
    except (KeyError, ValueError) as exc:
        plan.refusal, plan.refusal_kind = str(exc.args[0]), "params"
        return plan
    # What launch would refuse is refused here, before any kill.
    try:
        runs.check_outputs_apart(ws, pipe, stage, params)
    except runs.Refused as exc:
        plan.refusal, plan.refusal_kind = str(exc), exc.kind or "outputs"
        return plan
    plan.lints = runs.lints(ws, pipe, stage, params)
    bad = [x.message for x in plan.lints if x.level == "error"]
    refused = [x.message for x in refusing(plan.lints, force)]
    if refused:
        plan.refusal, plan.refusal_kind = f"stage {stage_name!r}: " + "; ".join(refused), "lint"
        return plan
    pf = runs.preflight(ws, pipe, stage, params)
    plan.disk = disk_line(pf)
    if not pf.fits and not ignore_disk:
        plan.refusal = f"stage {stage_name!r} {pf.shortfall()}; free space or pass --ignore-disk"
        plan.refusal_kind = "disk"
        return plan
    # The argv the launch will run, as it will run it (forced past the op's own checks).
    plan.argv = runs.launch_argv(stage, params, pipe, force=force and bool(bad), ignore_disk=ignore_disk)
    alive = bool(last) and (last.live or runs.stage_alive(last))
    # Workers that outlived a failed run still hold their GPU memory: a restart next to them OOMs again.
    leftovers = sorted(ProcessTable.snapshot().owners((RunRef.from_run(last),))) if last and not alive else []
    if alive or leftovers:
        if not kill:
            what = (f"run {last.id} of {stage_name!r} is still alive" if alive else
                    f"worker(s) {leftovers} of run {last.id} of {stage_name!r} are still alive")
            plan.refusal, plan.refusal_kind = f"{what}; stop it or restart with --kill", "live run"
            return plan
        plan.kill = plan_kill(ws, stage_name, nvml=nvml)
    return plan


def execute_restart(ws: Workspace, plan: RestartPlan, progress: Callable[[str], None] | None = None,
                    nvml: Any = None, pipe: cfg.Pipeline | None = None) -> Run:
    if plan.refusal:
        raise runs.Refused(plan.refusal, kind=plan.refusal_kind)
    if plan.kill and not plan.kill.refusal:
        result = execute_kill(ws, plan.kill, progress=progress, nvml=nvml)
        if result.still_alive:
            raise runs.Refused(f"processes still alive after kill: {result.still_alive}")
    pipe = pipe or cfg.load(ws.config_path)
    reason = "restart" + (f", {plan.halved[0]} {plan.halved[1]} -> {plan.halved[2]} after OOM" if plan.halved else "")
    return runs.launch(ws, pipe, plan.stage, base_params=plan.params, force=plan.force,
                       restart_of=plan.last.id if plan.last else None, reason=reason,
                       ignore_disk=plan.ignore_disk)
