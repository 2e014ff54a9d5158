"""What runs vouch for: the files under a custom stage's outputs, as a run found them.

For a custom stage that counts no samples (no op record says which of its files
are complete), the supervisor (claims.Claim) records the files under its
outputs: at the run's start, and after the run succeeded. clean's partial files
are those that no such record vouches for (actions/clean.py).

Data flow: supervise.py -> Claim -> .eagle3/vouched/*.json -> actions/clean.py.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from eagle3_console.fstree import Root
from eagle3_console.workspace import Workspace
from ops.common import CLAIM_FILE

VOUCHED_DIR = "vouched"


def manifest_path(ws: Workspace, registry: str, run_id: int, kind: str) -> Path:
    return ws.state_dir / VOUCHED_DIR / f"{registry}-{run_id:06d}-{kind}.json"


def record_files(outputs: list[str]) -> dict[str, dict[str, list[int]]]:
    """{output: {relative path: [size, mtime_ns]}} of the regular files found,
    links not followed, the lock file left out."""
    found: dict[str, dict[str, list[int]]] = {}
    for out in outputs:
        try:
            with Root(out) as root:
                found[out] = {"/".join(e.rel): [e.size, e.mtime_ns] for e in root.walk()
                              if e.rel != (CLAIM_FILE,)}
        except OSError:
            found[out] = {}
    return found


def write_manifest(path: Path, run_id: int, stage: str, outputs: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"run": run_id, "stage": stage, "time": time.time(),
                               "roots": record_files(outputs)}))
    os.replace(tmp, path)


def read_manifest(path: Path) -> dict[str, dict[str, list[int]]] | None:
    try:
        roots = json.loads(path.read_text())["roots"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return roots if isinstance(roots, dict) else None


def records_files(stage: Any) -> bool:
    """The stages whose files no op record or sample check vouches for."""
    return stage.spec is None and stage.expected_samples is None
