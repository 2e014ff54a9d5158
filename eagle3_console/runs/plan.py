"""What a launch will need, said before it runs: the disk estimate, labelled by
how it was made (ops/estimate.py lists the kinds), the disk preflight, and
the lines `run` prints.

Where it sits: runs.launch / preflight (the disk check of `run`, `restart`,
watch and the TUI), snapshot (the disk rows of `status`, the JSON and the
TUI's disk pane) and `run`'s printed plan all take their figure from
disk_estimate(). The figure is the op's: its spec's estimate hook (extract's,
with kind and basis), else its estimate_bytes labelled with its
estimate_rule. context() is what every hook is given. No torch, no textual.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from eagle3_console.kernel.config import Pipeline, Stage
from eagle3_console.kernel.model import DiskUsage
from eagle3_console.monitor.disk import free_space, room_for
from eagle3_console.monitor.tree import TreeIndex
from eagle3_console.runs.outputs import output_paths
from eagle3_console.kernel.units import human_bytes
from eagle3_console.kernel.workspace import Workspace
from ops.estimate import Estimate
from ops.spec import EstimateContext, Upstream


def context(ws: Workspace, pipe: Pipeline, params: dict[str, Any], stage: Stage | None = None) -> EstimateContext:
    """What an op's hooks are given: its params, the [target] table, the stage's
    name, and which stage of the pipeline writes the path a param names."""
    def upstream(key: str) -> Upstream | None:
        if not params.get(key):
            return None
        want = str(ws.resolve(str(params[key])))
        for other in pipe.stages.values():
            if stage is not None and other.name == stage.name:
                continue
            if want in (str(ws.resolve(str(other.params[p]))) for p in other.spec.output_params
                        if other.params.get(p)):
                return Upstream(other.name, other.op, other.spec.effective(other.params))
        return None
    return EstimateContext(root=ws.root, params=params, target=pipe.target,
                           stage=stage.name if stage is not None else "", upstream=upstream)


# ------------------------------------------------------------------ disk
def disk_estimate(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Estimate | None:
    """The best figure that can be made now for the stage's output, or None."""
    if stage.estimate_bytes is not None:
        return Estimate(stage.estimate_bytes, "declared", "estimate_bytes in the pipeline file")
    return stage.spec.estimate(context(ws, pipe, stage.spec.effective(params), stage))


@dataclass
class Preflight:
    estimate_bytes: int | None
    free_bytes: int | None
    path: str | None
    written_bytes: int = 0          # already under the outputs (a resume needs only the rest)
    fits: bool = True               # monitor.disk.room_for's verdict (True when nothing is estimated)
    estimate: Estimate | None = None   # the figure with its kind (upper bound, exact, ...) and basis

    @property
    def remaining_bytes(self) -> int | None:
        return None if self.estimate_bytes is None else max(0, self.estimate_bytes - self.written_bytes)

    def shortfall(self) -> str:
        """The refusal's sentence, sizes in a unit that shows them."""
        already = f" ({human_bytes(self.written_bytes)} of {human_bytes(self.estimate_bytes)} already written)" \
            if self.written_bytes else ""
        kind = f" ({self.estimate.label}: {self.estimate.basis})" if self.estimate else ""
        return (f"needs about {human_bytes(self.remaining_bytes)} more{already}{kind} but only "
                f"{human_bytes(self.free_bytes)} is free at {self.path}")


def preflight(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any]) -> Preflight:
    estimate = disk_estimate(ws, pipe, stage, params)
    est = None if estimate is None else estimate.bytes
    outs = output_paths(ws, stage, params)
    if est is None or not outs:
        return Preflight(est, None, outs[0] if outs else None, estimate=estimate)
    # One listing of what is there (the monitors' own index; a resume's outputs
    # are thousands of files, not millions): the estimate counts the whole output.
    written = 0
    for o in outs:
        if os.path.isdir(o):
            index = TreeIndex(o)
            index.refresh()
            written += index.total_bytes
    fits, free = room_for(outs[0], est, written)
    return Preflight(est, free, outs[0], written, fits=fits is not False, estimate=estimate)


# ------------------------------------------------------------------ run's plan
def disk_line(pf: Any) -> str | None:
    """A Preflight in a line: the estimate with its kind and basis, the free space, the verdict."""
    est = getattr(pf, "estimate", None)
    if est is None:
        return None
    line = f"disk: {est.describe()}"
    if pf.written_bytes:
        line += f"; {human_bytes(pf.written_bytes)} already written, {human_bytes(pf.remaining_bytes)} to go"
    if pf.free_bytes is not None:
        verdict = "fits" if pf.fits else "does NOT fit"
        line += f"; {human_bytes(pf.free_bytes)} free at {pf.path}: {verdict}"
    return line


def launch_lines(ws: Workspace, pipe: Pipeline, stage: Stage, params: dict[str, Any],
                 pf: Preflight | None) -> list[str]:
    """What `run` prints before it launches or refuses: disk (`pf`: the launch's own
    preflight; None where it could not be made, which launch says), then the op's own
    lines (extract's layers)."""
    out = []
    line = disk_line(pf) if pf is not None else None
    if line:
        out.append(line)
    out += stage.spec.plan_lines(context(ws, pipe, params, stage))
    return out


def downstream(pipe: Pipeline, name: str) -> list[str]:
    """The stages that depend on `name`, directly or through others, in pipeline order."""
    found = {name}
    for other in pipe.order():
        if found & set(pipe.stages[other].depends_on):
            found.add(other)
    return [n for n in pipe.order() if n in found and n != name]


def rerun_warnings(ws: Workspace, pipe: Pipeline, stage: Stage) -> list[str]:
    """`run` on a stage whose last run succeeded: what the TUI's start dialog asks, said
    (its outputs are complete; the downstream stages with complete outputs become stale)."""
    from eagle3_console.kernel.registry import Registry, RunStatus, id_path
    if not (ws.db_path.exists() or id_path(ws.db_path).exists()):
        return []
    with Registry(ws.db_path) as reg:
        last = reg.latest(stage.name)
        if last is None or last.status != RunStatus.SUCCEEDED:
            return []
        complete = [n for n in downstream(pipe, stage.name)
                    if (r := reg.latest(n)) is not None and r.status == RunStatus.SUCCEEDED]
    stale = ("makes stale (their outputs were made from the current ones): " + ", ".join(complete) if complete
             else "no downstream stage has complete outputs: none becomes stale")
    return [f"warning: {stage.name}'s last run {last.id} succeeded: its outputs are complete and this run goes "
            f"into them (an op that resumes, like extract, skips what is there; others rewrite their files); "
            + stale]


def unwritten_usage(stage: str, path: str, estimate_bytes: int) -> DiskUsage:
    """The disk row of an output nothing was written to yet: the estimate against the free space."""
    try:
        free, total = free_space(path)
    except OSError:
        free = total = None
    return DiskUsage(stage=stage, path=path, estimate_bytes=estimate_bytes, free_bytes=free, total_bytes=total,
                     fits=None if free is None else estimate_bytes <= free)


def label_usages(usages: list[DiskUsage], est: Estimate | None) -> None:
    """Say on each disk row how its estimate was made (its kind, in words too), and which figure its verdict used."""
    for d in usages:
        if d.estimate_bytes is not None and est is not None:
            d.estimate_kind, d.estimate_basis, d.estimate_label = est.kind, est.basis, est.label
        d.final_kind = "measured" if d.projected_bytes is not None else d.estimate_kind
