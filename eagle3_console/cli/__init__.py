"""The entry point (`eagle3-console`, `python -m eagle3_console.cli`). The
bare command opens the TUI; the commands are typer's (commands.py, the app,
which registers those of cli/runs.py and cli/actions.py).

`status --json` (cron, every minute) is answered here without typer: its
arguments are few and fixed (args.status_json_args), and click and typer
are a third of the process's imports. Anything else, or anything unusual
about those arguments, goes through typer. Both paths run
ctx.status_json(), so the output and the exit code are the same
(tests/test_status.py runs both), and both say a failure through
exit.report(), the one mapping from an exception to its exit code.

Data flow: cli -> args.py -> ctx.py (or the typer app) -> config / runs /
actions / snapshot. Nothing imports this module. It must never import
textual or torch at import time: `status --json` runs from cron.
Exit codes (exit.py, README): 0 OK, 1 WARNING, 2 CRITICAL or refused,
3 UNKNOWN / bad input, 75 another `watch` holds the lock.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any, Optional

from eagle3_console.cli import exit
from eagle3_console.cli.args import status_json_args
from eagle3_console.cli.ctx import Ctx, status_json

__all__ = ["main", "run", "status_json_args"]


def _status_without_typer(args: tuple[Optional[str], bool]) -> None:
    """click's standalone handling, for the exits status_json can take."""
    workspace, no_gpus = args
    c = Ctx(Path(workspace) if workspace is not None else None)
    try:
        code = status_json(c, no_gpus)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            _exit_for(exc, c)
        import click.utils      # as click does: no second error while flushing a closed pipe
        sys.stdout = click.utils.PacifyFlushWrapper(sys.stdout)
        sys.stderr = click.utils.PacifyFlushWrapper(sys.stderr)
        sys.exit(1)
    except Exception as exc:
        _exit_for(exc, c)
    sys.exit(code)


def _exit_for(exc: Exception, c: Optional[Ctx] = None) -> None:
    """Exit with `exc`'s code and line (exit.py); re-raise a bug."""
    code = exit.report(exc, c.ws.db_path if c else None)
    if code is None:
        raise exc
    sys.exit(code)


def main() -> None:
    argv = sys.argv[1:]
    if status_json_args(argv) is None:
        try:
            run(argv)
        except SystemExit:
            _flush_or_exit_3()
            raise
        return
    try:
        run(argv)
    except SystemExit as exc:
        _exit_now(exc.code)


def _flush_or_exit_3() -> None:
    """Flush what the command printed; where stdout refuses it (a full disk),
    say so in one line and exit 3 (the interpreter's own flush at exit would
    print a traceback and exit 120)."""
    try:
        sys.stdout.flush()
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            return
        code = exit.report(exc)
        if code is None:
            raise
        # What is left in the buffer is lost (said above): the exit's own flush writes it to /dev/null.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        sys.exit(code)


def _exit_now(code: Any) -> None:
    """End a finished `status --json` process without the interpreter's teardown.

    Its output is written and its files and database closed by then; what is
    left is freeing every module and the exit handlers of the C libraries it
    loaded (libnvidia-ml): 21 ms of 188 on an H200 with NVML live
    (benchmarks/status_cost.py --gpu-worker), on the call cron makes every
    minute. Python's atexit handlers still run; only this console-script
    entry does it (run() raises SystemExit for tests and the TUI)."""
    import atexit

    if code is None:
        code = exit.EXIT_OK
    elif not isinstance(code, int):
        sys.stderr.write(f"{code}\n")
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError as exc:
        if exc.errno == errno.EPIPE:
            pass            # a reader that went away: the command's own code stands (out.reader_gone)
        else:
            code = exit.report(exc)
            if code is None:
                raise
    atexit._run_exitfuncs()
    os._exit(code)


def run(argv: list[str], fast: bool = True) -> None:
    """The command line; fast=False sends `status --json` through typer too (tests compare the two)."""
    args = status_json_args(argv) if fast else None
    from eagle3_console.cli import out
    from eagle3_console.kernel import registrybusy
    registrybusy.notice = out.warn          # a busy state database is said while it is waited for
    try:
        if args is not None:
            _status_without_typer(args)
        from eagle3_console.cli.commands import app, hoist_workspace
        app(args=hoist_workspace(argv))
    except Exception as exc:
        # What fails outside a command (the workspace itself): the typer group says a command's.
        _exit_for(exc)


def __getattr__(name: str) -> Any:
    # `cli.app`, `cli.hoist_workspace`: the typer app, imported when asked for.
    if name in ("app", "hoist_workspace", "WORKSPACE_FLAGS"):
        from eagle3_console.cli import commands
        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
