"""The engines of extract by name: what the `engine` param chooses from.

Where it sits: __main__.py opens the engine here (open_engine) and hands it
to run.py, which drives it through engine.py's protocol. Cheap to import (no
torch): SGLang's pinned version is checked before torch and the target load.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from ops.extract.engine import Engine


def _open_hf(args: "argparse.Namespace") -> Engine:
    from ops.extract.hf_engine import HFEngine

    return HFEngine(args)


def _open_sglang(args: "argparse.Namespace") -> Engine:
    from ops.common import BadInput
    from ops.extract.sglang_engine import EngineVersionError, check_version

    # Before torch and the target: another SGLang would fail hours in, or worse, not fail.
    try:
        version = check_version()
    except EngineVersionError as exc:
        raise BadInput(str(exc)) from None
    from ops.extract.sglang_run import SGLangEngine

    return SGLangEngine.open(args, version)


# The `engine` param's choices.
ENGINES: dict[str, Callable[["argparse.Namespace"], Engine]] = {"hf": _open_hf, "sglang": _open_sglang}


def open_engine(args: "argparse.Namespace") -> Engine:
    """The engine `args.engine` names, its params checked (BadInput: one line, exit 2)."""
    return ENGINES[args.engine](args)
