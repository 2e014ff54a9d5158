"""Which run a training owns, and what it does with the checkpoints already in its output.

A run from step 0 gets a new token (ops/drafter/checkpoint.py RunMark). Into
an output that holds checkpoints of another run it refuses (exit 2, one
line) unless --replace-checkpoints (`replace_checkpoints = true`; not `run --force`, which only skips
the console's dependency check), which deletes
them first: a new run never mixes its steps with another run's, so `keep`,
resume and export's "newest" see one run. --resume continues the newest
checkpoint whose drafter config matches this run's, keeps that run's token
(its checkpoints stay prunable by `keep`), and says which run and step.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ops.drafter import checkpoint as ck


class OwnerError(ValueError):
    """One line for the operator; train exits 2."""


@dataclass
class Start:
    run: ck.RunMark
    own: frozenset = field(default_factory=frozenset)   # tokens `keep` prunes besides run.token
    resume_from: Path | None = None
    meta: dict | None = None                            # the resumed checkpoint's meta.json


def _by_run(found: list[tuple[int, Path, dict | None]]) -> str:
    groups: dict[ck.RunMark, list[int]] = {}
    for step, _path, meta in found:
        mark = ck.run_of(meta) if meta is not None else ck.RunMark(token=None)
        groups.setdefault(mark, []).append(step)
    return "; ".join(f"{mark.describe()}, step{'s' if len(s) > 1 else ''} {', '.join(map(str, sorted(s)))}"
                     for mark, s in groups.items())


def _read(output: Path) -> list[tuple[int, Path, dict | None]]:
    out = []
    for step, path in ck.list_checkpoints(output):
        try:
            out.append((step, path, ck.load_meta(path)))
        except ck.CheckpointError:
            out.append((step, path, None))
    return out


def refuse_early(output: Path, resume: bool, force: bool) -> None:
    """The refusal before the data and the target load (seconds to minutes): a
    plain new run into another run's checkpoints."""
    if not resume and not force:
        begin(output, resume, force, {}, False, lambda _msg: None)


def begin(output: Path, resume: bool, force: bool, drafter_config: dict, is_main: bool, log) -> Start:
    """This run's mark, after refusing or clearing another run's checkpoints, or the one to resume."""
    output = Path(output)
    found = _read(output)
    root = output / ck.CKPT_DIR
    if resume:
        return _resume(root, found, drafter_config, log)
    mark = ck.RunMark.new()
    if not found:
        return Start(run=mark)
    others = "another run" if len({ck.run_of(m or {}) for _, _, m in found}) == 1 else "other runs"
    if not force:
        raise OwnerError(f"{root} holds {len(found)} checkpoint(s) of {others}: {_by_run(found)}; "
                         f"pass resume=true (--resume) to continue it, or replace_checkpoints=true "
                         f"(--replace-checkpoints) to delete them and start over")
    if is_main:
        for _, path, _ in found:
            shutil.rmtree(path)
        log(f"train: --replace-checkpoints: deleted {len(found)} checkpoint(s) of {_by_run(found)}")
    return Start(run=mark)


def _resume(root: Path, found: list, drafter_config: dict, log) -> Start:
    if not found:
        log(f"resume: no checkpoint under {root}; starting from step 0")
        return Start(run=ck.RunMark.new())
    fits = [(s, p, m) for s, p, m in found if m is not None and m.get("drafter_config") == drafter_config
            and "step" in m]
    if not fits:
        newest = found[-1][1]
        raise OwnerError(f"{newest}: its drafter config differs from this run's (target/vocab/data changed?)"
                         + (f"; so does every other checkpoint under {root}" if len(found) > 1 else ""))
    step, path, meta = fits[-1]
    skipped = [s for s, _, _ in found if s > step]
    if skipped:
        log(f"resume: skipping checkpoint(s) at steps {', '.join(map(str, skipped))}: their drafter config "
            f"differs from this run's")
    theirs = ck.run_of(meta)
    # The resumed run goes on under its own token; one written before runs were
    # recorded gets a new one, and its unnamed checkpoints stay prunable.
    mark = ck.RunMark.new()
    mark = ck.RunMark(token=theirs.token or mark.token, id=mark.id)
    log(f"resume: continuing {theirs.describe()} from {path} (step {int(meta['step'])})")
    return Start(run=mark, own=frozenset({theirs.token}), resume_from=path, meta=meta)


def load_resumed(start: Start, model, opt, sched, device) -> int:
    """The resumed checkpoint's weights, optimizer and scheduler into this run; its step."""
    import torch

    if start.resume_from is None:
        return 0
    model.load_trainable_state(ck.load_model_state(start.resume_from), where=str(start.resume_from))
    state = torch.load(start.resume_from / ck.TRAINER_FILE, map_location=device, weights_only=False)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return int(start.meta["step"])
