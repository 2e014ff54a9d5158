"""The commands about runs: run and stop a stage, the run history (runs), a
run's log (logs) and the audit log of what was done to them (events).
commands.py registers them on the typer app; this module does not import it.

Data flow: ctx.py (the workspace) -> runs / registry / logtail -> the terminal.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

import typer

from eagle3_console.cli import opts
from eagle3_console.kernel import config as cfg
from eagle3_console.cli.exit import EXIT_CRITICAL, EXIT_OK, CommandError
from eagle3_console.cli.ctx import Ctx, ctx_of
from eagle3_console.cli.out import out, say, warn
from eagle3_console.kernel.registry import Registry, RunStatus, id_path


def run(ctx: typer.Context, stage: str,
        set_: list[str] = typer.Option([], "--set", help="Param override name=value (repeatable)."),
        force: bool = typer.Option(False, "--force", help="Start even if dependencies are not done (or the op's lint finds errors)."),
        ignore_disk: bool = typer.Option(False, "--ignore-disk", help="Start even if the disk estimate exceeds the free space."),
        dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan and the argv, and what would refuse "
                                                              "the launch now; launch nothing.")) -> None:
    """Start STAGE as a supervised run that survives this terminal."""
    from eagle3_console.runs import plan
    from eagle3_console import runs
    c = ctx_of(ctx)
    pipe = c.pipeline()
    pre = runs.prelaunch(c.ws, pipe, stage, cfg.parse_overrides(set_))
    # The plan first, whatever is refused next (a missing dependency, the disk).
    for line in plan.launch_lines(c.ws, pipe, pre.stage, pre.params, pre.preflight):
        say(line)
    for line in plan.rerun_warnings(c.ws, pipe, pre.stage):
        warn(line)
    for x in pre.lints:
        warn(f"lint {x}")
    if dry_run:
        argv, refusal = runs.dry_run(c.ws, pipe, pre, force=force, ignore_disk=ignore_disk)
        if argv is not None:
            say("argv: " + " ".join(argv))
        if refusal is not None:
            warn(f"would be refused now: {refusal}")
        out.print("dry run: nothing launched (without --dry-run, `run` starts it)", highlight=False)
        return
    r = runs.launch(c.ws, pipe, stage, force=force, ignore_disk=ignore_disk, pre=pre)
    if not r.live and r.started is None:
        # Ended before it ran (sbatch refused the job, the program cannot start): its cause, exit 2.
        # A run that started and already ended is a run like any other: its own status says how it went.
        out.print(f"run {r.id} of {stage}: {r.status}: {r.reason or 'no cause recorded'}; log {r.log_path}",
                  highlight=False, markup=False)
        raise typer.Exit(EXIT_CRITICAL)
    where = f"slurm job {r.job_id or '(being submitted)'}" if r.launcher == "slurm" else f"pid {r.pid}"
    out.print(f"run {r.id} of {stage}: {r.status}, {where}, log {r.log_path}", highlight=False)


def stop(ctx: typer.Context, stage: str,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL.",
                                     callback=opts.seconds())) -> None:
    """SIGTERM the stage's process group, SIGKILL after the grace period."""
    from eagle3_console import runs
    from eagle3_console.kernel.interrupts import Interrupted
    from eagle3_console.runs.stopper import Survivors
    c = ctx_of(ctx)
    c.stage_or_live(stage)
    try:
        r = runs.stop(c.ws, stage, grace_s=grace)
    except Survivors as exc:
        # The run ended, and not all of it: both said, exit 2.
        out.print(f"run {exc.run.id} of {stage}: {exc.run.status}", highlight=False)
        warn(f"warning: {exc}")
        raise typer.Exit(EXIT_CRITICAL) from None
    except Interrupted as exc:
        # Ctrl-C or a SIGTERM mid-grace: what was sent and what still runs, said and in the audit log.
        warn(exc.said)
        raise typer.Exit(exc.code) from None
    out.print(f"run {r.id} of {stage}: {r.status}", highlight=False)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M:%S") if t else "-"


def _ended(r) -> str:
    if r.signal:
        import signal as _signal
        return f"signal {_signal.Signals(r.signal).name}"
    return "-" if r.exit_code is None else str(r.exit_code)


def _read_registry(c: Ctx, read: Callable[[Registry], list]) -> list:
    """`read(registry)`, or nothing where the workspace never had a state
    database (opening one would create it, and a read never creates).
    A folder without a pipeline file is no workspace (a typo in -w): said, exit 3."""
    if not c.ws.config_path.exists():
        c.pipeline()
    if not (c.ws.db_path.exists() or id_path(c.ws.db_path).exists()):
        return []
    with Registry(c.ws.db_path) as reg:
        return read(reg)


