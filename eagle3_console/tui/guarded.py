"""The console's guarded actions, one table: what each plans, how its dialog
reads, and what it executes.

A guarded action is plan -> dialog -> execute. The plan is built off the UI
thread for the stage selected when the key was pressed; each dialog Option
carries the plan object its lines describe (Option.plan), and confirming
executes exactly that object. Nothing is kept on the app or the screen
between the two steps, so a second dialog planned meanwhile (k on A, move,
k on B) cannot swap what the first one executes.

A plan function returns a DialogSpec to confirm, or a bare Option when there
is nothing to confirm (start on a stage whose outputs do not exist yet): that
option is executed at once. Both steps raise freely; the runner in screen.py
turns an exception into a refusal (planning) or a failed outcome (executing),
in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from eagle3_console import actions
from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.kernel.model import Snapshot, StageOnly, StageStatus, oom_finding
from eagle3_console.kernel.registry import EXITED, MAY_BE_ALIVE, Registry, RunStatus
from eagle3_console.kernel.workspace import Workspace
from eagle3_console.tui.dialogs import DialogSpec, Option

COMPLETE = (RunStatus.SUCCEEDED, StageOnly.STALE)      # the stage's outputs exist and are whole

Progress = Callable[[str], None]


def _started(r: Any) -> bool:
    """A launch went well: the run is under way, or already done (a quick stage)."""
    return r.status in MAY_BE_ALIVE or r.status == RunStatus.SUCCEEDED


@dataclass(frozen=True)
class Context:
    """What the actions need from the console, fixed when the key is pressed."""
    ws: Workspace
    nvml: Any
    snapshot: Snapshot
    stop_grace_s: float = 10.0
    kill_release_timeout_s: float = 60.0


@dataclass(frozen=True)
class Guarded:
    verb: str                                                   # start | stop | kill | clean | restart
    plan: Callable[[Context, StageStatus], DialogSpec | Option]
    execute: Callable[[Context, StageStatus, Option, Progress], tuple[bool, list[str]]]
    # The new run is what the operator wants to watch: a successful outcome
    # closes the dialog and becomes a notification.
    closes_on_success: bool = False


def refused_spec(verb: str, stage: str, why: str, label: str = "REFUSED") -> DialogSpec:
    return DialogSpec(title=f"{verb} {stage}", confirm_label=verb,
                      options=[Option(verb, verb, [], refusal=why, refusal_label=label)])


def _still_latest(ws: Workspace, stage: str, run_id: int | None) -> None:
    """The plan was made for run `run_id`: refuse if another run started since."""
    with Registry(ws.db_path) as reg:
        latest = reg.latest(stage)
    now = latest.id if latest else None
    if now != run_id:
        raise runs.Refused(f"run {now} of {stage!r} started after this was planned (for run {run_id}); "
                           f"nothing done: plan again")


def made_stale(snap: Snapshot, stage: str) -> list[str]:
    """The downstream stages whose complete outputs a new run of `stage` makes stale."""
    return [n for n in snap.downstream(stage) if (s := snap.stage(n)) is not None and s.status in COMPLETE]


def stale_line(snap: Snapshot, stage: str) -> str:
    names = made_stale(snap, stage)
    if not names:
        return "no downstream stage has complete outputs: none becomes stale"
    return "makes stale (their outputs were made from the current ones): " + ", ".join(names)


# ------------------------------------------------------------------ start
@dataclass(frozen=True)
class StartPlan:
    stage: str
    last_run: int | None
    argv: list[str]


def plan_start(ctx: Context, st: StageStatus) -> DialogSpec | Option:
    pipe = cfg.load(ctx.ws.config_path)
    stage = pipe.stage(st.name)
    argv = stage.command(runs.stage_params(stage, None, pipe=pipe), pipe.target)
    plan = StartPlan(st.name, st.run_id, argv)
    if st.status not in COMPLETE:
        return Option("start", "start", [f"start {st.name}"], plan=plan)
    # Complete outputs: a new run rewrites them (train rewrote runs/drafter), as `r` would; ask as `r` does.
    lines = [f"start {st.name} again (last run {st.run_id}: {st.status})",
             "its outputs are complete: the stage runs again into them (an op that resumes, like extract, "
             "skips what is there; others rewrite their files)",
             stale_line(ctx.snapshot, st.name),
             "argv: " + " ".join(argv)]
    return DialogSpec(title=f"Start {st.name} again", confirm_label="Start",
                      options=[Option("start", "start", lines, plan=plan)])


def execute_start(ctx: Context, st: StageStatus, option: Option, progress: Progress) -> tuple[bool, list[str]]:
    plan: StartPlan = option.plan
    _still_latest(ctx.ws, plan.stage, plan.last_run)
    r = runs.launch(ctx.ws, cfg.load(ctx.ws.config_path), plan.stage)
    return _started(r), [f"started {plan.stage}: run {r.id}, {r.status}, pid {r.pid}"]


# ------------------------------------------------------------------ stop
@dataclass(frozen=True)
class StopPlan:
    stage: str
    run_id: int
    grace_s: float


def plan_stop(ctx: Context, st: StageStatus) -> DialogSpec:
    if st.status not in MAY_BE_ALIVE or st.run_id is None:
        last = f"its last run {st.run_id} {st.status}" if st.run_id else "it never ran"
        return DialogSpec(title=f"Stop {st.name}", confirm_label="Stop", options=[Option(
            "stop", "stop", [], f"{last}; no live run of {st.name!r}", refusal_label="NOTHING TO STOP")])
    grace = ctx.stop_grace_s
    lines = [f"stop run {st.run_id} of {st.name} (pid {st.pid}, {st.status}): SIGTERM its process group, "
             f"SIGKILL after {grace:g} s"]
    return DialogSpec(title=f"Stop {st.name}", confirm_label="Stop",
                      options=[Option("stop", "stop", lines, plan=StopPlan(st.name, st.run_id, grace))])


def execute_stop(ctx: Context, st: StageStatus, option: Option, progress: Progress) -> tuple[bool, list[str]]:
    plan: StopPlan = option.plan
    _still_latest(ctx.ws, plan.stage, plan.run_id)      # stop the run shown, not one started since
    r = runs.stop(ctx.ws, plan.stage, grace_s=plan.grace_s)
    return r.status in EXITED, [f"run {r.id} of {plan.stage}: {r.status}"]


# ------------------------------------------------------------------ kill
def plan_kill(ctx: Context, st: StageStatus) -> DialogSpec:
    p = actions.plan_kill(ctx.ws, st.name, nvml=ctx.nvml)
    gpus = (f"GPU memory cannot be checked here: {p.gpus_unavailable}" if p.gpus_unavailable else
            "NVML shows no GPU memory held by its processes")
    if p.refusal and not p.procs:
        # Good news after an OOM: say so, and what was checked.
        option = Option("kill", "kill", [f"no process of {st.name} (its runs, their process groups and "
                                         f"sessions) is alive", gpus], p.refusal,
                        refusal_label="NOTHING TO KILL")
        notes = (["Next after an OOM: c cleans the partial output, r restarts with a halved batch."]
                 if oom_finding(st) else [])
    else:
        option = Option("kill", "kill", p.lines(), p.refusal, plan=p)
        notes = ["After the signals, the dialog waits until NVML shows the GPU memory released, or says "
                 "which pid still holds what." if not p.gpus_unavailable else
                 f"After the signals, the dialog waits for the processes to exit ({gpus})."]
    return DialogSpec(title=f"Kill the workers of {st.name}", confirm_label="Kill", options=[option], notes=notes)


def execute_kill(ctx: Context, st: StageStatus, option: Option, progress: Progress) -> tuple[bool, list[str]]:
    res = actions.execute_kill(ctx.ws, option.plan, progress=progress, nvml=ctx.nvml,
                               release_timeout_s=ctx.kill_release_timeout_s)
    return res.ok, res.lines()


# ------------------------------------------------------------------ clean
def plan_clean(ctx: Context, st: StageStatus) -> DialogSpec:
    p = actions.plan_clean(ctx.ws, st.name)
    # The refusal heads the dialog once; the plan's lines say what was kept.
    lines = [ln for ln in p.lines() if not (p.refusal and ln.endswith(p.refusal))]
    label = "NOTHING TO CLEAN" if p.nothing_to_do else "REFUSED"
    return DialogSpec(title=f"Clean the partial outputs of {st.name}", confirm_label="Clean",
                      options=[Option("clean", "clean", lines, p.refusal, plan=p, refusal_label=label)],
                      type_to_confirm=st.name)


def execute_clean(ctx: Context, st: StageStatus, option: Option, progress: Progress) -> tuple[bool, list[str]]:
    res = actions.execute_clean(ctx.ws, option.plan)
    return not res.failed, res.lines()


# ------------------------------------------------------------------ restart
def plan_restart(ctx: Context, st: StageStatus) -> DialogSpec:
    # Always plan the kill: a live run, or workers that outlived a failed one, are listed in the
    # plan (pid, GPU, memory) and killed before the restart; nothing alive -> no kill.
    base = actions.plan_restart(ctx.ws, st.name, st, kill=True, nvml=ctx.nvml)
    options = [Option("same", "same parameters", base.lines(), base.refusal, plan=base)]
    if base.suggestion:
        halved = actions.plan_restart(ctx.ws, st.name, st, kill=True, halve_batch=True, nvml=ctx.nvml)
        name, old, new = base.suggestion
        options.insert(0, Option("halved", f"{name} {old} -> {new} (halved after the OOM)",
                                 halved.lines(), halved.refusal, plan=halved))
    alive = base.kill is not None and bool(base.kill.procs)
    notes = [stale_line(ctx.snapshot, st.name)] if made_stale(ctx.snapshot, st.name) else []
    return DialogSpec(title=f"Restart {st.name}" + (" (its live processes are killed first)" if alive else ""),
                      confirm_label="Restart", options=options, selected=options[0].key, notes=notes)


def execute_restart(ctx: Context, st: StageStatus, option: Option, progress: Progress) -> tuple[bool, list[str]]:
    r = actions.execute_restart(ctx.ws, option.plan, progress=progress, nvml=ctx.nvml)
    return _started(r), [f"run {r.id} of {st.name}: {r.status}, pid {r.pid}"]


ACTIONS: dict[str, Guarded] = {
    g.verb: g for g in (
        Guarded("start", plan_start, execute_start, closes_on_success=True),
        Guarded("stop", plan_stop, execute_stop),
        Guarded("kill", plan_kill, execute_kill),
        Guarded("clean", plan_clean, execute_clean),
        Guarded("restart", plan_restart, execute_restart, closes_on_success=True),
    )
}
