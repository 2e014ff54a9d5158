"""Training checkpoints: written atomically, found by step, loaded for resume/export.

`<train output>/checkpoints/step_<N>/` holds model.safetensors (the drafter's
weights, SGLang names), trainer.pt (optimizer + scheduler) and meta.json (step,
drafter config, data split). It is written under a temporary name and renamed,
so a directory named step_<N> is always whole; a crash leaves only a *.tmp-*
directory, which the train spec reports as partial (a full disk: the save
removes it and raises an OSError naming the file, ops/drafter/diskio.py).

A run owns its checkpoints: meta.json's "run" holds the run's token (random,
made when a run starts from step 0; a resume keeps the token of the run it
continues) and the console's run id of the process that wrote it
(EAGLE3_RUN_ID). `keep` prunes only the checkpoints of the saving run;
ops/train/owner.py decides what a new run does with another run's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from ops.drafter import diskio

CKPT_DIR = "checkpoints"
STEP_RE = re.compile(r"^step_(\d+)$")
MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"


class CheckpointError(ValueError):
    pass


@dataclass(frozen=True)
class RunMark:
    """Who wrote a checkpoint: the run's token, and the console's run id (None by hand)."""
    token: str | None
    id: str | None = None

    @classmethod
    def new(cls) -> "RunMark":
        return cls(token=uuid.uuid4().hex[:12], id=os.environ.get("EAGLE3_RUN_ID") or None)

    def to_dict(self) -> dict:
        return {"token": self.token, "id": self.id}

    def describe(self) -> str:
        """'run 3 (token 1a2b...)', or what is known of a checkpoint that predates run marks."""
        if self.token is None:
            return "an unnamed run (checkpoints written before runs were recorded)"
        return f"run {self.id or '(by hand)'} (token {self.token})"


def run_of(meta: dict) -> RunMark:
    run = meta.get("run") if isinstance(meta.get("run"), dict) else {}
    token, rid = run.get("token"), run.get("id")
    return RunMark(token=str(token) if token else None, id=str(rid) if rid not in (None, "") else None)


def list_checkpoints(output: Path) -> list[tuple[int, Path]]:
    root = Path(output) / CKPT_DIR
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and (p / META_FILE).exists() and (p / MODEL_FILE).exists():
            out.append((int(m.group(1)), p))
    return sorted(out)


def newest(output: Path) -> Path | None:
    found = list_checkpoints(output)
    return found[-1][1] if found else None


def resolve(path: Path) -> Path:
    """A checkpoint directory, or the newest one of a train output directory."""
    path = Path(path)
    if (path / MODEL_FILE).exists() and (path / META_FILE).exists():
        return path
    found = newest(path)
    if found is None:
        raise CheckpointError(f"{path}: neither a checkpoint (model.safetensors + meta.json) "
                              f"nor a train output with {CKPT_DIR}/step_<N>/")
    return found


def save(output: Path, step: int, model_state: dict, trainer_state: dict, meta: dict, keep: int,
         run: RunMark, own: frozenset = frozenset()) -> Path:
    """Write step_<step> for `run`, then keep its `keep` newest: of the
    checkpoints whose token is run's (or in `own`: the tokens it continues)."""
    root = Path(output) / CKPT_DIR
    with diskio.naming(root):
        root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f"step_{step:08d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        diskio.save_safetensors(model_state, tmp / MODEL_FILE)
        diskio.torch_save(trainer_state, tmp / TRAINER_FILE)
        diskio.write_text(tmp / META_FILE, json.dumps(dict(meta, step=step, run=run.to_dict()), indent=1))
    except BaseException:
        # A torn checkpoint holds the space the next try needs; its name says it is torn anyway.
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    diskio.fsync_dir(root)
    if keep > 0:
        mine = [p for _, p in list_checkpoints(output) if _token(p) in ({run.token} | set(own))]
        for old in mine[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def _token(ckpt: Path) -> str | None:
    try:
        return run_of(load_meta(ckpt)).token
    except CheckpointError:
        return None


def load_meta(ckpt: Path) -> dict:
    path = Path(ckpt) / META_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable ({exc})") from None


def load_model_state(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(ckpt) / MODEL_FILE))


def load_drafter(ckpt: Path):
    """(Eagle3Drafter with the checkpoint's weights, meta) on CPU."""
    from ops.drafter.config import DrafterConfig
    from ops.drafter.model import Eagle3Drafter

    ckpt = resolve(ckpt)
    meta = load_meta(ckpt)
    if "drafter_config" not in meta:
        raise CheckpointError(f"{ckpt / META_FILE}: key 'drafter_config' missing")
    model = Eagle3Drafter(DrafterConfig.from_dict(meta["drafter_config"]))
    model.load_trainable_state(load_model_state(ckpt), where=str(ckpt / MODEL_FILE))
    return model, meta
