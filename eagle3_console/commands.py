"""The typer commands (cli.py is the entry point; the actions, watch and the
exporter are in cli_actions.py). The bare command opens the TUI.

This module must never import textual or torch at import time.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from eagle3_console import config as cfg
from eagle3_console import cliopts
from eagle3_console.cli import (EXIT_CRITICAL, EXIT_OK, EXIT_UNKNOWN, Ctx, collect, err, out,
                                status_json)
from eagle3_console.registry import Registry, id_path
from eagle3_console.workspace import ENV_WORKSPACE, Workspace

app = typer.Typer(cls=cliopts.BadInputIsExit3, add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  help="Operations console for training EAGLE-3 drafters. No command: open the console (TUI).")


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
        force: bool = typer.Option(False, "--force", help="Start even if dependencies are not done (or the op's lint finds errors)."),
        ignore_disk: bool = typer.Option(False, "--ignore-disk", help="Start even if the disk estimate exceeds the free space.")) -> None:
    """Start STAGE as a supervised run that survives this terminal."""
    from eagle3_console import plan, runs
    c = _ctx(ctx)
    pipe = c.pipeline()
    try:
        overrides = cfg.parse_overrides(set_)
        st = pipe.stage(stage)
        params = runs.stage_params(st, overrides, pipe=pipe)
        # The plan first, whatever is refused next (a missing dependency, the disk).
        for line in plan.launch_lines(c.ws, pipe, st, params):
            out.print(line, highlight=False, markup=False)
        for line in plan.rerun_warnings(c.ws, pipe, st):
            err.print(line, highlight=False, markup=False)
        for x in runs.lints(c.ws, pipe, st, params):
            err.print(f"lint {x}", highlight=False, markup=False)
        r = runs.launch(c.ws, pipe, stage, overrides, force=force, ignore_disk=ignore_disk)
    except cfg.ConfigError as exc:
        err.print(f"error: {exc}", highlight=False, markup=False)
        raise typer.Exit(EXIT_UNKNOWN)
    except runs.Refused as exc:
        raise _refused(exc)
    out.print(f"run {r.id} of {stage}: {r.status}, pid {r.pid}, log {r.log_path}", highlight=False)


@app.command()
def stop(ctx: typer.Context, stage: str,
         grace: float = typer.Option(10.0, "--grace", help="Seconds between SIGTERM and SIGKILL.",
                                     callback=cliopts.seconds())) -> None:
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
             limit: int = typer.Option(20, "-n", help="How many runs.", callback=cliopts.integer(1)),
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
         lines: int = typer.Option(50, "-n", help="Lines from the end.", callback=cliopts.integer(0)),
         run_id: Optional[int] = typer.Option(None, "--run", help="A run id (default: the latest).",
                                               callback=cliopts.integer(1, cliopts.MAX_ID, "a run id"))) -> None:
    """Print the tail of a stage's log."""
    from eagle3_console.logtail import follow as follow_log, gone_message, open_log, run_ended, tail
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
    opened = open_log(r)
    if opened is None and r.status != "pending":
        # Deleted or rotated away: saying nothing (exit 0) read as "the run printed nothing".
        err.print(f"error: {gone_message(r, path)}", highlight=False, markup=False)
        raise typer.Exit(EXIT_CRITICAL)
    fh, moved = opened or (None, None)
    if moved:
        err.print(f"note: {path} is gone; reading the file run {r.id} still writes: {moved}",
                  highlight=False, markup=False)
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
        return
    with Registry(c.ws.db_path) as reg:
        # Like the run's own exit: a failed, killed or lost run is no 0 for a script waiting on it.
        raise typer.Exit(EXIT_OK if reg.get(r.id).status == "succeeded" else EXIT_CRITICAL)



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
@app.command()
def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="One JSON object (schema in README)."),
           no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML.")) -> None:
    """Stages, GPUs, disk and alerts. Exit: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
    if as_json:
        # cli.py answers most of these calls without typer, through the same function.
        raise typer.Exit(status_json(_ctx(ctx), no_gpus))
    snap = collect(_ctx(ctx), no_gpus)
    from eagle3_console.report import print_status
    print_status(out, snap)
    raise typer.Exit(snap.exit_code)



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


# The action commands and the exporter register themselves on `app`.
from eagle3_console import cli_actions  # noqa: E402,F401
