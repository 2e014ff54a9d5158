"""Paths of a workspace: where the pipeline file, state, logs and trash live.

Everything else asks this module for paths, so the on-disk layout is said once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CONFIG_NAME = "eagle3.toml"
STATE_DIR = ".eagle3"
ENV_WORKSPACE = "EAGLE3_WORKSPACE"
# Set in every stage's environment so that orphaned workers stay attributable.
ENV_RUN_ID = "EAGLE3_RUN_ID"
# Beside it: the registry the id belongs to (ids restart in a new registry)
# and the stage, so a worker outliving its registry still says what it is.
ENV_REGISTRY = "EAGLE3_REGISTRY"
ENV_STAGE = "EAGLE3_STAGE"


@dataclass(frozen=True)
class Workspace:
    root: Path

    @classmethod
    def at(cls, path: str | os.PathLike | None = None) -> "Workspace":
        """The workspace at `path`, else $EAGLE3_WORKSPACE, else the cwd."""
        chosen = path or os.environ.get(ENV_WORKSPACE) or os.getcwd()
        return cls(Path(chosen).expanduser().resolve())

    @property
    def config_path(self) -> Path:
        return self.root / CONFIG_NAME

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    @property
    def db_path(self) -> Path:
        return self.state_dir / "state.db"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def trash_dir(self) -> Path:
        return self.state_dir / "trash"

    @property
    def cache_dir(self) -> Path:
        """Monitor caches (log offsets, directory indexes) so that a one-shot
        `status` continues where the previous one stopped."""
        return self.state_dir / "cache"

    @property
    def watch_lock_path(self) -> Path:
        return self.state_dir / "watch.lock"

    def log_path(self, run_id: int, stage: str) -> Path:
        return self.logs_dir / f"{run_id:06d}-{stage}.log"

    def resolve(self, path: str | os.PathLike) -> Path:
        """A stage path as written in eagle3.toml: relative to the root, `..` resolved.

        Lexically (os.path.normpath, symlinks untouched): the paths need not
        exist yet, and clean must see a symlinked output as the link it is.
        Every later use (clean's trash destination, the shard monitor, the
        overlap check) takes this one normalised form."""
        p = Path(path).expanduser()
        return Path(os.path.normpath(p if p.is_absolute() else self.root / p))

    def guarded(self) -> list[tuple[Path, frozenset[Path]]]:
        """The folders no output may be, hold or (the state folder) lie in,
        lexically and through symlinks, each with the folders that hold it:
        what output_problem checks, computed once for a whole pipeline."""
        roots = {self.root, self.state_dir}
        roots |= {Path(os.path.realpath(g)) for g in roots}
        return [(g, frozenset((g, *g.parents))) for g in roots]

    def output_problem(self, path: Path, guarded: list[tuple[Path, frozenset[Path]]] | None = None) -> str | None:
        """Why `path` (normalised) cannot be a stage's output, or None.

        An output is what clean may move to the trash: never the workspace,
        its state folder, or a folder holding either (outputs on other disks,
        /data/..., are fine). Checked lexically and through symlinks;
        `guarded`: self.guarded(), when the caller checks many paths."""
        for p in {path, Path(os.path.realpath(path))}:
            above = None
            for g, holding in guarded if guarded is not None else self.guarded():
                if p in holding:
                    what = "the workspace" if g.name != STATE_DIR else "the console's state folder"
                    return (f"{path} is {what} ({g})" if p == g else f"{path} holds {what} ({g})") + \
                        "; expected a folder of its own that clean may empty"
                if g.name == STATE_DIR:
                    above = above if above is not None else frozenset(p.parents)
                    if g in above:
                        return f"{path} lies inside the console's state folder {g}; expected a folder of its own"
        return None

    def ensure_state(self) -> None:
        for d in (self.state_dir, self.logs_dir, self.cache_dir):
            d.mkdir(parents=True, exist_ok=True)
