"""A stage's output roots for given params, normalised and checked: what the
launch, the claims (claims.py), clean and the snapshot take as the folders a
stage writes. A root that is the workspace or its state folder, or that
overlaps another stage's, is refused (exit 3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3_console.kernel.config import Pipeline, Stage
from eagle3_console.kernel.refused import Refused
from eagle3_console.kernel.workspace import Workspace


def output_paths(ws: Workspace, stage: Stage, params: dict[str, Any], guarded: list | None = None) -> list[str]:
    """The stage's output roots for these params, normalised (Workspace.resolve);
    an output that is the workspace or its state folder is refused (exit 3),
    whether it came from the pipeline file, a `--set` or a recorded run."""
    outs = stage.spec.output_values(params, stage.outputs)
    paths = [ws.resolve(o) for o in outs]
    for raw, p in zip(outs, paths):
        problem = ws.output_problem(p, guarded)
        if problem:
            raise Refused(f"stages.{stage.name}: output {raw!r}: {problem}", code=3)
    return [str(p) for p in paths]


def check_outputs_apart(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> None:
    """The pipeline file's rule (separate output roots) for the outputs a
    `--set` or a restart actually gives: clean and the shard monitor trust
    that a root belongs to one stage."""
    guarded = ws.guarded()
    mine = [Path(p) for p in output_paths(ws, stage, params, guarded)]
    for other in pipe.stages.values():
        if other.name == stage.name:
            continue
        for q in output_paths(ws, other, other.params, guarded):
            q = Path(q)
            for p in mine:
                if p == q or q in p.parents or p in q.parents:
                    raise Refused(f"stages.{stage.name}: output {p} overlaps stage {other.name!r}'s output {q}; "
                                  f"expected separate output roots", code=3)
