"""What runs vouch for: the files under a custom stage's outputs, as a run found them.

For a custom stage that counts no samples (no op record says which of its files
are complete), the supervisor (claims.Claim) records the files under its
outputs (size and mtime, links not followed): at each run's start, and after
the run succeeded. clean's partial files are those that no such record vouches
for (Vouch), under the outputs the failed run's own start record names (an
output re-pointed in eagle3.toml while the run lived is not what it wrote);
a run whose start record does not name a folder is no witness for it (the
files there before the first run that named it stay).

Data flow: supervise.py -> Claim -> .eagle3/vouched/*.json -> actions/clean.py.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3_console.kernel.fstree import Root
from eagle3_console.kernel.registry import RunStatus
from eagle3_console.kernel.workspace import Workspace
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
    return stage.spec.partial_rule(stage.expected_samples) is None


@dataclass
class Vouch:
    """What the records of a stage's runs say of its files now.

    A file is the stage's good data when the latest succeeded run left it as it
    is, or when no run since changed it: each run's start record is the state
    the run began from, the next run's start (or now, for the latest) the state
    it left; only the runs whose start record names the folder count (an output
    re-pointed to a folder with files in it: they predate the runs that name
    it). A file touched between runs (its mtime moved, `touch -d`) changed in no
    run's window and stays vouched; one a failed run wrote or rewrote changed in
    that run's window."""
    end: dict | None                    # the latest succeeded run's files at its end
    starts: list[dict]                  # the start records of every run since it, oldest first
    roots: list[str] | None             # the outputs the latest run wrote (its start record's)
    why: str

    def keeps(self, root: str, rel: str, now: list[int]) -> bool:
        if self.end is not None and self.end.get(root, {}).get(rel) == now:
            return True
        named = [s[root] for s in self.starts if root in s]
        if not named:
            return False
        states = [files.get(rel) for files in named] + [now]
        return all(a == b for a, b in zip(states, states[1:]))


def load_vouch(ws: Workspace, history: list[tuple[int, str]], registry: str) -> Vouch | None:
    """The records of the stage's runs (history: (id, status), oldest first);
    None where no run left one (runs from before the records: the clock decides)."""
    ok = [rid for rid, status in history if status == RunStatus.SUCCEEDED]
    later = [rid for rid, _s in history if not ok or rid > ok[-1]]
    end = read_manifest(manifest_path(ws, registry, ok[-1], "end")) if ok else None
    starts = [read_manifest(manifest_path(ws, registry, rid, "start")) for rid in later]
    latest = starts[-1] if starts else None
    if any(s is None for s in starts):
        # Runs recorded before every run wrote its start: only the first run's start is known.
        first = next((s for s in starts if s is not None), None)
        starts = [first] if first is not None and not ok else []
    if end is None and not starts:
        return None
    roots = sorted(latest) if latest is not None else None
    if ok:
        why = f"temp files and files that runs after succeeded run {ok[-1]} wrote or changed"
    else:
        why = f"temp files and files that the stage's runs wrote or changed since run {later[0]}, its first, started"
    return Vouch(end, [s for s in starts if s is not None], roots, why)


def record_present(ws: Workspace, registry: str, run_id: int, outputs: list[str]) -> None:
    """A succeeded run's output folders that exist at its end (a stage may
    declare one it never writes): what `vanished` compares with later."""
    path = manifest_path(ws, registry, run_id, "outputs")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"run": run_id, "present": [o for o in outputs if os.path.isdir(o)]}))
    os.replace(tmp, path)


def vanished(ws: Workspace, registry: str, run_id: int) -> list[str]:
    """The output folders a succeeded run left that are gone now (moved or deleted)."""
    try:
        present = json.loads(manifest_path(ws, registry, run_id, "outputs").read_text())["present"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [p for p in present if isinstance(p, str) and not os.path.isdir(p)] if isinstance(present, list) else []
