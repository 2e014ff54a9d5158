"""Extract's preflight: will the output fit on its filesystem?

Runs before the model load (which can take 20 minutes), so a run that would
fill the disk at 90 % is refused at second one. The estimate is the spec's
(ops/extract/spec.py estimate_bytes: tokens x (aux + 1) x hidden x dtype
bytes), scaled to the share of tokens still to extract when resuming.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ops.extract.spec import estimate_bytes
from ops.units import human_bytes
from ops.spec import EstimateContext


def free_bytes(path: Path) -> int:
    """Free space of the filesystem that holds `path` (or its nearest existing parent)."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def disk_check(params: dict, target: dict, output: Path, remaining_share: float) -> tuple[bool, str]:
    """(fits, message). `remaining_share`: the share of tokens not yet on disk."""
    ctx = EstimateContext(root=Path.cwd(), params=params, target=target)
    total = estimate_bytes(ctx)
    if total is None:
        return True, "disk estimate unavailable (no token count); skipping the free-space check"
    need = int(total * remaining_share)
    free = free_bytes(output)
    text = (f"disk: estimate {human_bytes(total)} in all, {human_bytes(need)} still to write; "
            f"{human_bytes(free)} free on the filesystem of {output}")
    return need <= free, text
