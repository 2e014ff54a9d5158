"""What headless `watch` does on failure: restart with backoff, halve the batch after an OOM.

Data flow: snapshot.collect -> decide (pure: which stage, why, with what) ->
actions.plan_restart/execute_restart -> events. Runs under an exclusive lock
(watchlock.py) so two crons never restart the same stage twice.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from eagle3_console import actions
from eagle3_console.kernel import config as cfg
from eagle3_console import runs
from eagle3_console.actions.restart import can_halve
from eagle3_console.kernel.endclock import seconds_since_end
from eagle3_console.kernel.model import Snapshot, StageOnly, oom_finding
from eagle3_console.kernel.registry import ACTIVE, Registry, RunStatus
from eagle3_console.actions.watchlock import LockHeld, WatchLock
from eagle3_console.kernel.workspace import Workspace

__all__ = ["LockHeld", "WatchLock", "apply", "advance", "decide", "ready", "restart_pending", "settled",
           "start_driver"]


# Restarts after an out-of-memory on a stage without a restart policy: halving
# 2^10 covers a batch of 1,024 down to 1; a stage still out of memory then is
# not a batch problem.
OOM_RESTARTS = 10


@dataclass
class Decision:
    stage: str
    run_id: int
    reason: str
    halve: bool
    wait_s: float = 0.0       # > 0: backoff not yet elapsed


def decide(pipe: cfg.Pipeline, snap: Snapshot, reg: Registry, now: float) -> list[Decision]:
    out = []
    for st in snap.stages:
        if st.status not in (RunStatus.FAILED, RunStatus.LOST) or st.run_id is None:
            continue
        if st.status == RunStatus.LOST and (st.done or _alive_lost(reg, st.run_id)):
            continue    # a lost run whose stage still runs is not a failure yet; one that completed is none
        stage = pipe.stages.get(st.name)
        if stage is None:
            continue    # removed from the pipeline file: nothing says how to run it again
        oom = oom_finding(st) is not None
        chain = list(reg.restart_chain(st.run_id))
        restarts = sum(1 for r in chain if r.restart_of is not None)
        limit = stage.restart.max if stage.restart else 0
        halvable = oom and stage.batch_param and can_halve(st.params.get(stage.batch_param), stage.batch_share)
        if halvable and not stage.restart:
            limit = OOM_RESTARTS
        if restarts >= limit or (not stage.restart and not halvable):
            continue
        backoff = (stage.restart.backoff_s if stage.restart else 0.0) * (2 ** restarts)
        # The boot clock when the end was stamped with it (endclock.py); the wall
        # clock otherwise, capped at the backoff's own size: a clock stepped back
        # a day made `backoff_s = 5` wait 86402 s.
        elapsed = seconds_since_end(reg, chain[0].id)
        if elapsed is None:
            elapsed = now - (chain[0].ended or chain[0].created)
        reason = ("out of memory" if oom else f"{st.status}") + f", restart {restarts + 1}"
        out.append(Decision(st.name, st.run_id, reason, bool(halvable), min(backoff, max(0.0, backoff - elapsed))))
    return out


def _alive_lost(reg: Registry, run_id: int) -> bool:
    from eagle3_console import runs
    return runs.stage_alive(reg.get(run_id))


def apply(ws: Workspace, snap: Snapshot, say: Callable[[str], None], nvml: Any = None,
          pipe: cfg.Pipeline | None = None) -> list[str]:
    """One policy pass; returns what it did. `pipe`: the pipeline file as this pass read it."""
    pipe = pipe or cfg.load(ws.config_path)
    done = []
    with Registry(ws.db_path) as reg:
        decisions = decide(pipe, snap, reg, time.time())
    for d in decisions:
        if d.wait_s > 0:
            say(f"{d.stage}: run {d.run_id} {d.reason}: backoff, {d.wait_s:.0f} s left")
            continue
        kill = actions.plan_kill(ws, d.stage, nvml=nvml)
        if not kill.refusal:
            say(f"{d.stage}: killing leftover workers first")
            for line in kill.lines():
                say("  " + line)
            actions.execute_kill(ws, kill, progress=lambda m: say("  " + m), nvml=nvml)
        # A refusal (params the op no longer takes, a run started meanwhile) is said and
        # recorded; raised, it would end every cron pass with a traceback and skip other stages.
        try:
            plan = actions.plan_restart(ws, d.stage, snap.stage(d.stage), halve_batch=d.halve, force=True, nvml=nvml, pipe=pipe)
            if plan.refusal:
                raise runs.Refused(plan.refusal, kind=plan.refusal_kind)
            run = actions.execute_restart(ws, plan, nvml=nvml, pipe=pipe)
        except runs.Refused as exc:
            say(f"{d.stage}: not restarted: {exc}")
            # A short fixed outcome (what `events` sorts and folds by); the words are the detail.
            with Registry(ws.db_path) as reg:
                reg.record("watch-restart", f"refused: {exc.kind}" if exc.kind else "refused", stage=d.stage,
                           run_id=d.run_id, detail=str(exc), actor="watch")
            continue
        halved = f" with {plan.halved[0]} {plan.halved[1]} -> {plan.halved[2]}" if plan.halved else ""
        msg = f"{d.stage}: run {d.run_id} {d.reason}: restarted as run {run.id}{halved}"
        say(msg)
        with Registry(ws.db_path) as reg:
            reg.record("watch-restart", "started", stage=d.stage, run_id=run.id, targets=plan.argv,
                       detail=msg, actor="watch")
        done.append(msg)
    return done


def ready(pipe: cfg.Pipeline, snap: Snapshot) -> list[str]:
    """Stages that never ran (or are stale) and whose dependencies are all done, in pipeline order."""
    status = {s.name: s.status for s in snap.stages}
    done = {s.name for s in snap.stages if s.done}
    return [name for name in pipe.order()
            if status.get(name) in tuple(StageOnly)      # stale: its outputs no longer follow its inputs
            and all(dep in done for dep in pipe.stages[name].depends_on)]


def advance(ws: Workspace, snap: Snapshot, say: Callable[[str], None],
            pipe: cfg.Pipeline | None = None) -> list[str]:
    """Start the stages that are ready (`watch --advance`): the pipeline runs itself."""
    pipe = pipe or cfg.load(ws.config_path)
    done = []
    seen = {st.run_id: st.serve for st in snap.stages if st.serve is not None and st.run_id is not None}
    for name in ready(pipe, snap):
        try:
            run = runs.launch(ws, pipe, name, reason="advance", serve_states=seen)
        except runs.Refused as exc:
            say(f"{name}: not started: {exc}")
            continue
        serves = [d for d in pipe.stages[name].depends_on if runs.serves(pipe.stages[d])]
        why = f"dependencies done (server ready: {', '.join(serves)})" if serves else "dependencies succeeded"
        msg = f"{name}: {why}; started run {run.id}"
        say(msg)
        done.append(msg)
    return done


def restart_pending(ws: Workspace, snap: Snapshot, pipe: cfg.Pipeline | None = None) -> bool:
    """A failed stage the restart policy will start again (its backoff not over yet):
    for `--until-done` the pipeline has not settled, whatever `settled` reads."""
    pipe = pipe or cfg.load(ws.config_path)
    with Registry(ws.db_path) as reg:
        return bool(decide(pipe, snap, reg, time.time()))


def settled(snap: Snapshot) -> bool:
    """Nothing runs and nothing more will start: all succeeded, or a failure blocks the rest."""
    # A lost run whose processes live is still running, whatever its supervisor did.
    # A ready server serves until stopped: it is done for its dependents, not a run to wait for.
    if any((s.status in ACTIVE or (s.status == RunStatus.LOST and s.alive)) and not s.done
           for s in snap.stages):
        return False
    if all(s.done for s in snap.stages):
        return True
    done = {s.name for s in snap.stages if s.done}
    startable = [s for s in snap.stages if s.status in tuple(StageOnly) and all(d in done for d in s.depends_on)]
    return not startable and any(s.status in (RunStatus.FAILED, RunStatus.KILLED, RunStatus.LOST) and not s.done for s in snap.stages)


def start_driver(ws: Workspace, interval_s: float = 1.0) -> int:
    """`watch --advance --until-done` detached (new session, its own log), so the
    pipeline advances after the console or the SSH session is gone."""
    ws.ensure_state()
    log = open(ws.logs_dir / "watch.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "eagle3_console.cli", "-w", str(ws.root), "watch", "--advance",
                             "--until-done", "--interval", str(interval_s)],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=str(ws.root))
    log.close()
    return proc.pid
