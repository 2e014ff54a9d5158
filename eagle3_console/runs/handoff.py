"""What a launch hands its run's supervisor (runs.launch -> runs/supervise.py).

The supervisor never reads the pipeline file, which may have changed (or
broken) between the launch and its start: what it needs of the stage beyond
the run's record travels as its third argument. Light on purpose: `status`
imports runs, and must not pay for the supervisor's psutil.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass


@dataclass
class Handoff:
    """What a launch hands its run's supervisor (its third argument, JSON): the output
    roots it claims, whether a manifest vouches for their files (vouch.records_files),
    and a slurm stage's options (slurmparams.SlurmParams as a dict)."""

    outputs: list[str]
    manifest: bool
    slurm: dict | None = None

    def to_arg(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_arg(cls, text: str) -> "Handoff":
        return cls(**json.loads(text))
