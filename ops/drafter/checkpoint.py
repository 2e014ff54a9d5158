"""Training checkpoints: written atomically, found by step, loaded for resume/export.

`<train output>/checkpoints/step_<N>/` holds model.safetensors (the drafter's
weights, SGLang names), trainer.pt (optimizer + scheduler) and meta.json (step,
drafter config, data split). It is written under a temporary name and renamed,
so a directory named step_<N> is always whole; a crash leaves only a *.tmp-*
directory, which the train spec reports as partial.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

CKPT_DIR = "checkpoints"
STEP_RE = re.compile(r"^step_(\d+)$")
MODEL_FILE = "model.safetensors"
TRAINER_FILE = "trainer.pt"
META_FILE = "meta.json"


class CheckpointError(ValueError):
    pass


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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(output: Path, step: int, model_state: dict, trainer_state: dict, meta: dict, keep: int) -> Path:
    import torch
    from safetensors.torch import save_file

    root = Path(output) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{step:08d}"
    tmp = root / f"step_{step:08d}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file({k: v.detach().cpu().contiguous() for k, v in model_state.items()}, str(tmp / MODEL_FILE))
    torch.save(trainer_state, tmp / TRAINER_FILE)
    (tmp / META_FILE).write_text(json.dumps(dict(meta, step=step), indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    for _, old in list_checkpoints(output)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


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
