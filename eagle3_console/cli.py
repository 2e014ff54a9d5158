"""The headless commands (typer). The bare command opens the TUI.

Data flow: cli -> config / runs / actions / snapshot. This module must never
import textual or torch at import time: `status --json` runs from cron.
Exit codes: 0 OK, 1 WARNING, 2 CRITICAL or refused, 3 UNKNOWN / bad input,
75 another `watch` holds the lock.
"""

from __future__ import annotations

import json
import sqlite3
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from eagle3_console import config as cfg
from eagle3_console.registry import Registry, StateError, id_path
from eagle3_console.workspace import ENV_WORKSPACE, Workspace

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN, EXIT_LOCKED = 0, 1, 2, 3, 75

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  help="Operations console for training EAGLE-3 drafters. No command: open the console (TUI).")
# soft_wrap: plans list paths that must stay greppable, never folded.
# Piped (cron, grep) output is not folded to 80 columns.
_PIPE_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160


class _LazyConsole:
    """A rich Console made on first use: `status --json` (cron, every minute)
    prints with print() and never pays rich's import."""

    def __init__(self, **kwargs: object) -> None:
        self._kwargs = kwargs
        self._console = None

    def __getattr__(self, name: str):
        if self._console is None:
            from rich.console import Console
            self._console = Console(**self._kwargs)
        return getattr(self._console, name)


out = _LazyConsole(soft_wrap=True, width=_PIPE_WIDTH)
err = _LazyConsole(stderr=True, soft_wrap=True, width=_PIPE_WIDTH)


# The workspace of this invocation, for main()'s last-resort error line.
_WORKSPACE: list[Optional[Workspace]] = [None]


class Ctx:
    def __init__(self, workspace: Optional[Path]):
        self.ws = Workspace.at(workspace)
        _WORKSPACE[0] = self.ws

    def pipeline(self) -> cfg.Pipeline:
        try:
            return cfg.load(self.ws.config_path)
        except cfg.ConfigError as exc:
            err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
            raise typer.Exit(EXIT_UNKNOWN)

    def stage(self, name: str) -> cfg.Stage:
        # An unknown stage is bad input (exit 3), not a crash with a traceback.
        pipe = self.pipeline()
        try:
            return pipe.stage(name)
        except cfg.ConfigError as exc:
            err.print(f"error: {exc}", highlight=False, markup=False)
            raise typer.Exit(EXIT_UNKNOWN)


def _ctx(ctx: typer.Context) -> Ctx:
    return ctx.obj


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    workspace: Optional[Path] = typer.Option(None, "--workspace", "-w", envvar=ENV_WORKSPACE,
                                             help="Workspace folder (default: the current directory)."),
    readonly: bool = typer.Option(False, "--readonly", help="TUI: hide every destructive action."),
) -> None:
    ctx.obj = Ctx(workspace)
    if ctx.invoked_subcommand is None:
        _open_tui(ctx.obj, readonly)


def _open_tui(c: Ctx, readonly: bool) -> None:
    c.pipeline()
    try:
        from eagle3_console.app import run_app
    except ImportError as exc:
        err.print(f"error: the console (TUI) is not available: {exc}")
        raise typer.Exit(EXIT_UNKNOWN)
    raise typer.Exit(run_app(c.ws, readonly=readonly))


@app.command()
def tui(ctx: typer.Context, readonly: bool = typer.Option(False, "--readonly", help="Hide destructive actions.")) -> None:
    """Open the console on the workspace."""
    _open_tui(_ctx(ctx), readonly)


