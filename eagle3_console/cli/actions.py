"""The action commands (kill-workers, clean, restart: a plan printed, done
only with --yes), watch (the policies acting on their own) and the
Prometheus exporter. commands.py registers them on the typer app; this
module does not import it.

Data flow: ctx.py (the workspace, the snapshot) -> actions / policy /
exporter -> the terminal. A refusal is raised (exit.py says it).
"""

from __future__ import annotations

from datetime import datetime
from typing import Callable, TypeVar

import typer

from eagle3_console.cli import opts
from eagle3_console.kernel import config as cfg
from eagle3_console.cli.exit import EXIT_CRITICAL, EXIT_OK, CommandError
from eagle3_console.cli.ctx import collect, ctx_of
from eagle3_console.cli.out import Unwritable, out, say, warn

T = TypeVar("T")


def _show(lines: list[str]) -> None:
    for line in lines:
        say(line)


def _interruptible(c, action: str, stage: str, run_id, what: str, done, act: Callable[[], T]) -> T:
    """act() recorded before it starts; SIGTERM/SIGINT/SIGHUP mid-way: recorded, said, exit 128 + N."""
    from eagle3_console.actions.interrupted import Interrupted, recorded
    try:
        return recorded(c.ws, action, stage, run_id, what, done, act)
    except Interrupted as exc:
        warn(exc.said)
        raise typer.Exit(exc.code) from None


def _go_ahead(plan, yes: bool) -> bool:
    """Print the plan; exit 2 on a refusal, 0 when there is nothing to do; act only with --yes."""
    _show(plan.lines())
    if plan.refusal:
        raise typer.Exit(EXIT_OK if getattr(plan, "nothing_to_do", False) else EXIT_CRITICAL)
    if not yes:
        out.print("dry run: pass --yes to do this")
    return yes


def kill_workers(ctx: typer.Context, stage: str,
                 yes: bool = typer.Option(False, "--yes", help="Act; without it only the plan is printed."),
                 grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL.",
                                             callback=opts.seconds()),
                 wait: float = typer.Option(60.0, "--wait", help="Seconds to wait for GPU memory to come back.",
                                            callback=opts.seconds())) -> None:
    """Kill every process of STAGE's run and every GPU process tied to it; prove the memory came back."""
    from eagle3_console import actions
    c = ctx_of(ctx)
    c.stage_or_live(stage)
    plan = actions.plan_kill(c.ws, stage, grace_s=grace)
    if not _go_ahead(plan, yes):
        return
    from eagle3_console.actions.interrupted import procs_gone
    result = _interruptible(c, "kill-workers", stage, plan.run_ids[-1] if plan.run_ids else None,
                            f"{len(plan.procs)} process(es): {', '.join(str(p.pid) for p in plan.procs[:50])}",
                            procs_gone(plan.procs),
                            lambda: actions.execute_kill(c.ws, plan, progress=say, release_timeout_s=wait))
    raise typer.Exit(EXIT_OK if result.ok else EXIT_CRITICAL)


def clean(ctx: typer.Context, stage: str,
          yes: bool = typer.Option(False, "--yes", help="Move the partial files to .eagle3/trash/."),
          purge: bool = typer.Option(False, "--purge", help="Delete instead of moving to the trash (with --yes).")) -> None:
    """Remove partial outputs of a failed or killed run (never a complete one)."""
    from eagle3_console import actions
    c = ctx_of(ctx)
    c.stage(stage)
    plan = actions.plan_clean(c.ws, stage, purge=purge, pipe=c.pipeline())
    if not _go_ahead(plan, yes):
        return
    from eagle3_console.actions.interrupted import files_gone
    verb = "deleted" if purge else "moved to the trash"

    def clean_and_say():
        # Said inside: a signal while the result is printed is recorded too, not typer's silent 130.
        result = actions.execute_clean(c.ws, plan)
        _show(result.lines())
        return result
    result = _interruptible(c, "clean", stage, None, f"{len(plan.files):,} partial file(s) to be {verb}",
                            files_gone([str(p) for p, _s in plan.files], verb), clean_and_say)
    raise typer.Exit(EXIT_OK if not result.failed else EXIT_CRITICAL)


def restart(ctx: typer.Context, stage: str,
            set_: list[str] = typer.Option([], "--set", help="Param override name=value (repeatable)."),
            kill: bool = typer.Option(False, "--kill", help="Kill the live run first (through kill-workers)."),
            halve: bool = typer.Option(False, "--halve-batch", help="After an OOM, halve the stage's batch_param."),
            force: bool = typer.Option(False, "--force", help="Skip the dependency check (and the op's lint errors)."),
            ignore_disk: bool = typer.Option(False, "--ignore-disk", help="Start even if the disk estimate exceeds the free space."),
            yes: bool = typer.Option(False, "--yes", help="Act; without it only the plan is printed.")) -> None:
    """A new run with the last run's params plus overrides, linked to it."""
    from eagle3_console import actions
    c = ctx_of(ctx)
    if c.stage_or_live(stage) is None:
        _restart_removed(c, stage, kill, yes)
    pipe = c.pipeline()
    # The snapshot's out-of-memory finding decides the halving, as it does for watch and the TUI.
    seen = collect(c, no_gpus=True, pipe=pipe).stage(stage)
    plan = actions.plan_restart(c.ws, stage, seen, cfg.parse_overrides(set_), kill=kill, halve_batch=halve,
                               force=force, ignore_disk=ignore_disk, pipe=pipe)
    if not _go_ahead(plan, yes):
        return
    r = actions.execute_restart(c.ws, plan, progress=say, pipe=pipe)
    out.print(f"run {r.id} of {stage}: {r.status} (restart of {r.restart_of})", highlight=False)


