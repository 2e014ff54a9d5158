"""The typer app: the group (its -w/--workspace and --readonly), the commands
that open or set up a workspace, and every command registered in the order
`--help` lists them. Runs and their logs are cli/runs.py's, the actions,
watch and the exporter cli/actions.py's; neither imports this module.

Data flow: cli/__init__.py (the entry point) -> this app -> the command modules ->
ctx.py (the workspace, the snapshot) -> config / runs / actions / snapshot.
A command's failure is raised and said by exit.py through the group
(opts.ExitCodeGroup). This module must never import textual or torch at
import time.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer

from eagle3_console.cli import actions, args, opts, runs
from eagle3_console.cli.exit import EXIT_CRITICAL, CommandError
from eagle3_console.cli.ctx import Ctx, collect, ctx_of, status_json
from eagle3_console.cli.out import closed_pipe, out, reader_gone, say
from eagle3_console.kernel.workspace import ENV_WORKSPACE, Workspace

app = typer.Typer(cls=opts.ExitCodeGroup, add_completion=False, no_args_is_help=False, rich_markup_mode=None,
                  help="Operations console for training EAGLE-3 drafters. No command: open the console (TUI).\n\n"
                       "Exit codes: 0 OK (or nothing to do), 1 WARNING, 2 CRITICAL or refused, 3 UNKNOWN or bad "
                       "input, 75 another `watch` holds .eagle3/watch.lock, 128+N ended by signal N.")

WORKSPACE_FLAGS = args.WORKSPACE_FLAGS


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
        from eagle3_console.tui.app import run_app
    except ImportError as exc:
        raise CommandError(f"the console (TUI) is not available: {exc}") from None
    raise typer.Exit(run_app(c.ws, readonly=readonly))


def tui(ctx: typer.Context, readonly: bool = typer.Option(False, "--readonly", help="Hide destructive actions.")) -> None:
    """Open the console on the workspace."""
    _open_tui(ctx_of(ctx), readonly)


def init(ctx: typer.Context, directory: Optional[Path] = typer.Argument(None, help="Folder to create the workspace in.")) -> None:
    """Write a commented eagle3.toml template into DIRECTORY (default: the workspace, -w or the
    current directory), creating the folder; never overwrites one."""
    ws = Workspace.at(directory) if directory else ctx_of(ctx).ws
    ws.root.mkdir(parents=True, exist_ok=True)
    if ws.config_path.exists():
        raise CommandError(f"{ws.config_path} exists; not overwriting it", EXIT_CRITICAL)
    template = (Path(__file__).parents[1] / "template.toml").read_text()
    ws.config_path.write_text(template)
    ws.ensure_state()
    out.print(f"wrote {ws.config_path}\nedit it, then: eagle3-console -w {ws.root} status")


def demo(ctx: typer.Context, directory: Path = typer.Argument(Path("demo-workspace"), help="Where to build it."),
         no_open: bool = typer.Option(False, "--no-open", help="Build only; do not open the console."),
         run_all: bool = typer.Option(False, "--run", help="Start the whole pipeline, each stage when its dependencies succeed."),
         model: str = typer.Option("tiny", "--model", help="The target: tiny (trained here in seconds) or smollm2 "
                                   "(SmolLM2-135M-Instruct, the smollm2 extra; converted once, cached).")) -> None:
    """Build the demo workspace (synthetic corpus, tiny target; cached) and open the console on it."""
    from eagle3_console.cli.demo import MODELS, write_demo_workspace
    from ops.demo.realmodel import MissingExtra
    if model not in MODELS:
        raise CommandError(f"--model {model!r}: expected one of {', '.join(MODELS)}")
    ws = Workspace.at(directory)
    t0 = time.time()
    try:
        config, assets = write_demo_workspace(ws.root, log=say, model=model)
    except MissingExtra as exc:
        raise CommandError(str(exc)) from None
    except Exception as exc:   # a broken build must say what broke, not open an empty console
        raise CommandError(f"building the demo workspace failed: {exc}") from None
    how = "cached" if assets.get("cached") else f"built in {time.time() - t0:.0f} s"
    out.print(f"demo workspace {ws.root} ({how}); pipeline: {config}", highlight=False)
    ws.ensure_state()
    if run_all:
        from eagle3_console.actions.policy import start_driver
        pid = start_driver(ws)
        out.print(f"pipeline driver started (pid {pid}): stages start as their dependencies succeed", highlight=False)
    if no_open:
        out.print(f"open it with: eagle3-console -w {ws.root}", highlight=False)
        return
    ctx.obj = Ctx(ws.root)
    _open_tui(ctx.obj, readonly=False)


def status(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="One JSON object (schema in README)."),
           no_gpus: bool = typer.Option(False, "--no-gpus", help="Skip NVML.")) -> None:
    """Stages, GPUs, disk and alerts. Exit: 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN."""
    if as_json:
        # cli/__init__.py answers most of these calls without typer, through the same function.
        raise typer.Exit(status_json(ctx_of(ctx), no_gpus))
    snap = collect(ctx_of(ctx), no_gpus)
    from eagle3_console.observe.report import print_status
    try:
        print_status(out, snap)
        sys.stdout.flush()
    except OSError as exc:
        if not closed_pipe(exc):
            raise
        reader_gone()
    raise typer.Exit(snap.exit_code)


# The commands, in the order --help lists them.
for _name, _command in (
        ("tui", tui), ("init", init), ("run", runs.run), ("stop", runs.stop), ("runs", runs.runs_cmd),
        ("logs", runs.logs), ("events", runs.events), ("demo", demo), ("status", status),
        ("kill-workers", actions.kill_workers), ("clean", actions.clean), ("restart", actions.restart),
        ("watch", actions.watch), ("exporter", actions.exporter)):
    app.command(_name)(_command)


def hoist_workspace(argv: list[str]) -> list[str]:
    """argv with a -w/--workspace given after the command moved in front of it
    (args.hoist_workspace), for this app's command names."""
    names = {c.name for c in app.registered_commands} | {c.callback.__name__.replace("_", "-")
                                                         for c in app.registered_commands if c.callback}
    return args.hoist_workspace(argv, names)