@app.command()
def init(ctx: typer.Context, directory: Optional[Path] = typer.Argument(None, help="Folder to create the workspace in.")) -> None:
    """Write a commented eagle3.toml template (never overwrites one)."""
    ws = Workspace.at(directory) if directory else _ctx(ctx).ws
    ws.root.mkdir(parents=True, exist_ok=True)
    if ws.config_path.exists():
        err.print(f"error: {ws.config_path} exists; not overwriting it")
        raise typer.Exit(EXIT_CRITICAL)
    template = (Path(__file__).parent / "template.toml").read_text()
    ws.config_path.write_text(template)
    ws.ensure_state()
    out.print(f"wrote {ws.config_path}\nedit it, then: eagle3-console -w {ws.root} status")


def _refused(exc: Exception, code: int = EXIT_CRITICAL) -> typer.Exit:
    code = getattr(exc, "code", code)
    # Exit 3 is bad input (README): an error to fix, not a refusal to do something;
    # exit 0 is "nothing to do" (what was asked for already holds).
    word = {EXIT_UNKNOWN: "error", EXIT_OK: "nothing to do"}.get(code, "refused")
    (out if code == EXIT_OK else err).print(f"{word}: {exc}", highlight=False, markup=False)
    return typer.Exit(code)


@app.command()
def run(ctx: typer.Context, stage: str,
        set_: list[str] = typer.Option([], "--set", help="Param override name=value (repeatable)."),
        force: bool = typer.Option(False, "--force", help="Start even if dependencies have not succeeded or the disk looks short.")) -> None:
    """Start STAGE as a supervised run that survives this terminal."""
    from eagle3_console import runs
    c = _ctx(ctx)
    pipe = c.pipeline()
    try:
        overrides = cfg.parse_overrides(set_)
        st = pipe.stage(stage)
        for x in runs.lints(c.ws, pipe, st, runs.stage_params(st, overrides)):
            err.print(f"lint {x}", highlight=False, markup=False)
        r = runs.launch(c.ws, pipe, stage, overrides, force=force)
    except cfg.ConfigError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    except runs.Refused as exc:
        raise _refused(exc)
    out.print(f"run {r.id} of {stage}: {r.status}, pid {r.pid}, log {r.log_path}", highlight=False)


