"""Checks the typer commands share: numeric options validated at parse time;
and the typer app's group, which gives click's usage errors the README's exit
code for bad input (3) and every command's failure its exit code and line
(through exit.py, the one mapping).

Click parses `--interval nan`, `--interval inf` and `--port 70000` happily
(FloatRange lets NaN through: every comparison with it is false); each then
failed far from the command line (a sampler thread dead on inf, a busy loop
on nan, an OverflowError traceback from bind()). Here every number is checked
once, where the operator typed it, and refused with the option's name and the
range it takes.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import click
from typer.core import TyperGroup

from eagle3_console.cli import exit
from eagle3_console.cli.ctx import Ctx

EXIT_BAD_INPUT = exit.EXIT_BAD_INPUT

# A day: longer than any wait or interval an operator means (and inside what
# time.sleep and Event.wait accept: 1e300 raises OverflowError in both).
MAX_SECONDS = 86400.0
MAX_COUNT = 10_000_000
# The shortest pass interval of watch and the exporter: below it a loop only spins.
MIN_INTERVAL_S = 0.05
MAX_ID = 2**63 - 1          # SQLite's INTEGER


def seconds(minimum: float = 0.0, *, above: bool = False, maximum: float = MAX_SECONDS) -> Callable[[Any], Any]:
    """A typer callback for a float option: finite, >= minimum (> with above), <= maximum."""
    sign = ">" if above else ">="

    def check(value: Any) -> Any:
        if value is None:
            return value
        low = value <= minimum if above else value < minimum
        if not math.isfinite(value) or low or value > maximum:
            raise click.BadParameter(f"{value!r}: expected a finite number of seconds {sign} {minimum:g} "
                                     f"and <= {maximum:g}")
        return value
    return check


def integer(minimum: int = 0, maximum: int = MAX_COUNT, what: str = "an integer") -> Callable[[Any], Any]:
    """A typer callback for an int option: minimum <= value <= maximum."""
    def check(value: Any) -> Any:
        if value is None:
            return value
        if not minimum <= value <= maximum:
            raise click.BadParameter(f"{value}: expected {what} from {minimum} to {maximum}")
        return value
    return check


class ExitCodeGroup(TyperGroup):
    """The typer app's group. A usage error (an unknown option, a missing
    argument, a value a callback refused) exits 3, bad input, instead of
    click's 2, which the README's table (and cron) reads as CRITICAL.
    What a command raises is said in one line with its exit code
    (exit.report); a bug keeps its traceback.

    The group's own arguments are parsed in make_context, a command's inside
    the group's invoke; both re-raise a usage error with the code changed, so
    click still prints its usual `Usage: ... Error: ...` lines."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            exc.exit_code = EXIT_BAD_INPUT
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            exc.exit_code = EXIT_BAD_INPUT
            raise
        except click.exceptions.Exit:
            raise
        except Exception as exc:
            db_path = ctx.obj.ws.db_path if isinstance(ctx.obj, Ctx) else None
            code = exit.report(exc, db_path)
            if code is None:
                raise
            raise click.exceptions.Exit(code) from None
