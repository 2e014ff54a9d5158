"""The headless commands (typer). The bare command opens the TUI.

Data flow: cli -> config / runs / actions / snapshot. This module must never
import textual or torch at import time: `status --json` runs from cron.
Exit codes: 0 OK, 1 WARNING, 2 CRITICAL or refused, 3 UNKNOWN / bad input,
75 another `watch` holds the lock.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from eagle3_console import config as cfg
from eagle3_console.registry import Registry
from eagle3_console.workspace import ENV_WORKSPACE, Workspace

EXIT_OK, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNKNOWN, EXIT_LOCKED = 0, 1, 2, 3, 75

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  help="Operations console for training EAGLE-3 drafters. No command: open the console (TUI).")
out = Console()
err = Console(stderr=True)


class Ctx:
    def __init__(self, workspace: Optional[Path]):
        self.ws = Workspace.at(workspace)

    def pipeline(self) -> cfg.Pipeline:
        try:
            return cfg.load(self.ws.config_path)
        except cfg.ConfigError as exc:
            err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
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
    err.print(f"refused: {exc}", highlight=False, markup=False)
    return typer.Exit(getattr(exc, "code", code))


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
    c.pipeline().stage(stage)
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
    if not c.ws.db_path.exists():
        rows = []
    else:
        with Registry(c.ws.db_path) as reg:
            runs.reconcile(reg)
            rows = reg.runs(stage, limit)
    if as_json:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
        return
    t = Table("run", "stage", "status", "pid", "started", "ended", "exit", "restart of", "reason", "argv")
    for r in rows:
        t.add_row(str(r.id), r.stage, r.status, str(r.pid or "-"), _when(r.started), _when(r.ended), _ended(r),
                  str(r.restart_of or "-"), r.reason or "", " ".join(r.argv)[-60:])
    out.print(t)


@app.command()
def logs(ctx: typer.Context, stage: str,
         follow: bool = typer.Option(False, "-f", "--follow", help="Keep printing new lines (like tail -F)."),
         lines: int = typer.Option(50, "-n", help="Lines from the end."),
         run_id: Optional[int] = typer.Option(None, "--run", help="A run id (default: the latest).")) -> None:
    """Print the tail of a stage's log."""
    from eagle3_console.logtail import follow_file, last_lines
    c = _ctx(ctx)
    with Registry(c.ws.db_path) as reg:
        r = reg.get(run_id) if run_id else reg.latest(stage)
    if r is None:
        err.print(f"error: stage {stage!r} has no runs yet")
        raise typer.Exit(EXIT_CRITICAL)
    path = Path(r.log_path)
    for line in last_lines(path, lines):
        sys.stdout.write(line + "\n")
    sys.stdout.flush()
    if follow:
        try:
            for chunk in follow_file(path):
                sys.stdout.write(chunk)
                sys.stdout.flush()
        except KeyboardInterrupt:
            pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
