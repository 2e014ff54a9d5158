"""Pipeline stages. Each stage is a package `ops.<name>` with:

- `ops/<name>/__main__.py`: the program (`python -m ops.<name> --flag value ...`);
  heavy imports (torch, transformers) live inside its main();
- `ops/<name>/spec.py`: a subclass of OpSpec (its Params beside its hooks) and
  `SPEC`, its one instance; importable without torch.

The console imports specs only (arrow: eagle3_console -> ops specs).
Ops import nothing of ours but ops.
"""

from __future__ import annotations

import importlib

from ops.spec import OpSpec

KNOWN_OPS = ("prepare", "vocab", "extract", "verify", "train", "export", "bench", "serve", "regenerate")


def get_spec(name: str) -> OpSpec:
    """The spec of a built-in op; KeyError with the known names if absent."""
    if name not in KNOWN_OPS:
        raise KeyError(f"unknown op {name!r}")
    try:
        module = importlib.import_module(f"ops.{name}.spec")
    except ModuleNotFoundError as exc:
        raise KeyError(f"op {name!r} is not built yet ({exc})") from exc
    return module.SPEC