def _restart_removed(c, stage: str, kill: bool, yes: bool) -> None:
    """restart of a stage removed from the pipeline file while its run lives:
    with --kill its run is killed (as kill-workers does); it is never started
    again, since eagle3.toml no longer says how (exit 3)."""
    from eagle3_console import actions
    from eagle3_console.kernel.refused import Refused
    gone = f"stage {stage!r} is no longer in {c.ws.config_path}"
    if not kill:
        raise Refused(f"{gone}; its run still lives: stop it (`stop {stage}`, or `restart {stage} --kill`)", code=3)
    plan = actions.plan_kill(c.ws, stage)
    if not _go_ahead(plan, yes):
        raise typer.Exit(EXIT_OK)
    result = actions.execute_kill(c.ws, plan, progress=say)
    if not result.ok:
        raise typer.Exit(EXIT_CRITICAL)
    raise Refused(f"{gone}: its run was killed and is not restarted", code=3)


def watch(ctx: typer.Context,
          once: bool = typer.Option(False, "--once", help="One pass, then exit with the status code."),
          interval: float = typer.Option(30.0, "--interval", help="Seconds between passes.",
                                         callback=opts.seconds(opts.MIN_INTERVAL_S)),
          no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML: no GPU view, GPU memory not checked."),
          advance: bool = typer.Option(False, "--advance", help="Also start each stage that never ran (or is stale) once its dependencies are done."),
          until_done: bool = typer.Option(False, "--until-done", help="Exit once every stage succeeded (or nothing more can start).")) -> None:
    """Apply the policies (restart with backoff, halve the batch after an OOM) under an exclusive lock.

    Exit (with --once): the status code, 0-3; 75 when another watch holds .eagle3/watch.lock."""
    from eagle3_console.cli import watchloop
    c = ctx_of(ctx)
    if once or not c.ws.config_path.exists():
        # cron's one pass, or no pipeline file at all (a typo in -w): said at once, exit 3. A long
        # watch whose file is invalid from the start retries each pass, as when it turns invalid later.
        c.pipeline()
    lost: list[Unwritable] = []

    def tell(m: str) -> None:
        # A line that cannot be written (the cron log's disk full) never stops a pass
        # half-way: what it did is recorded in the registry's events all the same.
        try:
            out.print(f"{datetime.now():%H:%M:%S} {m}", highlight=False, markup=False)
        except Unwritable as exc:
            lost.append(exc)

    # Another watch holding the lock raises policy.LockHeld: exit 75 (exit.py).
    code = watchloop.run(c, watchloop.Options(once=once, interval_s=interval, no_gpus=no_gpus, advance=advance,
                                              until_done=until_done), tell)
    if lost:
        raise CommandError(f"{lost[0]} ({len(lost)} line(s) lost; the pass's actions are in `events`)")
    raise typer.Exit(code)


# ------------------------------------------------------------------ exporter
EXPORTER_PORT = 9457   # not nvitop-exporter's 8000 / 5050, dcgm-exporter's 9400, node_exporter's 9100


def exporter(ctx: typer.Context,
             port: int = typer.Option(EXPORTER_PORT, "--port", help="TCP port (0: any free one, printed).",
                                      callback=opts.integer(0, 65535, "a TCP port")),
             host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
             interval: float = typer.Option(5.0, "--interval", help="Seconds between snapshots (scrapes read the last one).",
                                           callback=opts.seconds(opts.MIN_INTERVAL_S)),
             no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML."),
             request_timeout: float = typer.Option(5.0, "--request-timeout",
                                                   help="Seconds a connection has from its acceptance to send its "
                                                        "whole request head (slower ones are closed).",
                                                   callback=opts.seconds(0.0, above=True))) -> None:
    """Serve the snapshot as Prometheus metrics on http://HOST:PORT/metrics."""
    from eagle3_console.observe import exporter as exp
    from eagle3_console.observe.snapshot import Collector
    c = ctx_of(ctx)
    c.pipeline()
    col = Collector(c.ws, gpus=not no_gpus, curves=False)
    try:
        code = exp.serve(col.collect, host, port, interval, request_timeout_s=request_timeout,
                         say=lambda m: out.print(m, highlight=False, markup=False, soft_wrap=True))
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    finally:
        col.close()
    raise typer.Exit(code)