@app.command()
def stop(ctx: typer.Context, stage: str,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL.")) -> None:
    """SIGTERM the stage's process group, SIGKILL after the grace period."""
    from eagle3_console import runs
    c = _ctx(ctx)
    c.stage(stage)
    try:
        r = runs.stop(c.ws, stage, grace_s=grace)
    except runs.Refused as exc:
        raise _refused(exc)
    out.print(f"run {r.id} of {stage}: {r.status}", highlight=False)


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%m-%d %H:%M:%S") if t else "-"


def _ended(r) -> str:
    if r.signal:
        import signal as _signal
        return f"signal {_signal.Signals(r.signal).name}"
    return "-" if r.exit_code is None else str(r.exit_code)


@app.command("runs")
def runs_cmd(ctx: typer.Context, stage: Optional[str] = typer.Argument(None),
             limit: int = typer.Option(20, "-n", help="How many runs."),
             as_json: bool = typer.Option(False, "--json")) -> None:
    """Run history, newest first."""
    from eagle3_console import runs
    c = _ctx(ctx)
    if not c.ws.db_path.exists() and not id_path(c.ws.db_path).exists():
        rows = []
    else:
        with Registry(c.ws.db_path) as reg:
            runs.reconcile(reg)
            rows = reg.runs(stage, limit)
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
        out.print("argv of each run: `runs --json`", highlight=False, markup=False)


@app.command()
def logs(ctx: typer.Context, stage: str,
         follow: bool = typer.Option(False, "-f", "--follow",
                                     help="Keep printing new lines (like tail -F) until the run ends."),
         lines: int = typer.Option(50, "-n", help="Lines from the end."),
         run_id: Optional[int] = typer.Option(None, "--run", help="A run id (default: the latest).")) -> None:
    """Print the tail of a stage's log."""
    from eagle3_console.logtail import follow as follow_log, run_ended, tail
    c = _ctx(ctx)
    with Registry(c.ws.db_path) as reg:
        try:
            r = reg.get(run_id) if run_id else reg.latest(stage)
        except KeyError:
            err.print(f"error: there is no run {run_id} in {c.ws.db_path}", highlight=False, markup=False)
            raise typer.Exit(EXIT_UNKNOWN)
    if r is None:
        # A recorded run's log is shown even when the pipeline file changed or broke since;
        # with none, an unknown stage is bad input (exit 3), not "no runs yet".
        c.stage(stage)
        err.print(f"error: stage {stage!r} has no runs yet")
        raise typer.Exit(EXIT_CRITICAL)
    path = Path(r.log_path)
    shown, upto = tail(path, lines)
    for line in shown:
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if follow:
        try:
            follow_log(path, sys.stdout, run_ended(c.ws.db_path, r.id), start=upto)
        except KeyboardInterrupt:
            pass



@app.command()
def demo(ctx: typer.Context, directory: Path = typer.Argument(Path("demo-workspace"), help="Where to build it."),
         no_open: bool = typer.Option(False, "--no-open", help="Build only; do not open the console."),
         run_all: bool = typer.Option(False, "--run", help="Start the whole pipeline, each stage when its dependencies succeed.")) -> None:
    """Build the demo workspace (synthetic corpus, tiny target; cached) and open the console on it."""
    from eagle3_console.demo import write_demo_workspace
    ws = Workspace.at(directory)
    t0 = time.time()
    try:
        config, assets = write_demo_workspace(ws.root, log=lambda m: out.print(m, highlight=False, markup=False))
    except Exception as exc:   # a broken build must say what broke, not open an empty console
        err.print(f"error: building the demo workspace failed: {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    how = "cached" if assets.get("cached") else f"built in {time.time() - t0:.0f} s"
    out.print(f"demo workspace {ws.root} ({how}); pipeline: {config}", highlight=False)
    ws.ensure_state()
    if run_all:
        from eagle3_console.policy import start_driver
        pid = start_driver(ws)
        out.print(f"pipeline driver started (pid {pid}): stages start as their dependencies succeed", highlight=False)
    if no_open:
        out.print(f"open it with: eagle3-console -w {ws.root}", highlight=False)
        return
    ctx.obj = Ctx(ws.root)
    _open_tui(ctx.obj, readonly=False)

# ------------------------------------------------------------------ status
def _collect(c: Ctx, no_gpus: bool = False):
    from eagle3_console.snapshot import Collector
    c.pipeline()
    try:
        col = Collector(c.ws, persist=True, gpus=not no_gpus)
        try:
            return col.collect()
        finally:
            col.close()
    except cfg.ConfigError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    except sqlite3.Error as exc:
        err.print(f"error: state database {c.ws.db_path} is unreadable: {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)


@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="One JSON object (schema in README)."),
           no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML.")) -> None:
    """Stages, GPUs, disk and alerts. Exit: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
    snap = _collect(_ctx(ctx), no_gpus)
    if as_json:
        print(json.dumps(snap.to_dict(), indent=2, default=str))
    else:
        from eagle3_console.report import print_status
        print_status(out, snap)
    raise typer.Exit(snap.exit_code)


# ------------------------------------------------------------------ actions
def _show(lines: list[str]) -> None:
    for line in lines:
        out.print(line, highlight=False, markup=False)


def _go_ahead(plan, yes: bool) -> bool:
    """Print the plan; exit 2 on a refusal, 0 when there is nothing to do; act only with --yes."""
    _show(plan.lines())
    if plan.refusal:
        raise typer.Exit(EXIT_OK if getattr(plan, "nothing_to_do", False) else EXIT_CRITICAL)
    if not yes:
        out.print("dry run: pass --yes to do this")
    return yes


@app.command("kill-workers")
def kill_workers(ctx: typer.Context, stage: str,
                 yes: bool = typer.Option(False, "--yes", help="Act; without it only the plan is printed."),
                 grace: float = typer.Option(10.0, "--grace"),
                 wait: float = typer.Option(60.0, "--wait", help="Seconds to wait for GPU memory to come back.")) -> None:
    """Kill every process of STAGE's run and every GPU process tied to it; prove the memory came back."""
    from eagle3_console import actions
    c = _ctx(ctx)
    c.stage(stage)
    plan = actions.plan_kill(c.ws, stage, grace_s=grace)
    if not _go_ahead(plan, yes):
        return
    result = actions.execute_kill(c.ws, plan, progress=lambda m: out.print(m, highlight=False, markup=False),
                                  release_timeout_s=wait)
    raise typer.Exit(EXIT_OK if result.ok else EXIT_CRITICAL)


@app.command()
def clean(ctx: typer.Context, stage: str,
          yes: bool = typer.Option(False, "--yes", help="Move the partial files to .eagle3/trash/."),
          purge: bool = typer.Option(False, "--purge", help="Delete instead of moving to the trash (with --yes).")) -> None:
    """Remove partial outputs of a failed or killed run (never a complete one)."""
    from eagle3_console import actions, runs
    c = _ctx(ctx)
    c.stage(stage)
    plan = actions.plan_clean(c.ws, stage, purge=purge)
    if not _go_ahead(plan, yes):
        return
    try:
        result = actions.execute_clean(c.ws, plan)
    except runs.Refused as exc:
        raise _refused(exc)
    _show(result.lines())
    raise typer.Exit(EXIT_OK if not result.failed else EXIT_CRITICAL)


@app.command()
def restart(ctx: typer.Context, stage: str,
            set_: list[str] = typer.Option([], "--set", help="Param override name=value (repeatable)."),
            kill: bool = typer.Option(False, "--kill", help="Kill the live run first (through kill-workers)."),
            halve: bool = typer.Option(False, "--halve-batch", help="After an OOM, halve the stage's batch_param."),
            force: bool = typer.Option(False, "--force", help="Skip the dependency and disk checks."),
            yes: bool = typer.Option(False, "--yes", help="Act; without it only the plan is printed.")) -> None:
    """A new run with the last run's params plus overrides, linked to it."""
    from eagle3_console import actions, runs
    c = _ctx(ctx)
    c.stage(stage)
    try:
        plan = actions.plan_restart(c.ws, stage, cfg.parse_overrides(set_), kill=kill, halve_batch=halve, force=force)
    except (cfg.ConfigError, runs.Refused) as exc:
        raise _refused(exc, EXIT_UNKNOWN)
    if not _go_ahead(plan, yes):
        return
    try:
        r = actions.execute_restart(c.ws, plan, progress=lambda m: out.print(m, highlight=False, markup=False))
    except runs.Refused as exc:
        raise _refused(exc)
    out.print(f"run {r.id} of {stage}: {r.status} (restart of {r.restart_of})", highlight=False)


@app.command()
def watch(ctx: typer.Context,
          once: bool = typer.Option(False, "--once", help="One pass, then exit with the status code."),
          interval: float = typer.Option(30.0, "--interval", help="Seconds between passes."),
          no_gpus: bool = typer.Option(False, "--no-gpus"),
          advance: bool = typer.Option(False, "--advance", help="Also start each stage that never ran (or is stale) once its dependencies are done."),
          until_done: bool = typer.Option(False, "--until-done", help="Exit once every stage succeeded (or nothing more can start).")) -> None:
    """Apply the policies (restart with backoff, halve the batch after an OOM) under an exclusive lock."""
    from eagle3_console import policy
    c = _ctx(ctx)
    c.pipeline()
    say = lambda m: out.print(f"{datetime.now():%H:%M:%S} {m}", highlight=False, markup=False)  # noqa: E731
    try:
        with policy.WatchLock(c.ws):
            while True:
                snap = _collect(c, no_gpus)
                acted = policy.apply(c.ws, snap, say)
                if advance:
                    acted += policy.advance(c.ws, snap, say)
                if acted:
                    snap = _collect(c, no_gpus)
                for a in snap.alerts:
                    say(f"{a.level.upper()}: {a.message}")
                if once:
                    raise typer.Exit(snap.exit_code)
                if until_done and policy.settled(snap):
                    say("pipeline settled: " + ", ".join(f"{s.name} {s.status}" for s in snap.stages))
                    raise typer.Exit(snap.exit_code)
                time.sleep(interval)
    except policy.LockHeld as exc:
        err.print(str(exc), highlight=False, markup=False)
        raise typer.Exit(EXIT_LOCKED)


# ------------------------------------------------------------------ exporter
EXPORTER_PORT = 9457   # not nvitop-exporter's 8000 / 5050, dcgm-exporter's 9400, node_exporter's 9100


@app.command()
def exporter(ctx: typer.Context,
             port: int = typer.Option(EXPORTER_PORT, "--port", help="TCP port (0: any free one, printed)."),
             host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0: every interface)."),
             interval: float = typer.Option(5.0, "--interval", help="Seconds between snapshots (scrapes read the last one)."),
             no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML.")) -> None:
    """Serve the snapshot as Prometheus metrics on http://HOST:PORT/metrics."""
    from eagle3_console import exporter as exp
    from eagle3_console.snapshot import Collector
    c = _ctx(ctx)
    c.pipeline()
    if interval <= 0:
        err.print(f"error: --interval {interval}: must be > 0", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    col = Collector(c.ws, gpus=not no_gpus, curves=False)
    try:
        code = exp.serve(col.collect, host, port, interval,
                         say=lambda m: out.print(m, highlight=False, markup=False, soft_wrap=True))
    except OSError as exc:
        err.print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    finally:
        col.close()
    raise typer.Exit(code)


WORKSPACE_FLAGS = ("-w", "--workspace")


def hoist_workspace(argv: list[str]) -> list[str]:
    """`status -w DIR` as well as `-w DIR status`: click binds an option to the
    level it is declared on (the group), and operators type it after the
    command. Moves a `-w/--workspace` given after the command in front of it."""
    names = {c.name for c in app.registered_commands} | {c.callback.__name__.replace("_", "-")
                                                         for c in app.registered_commands if c.callback}
    try:
        at = next(i for i, a in enumerate(argv) if a in names)
    except StopIteration:
        return argv
    head, rest, moved = argv[:at + 1], [], []
    tail = argv[at + 1:]
    i = 0
    while i < len(tail):
        a = tail[i]
        if a == "--":
            rest += tail[i:]
            break
        if a in WORKSPACE_FLAGS and i + 1 < len(tail):
            moved += tail[i:i + 2]
            i += 2
            continue
        if a.startswith("--workspace="):
            moved.append(a)
        else:
            rest.append(a)
        i += 1
    return head[:at] + moved + head[at:] + rest


def _environment_error(exc: BaseException) -> str | None:
    """One line for a broken workspace (state database, state folder, pipeline
    file), or None for anything else (a bug: its traceback is wanted)."""
    ws = _WORKSPACE[0]
    if isinstance(exc, (StateError, cfg.ConfigError)):
        return str(exc)
    if isinstance(exc, sqlite3.Error):
        where = ws.db_path if ws else "the state database"
        return f"state database {where}: {exc}"
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return None


def main() -> None:
    try:
        app(args=hoist_workspace(sys.argv[1:]))
    except Exception as exc:
        # Exit 3 (UNKNOWN) is promised for a workspace that cannot be read; cron
        # reads a traceback's exit 1 as a mere WARNING.
        line = _environment_error(exc)
        if line is None:
            raise
        err.print(f"error: {line}", highlight=False, markup=False)
        sys.exit(EXIT_UNKNOWN)


if __name__ == "__main__":
    main()