def runs_cmd(ctx: typer.Context, stage: Optional[str] = typer.Argument(None),
             limit: int = typer.Option(20, "-n", help="How many runs.", callback=opts.integer(1)),
             as_json: bool = typer.Option(False, "--json", help="As JSON: each run's argv, params, env and pids.")) -> None:
    """Run history, newest first."""
    from eagle3_console import runs
    c = ctx_of(ctx)

    def read(reg: Registry) -> list:
        runs.reconcile(reg)
        return reg.runs(stage, limit)
    rows = _read_registry(c, read)
    if stage and not rows:
        # Recorded runs are listed even when the pipeline file changed since;
        # with none, an unknown stage is bad input (exit 3), as everywhere.
        c.stage(stage)
    if as_json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    from rich.table import Table
    t = Table("run", "stage", "status", "pid", "started", "ended", "exit", "restart of", "reason")
    for col in t.columns[:-1]:
        col.no_wrap = True
    for r in rows:
        t.add_row(str(r.id), r.stage, r.status, str(r.pid or "-"), _when(r.started), _when(r.ended), _ended(r),
                  str(r.restart_of or "-"), r.reason or "")
    out.print(t)
    if rows:
        say("argv of each run: `runs --json`")


def events(ctx: typer.Context,
           stage: Optional[str] = typer.Option(None, "--stage", help="Only this stage's events."),
           limit: int = typer.Option(50, "--limit", "-n", help="How many events (repeated refusals count once).",
                                     callback=opts.integer(1)),
           as_json: bool = typer.Option(False, "--json", help="As JSON: each entry with its targets, "
                                                                "repeats and first_time.")) -> None:
    """The audit log, newest first: who stopped, killed, cleaned or restarted what, and how it went."""
    from eagle3_console.kernel.eventlog import fold
    c = ctx_of(ctx)
    # Enough records that a run of identical refusals (a cron pass each) folds whole.
    rows = fold(_read_registry(c, lambda reg: reg.events(stage, min(limit * 50, 100_000))), limit)
    if stage and not rows:
        c.stage(stage)      # as `runs`: no event of an unknown stage is bad input (exit 3)
    if as_json:
        print(json.dumps([f.as_json() for f in rows], indent=2))
        return
    from rich.table import Table
    t = Table("time", "actor", "action", "stage", "run", "outcome", "times", "n targets", "detail")
    for col in t.columns[:8]:
        col.no_wrap = True
    t.columns[8].overflow = "fold"
    for f in rows:
        e = f.event
        times = f"{f.repeats} since {_when(f.first_time)[6:]}" if f.repeats > 1 else "1"
        t.add_row(_when(e.time), e.actor, e.action, e.stage or "-", str(e.run_id or "-"), e.outcome, times,
                  str(len(e.targets)) if e.targets else "-", e.detail or "")
    out.print(t)
    if rows:
        say("the targets of each event: `events --json`")


def logs(ctx: typer.Context, stage: str,
         follow: bool = typer.Option(False, "-f", "--follow",
                                     help="Keep printing new lines (like tail -F) until the run ends."),
         lines: int = typer.Option(50, "-n", help="Lines from the end.", callback=opts.integer(0)),
         run_id: Optional[int] = typer.Option(None, "--run", help="A run id (default: the latest).",
                                               callback=opts.integer(1, opts.MAX_ID, "a run id"))) -> None:
    """Print the tail of a stage's log."""
    from eagle3_console.cli.logtail import follow as follow_log, gone_message, open_log, run_ended, tail
    c = ctx_of(ctx)
    with Registry(c.ws.db_path) as reg:
        try:
            r = reg.get(run_id) if run_id else reg.latest(stage)
        except KeyError:
            raise CommandError(f"there is no run {run_id} in {c.ws.db_path}") from None
    if r is None:
        # A recorded run's log is shown even when the pipeline file changed or broke since;
        # with none, an unknown stage is bad input (exit 3), not "no runs yet".
        c.stage(stage)
        raise CommandError(f"stage {stage!r} has no runs yet", EXIT_CRITICAL)
    path = Path(r.log_path)
    opened = open_log(r)
    if opened is None and r.status != RunStatus.PENDING:
        # Deleted or rotated away: saying nothing (exit 0) read as "the run printed nothing".
        raise CommandError(gone_message(r, path), EXIT_CRITICAL)
    fh, moved = opened or (None, None)
    if moved:
        warn(f"note: {path} is gone; reading the file run {r.id} still writes: {moved}")
    # The tail and the follow read one open file: a move in between loses nothing.
    shown, upto = tail(Path(f"/proc/self/fd/{fh.fileno()}") if fh else path, lines)
    for line in shown:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if not follow:
        if fh:
            fh.close()
        return
    try:
        follow_log(path, sys.stdout, run_ended(c.ws.db_path, r.id), start=upto, first=fh)
    except KeyboardInterrupt:
        # Ctrl-C ends the follow, not the run: 130 as for any command a terminal interrupts,
        # never the 0 a script waiting on the run reads as "it succeeded".
        raise typer.Exit(130) from None
    with Registry(c.ws.db_path) as reg:
        # Like the run's own exit: a failed, killed or lost run is no 0 for a script waiting on it.
        raise typer.Exit(EXIT_OK if reg.get(r.id).status == RunStatus.SUCCEEDED else EXIT_CRITICAL)
