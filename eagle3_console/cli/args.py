"""The command line as words, before typer sees it: the one scanner of
`-w/--workspace`, which both moves a workspace given after the command in
front of it (click binds the option to the group) and tells a plain
`status --json` (answered without typer, eagle3_console/cli/__init__.py) from
everything else.

No typer or click here: `status --json` (cron, every minute) reads its
arguments through this module alone.
"""

from __future__ import annotations

import os
from typing import Iterable, Optional

from eagle3_console.kernel.workspace import ENV_WORKSPACE

WORKSPACE_FLAGS = ("-w", "--workspace")


def workspace_options(words: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(the workspace values, their words as typed, every other word) of
    `words`. A flag with no word after it is left among the others, for
    click to refuse; nothing after `--` is an option."""
    values: list[str] = []
    taken: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(words):
        a = words[i]
        if a == "--":
            rest += words[i:]
            break
        if a in WORKSPACE_FLAGS and i + 1 < len(words):
            values.append(words[i + 1])
            taken += words[i:i + 2]
            i += 2
            continue
        if a.startswith("--workspace="):
            values.append(a.partition("=")[2])
            taken.append(a)
        else:
            rest.append(a)
        i += 1
    return values, taken, rest


def hoist_workspace(argv: list[str], commands: Iterable[str]) -> list[str]:
    """`status -w DIR` as well as `-w DIR status`: click binds an option to the
    level it is declared on (the group), and operators type it after the
    command. Moves a `-w/--workspace` given after the first of `commands` in
    front of it."""
    names = set(commands)
    try:
        at = next(i for i, a in enumerate(argv) if a in names)
    except StopIteration:
        return argv
    _values, taken, rest = workspace_options(argv[at + 1:])
    return argv[:at] + taken + [argv[at]] + rest


STATUS_JSON_WORDS = ("status", "--json", "--no-gpus")


def status_json_args(argv: list[str]) -> tuple[Optional[str], bool] | None:
    """(workspace or None, no_gpus) when argv is `status --json` with only
    -w/--workspace and --no-gpus around it, in any order typer accepts; None
    for anything else (typer parses it, and says what is wrong)."""
    if argv.count("status") != 1 or "--json" not in argv:
        return None
    if any(k.startswith("_") and k.endswith("_COMPLETE") for k in os.environ):
        return None     # a shell-completion request: click's
    values, _taken, rest = workspace_options(argv)
    # --json and --no-gpus are the command's: typer refuses them before it.
    if any(a not in STATUS_JSON_WORDS for a in rest) or rest.index("--json") < rest.index("status"):
        return None
    if "--no-gpus" in rest and rest.index("--no-gpus") < rest.index("status"):
        return None
    # Twice, empty, or a value click might read as an option: typer's call.
    if len(values) > 1 or any(not v or v.startswith("-") for v in values):
        return None
    if not values and os.environ.get(ENV_WORKSPACE) == "":
        return None
    return (values[0] if values else None), "--no-gpus" in rest
